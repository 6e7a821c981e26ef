//! idemkit's one coalescer: while a store's calls of one kind (`begin`, `complete`) are on
//! the wire, new ones queue, and the queue goes out as batches, one statement or script
//! call for many keys. Most of what a call costs a server is the call's own (a script
//! entry and a `TIME` on Redis; parse, plan and a commit's WAL flush on PostgreSQL), not
//! its key's, so under load a batch serves many callers for the cost of one. A call that
//! finds the lane idle is sent at once, on its own: nothing waits at concurrency 1.
//!
//! The stores (Redis, PostgreSQL, MySQL) share this mechanism, not a copy of it: the queue and
//! its limits ([`Lane`], [`Limits`]), the flush task that takes the queue when the wire has
//! room, and the guards that give a place on the wire back on every path ([`Lead`]). A
//! store says only what a queued call is ([`Job`]) and how a batch goes out ([`Sender`]).
//!
//! # How a call goes
//!
//! [`enter`] either hands the caller a [`Lead`] (send alone now; dropping the lead, when
//! the call answered or its caller left, frees its place), or queues the job the caller
//! builds, with the receiving end of its answer kept by the caller ([`queue`] makes that
//! answer's channel: what every store calls). The first call queued
//! while the wire has room schedules a flush; when the wire is full, the reply that makes
//! room does. The flush task yields once, so that tasks already running can queue their
//! calls too, then takes what is queued in batches, as many as the wire has room for, and
//! sends each from a task of its own: no caller's cancellation can strand the others.
//!
//! # Invariants
//!
//! - **Every place on the wire is given back.** A place is a [`Lead`], owned by the lone
//!   caller or by its batch's task. A batch's lead is made before its task is spawned and
//!   moved into it, so a task dropped before its first poll (its runtime shut down) drops
//!   it too; the flush task's guard is made the same way, and a flush dropped before it
//!   took the queue fails the queued calls (their answers are dropped) instead of leaving
//!   them for a flush that never comes. Made inside the task, an unpolled task kept its
//!   place for ever: two such leaks wedged a lane (found in Redis's copy, fixed there, and
//!   found again in PostgreSQL's: review M1 of `e047556`, the reason for one copy).
//! - **Batches are bounded** by keys and by bytes ([`Limits`]); a job over the byte bound
//!   on its own still goes, alone in its batch.
//! - **A queued call whose caller left is not sent** ([`Job::abandoned`]): nothing is
//!   reserved for nobody.
//! - **Each key once, in key order**, where the store needs it ([`Limits::each_key_once`]):
//!   a statement cannot write one row twice, and two batches writing rows in one order
//!   never wait on each other in opposite orders. A second call for a key stays queued for
//!   the next batch, so two concurrent duplicates are answered as two calls, one after the
//!   other.
//!
//! The model checks (`--cfg idemkit_loom`, `scripts/loom`) run the lane's enter, flush and
//! reply in every interleaving of three callers.

mod lane;
mod send;

#[cfg(all(test, idemkit_loom))]
mod model;

pub use lane::{Job, Lane, Limits};
pub use send::{Entry, Lead, Sender, enter, queue};

use idemkit_core::StoreError;
use tokio::sync::oneshot;

/// What a batch answers a queued call: its own outcome, or `Alone` (send it on its own: the
/// batch met a case a single call handles, such as a deadlock between two batches, a lock
/// held past the batch's bound, or a row the batch could not tell about).
#[derive(Debug)]
pub enum Reply<T> {
    /// The call's outcome, as a single call would have had it.
    Done(T),
    /// Send the call again, on its own.
    Alone,
}

/// The receiving end of a queued call's answer, kept by its caller.
pub type Answer<T> = oneshot::Receiver<Result<T, StoreError>>;

/// The sending end of a queued call's answer, kept in its [`Job`].
pub type Responder<T> = oneshot::Sender<Result<T, StoreError>>;

/// A queued call's answer; `Unavailable` if its batch was dropped before it answered (the
/// task sending it panicked, or the runtime shut down), or the flush never took it.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let (reply, answer) = tokio::sync::oneshot::channel::<Result<u8, _>>();
/// drop(reply); // a batch dropped unsent
/// let e = idemkit_coalesce::answer(answer).await.unwrap_err();
/// assert_eq!(e.kind(), idemkit_core::StoreErrorKind::Unavailable);
/// # });
/// ```
pub async fn answer<T>(answer: Answer<T>) -> Result<T, StoreError> {
    answer.await.unwrap_or_else(|_| {
        Err(StoreError::unavailable(
            "a coalesced call's batch was dropped before it answered",
        ))
    })
}

/// Copies of a batch's error, one for each of its callers: the kind kept, the text with it
/// (a `StoreError` carries its source, which is not `Clone`).
pub fn copies(e: &StoreError) -> impl Fn() -> StoreError + '_ {
    let text = e.to_string();
    move || StoreError::new(e.kind(), text.clone())
}
