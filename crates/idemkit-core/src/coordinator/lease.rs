//! The lease keeper: renewals while the owner works (the action, then its completion), the
//! lease-lost signal the action can watch, the maximum hold, and the guard that finishes a
//! dropped call. ARCHITECTURE.md rows 5-10, 17-22 and 25-27.

use std::future::Future;
use std::mem;
use std::pin::{Pin, pin};
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use crate::clock::{after, now};
use crate::ident::{Operation, StorageKey};
use crate::phase::Phase;
use crate::policy::{OnCancel, Policy};
use crate::record::RecordState;
use crate::store::{BeginRequest, CompleteRequest, Ownership, Store, StoreError};

pub(crate) use super::state::{Held, LeaseState};

/// Bounds one store call: no answer within `limit` is an outage, like a refused connection.
///
/// The timer is created (and boxed) only when the call is still pending after its first
/// poll: a store that answers at once (`MemoryStore`) pays neither the clock read nor the
/// timer, and the call's future stays small (it is moved on every call).
pub(crate) fn bounded<F, T>(limit: Duration, own: Option<Duration>, call: F) -> Bounded<F>
where
    F: Future<Output = Result<T, StoreError>>,
{
    Bounded {
        call,
        limit,
        // The store bounds its calls within our limit itself: no timer of ours.
        timed: own.is_none_or(|own| own > limit),
        timer: None,
        pending_since: None,
    }
}

pin_project_lite::pin_project! {
    /// See [`bounded`].
    pub(crate) struct Bounded<F> {
        #[pin]
        call: F,
        limit: Duration,
        timed: bool,
        timer: Option<Pin<Box<tokio::time::Sleep>>>,
        // When the call was first found pending (timed calls only): its start, read only
        // when the timer needs it anyway.
        pending_since: Option<Instant>,
    }
}

impl<F> Bounded<F> {
    /// When a timed call was first found pending (about when it was sent); `None` for a call
    /// that answered at its first poll, or one the store bounds itself.
    pub(crate) fn pending_since(&self) -> Option<Instant> {
        self.pending_since
    }
}

impl<F, T> Future for Bounded<F>
where
    F: Future<Output = Result<T, StoreError>>,
{
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(answer) = this.call.poll(cx) {
            return Poll::Ready(answer);
        }
        if !*this.timed {
            return Poll::Pending;
        }
        let limit = *this.limit;
        let since = this.pending_since;
        let timer = this.timer.get_or_insert_with(|| {
            let start = now();
            *since = Some(start);
            Box::pin(tokio::time::sleep_until(after(start, limit)))
        });
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(StoreError::unavailable(format!(
                "no answer within {} ms",
                limit.as_millis()
            )))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The owner's side of a reservation while it works.
pub(crate) struct Keeper<'a, S> {
    pub(crate) store: &'a S,
    pub(crate) key: &'a StorageKey,
    pub(crate) lease: Ownership,
    pub(crate) policy: &'a Policy,
    pub(crate) operation: &'a Operation,
    pub(crate) state: &'a LeaseState,
    /// When the reserving `begin` was sent: the hold is measured from here.
    pub(crate) reserved_at: Instant,
}

impl<S: Store> Keeper<'_, S> {
    /// Polls `work` (the action, then storing its outcome) and, beside it, renews the lease
    /// every third of it, until `work` is done. The renewal runs concurrently, so a slow
    /// store never stalls the work; the work is never cancelled by a failed renewal (aborting
    /// mid-effect is worse than finishing: the stale run's writes are refused by the owner
    /// check, downstream systems can refuse it by fencing token, and the action can watch
    /// [`Attempt::lease_lost`](super::Attempt::lease_lost)).
    ///
    /// `work` comes pinned by the caller: an `async fn` that took it by value would keep it
    /// twice in its state (the argument, and the pinned copy), and a call's state is moved
    /// on every call (docs/benchmarks.md).
    pub(crate) async fn keep_while<T>(&self, mut work: Pin<&mut impl Future<Output = T>>) -> T {
        let mut renewals = pin!(self.renewals());
        let mut renewing = true;
        loop {
            tokio::select! {
                biased;
                done = &mut work => return done,
                () = &mut renewals, if renewing => renewing = false,
            }
        }
    }

    /// Renews until the lease is lost or the maximum hold has passed. Each renewal is bounded
    /// by a third of the lease, so one that never answers cannot stop the next; after a
    /// failure the next try comes sooner (a quarter of the interval), and every try is
    /// scheduled from the last confirmed one, so two failures still leave a live lease.
    async fn renewals(&self) {
        let (op, key) = (self.operation, self.key);
        let every = self.policy.renew_every();
        let retry = (every / 4).max(Duration::from_millis(1));
        let mut next = after(self.reserved_at, every);
        loop {
            tokio::time::sleep_until(next).await;
            let sent = now();
            // The hold limit is for a hung action; once the action returned, the renewals
            // go on until its completion answers or gives up (rows 21 and 26), which is
            // bounded on its own: no try starts later than one lease after the first.
            if !self.state.completing.load(Ordering::SeqCst)
                && sent.duration_since(self.reserved_at) >= self.policy.max_hold
            {
                self.operation.metrics().lease_lost.increment(1);
                tracing::warn!(operation = %op, key = %key, max_hold_ms = self.policy.max_hold.as_millis() as u64,
                    "the action has held its key past max_hold: renewals stop, the key can be taken over when the lease ends");
                self.state.lose();
                return;
            }
            let limit = self.policy.store_timeout.min(every);
            match bounded(
                limit,
                self.store.call_timeout(),
                self.store.renew(self.key, &self.lease, self.policy.lease),
            )
            .await
            {
                Ok(()) => {
                    op.metrics().timing(Phase::Renew, sent);
                    self.state.confirm(after(sent, self.policy.lease));
                    next = after(sent, every);
                }
                Err(e) if e.is_lease_lost() => {
                    op.metrics().lease_lost.increment(1);
                    tracing::warn!(operation = %op, key = %key,
                        "lease lost while the owner works; its result will not be stored");
                    self.state.lose();
                    return;
                }
                Err(e) => {
                    op.metrics().store_error(Phase::Renew);
                    tracing::warn!(operation = %op, key = %key, error = %e, "lease renewal failed; retrying");
                    next = after(now(), retry);
                }
            }
        }
    }

    /// Stores the outcome, retrying an unavailable store with backoff while the lease lasts
    /// (the renewals go on meanwhile, and extend it if the store answers them), for one lease
    /// at most: the last try is sent just before the end the store confirmed, which the
    /// store's own lease outlasts, and no later than one lease after the first try was sent.
    /// Every try is bounded by `store_timeout`, also on a store that declares a bound of its
    /// own (a declared bound that does not hold must not hold the key for ever: review M2).
    /// So the caller has its answer at most one lease and two `store_timeout`s after its
    /// action returned. Returns whether it was stored.
    pub(crate) async fn complete(&self, completion: &CompleteRequest) -> bool {
        let (op, key) = (self.operation, self.key);
        self.state.completing.store(true, Ordering::SeqCst);
        // When the completion began: the first try's start, read only when that is timed
        // anyway (a recorder, or a try still pending at its first poll) or once a try failed
        // (most completions answer at once, and a clock read is a sizeable part of an
        // in-process call).
        let mut since = None;
        // How long before the confirmed end the last try goes out.
        let margin = (self.policy.lease / 20).min(Duration::from_millis(50));
        let mut backoff = Duration::from_millis(50);
        loop {
            let started = op.metrics().start();
            let mut call = pin!(bounded(
                self.policy.store_timeout,
                None,
                self.store.complete(self.key, &self.lease, completion),
            ));
            let result = call.as_mut().await;
            op.metrics().timing(Phase::Complete, started);
            let e = match result {
                Ok(()) => return true,
                Err(e) => e,
            };
            if e.is_lease_lost() {
                // Our lease expired and possibly another owner took the key over; its
                // record wins. The caller still gets this run's value: the action did run.
                op.metrics().lease_lost.increment(1);
                tracing::warn!(operation = %op, key = %key,
                    "lease lost before completion; the result was not stored");
                self.state.lose();
                return false;
            }
            op.metrics().store_error(Phase::Complete);
            let at = now();
            let since = *since.get_or_insert(started.or(call.pending_since()).unwrap_or(at));
            // Until the end the store confirmed, also when the owner stopped counting on it
            // (an action past `max_hold`): the store holds the lease until then, and a stored
            // result spares a duplicate run after it. But for one lease at most: a store
            // that renews and never completes must not hold the caller (and the key) until
            // `max_hold`.
            let last = self
                .state
                .held_until()
                .checked_sub(margin)
                .unwrap_or(at)
                .min(after(since, self.policy.lease));
            let retry_at = after(at, backoff).min(last);
            if !e.is_unavailable() || retry_at <= at {
                op.metrics().completion_failed.increment(1);
                tracing::warn!(operation = %op, key = %key, error = %e,
                    "the action ran but its outcome could not be stored; a retry after the lease expires will run it again");
                return false;
            }
            tracing::debug!(operation = %op, key = %key, error = %e, backoff_ms = backoff.as_millis() as u64,
                "completion failed; retrying while the lease lasts");
            // Boxed: only a failed completion waits, and an inline timer would enlarge every
            // owner's future.
            Box::pin(tokio::time::sleep_until(retry_at)).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

// ===== cancellation =====

/// What still has to happen to a reservation if the call's future is dropped now.
pub(crate) enum Pending {
    /// The action has not succeeded: release the key.
    Release,
    /// The action succeeded: store its outcome, so it is not run again.
    Complete(CompleteRequest),
    /// Nothing: the call finished the reservation itself.
    Done,
}

/// Finishes a reservation from a background task when the call's future is dropped.
pub(crate) struct Guard<'a, S: Store> {
    pub(crate) store: &'a S,
    pub(crate) key: &'a StorageKey,
    pub(crate) lease: Ownership,
    pub(crate) operation: &'a Operation,
    pub(crate) pending: Pending,
    /// What a drop mid-action does (row 17).
    pub(crate) on_cancel: OnCancel,
}

impl<S: Store> Guard<'_, S> {
    /// From here a drop stores `completion` (the action succeeded); it is kept here, and
    /// the call's own completion borrows it (a clone would copy the request and its
    /// `Arc`s on every call).
    pub(crate) fn completing(&mut self, completion: CompleteRequest) -> &CompleteRequest {
        self.pending = Pending::Complete(completion);
        match &self.pending {
            Pending::Complete(c) => c,
            _ => unreachable!("just set"),
        }
    }
}

impl<S: Store> Drop for Guard<'_, S> {
    fn drop(&mut self) {
        let pending = mem::replace(&mut self.pending, Pending::Done);
        match pending {
            Pending::Done => return,
            Pending::Release if self.on_cancel == OnCancel::KeepLease => {
                // Row 17: the cancelled effect may still be landing downstream; like a
                // crash, the key stays reserved until its lease (no longer renewed) ends.
                tracing::debug!(operation = %self.operation, key = %self.key,
                    "call dropped mid-action: the key stays reserved until its lease ends");
                return;
            }
            _ => {}
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the lease expires on its own
        };
        let (store, key, lease) = (self.store.clone(), self.key.clone(), self.lease);
        let operation = self.operation.clone();
        handle.spawn(async move {
            let result = match pending {
                Pending::Release => store.release(&key, &lease).await,
                Pending::Complete(c) => store.complete(&key, &lease, &c).await,
                Pending::Done => Ok(()),
            };
            match result {
                Ok(()) => {}
                Err(e) if e.is_lease_lost() => {
                    tracing::debug!(operation = %operation, key = %key, "a dropped call's lease was already gone");
                }
                Err(e) => {
                    tracing::warn!(operation = %operation, key = %key, error = %e,
                        "finishing a dropped call failed; the key unlocks when its lease expires");
                }
            }
        });
    }
}

/// Armed while a call's `begin` is on the wire: if the call is dropped then, the `begin`
/// may still reserve the key for an owner token nobody holds any more, so the drop hands
/// it to [`release_orphan`] (review L4), as a `begin` that failed as unavailable is.
pub(crate) struct OrphanGuard<'a, S: Store> {
    pub(crate) store: &'a S,
    pub(crate) req: &'a BeginRequest<'a>,
    /// The end of the lease the `begin` asked for: no orphan outlives it.
    pub(crate) until: Instant,
    pub(crate) store_timeout: Duration,
    pub(crate) armed: bool,
}

impl<S: Store> Drop for OrphanGuard<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            release_orphan(self.store, self.req, self.until, self.store_timeout);
        }
    }
}

/// Row 19: a `begin` whose answer was lost (it timed out, or the connection dropped after
/// the request went out) may have reserved the key for its owner token. Nobody would ever
/// release that reservation: every retry would wait out its lease. So a background task
/// reads the key (`Store::get`, which never reserves anything) and releases a reservation
/// held by this owner token; it reads again once more after `store_timeout` (a slow begin
/// may land after the first read), retrying while the store is unavailable, until the
/// orphan's lease would have ended anyway.
pub(crate) fn release_orphan<S: Store>(
    store: &S,
    req: &BeginRequest<'_>,
    until: Instant,
    store_timeout: Duration,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return; // no runtime: the lease expires on its own
    };
    let (store, key, owner) = (store.clone(), req.key.clone(), req.owner);
    handle.spawn(async move {
        let mut backoff = Duration::from_millis(50);
        let mut second_look = Some(store_timeout);
        loop {
            let next = match bounded(store_timeout, store.call_timeout(), store.get(&key)).await {
                Ok(Some(r)) if r.owner == owner && matches!(r.state, RecordState::Reserved) => {
                    let ownership = Ownership::new(owner, r.fencing);
                    let released =
                        bounded(store_timeout, store.call_timeout(), store.release(&key, &ownership))
                            .await;
                    match released {
                        Err(e) if !e.is_lease_lost() => {
                            tracing::debug!(key = %key, error = %e,
                                "releasing a lost begin's reservation failed; it expires with its lease");
                        }
                        _ => tracing::debug!(key = %key, "released a lost begin's reservation"),
                    }
                    return;
                }
                Ok(_) => match second_look.take() {
                    Some(later) => after(now(), later),
                    None => return,
                },
                Err(e) if !e.is_unavailable() => return,
                Err(_) => {
                    let next = after(now(), backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    next
                }
            };
            if next >= until {
                return;
            }
            tokio::time::sleep_until(next).await;
        }
    });
}
