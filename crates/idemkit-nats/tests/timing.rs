//! Issue 20 on a real nats-server: retries in process (a store outage and a duplicate in
//! flight never use up the broker's delivery count), panics, prefetch bounded by what can
//! start before `ack_wait`, and a dead owner released by an operator. Each failed before
//! its fix; the comment on each says how.
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, Message, consumer::PullConsumer, consumer::pull, stream};
use idemkit_core::{Coordinator, Key, MemoryStore, Operation, Policy, StorageKey, Store};
use idemkit_nats::JetStreamRunner;
use idemkit_runner::{Processor, RetryPolicy, Settlement};
use idemkit_test::{Fault, Probe};
use support::*;

fn body(m: &Message) -> String {
    String::from_utf8_lossy(&m.payload).into_owned()
}

fn op() -> Operation {
    Operation::new("mail.invoice").unwrap()
}

/// A stream with one subject and a durable pull consumer on it.
async fn consumer(
    url: &str,
    ack_wait: Duration,
    max_deliver: i64,
) -> (jetstream::Context, String, PullConsumer) {
    let js = jetstream::new(async_nats::connect(url).await.expect("nats"));
    let (name, subject, durable) = (unique("S"), unique("orders"), unique("workers"));
    let s = js
        .create_stream(stream::Config {
            name,
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await
        .expect("stream");
    let c = s
        .create_consumer(pull::Config {
            durable_name: Some(durable),
            ack_wait,
            max_deliver,
            ..Default::default()
        })
        .await
        .expect("consumer");
    (js, subject, c)
}

async fn publish(js: &jetstream::Context, subject: &str, body: &str) {
    js.publish(subject.to_owned(), body.to_owned().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// (delivered, settlement, body) of each settled delivery.
type Log = Arc<Mutex<Vec<(u32, Settlement, String)>>>;

/// `runner`, with every settled delivery appended to `log`.
fn logged<S, K, H>(runner: JetStreamRunner<S, K, H>, log: &Log) -> JetStreamRunner<S, K, H>
where
    S: idemkit_core::Store,
    K: Fn(&Message) -> Result<Key, idemkit_core::KeyError> + Send + Sync + 'static,
    H: idemkit_runner::Handle<Message> + 'static,
{
    let log = log.clone();
    runner.on_settled(move |s| {
        log.lock()
            .unwrap()
            .push((s.delivered, s.processed.settlement.clone(), body(s.message)));
    })
}

/// Item 9: the store is down for 1.5 s, then the handler fails once, then succeeds; the
/// consumer's `max_deliver` is 3 and the retry budget 2 deliveries.
///
/// Before: every outage retry was a `nak`, so the broker's delivery count passed the budget
/// during the outage and the handler's first failure dead-lettered the message (with a long
/// enough outage JetStream stopped delivering it at all: `max_deliver`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_outage_does_not_use_up_the_retry_budget() {
    let Some(url) = server() else { return };
    let (js, subject, consumer) = consumer(&url, Duration::from_secs(5), 3).await;
    let store = Probe::new(MemoryStore::new());
    store.fail(Fault::Begin, true);
    let failed_once = Arc::new(Mutex::new(false));
    let processor = {
        let failed_once = failed_once.clone();
        Processor::new(
            Coordinator::new(store.clone()),
            op(),
            |m: &Message| Key::new(body(m)),
            move |m: Message, _| {
                let failed_once = failed_once.clone();
                async move {
                    let mut failed = failed_once.lock().unwrap();
                    if !*failed {
                        *failed = true;
                        return Err("the mail server said 451".to_string());
                    }
                    Ok(body(&m))
                }
            },
        )
        .retry(
            RetryPolicy::new()
                .max_deliveries(2)
                .backoff(Duration::from_millis(100), Duration::from_millis(200)),
        )
    };
    let log: Log = Arc::default();
    let runner = logged(JetStreamRunner::new(consumer, processor), &log);
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    publish(&js, &subject, "order-1").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    store.fail(Fault::Begin, false);
    let settled = eventually(Duration::from_secs(20), || async {
        log.lock().unwrap().iter().any(|e| e.1.is_final())
    })
    .await;
    stop.notify_waiters();
    task.await.unwrap().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(settled, "{log:?}");
    assert_eq!(
        log,
        [(1, Settlement::Ack, "order-1".to_string())],
        "one delivery, retried in process and acked"
    );
}

/// Item 2's audit, for this runner: a handler that panics is a failing handler: retried,
/// then dead-lettered (`term`).
///
/// Before: the panic killed the message's task; the message was neither acked nor termed,
/// and came back after every `ack_wait`, forever (or until `max_deliver`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_handler_is_retried_then_dead_lettered() {
    let Some(url) = server() else { return };
    let (js, subject, consumer) = consumer(&url, Duration::from_secs(1), 50).await;
    let tries = Arc::new(Mutex::new(0u32));
    let processor = {
        let tries = tries.clone();
        Processor::new(
            Coordinator::new(MemoryStore::new()),
            op(),
            |m: &Message| Key::new(body(m)),
            move |m: Message, _| {
                let tries = tries.clone();
                async move {
                    *tries.lock().unwrap() += 1;
                    if body(&m) == "poison" {
                        panic!("the template cannot render this order");
                    }
                    Ok::<_, String>(body(&m))
                }
            },
        )
        .retry(
            RetryPolicy::new()
                .max_deliveries(3)
                .backoff(Duration::from_millis(20), Duration::from_millis(50)),
        )
    };
    let log: Log = Arc::default();
    let runner = logged(JetStreamRunner::new(consumer, processor), &log);
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    publish(&js, &subject, "poison").await;
    let parked = eventually(Duration::from_secs(20), || async {
        log.lock().unwrap().iter().any(|e| e.1.is_final())
    })
    .await;
    // Long enough for a redelivery after ack_wait, had the message not been termed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.notify_waiters();
    task.await.unwrap().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(parked, "{log:?}");
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        matches!(&log[0].1, Settlement::DeadLetter { reason } if reason.contains("panicked")),
        "{log:?}"
    );
    assert_eq!(*tries.lock().unwrap(), 3);
}

/// Item 9: the runner asks for no more messages than can start before `ack_wait` runs out.
/// 12 messages, 2 slots, handlers of 1 s, `ack_wait` 2 s (with in-progress acks, which only
/// run once a message has started).
///
/// Before: the client pulled 200 messages per request; those waiting for a slot passed
/// their `ack_wait` in the buffer and the broker delivered them again (delivered = 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buffered_messages_never_outlive_their_ack_wait() {
    let Some(url) = server() else { return };
    let (js, subject, consumer) = consumer(&url, Duration::from_secs(2), 50).await;
    for i in 0..12 {
        publish(&js, &subject, &format!("order-{i}")).await;
    }
    let processor = Processor::new(
        Coordinator::new(MemoryStore::new()),
        op(),
        |m: &Message| Key::new(body(m)),
        move |m: Message, _| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, String>(body(&m))
        },
    );
    let log: Log = Arc::default();
    let runner = logged(
        JetStreamRunner::new(consumer, processor).concurrency(2),
        &log,
    );
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    let all = eventually(Duration::from_secs(40), || async {
        log.lock().unwrap().len() >= 12
    })
    .await;
    stop.notify_waiters();
    task.await.unwrap().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(all, "{log:?}");
    let redelivered: Vec<_> = log.iter().filter(|e| e.0 > 1).collect();
    assert!(
        redelivered.is_empty(),
        "messages waited past their ack_wait in the client's buffer: {redelivered:?}"
    );
}

/// Item 7: a message whose key a dead worker holds (a 10-minute lease) goes on as soon as
/// an operator releases the reservation.
///
/// Before: the duplicate in flight was nak'ed with the owner's whole remaining lease as the
/// delay (~600 s); the release changed nothing for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_waiting_on_a_dead_owner_goes_on_when_the_owner_is_released() {
    let Some(url) = server() else { return };
    let (js, subject, consumer) = consumer(&url, Duration::from_secs(2), 50).await;
    let store = MemoryStore::new();
    let key = StorageKey::new(&op(), None, &Key::new("order-7").unwrap());
    let dead = idemkit_test::reserve(&store, &key, Duration::from_secs(600)).await;
    let handled = Arc::new(Mutex::new(0u32));
    let processor = {
        let handled = handled.clone();
        Processor::new(
            Coordinator::builder(store.clone())
                .policy(Policy::default().wait_timeout(Duration::from_millis(300)))
                .build(),
            op(),
            |m: &Message| Key::new(body(m)),
            move |m: Message, _| {
                *handled.lock().unwrap() += 1;
                async move { Ok::<_, String>(body(&m)) }
            },
        )
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let task = tokio::spawn(
        JetStreamRunner::new(consumer, processor).run(async move { s.notified().await }),
    );
    publish(&js, &subject, "order-7").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(*handled.lock().unwrap(), 0, "ran beside a live reservation");
    store.release(&key, &dead).await.unwrap(); // what `idemkit release` does
    let went_on = eventually(Duration::from_secs(20), || async {
        *handled.lock().unwrap() == 1
    })
    .await;
    stop.notify_waiters();
    task.await.unwrap().unwrap();
    assert!(went_on, "the message did not go on after the release");
}

/// Issue 26: a handler that returned a value gives its place to the next message while its
/// result goes to the store: with one handler at a time and every completion held by the
/// store, all three handlers run, none is acked; opened, all three settle.
///
/// Before (a place was held until the ack): only the first handler ran while its completion
/// was held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_next_handler_runs_while_a_result_is_stored() {
    let Some(url) = server() else { return };
    let (js, subject, consumer) = consumer(&url, Duration::from_secs(30), 5).await;
    for m in ["a", "b", "c"] {
        publish(&js, &subject, m).await;
    }
    let store = Probe::new(MemoryStore::new());
    store.hold_complete();
    let handled = Arc::new(Mutex::new(Vec::new()));
    let processor = {
        let handled = handled.clone();
        Processor::new(
            Coordinator::new(store.clone()),
            op(),
            |m: &Message| Key::new(body(m)),
            move |m: Message, _| {
                let handled = handled.clone();
                async move {
                    handled.lock().unwrap().push(body(&m));
                    Ok::<_, std::io::Error>(body(&m))
                }
            },
        )
    };
    let log: Log = Arc::default();
    let runner = logged(
        JetStreamRunner::new(consumer, processor).concurrency(1),
        &log,
    );
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    let all_ran = idemkit_test::eventually(Duration::from_secs(30), || async {
        handled.lock().unwrap().len() == 3
    })
    .await;
    let ran_held = handled.lock().unwrap().clone();
    let settled_held = log.lock().unwrap().len();
    store.open_complete();
    let all_settled = idemkit_test::eventually(Duration::from_secs(30), || async {
        log.lock().unwrap().len() == 3
    })
    .await;
    stop.notify_one();
    task.await.unwrap().unwrap();
    assert!(
        all_ran,
        "with completions held, the handlers that ran: {ran_held:?}"
    );
    assert_eq!(settled_held, 0, "settled while every completion was held");
    assert!(all_settled, "{:?}", log.lock().unwrap());
}

/// Review L5: `concurrency` counts running handlers, their retries in process included. 8
/// messages whose handlers fail (each takes 100 ms) are retried in place, with 2 slots: at
/// no time do more than 2 handlers run.
///
/// Before: a handler's slot was given back at its first failure, and its retries ran beside
/// the handlers of the messages that took the slot: up to 4 per slot (8 here) at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retries_in_process_run_within_the_concurrency() {
    let Some(url) = server() else { return };
    let (js, subject, consumer) = consumer(&url, Duration::from_secs(30), 50).await;
    for i in 0..8 {
        publish(&js, &subject, &format!("order-{i}")).await;
    }
    let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let processor = {
        let (running, most) = (running.clone(), most.clone());
        Processor::new(
            Coordinator::new(MemoryStore::new()),
            op(),
            |m: &Message| Key::new(body(m)),
            move |_m: Message, _| {
                let (running, most) = (running.clone(), most.clone());
                async move {
                    use std::sync::atomic::Ordering::SeqCst;
                    let now = running.fetch_add(1, SeqCst) + 1;
                    most.fetch_max(now, SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    running.fetch_sub(1, SeqCst);
                    Err::<String, _>("the mail server said 451".to_string())
                }
            },
        )
        .retry(
            RetryPolicy::new()
                .max_deliveries(3)
                .backoff(Duration::from_millis(10), Duration::from_millis(20)),
        )
    };
    let log: Log = Arc::default();
    let runner = logged(
        JetStreamRunner::new(consumer, processor).concurrency(2),
        &log,
    );
    let stop = Arc::new(tokio::sync::Notify::new());
    let s = stop.clone();
    let task = tokio::spawn(runner.run(async move { s.notified().await }));
    let all = eventually(Duration::from_secs(40), || async {
        log.lock()
            .unwrap()
            .iter()
            .filter(|e| e.1.is_final())
            .count()
            == 8
    })
    .await;
    stop.notify_waiters();
    task.await.unwrap().unwrap();
    assert!(all, "{:?}", log.lock().unwrap());
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most <= 2, "{most} handlers ran at once with 2 slots");
}
