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

/// Whether the server on `port` accepts `SET … IFEQ`, asked with redis-cli (not the store).
pub fn has_ifeq(port: u16) -> bool {
    let out = cli(port, &["set", "no-such-key", "v", "ifeq", "x"]);
    !out.contains("syntax error")
}

/// The commands clients sent to a server while `f` ran, as Redis' MONITOR reports them
/// (commands run inside scripts are excluded: MONITOR marks them `lua`).
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
        if !line.contains(" lua]") {
            // `1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "abc..." ...`
            let cmd = line
                .split('"')
                .nth(1)
                .unwrap_or_default()
                .to_ascii_uppercase();
            seen.push(cmd);
        }
    }
    let _ = monitor.kill();
    let _ = monitor.wait();
    seen
}
