//! What the owner knows about its lease (`LeaseState`), shared by the keeper, the action's
//! [`Attempt`](super::Attempt) and the completion: the end it counts on, and the end the
//! store may hold. Invariant 2 of ARCHITECTURE.md lives here: the end the owner counts on is
//! never later than the store's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::clock::{after, now};

/// What the owner knows about its lease, shared with the action's [`Attempt`](super::Attempt).
#[derive(Debug)]
pub(crate) struct LeaseState {
    /// Set when the store said the lease is gone, or renewals stopped for good.
    lost: AtomicBool,
    /// Set once the action returned and its outcome is being stored: renewals then go on
    /// past `max_hold` (the hold limit is for hung actions, not for a slow completion).
    pub(super) completing: AtomicBool,
    /// The end of the lease as last confirmed by the store: the instant the confirming call
    /// was *sent*, plus the lease (the store's clock started no earlier than that). Moved
    /// back to the moment of loss when the lease is lost.
    confirmed_until: Mutex<Instant>,
    /// The same end, never moved back: when the owner stops counting on its lease
    /// (`max_hold`), the store still holds it until then, and a completion may still land.
    held_until: Mutex<Instant>,
    changed: Notify,
}

/// How long from a reservation's send its owner counts on it, and how long the store may
/// hold it. The same for a call's own `begin`; for a prepared claim under a call lease
/// shorter than its batch's, the owner counts the call's lease (its first renewal sets the
/// store's end to that: review M6 of `e047556`), while the store holds the batch's until a
/// renewal lands, and a completion may still land until then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub(crate) counted: Duration,
    pub(crate) stored: Duration,
}

impl Held {
    /// A reservation the owner counts on for as long as the store holds it.
    pub(crate) fn same(lease: Duration) -> Self {
        Held {
            counted: lease,
            stored: lease,
        }
    }
}

impl LeaseState {
    /// The state of a reservation sent at `sent`.
    pub(crate) fn reserved(sent: Instant, held: Held) -> Self {
        LeaseState {
            lost: AtomicBool::new(false),
            completing: AtomicBool::new(false),
            confirmed_until: Mutex::new(after(sent, held.counted)),
            held_until: Mutex::new(after(sent, held.stored)),
            changed: Notify::new(),
        }
    }

    /// What is left of the lease, as far as the owner knows (zero once lost).
    pub(crate) fn left(&self) -> Duration {
        if self.lost.load(Ordering::SeqCst) {
            return Duration::ZERO;
        }
        self.confirmed_until().saturating_duration_since(now())
    }

    pub(crate) fn confirmed_until(&self) -> Instant {
        *self
            .confirmed_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The end of the lease the store last confirmed, even once the owner stopped counting
    /// on it.
    pub(super) fn held_until(&self) -> Instant {
        *self
            .held_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn confirm(&self, until: Instant) {
        for end in [&self.confirmed_until, &self.held_until] {
            let mut at = end.lock().unwrap_or_else(PoisonError::into_inner);
            *at = (*at).max(until);
        }
    }

    pub(crate) fn lose(&self) {
        {
            let mut at = self
                .confirmed_until
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *at = (*at).min(now());
        }
        self.lost.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst) || now() >= self.confirmed_until()
    }

    /// Resolves once [`is_lost`](LeaseState::is_lost) holds.
    pub(crate) async fn lost(&self) {
        loop {
            let changed = self.changed.notified();
            if self.is_lost() {
                return;
            }
            let until = self.confirmed_until();
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }
}
