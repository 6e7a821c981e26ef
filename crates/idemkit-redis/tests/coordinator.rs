//! The coordinator on Redis, beyond the coordinator conformance suite (tests/conformance.rs):
//! round trips counted by Redis itself, and outages of a Redis process the test owns
//! (stopped and restarted on its own port).

mod support;

use std::convert::Infallible;
use std::time::Duration;

use idemkit_core::{Coordinator, ErrorKind, Key, Operation, Source, Store};
use idemkit_redis::RedisStore;
use idemkit_test::{Mailer, assert_fails_closed_then_open};
use support::RedisProcess;

fn op() -> Operation {
    Operation::new("mail.invoice").unwrap()
}

fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_is_one_command_and_a_miss_two() {
    let server = RedisProcess::start(&[]);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let c = Coordinator::new(store);
    let mailer = Mailer::default();
    // Load the scripts first (the first call of each meets NOSCRIPT once, and the next
    // completion asks the server again whether it has `SET … IFEQ`: twice).
    for warm in ["warm-up", "warm-up-2"] {
        c.call(&op(), &key(warm))
            .run(|_| mailer.send(Duration::ZERO))
            .await
            .unwrap();
    }

    let miss = support::client_commands(server.port, async {
        let out = c
            .call(&op(), &key("k"))
            .run(|_| mailer.send(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(out.source, Source::Fresh);
    })
    .await;
    // The completion: its script, or one plain `SET … IFEQ` where the server has it
    // (Valkey 8.1 and later, Redis 8.4 and later).
    let has_ifeq = support::has_ifeq(server.port);
    assert_eq!(c.store().conditional_set(), Some(has_ifeq));
    let complete = if has_ifeq { "SET" } else { "EVALSHA" };
    assert_eq!(miss, ["EVALSHA", complete], "miss: begin + complete");

    let hit = support::client_commands(server.port, async {
        let out = c
            .call(&op(), &key("k"))
            .run(|_| mailer.send(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(out.source, Source::Replayed);
    })
    .await;
    assert_eq!(hit, ["EVALSHA"], "hit: begin only");
    assert_eq!(mailer.sent(), 2 + 1, "the two warm-ups and the miss");
}

/// Batch reservation: the 8 keys of a batch cost one round trip to reserve (a pipeline of
/// plain commands, `stamp`; then one completion each); the same batch delivered again costs
/// one round trip in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_batch_is_one_command_to_reserve_and_one_to_replay() {
    let server = RedisProcess::start(&[]);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let c = Coordinator::new(store);
    let mailer = Mailer::default();
    let keys: Vec<Key> = (0..8).map(|i| key(&format!("order-{i}"))).collect();
    // Load the scripts first (the first call of each meets NOSCRIPT once, and the next
    // completion asks the server again whether it has `SET … IFEQ`: twice).
    drop(c.prepare(&op(), &[key("warm-a"), key("warm-b")]).await);
    for warm in ["warm-up", "warm-up-2"] {
        c.call(&op(), &key(warm))
            .run(|_| mailer.send(Duration::ZERO))
            .await
            .unwrap();
    }
    let run_batch = || async {
        let prepared = c.prepare(&op(), &keys).await;
        let mut sources = Vec::new();
        for (k, p) in keys.iter().zip(prepared) {
            let out = c
                .call(&op(), k)
                .prepared(p)
                .run(|_| mailer.send(Duration::ZERO))
                .await
                .unwrap();
            sources.push(out.source);
        }
        sources
    };
    // The batch's begin: one pipeline (`stamp`), a `SET` per key between two `TIME`s.
    let pipeline: Vec<&str> = ["TIME"]
        .into_iter()
        .chain(["SET"; 8])
        .chain(["TIME"])
        .collect();
    let mut first = Vec::new();
    let stale = c.store().plain_begin_counts().stale;
    let fresh = support::client_commands(server.port, async { first = run_batch().await }).await;
    assert!(first.iter().all(|s| *s == Source::Fresh), "{first:?}");
    // The stamp not proven (a machine so busy that over 1 ms passed between stamping and
    // running) is taken again for the whole batch by one script call (`restamp_many.lua`,
    // loaded on its first use, after which the store asks again whether the server has
    // `SET … IFEQ`: at most four commands).
    let restamped = c.store().plain_begin_counts().stale > stale;
    assert_eq!(fresh[..10], pipeline[..], "{fresh:?}");
    if restamped {
        assert!(fresh.len() <= 10 + 4 + 8, "{fresh:?}");
    } else {
        assert_eq!(
            fresh.len(),
            10 + 8,
            "one pipeline and 8 completions: {fresh:?}"
        );
    }
    let mut second = Vec::new();
    let replay = support::client_commands(server.port, async { second = run_batch().await }).await;
    assert!(second.iter().all(|s| *s == Source::Replayed), "{second:?}");
    assert_eq!(replay, pipeline, "the redelivered batch: one round trip");
    assert_eq!(mailer.sent(), 2 + 8, "the two warm-ups and the batch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_server_down_fail_closed_runs_nothing_and_fail_open_runs_and_counts() {
    let mut server = RedisProcess::start(&[]);
    let store = RedisStore::builder()
        .response_timeout(Duration::from_millis(300))
        .connection_timeout(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .unwrap();
    server.stop();
    assert_fails_closed_then_open(store.clone()).await;
    let closed = Coordinator::new(store.clone());

    // Back up: the same store handle reconnects and protects again.
    server.restart();
    let out = wait_until_up(&closed, "after-restart").await;
    assert_eq!(out, Source::Fresh);
}

/// Retries a fresh call until the reconnecting store answers; returns its source.
async fn wait_until_up<S: Store>(c: &Coordinator<S>, k: &str) -> Source {
    for _ in 0..100 {
        let r = c
            .call(&op(), &key(k))
            .run(|_| async { Ok::<_, Infallible>(1) })
            .await;
        match r {
            Ok(out) => return out.source,
            Err(e) if e.kind() == ErrorKind::StoreUnavailable => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    panic!("the store did not come back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_begin_and_complete_loses_the_reservation_not_the_result() {
    let mut server = RedisProcess::start(&[]);
    let store = RedisStore::builder()
        .response_timeout(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .unwrap();
    let c = Coordinator::new(store.clone());
    let mailer = Mailer::default();
    // Scripts loaded, then the server restarts empty (no scripts, no records) mid-action.
    c.call(&op(), &key("warm-up"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    let out = c
        .call(&op(), &key("k"))
        .run(|_| async {
            server.stop();
            server.restart();
            // Let the connection notice and reconnect before completing.
            let probe = Coordinator::new(store.clone());
            wait_until_up(&probe, "probe").await;
            mailer.send(Duration::ZERO).await
        })
        .await
        .unwrap();
    // The action ran and its caller has the value; the reservation died with the server, so
    // `complete` (reloading its script after NOSCRIPT) found no lease and stored nothing.
    assert_eq!((out.value.as_str(), out.source), ("em_2", Source::Fresh));
    let sk = idemkit_core::StorageKey::new(&op(), None, &key("k"));
    assert_eq!(store.get(&sk).await.unwrap(), None);
    // The documented window: a retry runs again, and from then on replays.
    let again = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (again.value.as_str(), again.source),
        ("em_3", Source::Fresh)
    );
    let replay = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (replay.value.as_str(), replay.source),
        ("em_3", Source::Replayed)
    );
}

/// Issue 52: a duplicate refused while the original runs, on Redis, is told the original's
/// attempt and the process running it, as its reservation records them: with a lone `begin`
/// (the script) and with the plain begins of a store without coalescing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_duplicate_points_to_the_original() {
    use idemkit_core::{Error, InFlight};
    let server = RedisProcess::start(&[]);
    for coalesce in [true, false] {
        let connect = || async {
            RedisStore::builder()
                .coalesce(coalesce)
                .connect(&server.url())
                .await
                .unwrap()
        };
        let original = Coordinator::builder(connect().await)
            .holder_name("billing-worker")
            .build();
        let duplicate = Coordinator::builder(connect().await)
            .holder_name("other-worker")
            .build();
        let k = key(&format!("pointer-{coalesce}"));
        let (started, seen) = tokio::sync::oneshot::channel();
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        let owner = tokio::spawn(
            original
                .call_owned(op(), k.clone())
                .run(move |a| async move {
                    let _ = started.send(a.fencing_token());
                    let _ = finished.await;
                    Ok::<_, Infallible>("em_1".to_string())
                }),
        );
        let fencing = seen.await.unwrap().expect("a protected run");
        let dup = duplicate
            .call(&op(), &k)
            .in_flight(InFlight::Reject)
            .run(|_| async { Ok::<_, Infallible>("em_2".to_string()) })
            .await
            .unwrap_err();
        match dup {
            Error::InFlight {
                attempt, holder, ..
            } => {
                assert_eq!(attempt, Some(fencing), "coalesce {coalesce}");
                let holder = holder.expect("Redis reports the holder");
                assert_eq!(holder.name, "billing-worker", "coalesce {coalesce}");
                assert_eq!(holder.pid, std::process::id());
            }
            other => panic!("coalesce {coalesce}: {other:?}"),
        }
        finish.send(()).unwrap();
        owner.await.unwrap().unwrap();
    }
}
