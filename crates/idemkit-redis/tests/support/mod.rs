//! Helpers for tests against real Redis servers.
#![allow(dead_code, unreachable_pub)]

use std::io::BufRead as _;

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
    connect_with(url, RedisStore::builder()).await
}

/// As [`connect`], from `builder` (its prefix replaced by a random one).
pub async fn connect_with(
    url: &str,
    builder: idemkit_redis::RedisStoreBuilder,
) -> Option<RedisStore> {
    let store = builder.prefix(prefix()).connect(url).await;
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

/// Whether the server on `port` accepts `SET … IFEQ`, asked with redis-cli (not the store).
pub fn has_ifeq(port: u16) -> bool {
    let out = cli(port, &["set", "no-such-key", "v", "ifeq", "x"]);
    !out.contains("syntax error")
}

/// The commands clients sent to a server while `f` ran, as Redis' MONITOR reports them
/// (commands run inside scripts are excluded: MONITOR marks them `lua`), the `SET … IFEQ`
/// capability probe left out: a completion asks again after any script reload of the
/// process (`plain.rs`, `RELOADS`), so another test's fresh server makes it appear in any
/// window (seen: `["EVALSHA", "SET", "EVALSHA"]` for a miss on Redis 7, 7 runs in 12 of the
/// test binary), and so are a connection's set-up commands (`HELLO`, `CLIENT`, `AUTH`,
/// `SELECT`): after a server restart, redis-rs' connection manager (the store's connection
/// for subscriptions) connects again on its own schedule, which can fall in any window
/// (seen on a fresh clone's run: `["EVALSHA", "HELLO", "CLIENT", "CLIENT", "SET",
/// "EVALSHA"]` for a miss after a failover). What a call sends is counted, not how its
/// connections come up (`tests/lanes.rs` counts those).
pub async fn client_commands<F: std::future::Future<Output = ()>>(port: u16, f: F) -> Vec<String> {
    let mut monitor = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "monitor"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(monitor.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "OK");
    f.await;
    // A marker from another connection closes the window.
    let marker = format!("end-{:x}", fastrand::u64(..));
    std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "echo", &marker])
        .output()
        .unwrap();
    let mut seen = Vec::new();
    for line in lines {
        let line = line.unwrap();
        if line.contains(&marker) {
            break;
        }
        if !line.contains(" lua]") && !line.contains("idemkit.probe") {
            // `1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "abc..." ...`
            let cmd = line
                .split('"')
                .nth(1)
                .unwrap_or_default()
                .to_ascii_uppercase();
            if !matches!(cmd.as_str(), "HELLO" | "CLIENT" | "AUTH" | "SELECT") {
                seen.push(cmd);
            }
        }
    }
    let _ = monitor.kill();
    let _ = monitor.wait();
    seen
}

/// An owner whose action (one email) holds until `between` has run, and a waiter on its key
/// that starts once the action has: `between` gets the waiter's time (see it subscribed,
/// fail the server over...) before the owner finishes. The owner's and the waiter's
/// receipts.
pub async fn owner_and_waiter<F, Fut>(
    c: &idemkit_core::Coordinator<RedisStore>,
    key: &idemkit_core::Key,
    mailer: &idemkit_test::Mailer,
    between: F,
) -> (idemkit_core::Receipt<String>, idemkit_core::Receipt<String>)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use std::time::Duration;
    let op = idemkit_core::Operation::new("mail.invoice").unwrap();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let owner = {
        let (c, op, key, mailer) = (c.clone(), op.clone(), key.clone(), mailer.clone());
        tokio::spawn(async move {
            c.call(&op, &key)
                .run(|_| async move {
                    started_tx.send(()).unwrap();
                    released.await.unwrap();
                    mailer.send(Duration::ZERO).await
                })
                .await
                .unwrap()
        })
    };
    started.await.unwrap();
    let waiter = {
        let (c, key, mailer) = (c.clone(), key.clone(), mailer.clone());
        tokio::spawn(async move {
            c.call(&op, &key)
                .in_flight(idemkit_core::InFlight::Wait)
                .run(|_| mailer.send(Duration::ZERO))
                .await
                .unwrap()
        })
    };
    between().await;
    release.send(()).unwrap();
    (owner.await.unwrap(), waiter.await.unwrap())
}

/// Returns once the server on `port` has a subscriber on a channel under `prefix` (a
/// waiter's wake-up channel).
pub async fn subscribed(port: u16, prefix: &str) {
    let pattern = format!("{prefix}:*");
    while cli(port, &["pubsub", "channels", &pattern]).is_empty() {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Valkey's server binary (`IDEMKIT_VALKEY_SERVER`, which `scripts/test` sets from
/// `scripts/valkey`), or `None` (a skip, or a failure under `CI`).
pub fn valkey() -> Option<String> {
    let bin = std::env::var("IDEMKIT_VALKEY_SERVER").ok();
    let found = bin
        .as_deref()
        .is_some_and(|b| std::path::Path::new(b).exists());
    idemkit_test::require_service("valkey-server (IDEMKIT_VALKEY_SERVER)", found).then_some(bin)?
}

/// Whether the replica on `port` has its link to its primary up.
pub fn replication_up(port: u16) -> bool {
    cli(port, &["info", "replication"]).contains("master_link_status:up")
}

/// Waits (polling the replica's own report, at most 10 s) until the replica on `port` has
/// synced with its primary.
pub async fn replica_synced(port: u16) {
    for _ in 0..400 {
        if replication_up(port) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("the replica on {port} did not sync");
}
