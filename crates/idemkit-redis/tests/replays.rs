//! A run of replays on a Redis server this test owns, counted by Redis itself (`INFO
//! commandstats`): once most recent `begin`s met a completed record, a replay is one plain
//! `GET` instead of the `begin` script, and every other answer (an absent key, another
//! fingerprint, another owner's reservation, a released key, bytes not ours, a key of
//! another type) is still exactly what the script gives.

mod support;

use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, Fingerprint, Key, Operation, OwnerToken, ResultKind,
    StorageKey, Store, StoreErrorKind,
};
use idemkit_redis::RedisStore;
use support::RedisProcess;

/// `calls` of `command` so far, from the server's own counters.
fn calls(port: u16, command: &str) -> u64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "commandstats"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("cmdstat_{command}:calls=");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|l| l.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

fn key(name: &str) -> StorageKey {
    let op = Operation::new("mail.invoice").unwrap();
    StorageKey::new(&op, None, &Key::new(name).unwrap())
}

const LEASE: Duration = Duration::from_secs(30);

async fn begin(store: &RedisStore, k: &StorageKey, fingerprint: Option<Fingerprint>) -> Claim {
    store
        .begin(&BeginRequest::new(k, OwnerToken::random(), LEASE).with_fingerprint(fingerprint))
        .await
        .unwrap()
}

/// A key completed with `result` (no fingerprint).
async fn completed(store: &RedisStore, name: &str, result: &str) -> StorageKey {
    let k = key(name);
    let Claim::Reserved { ownership, .. } = begin(store, &k, None).await else {
        panic!("{name}: not reserved");
    };
    let done = CompleteRequest::new(
        ResultKind::Value,
        Bytes::from(result.to_owned()),
        Duration::from_secs(60),
    );
    store.complete(&k, &ownership, &done).await.unwrap();
    k
}

/// A store whose recent `begin`s all met a completed record: 16 replays of `hot`.
async fn after_replays(server: &RedisProcess, coalesce: bool) -> (RedisStore, StorageKey) {
    let store = RedisStore::builder()
        .prefix(format!("replays-{:x}", fastrand::u64(..)))
        .coalesce(coalesce)
        .connect(&server.url())
        .await
        .unwrap();
    let hot = completed(&store, "hot", "em_hot").await;
    for _ in 0..16 {
        assert!(matches!(begin(&store, &hot, None).await, Claim::Replay(_)));
    }
    (store, hot)
}

#[tokio::test]
async fn a_run_of_replays_is_read_with_one_get_each() {
    let server = RedisProcess::start(&[]);
    for coalesce in [true, false] {
        let (store, hot) = after_replays(&server, coalesce).await;
        let (scripts, gets) = (calls(server.port, "evalsha"), calls(server.port, "get"));
        for _ in 0..20 {
            match begin(&store, &hot, None).await {
                Claim::Replay(replay) => {
                    assert_eq!(replay.outcome.bytes(), &Bytes::from_static(b"em_hot"));
                }
                other => panic!("coalesce {coalesce}: {other:?}"),
            }
        }
        assert_eq!(
            calls(server.port, "evalsha") - scripts,
            0,
            "coalesce {coalesce}: a replay after a run of replays ran the begin script"
        );
        assert_eq!(calls(server.port, "get") - gets, 20, "coalesce {coalesce}");
    }
}

#[tokio::test]
async fn after_a_run_of_replays_every_other_answer_is_the_scripts() {
    let server = RedisProcess::start(&[]);
    let (store, hot) = after_replays(&server, true).await;
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();

    // A completed record made without a fingerprint, asked for with one: refused.
    let other = Some(Fingerprint::of(b"another request"));
    assert!(matches!(begin(&store, &hot, other).await, Claim::Mismatch));

    // An absent key: reserved (the GET found nothing, the script reserved).
    let fresh = key("fresh");
    let Claim::Reserved { ownership, .. } = begin(&store, &fresh, None).await else {
        panic!("an absent key was not reserved");
    };

    // Another owner's live reservation: in flight, with its lease and age.
    match begin(&store, &fresh, None).await {
        Claim::InFlight {
            retry_after,
            fencing,
            held_for,
            ..
        } => {
            assert!(retry_after <= LEASE && retry_after > Duration::ZERO);
            assert_eq!(fencing, ownership.fencing);
            assert!(held_for.is_some());
        }
        other => panic!("another owner's reservation: {other:?}"),
    }

    // A released key (its tombstone): reserved again, with a later fencing token.
    store.release(&fresh, &ownership).await.unwrap();
    let Claim::Reserved {
        ownership: again, ..
    } = begin(&store, &fresh, None).await
    else {
        panic!("a released key was not reserved again");
    };
    assert!(again.fencing > ownership.fencing);

    // Bytes that are not a record of ours, and a key of another type: corrupt, nothing run.
    let foreign = key("foreign");
    let _: () = redis::cmd("SET")
        .arg(store.redis_key(&foreign))
        .arg("not a record")
        .query_async(&mut raw)
        .await
        .unwrap();
    let hash = key("hash");
    let _: () = redis::cmd("HSET")
        .arg(store.redis_key(&hash))
        .arg("f")
        .arg("v")
        .query_async(&mut raw)
        .await
        .unwrap();
    for k in [&foreign, &hash] {
        let err = store
            .begin(&BeginRequest::new(k, OwnerToken::random(), LEASE))
            .await
            .expect_err("bytes not ours were taken for a record");
        assert_eq!(err.kind(), StoreErrorKind::Corrupt, "{k}: {err}");
    }

    // And the replays still answer with the record.
    assert!(matches!(begin(&store, &hot, None).await, Claim::Replay(_)));
}

/// On a Cluster the replay read goes to each key's own primary: after a run of replays of
/// keys on every primary, each replays from its `GET` (no script on any node), and a fresh
/// key is still reserved.
#[tokio::test]
async fn on_a_cluster_a_run_of_replays_reads_each_keys_primary() {
    let cluster = idemkit_test::redis_server::Cluster::start();
    let store = RedisStore::builder()
        .prefix(format!("replays-{:x}", fastrand::u64(..)))
        .connect_cluster(cluster.urls())
        .await
        .unwrap();
    let mut keys = Vec::new();
    // Enough keys that every primary holds some (their slots follow from their names).
    for i in 0..30 {
        keys.push(completed(&store, &format!("order-{i}"), &format!("em_{i}")).await);
    }
    for n in &cluster.nodes {
        assert!(
            idemkit_test::redis_server::dbsize(n.port) > 0,
            "no key on {}",
            n.port
        );
    }
    for k in keys.iter().cycle().take(16) {
        assert!(matches!(begin(&store, k, None).await, Claim::Replay(_)));
    }
    let scripts = |c: &idemkit_test::redis_server::Cluster| -> u64 {
        c.nodes.iter().map(|n| calls(n.port, "evalsha")).sum()
    };
    let before = scripts(&cluster);
    for (i, k) in keys.iter().enumerate() {
        match begin(&store, k, None).await {
            Claim::Replay(replay) => {
                assert_eq!(replay.outcome.bytes(), &Bytes::from(format!("em_{i}")));
            }
            other => panic!("{k}: {other:?}"),
        }
    }
    assert_eq!(scripts(&cluster) - before, 0, "a replay ran the script");
    assert!(matches!(
        begin(&store, &key("fresh"), None).await,
        Claim::Reserved { .. }
    ));
}
