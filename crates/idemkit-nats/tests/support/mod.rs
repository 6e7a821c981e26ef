//! Helpers for tests against a real nats-server with JetStream, and Redis.
#![allow(dead_code, unreachable_pub, unused_imports)]

/// The server (see [`idemkit_test::brokers::nats`]).
pub fn server() -> Option<String> {
    idemkit_test::brokers::nats()
}

pub fn redis_url() -> String {
    std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// A name no other test uses (letters, digits and dashes: valid for streams and subjects).
pub fn unique(what: &str) -> String {
    format!("idemkit-{what}-{:016x}", fastrand::u64(..))
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
