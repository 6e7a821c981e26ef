//! The RabbitMQ runner on the machine's RabbitMQ (3.10) with the key on real Redis.
//!
//! Where a scenario can repeat an effect, it runs with idempotency and with it switched off
//! (`Processor::protected(false)`), and both counts are asserted, so each test shows what it
//! would report if the protection were missing.
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, KeyError, Operation, Policy};
use idemkit_rabbitmq::{Message, RabbitRunner, RunnerError};
use idemkit_redis::RedisStore;
use idemkit_runner::{Handle, Processor, RetryPolicy, Settlement};
use idemkit_test::faults::{FaultPoint, stop_at_tokio, stopped};
use support::*;

/// What the runners saw: (worker, delivery, settlement, receipt value).
type Log = Arc<Mutex<Vec<(u32, u32, Settlement, Option<String>)>>>;

struct Setup {
    prefix: String,
    mails: String,
}

impl Setup {
    fn new() -> Setup {
        let prefix = unique("prefix");
        Setup {
            mails: format!("{prefix}:mails"),
            prefix,
        }
    }

    /// A processor whose handler mails (appends the order to the Redis list), then takes
    /// `slow`; `fail` decides, from the try's number (1-based), whether it then fails
    /// (`Some(false)`), panics (`Some(true)`) or returns (`None`).
    async fn processor(
        &self,
        id: u32,
        protected: bool,
        slow: Duration,
        fail: fn(u32) -> Option<bool>,
        tries: Arc<AtomicU32>,
    ) -> Processor<
        RedisStore,
        impl Fn(&Message) -> Result<Key, KeyError> + Send + Sync + 'static,
        impl Handle<Message, Output = String> + 'static,
    > {
        let store = RedisStore::builder()
            .prefix(&self.prefix)
            .connect(&redis_url())
            .await
            .unwrap();
        let coordinator = Coordinator::builder(store)
            .policy(Policy::new().lease(Duration::from_secs(2)))
            .build();
        let mails = self.mails.clone();
        Processor::builder(coordinator, Operation::new("mail.invoice").unwrap())
            .key(|m: &Message| Key::compose([m.text().unwrap_or(""), "invoice"]))
            .handler(move |m: Message, _| {
                let (mails, tries) = (mails.clone(), tries.clone());
                async move {
                    let order = m.text().unwrap_or("").to_string();
                    let n = tries.fetch_add(1, Ordering::SeqCst) + 1;
                    match fail(n) {
                        Some(true) => panic!("the handler panicked on try {n}"),
                        Some(false) => {
                            return Err(redis::RedisError::from((
                                redis::ErrorKind::Io,
                                "the mail API is down",
                            )));
                        }
                        None => {}
                    }
                    let mut r = redis().await;
                    redis::cmd("RPUSH")
                        .arg(&mails)
                        .arg(&order)
                        .query_async::<()>(&mut r)
                        .await?;
                    tokio::time::sleep(slow).await;
                    Ok::<_, redis::RedisError>(format!("em_{order}_w{id}"))
                }
            })
            .protected(protected)
            .retry(
                RetryPolicy::new()
                    .max_deliveries(3)
                    .backoff(Duration::from_millis(10), Duration::from_millis(50)),
            )
    }
}

fn never(_: u32) -> Option<bool> {
    None
}

/// A runner that logs every settlement as `id`.
fn logged<S, K, H>(
    uri: &str,
    queue: &str,
    processor: Processor<S, K, H>,
    id: u32,
    log: &Log,
) -> RabbitRunner<S, K, H>
where
    S: idemkit_core::Store + Send + Sync + 'static,
    K: Fn(&Message) -> Result<Key, KeyError> + Send + Sync + 'static,
    H: Handle<Message, Output = String> + 'static,
{
    let log = log.clone();
    RabbitRunner::new(uri, queue, processor)
        .concurrency(4)
        .on_settled(move |x| {
            log.lock().unwrap().push((
                id,
                x.delivered,
                x.processed.settlement.clone(),
                x.processed.receipt.as_ref().map(|r| r.value.clone()),
            ));
        })
}

/// Runs `runner` until the returned sender is fired.
fn spawn<F>(run: impl FnOnce(tokio::sync::oneshot::Receiver<()>) -> F) -> Stop
where
    F: std::future::Future<Output = Result<(), RunnerError>> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    Stop {
        tx,
        task: tokio::spawn(run(rx)),
    }
}

struct Stop {
    tx: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), RunnerError>>,
}

impl Stop {
    async fn stop(self) {
        let _ = self.tx.send(());
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the runner stopped")
            .unwrap()
            .unwrap();
    }
}

async fn until(rx: tokio::sync::oneshot::Receiver<()>) {
    let _ = rx.await;
}

/// A worker process (the `rabbitmq_worker` example) stopped at `point`; a second one,
/// started after it, consumes until it settled one message. The mails.
async fn killed_worker(uri: &str, point: FaultPoint, protected: bool) -> BTreeMap<String, u32> {
    let (s, q) = (Setup::new(), unique("orders"));
    let ch = channel(uri).await;
    queue(&ch, &q, false, None).await;
    publish(&ch, &q, "order-3").await;
    let worker = || {
        let mut c = tokio::process::Command::new(idemkit_test::example_binary("rabbitmq_worker"));
        c.args(["--uri", uri, "--queue", &q, "--redis", &redis_url()])
            .args([
                "--prefix",
                &s.prefix,
                "--mails",
                &s.mails,
                "--lease-ms",
                "2000",
            ])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        if !protected {
            c.arg("--unprotected");
        }
        c
    };
    let mut first = worker();
    stop_at_tokio(&mut first, point);
    let first = tokio::time::timeout(Duration::from_secs(60), first.status())
        .await
        .expect("the first worker got the message")
        .unwrap();
    assert!(stopped(&first), "{point}: stopped where told: {first}");
    let mut second = worker();
    second.args(["--exit-after", "1"]);
    let second = tokio::time::timeout(Duration::from_secs(60), second.status())
        .await
        .expect("the message was redelivered to the second worker")
        .unwrap();
    assert!(second.success());
    assert_eq!(ready(&ch, &q).await, 0, "the second worker acked it");
    effects(&s.mails).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_between_the_effect_and_the_ack_does_not_repeat_it() {
    let Some(uri) = server() else { return };
    let (with, without) = tokio::join!(
        killed_worker(&uri, FaultPoint::BeforeAck, true),
        killed_worker(&uri, FaultPoint::BeforeAck, false)
    );
    eprintln!("mails with idemkit {with:?}, without {without:?}");
    assert_eq!(with["order-3"], 1, "with idemkit: the redelivery replays");
    assert_eq!(without["order-3"], 2, "without: the redelivery mails again");
}

/// The first worker (through a relay) runs a slow handler; once its mail is out, its
/// connection is cut and the broker requeues the message while the handler still runs. The
/// redelivery goes to a second worker (`racer`) or, after it reconnects, to the first.
async fn cut_while_running(
    uri: &str,
    racer: bool,
    protected: bool,
) -> (
    BTreeMap<String, u32>,
    Vec<(u32, u32, Settlement, Option<String>)>,
) {
    let (s, q, log) = (Setup::new(), unique("orders"), Log::default());
    let ch = channel(uri).await;
    queue(&ch, &q, false, None).await;
    let relay = Relay::start(uri).await;
    let slow = Duration::from_millis(2500);
    let p1 = s.processor(1, protected, slow, never, Arc::default()).await;
    let w1 = logged(&relay.uri, &q, p1, 1, &log);
    let first = spawn(|rx| w1.run(until(rx)));
    publish(&ch, &q, "order-1").await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            effects(&s.mails).await.contains_key("order-1")
        })
        .await,
        "the first worker mailed"
    );
    let second = if racer {
        let p2 = s.processor(2, protected, slow, never, Arc::default()).await;
        let w2 = logged(uri, &q, p2, 2, &log);
        Some(spawn(|rx| w2.run(until(rx))))
    } else {
        None
    };
    relay.cut();
    let redelivered = eventually(Duration::from_secs(30), || async {
        log.lock().unwrap().iter().any(|e| e.1 == 2)
    })
    .await;
    // A little longer, for a late duplicate.
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.stop().await;
    if let Some(second) = second {
        second.stop().await;
    }
    assert!(
        redelivered,
        "the broker redelivered: {:?}",
        log.lock().unwrap()
    );
    assert_eq!(ready(&ch, &q).await, 0, "acked in the end");
    let log = log.lock().unwrap().clone();
    (effects(&s.mails).await, log)
}

fn one_effect_same_receipt(
    mails: &BTreeMap<String, u32>,
    log: &[(u32, u32, Settlement, Option<String>)],
) {
    assert_eq!(mails["order-1"], 1, "one mail: {log:?}");
    assert!(
        log.iter().all(|e| e.2 == Settlement::Ack),
        "every delivery acks: {log:?}"
    );
    let receipts: std::collections::BTreeSet<_> = log.iter().map(|e| e.3.clone()).collect();
    assert_eq!(receipts.len(), 1, "with the same receipt: {log:?}");
    assert_eq!(
        receipts.into_iter().next().flatten().as_deref(),
        Some("em_order-1_w1"),
        "the first worker's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumers_racing_a_redelivered_message_make_one_effect() {
    let Some(uri) = server() else { return };
    let ((mails, log), without) = tokio::join!(
        cut_while_running(&uri, true, true),
        cut_while_running(&uri, true, false)
    );
    eprintln!("with idemkit: {mails:?} {log:?}; without: {without:?}");
    one_effect_same_receipt(&mails, &log);
    assert!(
        log.iter().any(|e| e.0 == 2 && e.1 == 2),
        "the second worker took the redelivery: {log:?}"
    );
    assert_eq!(
        without.0["order-1"], 2,
        "without: the redelivery mails again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_connection_is_reopened_and_the_requeued_message_replays() {
    let Some(uri) = server() else { return };
    let ((mails, log), without) = tokio::join!(
        cut_while_running(&uri, false, true),
        cut_while_running(&uri, false, false)
    );
    eprintln!("with idemkit: {mails:?} {log:?}; without: {without:?}");
    one_effect_same_receipt(&mails, &log);
    assert!(log.len() >= 2, "settled before and after the cut: {log:?}");
    assert_eq!(
        without.0["order-1"], 2,
        "without: the redelivery mails again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panicking_handler_is_retried_in_place_then_dead_lettered_with_a_confirm() {
    let Some(uri) = server() else { return };
    let (s, q, log) = (Setup::new(), unique("orders"), Log::default());
    let (dlx, dlq) = (unique("dlx"), unique("dead"));
    let ch = channel(&uri).await;
    queue(&ch, &q, false, None).await;
    dead_letters(&ch, &dlx, Some(&dlq)).await;
    let tries = Arc::new(AtomicU32::new(0));
    let p = s
        .processor(1, true, Duration::ZERO, |_| Some(true), tries.clone())
        .await;
    let runner = logged(&uri, &q, p, 1, &log).dead_letter_exchange(&dlx, None);
    let stop = spawn(|rx| runner.run(until(rx)));
    publish(&ch, &q, "order-4").await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            !log.lock().unwrap().is_empty()
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.stop().await;
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 1, "settled once: {log:?}");
    assert!(
        matches!(&log[0].2, Settlement::DeadLetter { reason } if reason.contains("panicked")),
        "{log:?}"
    );
    assert_eq!(
        tries.load(Ordering::SeqCst),
        3,
        "max_deliveries tries, in place"
    );
    let dead = drain(&ch, &dlq).await;
    assert_eq!(dead.len(), 1, "one dead letter");
    assert_eq!(dead[0].0, "order-4");
    let reason = text(&dead[0].1, "idemkit-error").unwrap();
    assert!(reason.contains("the handler panicked on try 3"), "{reason}");
    assert_eq!(
        text(&dead[0].1, "idemkit-queue").as_deref(),
        Some(q.as_str())
    );
    assert_eq!(ready(&ch, &q).await, 0, "the original was acked");
    assert!(effects(&s.mails).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_the_broker_cannot_route_is_not_lost() {
    let Some(uri) = server() else { return };
    let (s, q, log) = (Setup::new(), unique("orders"), Log::default());
    let (dlx, dlq) = (unique("dlx"), unique("dead"));
    let ch = channel(&uri).await;
    queue(&ch, &q, false, None).await;
    // The exchange, with no queue bound yet: a dead letter published to it is confirmed
    // but routed nowhere.
    dead_letters(&ch, &dlx, None).await;
    let tries = Arc::new(AtomicU32::new(0));
    let p = s
        .processor(1, true, Duration::ZERO, |_| Some(false), tries.clone())
        .await;
    let runner = logged(&uri, &q, p, 1, &log).dead_letter_exchange(&dlx, None);
    let stop = spawn(|rx| runner.run(until(rx)));
    publish(&ch, &q, "order-5").await;
    // The message comes back to the queue and is tried again: more than one delivery's
    // tries.
    assert!(
        eventually(Duration::from_secs(60), || async {
            tries.load(Ordering::SeqCst) > 3
        })
        .await,
        "the message was delivered again"
    );
    assert!(log.lock().unwrap().is_empty(), "not settled while unparked");
    dead_letters(&ch, &dlx, Some(&dlq)).await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            !log.lock().unwrap().is_empty()
        })
        .await,
        "parked once a queue is bound"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.stop().await;
    let dead = drain(&ch, &dlq).await;
    assert_eq!(dead.len(), 1, "one dead letter");
    assert_eq!(dead[0].0, "order-5");
    assert_eq!(ready(&ch, &q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retries_in_place_leave_a_quorum_queues_delivery_limit_alone() {
    let Some(uri) = server() else { return };
    let (s, q, log) = (Setup::new(), unique("orders"), Log::default());
    let ch = channel(&uri).await;
    // One delivery allowed beyond the first: a runner that requeued to retry would lose
    // the message on its third try.
    queue(&ch, &q, true, Some(1)).await;
    let tries = Arc::new(AtomicU32::new(0));
    let p = s
        .processor(
            1,
            true,
            Duration::ZERO,
            |n| (n < 3).then_some(false),
            tries.clone(),
        )
        .await;
    let runner = logged(&uri, &q, p, 1, &log);
    let stop = spawn(|rx| runner.run(until(rx)));
    publish(&ch, &q, "order-6").await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            !log.lock().unwrap().is_empty()
        })
        .await
    );
    stop.stop().await;
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].2, Settlement::Ack);
    assert_eq!(log[0].1, 1, "the broker delivered it once");
    assert_eq!(tries.load(Ordering::SeqCst), 3);
    assert_eq!(effects(&s.mails).await["order-6"], 1);
    assert_eq!(ready(&ch, &q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shutdown_finishes_the_running_handler_and_returns_the_rest_to_the_queue() {
    let Some(uri) = server() else { return };
    let (s, q, log) = (Setup::new(), unique("orders"), Log::default());
    let ch = channel(&uri).await;
    queue(&ch, &q, false, None).await;
    let p = s
        .processor(1, true, Duration::from_millis(1500), never, Arc::default())
        .await;
    let runner = logged(&uri, &q, p, 1, &log).concurrency(1).prefetch(5);
    for order in ["order-a", "order-b", "order-c"] {
        publish(&ch, &q, order).await;
    }
    let stop = spawn(|rx| runner.run(until(rx)));
    assert!(
        eventually(Duration::from_secs(30), || async {
            !effects(&s.mails).await.is_empty()
        })
        .await
    );
    // Shut down while the first handler runs, the other two prefetched.
    stop.stop().await;
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log.len(),
        1,
        "the running one finished and settled: {log:?}"
    );
    assert_eq!(log[0].2, Settlement::Ack);
    assert_eq!(effects(&s.mails).await.len(), 1);
    assert!(
        eventually(Duration::from_secs(10), || async {
            ready(&ch, &q).await == 2
        })
        .await,
        "the two not started are back in the queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_the_broker_cancels_consumes_again_once_its_queue_is_back() {
    let Some(uri) = server() else { return };
    let (s, q, log) = (Setup::new(), unique("orders"), Log::default());
    let ch = channel(&uri).await;
    queue(&ch, &q, false, None).await;
    let p = s
        .processor(1, true, Duration::ZERO, never, Arc::default())
        .await;
    let runner = logged(&uri, &q, p, 1, &log);
    let stop = spawn(|rx| runner.run(until(rx)));
    publish(&ch, &q, "order-x").await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            log.lock().unwrap().len() == 1
        })
        .await
    );
    // Deleting the queue cancels the consumer (basic.cancel from the broker).
    ch.queue_delete(q.as_str().into(), Default::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    queue(&ch, &q, false, None).await;
    publish(&ch, &q, "order-y").await;
    let again = eventually(Duration::from_secs(30), || async {
        log.lock().unwrap().len() == 2
    })
    .await;
    stop.stop().await;
    assert!(again, "consumed again: {:?}", log.lock().unwrap());
    assert_eq!(
        effects(&s.mails).await,
        BTreeMap::from([("order-x".into(), 1), ("order-y".into(), 1)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_queue_is_an_error_at_start() {
    let Some(uri) = server() else { return };
    let s = Setup::new();
    let p = s
        .processor(1, true, Duration::ZERO, never, Arc::default())
        .await;
    let runner = RabbitRunner::new(&uri, unique("missing"), p);
    let ran = tokio::time::timeout(Duration::from_secs(30), runner.run(std::future::pending()))
        .await
        .expect("it returns");
    assert!(
        matches!(&ran, Err(RunnerError::Connect(e)) if e.to_string().contains("NOT_FOUND")),
        "{ran:?}"
    );
}

/// Issue 51, item 3: the deliveries the channel holds at once (the prefetch window) are
/// claimed together, in one `begin_many`, as the Kafka runner claims a partition's batch;
/// each is then handled with its claim, once. Sixteen messages wait in the queue before the
/// runner starts, so the broker pushes them in one burst. Before: a `begin` each, no
/// `begin_many` (the probe counted 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deliveries_that_arrive_together_are_claimed_in_one_store_call() {
    let Some(uri) = server() else { return };
    let ch = channel(&uri).await;
    let q = unique("claims");
    queue(&ch, &q, false, None).await;
    for i in 0..16 {
        publish(&ch, &q, &format!("order-{i}")).await;
    }
    let probe = idemkit_test::Probe::new(idemkit_core::MemoryStore::new());
    let runs = Arc::new(AtomicU32::new(0));
    let handler_runs = runs.clone();
    let processor = Processor::builder(
        Coordinator::new(probe.clone()),
        Operation::new("mail.invoice").unwrap(),
    )
    .key(|m: &Message| Key::compose([m.text().unwrap_or(""), "invoice"]))
    .handler(move |m: Message, _| {
        let runs = handler_runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(format!("em_{}", m.text().unwrap_or("")))
        }
    });
    let settled = Arc::new(AtomicU32::new(0));
    let all = Arc::new(tokio::sync::Notify::new());
    let (count, done) = (settled.clone(), all.clone());
    let stop = spawn(|rx| {
        RabbitRunner::new(&uri, &q, processor)
            .concurrency(16)
            .on_settled(move |_| {
                if count.fetch_add(1, Ordering::SeqCst) + 1 == 16 {
                    done.notify_one();
                }
            })
            .run(until(rx))
    });
    tokio::time::timeout(Duration::from_secs(60), all.notified())
        .await
        .expect("all sixteen settled");
    stop.stop().await;
    let counts = probe.counts();
    eprintln!("sixteen deliveries: {counts:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 16, "each handled once");
    assert_eq!(counts.begin, 16, "each key claimed once: {counts:?}");
    assert!(
        (1..16).contains(&counts.begin_many),
        "the burst claimed in batches, not one key at a time: {counts:?}"
    );
    assert_eq!(ready(&ch, &q).await, 0, "every message acked");
}
