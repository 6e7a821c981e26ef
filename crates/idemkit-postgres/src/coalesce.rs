//! Coalescing concurrent `begin`s (and `complete`s) into one statement each.
//!
//! A miss costs PostgreSQL two committed statements, and under load most of a statement's
//! cost is its own (parse, plan, the commit's WAL flush), not the key's. So while
//! [`MAX_IN_FLIGHT`] statements of one kind are running, a new call queues; when one of them
//! answers, the queue goes out as one statement (`begin_many`, `complete_many`: one commit
//! for many keys) in the slot that freed, from a task of its own, so that no caller's
//! cancellation can strand the others. A call that finds a slot free and nobody queued is
//! sent at once, on its own, as without coalescing: nothing waits at concurrency 1.
//!
//! A batch holds each key once (a statement cannot reserve or complete one row twice); a
//! second call for a key stays queued for the next batch, so two concurrent duplicates are
//! answered as two calls one after the other. A queued call whose caller has gone (its
//! future dropped, say by a timeout) is dropped before it is sent, so nothing is reserved
//! for nobody. Rows are written in key order by both statements, as by every batch of this
//! store: two batches never wait on each other's rows in opposite orders.

use std::sync::{Mutex, MutexGuard, PoisonError};

use idemkit_core::StoreError;
use tokio::sync::oneshot;

/// The most keys in one statement. Large enough that one commit serves a whole burst of
/// the default pool's callers; a queue longer than this goes out in several statements.
pub(crate) const MAX_BATCH: usize = 64;

/// The most result bytes in one statement (review L1 of `e047556`): a batch's results go as
/// one `bytea[]` parameter, a single datum, which PostgreSQL caps at 1 GB; and one huge
/// statement holds its connection and its callers while it is sent. A call whose own result
/// is over this goes in a batch of its own.
pub(crate) const MAX_BATCH_BYTES: usize = 16 << 20;

/// The most statements of one kind running at once (a lone call or a batch each). Two: one
/// batch fills while the other runs, and `begin`s and `complete`s together keep four of the
/// pool's connections busy at most, leaving the rest to waits, renewals and the caller's
/// own transactions.
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// A queued call: its key, and whether its caller still waits for it.
pub(crate) trait Job: Send + 'static {
    fn key(&self) -> &str;
    fn abandoned(&self) -> bool;
    /// The bytes it adds to a statement beyond its key (a completion's result).
    fn size(&self) -> usize {
        0
    }
}

/// What a queued call is answered: its own statement's outcome, or `Alone` (send it on its
/// own: the batch met a race or a deadlock that a single statement handles).
#[derive(Debug)]
pub(crate) enum Reply<T> {
    Done(T),
    Alone,
}

/// The receiving end of a queued call.
pub(crate) type Answer<T> = oneshot::Receiver<Result<Reply<T>, StoreError>>;
/// The sending end, kept in the job.
pub(crate) type Responder<T> = oneshot::Sender<Result<Reply<T>, StoreError>>;

/// One kind's queue and its running statements.
#[derive(Debug)]
pub(crate) struct Lane<J> {
    state: Mutex<State<J>>,
}

#[derive(Debug)]
struct State<J> {
    in_flight: usize,
    queue: Vec<J>,
}

impl<J> Default for Lane<J> {
    fn default() -> Self {
        Lane {
            state: Mutex::new(State {
                in_flight: 0,
                queue: Vec::new(),
            }),
        }
    }
}

/// How a call enters its lane.
pub(crate) enum Entered<T> {
    /// A slot was free: send the call now, then [`Lane::next`] (the slot's next batch).
    Alone,
    /// Queued: the answer comes from a batch.
    Queued(Answer<T>),
}

impl<J: Job> Lane<J> {
    fn lock(&self) -> MutexGuard<'_, State<J>> {
        // The state stays consistent across a panic: every change is one assignment.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a slot, or queues the job `make` builds (built only then: a lone call allocates
    /// nothing for the queue).
    pub(crate) fn enter<T>(&self, make: impl FnOnce(Responder<T>) -> J) -> Entered<T> {
        let mut state = self.lock();
        if state.in_flight < MAX_IN_FLIGHT && state.queue.is_empty() {
            state.in_flight += 1;
            return Entered::Alone;
        }
        let (tx, rx) = oneshot::channel();
        state.queue.push(make(tx));
        Entered::Queued(rx)
    }

    /// A slot's statement has answered: the next batch for it (queued calls, each key once,
    /// in key order), or `None` and the slot is free.
    pub(crate) fn next(&self) -> Option<Vec<J>> {
        let mut state = self.lock();
        state.queue.retain(|job| !job.abandoned());
        if state.queue.is_empty() {
            state.in_flight -= 1;
            return None;
        }
        let mut batch: Vec<J> = Vec::with_capacity(state.queue.len().min(MAX_BATCH));
        let mut rest = Vec::new();
        let mut bytes = 0;
        for job in state.queue.drain(..) {
            // By keys and by bytes; a job over the byte bound alone still goes (on its own).
            let fits = batch.is_empty() || bytes + job.size() <= MAX_BATCH_BYTES;
            if batch.len() < MAX_BATCH && fits && !batch.iter().any(|b| b.key() == job.key()) {
                bytes += job.size();
                batch.push(job);
            } else {
                rest.push(job);
            }
        }
        state.queue = rest;
        drop(state);
        batch.sort_unstable_by(|a, b| a.key().cmp(b.key()));
        Some(batch)
    }

    /// The slot's owner cannot go on (a panic, no runtime to send from): the queued calls
    /// are answered with an error (their senders dropped) and the slot is freed.
    pub(crate) fn abandon(&self) {
        let mut state = self.lock();
        state.queue.clear();
        state.in_flight -= 1;
    }

    #[cfg(test)]
    fn queued(&self) -> (usize, usize) {
        let state = self.lock();
        (state.in_flight, state.queue.len())
    }
}

/// The answer a queued call gets when its batch never answered (the task sending it
/// panicked, or the runtime shut down).
pub(crate) fn dropped() -> StoreError {
    StoreError::unavailable("a coalesced call's batch was dropped before it answered")
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TestJob {
        key: &'static str,
        size: usize,
        reply: Responder<()>,
    }

    impl Job for TestJob {
        fn key(&self) -> &str {
            self.key
        }
        fn abandoned(&self) -> bool {
            self.reply.is_closed()
        }
        fn size(&self) -> usize {
            self.size
        }
    }

    fn queue(lane: &Lane<TestJob>, key: &'static str) -> Answer<()> {
        queue_sized(lane, key, 0)
    }

    fn queue_sized(lane: &Lane<TestJob>, key: &'static str, size: usize) -> Answer<()> {
        match lane.enter(|reply| TestJob { key, size, reply }) {
            Entered::Queued(rx) => rx,
            Entered::Alone => panic!("{key} went alone"),
        }
    }

    #[test]
    fn free_slots_go_alone_then_calls_queue_and_batches_hold_each_key_once() {
        let lane = Lane::<TestJob>::default();
        for _ in 0..MAX_IN_FLIGHT {
            assert!(matches!(
                lane.enter(|reply| TestJob {
                    key: "a",
                    size: 0,
                    reply
                }),
                Entered::Alone
            ));
        }
        let _b = queue(&lane, "b");
        let _a1 = queue(&lane, "a");
        let _a2 = queue(&lane, "a");
        let gone = queue(&lane, "c");
        drop(gone);
        assert_eq!(lane.queued(), (MAX_IN_FLIGHT, 4));
        // The abandoned call is not sent; "a" once per batch, in key order.
        let batch = lane.next().expect("a batch");
        assert_eq!(batch.iter().map(|j| j.key).collect::<Vec<_>>(), ["a", "b"]);
        let batch = lane.next().expect("the second a");
        assert_eq!(batch.iter().map(|j| j.key).collect::<Vec<_>>(), ["a"]);
        // Nothing left: each slot frees.
        assert!(lane.next().is_none());
        assert!(lane.next().is_none());
        assert_eq!(lane.queued(), (0, 0));
        assert!(matches!(
            lane.enter(|reply| TestJob {
                key: "d",
                size: 0,
                reply
            }),
            Entered::Alone
        ));
    }

    #[test]
    fn a_queue_longer_than_a_batch_goes_out_in_several() {
        let lane = Lane::<TestJob>::default();
        for _ in 0..MAX_IN_FLIGHT {
            let _ = lane.enter(|reply| TestJob {
                key: "x",
                size: 0,
                reply,
            });
        }
        let keys: Vec<&'static str> = (0..MAX_BATCH + 3)
            .map(|i| &*Box::leak(format!("k{i:03}").into_boxed_str()))
            .collect();
        let _answers: Vec<_> = keys.iter().map(|k| queue(&lane, k)).collect();
        assert_eq!(lane.next().map(|b| b.len()), Some(MAX_BATCH));
        assert_eq!(lane.next().map(|b| b.len()), Some(3));
    }

    /// Review L1 (of `e047556`): batches are bounded by bytes too (a batch's results are one
    /// datum, capped at 1 GB by PostgreSQL), and a job over the bound alone goes on its own.
    /// Before: one batch of all six, 48 MiB of results.
    #[test]
    fn a_queue_over_the_byte_bound_goes_out_in_several_and_a_huge_job_alone() {
        let lane = Lane::<TestJob>::default();
        for _ in 0..MAX_IN_FLIGHT {
            let _ = lane.enter(|reply| TestJob {
                key: "x",
                size: 0,
                reply,
            });
        }
        let mb = 1 << 20;
        let _answers: Vec<_> = [
            ("a", 6 * mb),
            ("b", 6 * mb),
            ("c", 6 * mb),
            ("d", 20 * mb),
            ("e", 5 * mb),
            ("f", 5 * mb),
        ]
        .into_iter()
        .map(|(k, size)| queue_sized(&lane, k, size))
        .collect();
        let keys = |b: Vec<TestJob>| b.iter().map(|j| j.key).collect::<Vec<_>>();
        // 6 + 6 fit 16 MiB, the third 6 does not; 5 and 5 follow the first two in the bound.
        assert_eq!(lane.next().map(keys), Some(vec!["a", "b"]));
        assert_eq!(lane.next().map(keys), Some(vec!["c", "e", "f"]));
        assert_eq!(
            lane.next().map(keys),
            Some(vec!["d"]),
            "the huge one on its own"
        );
        assert!(lane.next().is_none());
    }

    #[test]
    fn abandoning_answers_the_queue_and_frees_the_slot() {
        let lane = Lane::<TestJob>::default();
        for _ in 0..MAX_IN_FLIGHT {
            let _ = lane.enter(|reply| TestJob {
                key: "x",
                size: 0,
                reply,
            });
        }
        let mut rx = queue(&lane, "y");
        lane.abandon();
        assert!(matches!(
            rx.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
        assert_eq!(lane.queued(), (MAX_IN_FLIGHT - 1, 0));
    }
}
