//! The store under simulation: a store (a `MemoryStore`, or Redis or PostgreSQL with real
//! time) behind a wrapper that, from the run's seed,
//! delays each call, fails it before it reaches the store, loses its reply after the store
//! applied it, applies it after its caller gave up, takes the store down for a while, and
//! makes it forget everything. It writes down what the store really did (the log the
//! checker reads), independently of what the callers were told.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idemkit_core::store::{BeginRequest, Claim, CompleteRequest, Ownership};
use idemkit_core::{
    FencingToken, MemoryStore, RawStore, Record, RecordState, StorageKey, Store, StoreError,
};
use tokio::time::Instant;

/// How often each fault happens, drawn per run from its seed.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// Probability that a call is delayed before it reaches the store, and the longest delay.
    pub delay: (f64, Duration),
    /// Probability that a call fails (`Unavailable`) before it reaches the store.
    pub fail_before: f64,
    /// Probability that the store applies a call and its reply is lost (`Unavailable`).
    pub lose_reply: f64,
    /// Probability that a call reaches the store late, after up to this long, whether or
    /// not its caller still waits (a request still on the wire).
    pub apply_late: (f64, Duration),
    /// Probability per call that the store goes down for up to this long (it keeps its data).
    pub outage: (f64, Duration),
    /// Probability per call that the store restarts and forgets every record.
    pub forget: f64,
    /// Probability per call that the clock jumps ahead by up to this long at once: the whole
    /// process stalls (paused time only), so leases run out under their owners.
    pub stall: (f64, Duration),
    /// Probability that a `complete` never answers (the request is lost, or applied with
    /// its reply lost: a coin decides): a store that renews but does not complete.
    pub hang_complete: f64,
    /// Probability that a `complete` takes up to this long before it reaches the store
    /// (drawn past the lease: a completion slower than the lease).
    pub slow_complete: (f64, Duration),
}

impl Faults {
    /// No faults at all.
    pub const NONE: Faults = Faults {
        delay: (0.0, Duration::ZERO),
        fail_before: 0.0,
        lose_reply: 0.0,
        apply_late: (0.0, Duration::ZERO),
        outage: (0.0, Duration::ZERO),
        forget: 0.0,
        stall: (0.0, Duration::ZERO),
        hang_complete: 0.0,
        slow_complete: (0.0, Duration::ZERO),
    };
}

/// What the store really did (not what its callers were told), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreEvent {
    /// A `begin` applied that reserved the key under a new fencing token; `seq` orders it
    /// against the effects (many things happen at one instant of paused time).
    Granted {
        key: String,
        fencing: u64,
        /// When the `begin` was handed to the store (no later than it applied).
        sent: Duration,
        /// When the store's answer came back (no earlier than it applied).
        at: Duration,
        seq: u64,
    },
    /// A caller was answered `Ok` for a `begin` (reserved) or a `renew` it sent at `sent`
    /// asking for `lease`: its lease is confirmed until `sent + lease`.
    Confirmed {
        key: String,
        fencing: u64,
        until: Duration,
    },
    /// A `complete` applied.
    Completed {
        key: String,
        fencing: u64,
        /// When the `complete` was handed to the store, and when its answer came back.
        sent: Duration,
        at: Duration,
    },
    /// A `release` applied, between `sent` and `at`.
    Released {
        key: String,
        fencing: u64,
        sent: Duration,
        at: Duration,
    },
    /// A write applied for an ownership that was not the record's: a stale writer accepted.
    StaleAccepted {
        key: String,
        fencing: u64,
        what: &'static str,
        at: Duration,
    },
    /// A write the store refused: its owner no longer held the key.
    Refused {
        key: String,
        fencing: u64,
        what: &'static str,
        at: Duration,
    },
    /// The whole process stalled for `by` (the clock jumped).
    Stalled { from: Duration, by: Duration },
    /// The store restarted and forgot every record, between `from` and `at` (a server
    /// forgets key by key).
    Forgot { from: Duration, at: Duration },
}

struct Shared<S> {
    inner: S,
    /// In process on paused time, a write's owner is checked against the record read just
    /// before it (nothing runs in between); against a server that read could race.
    strict: bool,
    rng: Mutex<fastrand::Rng>,
    faults: Faults,
    start: Instant,
    down_until: Mutex<Option<Instant>>,
    log: Mutex<Vec<StoreEvent>>,
    keys: Mutex<BTreeSet<String>>,
    granted: Mutex<BTreeSet<(String, u64)>>,
    seq: Arc<std::sync::atomic::AtomicU64>,
}

/// The fault-injecting store. Cheap to clone.
pub struct SimStore<S = MemoryStore> {
    shared: Arc<Shared<S>>,
}

impl<S> Clone for SimStore<S> {
    fn clone(&self) -> Self {
        SimStore {
            shared: self.shared.clone(),
        }
    }
}

impl<S> std::fmt::Debug for SimStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimStore")
            .field("faults", &self.shared.faults)
            .finish_non_exhaustive()
    }
}

/// What happens to one call.
enum Fate {
    Deliver,
    FailBefore,
    LoseReply,
    Late(Duration),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SimStore {
    /// A `MemoryStore` with `faults`, drawing from `rng` (seeded by the run), owners checked
    /// strictly (in process, on paused time).
    pub fn new(faults: Faults, rng: fastrand::Rng, start: Instant) -> Self {
        SimStore::over(MemoryStore::new(), faults, rng, start, true)
    }
}

impl<S: RawStore> SimStore<S> {
    /// `inner` with `faults`; `strict`: check each write's owner against a read just before
    /// it (only where nothing can run in between).
    pub fn over(
        inner: S,
        faults: Faults,
        rng: fastrand::Rng,
        start: Instant,
        strict: bool,
    ) -> Self {
        SimStore {
            shared: Arc::new(Shared {
                inner,
                strict,
                rng: Mutex::new(rng),
                faults,
                start,
                down_until: Mutex::new(None),
                log: Mutex::new(Vec::new()),
                keys: Mutex::new(BTreeSet::new()),
                granted: Mutex::new(BTreeSet::new()),
                seq: Arc::default(),
            }),
        }
    }

    /// The next number of the run's one sequence (store grants and effects share it).
    pub fn tick(&self) -> u64 {
        self.shared
            .seq
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    /// The sequence itself, for the effects.
    pub fn ticker(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.shared.seq.clone()
    }

    /// What the store did, so far.
    pub fn log(&self) -> Vec<StoreEvent> {
        lock(&self.shared.log).clone()
    }

    fn since_start(&self) -> Duration {
        Instant::now() - self.shared.start
    }

    fn note(&self, event: StoreEvent) {
        lock(&self.shared.log).push(event);
    }

    fn chance(&self, p: f64) -> bool {
        p > 0.0 && lock(&self.shared.rng).f64() < p
    }

    fn upto(&self, max: Duration) -> Duration {
        let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(lock(&self.shared.rng).u64(0..=ms))
    }

    /// Draws this call's delay and fate, and the store-wide events it triggers.
    async fn plan(&self) -> Fate {
        let f = self.shared.faults;
        if self.chance(f.delay.0) {
            tokio::time::sleep(self.upto(f.delay.1)).await;
        }
        if self.chance(f.forget) {
            self.forget().await;
        }
        if self.shared.strict && self.chance(f.stall.0) {
            let by = self.upto(f.stall.1);
            // Noted first: the call that stalls may be dropped (timed out) during the jump.
            self.note(StoreEvent::Stalled {
                from: self.since_start(),
                by,
            });
            tokio::time::advance(by).await;
        }
        if self.chance(f.outage.0) {
            let until = Instant::now() + self.upto(f.outage.1);
            let mut down = lock(&self.shared.down_until);
            *down = Some(down.map_or(until, |d| d.max(until)));
        }
        let down = lock(&self.shared.down_until).is_some_and(|d| Instant::now() < d);
        if down || self.chance(f.fail_before) {
            Fate::FailBefore
        } else if self.chance(f.lose_reply) {
            Fate::LoseReply
        } else if self.chance(f.apply_late.0) {
            Fate::Late(self.upto(f.apply_late.1))
        } else {
            Fate::Deliver
        }
    }

    /// The store restarts without its data: every record is gone. Fencing tokens keep
    /// growing (as Redis' clock-based and PostgreSQL's sequence-based tokens do).
    async fn forget(&self) {
        let from = self.since_start();
        let keys: Vec<String> = lock(&self.shared.keys).iter().cloned().collect();
        for key in keys {
            if let Some(key) = StorageKey::parse(&key)
                .map(|(op, scope, k)| StorageKey::new(&op, scope.as_ref(), &k))
            {
                let _ = self.shared.inner.purge(&key).await;
            }
        }
        self.note(StoreEvent::Forgot {
            from,
            at: self.since_start(),
        });
    }

    /// The record's fencing token and state right now (MemoryStore answers at once).
    async fn current(&self, key: &StorageKey) -> Option<(FencingToken, RecordState)> {
        if !self.shared.strict {
            return None;
        }
        match self.shared.inner.get(key).await {
            Ok(Some(Record { fencing, state, .. })) => Some((fencing, state)),
            _ => None,
        }
    }

    /// Runs `op` against the store under this call's fate; `apply` logs what the store did.
    async fn call<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(SimStore<S>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        match self.plan().await {
            Fate::FailBefore => Err(StoreError::unavailable("sim: the store is unreachable")),
            // Against a server the call is a request on the wire: it runs to its end (and is
            // logged) even if its caller stops waiting. In process it ends within one poll.
            Fate::Deliver if !self.shared.strict => self.detached(op).await,
            Fate::Deliver => op(self.clone()).await,
            Fate::LoseReply => {
                let _ = if self.shared.strict {
                    op(self.clone()).await
                } else {
                    self.detached(op).await
                };
                Err(StoreError::unavailable("sim: the reply was lost"))
            }
            Fate::Late(after) => {
                // On the wire: applied even if the caller stops waiting.
                let store = self.clone();
                let late = tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    op(store).await
                });
                match late.await {
                    Ok(answer) => answer,
                    Err(e) => Err(StoreError::unavailable(e.to_string())),
                }
            }
        }
    }

    /// `Store::complete` under this call's fate, as logged.
    async fn complete_now(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let (k, o, r) = (key.clone(), *ownership, request.clone());
        self.call(move |s| async move {
            let before = s.current(&k).await;
            let handed = s.since_start();
            s.refused(
                &k,
                &o,
                "complete",
                s.shared.inner.complete(&k, &o, &r).await,
            )?;
            s.check_owner(&k, &o, before, "complete");
            s.note(StoreEvent::Completed {
                key: k.as_str().to_owned(),
                fencing: o.fencing.get(),
                sent: handed,
                at: s.since_start(),
            });
            Ok(())
        })
        .await
    }

    /// `op` in a task of its own, awaited.
    async fn detached<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(SimStore<S>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        match tokio::spawn(op(self.clone())).await {
            Ok(answer) => answer,
            Err(e) => Err(StoreError::unavailable(e.to_string())),
        }
    }

    /// Notes a write the store refused for a lost lease; passes the answer on.
    fn refused(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        what: &'static str,
        answer: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        if answer.as_ref().is_err_and(StoreError::is_lease_lost) {
            self.note(StoreEvent::Refused {
                key: key.as_str().to_owned(),
                fencing: ownership.fencing.get(),
                what,
                at: self.since_start(),
            });
        }
        answer
    }

    /// A write by `ownership` that the store accepted: stale if the record it applied to
    /// was another owner's.
    fn check_owner(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        before: Option<(FencingToken, RecordState)>,
        what: &'static str,
    ) {
        if !self.shared.strict {
            return;
        }
        if before.is_none_or(|(fencing, _)| fencing != ownership.fencing) {
            self.note(StoreEvent::StaleAccepted {
                key: key.as_str().to_owned(),
                fencing: ownership.fencing.get(),
                what,
                at: self.since_start(),
            });
        }
    }
}

impl<S: RawStore> SimStore<S> {
    /// One `begin`, sent at `sent` (for a batch: when the batch was sent, which is what its
    /// callers count their leases from).
    async fn begin_sent(
        &self,
        req: &BeginRequest<'_>,
        sent: Duration,
    ) -> Result<Claim, StoreError> {
        let key = req.key.clone();
        lock(&self.shared.keys).insert(key.as_str().to_owned());
        let (owner, lease, fingerprint) = (req.owner, req.lease, req.fingerprint);
        let claim = self
            .call(move |s| async move {
                let req = BeginRequest::new(&key, owner, lease).with_fingerprint(fingerprint);
                let handed = s.since_start();
                let claim = s.shared.inner.begin(&req).await?;
                if let Claim::Reserved { ownership, .. } = &claim {
                    let id = (key.as_str().to_owned(), ownership.fencing.get());
                    if lock(&s.shared.granted).insert(id.clone()) {
                        s.note(StoreEvent::Granted {
                            key: id.0,
                            fencing: id.1,
                            sent: handed,
                            at: s.since_start(),
                            seq: s.tick(),
                        });
                    }
                }
                Ok(claim)
            })
            .await?;
        if let Claim::Reserved { ownership, .. } = &claim {
            self.note(StoreEvent::Confirmed {
                key: req.key.as_str().to_owned(),
                fencing: ownership.fencing.get(),
                until: sent + req.lease,
            });
        }
        Ok(claim)
    }
}

impl<S: RawStore> Store for SimStore<S> {
    fn max_ttl(&self) -> Duration {
        self.shared.inner.max_ttl()
    }

    fn uses_reservation(&self) -> bool {
        self.shared.inner.uses_reservation()
    }

    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Claim, StoreError> {
        self.begin_sent(req, self.since_start()).await
    }

    async fn begin_many(&self, reqs: &[BeginRequest<'_>]) -> Vec<Result<Claim, StoreError>> {
        let sent = self.since_start();
        let mut claims = Vec::with_capacity(reqs.len());
        for req in reqs {
            claims.push(self.begin_sent(req, sent).await);
        }
        claims
    }

    async fn renew(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let sent = self.since_start();
        let (k, o) = (key.clone(), *ownership);
        self.call(move |s| async move {
            let before = s.current(&k).await;
            s.refused(&k, &o, "renew", s.shared.inner.renew(&k, &o, lease).await)?;
            s.check_owner(&k, &o, before, "renew");
            Ok(())
        })
        .await?;
        self.note(StoreEvent::Confirmed {
            key: key.as_str().to_owned(),
            fencing: ownership.fencing.get(),
            until: sent + lease,
        });
        Ok(())
    }

    async fn complete(
        &self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let f = self.shared.faults;
        if self.chance(f.slow_complete.0) {
            tokio::time::sleep(self.upto(f.slow_complete.1)).await;
        }
        if self.chance(f.hang_complete) {
            if self.chance(0.5) {
                // Applied, its reply never comes back.
                let _ = Box::pin(self.complete_now(key, ownership, request)).await;
            }
            return std::future::pending().await;
        }
        self.complete_now(key, ownership, request).await
    }

    async fn release(&self, key: &StorageKey, ownership: &Ownership) -> Result<(), StoreError> {
        let (k, o) = (key.clone(), *ownership);
        self.call(move |s| async move {
            let before = s.current(&k).await;
            let handed = s.since_start();
            s.refused(&k, &o, "release", s.shared.inner.release(&k, &o).await)?;
            s.check_owner(&k, &o, before, "release");
            s.note(StoreEvent::Released {
                key: k.as_str().to_owned(),
                fencing: o.fencing.get(),
                sent: handed,
                at: s.since_start(),
            });
            Ok(())
        })
        .await
    }

    async fn wait(
        &self,
        key: &StorageKey,
        seen: FencingToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        if matches!(self.plan().await, Fate::FailBefore) {
            return Err(StoreError::unavailable("sim: the store is unreachable"));
        }
        self.shared.inner.wait(key, seen, timeout).await
    }

    async fn get(&self, key: &StorageKey) -> Result<Option<Record>, StoreError> {
        let k = key.clone();
        self.call(move |s| async move { s.shared.inner.get(&k).await })
            .await
    }
}
