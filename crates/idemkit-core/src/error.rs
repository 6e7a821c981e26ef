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

/// What a call's error means for its caller; one `match` decides retry, requeue or give up.
///
/// | kind | queue worker | HTTP |
/// |---|---|---|
/// | `InvalidInput` | dead-letter | 400 |
/// | `InFlight` | requeue after `retry_after` | 409 + `Retry-After` |
/// | `KeyReused` | dead-letter | 422 |
/// | `Action` | the action's own policy | the action's own mapping |
/// | `ResultUnavailable` | ack (the effect happened) | 500 |
/// | `Decode` | dead-letter, alert | 500 |
/// | `StoreUnavailable` | requeue | 503 |
/// | `Store` | dead-letter, alert | 500 |
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{Error, ErrorKind};
///
/// let e: Error<std::io::Error> = Error::InFlight { retry_after: Duration::from_secs(2) };
/// assert_eq!(e.kind(), ErrorKind::InFlight);
/// assert!(e.is_retryable());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The operation, key or scope is invalid.
    InvalidInput,
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
    /// The store was unreachable (fail-closed).
    StoreUnavailable,
    /// Any other store failure: a corrupt or foreign record, a refused request.
    Store,
}

/// Why a call did not return the action's value.
///
/// `E` is the action's own error type.
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
    /// An operation, key or scope failed validation; nothing ran.
    InvalidKey(KeyError),
    /// Another caller holds the key (reject mode, or a wait that timed out); nothing ran.
    InFlight {
        /// Time left on the owner's lease when last seen.
        retry_after: Duration,
    },
    /// The key was first used with a different request fingerprint; nothing ran, and nobody
    /// else's result was returned.
    KeyReused,
    /// The action ran now and failed. Its reservation was released (or, if classified
    /// permanent, the error was stored).
    Action(E),
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
            Error::InFlight { .. } => ErrorKind::InFlight,
            Error::KeyReused => ErrorKind::KeyReused,
            Error::Action(_) | Error::ReplayedAction(_) => ErrorKind::Action,
            Error::ResultUnavailable { .. } => ErrorKind::ResultUnavailable,
            Error::Decode(_) => ErrorKind::Decode,
            Error::Store { source, .. } if source.kind() == StoreErrorKind::Unavailable => {
                ErrorKind::StoreUnavailable
            }
            Error::Store { .. } => ErrorKind::Store,
        }
    }

    /// Whether trying the same call later can succeed: in flight, store unavailable, or a
    /// fresh action failure (its key was released).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Error;
    /// assert!(!Error::<()>::KeyReused.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::InFlight | ErrorKind::StoreUnavailable
        ) || matches!(self, Error::Action(_))
    }

    /// For [`Error::InFlight`], the time left on the owner's lease.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::Error;
    /// let e = Error::<()>::InFlight { retry_after: Duration::from_secs(3) };
    /// assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::InFlight { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    /// The action's error, fresh or replayed, if that is what this is.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Error;
    /// assert_eq!(Error::Action(7).into_action_error(), Some(7));
    /// ```
    pub fn into_action_error(self) -> Option<E> {
        match self {
            Error::Action(e) | Error::ReplayedAction(e) => Some(e),
            _ => None,
        }
    }
}

impl<E> From<KeyError> for Error<E> {
    fn from(e: KeyError) -> Self {
        Error::InvalidKey(e)
    }
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidKey(e) => write!(f, "invalid idempotency key: {e}"),
            Error::InFlight { retry_after } => write!(
                f,
                "in progress: another caller holds the key (retry after {} ms)",
                retry_after.as_millis()
            ),
            Error::KeyReused => f.write_str("idempotency key reused for a different request"),
            Error::Action(e) => write!(f, "action failed: {e}"),
            Error::ReplayedAction(e) => write!(f, "action failed earlier (replayed): {e}"),
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
            Error::Action(e) | Error::ReplayedAction(e) => Some(e),
            Error::Decode(e) => Some(&**e),
            Error::Store { source, .. } => Some(source),
            _ => None,
        }
    }
}
