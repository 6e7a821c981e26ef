//! Entering a lane, the flush task, and the guards that give places back.

use std::future::Future;
use std::marker::PhantomData;

use crate::lane::{Entered, Job, Lane};

/// A store's side of one lane: where its queue is, and how a batch of it goes out.
///
/// Cheap to clone (a handle on the store): the flush task and each batch's task own one.
pub trait Sender<J: Job>: Clone + Send + Sync + 'static {
    /// The lane this sender's calls queue in.
    fn lane(&self) -> &Lane<J>;

    /// Sends `batch` as one call and answers each of its jobs (through the job's own
    /// reply). A job not answered is answered for it: its reply is dropped, and its caller
    /// gets an error ([`answer`](crate::answer)).
    fn send(&self, batch: Vec<J>) -> impl Future<Output = ()> + Send;
}

/// A place on the wire: held by a call sent alone, or by a batch's task. Dropping it (the
/// call answered, or its caller or task gone) frees the place, and schedules a flush if
/// calls queued meanwhile.
#[must_use = "dropping a lead frees its place on the wire"]
pub struct Lead<J: Job, S: Sender<J>> {
    sender: S,
    job: PhantomData<fn() -> J>,
}

impl<J: Job, S: Sender<J>> std::fmt::Debug for Lead<J, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lead").finish_non_exhaustive()
    }
}

impl<J: Job, S: Sender<J>> Drop for Lead<J, S> {
    fn drop(&mut self) {
        if self.sender.lane().done() {
            flush(self.sender.clone());
        }
    }
}

/// Enters `sender`'s lane: `Some(lead)` to send the call alone now, holding the lead until
/// it answered; `None` when the call was queued as `job()` (built only then), its answer to
/// come through the reply the job carries. A flush is scheduled when one is due.
pub fn enter<J: Job, S: Sender<J>>(sender: &S, job: impl FnOnce() -> J) -> Option<Lead<J, S>> {
    match sender.lane().enter(job) {
        Entered::Alone => Some(Lead {
            sender: sender.clone(),
            job: PhantomData,
        }),
        Entered::Queued { flush: true } => {
            flush(sender.clone());
            None
        }
        Entered::Queued { flush: false } => None,
    }
}

/// Where [`queue`] put a call.
#[derive(Debug)]
pub enum Entry<J: Job, S: Sender<J>, T> {
    /// Send the call alone now, holding the lead until it answered.
    Alone(Lead<J, S>),
    /// The call was queued: its answer comes here ([`answer`](crate::answer)).
    Queued(crate::Answer<T>),
}

/// [`enter`] with the answer's channel made for the caller: the job is built from the
/// sending end (only if the call is queued), and the receiving end comes back in
/// [`Entry::Queued`].
///
/// ```
/// # use idemkit_coalesce::{Entry, Job, Lane, Limits, Responder, Sender, queue};
/// # #[derive(Clone)] struct Store(std::sync::Arc<Lane<Call>>);
/// # struct Call { key: String, reply: Responder<u64> }
/// # impl Job for Call { fn key(&self) -> &str { &self.key } fn abandoned(&self) -> bool { self.reply.is_closed() } }
/// # impl Sender<Call> for Store {
/// #     fn lane(&self) -> &Lane<Call> { &self.0 }
/// #     async fn send(&self, batch: Vec<Call>) { for c in batch { let _ = c.reply.send(Ok(1)); } }
/// # }
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = Store(std::sync::Arc::new(Lane::new(Limits::new(16, 2))));
/// match queue(&store, |reply| Call { key: "k".into(), reply }) {
///     // An idle lane: the call goes alone, its place held until it answered.
///     Entry::Alone(_lead) => {}
///     Entry::Queued(answer) => { idemkit_coalesce::answer(answer).await.unwrap(); }
/// }
/// # });
/// ```
pub fn queue<J: Job, S: Sender<J>, T>(
    sender: &S,
    job: impl FnOnce(crate::Responder<T>) -> J,
) -> Entry<J, S, T> {
    let mut queued = None;
    let lead = enter(sender, || {
        let (reply, answer) = tokio::sync::oneshot::channel();
        queued = Some(answer);
        job(reply)
    });
    match (lead, queued) {
        (Some(lead), _) => Entry::Alone(lead),
        (None, Some(answer)) => Entry::Queued(answer),
        // `enter` builds the job exactly when it queues the call.
        (None, None) => unreachable!("a call neither sent alone nor queued"),
    }
}

/// If the flush task is dropped before it took the queue (its runtime shut down, even
/// before the task was first polled), the queued calls are failed and the next call
/// schedules a flush again. Made before the task is spawned and moved into it, so that
/// dropping the unpolled task drops it too.
struct Unsent<J: Job, S: Sender<J>> {
    sender: S,
    armed: bool,
    job: PhantomData<fn() -> J>,
}

impl<J: Job, S: Sender<J>> Drop for Unsent<J, S> {
    fn drop(&mut self) {
        if self.armed {
            self.sender.lane().abandon();
        }
    }
}

/// Schedules the flush task: it takes the queue and sends each batch from a task of its own.
fn flush<J: Job, S: Sender<J>>(sender: S) {
    let mut unsent = Unsent {
        sender,
        armed: true,
        job: PhantomData,
    };
    // A place can be freed where no runtime is (a call's future dropped after its runtime):
    // then nobody can send the queue, and its callers get an error (`Unsent`).
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        // Let the tasks that are ready queue their calls first: without this yield a
        // multi-thread runtime runs the new task at once (its LIFO slot), and batches hold
        // one or two keys (docs/benchmarks.md: then coalescing costs Redis more than it
        // saves).
        tokio::task::yield_now().await;
        unsent.armed = false;
        let sender = &unsent.sender;
        for batch in sender.lane().take() {
            // The batch's place (counted by `take`), made before its task is spawned: an
            // unpolled task gives it back too.
            let place = Lead {
                sender: sender.clone(),
                job: PhantomData,
            };
            tokio::spawn(async move {
                place.sender.send(batch).await;
                drop(place);
            });
        }
    });
}

#[cfg(all(test, not(idemkit_loom)))]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use idemkit_core::StoreError;
    use tokio::sync::{Notify, oneshot};

    use super::*;
    use crate::{Answer, Limits, Responder, answer};

    struct Echo {
        key: String,
        reply: Responder<usize>,
    }

    impl Job for Echo {
        fn key(&self) -> &str {
            &self.key
        }
        fn abandoned(&self) -> bool {
            self.reply.is_closed()
        }
    }

    /// A store whose batches answer each job with the batch's size, once `open` says so.
    #[derive(Clone)]
    struct Store {
        lane: Arc<Lane<Echo>>,
        open: Arc<Notify>,
        batches: Arc<AtomicUsize>,
    }

    impl Sender<Echo> for Store {
        fn lane(&self) -> &Lane<Echo> {
            &self.lane
        }
        async fn send(&self, batch: Vec<Echo>) {
            self.open.notified().await;
            self.batches.fetch_add(1, Ordering::SeqCst);
            let n = batch.len();
            for job in batch {
                let _ = job.reply.send(Ok(n));
            }
        }
    }

    fn store() -> Store {
        Store {
            lane: Arc::new(Lane::new(Limits::new(16, 2))),
            open: Arc::new(Notify::new()),
            batches: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn queue(store: &Store, key: &str) -> Answer<usize> {
        let (reply, rx) = oneshot::channel();
        let lead = enter(store, || Echo {
            key: key.to_owned(),
            reply,
        });
        assert!(lead.is_none(), "{key} went alone");
        rx
    }

    #[tokio::test]
    async fn calls_queued_behind_a_lone_call_go_out_as_one_batch() {
        let store = store();
        let lead = enter(&store, || unreachable!("the first call goes alone"));
        let lead = lead.expect("alone");
        let answers: Vec<_> = ["a", "b", "c"].iter().map(|k| queue(&store, k)).collect();
        // The flush task takes all three into one batch, which waits for `open`.
        while store.lane.counts() != (2, 0) {
            tokio::task::yield_now().await;
        }
        store.open.notify_one();
        for a in answers {
            assert_eq!(answer(a).await.unwrap(), 3);
        }
        drop(lead);
        assert_eq!(store.batches.load(Ordering::SeqCst), 1);
        assert!(store.lane.is_idle());
    }

    /// A flush whose runtime shut down before its first poll fails the queued calls and
    /// leaves the lane usable; a batch task dropped unpolled gives its place back.
    #[test]
    fn unpolled_flushes_and_batches_give_everything_back() {
        let store = store();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (lead, a) = rt.block_on(async {
            let lead = enter(&store, || unreachable!()).expect("alone");
            (lead, queue(&store, "a"))
        });
        // The flush task was spawned, never polled: the runtime goes with it.
        drop(rt);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e: StoreError = rt.block_on(answer(a)).unwrap_err();
        assert_eq!(e.kind(), idemkit_core::StoreErrorKind::Unavailable);
        drop(lead);
        assert!(store.lane.is_idle(), "{:?}", store.lane);
        // Batches spawned and dropped unpolled, many times over: no place is kept. One task
        // between two polls of `block_on`'s future, so that it sees the flush's work before
        // the runtime polls the batch's task.
        for _ in 0..4 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .event_interval(1)
                .build()
                .unwrap();
            rt.block_on(async {
                let lead = enter(&store, || unreachable!()).expect("alone");
                let _a = queue(&store, "b");
                drop(lead);
                // The flush took "b" (its batch counted on the wire) and spawned the batch's
                // task, which this runtime has not polled yet: leave it so.
                while store.lane.counts() != (1, 0) {
                    tokio::task::yield_now().await;
                }
            });
            drop(rt);
            assert!(store.lane.is_idle(), "{:?}", store.lane);
        }
    }
}
