//! Coalescing concurrent single calls: while calls of one kind (`begin` or `complete`) are
//! on the wire, new ones queue, and a flush task sends the queue as one script call
//! (`begin_many.lua`, `complete_many.lua`): one script entry and one `TIME` for many keys,
//! which is most of what a call costs Redis. A call to an idle store is sent at once, as
//! before (no added latency at concurrency 1).
//!
//! The flush task is spawned by the first call queued; it yields once, so that the tasks
//! already running can queue theirs, then sends everything queued (in script calls of at
//! most [`MAX_BATCH`] keys, each awaited in a task of its own, so batches are pipelined on
//! the connection, not sent one round trip after another). A batch answers each key exactly
//! as the single script would: both scripts walk their keys in order, so a key given twice
//! (two concurrent duplicates) is answered as two calls one after the other.
//!
//! One server without the durability guard only: on a Cluster keys of one slot rarely meet,
//! and the guard's `WAIT` is per reservation.

use std::sync::PoisonError;

use bytes::Bytes;
// std's mutex, or loom's under `--cfg idemkit_loom` (the model checks, model.rs).
use idemkit_core::__sync::{Mutex, MutexGuard};
use idemkit_core::{ResultKind, StoreError, StoreErrorKind};
use redis::{Cmd, Value};
use tokio::sync::oneshot;

use crate::RedisStore;
use crate::errors::unexpected;
use crate::scripts;
use crate::scripts::query_loading;

/// The most keys sent in one script call. Small enough that several batches are on the wire
/// at once, so the client handles one batch's replies while Redis runs the next (one large
/// batch makes them take turns); the trade-off is measured in docs/benchmarks.md.
const MAX_BATCH: usize = 16;

/// The most script calls of one kind on one lane's wire at once (a lone call or a batch
/// each). A call that finds the wire full waits in the queue for a reply to make room, so
/// under load the queue fills and batches grow, where sending every queue at once made
/// small batches, each paying a script entry, which costs Redis more than a key in it does
/// (docs/benchmarks.md). Two, not one: the client reads one batch's reply while Redis runs
/// the next.
const MAX_IN_FLIGHT: usize = 2;

/// A queued call's answer: the script's reply for its key.
pub(crate) type Answer = oneshot::Receiver<Result<Value, StoreError>>;

/// A queued `begin`.
pub(crate) struct BeginJob {
    pub(crate) rkey: String,
    pub(crate) owner: u128,
    pub(crate) fingerprint: Option<[u8; 16]>,
    pub(crate) lease_ms: u64,
    /// The reserving process (`Record::holder`), if the caller said.
    pub(crate) holder: Option<idemkit_core::record::SharedHolder>,
    pub(crate) reply: oneshot::Sender<Result<Value, StoreError>>,
}

impl BeginJob {
    fn parts(&self) -> scripts::Parts<'_> {
        scripts::Parts {
            owner: self.owner,
            fingerprint: self.fingerprint.as_ref(),
            holder: self.holder.as_deref().map(|h| (h, self.lease_ms)),
        }
    }
}

/// A queued `complete`.
pub(crate) struct CompleteJob {
    pub(crate) rkey: String,
    pub(crate) owner: u128,
    pub(crate) fencing: u64,
    pub(crate) ttl_ms: u64,
    pub(crate) kind: ResultKind,
    pub(crate) bytes: Bytes,
    /// What the reservation was made with, as far as the caller said
    /// (`CompleteRequest::reservation`): its fingerprint, holder and lease.
    pub(crate) fingerprint: Option<[u8; 16]>,
    pub(crate) holder: Option<(idemkit_core::record::SharedHolder, u64)>,
    /// The caller said what it reserved with: its reservation is known byte for byte, and
    /// a plain `SET … IFEQ` can complete it (see `plain`).
    pub(crate) known: bool,
    pub(crate) reply: oneshot::Sender<Result<Value, StoreError>>,
}

impl CompleteJob {
    fn parts(&self) -> scripts::Parts<'_> {
        scripts::Parts {
            owner: self.owner,
            fingerprint: self.fingerprint.as_ref(),
            holder: self.holder.as_ref().map(|(h, lease)| (&**h, *lease)),
        }
    }
}

/// The queue of one kind of call, and how many calls of that kind are on the wire.
pub(crate) struct Coalescer<J> {
    state: Mutex<State<J>>,
}

struct State<J> {
    /// Calls (single or batched) of this kind on the wire.
    in_flight: usize,
    queue: Vec<J>,
    /// A flush task is scheduled.
    flushing: bool,
}

impl<J> Default for Coalescer<J> {
    fn default() -> Self {
        Coalescer {
            state: Mutex::new(State {
                in_flight: 0,
                queue: Vec::new(),
                flushing: false,
            }),
        }
    }
}

/// What [`Coalescer::enter`] decided.
pub(crate) enum Entered {
    /// Send alone now, holding a [`Lead`].
    Lead,
    /// Queued; the caller spawns the flush task when told to.
    Queued { spawn_flush: bool },
}

impl<J> Coalescer<J> {
    fn lock(&self) -> MutexGuard<'_, State<J>> {
        // Nothing under this lock can panic; keep serving if something ever did.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Nothing on the wire, nothing queued, no flush scheduled (the model checks' end state).
    #[cfg(all(test, idemkit_loom))]
    pub(crate) fn is_idle(&self) -> bool {
        let state = self.lock();
        state.in_flight == 0 && state.queue.is_empty() && !state.flushing
    }

    /// Lead when nothing of this kind is on the wire or queued; otherwise queue `job()`, and
    /// schedule a flush unless one is scheduled or the wire is full (then the next reply
    /// schedules it, [`done`](Coalescer::done)).
    pub(crate) fn enter(&self, job: impl FnOnce() -> J) -> Entered {
        let mut state = self.lock();
        if state.in_flight == 0 && state.queue.is_empty() {
            state.in_flight += 1;
            return Entered::Lead;
        }
        state.queue.push(job());
        let spawn_flush = !state.flushing && state.in_flight < MAX_IN_FLIGHT;
        state.flushing |= spawn_flush;
        Entered::Queued { spawn_flush }
    }

    /// What is queued, in batches, as many as the wire has room for (each counted on it);
    /// the flush is over. What is left waits for a reply to make room.
    pub(crate) fn take_all(&self) -> Vec<Vec<J>> {
        let mut state = self.lock();
        state.flushing = false;
        let mut batches = Vec::new();
        while !state.queue.is_empty() && state.in_flight < MAX_IN_FLIGHT {
            let n = state.queue.len().min(MAX_BATCH);
            batches.push(state.queue.drain(..n).collect());
            state.in_flight += 1;
        }
        batches
    }

    /// The flush task is gone before it took the queue.
    fn abandon(&self) {
        let mut state = self.lock();
        state.flushing = false;
        state.queue.clear();
    }

    /// A call of this kind answered (or was dropped). `true`: calls are queued and no flush
    /// is scheduled, so the caller must spawn one (this reply made room on the wire).
    pub(crate) fn done(&self) -> bool {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        let flush = !state.queue.is_empty() && !state.flushing;
        state.flushing |= flush;
        flush
    }
}

/// Which queue a call belongs to.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Begin,
    Complete,
}

impl Kind {
    fn done(self, store: &RedisStore, lane: usize) {
        let queue = &store.shared.lanes[lane];
        let flush = match self {
            Kind::Begin => queue.begins.done(),
            Kind::Complete => queue.completes.done(),
        };
        if flush {
            spawn_flush(store, self, lane);
        }
    }
}

/// Held by a call on the wire (a lone call, or a batch); dropping it frees its place.
pub(crate) struct Lead<'a> {
    pub(crate) store: &'a RedisStore,
    pub(crate) kind: Kind,
    pub(crate) lane: usize,
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.kind.done(self.store, self.lane);
    }
}

/// If a flush task is dropped before it took the queue (its runtime shut down, even before
/// the task was first polled), the queued callers get an error and the next call schedules
/// a flush again. Built before the task is spawned and moved into it, so that dropping the
/// unpolled task drops it too.
struct Unsent {
    store: RedisStore,
    kind: Kind,
    lane: usize,
    armed: bool,
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if self.armed {
            let lane = &self.store.shared.lanes[self.lane];
            match self.kind {
                Kind::Begin => lane.begins.abandon(),
                Kind::Complete => lane.completes.abandon(),
            }
        }
    }
}

/// Spawns the flush task of `kind` on `lane` (the first queued call does, once per flush).
pub(crate) fn spawn_flush(store: &RedisStore, kind: Kind, lane: usize) {
    let mut unsent = Unsent {
        store: store.clone(),
        kind,
        lane,
        armed: true,
    };
    // A reply's `done` can run where no runtime is (a call's future dropped after its
    // runtime): then nobody can send the queue, and its callers get an error (`Unsent`).
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        // Let the tasks that are ready queue their calls first: without this yield a
        // multi-thread runtime runs the new task at once (its LIFO slot), and batches hold one
        // or two keys (docs/benchmarks.md: more Redis instructions per miss than no coalescing
        // at all).
        tokio::task::yield_now().await;
        unsent.armed = false;
        let store = unsent.store.clone();
        match kind {
            Kind::Begin => {
                for batch in store.shared.lanes[lane].begins.take_all() {
                    let place = Place::new(&store, kind, lane);
                    tokio::spawn(async move {
                        send_begins(&place.store, lane, batch).await;
                        drop(place);
                    });
                }
            }
            Kind::Complete => {
                for batch in store.shared.lanes[lane].completes.take_all() {
                    let place = Place::new(&store, kind, lane);
                    tokio::spawn(async move {
                        send_completes(&place.store, lane, batch).await;
                        drop(place);
                    });
                }
            }
        }
    });
}

/// A batch's place on the wire (counted by `take_all`), owned by its task: built before the
/// task is spawned and moved into it, so that a task dropped before its first poll (its
/// runtime shut down mid-flush) gives the place back too, as [`Unsent`] does for the flush
/// task. Built inside the task, an unpolled batch kept its place for ever, and two such
/// leaks left the lane's queue with no room on the wire (review M2).
struct Place {
    store: RedisStore,
    kind: Kind,
    lane: usize,
}

impl Place {
    fn new(store: &RedisStore, kind: Kind, lane: usize) -> Self {
        Place {
            store: store.clone(),
            kind,
            lane,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.kind.done(&self.store, self.lane);
    }
}

/// Hands each job its item of the reply, or the call's error.
fn answer<J>(
    jobs: Vec<J>,
    reply: Result<Value, StoreError>,
    sender: impl Fn(J) -> oneshot::Sender<Result<Value, StoreError>>,
) {
    match reply {
        Ok(Value::Array(items)) if items.len() == jobs.len() => {
            for (job, item) in jobs.into_iter().zip(items) {
                let _ = sender(job).send(Ok(item));
            }
        }
        Ok(other) => {
            for job in jobs {
                let _ = sender(job).send(Err(unexpected(Some(&other))));
            }
        }
        Err(e) => {
            let (kind, text) = (e.kind(), e.to_string());
            for job in jobs {
                let _ = sender(job).send(Err(StoreError::new(kind, text.clone())));
            }
        }
    }
}

async fn send_begins(store: &RedisStore, lane: usize, mut jobs: Vec<BeginJob>) {
    // `begin_many.lua` takes one lease per call: one call per lease (nearly always one).
    while !jobs.is_empty() {
        let lease = jobs[0].lease_ms;
        let (same, rest): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|j| j.lease_ms == lease);
        jobs = rest;
        let mut cmd = Cmd::with_capacity(4 + 2 * same.len(), 96 * same.len());
        cmd.arg("EVALSHA")
            .arg(scripts::BEGIN_MANY.script.get_hash())
            .arg(same.len());
        for j in &same {
            cmd.arg(&j.rkey);
        }
        let parts: Vec<scripts::Parts<'_>> = same.iter().map(BeginJob::parts).collect();
        scripts::begin_many_args(&mut cmd, lease, &parts);
        drop(parts);
        let reply = query_loading(
            &mut store.shared.lanes[lane].conn.clone(),
            &cmd,
            &scripts::BEGIN_MANY,
        )
        .await;
        answer(same, reply, |j| j.reply);
    }
}

async fn send_completes(store: &RedisStore, lane: usize, mut jobs: Vec<CompleteJob>) {
    if jobs.iter().any(|j| j.known) {
        jobs = send_plain_completes(store, lane, jobs).await;
    }
    // `complete_many.lua` takes one ttl per call: one call per ttl (usually one).
    while !jobs.is_empty() {
        let ttl = jobs[0].ttl_ms;
        let (same, rest): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|j| j.ttl_ms == ttl);
        jobs = rest;
        let size: usize = same.iter().map(|j| 2 * j.rkey.len() + j.bytes.len()).sum();
        let mut cmd = Cmd::with_capacity(4 + 3 * same.len(), size + 192 * same.len());
        cmd.arg("EVALSHA")
            .arg(scripts::COMPLETE_MANY.script.get_hash())
            .arg(same.len());
        for j in &same {
            cmd.arg(&j.rkey);
        }
        scripts::complete_many_args(
            &mut cmd,
            ttl,
            same.iter()
                .map(|j| (j.parts(), j.fencing, j.kind, &j.bytes[..])),
        );
        let reply = query_loading(
            &mut store.shared.lanes[lane].conn.clone(),
            &cmd,
            &scripts::COMPLETE_MANY,
        )
        .await;
        answer(same, reply, |j| j.reply);
    }
}

/// The batch's completions whose reservations are known, as one pipeline of plain
/// `SET … IFEQ`s where the server has them (see `plain`): each one written is answered;
/// what is left (nothing written) goes to `complete_many.lua`.
async fn send_plain_completes(
    store: &RedisStore,
    lane: usize,
    jobs: Vec<CompleteJob>,
) -> Vec<CompleteJob> {
    let caps = &store.shared.caps;
    let mut conn = store.shared.lanes[lane].conn.clone();
    match caps.ifeq(&mut conn, &store.shared.prefix).await {
        Ok(true) => {}
        Ok(false) => return jobs,
        Err(e) => {
            answer(jobs, Err(e), |j| j.reply);
            return Vec::new();
        }
    }
    let (plain, mut rest): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|j| j.known);
    let written = crate::plain::complete_all(
        caps,
        &mut conn,
        plain.iter().map(|j| {
            let done = crate::plain::Completion {
                fencing: j.fencing,
                kind: j.kind,
                bytes: &j.bytes,
                ttl_ms: j.ttl_ms,
            };
            (&j.rkey[..], j.parts(), done)
        }),
    )
    .await;
    match written {
        Ok(written) => {
            for (job, written) in plain.into_iter().zip(written) {
                if written {
                    let _ = job.reply.send(Ok(Value::Int(1)));
                } else {
                    rest.push(job);
                }
            }
            rest
        }
        Err(e) => {
            answer(plain, Err(e), |j| j.reply);
            rest
        }
    }
}

/// A queued call's reply, or `Unavailable` if its batch was lost (the flush task died).
pub(crate) async fn wait(answer: Answer) -> Result<Value, StoreError> {
    answer.await.unwrap_or_else(|_| {
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "a coalesced call was dropped before it was sent",
        ))
    })
}
