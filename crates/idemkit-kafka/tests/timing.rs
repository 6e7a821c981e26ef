//! Issue 20 on a real broker: the runner's defects that show only with real timing (a
//! panicking handler, a slow partition, a dead owner released by an operator, a batch whose
//! last message is slow). Each failed before its fix; the comment on each says how.
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkit_core::{Coordinator, InFlight, Key, MemoryStore, Operation, Policy, StorageKey, Store};
use idemkit_kafka::{KafkaRunner, RebalanceEvent};
use idemkit_runner::{Processor, RetryPolicy, Settlement};
use rdkafka::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::OwnedMessage;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use support::*;

fn body(m: &OwnedMessage) -> String {
    String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned()
}

fn op() -> Operation {
    Operation::new("mail.invoice").unwrap()
}

/// The group's committed offset of `topic`'s partition 0 (read without joining the group).
fn committed(brokers: &str, group: &str, topic: &str) -> Option<i64> {
    let c: BaseConsumer = consumer_config(brokers, group).create().unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition(topic, 0);
    let got = c.committed_offsets(list, Duration::from_secs(5)).ok()?;
    match got.find_partition(topic, 0)?.offset() {
        Offset::Offset(n) => Some(n),
        _ => None,
    }
}

type Handled = Arc<Mutex<Vec<String>>>;

/// Item 2: a handler that panics on `poison`, then `a`, `b`, and later `c`, on one partition.
///
/// Before: the panic killed the partition task with its batch; the receive loop started a
/// fresh task for the next message received: `handled = ["c"]`, the committed offset 4,
/// nothing dead-lettered (`poison`, `a` and `b` silently skipped).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_handler_is_retried_then_dead_lettered_and_nothing_behind_it_is_lost() {
    let Some(brokers) = brokers() else { return };
    let (topic, group) = (unique("orders"), unique("group"));
    let dead = format!("{topic}.dead");
    create_topic(&brokers, &topic, 1).await;
    create_topic(&brokers, &dead, 1).await;
    let p = producer(&brokers);
    for (key, payload) in [("order-1", "poison"), ("order-2", "a"), ("order-3", "b")] {
        produce(&p, &topic, 0, key, payload).await;
    }
    let handled: Handled = Arc::default();
    let tries = Arc::new(Mutex::new(0u32));
    let processor = {
        let (handled, tries) = (handled.clone(), tries.clone());
        Processor::new(
            Coordinator::new(MemoryStore::new()),
            op(),
            |m: &OwnedMessage| Key::new(body(m)),
            move |m: OwnedMessage, _| {
                let (handled, tries) = (handled.clone(), tries.clone());
                async move {
                    if body(&m) == "poison" {
                        *tries.lock().unwrap() += 1;
                        panic!("the template cannot render this order");
                    }
                    handled.lock().unwrap().push(body(&m));
                    Ok::<_, std::io::Error>(body(&m))
                }
            },
        )
        .retry(
            RetryPolicy::new()
                .max_deliveries(3)
                .backoff(Duration::from_millis(20), Duration::from_millis(50)),
        )
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let runner = KafkaRunner::new(
        consumer_config(&brokers, &group),
        [topic.clone()],
        processor,
    )
    .dead_letter_topic(&dead);
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    let first = eventually(Duration::from_secs(60), || async {
        handled.lock().unwrap().len() == 2
    })
    .await;
    produce(&p, &topic, 0, "order-4", "c").await;
    let all = eventually(Duration::from_secs(60), || async {
        handled.lock().unwrap().len() == 3
    })
    .await;
    let parked = eventually(Duration::from_secs(30), || async {
        committed(&brokers, &group, &topic) == Some(4)
    })
    .await;
    stop.notify_one();
    task.await.unwrap().unwrap();
    let handled = handled.lock().unwrap().clone();
    assert!(first && all, "handled {handled:?}");
    assert_eq!(handled, ["a", "b", "c"]);
    assert_eq!(
        *tries.lock().unwrap(),
        3,
        "three tries, then the dead letter"
    );
    assert!(parked, "the committed offset passed every message");
    let dlq = read_topic(&brokers, &dead, 1).await;
    assert_eq!(dlq.len(), 1, "the panicking message is dead-lettered");
    assert_eq!(dlq[0].payload(), Some(&b"poison"[..]));
}

/// Item 2: a panic in the `on_settled` hook is a failure of that message: it is processed
/// again (a replay), then dead-lettered; the messages behind it go on.
///
/// Before: the hook's panic killed the partition task like a handler's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_hook_is_a_failure_of_its_message_not_of_the_partition() {
    let Some(brokers) = brokers() else { return };
    let (topic, group) = (unique("orders"), unique("group"));
    let dead = format!("{topic}.dead");
    create_topic(&brokers, &topic, 1).await;
    create_topic(&brokers, &dead, 1).await;
    let p = producer(&brokers);
    for (key, payload) in [("order-1", "x"), ("order-2", "y")] {
        produce(&p, &topic, 0, key, payload).await;
    }
    let runs: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let settled: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let processor = {
        let runs = runs.clone();
        Processor::new(
            Coordinator::new(MemoryStore::new()),
            op(),
            |m: &OwnedMessage| Key::new(body(m)),
            move |m: OwnedMessage, _| {
                *runs.lock().unwrap().entry(body(&m)).or_default() += 1;
                async move { Ok::<_, std::io::Error>(body(&m)) }
            },
        )
        .retry(
            RetryPolicy::new()
                .max_deliveries(2)
                .backoff(Duration::from_millis(20), Duration::from_millis(50)),
        )
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let seen = settled.clone();
    let runner = KafkaRunner::new(
        consumer_config(&brokers, &group),
        [topic.clone()],
        processor,
    )
    .dead_letter_topic(&dead)
    .on_settled(move |s| {
        let dead = matches!(s.processed.settlement, Settlement::DeadLetter { .. });
        seen.lock().unwrap().push((body(s.message), dead));
        if body(s.message) == "x" && !dead {
            panic!("the metrics exporter blew up");
        }
    });
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    let done = eventually(Duration::from_secs(60), || async {
        settled.lock().unwrap().iter().any(|(b, _)| b == "y")
    })
    .await;
    let parked = eventually(Duration::from_secs(30), || async {
        committed(&brokers, &group, &topic) == Some(2)
    })
    .await;
    stop.notify_one();
    task.await.unwrap().unwrap();
    let settled = settled.lock().unwrap().clone();
    assert!(done && parked, "settled {settled:?}");
    assert_eq!(
        settled,
        [
            ("x".to_string(), false),
            ("x".to_string(), false),
            ("x".to_string(), true),
            ("y".to_string(), false)
        ]
    );
    assert_eq!(
        runs.lock().unwrap()["x"],
        1,
        "the retry replayed, it did not run again"
    );
    assert_eq!(read_topic(&brokers, &dead, 1).await.len(), 1);
}

/// Item 7: a message whose key a dead worker holds (a reservation with a 10-minute lease)
/// goes on as soon as an operator releases the reservation.
///
/// Before: once its wait timed out, the runner slept for the dead owner's whole remaining
/// lease (`Settlement::Retry { after: ~600 s }`) and ignored the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_waiting_on_a_dead_owner_goes_on_when_the_owner_is_released() {
    let Some(brokers) = brokers() else { return };
    let (topic, group) = (unique("orders"), unique("group"));
    create_topic(&brokers, &topic, 1).await;
    let store = MemoryStore::new();
    let key = StorageKey::new(&op(), None, &Key::new("order-7").unwrap());
    let dead = idemkit_test::reserve(&store, &key, Duration::from_secs(600)).await;
    let handled: Handled = Arc::default();
    let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let processor = {
        let (handled, seen) = (handled.clone(), seen.clone());
        Processor::new(
            Coordinator::builder(store.clone())
                .policy(Policy::default().wait_timeout(Duration::from_millis(300)))
                .build(),
            op(),
            move |m: &OwnedMessage| {
                seen.store(true, std::sync::atomic::Ordering::SeqCst);
                Key::new(body(m))
            },
            move |m: OwnedMessage, _| {
                handled.lock().unwrap().push(body(&m));
                async move { Ok::<_, std::io::Error>(body(&m)) }
            },
        )
    };
    let p = producer(&brokers);
    produce(&p, &topic, 0, "k", "order-7").await;
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let runner = KafkaRunner::new(
        consumer_config(&brokers, &group),
        [topic.clone()],
        processor,
    );
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    // The message arrives and waits on the dead owner past its wait timeout.
    let arrived = eventually(Duration::from_secs(60), || async {
        seen.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    assert!(arrived, "the message never arrived");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        handled.lock().unwrap().is_empty(),
        "ran beside a live reservation"
    );
    store.release(&key, &dead).await.unwrap(); // what `idemkit release` does
    let went_on = eventually(Duration::from_secs(20), || async {
        handled.lock().unwrap().len() == 1
    })
    .await;
    stop.notify_one();
    task.await.unwrap().unwrap();
    assert!(went_on, "the message did not go on after the release");
}

/// Item 10: one partition's handler is stuck with its queue full; the other partition goes
/// on, and the runner keeps polling (it sees the assignment hook fire, and is not evicted).
///
/// Before: the full queue blocked the receive loop's `send`, so no partition received
/// anything until the stuck one moved (p1 handled nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stuck_partition_does_not_stop_the_others() {
    let Some(brokers) = brokers() else { return };
    let (topic, group) = (unique("orders"), unique("group"));
    create_topic(&brokers, &topic, 2).await;
    let p = producer(&brokers);
    for i in 0..8 {
        produce(&p, &topic, 0, &format!("p0-{i}"), &format!("p0-{i}")).await;
    }
    let release = Arc::new(tokio::sync::Notify::new());
    let stuck = Arc::new(tokio::sync::Notify::new());
    let handled: Handled = Arc::default();
    let processor = {
        let (handled, release, stuck) = (handled.clone(), release.clone(), stuck.clone());
        Processor::new(
            Coordinator::new(MemoryStore::new()),
            op(),
            |m: &OwnedMessage| Key::new(body(m)),
            move |m: OwnedMessage, _| {
                let (handled, release, stuck) = (handled.clone(), release.clone(), stuck.clone());
                async move {
                    if body(&m) == "p0-0" {
                        stuck.notify_one();
                        release.notified().await;
                    }
                    handled.lock().unwrap().push(body(&m));
                    Ok::<_, std::io::Error>(body(&m))
                }
            },
        )
    };
    let assigned: Arc<Mutex<Vec<RebalanceEvent>>> = Arc::default();
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let seen = assigned.clone();
    let runner = KafkaRunner::new(
        consumer_config(&brokers, &group),
        [topic.clone()],
        processor,
    )
    .queue_depth(1)
    .batch(1)
    .on_rebalance(move |e| seen.lock().unwrap().push(e.clone()));
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    // p0 is stuck on its first message; once its queue is full (a second to receive the
    // rest), p1 gets messages.
    tokio::time::timeout(Duration::from_secs(60), stuck.notified())
        .await
        .expect("p0's first message started");
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..4 {
        produce(&p, &topic, 1, &format!("p1-{i}"), &format!("p1-{i}")).await;
    }
    let other = eventually(Duration::from_secs(30), || async {
        handled
            .lock()
            .unwrap()
            .iter()
            .filter(|b| b.starts_with("p1"))
            .count()
            == 4
    })
    .await;
    release.notify_one();
    let rest = eventually(Duration::from_secs(30), || async {
        handled.lock().unwrap().len() == 12
    })
    .await;
    stop.notify_one();
    task.await.unwrap().unwrap();
    let handled = handled.lock().unwrap().clone();
    assert!(other, "p1 went nowhere while p0 was stuck: {handled:?}");
    assert!(rest, "p0's messages were lost after its pause: {handled:?}");
    let p0: Vec<&String> = handled.iter().filter(|b| b.starts_with("p0")).collect();
    assert_eq!(
        p0,
        (0..8)
            .map(|i| format!("p0-{i}"))
            .collect::<Vec<_>>()
            .iter()
            .collect::<Vec<_>>(),
        "p0 in order, each once"
    );
    assert!(
        assigned
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, RebalanceEvent::Assigned(ps) if ps.len() == 2)),
        "{:?}",
        assigned.lock().unwrap()
    );
}

/// Item 10: each message's offset is stored as soon as it settles, not when its batch is
/// done: with the batch's last message stuck, the messages before it are committed.
///
/// Before: offsets were stored only after the whole batch; a kill or a rebalance sent the
/// finished rest of the batch to the next owner (the committed offset stayed at 0 here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn offsets_are_stored_as_messages_settle_not_per_batch() {
    let Some(brokers) = brokers() else { return };
    let (topic, group) = (unique("orders"), unique("group"));
    create_topic(&brokers, &topic, 1).await;
    let p = producer(&brokers);
    for i in 0..10 {
        produce(&p, &topic, 0, &format!("m{i}"), &format!("m{i}")).await;
    }
    let release = Arc::new(tokio::sync::Notify::new());
    let handled: Handled = Arc::default();
    let processor = {
        let (handled, release) = (handled.clone(), release.clone());
        Processor::new(
            Coordinator::new(MemoryStore::new()),
            op(),
            |m: &OwnedMessage| Key::new(body(m)),
            move |m: OwnedMessage, _| {
                let (handled, release) = (handled.clone(), release.clone());
                async move {
                    // The first message holds until the rest has arrived (one batch).
                    if body(&m) == "m0" {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                    if body(&m) == "m9" {
                        release.notified().await;
                    }
                    handled.lock().unwrap().push(body(&m));
                    Ok::<_, std::io::Error>(body(&m))
                }
            },
        )
        .in_flight(InFlight::Wait)
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let runner = KafkaRunner::new(
        consumer_config(&brokers, &group),
        [topic.clone()],
        processor,
    );
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    let nine = eventually(Duration::from_secs(60), || async {
        handled.lock().unwrap().len() == 9
    })
    .await;
    let stored = eventually(Duration::from_secs(20), || async {
        committed(&brokers, &group, &topic) == Some(9)
    })
    .await;
    let seen = committed(&brokers, &group, &topic);
    release.notify_one();
    stop.notify_one();
    task.await.unwrap().unwrap();
    assert!(nine, "{:?}", handled.lock().unwrap());
    assert!(
        stored,
        "with m9 still running, the group's committed offset is {seen:?}, not 9"
    );
}

/// Issue 26: a partition's next message starts while the previous one's result is on its
/// way to the store, and offsets are still stored in order, each once its message has
/// settled. The store holds every completion until told: `flaky`'s handler runs while
/// `m0`'s result is held; `flaky` fails, so `m2` does not start (a failing message is retried
/// before any later one: effects stay in offset order); nothing is settled or committed.
/// Opened, `m0` settles, `flaky` is retried and settles, then `m2`: in order, and the
/// committed offset reaches 3.
///
/// Before (each message settled before the next started): only `m0`'s handler ran while its
/// completion was held (`handled = ["m0"]`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_next_message_runs_while_the_previous_result_is_stored() {
    use idemkit_test::Probe;
    let Some(brokers) = brokers() else { return };
    let (topic, group) = (unique("orders"), unique("group"));
    create_topic(&brokers, &topic, 1).await;
    let p = producer(&brokers);
    for m in ["m0", "flaky", "m2"] {
        produce(&p, &topic, 0, m, m).await;
    }
    let store = Probe::new(MemoryStore::new());
    store.hold_complete();
    let handled: Handled = Arc::default();
    let settled: Handled = Arc::default();
    let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let processor = {
        let (handled, failed_once) = (handled.clone(), failed_once.clone());
        Processor::new(
            Coordinator::new(store.clone()),
            op(),
            |m: &OwnedMessage| Key::new(body(m)),
            move |m: OwnedMessage, _| {
                let (handled, failed_once) = (handled.clone(), failed_once.clone());
                async move {
                    let name = body(&m);
                    if name == "flaky"
                        && !failed_once.swap(true, std::sync::atomic::Ordering::SeqCst)
                    {
                        handled.lock().unwrap().push("flaky failed".into());
                        return Err(std::io::Error::other("a first try fails"));
                    }
                    handled.lock().unwrap().push(name.clone());
                    Ok::<_, std::io::Error>(name)
                }
            },
        )
        .retry(
            RetryPolicy::new()
                .max_deliveries(3)
                .backoff(Duration::from_millis(10), Duration::from_millis(10)),
        )
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let on_settled = settled.clone();
    let runner = KafkaRunner::new(
        consumer_config(&brokers, &group),
        [topic.clone()],
        processor,
    )
    .on_settled(move |done| on_settled.lock().unwrap().push(body(done.message)));
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    let two_ran = eventually(Duration::from_secs(60), || async {
        handled.lock().unwrap().len() == 2
    })
    .await;
    // Time for `m2` to start, which it must not.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ran_held = handled.lock().unwrap().clone();
    let settled_held = settled.lock().unwrap().clone();
    let committed_held = committed(&brokers, &group, &topic);
    store.open_complete();
    let all_settled = eventually(Duration::from_secs(30), || async {
        settled.lock().unwrap().len() == 3
    })
    .await;
    let stored = eventually(Duration::from_secs(20), || async {
        committed(&brokers, &group, &topic) == Some(3)
    })
    .await;
    stop.notify_one();
    task.await.unwrap().unwrap();
    assert!(
        two_ran,
        "with completions held, the handlers that ran: {ran_held:?}"
    );
    assert_eq!(ran_held, ["m0", "flaky failed"]);
    assert_eq!(
        *handled.lock().unwrap(),
        ["m0", "flaky failed", "flaky", "m2"]
    );
    assert!(
        settled_held.is_empty(),
        "settled while held: {settled_held:?}"
    );
    assert!(
        committed_held.is_none_or(|o| o <= 0),
        "committed while nothing was stored: {committed_held:?}"
    );
    assert!(all_settled, "{:?}", settled.lock().unwrap());
    assert_eq!(*settled.lock().unwrap(), ["m0", "flaky", "m2"]);
    assert!(
        stored,
        "committed: {:?}",
        committed(&brokers, &group, &topic)
    );
}
