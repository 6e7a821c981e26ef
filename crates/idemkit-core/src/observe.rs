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

use metrics::{Counter, Histogram, SharedString};
use tokio::time::Instant;

use crate::phase::Phase;

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

/// One operation's metric handles, registered on its first call with the recorder installed
/// then (install the recorder at start-up, before the first call; without one, phases are
/// not timed at all). Cached so that a call
/// does not build label sets and look handles up on every increment, which would be a large
/// part of a replay's cost (docs/benchmarks.md).
#[derive(Debug)]
pub(crate) struct OpMetrics {
    pub(crate) hits: Counter,
    pub(crate) misses: Counter,
    pub(crate) takeovers: Counter,
    pub(crate) waits: Counter,
    pub(crate) rejections: Counter,
    pub(crate) key_reuse: Counter,
    pub(crate) lease_lost: Counter,
    pub(crate) completion_failed: Counter,
    pub(crate) results_unavailable: Counter,
    pub(crate) unprotected_store_unavailable: Counter,
    pub(crate) unprotected_in_flight: Counter,
    store_errors: [Counter; PHASES.len()],
    phase_seconds: [Histogram; PHASES.len()],
    /// Whether phases are timed: a recorder was installed when the handles were registered.
    /// Without one every handle is a no-op, and the clock reads that would only feed
    /// `idemkit_phase_seconds` are skipped: most of a MemoryStore replay's clock reads, a
    /// sizeable part of its time (docs/benchmarks.md).
    timed: bool,
}

const PHASES: [Phase; 6] = [
    Phase::Begin,
    Phase::Wait,
    Phase::Action,
    Phase::Renew,
    Phase::Complete,
    Phase::Release,
];

fn index(phase: Phase) -> usize {
    PHASES
        .iter()
        .position(|p| *p == phase)
        .expect("every phase is listed")
}

impl OpMetrics {
    pub(crate) fn register(op: SharedString) -> Self {
        let c = |name: &'static str| metrics::counter!(name, "operation" => op.clone());
        let unprotected = |reason: &'static str| metrics::counter!(UNPROTECTED_RUNS, "operation" => op.clone(), "reason" => reason);
        // `metrics` hands out no-op handles without a recorder, and has no way to ask for
        // one. Its no-op recorder is zero-sized; a real one keeps state (a zero-sized
        // recorder that records into statics would lose its phase timings: documented).
        let timed = metrics::with_recorder(|r| std::mem::size_of_val(r) > 0);
        OpMetrics {
            timed,
            hits: c(HITS),
            misses: c(MISSES),
            takeovers: c(TAKEOVERS),
            waits: c(WAITS),
            rejections: c(REJECTIONS),
            key_reuse: c(KEY_REUSE),
            lease_lost: c(LEASE_LOST),
            completion_failed: c(COMPLETION_FAILED),
            results_unavailable: c(RESULTS_UNAVAILABLE),
            unprotected_store_unavailable: unprotected("store_unavailable"),
            unprotected_in_flight: unprotected("in_flight"),
            store_errors: PHASES.map(|p| {
                metrics::counter!(STORE_ERRORS, "operation" => op.clone(), "phase" => p.as_str())
            }),
            phase_seconds: PHASES.map(|p| {
                metrics::histogram!(PHASE_SECONDS, "operation" => op.clone(), "phase" => p.as_str())
            }),
        }
    }

    pub(crate) fn store_error(&self, phase: Phase) {
        self.store_errors[index(phase)].increment(1);
    }

    /// When a timed phase starts: `None` (no clock read) when phases are not timed.
    pub(crate) fn start(&self) -> Option<Instant> {
        self.timed.then(Instant::now)
    }

    /// Records a phase that started at `started` (from [`start`](OpMetrics::start), or an
    /// instant the caller read for its own use), if phases are timed.
    pub(crate) fn timing(&self, phase: Phase, started: impl Into<Option<Instant>>) {
        if let (true, Some(started)) = (self.timed, started.into()) {
            self.phase_seconds[index(phase)].record(started.elapsed().as_secs_f64());
        }
    }
}
