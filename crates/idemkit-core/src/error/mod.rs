//! The coordinator's error: one typed enum, generic over the action's own error.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

mod kind;
mod lease_lost;

use crate::phase::Phase;
pub use kind::{Disposition, ErrorKind};
pub use lease_lost::LeaseLost;

use crate::ident::KeyError;
use crate::record::{FencingToken, SharedHolder};
use crate::store::{BoxError, StoreError, StoreErrorKind};

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
        /// The original attempt: the owner's reservation's fencing token, which names it
        /// for as long as it runs (renewals keep it; a takeover or a retry after a release
        /// draws a new one) and is what its record, its log lines (`fencing`) and
        /// `idemkit inspect` show. `None` only for an error not made by the coordinator
        /// ([`Error::in_flight`]).
        attempt: Option<FencingToken>,
        /// The process running it, as its reservation records it, where the store reads it
        /// with the claim ([`Claim::InFlight`](crate::Claim::InFlight)'s `holder`: the
        /// MemoryStore and Redis do, the SQL stores do not).
        holder: Option<SharedHolder>,
    },
    /// The key was first used with a different request fingerprint; nothing ran, and nobody
    /// else's result was returned.
    KeyReused,
    /// The action ran now and failed, and a retry runs it again: its reservation was
    /// released (at once), or, for a permanent error that could not be stored, is left to
    /// end with its lease; a run without a reservation (fail-open, `InFlight::Run`) had none.
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
            attempt: None,
            holder: None,
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
    /// fresh action failure (its key released, or left to its lease). A stored or replayed permanent error is
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
                attempt,
                holder,
            } => Error::InFlight {
                retry_after,
                lease_left,
                held_for,
                attempt,
                holder,
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
            Error::Action(_) => f.write_str("the action failed; a retry runs it again"),
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
