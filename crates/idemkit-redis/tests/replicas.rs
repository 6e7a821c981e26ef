//! The durability guard against a real primary and replica the test starts and stops.

mod support;

use std::convert::Infallible;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, ErrorKind, Key, Operation, Source};
use idemkit_redis::RedisStore;
use support::RedisProcess;

fn replication_up(port: u16) -> bool {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "replication"])
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).contains("master_link_status:up"))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_guard_an_unreplicated_reservation_runs_nothing() {
    let primary = RedisProcess::start(&[]);
    let mut replica = RedisProcess::start(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    for _ in 0..400 {
        if replication_up(replica.port) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(replication_up(replica.port), "the replica did not sync");

    let guarded = RedisStore::builder()
        .wait_for_replicas(1, Duration::from_millis(200))
        .connect(&primary.url())
        .await
        .unwrap();
    let c = Coordinator::new(guarded);
    let op = Operation::new("mail.invoice").unwrap();
    let runs = AtomicUsize::new(0);
    let action = |_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Infallible>("em_1".to_string())
    };

    // Replicated: the call runs and the replay works.
    let first = c
        .call(&op, &Key::new("a").unwrap())
        .run(action)
        .await
        .unwrap();
    assert_eq!(first.source, Source::Fresh);
    let replay = c
        .call(&op, &Key::new("a").unwrap())
        .run(action)
        .await
        .unwrap();
    assert_eq!(replay.source, Source::Replayed);

    // The replica is gone: a reservation cannot be acknowledged, so nothing runs.
    replica.stop();
    let refused = c.call(&op, &Key::new("b").unwrap()).run(action).await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::StoreUnavailable);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Without the guard the same primary accepts the call: the guard made the difference.
    let unguarded = Coordinator::new(RedisStore::connect(&primary.url()).await.unwrap());
    let out = unguarded
        .call(&op, &Key::new("c").unwrap())
        .run(action)
        .await
        .unwrap();
    assert_eq!(out.source, Source::Fresh);
}
