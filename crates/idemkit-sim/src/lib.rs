//! A seeded simulation of idemkit's coordinator, and an independent checker of what it did.
//!
//! One seed draws a policy, a fault mix and a crowd of callers racing on a few keys over a
//! `MemoryStore` behind [`SimStore`], which delays calls, fails them, loses replies after the
//! store applied them, applies them after their caller gave up, takes the store down and
//! makes it forget. Actions take random time (some past the lease), some panic, some are
//! killed mid-run; callers redeliver what failed, as a queue would; some come in a batch,
//! some complete through a `Completer`. Time is tokio's paused clock, so a run of many
//! simulated seconds takes milliseconds, and the same seed replays the same run.
//!
//! [`check`] reads the [`History`] (what the store really did, every effect with its
//! fencing token, every answer) and fails on a stale write accepted, a key reserved again
//! after its completion, an effect done under a lease another owner held, a replay that
//! differs from what was stored, a fresh result reported stored and not stored, a completion
//! that gave up while its lease was still confirmed, a waiter past its bound, an unexpected
//! panic, or a caller that never answered. Second effects of a key in a documented
//! [`Window`] are counted, not failed.
//!
//! ```
//! let history = idemkit_sim::run(7);
//! let tally = idemkit_sim::check(&history).expect("seed 7 keeps every guarantee");
//! assert_eq!(tally.answers, history.answers.len());
//! ```
//!
//! `cargo test -p idemkit-sim` runs the seeds CI runs; `IDEMKIT_SIM_SEEDS=100000` runs more
//! (the soak), `IDEMKIT_SIM_SEED=1234` replays one and prints its history.
#![forbid(unsafe_code)]
// A harness, not a library API: the history's types are plain data whose fields are named
// for what they hold; the modules say what each event means.
#![allow(missing_docs)]

mod check;
mod scenario;
mod store;

pub use check::{Tally, Violation, Window, check};
pub use scenario::{
    Answer, DELIBERATE, Effect, History, Outcome, Setup, quiet_deliberate_panics, run, run_on,
    setup,
};
pub use store::{Faults, SimStore, StoreEvent};
