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

use crate::errors::unexpected;
use crate::scripts;
use crate::{RedisStore, query_loading};

/// The most keys sent in one script call. Small enough that several batches are on the wire
/// at once, so the client handles one batch's replies while Redis runs the next (one large
/// batch makes them take turns); the trade-off is measured in docs/benchmarks.md.
const MAX_BATCH: usize = 16;

/// A queued call's answer: the script's reply for its key.
pub(crate) type Answer = oneshot::Receiver<Result<Value, StoreError>>;

/// A queued `begin`.
pub(crate) struct BeginJob {
    pub(crate) rkey: String,
    pub(crate) owner: [u8; 17],
    pub(crate) fingerprint: Option<[u8; 16]>,
    pub(crate) lease_ms: u64,
    /// The reserving process (`Record::holder`), if the caller said.
    pub(crate) holder: Option<idemkit_core::record::SharedHolder>,
    pub(crate) reply: oneshot::Sender<Result<Value, StoreError>>,
}

/// A queued `complete`.
pub(crate) struct CompleteJob {
    pub(crate) rkey: String,
    pub(crate) lease: [u8; 24],
    pub(crate) ttl_ms: u64,
    pub(crate) kind: ResultKind,
    pub(crate) bytes: Bytes,
    pub(crate) reply: oneshot::Sender<Result<Value, StoreError>>,
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

    /// Lead when nothing of this kind is on the wire or queued; otherwise queue `job()`.
    pub(crate) fn enter(&self, job: impl FnOnce() -> J) -> Entered {
        let mut state = self.lock();
        if state.in_flight == 0 && state.queue.is_empty() {
            state.in_flight += 1;
            return Entered::Lead;
        }
        state.queue.push(job());
        let spawn_flush = !state.flushing;
        state.flushing = true;
        Entered::Queued { spawn_flush }
    }

    /// Everything queued, in batches, each counted on the wire; the flush is over.
    pub(crate) fn take_all(&self) -> Vec<Vec<J>> {
        let mut state = self.lock();
        state.flushing = false;
        let mut batches = Vec::new();
        while !state.queue.is_empty() {
            let n = state.queue.len().min(MAX_BATCH);
            batches.push(state.queue.drain(..n).collect());
        }
        state.in_flight += batches.len();
        batches
    }

    /// The flush task is gone before it took the queue.
    fn abandon(&self) {
        let mut state = self.lock();
        state.flushing = false;
        state.queue.clear();
    }

    /// A call of this kind answered (or was dropped).
    pub(crate) fn done(&self) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
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
        let lane = &store.shared.lanes[lane];
        match self {
            Kind::Begin => lane.begins.done(),
            Kind::Complete => lane.completes.done(),
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
    tokio::spawn(async move {
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
                    let store = store.clone();
                    tokio::spawn(async move {
                        let _lead = Lead {
                            store: &store,
                            kind,
                            lane,
                        };
                        send_begins(&store, lane, batch).await;
                    });
                }
            }
            Kind::Complete => {
                for batch in store.shared.lanes[lane].completes.take_all() {
                    let store = store.clone();
                    tokio::spawn(async move {
                        let _lead = Lead {
                            store: &store,
                            kind,
                            lane,
                        };
                        send_completes(&store, lane, batch).await;
                    });
                }
            }
        }
    });
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
        let mut cmd = Cmd::with_capacity(3 + 3 * same.len(), 64 * same.len());
        cmd.arg("EVALSHA")
            .arg(scripts::BEGIN_MANY.script.get_hash())
            .arg(same.len());
        for j in &same {
            cmd.arg(&j.rkey);
        }
        cmd.arg(lease);
        for j in &same {
            cmd.arg(&j.owner[..])
                .arg(j.fingerprint.as_ref().map_or(&[][..], |f| &f[..]))
                .arg(scripts::HolderArg(j.holder.as_deref(), lease));
        }
        let reply = query_loading(
            &mut store.shared.lanes[lane].conn.clone(),
            &cmd,
            &scripts::BEGIN_MANY,
        )
        .await;
        answer(same, reply, |j| j.reply);
    }
}

async fn send_completes(store: &RedisStore, lane: usize, jobs: Vec<CompleteJob>) {
    let mut cmd = Cmd::with_capacity(3 + 4 * jobs.len(), 96 * jobs.len());
    cmd.arg("EVALSHA")
        .arg(scripts::COMPLETE_MANY.script.get_hash())
        .arg(jobs.len());
    for j in &jobs {
        cmd.arg(&j.rkey);
    }
    for j in &jobs {
        let len = u32::try_from(j.bytes.len()).unwrap_or(u32::MAX);
        let mut tail = Vec::with_capacity(5 + j.bytes.len());
        tail.push(j.kind.to_byte());
        tail.extend_from_slice(&len.to_be_bytes());
        tail.extend_from_slice(&j.bytes);
        cmd.arg(&j.lease[..]).arg(j.ttl_ms).arg(tail);
    }
    let reply = query_loading(
        &mut store.shared.lanes[lane].conn.clone(),
        &cmd,
        &scripts::COMPLETE_MANY,
    )
    .await;
    answer(jobs, reply, |j| j.reply);
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
