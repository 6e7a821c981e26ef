//! The phases of a call: what errors, metrics and spans name. A leaf: it imports nothing of
//! the crate, so `error`, `observe` and `ident` can all use it.

use std::fmt;

/// A phase of a call, for errors, metrics and spans.
///
/// # Example
///
/// ```
/// use idemkit_core::Phase;
///
/// assert_eq!(Phase::Begin.as_str(), "begin");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Reserve, replay or report in flight.
    Begin,
    /// Waiting for another owner.
    Wait,
    /// The action itself.
    Action,
    /// Extending the lease.
    Renew,
    /// Storing the result.
    Complete,
    /// Deleting the reservation after an error.
    Release,
}

impl Phase {
    /// The phase's name, as used in metrics labels.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Phase;
    /// assert_eq!(Phase::Complete.as_str(), "complete");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Begin => "begin",
            Phase::Wait => "wait",
            Phase::Action => "action",
            Phase::Renew => "renew",
            Phase::Complete => "complete",
            Phase::Release => "release",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}
