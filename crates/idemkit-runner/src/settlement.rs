//! What a runner does with one delivery, and how often a failing handler is retried.

use std::fmt;
use std::time::Duration;

use idemkit_core::{Disposition, Error, KeyError};

/// What a runner does with one delivery.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_runner::Settlement;
///
/// let s = Settlement::Retry { after: Duration::from_millis(200) };
/// assert!(!s.is_final());
/// assert!(Settlement::Ack.is_final());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settlement {
    /// Acknowledge (commit the offset, `ack`): the effect happened, now or earlier.
    Ack,
    /// Deliver again after `after` (nak with a delay, retry in place, requeue).
    Retry {
        /// How long to wait first.
        after: Duration,
    },
    /// Retrying cannot help, or the handler's retries are used up: park the message (a
    /// dead-letter topic, `term`, a user hook) and move on.
    DeadLetter {
        /// Why, in one line: goes into the dead-letter record.
        reason: String,
    },
}

impl Settlement {
    /// Whether the delivery is done with: acknowledged or dead-lettered.
    ///
    /// # Example
    ///
    /// See [`Settlement`].
    pub fn is_final(&self) -> bool {
        !matches!(self, Settlement::Retry { .. })
    }
}

/// How often a failing handler is retried, and how long to wait between tries.
///
/// The wait after the `n`-th failure is `initial * 2^(n-1)`, capped at `max`; no jitter
/// (the broker's own redelivery spreads workers out). The defaults: 5 deliveries, 100 ms
/// doubling to 30 s.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_runner::RetryPolicy;
///
/// let p = RetryPolicy::new().backoff(Duration::from_millis(100), Duration::from_secs(1));
/// assert_eq!(p.delay(1), Duration::from_millis(100));
/// assert_eq!(p.delay(3), Duration::from_millis(400));
/// assert_eq!(p.delay(10), Duration::from_secs(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_deliveries: u32,
    initial: Duration,
    max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_deliveries: 5,
            initial: Duration::from_millis(100),
            max: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The defaults: 5 deliveries, 100 ms doubling to 30 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many deliveries a failing handler gets before its message is dead-lettered
    /// (at least 1: 1 means no retry).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n.max(1);
        self
    }

    /// The first wait and the cap.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial = initial;
        self.max = max.max(initial);
        self
    }

    /// The configured number of deliveries.
    pub fn deliveries(&self) -> u32 {
        self.max_deliveries
    }

    /// The wait after the `failures`-th failure (1-based).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }

    /// The settlement of one delivery, from the call's result: the table in the
    /// [crate docs](crate). `delivery` is this delivery's number, 1 for the first.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemkit_runner::{RetryPolicy, Settlement};
    /// use idemkit_core::Error;
    ///
    /// let p = RetryPolicy::new().max_deliveries(2);
    /// let failed: Result<(), _> = Err(Error::Action("smtp down"));
    /// assert_eq!(p.settle(&failed, 1), Settlement::Retry { after: Duration::from_millis(100) });
    /// assert!(matches!(p.settle(&failed, 2), Settlement::DeadLetter { reason } if reason.contains("smtp down")));
    /// ```
    pub fn settle<T, E: fmt::Display>(
        &self,
        result: &Result<T, Error<E>>,
        delivery: u32,
    ) -> Settlement {
        let Err(error) = result else {
            return Settlement::Ack;
        };
        match (error, error.disposition()) {
            (_, Disposition::Ack) => Settlement::Ack,
            (Error::InFlight { retry_after, .. }, _) => Settlement::Retry {
                after: *retry_after,
            },
            (Error::Action(e), _) if delivery >= self.max_deliveries => Settlement::DeadLetter {
                reason: format!(
                    "the handler failed on delivery {delivery} of {}: {e}",
                    self.max_deliveries
                ),
            },
            (Error::Action(_), _) => Settlement::Retry {
                after: self.delay(delivery),
            },
            // A store outage is not the message's fault: back off, never dead-letter.
            (_, Disposition::Retry { after }) => Settlement::Retry {
                after: after.unwrap_or_else(|| self.delay(delivery)),
            },
            (e, _) => Settlement::DeadLetter {
                reason: dead_letter_reason(e),
            },
        }
    }

    /// The settlement of a message whose key function failed: dead-letter, never run
    /// unprotected.
    pub fn settle_key_error(&self, error: &KeyError) -> Settlement {
        Settlement::DeadLetter {
            reason: format!("the message names no valid effect key: {error}"),
        }
    }
}

fn dead_letter_reason<E: fmt::Display>(e: &Error<E>) -> String {
    match e {
        Error::ActionStored(inner) | Error::ReplayedAction(inner) => format!("{e}: {inner}"),
        _ => e.to_string(),
    }
}
