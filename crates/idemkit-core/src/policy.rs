//! What the coordinator does in each situation the store reports.

use std::time::Duration;

/// What a caller does when another owner holds the key and is still running.
///
/// # Example
///
/// ```
/// use idemkit_core::{InFlight, Policy};
///
/// let policy = Policy::default().in_flight(InFlight::Reject);
/// assert_eq!(policy.in_flight, InFlight::Reject);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InFlight {
    /// Wait for the owner's result (woken by the store when it completes or releases). The
    /// wait follows the owner's lease: as long as the owner renews, the caller keeps waiting,
    /// up to [`Policy::wait_timeout`] in all; if the owner's lease expires, the caller takes
    /// the key over and runs the action itself. The default.
    Wait,
    /// Return [`Error::InFlight`](crate::Error::InFlight) at once, with a `retry_after` (the
    /// time left on the owner's lease, or [`Policy::retry_hint`] minus how long the owner has
    /// held the key): a queue worker requeues, an HTTP handler answers 409 with `Retry-After`.
    Reject,
    /// Run the action anyway, unprotected (its result is not stored). Counted and logged.
    Run,
}

/// What a caller does when the store fails before the action ran.
///
/// # Example
///
/// ```
/// use idemkit_core::{OnStoreError, Policy};
///
/// assert_eq!(Policy::default().on_store_error, OnStoreError::FailClosed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Return [`Error::Store`](crate::Error::Store) and run nothing. The default: the
    /// transports idemkit sits behind redeliver (queues) or retry (HTTP clients), so a refused
    /// call is retried later, while a duplicate charge or email cannot be taken back.
    FailClosed,
    /// Run the action unprotected, log at `warn` and count `idemkit_unprotected_runs_total`.
    /// Only for store *unavailability* ([`StoreErrorKind::Unavailable`]); a corrupt record or a
    /// refused request always fails closed, so a bad record can never switch protection off.
    ///
    /// [`StoreErrorKind::Unavailable`]: crate::StoreErrorKind::Unavailable
    FailOpen,
}

/// What happens to a reservation when its call's future is dropped while the action runs
/// (a `select!` or timeout around the call, a task aborted, a runtime shutting down).
///
/// A dropped action stopped at an arbitrary `.await`: its effect may be half done, or sent
/// and still landing downstream (a request on the wire, a message in a producer's buffer).
/// A crashed process leaves its key reserved until the lease ends; by default a dropped call
/// does the same, so a retry cannot run the effect again while the first attempt may still
/// be taking effect. A call dropped after its action returned `Ok` always stores the result
/// (ARCHITECTURE.md rows 17 and 18).
///
/// # Example
///
/// ```
/// use idemkit_core::{OnCancel, Policy};
///
/// assert_eq!(Policy::default().on_cancel, OnCancel::KeepLease);
/// let eager = Policy::default().on_cancel(OnCancel::Release);
/// assert_eq!(eager.on_cancel, OnCancel::Release);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnCancel {
    /// Leave the reservation to expire with its lease (it is no longer renewed): the next
    /// delivery runs after at most one lease. The default, and what a crash does.
    KeepLease,
    /// Release the reservation at once (from a background task), so the next delivery runs
    /// now. For actions that are safe to repeat as soon as they are cancelled (nothing
    /// leaves the process before they return).
    Release,
}

/// The coordinator's policy, set per coordinator and overridable per operation and per call.
///
/// | field | default | why |
/// |---|---|---|
/// | `in_flight` | [`InFlight::Wait`] | a duplicate gets the same answer as the original |
/// | `on_store_error` | [`OnStoreError::FailClosed`] | see there |
/// | `lease` | 15 s | renewed every third (5 s); a dead owner blocks its key for at most 15 s |
/// | `wait_timeout` | 60 s | a waiter gives up with [`Error::InFlight`](crate::Error::InFlight) after this |
/// | `ttl` | 24 h | outlives a day of redeliveries and dead-letter re-drives (the seed's usual choice) |
/// | `max_result_bytes` | 1 MiB | a larger result is not stored; replays get `ResultUnavailable` |
/// | `store_timeout` | 5 s | a store call that has not answered by then counts as unavailable |
/// | `max_hold` | 1 h | an action still running after this stops renewing: its key can be taken over |
/// | `retry_hint` | `None` | `Error::InFlight`'s `retry_after` is the time left on the owner's lease |
/// | `on_cancel` | [`OnCancel::KeepLease`] | a dropped call's effect may still be landing: its retry waits out the lease |
///
/// Durations above [`Policy::MAX_DURATION`] (100 years) are clamped to it, so no deadline
/// computed from a policy can overflow. A zero `lease` or `ttl` is refused when a call runs,
/// with [`Error::Config`](crate::Error::Config), before anything is reserved.
///
/// # Choosing them for a queue
///
/// Keep the queue's visibility timeout (or Kafka's `max.poll.interval.ms`) above the
/// action's usual time, and `wait_timeout` below the visibility timeout, or use
/// [`InFlight::Reject`]: a waiter that outlives its own delivery makes the queue deliver the
/// message a third time.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{InFlight, Policy};
///
/// let p = Policy::default().lease(Duration::from_secs(30)).in_flight(InFlight::Reject);
/// assert_eq!(p.lease, Duration::from_secs(30));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Policy {
    /// What to do about a concurrent duplicate.
    pub in_flight: InFlight,
    /// What to do when the store is unavailable before the action.
    pub on_store_error: OnStoreError,
    /// How long a reservation holds without renewal. Renewed every third of it.
    pub lease: Duration,
    /// The longest a waiter waits in all.
    pub wait_timeout: Duration,
    /// The default retention of a completed record (a call's `ttl` overrides it).
    pub ttl: Duration,
    /// The largest encoded result (or stored permanent error) that is stored.
    pub max_result_bytes: usize,
    /// The longest one store call may take before it counts as unavailable. Renewals are
    /// bounded tighter: by a third of the lease.
    pub store_timeout: Duration,
    /// The longest an owner renews its lease. An action still running after this is
    /// presumed hung: renewals stop, the action is told (see
    /// [`Attempt::lease_lost`](crate::Attempt::lease_lost)) and, once the lease runs out, a
    /// duplicate takes the key over. Set it above the longest action you expect.
    pub max_hold: Duration,
    /// A typical action time, used to tell a rejected duplicate when to come back: its
    /// `retry_after` is this minus how long the owner has held the key (at least a tenth of
    /// it), never more than the time left on the owner's lease. `None`: the time left on
    /// the lease.
    pub retry_hint: Option<Duration>,
    /// What a call dropped while its action runs does with its reservation.
    pub on_cancel: OnCancel,
}

/// The shortest lease: renewing every third of it must still leave time to do anything.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(3);

const fn clamp(d: Duration) -> Duration {
    if d.as_secs() > Policy::MAX_DURATION.as_secs() {
        Policy::MAX_DURATION
    } else {
        d
    }
}

impl Policy {
    /// The defaults (see the table above).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Policy;
    /// assert_eq!(Policy::new(), Policy::default());
    /// ```
    pub const fn new() -> Self {
        Policy {
            in_flight: InFlight::Wait,
            on_store_error: OnStoreError::FailClosed,
            lease: Duration::from_secs(15),
            wait_timeout: Duration::from_secs(60),
            ttl: Duration::from_secs(24 * 3600),
            max_result_bytes: 1 << 20,
            store_timeout: Duration::from_secs(5),
            max_hold: Duration::from_secs(3600),
            retry_hint: None,
            on_cancel: OnCancel::KeepLease,
        }
    }

    /// The longest duration a policy holds (100 years): a "forever" TTL or wait timeout is
    /// clamped to it.
    pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

    /// Sets [`Policy::in_flight`].
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{InFlight, Policy};
    /// assert_eq!(Policy::new().in_flight(InFlight::Run).in_flight, InFlight::Run);
    /// ```
    pub const fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.in_flight = in_flight;
        self
    }

    /// Sets [`Policy::on_store_error`].
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::{OnStoreError, Policy};
    /// let p = Policy::new().on_store_error(OnStoreError::FailOpen);
    /// assert_eq!(p.on_store_error, OnStoreError::FailOpen);
    /// ```
    pub const fn on_store_error(mut self, on_store_error: OnStoreError) -> Self {
        self.on_store_error = on_store_error;
        self
    }

    /// Sets [`Policy::lease`]. A call refuses a lease under 3 ms with
    /// [`Error::Config`](crate::Error::Config).
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::Policy;
    /// assert_eq!(Policy::new().lease(Duration::MAX).lease, Policy::MAX_DURATION);
    /// ```
    pub const fn lease(mut self, lease: Duration) -> Self {
        self.lease = clamp(lease);
        self
    }

    /// Sets [`Policy::wait_timeout`].
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::Policy;
    /// assert_eq!(Policy::new().wait_timeout(Duration::from_secs(5)).wait_timeout.as_secs(), 5);
    /// ```
    pub const fn wait_timeout(mut self, wait_timeout: Duration) -> Self {
        self.wait_timeout = clamp(wait_timeout);
        self
    }

    /// Sets [`Policy::ttl`].
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::Policy;
    /// assert_eq!(Policy::new().ttl(Duration::from_secs(7 * 86400)).ttl.as_secs(), 604800);
    /// ```
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = clamp(ttl);
        self
    }

    /// Sets [`Policy::max_result_bytes`].
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::Policy;
    /// assert_eq!(Policy::new().max_result_bytes(64).max_result_bytes, 64);
    /// ```
    pub const fn max_result_bytes(mut self, max: usize) -> Self {
        self.max_result_bytes = max;
        self
    }

    /// Sets [`Policy::store_timeout`].
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::Policy;
    /// let p = Policy::new().store_timeout(Duration::from_millis(500));
    /// assert_eq!(p.store_timeout, Duration::from_millis(500));
    /// ```
    pub const fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = clamp(timeout);
        self
    }

    /// Sets [`Policy::max_hold`].
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::Policy;
    /// assert_eq!(Policy::new().max_hold(Duration::from_secs(60)).max_hold.as_secs(), 60);
    /// ```
    pub const fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = clamp(max_hold);
        self
    }

    /// Sets [`Policy::retry_hint`].
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_core::Policy;
    /// let p = Policy::new().retry_hint(Some(Duration::from_millis(300)));
    /// assert_eq!(p.retry_hint, Some(Duration::from_millis(300)));
    /// ```
    pub const fn retry_hint(mut self, hint: Option<Duration>) -> Self {
        self.retry_hint = match hint {
            Some(h) => Some(clamp(h)),
            None => None,
        };
        self
    }

    /// What a call dropped while its action runs does with its reservation (see
    /// [`OnCancel`]).
    ///
    /// # Example
    ///
    /// See [`OnCancel`].
    pub const fn on_cancel(mut self, on_cancel: OnCancel) -> Self {
        self.on_cancel = on_cancel;
        self
    }

    /// The `retry_after` to tell a rejected duplicate, from the owner's remaining lease and
    /// how long it has held the key (see [`Policy::retry_hint`]).
    pub(crate) fn retry_after(&self, lease_left: Duration, held_for: Option<Duration>) -> Duration {
        match self.retry_hint {
            None => lease_left,
            Some(hint) => {
                let left = hint.saturating_sub(held_for.unwrap_or(Duration::ZERO));
                left.max(hint / 10).min(lease_left)
            }
        }
    }

    /// How often an owner renews its lease: a third of it, so two renewals can fail (a store
    /// blip) before the lease runs out under a live owner.
    pub(crate) fn renew_every(&self) -> Duration {
        renew_every(self.lease)
    }
}

/// The renewal interval of a lease (see [`Policy::renew_every`]).
pub(crate) fn renew_every(lease: Duration) -> Duration {
    lease / 3
}

impl Default for Policy {
    fn default() -> Self {
        Self::new()
    }
}
