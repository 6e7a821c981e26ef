//! What the Redis store coalesces, and how (the queue itself is `idemkit_coalesce`'s, the
//! one coalescer of every store): while calls of one kind (`begin` or `complete`) are on a
//! lane's wire, new ones queue, and the coalescer's flush sends the queue as one script call
//! (`begin_many.lua`, `complete_many.lua`): one script entry and one `TIME` for many keys,
//! which is most of what a call costs Redis. A call to an idle lane is sent at once, as
//! before (no added latency at concurrency 1). Batches are pipelined on the connection
//! (each sent from a task of its own), not sent one round trip after another. A batch
//! answers each key exactly as the single script would: both scripts walk their keys in
//! order, so a key given twice (two concurrent duplicates) is answered as two calls one
//! after the other.
//!
//! One server without the durability guard only: on a Cluster keys of one slot rarely meet,
//! and the guard's `WAIT` is per reservation.

use std::sync::Arc;

use bytes::Bytes;
use idemkit_coalesce::{Job, Limits, Sender, copies};
use idemkit_core::{ResultKind, StoreError};
use redis::{Cmd, Value};

use crate::Shared;
use crate::errors::unexpected;
use crate::resp::Arg;
use crate::scripts;
use crate::scripts::query_loading;

/// How the lanes batch: at most 16 keys a script call, small enough that several batches
/// are on the wire at once, so the client handles one batch's replies while Redis runs the
/// next (one large batch makes them take turns; the trade-off is measured in
/// docs/benchmarks.md); and at most two script calls of one kind on a lane's wire at once.
/// A call that finds the wire full waits in the queue for a reply to make room, so under
/// load the queue fills and batches grow, where sending every queue at once made small
/// batches, each paying a script entry, which costs Redis more than a key in it does. Two,
/// not one: the client reads one batch's reply while Redis runs the next. A call goes alone
/// only when nothing of its kind is on the wire or queued. Results are bounded per batch as
/// on PostgreSQL (16 MiB), so one command never carries dozens of large results.
pub(crate) const LIMITS: Limits = Limits::new(16, 2).max_bytes(16 << 20);

/// A queued call's answer: the script's reply for its key.
type Responder = idemkit_coalesce::Responder<Value>;

/// A queued `begin`.
pub(crate) struct BeginJob {
    pub(crate) rkey: String,
    pub(crate) owner: u128,
    pub(crate) fingerprint: Option<[u8; 16]>,
    pub(crate) lease_ms: u64,
    /// The reserving process (`Record::holder`), if the caller said.
    pub(crate) holder: Option<idemkit_core::record::SharedHolder>,
    pub(crate) reply: Responder,
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
    pub(crate) reply: Responder,
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

impl Job for BeginJob {
    fn key(&self) -> &str {
        &self.rkey
    }
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
}

impl Job for CompleteJob {
    fn key(&self) -> &str {
        &self.rkey
    }
    fn abandoned(&self) -> bool {
        self.reply.is_closed()
    }
    fn size(&self) -> usize {
        self.bytes.len()
    }
}

/// A lane of the store's connections, as the coalescer sends on it: a batch of `begin`s is
/// one `begin_many.lua` call, a batch of `complete`s one `complete_many.lua` (after the
/// plain `SET … IFEQ`s that can complete some of them).
#[derive(Clone)]
pub(crate) struct OnLane {
    pub(crate) shared: Arc<Shared>,
    pub(crate) at: usize,
}

impl Sender<BeginJob> for OnLane {
    fn lane(&self) -> &idemkit_coalesce::Lane<BeginJob> {
        &self.shared.lanes[self.at].begins
    }
    fn send(&self, batch: Vec<BeginJob>) -> impl Future<Output = ()> + Send {
        send_begins(self, batch)
    }
}

impl Sender<CompleteJob> for OnLane {
    fn lane(&self) -> &idemkit_coalesce::Lane<CompleteJob> {
        &self.shared.lanes[self.at].completes
    }
    fn send(&self, batch: Vec<CompleteJob>) -> impl Future<Output = ()> + Send {
        send_completes(self, batch)
    }
}

/// Hands each job its item of the reply, or the call's error.
fn answer<J>(jobs: Vec<J>, reply: Result<Value, StoreError>, sender: impl Fn(J) -> Responder) {
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
            let copy = copies(&e);
            for job in jobs {
                let _ = sender(job).send(Err(copy()));
            }
        }
    }
}

async fn send_begins(to: &OnLane, jobs: Vec<BeginJob>) {
    // Plain begins first where the store has an estimate of the server's clock (see
    // `stamp`): one pipeline for the batch; the keys it did not answer go to the script.
    let plain = crate::stamp::begin(
        &to.shared.clock,
        &mut to.shared.lanes[to.at].conn.clone(),
        jobs.iter().map(|j| (&j.rkey[..], j.parts(), j.lease_ms)),
    )
    .await;
    let found = match plain {
        Ok(Some(found)) => found,
        Ok(None) => return send_scripts(to, jobs).await,
        Err(e) => return answer(jobs, Err(e), |j| j.reply),
    };
    let mut rest = Vec::new();
    let mut stale = Vec::new();
    for (job, found) in jobs.into_iter().zip(found) {
        match found {
            crate::stamp::Found::Answer(reply) => {
                let _ = job.reply.send(Ok(reply));
            }
            crate::stamp::Found::Script { stale: None } => rest.push(job),
            crate::stamp::Found::Script { stale: Some(token) } => stale.push((job, token)),
        }
    }
    // A stamp outside the window (one stamp for the batch): the keys' reservations take
    // their tokens again from the server's clock in one script call, before the rest is
    // answered (a duplicate of a restamped key then reads the token its owner is given).
    if let Some(&(_, token)) = stale.first() {
        let restamped = crate::stamp::restamp(
            &mut to.shared.lanes[to.at].conn.clone(),
            token,
            stale.iter().map(|(j, _)| (&j.rkey[..], j.owner)),
        )
        .await;
        match restamped {
            Ok(tokens) => {
                for ((job, _), token) in stale.into_iter().zip(tokens) {
                    match token {
                        Some(t) => {
                            let _ = job.reply.send(Ok(Value::Int(t as i64)));
                        }
                        // No longer the caller's reservation under the stamp (it expired
                        // meanwhile): the script answers what the key holds.
                        None => rest.push(job),
                    }
                }
            }
            Err(e) => answer(stale.into_iter().map(|(j, _)| j).collect(), Err(e), |j| {
                j.reply
            }),
        }
    }
    send_scripts(to, rest).await;
}

/// A batch of `begin`s as `begin_many.lua` calls.
async fn send_scripts(to: &OnLane, mut jobs: Vec<BeginJob>) {
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
            &mut to.shared.lanes[to.at].conn.clone(),
            &cmd,
            &scripts::BEGIN_MANY,
        )
        .await;
        answer(same, reply, |j| j.reply);
    }
}

async fn send_completes(to: &OnLane, mut jobs: Vec<CompleteJob>) {
    if jobs.iter().any(|j| j.known) {
        jobs = send_plain_completes(to, jobs).await;
    }
    // `complete_many.lua` takes one ttl per call: one call per ttl (usually one).
    while !jobs.is_empty() {
        let ttl = jobs[0].ttl_ms;
        let (same, rest): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|j| j.ttl_ms == ttl);
        jobs = rest;
        // The keys, the ttl, then each key's reservation and completed record, written
        // where they are sent (`resp`).
        let parts: Vec<scripts::Parts<'_>> = same.iter().map(CompleteJob::parts).collect();
        let mut args = Vec::with_capacity(3 + 3 * same.len());
        args.extend([
            Arg::Bytes(b"EVALSHA"),
            Arg::from(scripts::COMPLETE_MANY.script.get_hash()),
            Arg::Int(same.len() as u64),
        ]);
        args.extend(same.iter().map(|j| Arg::from(&j.rkey[..])));
        args.push(Arg::Int(ttl));
        for (j, p) in same.iter().zip(&parts) {
            args.push(Arg::Mine(p, j.fencing));
            args.push(Arg::Done(p, j.fencing, j.kind, &j.bytes));
        }
        let reply = scripts::eval_list(
            &mut to.shared.lanes[to.at].conn.clone(),
            &scripts::COMPLETE_MANY,
            &args,
        )
        .await;
        drop(args);
        drop(parts);
        answer(same, reply, |j| j.reply);
    }
}

/// The batch's completions whose reservations are known, as one pipeline of plain
/// `SET … IFEQ`s where the server has them (see `plain`): each one written is answered;
/// what is left (nothing written) goes to `complete_many.lua`.
async fn send_plain_completes(to: &OnLane, jobs: Vec<CompleteJob>) -> Vec<CompleteJob> {
    let caps = &to.shared.caps;
    let mut conn = to.shared.lanes[to.at].conn.clone();
    match caps.ifeq(&mut conn, &to.shared.prefix).await {
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
