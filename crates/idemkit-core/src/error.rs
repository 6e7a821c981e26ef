//! The coordinator's error: one typed enum, generic over the action's own error.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::KeyError;
use crate::store::{BoxError, StoreError, StoreErrorKind};

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

/// What a call's error means for its caller, by kind. [`Error::disposition`] turns it into
/// one decision for a transport, and [`Error::http_status`] into a status code.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{Error, ErrorKind};
///
/// let e: Error<std::io::Error> = Error::in_flight(Duration::from_secs(2));
/// assert_eq!(e.kind(), ErrorKind::InFlight);
/// assert!(e.is_retryable());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The operation, key or scope is invalid.
    InvalidInput,
    /// The call's policy cannot work (a zero TTL, a lease under 3 ms).
    Config,
    /// Another caller holds the key.
    InFlight,
    /// The key was used before for a different request.
    KeyReused,
    /// The action failed (now, or earlier and the failure was stored as permanent).
    Action,
    /// The action succeeded earlier but its result could not be kept.
    ResultUnavailable,
    /// A stored result does not decode.
    Decode,
    /// The store was unreachable or did not answer in time (fail-closed).
    StoreUnavailable,
    /// Any other store failure: a corrupt or foreign record, a refused request.
    Store,
}

/// What a transport should do with the message or request whose call failed: the one
/// decision every integration reads (queue and Kafka runners, the HTTP layer).
///
/// | error | disposition | HTTP status |
/// |---|---|---|
/// | [`Error::InvalidKey`] | `DeadLetter` | 400 |
/// | [`Error::Config`] | `DeadLetter` | 500 |
/// | [`Error::InFlight`] | `Retry { after: Some(retry_after) }` | 409 + `Retry-After` |
/// | [`Error::KeyReused`] | `DeadLetter` | 422 |
/// | [`Error::Action`] (key released) | `Retry { after: None }` | the action's own |
/// | [`Error::ActionStored`], [`Error::ReplayedAction`] | `DeadLetter` | the action's own |
/// | [`Error::ResultUnavailable`] | `Ack` (the effect happened) | 500 |
/// | [`Error::Decode`] | `DeadLetter` | 500 |
/// | [`Error::Store`], store unavailable | `Retry { after: None }` | 503 |
/// | [`Error::Store`], phase `Complete`, lease lost (a [`Completer`](crate::Completer)'s transaction: the effect rolled back) | `Retry { after: None }` | 500 |
/// | [`Error::Store`], any other store error | `DeadLetter` | 500 |
///
/// `Ack` means acknowledge (commit the offset): nothing is left to do. `Retry` means
/// deliver again (requeue, nack with a delay, seek back) after `after` if given, else after
/// the transport's own backoff. `DeadLetter` means retrying the same message cannot succeed:
/// park it for a person (an HTTP server answers the error status).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{Disposition, Error};
///
/// let e = Error::<std::io::Error>::in_flight(Duration::from_millis(300));
/// assert_eq!(e.disposition(), Disposition::Retry { after: Some(Duration::from_millis(300)) });
/// assert_eq!(Error::<std::io::Error>::KeyReused.disposition(), Disposition::DeadLetter);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// Acknowledge: the effect happened, nothing is left to do.
    Ack,
    /// Deliver again, after this long if given.
    Retry {
        /// When to come back, if the error says.
        after: Option<Duration>,
    },
    /// Retrying cannot help: dead-letter (or answer the error, over HTTP).
    DeadLetter,
}

/// Why a call did not return the action's value.
///
/// `E` is the action's own error type. `Error<E>` displays for every `E` (the action's own
/// error is not part of the message: it is the error's [`source`](StdError::source) when `E`
/// is an error type, and [`Error::into_action_error`] returns it).
///
/// # Example
///
/// ```
/// use idemkit_core::{Coordinator, Error, Key, MemoryStore, Operation};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let c = Coordinator::new(MemoryStore::new());
/// let (op, key) = (Operation::new("op")?, Key::new("k")?);
/// let r = c.call(&op, &key).run(|_| async { Err::<u32, _>("smtp down") }).await;
/// assert!(matches!(r, Err(Error::Action("smtp down"))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error<E> {
    /// An operation, key or scope failed validation; nothing ran. The coordinator never
    /// returns it itself (its arguments are already valid): it is here so that a handler
    /// that builds its key with `?` gets one error type.
    InvalidKey(KeyError),
    /// The call's policy cannot work; nothing ran.
    Config {
        /// What is wrong.
        reason: &'static str,
    },
    /// Another caller holds the key (reject mode, or a wait that timed out); nothing ran.
    InFlight {
        /// When to come back: the policy's [`retry_hint`](crate::Policy::retry_hint) minus how
        /// long the owner has held the key, or else the time left on the owner's lease.
        retry_after: Duration,
        /// Time left on the owner's lease when last seen: the owner's result exists by then,
        /// or the key can be taken over.
        lease_left: Duration,
        /// How long the owner has held the key, if the store knows.
        held_for: Option<Duration>,
    },
    /// The key was first used with a different request fingerprint; nothing ran, and nobody
    /// else's result was returned.
    KeyReused,
    /// The action ran now and failed; its reservation was released, so a retry runs it again.
    Action(E),
    /// The action ran now and failed permanently: the error was stored, and later calls get
    /// it as [`Error::ReplayedAction`] without running the action.
    ActionStored(E),
    /// The action failed permanently on an earlier call; this is that stored error, replayed.
    ReplayedAction(E),
    /// The action succeeded on an earlier call, but its result could not be stored (too large,
    /// or the codec failed). The effect happened; it will not run again within the TTL.
    ResultUnavailable {
        /// Why it was not stored.
        reason: String,
    },
    /// A stored result could not be decoded with this call's codec; nothing ran.
    Decode(BoxError),
    /// The store failed in a phase where the call could not go on; for `Begin` and `Wait`
    /// nothing ran.
    Store {
        /// Where.
        phase: Phase,
        /// The store's error.
        source: StoreError,
    },
}

impl<E> Error<E> {
    /// An [`Error::InFlight`] whose owner has `lease_left` on its lease, told to come back
    /// then.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::Error;
    /// let e = Error::<()>::in_flight(Duration::from_secs(3));
    /// assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
    /// ```
    pub fn in_flight(lease_left: Duration) -> Self {
        Error::InFlight {
            retry_after: lease_left,
            lease_left,
            held_for: None,
        }
    }

    /// What the error means for the caller.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Error, ErrorKind};
    /// assert_eq!(Error::<()>::KeyReused.kind(), ErrorKind::KeyReused);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidKey(_) => ErrorKind::InvalidInput,
            Error::Config { .. } => ErrorKind::Config,
            Error::InFlight { .. } => ErrorKind::InFlight,
            Error::KeyReused => ErrorKind::KeyReused,
            Error::Action(_) | Error::ActionStored(_) | Error::ReplayedAction(_) => {
                ErrorKind::Action
            }
            Error::ResultUnavailable { .. } => ErrorKind::ResultUnavailable,
            Error::Decode(_) => ErrorKind::Decode,
            Error::Store { source, .. } if source.kind() == StoreErrorKind::Unavailable => {
                ErrorKind::StoreUnavailable
            }
            Error::Store { .. } => ErrorKind::Store,
        }
    }

    /// What a transport should do about it (the table on [`Disposition`]).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{Disposition, Error};
    /// assert_eq!(Error::Action(1).disposition(), Disposition::Retry { after: None });
    /// assert_eq!(Error::ActionStored(1).disposition(), Disposition::DeadLetter);
    /// ```
    pub fn disposition(&self) -> Disposition {
        match self {
            Error::InFlight { retry_after, .. } => Disposition::Retry {
                after: Some(*retry_after),
            },
            Error::Action(_) => Disposition::Retry { after: None },
            Error::ResultUnavailable { .. } => Disposition::Ack,
            Error::Store { source, .. } if source.kind() == StoreErrorKind::Unavailable => {
                Disposition::Retry { after: None }
            }
            // Only a `Completer` (the caller's transaction) reports a lost lease: the
            // completion was refused, so the effect rolled back with it and must run again.
            Error::Store {
                phase: Phase::Complete,
                source,
            } if source.kind() == StoreErrorKind::LeaseLost => Disposition::Retry { after: None },
            Error::InvalidKey(_)
            | Error::Config { .. }
            | Error::KeyReused
            | Error::ActionStored(_)
            | Error::ReplayedAction(_)
            | Error::Decode(_)
            | Error::Store { .. } => Disposition::DeadLetter,
        }
    }

    /// The HTTP status an API answers with (the table on [`Disposition`]); `None` for the
    /// action's own errors, which the application maps itself.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Error;
    /// assert_eq!(Error::<()>::KeyReused.http_status(), Some(422));
    /// assert_eq!(Error::Action(()).http_status(), None);
    /// ```
    pub fn http_status(&self) -> Option<u16> {
        Some(match self.kind() {
            ErrorKind::InvalidInput => 400,
            ErrorKind::InFlight => 409,
            ErrorKind::KeyReused => 422,
            ErrorKind::StoreUnavailable => 503,
            ErrorKind::Action => return None,
            ErrorKind::Config
            | ErrorKind::ResultUnavailable
            | ErrorKind::Decode
            | ErrorKind::Store => 500,
        })
    }

    /// Whether trying the same call later can succeed: in flight, store unavailable, or a
    /// fresh action failure whose key was released. A stored or replayed permanent error is
    /// not retryable: every retry replays it.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Error;
    /// assert!(!Error::<()>::KeyReused.is_retryable());
    /// assert!(Error::Action(()).is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(self.disposition(), Disposition::Retry { .. })
    }

    /// For [`Error::InFlight`], when to come back.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::Error;
    /// let e = Error::<()>::in_flight(Duration::from_secs(3));
    /// assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::InFlight { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The action's error, fresh, stored or replayed, if that is what this is.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Error;
    /// assert_eq!(Error::Action(7).into_action_error(), Some(7));
    /// ```
    pub fn into_action_error(self) -> Option<E> {
        match self {
            Error::Action(e) | Error::ActionStored(e) | Error::ReplayedAction(e) => Some(e),
            _ => None,
        }
    }

    /// Maps the action's error, keeping everything else.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Error;
    /// let e = Error::Action(7).map_action(|n| n.to_string());
    /// assert_eq!(e.into_action_error().as_deref(), Some("7"));
    /// ```
    pub fn map_action<F>(self, f: impl FnOnce(E) -> F) -> Error<F> {
        match self {
            Error::InvalidKey(e) => Error::InvalidKey(e),
            Error::Config { reason } => Error::Config { reason },
            Error::InFlight {
                retry_after,
                lease_left,
                held_for,
            } => Error::InFlight {
                retry_after,
                lease_left,
                held_for,
            },
            Error::KeyReused => Error::KeyReused,
            Error::Action(e) => Error::Action(f(e)),
            Error::ActionStored(e) => Error::ActionStored(f(e)),
            Error::ReplayedAction(e) => Error::ReplayedAction(f(e)),
            Error::ResultUnavailable { reason } => Error::ResultUnavailable { reason },
            Error::Decode(e) => Error::Decode(e),
            Error::Store { phase, source } => Error::Store { phase, source },
        }
    }
}

impl<E> From<KeyError> for Error<E> {
    fn from(e: KeyError) -> Self {
        Error::InvalidKey(e)
    }
}

/// The message says what idemkit saw; the action's own error is the [`source`](StdError::source).
impl<E> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey(e) => write!(f, "invalid idempotency key: {e}"),
            Error::Config { reason } => write!(f, "invalid idempotency policy: {reason}"),
            Error::InFlight { retry_after, .. } => write!(
                f,
                "in progress: another caller holds the key (retry after {} ms)",
                retry_after.as_millis()
            ),
            Error::KeyReused => f.write_str("idempotency key reused for a different request"),
            Error::Action(_) => f.write_str("the action failed; its key was released"),
            Error::ActionStored(_) => {
                f.write_str("the action failed permanently; the failure was stored")
            }
            Error::ReplayedAction(_) => f.write_str("the action failed earlier (replayed)"),
            Error::ResultUnavailable { reason } => {
                write!(f, "the action ran, but its result is unavailable: {reason}")
            }
            Error::Decode(e) => write!(f, "stored result does not decode: {e}"),
            Error::Store { phase, source } => write!(f, "store failed during {phase}: {source}"),
        }
    }
}

impl<E: StdError + 'static> StdError for Error<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Error::InvalidKey(e) => Some(e),
            Error::Action(e) | Error::ActionStored(e) | Error::ReplayedAction(e) => Some(e),
            Error::Decode(e) => Some(&**e),
            Error::Store { source, .. } => Some(source),
            _ => None,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Before: a completer's refused completion (the caller's transaction lost its lease,
    /// its effect rolled back) was dead-lettered like a corrupt record.
    #[test]
    fn a_completers_lost_lease_is_retried_not_dead_lettered() {
        let lost = Error::<()>::Store {
            phase: Phase::Complete,
            source: StoreError::lease_lost(),
        };
        assert_eq!(lost.disposition(), Disposition::Retry { after: None });
        assert!(lost.is_retryable());
        let corrupt = Error::<()>::Store {
            phase: Phase::Begin,
            source: StoreError::corrupt("bad magic"),
        };
        assert_eq!(corrupt.disposition(), Disposition::DeadLetter);
    }
}
