//! Helpers for tests against real Redis servers.
#![allow(dead_code, unreachable_pub)]

use idemkit_redis::RedisStore;

/// The shared server: `IDEMKIT_REDIS_URL`, default the machine's Redis on 6379.
pub fn redis_url() -> String {
    std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// A random prefix, so tests never see each other's keys and nothing is ever flushed.
pub fn prefix() -> String {
    format!("idemkit-test-{:016x}", fastrand::u64(..))
}

pub async fn connect(url: &str) -> Option<RedisStore> {
    let store = RedisStore::builder().prefix(prefix()).connect(url).await;
    if idemkit_test::require_service(&format!("redis at {url}"), store.is_ok()) {
        Some(store.unwrap())
    } else {
        None
    }
}

#[allow(unused_imports)]
pub use idemkit_test::redis_server::{RedisProcess, free_port, redis_ping};

/// `redis-cli -p PORT ARGS...`: its output, trimmed.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
