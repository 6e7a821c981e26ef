//! Redis behind Sentinel: a master, a replica and three sentinels the test starts
//! (`redis-server --sentinel`), a store connected through the sentinels, and a failover in
//! the middle of a call (`SENTINEL FAILOVER`: the replica is promoted, the old master demoted
//! and its clients killed).
//!
//! What must hold: the store finds the master through the sentinels, follows it to the new
//! one, and keeps every promise across the move: a result stored before the failover (the
//! durability guard had the replica acknowledge it) is replayed after it, a call whose action
//! runs through the failover stores its result on the new master once, and its waiter gets
//! that result; nothing runs twice.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation, Source};
use idemkit_redis::RedisStore;
use idemkit_test::Mailer;
use support::{RedisProcess, cli, free_port};

/// A sentinel this test owns, killed on drop.
struct Sentinel {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl Sentinel {
    fn start(master_port: u16) -> Sentinel {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("idemkit-sentinel-{port}-{:x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor mymaster 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds mymaster 1000\n\
                 sentinel failover-timeout mymaster 10000\n\
                 sentinel parallel-syncs mymaster 1\n",
                dir.display()
            ),
        )
        .unwrap();
        let child = Command::new("timeout")
            .args(["--kill-after=5", "900", "redis-server"])
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's runs as a sentinel with --sentinel)");
        let s = Sentinel { port, dir, child };
        wait_until(Duration::from_secs(30), "the sentinel answers", || {
            cli(port, &["ping"]) == "PONG"
        });
        s
    }

    /// The master's port as this sentinel sees it.
    fn master_port(&self) -> Option<u16> {
        cli(
            self.port,
            &["sentinel", "get-master-addr-by-name", "mymaster"],
        )
        .lines()
        .nth(1)
        .and_then(|p| p.trim().parse().ok())
    }

    /// A field of `SENTINEL MASTER mymaster`.
    fn master_field(&self, name: &str) -> Option<String> {
        let out = cli(self.port, &["sentinel", "master", "mymaster"]);
        let lines: Vec<&str> = out.lines().collect();
        lines
            .windows(2)
            .find(|w| w[0] == name)
            .map(|w| w[1].to_string())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits for a condition the servers report, polling them (no event exists for it).
fn wait_until(within: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let step = Duration::from_millis(50);
    for _ in 0..within.as_millis() / step.as_millis() {
        if ok() {
            return;
        }
        std::thread::sleep(step);
    }
    panic!("timed out waiting until {what}");
}

fn op() -> Operation {
    Operation::new("mail.invoice").unwrap()
}

/// A master, its replica, and three sentinels that know both and each other.
fn group() -> (RedisProcess, RedisProcess, Vec<Sentinel>) {
    let master = RedisProcess::start_as("redis-server", &[]);
    let port = master.port.to_string();
    let replica = RedisProcess::start_as("redis-server", &["--replicaof", "127.0.0.1", &port]);
    wait_until(Duration::from_secs(30), "the replica is in sync", || {
        cli(replica.port, &["info", "replication"]).contains("master_link_status:up")
    });
    let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(master.port)).collect();
    // Sentinels learn of replicas from the master's INFO (every 10 s at first) and of each
    // other through its hello channel: a failover needs both.
    for s in &sentinels {
        wait_until(
            Duration::from_secs(60),
            "the sentinels know the group",
            || {
                s.master_field("num-slaves").as_deref() == Some("1")
                    && s.master_field("num-other-sentinels").as_deref() == Some("2")
            },
        );
    }
    (master, replica, sentinels)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_behind_sentinel_follows_a_failover_and_keeps_its_promises() {
    let (master, replica, sentinels) = group();
    let url = format!(
        "redis+sentinel://{}/mymaster",
        sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect::<Vec<_>>()
            .join(",")
    );
    let prefix = support::prefix();
    let store = RedisStore::builder()
        .prefix(prefix.clone())
        .wait_for_replicas(1, Duration::from_secs(2))
        .connect(&url)
        .await
        .expect("connect through the sentinels");
    let c = Coordinator::new(store);
    let mailer = Mailer::default();

    // Before the failover: a result stored (and acknowledged by the replica).
    let before = Key::new("order-1.invoice").unwrap();
    let first = c
        .call(&op(), &before)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(first.source, Source::Fresh);
    assert!(first.stored);
    assert!(cli(master.port, &["dbsize"]).parse::<u64>().unwrap() >= 1);

    // A call whose action runs through the failover, and a waiter on it.
    let during = Key::new("order-2.invoice").unwrap();
    let (done, waited) = support::owner_and_waiter(&c, &during, &mailer, || async {
        support::subscribed(master.port, &prefix).await;
        // The failover: the replica becomes the master, the old master its replica.
        assert_eq!(
            cli(sentinels[0].port, &["sentinel", "failover", "mymaster"]),
            "OK"
        );
        for s in &sentinels {
            wait_until(
                Duration::from_secs(60),
                "every sentinel names the new master",
                || s.master_port() == Some(replica.port),
            );
        }
        wait_until(
            Duration::from_secs(60),
            "the old master follows the new one",
            || cli(master.port, &["info", "replication"]).contains("master_link_status:up"),
        );
        // The action ends now: its result goes to the new master, once, and the waiter
        // gets it.
    })
    .await;
    assert_eq!(done.source, Source::Fresh);
    assert_eq!(waited.source, Source::Replayed);
    assert_eq!(done.value, waited.value);

    // After it: the result stored before the failover is replayed, a new key runs once.
    let again = c
        .call(&op(), &before)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(again.source, Source::Replayed);
    assert_eq!(again.value, first.value);
    let after = Key::new("order-3.invoice").unwrap();
    let third = c
        .call(&op(), &after)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(third.source, Source::Fresh);
    assert!(third.stored, "acknowledged by the new master's replica");
    assert_eq!(mailer.sent(), 3, "one email per key");
    // The new master holds the records.
    assert!(cli(replica.port, &["info", "replication"]).contains("role:master"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_the_sentinels_do_not_know_is_a_configuration_error() {
    let (_master, _replica, sentinels) = group();
    let e = RedisStore::builder()
        .connect_sentinel(
            sentinels
                .iter()
                .map(|s| format!("redis://127.0.0.1:{}", s.port)),
            "nosuchmaster",
        )
        .await
        .expect_err("an unknown master name");
    assert!(!e.is_unavailable(), "{e:?}");
    assert!(e.to_string().contains("nosuchmaster"), "{e}");
    // A URL without a master name is refused before anything is asked.
    let e = RedisStore::connect(&format!("redis+sentinel://127.0.0.1:{}", sentinels[0].port))
        .await
        .expect_err("no master name");
    assert!(e.to_string().contains("master"), "{e}");
}
