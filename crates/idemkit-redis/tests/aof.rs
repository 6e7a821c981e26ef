//! The durability guard on disk (issue 52, `RedisStoreBuilder::wait_for_aof`): `WAITAOF`
//! after every guarded write, against servers the tests start: Valkey 9.1 (which has it:
//! `IDEMKIT_VALKEY_SERVER`, set by `scripts/test`) with and without its append-only file and
//! with a replica, and the machine's `redis-server` (Redis 7.0, which does not).

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, ErrorKind, Key, Operation, Source, StoreErrorKind};
use idemkit_redis::RedisStore;
use support::{RedisProcess, cli, valkey};

/// Calls of `command` the server counted (`INFO commandstats`).
fn calls(port: u16, command: &str) -> u64 {
    let text = cli(port, &["info", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.trim().parse().unwrap())
}

fn op() -> Operation {
    Operation::new("payments.charge").unwrap()
}

/// A server without `WAITAOF` (Redis 7.0), or one that cannot honour it (no append-only file
/// and `local` asked): `connect` fails with a typed error before any call, found by sending
/// the command, not by reading the version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_wait_for_its_disk_is_refused_at_connect() {
    // The machine's redis-server: Redis 7.0 has no WAITAOF (7.2 added it).
    let redis = RedisProcess::start_as("redis-server", &[]);
    let has = !cli(redis.port, &["command", "info", "waitaof"])
        .trim()
        .is_empty();
    let connected = RedisStore::builder()
        .wait_for_aof(false, 1, Duration::from_millis(100))
        .connect(&redis.url())
        .await;
    if has {
        // A newer redis-server on this machine: the capability, not the name, decides.
        assert!(connected.is_ok(), "{connected:?}");
    } else {
        let e = connected.expect_err("a server without WAITAOF was accepted");
        assert_eq!(e.kind(), StoreErrorKind::Rejected, "{e}");
        assert!(e.to_string().contains("WAITAOF"), "{e}");
    }

    let Some(valkey) = valkey() else { return };
    let no_aof = RedisProcess::start_as(&valkey, &["--appendonly", "no"]);
    let e = RedisStore::builder()
        .wait_for_aof(true, 0, Duration::from_millis(100))
        .connect(&no_aof.url())
        .await
        .expect_err("local without an append-only file was accepted");
    assert_eq!(e.kind(), StoreErrorKind::Rejected, "{e}");
    assert!(e.to_string().contains("appendonly"), "{e}");
    // Replicas only: the primary's own file is not asked for, so this one can.
    RedisStore::builder()
        .wait_for_aof(false, 0, Duration::from_millis(100))
        .connect(&no_aof.url())
        .await
        .expect("WAITAOF 0 0 on a server without an append-only file");
}

/// With the guard on the primary's disk and one replica's, every write phase is followed by
/// a `WAITAOF` (none by `WAIT`): the call runs once, its replay is stored; with the replica
/// gone, a reservation cannot reach its disk and nothing runs.
///
/// The healthy calls wait up to 30 s for the disks (`WAITAOF` answers as soon as they have
/// the write, so this costs nothing when they do): with 500 ms, a fresh clone's test run
/// saw the replay's `WAITAOF` time out on a busy machine (`stored: false`, the record not
/// proven on the replica's disk in time). Only the refused call, whose wait must run out,
/// has the short bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_aof_guard_a_call_runs_only_once_its_record_is_on_disk() {
    let Some(valkey) = valkey() else { return };
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let primary = RedisProcess::start_as(&valkey, &aof);
    let port = primary.port.to_string();
    let replica_args = [&aof[..], &["--replicaof", "127.0.0.1", &port]].concat();
    let mut replica = RedisProcess::start_as(&valkey, &replica_args);
    support::replica_synced(replica.port).await;

    let url = primary.url();
    let guarded = |timeout| {
        RedisStore::builder()
            .wait_for_aof(true, 1, timeout)
            .connect(&url)
    };
    let c = Coordinator::new(guarded(Duration::from_secs(30)).await.unwrap());
    let impatient = Coordinator::new(guarded(Duration::from_millis(500)).await.unwrap());
    let runs = AtomicUsize::new(0);
    let action = |_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Infallible>("ch_1".to_string())
    };
    let before = calls(primary.port, "waitaof");
    let first = c
        .call(&op(), &Key::new("order-9").unwrap())
        .run(action)
        .await
        .unwrap();
    assert_eq!((first.source, first.stored), (Source::Fresh, true));
    // The reservation's and the completion's.
    assert!(
        calls(primary.port, "waitaof") >= before + 2,
        "{} WAITAOF",
        calls(primary.port, "waitaof") - before
    );
    assert_eq!(calls(primary.port, "wait"), 0);
    let replay = c
        .call(&op(), &Key::new("order-9").unwrap())
        .run(action)
        .await
        .unwrap();
    assert_eq!((replay.source, replay.stored), (Source::Replayed, true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The replica is gone: no replica's disk has the reservation, so nothing runs.
    replica.stop();
    let refused = impatient
        .call(&op(), &Key::new("order-10").unwrap())
        .run(action)
        .await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::StoreUnavailable);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
