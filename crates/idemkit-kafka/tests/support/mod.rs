//! Helpers for tests against a real Kafka-protocol broker (tansu) and Redis.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_redis::RedisStore;
use idemkit_runner::{Processor, RetryPolicy};
use rdkafka::Message as _;
use rdkafka::message::OwnedMessage;

/// The broker (see [`idemkit_test::brokers::kafka`]).
pub fn brokers() -> Option<String> {
    idemkit_test::brokers::kafka()
}

pub fn redis_url() -> String {
    std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// A name no other test uses.
pub fn unique(what: &str) -> String {
    format!("idemkit-{what}-{:016x}", fastrand::u64(..))
}

/// Creates `topic` with `partitions` partitions.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let results = admin
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create topic");
    for r in results {
        r.expect("topic created");
    }
}

pub fn producer(brokers: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "0")
        .create()
        .expect("producer")
}

/// Produces `key` → `payload` to one partition, waiting for the broker's ack.
pub async fn produce(p: &FutureProducer, topic: &str, partition: i32, key: &str, payload: &str) {
    p.send(
        FutureRecord::to(topic)
            .partition(partition)
            .key(key)
            .payload(payload),
        Duration::from_secs(10),
    )
    .await
    .map_err(|(e, _)| e)
    .expect("produced");
}

/// A consumer configuration for `group`: earliest offsets, short sessions so a killed
/// member's partitions move on within seconds.
pub fn consumer_config(brokers: &str, group: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("auto.commit.interval.ms", "200")
        .set("topic.metadata.refresh.interval.ms", "1000");
    c
}

pub async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis is up (scripts/test starts it)")
}

/// How many times each effect happened: the "mails" list the handlers append to.
pub async fn effects(list: &str) -> std::collections::BTreeMap<String, u32> {
    let mut r = redis().await;
    let all: Vec<String> = redis::cmd("LRANGE")
        .arg(list)
        .arg(0)
        .arg(-1)
        .query_async(&mut r)
        .await
        .unwrap();
    let mut m = std::collections::BTreeMap::new();
    for e in all {
        *m.entry(e).or_insert(0) += 1;
    }
    m
}

pub use idemkit_test::eventually;

/// Reads `topic` from the start (a reader group of its own) until `n` records arrived, or
/// 30 s passed.
pub async fn read_topic(
    brokers: &str,
    topic: &str,
    n: usize,
) -> Vec<rdkafka::message::OwnedMessage> {
    use rdkafka::consumer::{Consumer as _, StreamConsumer};
    let c: StreamConsumer = consumer_config(brokers, &unique("reader"))
        .create()
        .unwrap();
    c.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        match tokio::time::timeout_at(deadline, c.recv()).await {
            Ok(Ok(m)) => out.push(m.detach()),
            Ok(Err(e)) => panic!("read {topic}: {e}"),
            Err(_) => break,
        }
    }
    out
}

/// The `kafka_worker` example as a child process of `group` on `topic`, its keys under
/// `prefix` on Redis and its mails in the list `mails` (killed when dropped).
pub fn kafka_worker(
    brokers: &str,
    topic: &str,
    group: &str,
    prefix: &str,
    mails: &str,
) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(idemkit_test::example_binary("kafka_worker"));
    c.args(["--brokers", brokers, "--topic", topic, "--group", group])
        .args([
            "--redis",
            &redis_url(),
            "--prefix",
            prefix,
            "--mails",
            mails,
        ])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
    c
}

pub fn order_of(m: &OwnedMessage) -> String {
    m.key()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .unwrap_or_default()
}

pub async fn store(prefix: &str) -> RedisStore {
    RedisStore::builder()
        .prefix(prefix)
        .connect(&redis_url())
        .await
        .expect("redis store")
}

/// A processor whose effect appends the order id to the Redis list `mails`, then waits for
/// `hold` to be released (if given) before returning.
pub fn processor(
    store: RedisStore,
    mails: String,
    protected: bool,
    hold: Option<Arc<AtomicBool>>,
    seen: Option<Arc<AtomicBool>>,
) -> Processor<
    RedisStore,
    impl Fn(&OwnedMessage) -> Result<Key, idemkit_core::KeyError> + Send + Sync + 'static,
    impl idemkit_runner::Handle<OwnedMessage, Output = String> + 'static,
> {
    Processor::new(
        Coordinator::new(store),
        Operation::new("mail.invoice").unwrap(),
        {
            let seen = seen.clone();
            move |m: &OwnedMessage| {
                if let Some(seen) = &seen {
                    seen.store(true, Ordering::SeqCst);
                }
                Key::compose([order_of(m).as_str(), "invoice"])
            }
        },
        move |m: OwnedMessage, _| {
            let (mails, hold) = (mails.clone(), hold.clone());
            if let Some(seen) = &seen {
                seen.store(true, Ordering::SeqCst);
            }
            async move {
                let mut r = redis().await;
                redis::cmd("RPUSH")
                    .arg(&mails)
                    .arg(order_of(&m))
                    .query_async::<()>(&mut r)
                    .await?;
                if let Some(hold) = hold {
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                    while !hold.load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                Ok::<_, redis::RedisError>(format!("em_{}", order_of(&m)))
            }
        },
    )
    .protected(protected)
    .retry(
        RetryPolicy::new()
            .max_deliveries(3)
            .backoff(Duration::from_millis(50), Duration::from_millis(200)),
    )
}
