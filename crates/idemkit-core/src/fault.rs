//! Named points where a test can stop a worker process, as `kill -9` would, to prove what a
//! crash there does: [`FaultPoint`], set by the `IDEMKIT_STOP_AT` environment variable of a
//! process built with the `fault-points` feature (tests enable it through `idemkit-test`'s
//! feature of the same name; see `idemkit_test::faults`). Without the feature, [`hit`] is
//! an empty inline function: nothing is read, nothing can stop.

/// The environment variable naming the point to stop at ([`FaultPoint::name`]).
pub const STOP_AT: &str = "IDEMKIT_STOP_AT";

/// A point in a call or a runner where a test may stop its process.
///
/// # Example
///
/// ```
/// use idemkit_core::fault::FaultPoint;
///
/// assert_eq!(FaultPoint::parse("before-ack"), Some(FaultPoint::BeforeAck));
/// assert_eq!(FaultPoint::AfterAction.name(), "after-action");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultPoint {
    /// The action returned its value (its effect happened); nothing is stored yet: the
    /// completion has not been sent. A crash here leaves the key reserved until its lease
    /// ends; the next delivery runs the action again (protect the effect downstream with
    /// the attempt's downstream key).
    AfterAction,
    /// A runner settled a delivery (its result stored, or its dead letter sent) and has not
    /// acknowledged it to the broker (Kafka: the offset is not stored; JetStream: no `ack`).
    /// A crash here redelivers the message, whose call is then a replay.
    BeforeAck,
    /// An inbox handler (`idemkit_postgres::Inbox::handler`) committed its database effect
    /// with its inbox row and has not run its external effect. A crash here leaves the key
    /// reserved until its lease ends; the next delivery finds the claim committed, skips the
    /// database effect and sends the external one.
    AfterInboxCommit,
}

impl FaultPoint {
    /// Every point.
    pub const ALL: [FaultPoint; 3] = [
        FaultPoint::AfterAction,
        FaultPoint::BeforeAck,
        FaultPoint::AfterInboxCommit,
    ];

    /// The point's name, as `IDEMKIT_STOP_AT` spells it.
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::AfterAction => "after-action",
            FaultPoint::BeforeAck => "before-ack",
            FaultPoint::AfterInboxCommit => "after-inbox-commit",
        }
    }

    /// The point a name names.
    pub fn parse(name: &str) -> Option<FaultPoint> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl std::fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Called by the coordinator and the runners at each point: with the `fault-points` feature
/// and `IDEMKIT_STOP_AT` naming this point, the process stops here at once
/// (`std::process::abort`: no destructor, no flush, no release), after one line on stderr.
#[inline]
pub fn hit(point: FaultPoint) {
    #[cfg(feature = "fault-points")]
    armed::hit(point);
    #[cfg(not(feature = "fault-points"))]
    let _ = point;
}

#[cfg(feature = "fault-points")]
mod armed {
    use std::sync::OnceLock;

    use super::{FaultPoint, STOP_AT};

    pub(super) fn hit(point: FaultPoint) {
        static ASKED: OnceLock<Option<FaultPoint>> = OnceLock::new();
        let asked = ASKED.get_or_init(|| {
            let name = std::env::var(STOP_AT).ok()?;
            let parsed = FaultPoint::parse(&name);
            if parsed.is_none() {
                eprintln!("idemkit: {STOP_AT}={name:?} names no fault point; ignored");
            }
            parsed
        });
        if *asked == Some(point) {
            eprintln!("idemkit: stopped at {point} ({STOP_AT})");
            std::process::abort();
        }
    }
}
