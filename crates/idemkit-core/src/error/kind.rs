//! What kind of failure, and what a runner or an HTTP layer does with it.

use std::time::Duration;

#[cfg(doc)]
use super::Error;

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
