//! Transactional output (`KafkaRunner::transactional_output`, issue 52), on the machine's
//! Kafka-protocol broker: outputs made from each message's result are produced in its
//! partition's transaction, which commits them with the input offsets; a transaction that
//! did not commit leaves its offsets uncommitted, and the redelivery replays the result and
//! produces the outputs again.
//!
//! The broker here, tansu 0.6.0, commits and aborts transactions but serves the records of an
//! aborted one to a `read_committed` consumer too (measured: a record produced in a
//! transaction that was then aborted was read back at its offset). So these tests check what
//! the runner does (which offsets a transaction carries, that an uncommitted batch comes
//! again, that outputs come from replayed results), not the broker's isolation, which is
//! Kafka's own guarantee.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Operation};
use idemkit_kafka::{KafkaRunner, Output, Processor, dedupe_headers, dedupe_key};
use idemkit_test::faults::{FaultPoint, stop_at_tokio, stopped};
use rdkafka::Offset;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::{Headers as _, Message as _, OwnedMessage};
use rdkafka::producer::FutureRecord;
use support::{brokers, consumer_config, create_topic, producer, read_topic, redis_url, unique};
use tokio::sync::Notify;

/// Produces `order` to `topic` under the dedupe id `id`.
async fn produce(brokers: &str, topic: &str, order: &str, id: &str) {
    producer(brokers)
        .send(
            FutureRecord::to(topic)
                .partition(0)
                .key(order)
                .payload(order)
                .headers(dedupe_headers(None, id)),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("produced");
}

/// The group's committed offset of `topic`'s partition 0 (`None`: nothing committed).
fn committed(brokers: &str, group: &str, topic: &str) -> Option<i64> {
    let c: BaseConsumer = consumer_config(brokers, group).create().unwrap();
    let mut list = rdkafka::TopicPartitionList::new();
    list.add_partition(topic, 0);
    let got = c.committed_offsets(list, Duration::from_secs(10)).unwrap();
    match got.find_partition(topic, 0).unwrap().offset() {
        Offset::Offset(n) => Some(n),
        _ => None,
    }
}

/// A runner of `group` on `input` whose handler counts its runs in `runs` and returns the
/// order's invoice; each result's output goes to `output`, named by the input's dedupe id.
/// It stops once `stop_after` messages settled.
async fn run(
    brokers: &str,
    group: &str,
    input: &str,
    output: &str,
    prefix: &str,
    runs: Arc<AtomicUsize>,
    stop_after: usize,
) {
    let store = idemkit_redis::RedisStore::builder()
        .prefix(prefix)
        .connect(&redis_url())
        .await
        .expect("redis");
    let processor = Processor::builder(
        Coordinator::new(store),
        Operation::new("invoice.issue").unwrap(),
    )
    .key(dedupe_key)
    .handler(move |m: OwnedMessage, _attempt| {
        let runs = runs.clone();
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            let order = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            Ok::<_, std::io::Error>(format!("{order}:inv-{n}"))
        }
    });
    let (settled, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
    let (count, notify) = (settled.clone(), done.clone());
    let output = output.to_string();
    let run = KafkaRunner::new(consumer_config(brokers, group), [input], processor)
        .transactional_output(format!("{group}-tx"), move |m, receipt| {
            let id = dedupe_key(m).expect("keyed").as_str().to_string();
            vec![
                Output::new(output.clone(), receipt.value.clone())
                    .headers(dedupe_headers(None, &format!("{id}.issued"))),
            ]
        })
        .on_settled(move |_| {
            if count.fetch_add(1, Ordering::SeqCst) + 1 >= stop_after {
                notify.notify_one();
            }
        })
        .run(async move { done.notified().await });
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the runner settled its messages")
        .expect("the runner");
}

fn text(m: &OwnedMessage) -> (String, String) {
    let header = m
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == idemkit_kafka::DEDUPE_HEADER))
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default();
    (
        String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
        header,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outputs_and_input_offsets_commit_in_one_transaction() {
    let Some(brokers) = brokers() else { return };
    let (input, output, group) = (unique("in"), unique("out"), unique("g"));
    create_topic(&brokers, &input, 1).await;
    create_topic(&brokers, &output, 1).await;
    // order-1 twice (its producer retried: one dedupe id), then order-2.
    produce(&brokers, &input, "order-1", "order-1.paid").await;
    produce(&brokers, &input, "order-1", "order-1.paid").await;
    produce(&brokers, &input, "order-2", "order-2.paid").await;
    let runs = Arc::new(AtomicUsize::new(0));
    run(
        &brokers,
        &group,
        &input,
        &output,
        &unique("tx"),
        runs.clone(),
        3,
    )
    .await;

    assert_eq!(runs.load(Ordering::SeqCst), 2, "one invoice per order");
    // Auto-commit is off: only the transactions can have committed the offsets.
    assert_eq!(
        committed(&brokers, &group, &input),
        Some(3),
        "the input offsets"
    );
    let outputs: Vec<_> = read_topic(&brokers, &output, 3)
        .await
        .iter()
        .map(text)
        .collect();
    // Each message's output, the retried one's from the replayed result, under one id.
    assert_eq!(
        outputs,
        [
            (
                "order-1:inv-1".to_string(),
                "order-1.paid.issued".to_string()
            ),
            (
                "order-1:inv-1".to_string(),
                "order-1.paid.issued".to_string()
            ),
            (
                "order-2:inv-2".to_string(),
                "order-2.paid.issued".to_string()
            ),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_before_its_commit_leaves_the_offset_and_the_output_to_the_replay() {
    let Some(brokers) = brokers() else { return };
    let (input, output, group, prefix) = (unique("in"), unique("out"), unique("g"), unique("tx"));
    let mails = format!("{prefix}:mails");
    create_topic(&brokers, &input, 1).await;
    create_topic(&brokers, &output, 1).await;
    produce(&brokers, &input, "order-3", "order-3.paid").await;
    let worker = || {
        let mut c = support::kafka_worker(&brokers, &input, &group, &prefix, &mails);
        c.args(["--outputs", &output]);
        c
    };
    // The first worker mails, stores its result, and dies before its transaction commits.
    let mut first = worker();
    stop_at_tokio(&mut first, FaultPoint::BeforeAck);
    let mut first = first.spawn().unwrap();
    let pid = first.id().unwrap();
    let status = tokio::time::timeout(Duration::from_secs(90), first.wait())
        .await
        .expect("the first worker handled the message")
        .unwrap();
    assert!(stopped(&status), "stopped before its commit: {status}");
    assert_eq!(
        committed(&brokers, &group, &input),
        None,
        "no offset committed outside a transaction"
    );
    // The next gets the message again: the result replays and its output is produced, in a
    // transaction that commits the offset.
    let second = tokio::time::timeout(
        Duration::from_secs(90),
        worker().arg("--exit-after").arg("1").status(),
    )
    .await
    .expect("the replacement got the message again")
    .unwrap();
    assert!(second.success(), "{second}");
    assert_eq!(support::effects(&mails).await["order-3"], 1, "one mail");
    assert_eq!(committed(&brokers, &group, &input), Some(1));
    let outputs = read_topic(&brokers, &output, 1).await;
    assert_eq!(outputs.len(), 1);
    // The first worker's result (its process id), replayed.
    let value = String::from_utf8_lossy(outputs[0].payload().unwrap_or_default()).into_owned();
    assert_eq!(value, format!("em_order-3_{pid}"));
}

/// The group's committed offsets of `topic`'s `partitions`, summed (nothing committed: 0).
fn committed_total(brokers: &str, group: &str, topic: &str, partitions: i32) -> i64 {
    let c: BaseConsumer = consumer_config(brokers, group).create().unwrap();
    let mut list = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p);
    }
    let got = c.committed_offsets(list, Duration::from_secs(10)).unwrap();
    got.elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(n) => n,
            _ => 0,
        })
        .sum()
}

/// Where a member consumes and produces.
struct Topics<'a> {
    brokers: &'a str,
    group: &'a str,
    input: &'a str,
    output: &'a str,
}

/// A member of `group` whose handler mails (a Redis list) and returns `em_{order}`, holding
/// after its effect until `hold` is set (if given); its key function sets `seen` (if given).
/// Each result goes to `output`, keyed by the order.
fn member(
    at: &Topics<'_>,
    store: idemkit_redis::RedisStore,
    mails: String,
    hold: Option<Arc<std::sync::atomic::AtomicBool>>,
    seen: Option<Arc<std::sync::atomic::AtomicBool>>,
    stop: Arc<Notify>,
) -> tokio::task::JoinHandle<()> {
    // The runner tests' processor: a mail per order, holding after it until `hold` is set.
    let processor = support::processor(store, mails, true, hold, seen);
    let output = at.output.to_string();
    let run = KafkaRunner::new(consumer_config(at.brokers, at.group), [at.input], processor)
        .transactional_output(format!("{}-tx", at.group), move |m, receipt| {
            vec![
                Output::new(output.clone(), receipt.value.clone())
                    .key(m.key().unwrap_or_default().to_vec()),
            ]
        })
        .run(async move { stop.notified().await });
    tokio::spawn(async move { run.await.expect("runner") })
}

/// A second member joins while the first one's handlers hold after their effects: the
/// revoked partitions' calls end unsettled (no output, no offset in a transaction), and their
/// next owner, whose producer takes over the partition's transactional id, replays the
/// results, produces their outputs and commits the offsets. Every mail once, every input
/// offset committed, and every output of an order is its stored result.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebalance_mid_stream_commits_every_input_and_outputs_only_stored_results() {
    let Some(brokers) = brokers() else { return };
    let (input, output, group, prefix) = (unique("in"), unique("out"), unique("g"), unique("tx"));
    let mails = format!("{prefix}:mails");
    let partitions = 4;
    create_topic(&brokers, &input, partitions).await;
    create_topic(&brokers, &output, 1).await;
    let p = producer(&brokers);
    let orders: Vec<String> = (0..16).map(|i| format!("order-{i}")).collect();
    for (i, o) in orders.iter().enumerate() {
        support::produce(&p, &input, i as i32 % partitions, o, "paid").await;
    }
    let store = || async {
        idemkit_redis::RedisStore::builder()
            .prefix(&prefix)
            .connect(&redis_url())
            .await
            .expect("redis")
    };
    let second = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (stop_a, stop_b) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let at = Topics {
        brokers: &brokers,
        group: &group,
        input: &input,
        output: &output,
    };
    let a = member(
        &at,
        store().await,
        mails.clone(),
        Some(second.clone()),
        None,
        stop_a.clone(),
    );
    assert!(
        support::eventually(Duration::from_secs(60), || async {
            !support::effects(&mails).await.is_empty()
        })
        .await,
        "the first member is mid-handler"
    );
    let b = member(
        &at,
        store().await,
        mails.clone(),
        None,
        Some(second.clone()),
        stop_b.clone(),
    );
    let all_committed = support::eventually(Duration::from_secs(90), || async {
        committed_total(&brokers, &group, &input, partitions) == 16
    })
    .await;
    stop_a.notify_one();
    stop_b.notify_one();
    a.await.unwrap();
    b.await.unwrap();
    assert!(
        all_committed,
        "every input offset committed: {}",
        committed_total(&brokers, &group, &input, partitions)
    );
    let sent = support::effects(&mails).await;
    assert!(
        orders.iter().all(|o| sent.get(o) == Some(&1)),
        "every mail once: {sent:?}"
    );
    let mut outputs: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for m in read_topic(&brokers, &output, 16).await {
        let order = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        outputs.entry(order).or_default().insert(text(&m).0);
    }
    for o in &orders {
        assert_eq!(
            outputs
                .get(o)
                .map(|values| values.iter().cloned().collect::<Vec<_>>()),
            Some(vec![format!("em_{o}")]),
            // Every order's, so that a failure shows whether outputs were missing (the
            // read ran out of time) or wrong.
            "{o}'s outputs are its stored result; every order's: {outputs:?}"
        );
    }
}
