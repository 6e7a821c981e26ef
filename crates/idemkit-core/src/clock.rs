//! The one place that reads time.
//!
//! Leases and TTLs are measured on [`tokio::time::Instant`], so tests can pause and advance
//! time (`tokio::time::pause`) instead of sleeping. Records also carry wall-clock timestamps
//! for people (`created`, `expires`, as `Store::get` reports them); [`Clock`] derives those from the
//! same monotonic instant, so a paused test sees consistent wall times too.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Monotonic now, pausable in tests.
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// `Instant + Duration` that cannot panic: policies clamp durations to 100 years, and this
/// saturates anything beyond the platform's range to a far future that is never reached.
pub(crate) fn after(from: Instant, d: Duration) -> Instant {
    from.checked_add(d)
        .unwrap_or_else(|| from + Duration::from_secs(30 * 365 * 24 * 3600))
}

/// Maps the monotonic clock to Unix milliseconds, anchored once at construction.
///
/// # Example
///
/// ```
/// use idemkit_core::clock::Clock;
///
/// let clock = Clock::system();
/// let a = clock.unix_ms(clock.now());
/// assert!(a > 1_600_000_000_000);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    anchor: Instant,
    anchor_unix_ms: u64,
}

impl Clock {
    /// A clock anchored at the system's wall time now.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::clock::Clock;
    /// let _ = Clock::system();
    /// ```
    #[allow(clippy::disallowed_methods)] // the one sanctioned read of the wall clock
    pub fn system() -> Self {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Clock {
            anchor: now(),
            anchor_unix_ms: unix.as_millis() as u64,
        }
    }

    /// Monotonic now (paused in tests under `tokio::time::pause`).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::clock::Clock;
    /// let c = Clock::system();
    /// assert!(c.now() >= c.now() - std::time::Duration::from_millis(1));
    /// ```
    pub fn now(&self) -> Instant {
        now()
    }

    /// Unix milliseconds of a monotonic instant.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::clock::Clock;
    /// let c = Clock::system();
    /// let t = c.now();
    /// assert_eq!(c.unix_ms(t + std::time::Duration::from_secs(1)), c.unix_ms(t) + 1000);
    /// ```
    pub fn unix_ms(&self, at: Instant) -> u64 {
        if at >= self.anchor {
            self.anchor_unix_ms + (at - self.anchor).as_millis() as u64
        } else {
            self.anchor_unix_ms
                .saturating_sub((self.anchor - at).as_millis() as u64)
        }
    }
}
