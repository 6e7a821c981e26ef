//! A partition's task: its messages in offset order, each started call's completion
//! pipelined behind the next handler, offsets stored as messages settle.

use super::*;

/// The receive loop's view of one assigned partition.
pub(crate) struct Partition {
    /// The generation its task was started with.
    pub(crate) generation: u64,
    /// The task's queue.
    pub(crate) tx: mpsc::Sender<OwnedMessage>,
    /// Messages received while the queue was full, in order; the partition is paused while
    /// any wait here.
    pub(crate) overflow: VecDeque<OwnedMessage>,
    pub(crate) paused: bool,
    pub(crate) task: tokio::task::Id,
}

/// A finished partition task: the partition it served if it died while its partition was
/// still this member's (not revoked, not shut down).
pub(crate) fn died(
    done: Result<(tokio::task::Id, ()), tokio::task::JoinError>,
    partitions: &HashMap<(String, i32), Partition>,
    generations: &Generations,
) -> Option<(String, i32)> {
    let id = match done {
        Ok((id, ())) => id,
        Err(e) => {
            tracing::error!(error = %e, "kafka runner: a partition task died");
            e.id()
        }
    };
    partitions
        .iter()
        .find(|(tp, p)| p.task == id && p.generation == generations.get(tp))
        .map(|(tp, _)| tp.clone())
}

/// Moves waiting messages into queues with room again; resumes a partition whose overflow
/// is empty. A revoked partition's waiting messages are dropped (its next owner gets them).
pub(crate) fn refill(
    consumer: &StreamConsumer<RunnerContext>,
    partitions: &mut HashMap<(String, i32), Partition>,
    generations: &Generations,
) {
    for (tp, p) in partitions.iter_mut() {
        if p.generation != generations.get(tp) {
            p.overflow.clear();
        }
        while let Some(m) = p.overflow.pop_front() {
            match p.tx.try_send(m) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(m)) => {
                    p.overflow.push_front(m);
                    break;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    p.overflow.clear();
                    break;
                }
            }
        }
        if p.overflow.is_empty() && p.paused {
            p.paused = false;
            resume(consumer, tp);
        }
    }
}

/// How many of a partition's messages may be started and not yet settled at once: the one
/// whose handler runs, and those whose results are on their way to the store.
pub(crate) const PIPELINE: usize = 64;

/// A started message: its call runs in a task of its own, so that its completion goes on
/// while the partition's next message is handled, and while an older one is settled.
pub(crate) type Started<T> = VecDeque<(OwnedMessage, tokio::task::JoinHandle<Processed<T>>)>;

pub(crate) async fn partition_task<S, K, H>(
    shared: Arc<Shared<S, K, H>>,
    tp: (String, i32),
    generation: u64,
    mut queue: mpsc::Receiver<OwnedMessage>,
) where
    S: Store + Send + Sync + 'static,
    K: Fn(&OwnedMessage) -> Result<Key, KeyError> + Send + Sync + 'static,
    H: Handle<OwnedMessage> + 'static,
    H::Output: 'static,
{
    let current = || shared.generations.get(&tp) == generation;
    let assigned = || shared.generations.assigned(&tp, generation);
    // Transactional output: the partition's own producer (its id fences the partition's
    // previous owner, whose open transaction is aborted).
    let txn = match &shared.transactional {
        Some((t, cluster)) => match PartitionTxn::start(cluster.clone(), &t.id, &tp).await {
            Ok(txn) => Some(txn),
            Err(e) => {
                tracing::error!(error = %e, topic = tp.0, partition = tp.1, "kafka runner: the partition's transactional producer did not start");
                return;
            }
        },
        None => None,
    };
    let batch = shared.batch;
    let mut pending: Vec<OwnedMessage> = Vec::with_capacity(batch);
    // Oldest first: settled, and their offsets stored, in this order.
    let mut started: Started<H::Output> = VecDeque::new();
    loop {
        // The next message; what was started meanwhile settles as it finishes.
        let next = loop {
            let Some((_, oldest)) = started.front_mut() else {
                break queue.recv().await;
            };
            let oldest_done = tokio::select! {
                biased;
                joined = oldest => joined,
                m = queue.recv() => break m,
            };
            if !settle_oldest(
                &shared,
                &tp,
                &mut started,
                oldest_done,
                &current,
                txn.as_ref(),
            )
            .await
            {
                return finish(&shared, started, txn.as_ref(), &assigned).await;
            }
        };
        let Some(m) = next else { break };
        pending.push(m);
        // What has arrived for this partition meanwhile joins the batch (never waits for
        // more: no latency is added when messages come one at a time).
        while pending.len() < batch {
            match queue.try_recv() {
                Ok(m) => pending.push(m),
                Err(_) => break,
            }
        }
        shared.drained.notify_one();
        if !current() {
            break;
        }
        // The batch's keys reserved in one round trip; then each message starts once the
        // one before it has handled its message (its effect happened; its completion may be
        // on the wire), or has settled: effects in offset order, completions overlapping.
        let mut claims = if pending.len() > 1 {
            shared.settler.processor().prepare(&pending).await
        } else {
            vec![None]
        }
        .into_iter();
        for message in pending.drain(..) {
            if !current() {
                // Revoked: the unused claims are released as they drop.
                return finish(&shared, started, txn.as_ref(), &assigned).await;
            }
            let claim = claims.next().flatten();
            let handled = Arc::new(tokio::sync::Notify::new());
            let call = {
                let (shared, message, handled) = (shared.clone(), message.clone(), handled.clone());
                // Boxed: the call's future is many kilobytes, and a task's future is copied
                // whole as it is spawned, finished and read; a box is copied once (as in
                // `idemkit_runner::handle_together`, measured in docs/benchmarks.md).
                tokio::spawn(Box::pin(async move {
                    let signal = move || handled.notify_one();
                    shared
                        .settler
                        .processor()
                        .process_signalled(&message, claim, 1, signal)
                        .await
                }))
            };
            started.push_back((message, call));
            // Until this message has handled its own (or settled), the next one waits;
            // older ones settle meanwhile. A handler that fails is retried before any later
            // message starts: `handled` is only told of a value.
            let mut this_settled = false;
            while !this_settled {
                let newest = started.len() == 1;
                let (_, oldest) = started.front_mut().expect("this message is started");
                let oldest_done = tokio::select! {
                    biased;
                    () = handled.notified() => break,
                    joined = oldest => joined,
                };
                if !settle_oldest(
                    &shared,
                    &tp,
                    &mut started,
                    oldest_done,
                    &current,
                    txn.as_ref(),
                )
                .await
                {
                    return finish(&shared, started, txn.as_ref(), &assigned).await;
                }
                this_settled = newest;
            }
            // Bounded: with many results on the wire, the oldest settle first.
            if !settle_down_to(
                &shared,
                &tp,
                &mut started,
                PIPELINE - 1,
                &current,
                txn.as_ref(),
            )
            .await
            {
                return finish(&shared, started, txn.as_ref(), &assigned).await;
            }
        }
        // Transactional output: the batch settles whole, then its outputs and its offsets
        // commit together (no pipeline across batches).
        if let Some(t) = &txn {
            if !settle_down_to(&shared, &tp, &mut started, 0, &current, Some(t)).await {
                return finish(&shared, started, Some(t), &assigned).await;
            }
            if !current() {
                return finish(&shared, started, Some(t), &assigned).await;
            }
            if let Err(e) = t.commit(shared.consumer.group_metadata()).await {
                // Its messages come again from the last committed offset (the runner
                // stops; the next owner or a restart replays their results).
                tracing::error!(error = %e, topic = tp.0, partition = tp.1, "kafka runner: the transaction did not commit");
                t.abort().await;
                return finish(&shared, started, Some(t), &assigned).await;
            }
        }
    }
    // The queue is closed (shutdown) or the partition revoked: what was started finishes,
    // and settles while the partition is still this member's.
    if !settle_down_to(&shared, &tp, &mut started, 0, &current, txn.as_ref()).await {
        return finish(&shared, started, txn.as_ref(), &assigned).await;
    }
    if let Some(t) = &txn {
        t.close(assigned(), shared.consumer.group_metadata()).await;
    }
}

/// Waits for the oldest started calls and settles them, until at most `left` are started.
/// False if the partition was revoked (see [`settle_oldest`]).
async fn settle_down_to<S, K, H>(
    shared: &Shared<S, K, H>,
    tp: &(String, i32),
    started: &mut Started<H::Output>,
    left: usize,
    current: &(impl Fn() -> bool + Sync),
    txn: Option<&PartitionTxn>,
) -> bool
where
    S: Store + Send + Sync + 'static,
    K: Fn(&OwnedMessage) -> Result<Key, KeyError> + Send + Sync + 'static,
    H: Handle<OwnedMessage> + 'static,
{
    while started.len() > left {
        let (_, oldest) = started.front_mut().expect("more than `left` started");
        let oldest_done = oldest.await;
        if !settle_oldest(shared, tp, started, oldest_done, current, txn).await {
            return false;
        }
    }
    true
}

/// Settles the oldest started message, whose call finished, and stores its offset. False if
/// the partition was revoked (nothing stored).
pub(crate) async fn settle_oldest<S, K, H>(
    shared: &Shared<S, K, H>,
    tp: &(String, i32),
    started: &mut Started<H::Output>,
    joined: Result<Processed<H::Output>, tokio::task::JoinError>,
    current: &(impl Fn() -> bool + Sync),
    txn: Option<&PartitionTxn>,
) -> bool
where
    S: Store + Send + Sync + 'static,
    K: Fn(&OwnedMessage) -> Result<Key, KeyError> + Send + Sync + 'static,
    H: Handle<OwnedMessage> + 'static,
{
    let (message, _) = started.pop_front().expect("the oldest finished");
    let processed = match joined {
        Ok(processed) => processed,
        // The processor catches the handler's panics: anything else is a bug of ours, and
        // the partition task dies with it, as it would have inline (no later offset is
        // stored past this message).
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: the runtime is shutting down.
        Err(_) => return false,
    };
    if !current() {
        // Revoked before its call ended: not settled here (the next owner replays it), and
        // its end shown to `on_unsettled`, as the other started calls' (`finish`).
        unsettled(shared, &message, &processed);
        return false;
    }
    let Some(settled) = settle(shared, &message, processed, current).await else {
        return false; // revoked while settling: the next owner has it
    };
    if let (Some(t), Some((transactional, _))) = (txn, &shared.transactional) {
        // Outputs from the result, fresh or replayed (a dead letter has none).
        let outputs = match (&settled.settlement, &settled.receipt) {
            (Settlement::Ack, Some(receipt)) => (transactional.outputs)(&message, receipt),
            _ => Vec::new(),
        };
        if let Err(e) = t.add(message.offset(), outputs).await {
            tracing::error!(error = %e, topic = tp.0, partition = tp.1, "kafka runner: an output was not produced");
            t.abort().await;
            return false;
        }
        return true;
    }
    if current()
        && let Err(e) = shared.consumer.store_offset(&tp.0, tp.1, message.offset())
    {
        tracing::debug!(error = %e, topic = tp.0, partition = tp.1, "kafka runner: offset not stored");
    }
    true
}

/// A revoked or shut-down partition's started calls run to their end (their results are
/// stored under their keys, so the next owner replays them); nothing more is settled. Each
/// one's end is shown to the `on_unsettled` hook, if there is one.
pub(crate) async fn finish<S, K, H>(
    shared: &Shared<S, K, H>,
    started: Started<H::Output>,
    txn: Option<&PartitionTxn>,
    assigned: &impl Fn() -> bool,
) where
    S: Store + Send + Sync + 'static,
    K: Fn(&OwnedMessage) -> Result<Key, KeyError> + Send + Sync + 'static,
    H: Handle<OwnedMessage> + 'static,
{
    for (message, call) in started {
        match call.await {
            Ok(processed) => unsettled(shared, &message, &processed),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    // What was settled before: committed if the partition is still ours (a shutdown),
    // aborted if it was revoked (delivered again to its next owner, who replays it).
    if let Some(t) = txn {
        t.close(assigned(), shared.consumer.group_metadata()).await;
    }
}

/// Shows a call that ended unsettled to the `on_unsettled` hook, its panics caught.
fn unsettled<S, K, H: Handle<OwnedMessage>>(
    shared: &Shared<S, K, H>,
    message: &OwnedMessage,
    processed: &Processed<H::Output>,
) {
    if let Some(hook) = &shared.on_unsettled
        && let Err(panic) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(message, processed)))
    {
        tracing::error!(
            panic = idemkit_core::unwind::message(&*panic),
            "kafka runner: the on_unsettled hook panicked"
        );
    }
}

/// Settles one message through the shared settle loop (retried in place until final, the
/// partition waiting so that its order is kept; dead-lettered; shown to the hook): its final
/// outcome, or `None` if the partition was revoked meanwhile.
pub(crate) async fn settle<S, K, H>(
    shared: &Shared<S, K, H>,
    message: &OwnedMessage,
    processed: Processed<H::Output>,
    current: &(impl Fn() -> bool + Sync),
) -> Option<Processed<H::Output>>
where
    S: Store + Send + Sync + 'static,
    K: Fn(&OwnedMessage) -> Result<Key, KeyError> + Send + Sync + 'static,
    H: Handle<OwnedMessage> + 'static,
{
    let transport = Parking {
        dead_letter: shared.dead_letter.as_ref(),
        current,
    };
    // A dead letter is retried until produced or the partition is revoked: not parked
    // means revoked.
    shared
        .settler
        .settle(&transport, message, 1, processed, current)
        .await
        .filter(|done| done.parked)
        .map(|done| done.processed)
}
