//! The action's own refusal to go on without its lease.

use std::time::Duration;

#[cfg(doc)]
use super::Error;

/// An action's refusal to take an irreversible step because its lease is lost, or ends
/// within the margin it asked for ([`Attempt::check_lease`](crate::Attempt::check_lease)):
/// another caller may take the key over and run the effect, so this one stops. Return it
/// from the action (with `?`: it converts into `std::io::Error`, `Box<dyn Error>` and
/// `anyhow::Error`); the call then fails with [`Error::Action`] and the effect runs on the
/// next delivery, or is already running elsewhere.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{Attempt, LeaseLost};
///
/// // An unprotected attempt has no lease to lose.
/// assert!(Attempt::unprotected().check_lease(Duration::from_secs(1)).is_ok());
/// let e = LeaseLost::new(Duration::from_millis(3));
/// assert_eq!(e.lease_left, Duration::from_millis(3));
/// let io: std::io::Error = e.into();
/// assert!(io.to_string().contains("lease"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the lease on this key is lost or about to end ({} ms left): another caller may run this effect",
    lease_left.as_millis()
)]
#[non_exhaustive]
pub struct LeaseLost {
    /// What was left of the lease, as the coordinator knows it (zero once it is lost).
    pub lease_left: Duration,
}

impl LeaseLost {
    /// One, with `lease_left` left.
    ///
    /// # Example
    ///
    /// See [`LeaseLost`].
    pub fn new(lease_left: Duration) -> Self {
        LeaseLost { lease_left }
    }
}

impl From<LeaseLost> for std::io::Error {
    fn from(e: LeaseLost) -> Self {
        std::io::Error::other(e)
    }
}
