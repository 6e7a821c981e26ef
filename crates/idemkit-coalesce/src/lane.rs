//! One kind's queue, its places on the wire, and the limits of its batches.

use std::fmt;
use std::sync::PoisonError;

// std's mutex, or loom's under `--cfg idemkit_loom` (the model checks, model.rs).
use idemkit_core::__sync::{Mutex, MutexGuard};

/// A queued call: its key, its size, and whether its caller still waits for it.
pub trait Job: Send + 'static {
    /// The key it reserves or completes ([`Limits::each_key_once`] compares them).
    fn key(&self) -> &str;
    /// Its caller is gone (its answer's receiver dropped): it is not sent.
    fn abandoned(&self) -> bool;
    /// The bytes it adds to a batch beyond its key (a completion's result), counted against
    /// [`Limits::max_bytes`].
    fn size(&self) -> usize {
        0
    }
}

/// How a lane batches: how many calls may be on the wire at once, and how large a batch is.
///
/// ```
/// use idemkit_coalesce::Limits;
///
/// // At most 64 keys and 16 MiB a batch, two batches on the wire, each key once.
/// let limits = Limits::new(64, 2).max_bytes(16 << 20).alone(2).each_key_once();
/// assert_eq!(limits.max_keys(), 64);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    max_keys: usize,
    max_bytes: usize,
    max_in_flight: usize,
    alone: usize,
    each_key_once: bool,
}

impl Limits {
    /// At most `max_keys` calls a batch and `max_in_flight` calls (a lone call or a batch
    /// each) on the wire at once; a call is sent alone only when nothing else is on the
    /// wire or queued ([`alone`](Self::alone)); no byte bound; keys as they come.
    pub const fn new(max_keys: usize, max_in_flight: usize) -> Self {
        Limits {
            max_keys: if max_keys == 0 { 1 } else { max_keys },
            max_bytes: usize::MAX,
            max_in_flight: if max_in_flight == 0 { 1 } else { max_in_flight },
            alone: 1,
            each_key_once: false,
        }
    }

    /// At most `bytes` of [`Job::size`] a batch; a job larger than that goes in a batch of
    /// its own.
    pub const fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// A call is sent alone, at once, while fewer than `n` calls are on the wire and none is
    /// queued (at most `max_in_flight`). One (the default) batches as soon as one call is on
    /// the wire: best where the wire pipelines (Redis); more where each call holds a
    /// connection and a lone call answers sooner than a batch fills (SQL).
    pub const fn alone(mut self, n: usize) -> Self {
        self.alone = if n == 0 {
            1
        } else if n > self.max_in_flight {
            self.max_in_flight
        } else {
            n
        };
        self
    }

    /// Each key at most once a batch, and the batch in key order.
    pub const fn each_key_once(mut self) -> Self {
        self.each_key_once = true;
        self
    }

    /// The most calls in one batch.
    pub const fn max_keys(&self) -> usize {
        self.max_keys
    }
}

/// One kind's queue and its places on the wire. A store keeps one per kind of call (and
/// per connection, where its calls are pipelined on a few).
pub struct Lane<J> {
    limits: Limits,
    state: Mutex<State<J>>,
}

struct State<J> {
    /// Calls (lone or batched) on the wire: one place each.
    in_flight: usize,
    queue: Vec<J>,
    /// A flush task is scheduled and has not taken the queue yet.
    flushing: bool,
}

impl<J> fmt::Debug for Lane<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Lane")
            .field("limits", &self.limits)
            .field("in_flight", &state.in_flight)
            .field("queued", &state.queue.len())
            .field("flushing", &state.flushing)
            .finish()
    }
}

/// What [`Lane::enter`] decided.
pub(crate) enum Entered {
    /// Send alone now: a place was taken.
    Alone,
    /// Queued; `flush`: the caller schedules the flush.
    Queued { flush: bool },
}

impl<J> Lane<J> {
    /// An idle lane.
    pub fn new(limits: Limits) -> Self {
        Lane {
            limits,
            state: Mutex::new(State {
                in_flight: 0,
                queue: Vec::new(),
                flushing: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<J>> {
        // Every change under this lock is a few assignments that cannot panic half-way;
        // keep serving if something ever did.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Nothing on the wire, nothing queued, no flush scheduled.
    pub fn is_idle(&self) -> bool {
        let state = self.lock();
        state.in_flight == 0 && state.queue.is_empty() && !state.flushing
    }

    /// Takes a place and answers `Alone` when fewer than [`Limits::alone`] calls are on the
    /// wire and none is queued; otherwise queues `job()` (built only then: a lone call
    /// allocates nothing for the queue), and schedules a flush unless one is scheduled or
    /// the wire is full (then the next reply schedules it, [`done`](Lane::done)).
    pub(crate) fn enter(&self, job: impl FnOnce() -> J) -> Entered {
        let mut state = self.lock();
        if state.in_flight < self.limits.alone && state.queue.is_empty() {
            state.in_flight += 1;
            return Entered::Alone;
        }
        state.queue.push(job());
        let flush = !state.flushing && state.in_flight < self.limits.max_in_flight;
        state.flushing |= flush;
        Entered::Queued { flush }
    }

    /// A call on the wire answered (or its caller left): its place is free. `true`: calls
    /// are queued and no flush is scheduled, so the caller must schedule one (this reply
    /// made room on the wire).
    pub(crate) fn done(&self) -> bool {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        let flush = !state.queue.is_empty() && !state.flushing;
        state.flushing |= flush;
        flush
    }

    /// The flush task was dropped before it took the queue: the queued calls are failed
    /// (their answers dropped), and the next call schedules a flush again.
    pub(crate) fn abandon(&self) {
        let mut state = self.lock();
        state.flushing = false;
        state.queue.clear();
    }
}

impl<J: Job> Lane<J> {
    /// The flush: what is queued (less the calls whose callers left), in batches, as many
    /// as the wire has room for, each counted on it. What is left waits for a reply to make
    /// room.
    pub(crate) fn take(&self) -> Vec<Vec<J>> {
        let mut state = self.lock();
        state.flushing = false;
        state.queue.retain(|job| !job.abandoned());
        let mut batches = Vec::new();
        while !state.queue.is_empty() && state.in_flight < self.limits.max_in_flight {
            let batch = self.batch(&mut state.queue);
            state.in_flight += 1;
            batches.push(batch);
        }
        batches
    }

    /// The next batch out of `queue`, in the queue's order: up to `max_keys` jobs and
    /// `max_bytes` (a first job over it goes alone), each key once if so limited.
    fn batch(&self, queue: &mut Vec<J>) -> Vec<J> {
        let Limits {
            max_keys,
            max_bytes,
            each_key_once,
            ..
        } = self.limits;
        if !each_key_once && max_bytes == usize::MAX {
            let n = queue.len().min(max_keys);
            return queue.drain(..n).collect();
        }
        let mut batch: Vec<J> = Vec::with_capacity(queue.len().min(max_keys));
        let mut rest = Vec::new();
        let mut bytes = 0usize;
        for job in queue.drain(..) {
            let fits = batch.is_empty() || bytes.saturating_add(job.size()) <= max_bytes;
            let twin = each_key_once && batch.iter().any(|b| b.key() == job.key());
            if batch.len() < max_keys && fits && !twin {
                bytes = bytes.saturating_add(job.size());
                batch.push(job);
            } else {
                rest.push(job);
            }
        }
        // Back into the queue's own allocation: replacing the queue with `rest` dropped it,
        // and the next calls grew a new one push by push.
        queue.append(&mut rest);
        if each_key_once {
            batch.sort_unstable_by(|a, b| a.key().cmp(b.key()));
        }
        batch
    }

    /// How many calls are on the wire and queued (tests).
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        (state.in_flight, state.queue.len())
    }
}

#[cfg(all(test, not(idemkit_loom)))]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    struct TestJob {
        key: String,
        size: usize,
        reply: oneshot::Sender<()>,
    }

    impl Job for TestJob {
        fn key(&self) -> &str {
            &self.key
        }
        fn abandoned(&self) -> bool {
            self.reply.is_closed()
        }
        fn size(&self) -> usize {
            self.size
        }
    }

    fn job(key: &str, size: usize) -> (TestJob, oneshot::Receiver<()>) {
        let (reply, rx) = oneshot::channel();
        let key = key.to_owned();
        (TestJob { key, size, reply }, rx)
    }

    /// Queues `key`, keeping its answer's receiver (dropped: the caller left).
    fn queue(lane: &Lane<TestJob>, key: &str, size: usize) -> oneshot::Receiver<()> {
        let (j, rx) = job(key, size);
        match lane.enter(|| j) {
            Entered::Queued { .. } => rx,
            Entered::Alone => panic!("{key} went alone"),
        }
    }

    fn keys(batch: &[TestJob]) -> Vec<&str> {
        batch.iter().map(|j| j.key.as_str()).collect()
    }

    fn sql() -> Lane<TestJob> {
        Lane::new(
            Limits::new(64, 2)
                .max_bytes(16 << 20)
                .alone(2)
                .each_key_once(),
        )
    }

    #[test]
    fn alone_while_places_are_free_then_queued_and_each_key_once_in_key_order() {
        let lane = sql();
        for _ in 0..2 {
            assert!(matches!(lane.enter(|| job("a", 0).0), Entered::Alone));
        }
        let _b = queue(&lane, "b", 0);
        let _a1 = queue(&lane, "a", 0);
        let _a2 = queue(&lane, "a", 0);
        drop(queue(&lane, "c", 0));
        assert_eq!(lane.counts(), (2, 4));
        // A reply makes room: the abandoned call is not sent; "a" once, in key order.
        assert!(lane.done(), "the reply that makes room schedules the flush");
        let batches = lane.take();
        assert_eq!(batches.len(), 1, "one place was free");
        assert_eq!(keys(&batches[0]), ["a", "b"]);
        assert!(lane.done());
        assert_eq!(keys(&lane.take()[0]), ["a"]);
        // Nothing left: every place frees, and the next call goes alone.
        assert!(!lane.done());
        assert!(!lane.done());
        assert!(lane.is_idle());
        assert!(matches!(lane.enter(|| job("d", 0).0), Entered::Alone));
    }

    #[test]
    fn one_alone_then_the_first_queued_call_schedules_the_flush_and_batches_fill_the_wire() {
        let lane = Lane::new(Limits::new(2, 2));
        assert!(matches!(lane.enter(|| job("a", 0).0), Entered::Alone));
        let mut answers = Vec::new();
        for (i, key) in ["b", "c", "d", "e", "f"].into_iter().enumerate() {
            let (j, rx) = job(key, 0);
            answers.push(rx);
            match lane.enter(|| j) {
                Entered::Queued { flush } => assert_eq!(flush, i == 0, "{key}"),
                Entered::Alone => panic!("{key} went alone"),
            }
        }
        // One place left on the wire: one batch of two, the rest waits for a reply.
        let batches = lane.take();
        assert_eq!(
            batches.iter().map(|b| keys(b)).collect::<Vec<_>>(),
            [["b", "c"]]
        );
        assert!(lane.done(), "a reply makes room");
        assert_eq!(keys(&lane.take()[0]), ["d", "e"]);
    }

    /// Review L1 (of `e047556`): batches are bounded by bytes too, and a job over the bound
    /// on its own goes alone. Before: one batch of all six, 48 MiB of results.
    #[test]
    fn a_queue_over_the_byte_bound_goes_out_in_several_and_a_huge_job_alone() {
        let lane = sql();
        for _ in 0..2 {
            let _ = lane.enter(|| job("x", 0).0);
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
        .map(|(k, size)| queue(&lane, k, size))
        .collect();
        let next = || {
            lane.done();
            lane.take().pop().map(|b| keys(&b).join(""))
        };
        // 6 + 6 fit 16 MiB, the third 6 does not; 5 and 5 fit after it.
        assert_eq!(next().as_deref(), Some("ab"));
        assert_eq!(next().as_deref(), Some("cef"));
        assert_eq!(next().as_deref(), Some("d"), "the huge one on its own");
        assert_eq!(next(), None);
    }

    #[test]
    fn a_queue_longer_than_a_batch_goes_out_in_several() {
        let lane = sql();
        for _ in 0..2 {
            let _ = lane.enter(|| job("x", 0).0);
        }
        let _answers: Vec<_> = (0..64 + 3)
            .map(|i| queue(&lane, &format!("k{i:03}"), 0))
            .collect();
        lane.done();
        lane.done();
        let sizes: Vec<usize> = lane.take().iter().map(Vec::len).collect();
        assert_eq!(sizes, [64, 3]);
    }

    #[test]
    fn an_abandoned_flush_fails_the_queue_and_the_next_call_schedules_another() {
        let lane = Lane::new(Limits::new(16, 2));
        let _ = lane.enter(|| job("a", 0).0);
        let mut rx = queue(&lane, "b", 0);
        lane.abandon();
        assert!(matches!(
            rx.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
        let (j, _rx) = job("c", 0);
        assert!(matches!(lane.enter(|| j), Entered::Queued { flush: true }));
    }
}
