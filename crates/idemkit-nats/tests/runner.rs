//! The JetStream runner on a real nats-server (2.15, JetStream) with the key on real Redis.
//!
//! Every scenario runs with idempotency and with it switched off
//! (`Processor::protected(false)`); both counts are asserted, so each test shows what it
//! would report if the protection were missing.
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, Message, consumer::PullConsumer, consumer::pull, stream};
use idemkit_core::{Coordinator, InFlight, Key, Operation, Policy};
use idemkit_nats::JetStreamRunner;
use idemkit_redis::RedisStore;
use idemkit_runner::{Processor, Settlement};
use support::*;

fn order_of(m: &Message) -> String {
    String::from_utf8_lossy(&m.payload).into_owned()
}

struct Setup {
    js: jetstream::Context,
    subject: String,
    durable: String,
    stream: String,
    prefix: String,
    mails: String,
}

async fn setup(url: &str, ack_wait: Duration) -> Setup {
    let js = jetstream::new(async_nats::connect(url).await.expect("nats"));
    let (stream, subject, durable, prefix) = (
        unique("S"),
        unique("orders"),
        unique("workers"),
        unique("prefix"),
    );
    let s = js
        .create_stream(stream::Config {
            name: stream.clone(),
            subjects: vec![subject.clone(), format!("{subject}.dead")],
            ..Default::default()
        })
        .await
        .expect("stream");
    s.create_consumer(pull::Config {
        durable_name: Some(durable.clone()),
        ack_wait,
        max_deliver: 50,
        filter_subject: subject.clone(),
        ..Default::default()
    })
    .await
    .expect("consumer");
    let mails = format!("{prefix}:mails");
    Setup {
        js,
        subject,
        durable,
        stream,
        prefix,
        mails,
    }
}

impl Setup {
    async fn consumer(&self) -> PullConsumer {
        self.js
            .get_stream(&self.stream)
            .await
            .unwrap()
            .get_consumer(&self.durable)
            .await
            .unwrap()
    }

    async fn publish(&self, order: &str) {
        self.js
            .publish(self.subject.clone(), order.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// What one worker saw: (worker, delivery, settlement, receipt value).
type Log = Arc<Mutex<Vec<(u32, u32, Settlement, Option<String>)>>>;

/// A worker whose handler mails (appends to the Redis list), then takes `slow`.
async fn worker(
    s: &Setup,
    id: u32,
    mode: InFlight,
    protected: bool,
    slow: Duration,
    progress: bool,
    log: Log,
) -> JetStreamRunner<
    RedisStore,
    impl Fn(&Message) -> Result<Key, idemkit_core::KeyError> + Send + Sync + 'static,
    impl idemkit_runner::Handle<Message, Output = String> + 'static,
> {
    let store = RedisStore::builder()
        .prefix(&s.prefix)
        .connect(&redis_url())
        .await
        .unwrap();
    let coordinator = Coordinator::builder(store)
        .policy(
            Policy::new()
                .lease(Duration::from_secs(2))
                .retry_hint(Some(slow)),
        )
        .build();
    let mails = s.mails.clone();
    let processor = Processor::new(
        coordinator,
        Operation::new("mail.invoice").unwrap(),
        |m: &Message| Key::compose([order_of(m).as_str(), "invoice"]),
        move |m: Message, _| {
            let mails = mails.clone();
            async move {
                let mut r = redis().await;
                redis::cmd("RPUSH")
                    .arg(&mails)
                    .arg(order_of(&m))
                    .query_async::<()>(&mut r)
                    .await?;
                tokio::time::sleep(slow).await;
                Ok::<_, redis::RedisError>(format!("em_{}_w{id}", order_of(&m)))
            }
        },
    )
    .in_flight(mode)
    .protected(protected);
    JetStreamRunner::new(s.consumer().await, processor)
        .concurrency(4)
        .in_progress_acks(progress)
        .on_settled(move |x| {
            log.lock().unwrap().push((
                id,
                x.delivered,
                x.processed.settlement.clone(),
                x.processed.receipt.as_ref().map(|r| r.value.clone()),
            ));
        })
}

/// The seed's experiment 2 on a real broker: ack-wait 1 s, a handler that takes 2.5 s, no
/// in-progress acks, two workers on one durable consumer: the broker redelivers while the
/// first delivery still runs.
async fn redelivered_while_running(
    url: &str,
    mode: InFlight,
    protected: bool,
) -> (
    BTreeMap<String, u32>,
    Vec<(u32, u32, Settlement, Option<String>)>,
) {
    let s = setup(url, Duration::from_secs(1)).await;
    let log: Log = Arc::default();
    let slow = Duration::from_millis(2500);
    let w1 = worker(&s, 1, mode, protected, slow, false, log.clone()).await;
    let w2 = worker(&s, 2, mode, protected, slow, false, log.clone()).await;
    let stop = Arc::new(tokio::sync::Notify::new());
    let (s1, s2) = (stop.clone(), stop.clone());
    let t1 = tokio::spawn(w1.run(async move { s1.notified().await }));
    let t2 = tokio::spawn(w2.run(async move { s2.notified().await }));
    s.publish("order-1").await;
    // Until the message is acked, and a little longer for a late duplicate.
    let acked = eventually(Duration::from_secs(30), || async {
        log.lock().unwrap().iter().any(|e| e.2 == Settlement::Ack)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.notify_waiters();
    t1.await.unwrap().unwrap();
    t2.await.unwrap().unwrap();
    assert!(acked, "the message was acked");
    let log = log.lock().unwrap().clone();
    (effects(&s.mails).await, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivery_while_the_first_worker_runs_waits_and_both_ack_with_the_same_receipt() {
    let Some(url) = server() else { return };
    let (with, without) = tokio::join!(
        redelivered_while_running(&url, InFlight::Wait, true),
        redelivered_while_running(&url, InFlight::Wait, false)
    );
    eprintln!(
        "wait mode, with idemkit: mails {:?}, settlements {:?}",
        with.0, with.1
    );
    eprintln!(
        "without: mails {:?}, settlements {:?}",
        without.0, without.1
    );
    let (mails, log) = with;
    assert_eq!(mails["order-1"], 1, "one mail");
    assert!(
        log.len() >= 2,
        "the broker redelivered while the first ran: {log:?}"
    );
    assert!(
        log.iter().all(|e| e.2 == Settlement::Ack),
        "every delivery acks: {log:?}"
    );
    let receipts: std::collections::BTreeSet<_> = log.iter().map(|e| e.3.clone()).collect();
    assert_eq!(receipts.len(), 1, "with the same receipt: {log:?}");
    assert!(
        without.0["order-1"] >= 2,
        "without: the redelivery mails again"
    );
}

/// Reject mode: the duplicate is not nak'ed (a nak would use up a broker delivery for what
/// is not the message's fault, issue 20); the runner waits in process for the owner's key
/// (pushed by the store) and then acks with the replayed receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivery_while_the_first_worker_runs_waits_in_process_in_reject_mode() {
    let Some(url) = server() else { return };
    let (with, without) = tokio::join!(
        redelivered_while_running(&url, InFlight::Reject, true),
        redelivered_while_running(&url, InFlight::Reject, false)
    );
    eprintln!(
        "reject mode, with idemkit: mails {:?}, settlements {:?}",
        with.0, with.1
    );
    eprintln!(
        "without: mails {:?}, settlements {:?}",
        without.0, without.1
    );
    let (mails, log) = with;
    assert_eq!(mails["order-1"], 1, "one mail");
    assert!(
        log.len() >= 2,
        "the broker redelivered while the first ran: {log:?}"
    );
    assert!(
        log.iter().all(|e| e.2 == Settlement::Ack),
        "no nak: every delivery acks: {log:?}"
    );
    let receipts: std::collections::BTreeSet<_> = log.iter().map(|e| e.3.clone()).collect();
    assert_eq!(receipts.len(), 1, "with the same receipt: {log:?}");
    assert!(
        without.0["order-1"] >= 2,
        "without: the redelivery mails again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_progress_acks_keep_a_slow_handler_from_being_redelivered() {
    let Some(url) = server() else { return };
    let s = setup(&url, Duration::from_secs(1)).await;
    let log: Log = Arc::default();
    // Unprotected: only the in-progress acks stand between the slow handler and a redelivery.
    let w1 = worker(
        &s,
        1,
        InFlight::Wait,
        false,
        Duration::from_millis(3000),
        true,
        log.clone(),
    )
    .await;
    let w2 = worker(
        &s,
        2,
        InFlight::Wait,
        false,
        Duration::from_millis(3000),
        true,
        log.clone(),
    )
    .await;
    let stop = Arc::new(tokio::sync::Notify::new());
    let (s1, s2) = (stop.clone(), stop.clone());
    let t1 = tokio::spawn(w1.run(async move { s1.notified().await }));
    let t2 = tokio::spawn(w2.run(async move { s2.notified().await }));
    s.publish("order-2").await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            !log.lock().unwrap().is_empty()
        })
        .await
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.notify_waiters();
    t1.await.unwrap().unwrap();
    t2.await.unwrap().unwrap();
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 1, "one delivery, acked: {log:?}");
    assert_eq!(log[0].1, 1);
    assert_eq!(effects(&s.mails).await["order-2"], 1);
}

/// A worker process exits at `crash` (a flag of the example); a second one, started after
/// it, consumes until it settled one message.
async fn killed_worker(url: &str, crash: &str, protected: bool) -> BTreeMap<String, u32> {
    let s = setup(url, Duration::from_secs(1)).await;
    s.publish("order-3").await;
    let worker = |extra: &[&str]| {
        let mut c = tokio::process::Command::new(idemkit_test::example_binary("jetstream_worker"));
        c.args([
            "--server",
            url,
            "--stream",
            &s.stream,
            "--subject",
            &s.subject,
            "--durable",
            &s.durable,
        ])
        .args([
            "--redis",
            &redis_url(),
            "--prefix",
            &s.prefix,
            "--mails",
            &s.mails,
        ])
        .args(["--ack-wait-ms", "1000", "--lease-ms", "2000"])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
        if !protected {
            c.arg("--unprotected");
        }
        c
    };
    let first = tokio::time::timeout(Duration::from_secs(60), worker(&[crash]).status())
        .await
        .expect("the first worker got the message")
        .unwrap();
    assert_eq!(
        first.code(),
        Some(3),
        "the first worker died where it was told to"
    );
    let second = tokio::time::timeout(
        Duration::from_secs(60),
        worker(&["--exit-after", "1"]).status(),
    )
    .await
    .expect("the message was redelivered to the second worker")
    .unwrap();
    assert!(second.success());
    effects(&s.mails).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_after_the_effect_and_before_the_ack_does_not_repeat_it() {
    let Some(url) = server() else { return };
    let (with, without) = tokio::join!(
        killed_worker(&url, "--crash-after-effect", true),
        killed_worker(&url, "--crash-after-effect", false)
    );
    eprintln!("mails with idemkit {with:?}, without {without:?}");
    assert_eq!(with["order-3"], 1, "with idemkit: the redelivery replays");
    assert_eq!(without["order-3"], 2, "without: the redelivery mails again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_mid_handler_leaves_the_message_to_the_next_one() {
    let Some(url) = server() else { return };
    let mails = killed_worker(&url, "--crash-in-handler", true).await;
    // Killed before the effect: the message is not lost, the next worker takes the key over
    // once the dead one's lease (2 s) expires, and mails once.
    assert_eq!(mails.get("order-3").copied(), Some(1), "{mails:?}");
}

/// Issue 51, item 3: the messages a pull brings at once are claimed together, in one
/// `begin_many`, as the Kafka runner claims a partition's batch; each is then handled with its
/// claim, once. Sixteen messages wait in the stream before the runner starts, so its first
/// pull brings them together. Before: a `begin` each, no `begin_many` (the probe counted 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_that_arrive_together_are_claimed_in_one_store_call() {
    let Some(url) = server() else { return };
    let s = setup(&url, Duration::from_secs(30)).await;
    for i in 0..16 {
        s.publish(&format!("order-{i}")).await;
    }
    let probe = idemkit_test::Probe::new(idemkit_core::MemoryStore::new());
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let handler_runs = runs.clone();
    let processor = Processor::builder(
        Coordinator::new(probe.clone()),
        Operation::new("mail.invoice").unwrap(),
    )
    .key(|m: &Message| Key::compose([order_of(m).as_str(), "invoice"]))
    .handler(move |m: Message, _| {
        let runs = handler_runs.clone();
        async move {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>(format!("em_{}", order_of(&m)))
        }
    });
    let settled = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let all = Arc::new(tokio::sync::Notify::new());
    let (count, done) = (settled.clone(), all.clone());
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let runner = JetStreamRunner::new(s.consumer().await, processor)
        .concurrency(16)
        .on_settled(move |_| {
            if count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == 16 {
                done.notify_one();
            }
        });
    let task = tokio::spawn(runner.run(async move { stopped.notified().await }));
    tokio::time::timeout(Duration::from_secs(60), all.notified())
        .await
        .expect("all sixteen settled");
    stop.notify_one();
    task.await.unwrap().unwrap();
    let counts = probe.counts();
    eprintln!("sixteen messages: {counts:?}");
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        16,
        "each handled once"
    );
    assert_eq!(counts.begin, 16, "each key claimed once: {counts:?}");
    assert!(
        (1..16).contains(&counts.begin_many),
        "the pull claimed in batches, not one key at a time: {counts:?}"
    );
}
