//! [`Probe`]: a store wrapper that counts calls per phase and injects faults.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, FencingToken, Ownership, RawStore, Record, StorageKey,
    Store, StoreError,
};
use tokio::sync::Notify;

/// A phase a [`Probe`] can fail.
///
/// # Example
///
/// ```
/// use idemkit_core::MemoryStore;
/// use idemkit_test::{Fault, Probe};
///
/// let probe = Probe::new(MemoryStore::new());
/// probe.fail(Fault::Begin, true);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// `begin` returns `Unavailable`.
    Begin,
    /// `renew` returns `Unavailable`.
    Renew,
    /// `complete` returns `Unavailable`.
    Complete,
    /// `release` returns `Unavailable`.
    Release,
    /// `wait` returns `Unavailable`.
    Wait,
}

/// Calls seen by a [`Probe`], per phase.
///
/// # Example
///
/// ```
/// let counts = idemkit_test::ProbeCounts::default();
/// assert_eq!(counts.total(), 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeCounts {
    /// `begin` calls.
    pub begin: usize,
    /// `renew` calls.
    pub renew: usize,
    /// `complete` calls.
    pub complete: usize,
    /// `release` calls.
    pub release: usize,
    /// `wait` calls.
    pub wait: usize,
    /// `get` calls.
    pub get: usize,
    /// `begin_many` calls (a batch's claim). The probe sends a batch's keys on one by one,
    /// each counted as a `begin` too, so every fault and count of `begin` applies to them.
    pub begin_many: usize,
}

impl ProbeCounts {
    /// All calls: the store round trips of the calls observed.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(idemkit_test::ProbeCounts::default().total(), 0);
    /// ```
    pub fn total(&self) -> usize {
        self.begin + self.renew + self.complete + self.release + self.wait + self.get
    }
}

#[derive(Debug, Default)]
struct State {
    calls: [AtomicUsize; 7],
    faults: [AtomicBool; 5],
    /// Per phase: how many of the next calls never answer (a store that accepted the
    /// request and went silent).
    hangs: [AtomicUsize; 5],
    /// While set, `complete` waits for [`Probe::open_complete`] before reaching the store.
    hold_complete: AtomicBool,
    complete_gate: Notify,
    /// Per phase: how many of the next calls reach the store and then never answer (the
    /// request applied, its reply lost).
    lost_replies: [AtomicUsize; 5],
    /// Per phase: how long each call waits before it reaches the store, in microseconds.
    delays: [AtomicU64; 5],
    /// The bound the probe declares as `Store::call_timeout`, in microseconds (0: none).
    declared_call_timeout: AtomicU64,
}

/// Wraps a store, counting calls per phase and failing chosen phases with `Unavailable`:
/// an outage at exactly the phase a test needs. The wrapped store is real; only the fault is
/// injected.
///
/// # Example
///
/// ```
/// use idemkit_core::MemoryStore;
/// use idemkit_test::Probe;
///
/// let probe = Probe::new(MemoryStore::new());
/// assert_eq!(probe.counts().begin, 0);
/// ```
#[derive(Debug, Clone)]
pub struct Probe<S> {
    inner: S,
    state: Arc<State>,
}

impl<S: Store> Probe<S> {
    /// Wraps a store.
    ///
    /// # Example
    ///
    /// See [`Probe`].
    pub fn new(inner: S) -> Self {
        Probe {
            inner,
            state: Arc::default(),
        }
    }

    /// The wrapped store.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::MemoryStore;
    /// let probe = idemkit_test::Probe::new(MemoryStore::new());
    /// assert!(probe.inner().is_empty());
    /// ```
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Makes a phase fail (`true`) or work (`false`).
    ///
    /// # Example
    ///
    /// See [`Fault`].
    pub fn fail(&self, fault: Fault, on: bool) {
        self.state.faults[fault as usize].store(on, Ordering::SeqCst);
    }

    /// Makes the next `n` calls of a phase never answer: they stay pending until the caller
    /// gives up (a store that took the request and went silent). Later calls work.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::MemoryStore;
    /// use idemkit_test::{Fault, Probe};
    /// let probe = Probe::new(MemoryStore::new());
    /// probe.hang_next(Fault::Renew, 1);
    /// ```
    pub fn hang_next(&self, fault: Fault, n: usize) {
        self.state.hangs[fault as usize].store(n, Ordering::SeqCst);
    }

    /// Makes the next `n` calls of a phase reach the inner store and then never answer: the
    /// store applied the request, the reply was lost (a connection cut after the write, a
    /// timeout on a slow reply).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_test::{Fault, Probe};
    /// let probe = Probe::new(idemkit_core::MemoryStore::new());
    /// probe.lose_reply_next(Fault::Begin, 1);
    /// ```
    pub fn lose_reply_next(&self, fault: Fault, n: usize) {
        self.state.lost_replies[fault as usize].store(n, Ordering::SeqCst);
    }

    /// Delays every call of a phase by `d` before it reaches the inner store (a slow store
    /// or a slow network); `Duration::ZERO` ends it.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use idemkit_test::{Fault, Probe};
    /// let probe = Probe::new(idemkit_core::MemoryStore::new());
    /// probe.delay(Fault::Complete, Duration::from_millis(150));
    /// ```
    pub fn delay(&self, fault: Fault, d: Duration) {
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.state.delays[fault as usize].store(micros, Ordering::SeqCst);
    }

    /// Declares `bound` as the probe's [`Store::call_timeout`] (`None`: none, the default), as
    /// a store that bounds its own calls would, so that the coordinator sets no timer of
    /// its own within it. The probe's hangs ignore it: that is a store whose declared bound
    /// does not hold, which the coordinator must survive too.
    ///
    /// # Example
    ///
    /// ```
    /// # use std::time::Duration;
    /// use idemkit_core::Store;
    /// let probe = idemkit_test::Probe::new(idemkit_core::MemoryStore::new());
    /// probe.declare_call_timeout(Some(Duration::from_secs(1)));
    /// assert_eq!(probe.call_timeout(), Some(Duration::from_secs(1)));
    /// ```
    pub fn declare_call_timeout(&self, bound: Option<Duration>) {
        let micros = bound.map_or(0, |d| {
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
        });
        self.state
            .declared_call_timeout
            .store(micros, Ordering::SeqCst);
    }

    /// Makes `complete` wait until [`open_complete`](Probe::open_complete).
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::MemoryStore;
    /// let probe = idemkit_test::Probe::new(MemoryStore::new());
    /// probe.hold_complete();
    /// probe.open_complete();
    /// ```
    pub fn hold_complete(&self) {
        self.state.hold_complete.store(true, Ordering::SeqCst);
    }

    /// Lets held and future `complete` calls through.
    ///
    /// # Example
    ///
    /// See [`hold_complete`](Probe::hold_complete).
    pub fn open_complete(&self) {
        self.state.hold_complete.store(false, Ordering::SeqCst);
        self.state.complete_gate.notify_waiters();
    }

    /// Calls so far.
    ///
    /// # Example
    ///
    /// See [`Probe`].
    pub fn counts(&self) -> ProbeCounts {
        let c = |i: usize| self.state.calls[i].load(Ordering::SeqCst);
        ProbeCounts {
            begin: c(0),
            renew: c(1),
            complete: c(2),
            release: c(3),
            wait: c(4),
            get: c(5),
            begin_many: c(6),
        }
    }

    /// Resets the counts to zero.
    ///
    /// # Example
    ///
    /// ```
    /// # use idemkit_core::MemoryStore;
    /// let probe = idemkit_test::Probe::new(MemoryStore::new());
    /// probe.reset_counts();
    /// assert_eq!(probe.counts().total(), 0);
    /// ```
    pub fn reset_counts(&self) {
        for c in &self.state.calls {
            c.store(0, Ordering::SeqCst);
        }
    }

    async fn enter(&self, call: usize, fault: Option<Fault>) -> Result<(), StoreError> {
        self.state.calls[call].fetch_add(1, Ordering::SeqCst);
        if let Some(f) = fault {
            let hangs = &self.state.hangs[f as usize];
            if hangs
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                std::future::pending::<()>().await;
            }
        }
        if let Some(f) = fault {
            let micros = self.state.delays[f as usize].load(Ordering::SeqCst);
            if micros > 0 {
                tokio::time::sleep(Duration::from_micros(micros)).await;
            }
        }
        match fault {
            Some(f) if self.state.faults[f as usize].load(Ordering::SeqCst) => {
                Err(StoreError::unavailable(format!("injected {f:?} outage")))
            }
            _ => Ok(()),
        }
    }
}

impl<S> Probe<S> {
    /// After the inner store answered: never answer if this call's reply is to be lost.
    async fn reply<T>(&self, fault: Fault, answer: T) -> T {
        let lost = &self.state.lost_replies[fault as usize];
        if lost
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            std::future::pending::<()>().await;
        }
        answer
    }
}

impl<S: Store> Store for Probe<S> {
    fn max_ttl(&self) -> Duration {
        self.inner.max_ttl()
    }

    fn uses_reservation(&self) -> bool {
        self.inner.uses_reservation()
    }

    // `None` unless a test declares one (`declare_call_timeout`): the probe can hang a call
    // (`hang_next`) whatever the inner store promises, so the coordinator times every call.
    fn call_timeout(&self) -> Option<Duration> {
        match self.state.declared_call_timeout.load(Ordering::SeqCst) {
            0 => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Claim, StoreError> {
        self.enter(0, Some(Fault::Begin)).await?;
        let answer = self.inner.begin(req).await;
        self.reply(Fault::Begin, answer).await
    }

    async fn begin_many(&self, reqs: &[BeginRequest<'_>]) -> Vec<Result<Claim, StoreError>> {
        self.state.calls[6].fetch_add(1, Ordering::SeqCst);
        let mut claims = Vec::with_capacity(reqs.len());
        for req in reqs {
            claims.push(self.begin(req).await);
        }
        claims
    }

    async fn renew(
        &self,
        key: &StorageKey,
        lease: &Ownership,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.enter(1, Some(Fault::Renew)).await?;
        let answer = self.inner.renew(key, lease, ttl).await;
        self.reply(Fault::Renew, answer).await
    }

    async fn complete(
        &self,
        key: &StorageKey,
        lease: &Ownership,
        completion: &CompleteRequest,
    ) -> Result<(), StoreError> {
        self.enter(2, Some(Fault::Complete)).await?;
        loop {
            let opened = self.state.complete_gate.notified();
            if !self.state.hold_complete.load(Ordering::SeqCst) {
                break;
            }
            opened.await;
        }
        let answer = self.inner.complete(key, lease, completion).await;
        self.reply(Fault::Complete, answer).await
    }

    async fn release(&self, key: &StorageKey, lease: &Ownership) -> Result<(), StoreError> {
        self.enter(3, Some(Fault::Release)).await?;
        let answer = self.inner.release(key, lease).await;
        self.reply(Fault::Release, answer).await
    }

    async fn wait(
        &self,
        key: &StorageKey,
        seen: FencingToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        self.enter(4, Some(Fault::Wait)).await?;
        self.inner.wait(key, seen, timeout).await
    }

    async fn get(&self, key: &StorageKey) -> Result<Option<Record>, StoreError> {
        self.enter(5, None).await?;
        self.inner.get(key).await
    }
}

impl<S: RawStore> RawStore for Probe<S> {
    async fn put_raw(
        &self,
        key: &StorageKey,
        bytes: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.inner.put_raw(key, bytes, ttl).await
    }

    async fn purge(&self, key: &StorageKey) -> Result<bool, StoreError> {
        self.inner.purge(key).await
    }
}
