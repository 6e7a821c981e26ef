//! Stopping a worker at a named point, for a test of what a crash there does (the
//! `fault-points` feature, off by default; enable it on the dev-dependency only):
//!
//! ```toml
//! [dev-dependencies]
//! idemkit-test = { version = "0.1", features = ["fault-points"] }
//! ```
//!
//! The worker under test is a separate process (a binary or an example of the package, built
//! by `cargo test` with the dev-dependencies' features, so the points are armed in it); the
//! test starts it with [`stop_at`], and it stops at that point at once
//! (`std::process::abort`, as `kill -9` would: no destructor, no release, no commit), after
//! the line `idemkit: stopped at <point>` on its stderr. Nothing in the worker's code
//! changes: the coordinator and the runners carry the points ([`FaultPoint`]).
//!
//! ```no_run
//! use idemkit_test::faults::{FaultPoint, stop_at};
//!
//! let mut worker = std::process::Command::new(idemkit_test::example_binary("kafka_worker"));
//! // Killed between the invoice's completion and the offset's commit:
//! let status = stop_at(&mut worker, FaultPoint::BeforeAck).status().unwrap();
//! assert!(idemkit_test::faults::stopped(&status));
//! ```

pub use idemkit_core::fault::{FaultPoint, STOP_AT};

/// Makes the worker `cmd` will start stop at `point` (sets `IDEMKIT_STOP_AT`).
pub fn stop_at(cmd: &mut std::process::Command, point: FaultPoint) -> &mut std::process::Command {
    cmd.env(STOP_AT, point.name())
}

/// [`stop_at`] for tokio's `Command`.
pub fn stop_at_tokio(
    cmd: &mut tokio::process::Command,
    point: FaultPoint,
) -> &mut tokio::process::Command {
    cmd.env(STOP_AT, point.name())
}

/// Whether a worker's exit is a fault point's stop (`SIGABRT` on Unix), not a clean exit or
/// another failure.
pub fn stopped(status: &std::process::ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        status.signal() == Some(6)
    }
    #[cfg(not(unix))]
    {
        !status.success()
    }
}
