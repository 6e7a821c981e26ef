//! Messages that arrived together, claimed together: one store round trip for their keys
//! (`Store::begin_many`), then each handled in a task of its own as soon as a handler is
//! free. What the RabbitMQ and JetStream runners do with the deliveries a channel or a pull
//! holds at once (the Kafka runner claims a partition's batch in order instead:
//! `process_batch`).

use std::future::Future;

use idemkit_core::{Prepared, Store};
use tokio::task::JoinSet;

use crate::{Handle, HandlerSlots, KeyOf, Processor, Ticket, Turn};

/// Handles `batch` (messages in the order received, each with what its runner keeps beside
/// it, such as an acknowledger, and its [`Ticket`]) through `each(message, kept, claim,
/// turn)`, each in a task of its own. Several messages, or a lone one that finds every
/// handler busy, have their keys claimed in one store round trip first (`claim`: the
/// message's reservation, or its replay); then each task waits for its [`Turn`] (a free
/// handler of `slots`, in order: `turn.slot()`) and runs its handler holding the slot (give
/// it back once the handler's value is there). So a claim's round trip overlaps the
/// handlers still running rather than delaying the next one, and the wait is the task's
/// own (a runner keeps the message alive meanwhile, as JetStream's in-progress acks do). A
/// claim that waited longer than a renewal interval is confirmed before its handler runs,
/// as any prepared claim is (ARCHITECTURE.md row 31). A lone message with a handler free
/// is not claimed first (`claim` is `None`: its call reserves its key, one round trip as
/// before).
///
/// Once `slots` is [closed](HandlerSlots::close) (the runner is shutting down), `slot()`
/// answers `None` to a message still waiting: the task drops it with its claim (released),
/// leaving it to the broker. Returns once every task ended; a panic of `each` (not of a
/// handler: the processor catches those) goes on.
///
/// # Example
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
/// use idemkit_runner::{HandlerSlots, Processor, handle_together};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let p = Arc::new(Processor::new(
///     Coordinator::new(MemoryStore::new()),
///     Operation::new("mail.invoice")?,
///     |order: &String| Key::compose([order.as_str(), "invoice"]),
///     |order: String, _| async move { Ok::<_, std::io::Error>(format!("em_{order}")) },
/// ));
/// let slots = HandlerSlots::new(1);
/// let sent = Arc::new(Mutex::new(Vec::new()));
/// let mut batch = Vec::new();
/// for (n, order) in ["order-1", "order-2"].into_iter().enumerate() {
///     batch.push((order.to_string(), n, slots.enter().await.unwrap()));
/// }
/// let (q, log) = (p.clone(), sent.clone());
/// handle_together(&p, &slots, batch, move |order, n, claim, turn| {
///     let (p, log) = (q.clone(), log.clone());
///     async move {
///         let Some(slot) = turn.slot().await else { return }; // closed: not started
///         let done = p.process_signalled(&order, claim, 1, || slot.give_back()).await;
///         log.lock().unwrap().push((n, done.receipt.map(|r| r.value)));
///     }
/// })
/// .await;
/// let sent = sent.lock().unwrap().clone();
/// assert_eq!(sent, [(0, Some("em_order-1".into())), (1, Some("em_order-2".into()))]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn handle_together<S, K, H, M, X, F, Fut>(
    processor: &Processor<S, K, H>,
    slots: &HandlerSlots,
    batch: Vec<(M, X, Ticket)>,
    each: F,
) where
    S: Store,
    K: KeyOf<M>,
    H: Handle<M>,
    F: Fn(M, X, Option<Prepared<S>>, Turn) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let ahead = batch.len() > 1 || !slots.handler_free();
    let mut messages = Vec::with_capacity(batch.len());
    let mut rest = Vec::with_capacity(batch.len());
    for (message, kept, ticket) in batch {
        messages.push(message);
        rest.push((kept, ticket));
    }
    let claims = if ahead {
        processor.prepare(&messages).await
    } else {
        messages.iter().map(|_| None).collect()
    };
    let mut running = JoinSet::new();
    for ((message, (kept, ticket)), claim) in messages.into_iter().zip(rest).zip(claims) {
        // Boxed: a message's future (its claim, the coordinator's call, the handler's and
        // the settlement's futures) is many kilobytes, and a task's future is copied
        // whole as it is spawned, stored, finished and read (tokio's task cell holds it
        // inline); a box is copied once. Measured in docs/benchmarks.md.
        running.spawn(Box::pin(each(message, kept, claim, slots.turn(ticket))));
    }
    while let Some(done) = running.join_next().await {
        if let Err(e) = done
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use idemkit_core::{Coordinator, Key, MemoryStore, Operation, RecordState, StorageKey, Store};
    use tokio::sync::Notify;

    use super::*;

    type Handling = std::pin::Pin<Box<dyn Future<Output = Result<u32, std::io::Error>> + Send>>;
    type Handler = Box<dyn Fn(String, idemkit_core::Attempt) -> Handling + Send + Sync>;
    type Runner =
        Processor<MemoryStore, fn(&String) -> Result<Key, idemkit_core::KeyError>, Handler>;

    #[expect(
        clippy::ptr_arg,
        reason = "a key function of String messages takes &String"
    )]
    fn key(m: &String) -> Result<Key, idemkit_core::KeyError> {
        Key::new(m.as_str())
    }

    /// A processor whose handler for "slow" waits for `gate` (after `started`), and counts
    /// every run.
    fn runner(gate: Arc<Notify>, started: Arc<Notify>, runs: Arc<AtomicU32>) -> Arc<Runner> {
        let handler: Handler = Box::new(move |m: String, _| {
            let (gate, started, runs) = (gate.clone(), started.clone(), runs.clone());
            Box::pin(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if m == "slow" {
                    started.notify_one();
                    gate.notified().await;
                }
                Ok(1)
            })
        });
        Arc::new(Processor::new(
            Coordinator::new(MemoryStore::new()),
            Operation::new("runner.claim").unwrap(),
            key as fn(&String) -> Result<Key, idemkit_core::KeyError>,
            handler,
        ))
    }

    fn stored(p: &Runner, m: &str) -> StorageKey {
        StorageKey::new(p.operation(), None, &Key::new(m).unwrap())
    }

    /// Spawns `handle_together` for one message, each run through the processor.
    fn start(p: &Arc<Runner>, slots: &HandlerSlots, m: &str) -> tokio::task::JoinHandle<()> {
        let ticket = slots.try_enter().expect("a ticket");
        let (p, slots, m) = (p.clone(), slots.clone(), m.to_string());
        tokio::spawn(async move {
            let q = p.clone();
            handle_together(
                &p,
                &slots,
                vec![(m, (), ticket)],
                move |m, (), claim, turn: Turn| {
                    let q = q.clone();
                    async move {
                        let Some(slot) = turn.slot().await else {
                            return;
                        };
                        q.process_signalled(&m, claim, 1, || slot.give_back()).await;
                    }
                },
            )
            .await;
        })
    }

    /// Yields until `done` holds, failing after many turns (no clock: each turn lets the
    /// spawned tasks run on this current-thread runtime).
    async fn until(mut done: impl AsyncFnMut() -> bool, what: &str) {
        for _ in 0..10_000 {
            if done().await {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("never: {what}");
    }

    /// One handler, held by a "slow" message until `gate`, and a second message `m` waiting
    /// for it with its key claimed.
    struct Busy {
        p: Arc<Runner>,
        gate: Arc<Notify>,
        runs: Arc<AtomicU32>,
        slots: HandlerSlots,
        slow: tokio::task::JoinHandle<()>,
        waiting: tokio::task::JoinHandle<()>,
        store: MemoryStore,
        key: StorageKey,
    }

    async fn busy(m: &str) -> Busy {
        let (gate, started, runs) = (Arc::default(), Arc::new(Notify::new()), Arc::default());
        let p = runner(Arc::clone(&gate), started.clone(), Arc::clone(&runs));
        let slots = HandlerSlots::new(1);
        let slow = start(&p, &slots, "slow");
        started.notified().await;
        let waiting = start(&p, &slots, m);
        let store = p.coordinator().store().clone();
        let key = stored(&p, m);
        until(
            async || store.get(&key).await.unwrap().is_some(),
            "the waiting message's key reserved",
        )
        .await;
        Busy {
            p,
            gate,
            runs,
            slots,
            slow,
            waiting,
            store,
            key,
        }
    }

    #[tokio::test]
    async fn a_message_that_finds_every_handler_busy_is_claimed_while_it_waits() {
        let Busy {
            gate,
            runs,
            slow,
            waiting: next,
            store,
            key,
            ..
        } = busy("next").await;
        // Reserved before the handler is free: the claim overlaps the running handler.
        let record = store.get(&key).await.unwrap().expect("reserved");
        assert_eq!(record.state, RecordState::Reserved);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "only the slow handler ran so far"
        );
        gate.notify_one();
        slow.await.unwrap();
        next.await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        let record = store.get(&key).await.unwrap().expect("stored");
        assert!(
            matches!(record.state, RecordState::Completed(_)),
            "{record:?}"
        );
    }

    /// A claim that waits past its whole lease behind a busy handler (paused time), while a
    /// redelivery of its message takes the expired key and completes it: when its turn comes
    /// the claim is confirmed first (row 31), finds the result and replays it; the handler
    /// never runs a second time.
    #[tokio::test(start_paused = true)]
    async fn a_claim_that_waited_past_its_lease_is_confirmed_before_its_handler_runs() {
        let Busy {
            p,
            gate,
            runs,
            slow,
            waiting,
            store,
            key,
            ..
        } = busy("next").await;
        // Far past any lease: the waiting claim's reservation has expired (the slow
        // handler's own lease is renewed meanwhile).
        tokio::time::advance(std::time::Duration::from_secs(600)).await;
        assert!(
            store.get(&key).await.unwrap().is_none(),
            "the claim expired"
        );
        // A redelivery elsewhere takes the key and completes it.
        let other = p.process(&"next".to_string(), 2).await;
        assert_eq!(other.settlement, crate::Settlement::Ack);
        assert_eq!(runs.load(Ordering::SeqCst), 2, "slow, and the redelivery");
        gate.notify_one();
        slow.await.unwrap();
        waiting.await.unwrap();
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "the stale claim ran its handler beside the redelivery's result"
        );
    }

    #[tokio::test]
    async fn a_message_waiting_for_a_handler_at_shutdown_is_not_started_and_its_claim_released() {
        let Busy {
            gate,
            runs,
            slots,
            slow,
            waiting,
            store,
            key,
            ..
        } = busy("waiting").await;
        slots.close();
        // The waiting message's batch ends without starting it; its claim is released.
        waiting.await.unwrap();
        until(
            async || store.get(&key).await.unwrap().is_none(),
            "the unused claim released",
        )
        .await;
        gate.notify_one();
        slow.await.unwrap();
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "the waiting message never ran"
        );
        assert!(slots.enter().await.is_none(), "no tickets after close");
    }
}
