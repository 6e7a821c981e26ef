//! Helpers for tests against real Redis servers.
#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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

/// A free TCP port on loopback whose cluster-bus port (+10000) is free too.
pub fn free_port() -> u16 {
    loop {
        let p = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p < 55_000 && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

/// A `redis-server` this test owns, on its own port, killed on drop. Wrapped in `timeout`
/// so that a test process that dies cannot leave it running.
pub struct RedisProcess {
    pub port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

impl RedisProcess {
    pub fn start(extra: &[&str]) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("idemkit-redis-{port}-{:x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = RedisProcess {
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        p.restart();
        p
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts (again) on the same port, empty: nothing is persisted.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("timeout")
            .args([
                "--kill-after=5",
                "900",
                "redis-server",
                "--port",
                &self.port.to_string(),
            ])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install redis-server)");
        self.child = Some(child);
        for _ in 0..200 {
            if redis_ping(self.port) {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("redis-server on port {} did not start", self.port);
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGTERM to `timeout`, which passes it on to redis-server and reaps it.
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
            for _ in 0..200 {
                if !redis_ping(self.port) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn redis_ping(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "ping"])
        .output()
        .map(|o| o.status.success() && o.stdout.starts_with(b"PONG"))
        .unwrap_or(false)
}
