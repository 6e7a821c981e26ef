//! Metric names. Every metric carries an `operation` label; store errors and phase latencies
//! also carry `phase`, unprotected runs carry `reason`.
//!
//! Metrics go through the [`metrics`] facade: install any recorder (Prometheus, StatsD...) in
//! the application; without one they cost a few nanoseconds. Spans and events go through
//! [`tracing`]: each call is a `idemkit.call` span with `operation` and `key` fields;
//! unprotected runs, lost leases and failed completions are `warn` events.
//!
//! # Example
//!
//! ```
//! assert_eq!(idemkit_core::observe::HITS, "idemkit_hits_total");
//! ```

use tokio::time::Instant;

use crate::{Operation, Phase};

/// Calls answered from a completed record (replays).
pub const HITS: &str = "idemkit_hits_total";
/// Calls that reserved the key and ran the action.
pub const MISSES: &str = "idemkit_misses_total";
/// Of the misses, those that took over an expired lease (the previous owner died or stalled).
pub const TAKEOVERS: &str = "idemkit_takeovers_total";
/// Times a caller waited for another owner.
pub const WAITS: &str = "idemkit_waits_total";
/// Calls refused because another owner held the key (reject mode or wait timeout).
pub const REJECTIONS: &str = "idemkit_rejections_total";
/// Calls refused because the key was used for a different request.
pub const KEY_REUSE: &str = "idemkit_key_reuse_total";
/// Store errors, by `phase`.
pub const STORE_ERRORS: &str = "idemkit_store_errors_total";
/// Actions run without protection, by `reason` (`store_unavailable`, `in_flight`).
pub const UNPROTECTED_RUNS: &str = "idemkit_unprotected_runs_total";
/// Owners that found their lease gone while renewing or completing.
pub const LEASE_LOST: &str = "idemkit_lease_lost_total";
/// Actions that succeeded but whose result could not be stored (store down after the action).
pub const COMPLETION_FAILED: &str = "idemkit_completion_failed_total";
/// Results too large or unencodable, kept as "result unavailable" records.
pub const RESULTS_UNAVAILABLE: &str = "idemkit_results_unavailable_total";
/// Latency of each phase in seconds, by `phase`.
pub const PHASE_SECONDS: &str = "idemkit_phase_seconds";

pub(crate) fn count(name: &'static str, op: &Operation) {
    metrics::counter!(name, "operation" => op.label()).increment(1);
}

pub(crate) fn count_phase(name: &'static str, op: &Operation, phase: Phase) {
    metrics::counter!(name, "operation" => op.label(), "phase" => phase.as_str()).increment(1);
}

pub(crate) fn unprotected(op: &Operation, reason: &'static str) {
    metrics::counter!(UNPROTECTED_RUNS, "operation" => op.label(), "reason" => reason).increment(1);
}

pub(crate) fn timing(op: &Operation, phase: Phase, started: Instant) {
    metrics::histogram!(PHASE_SECONDS, "operation" => op.label(), "phase" => phase.as_str())
        .record(started.elapsed().as_secs_f64());
}
