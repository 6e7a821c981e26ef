//! Helpers for tests against a real Kafka-protocol broker (tansu) and Redis.
#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};

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
