//! Coalescing (issue 51 item 4): concurrent `begin`s queued behind the two running ones go
//! out as one statement. Each test builds its store on a pool of one connection and holds
//! that connection while the calls arrive: the first two calls take the two places and wait
//! for the connection, the rest queue, and releasing it lets everything go at once, so what
//! queued is known, not a matter of timing.

mod support;

use idemkit_test::{reserved, spawn_begin, unique_keys as keys};

use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, OwnerToken, Ownership, ResultKind, StorageKey, Store,
};
use idemkit_mysql::MySqlStore;
use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::pool::PoolConnection;

const TABLE: &str = "idemkit_test_records";

/// A store on a pool of one connection, that connection held, and a second pool to look at
/// the table with.
async fn held(coalesce: bool) -> Option<(MySqlStore, PoolConnection<sqlx::MySql>, MySqlPool)> {
    // Migrated through the shared pool, so the one connection is free to be held.
    let look = support::store().await?.pool().clone();
    let one = pool_of(1).await;
    let store = MySqlStore::builder()
        .table(TABLE)
        .recheck(Duration::from_secs(60))
        .coalesce(coalesce)
        .build(one.clone())
        .unwrap();
    let conn = one.acquire().await.unwrap();
    Some((store, conn, look))
}

/// A pool of its own with `n` connections, for the store under test.
async fn pool_of(n: u32) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(n)
        .test_before_acquire(false)
        .connect(&support::url())
        .await
        .unwrap()
}

/// Lets the spawned calls reach their lane (they do no I/O before it).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// How many statements wrote the rows of `keys`: a statement reads the clock once for all
/// its rows.
async fn distinct_clocks(look: &MySqlPool, keys: &[StorageKey]) -> i64 {
    let marks = vec!["?"; keys.len()].join(", ");
    let sql = format!("SELECT COUNT(DISTINCT created_us) FROM {TABLE} WHERE `key` IN ({marks})");
    let mut q = sqlx::query_scalar(&sql);
    for k in keys {
        q = q.bind(k.as_str());
    }
    q.fetch_one(look).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_begins_go_out_as_one_statement_and_a_store_without_coalescing_sends_each() {
    for coalesce in [true, false] {
        let Some((store, conn, look)) = held(coalesce).await else {
            return;
        };
        let keys = keys("one-statement", 12);
        let calls: Vec<_> = keys
            .iter()
            .map(|k| spawn_begin(&store, k, OwnerToken::random()))
            .collect();
        settle().await;
        drop(conn);
        let mut tokens = Vec::new();
        for (call, k) in calls.into_iter().zip(&keys) {
            let lease = reserved(call.await.unwrap());
            // The row holds the token its caller was given.
            let record = store.get(k).await.unwrap().expect("reserved");
            assert_eq!(record.fencing, lease.fencing, "{k}");
            tokens.push(lease.fencing);
        }
        let clocks = distinct_clocks(&look, &keys).await;
        if coalesce {
            assert_eq!(clocks, 3, "two lone begins and one batch");
        } else {
            assert_eq!(clocks, 12, "one statement per begin");
        }
    }
}

/// A batch reserves absent keys only: every other key in it (a live row of another owner,
/// the caller's own reservation sent again, a completed record, an expired row) is answered
/// exactly as the single statement answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_every_other_row_as_a_single_begin_does() {
    let Some((store, conn, _look)) = held(true).await else {
        return;
    };
    drop(conn);
    let ks = keys("mixed", 8);
    let lease = Duration::from_secs(30);
    // keys 0-3 fresh; 4: another owner's live reservation; 5: the caller's own (sent again
    // with the same owner); 6: a completed record; 7: an expired reservation.
    let other = reserved(
        store
            .begin(&BeginRequest::new(&ks[4], OwnerToken::random(), lease))
            .await,
    );
    let own_owner = OwnerToken::random();
    let own = reserved(
        store
            .begin(&BeginRequest::new(&ks[5], own_owner, lease))
            .await,
    );
    let done = reserved(
        store
            .begin(&BeginRequest::new(&ks[6], OwnerToken::random(), lease))
            .await,
    );
    store
        .complete(
            &ks[6],
            &done,
            &CompleteRequest::new(
                ResultKind::Value,
                Bytes::from_static(b"em_6"),
                Duration::from_secs(60),
            ),
        )
        .await
        .unwrap();
    let expired = reserved(
        store
            .begin(&BeginRequest::new(
                &ks[7],
                OwnerToken::random(),
                Duration::from_millis(3),
            ))
            .await,
    );
    while store.get(&ks[7]).await.unwrap().is_some() {
        tokio::task::yield_now().await;
    }

    let own_until = store
        .get(&ks[5])
        .await
        .unwrap()
        .expect("reserved")
        .expires_at_ms;

    // Hold the store's one connection again so that the calls queue, then let them go.
    let conn = store.pool().acquire().await.unwrap();
    let fill: Vec<_> = keys("mixed-fill", 2)
        .iter()
        .map(|k| spawn_begin(&store, k, OwnerToken::random()))
        .collect();
    settle().await;
    let owners: Vec<OwnerToken> = (0..8)
        .map(|i| {
            if i == 5 {
                own_owner
            } else {
                OwnerToken::random()
            }
        })
        .collect();
    let calls: Vec<_> = ks
        .iter()
        .zip(&owners)
        .map(|(k, o)| spawn_begin(&store, k, *o))
        .collect();
    settle().await;
    drop(conn);
    for f in fill {
        reserved(f.await.unwrap());
    }
    let mut claims = Vec::new();
    for c in calls {
        claims.push(c.await.unwrap().unwrap());
    }
    for (i, claim) in claims.iter().enumerate().take(4) {
        assert!(
            matches!(
                claim,
                Claim::Reserved {
                    took_over: false,
                    ..
                }
            ),
            "{i}: {claim:?}"
        );
    }
    assert!(
        matches!(&claims[4], Claim::InFlight { fencing, .. } if *fencing == other.fencing),
        "{:?}",
        claims[4]
    );
    assert!(
        matches!(&claims[5], Claim::Reserved { ownership, .. } if *ownership == own),
        "the caller's own reservation, sent again: {:?}",
        claims[5]
    );
    // ... and its lease runs from the second `begin`, as its caller counts it.
    let renewed = store
        .get(&ks[5])
        .await
        .unwrap()
        .expect("reserved")
        .expires_at_ms;
    assert!(
        renewed > own_until,
        "not renewed: {own_until} then {renewed}"
    );
    assert!(
        matches!(&claims[6], Claim::Replay(r) if r.outcome.bytes() == &Bytes::from_static(b"em_6")),
        "{:?}",
        claims[6]
    );
    match &claims[7] {
        Claim::Reserved {
            ownership,
            took_over,
        } => {
            assert!(
                *took_over,
                "an expired reservation is taken over, and said so"
            );
            assert!(ownership.fencing > expired.fencing);
        }
        other => panic!("expired: {other:?}"),
    }
}

/// Queued completions go out as one statement: each row takes its own result, a stale owner
/// in the batch is refused (`LeaseLost`) and every other completion in it still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_completions_store_each_result_and_refuse_a_stale_owner() {
    let Some((store, conn, look)) = held(true).await else {
        return;
    };
    drop(conn);
    let keys = keys("complete-batch", 8);
    let mut owners = Vec::new();
    for k in &keys {
        owners.push(reserved(
            spawn_begin(&store, k, OwnerToken::random()).await.unwrap(),
        ));
    }
    // First with key 7's completion from a stale owner among the others' first
    // completions; then every completion again, key 7's from its real owner.
    for stale in [Some(7), None] {
        let conn = store.pool().acquire().await.unwrap();
        let mut owners = owners.clone();
        if let Some(i) = stale {
            // A fencing token not the row's: another owner's lease, long lost.
            owners[i] = Ownership::new(owners[i].owner, idemkit_core::FencingToken::new(1));
        }
        let calls: Vec<_> = keys
            .iter()
            .zip(&owners)
            .enumerate()
            .map(|(i, (k, o))| {
                let (store, key, o) = (store.clone(), k.clone(), *o);
                tokio::spawn(async move {
                    let req = CompleteRequest::new(
                        ResultKind::Value,
                        Bytes::from(format!("em_{i}")),
                        Duration::from_secs(60 + i as u64),
                    );
                    store.complete(&key, &o, &req).await
                })
            })
            .collect();
        settle().await;
        drop(conn);
        for (i, call) in calls.into_iter().enumerate() {
            let done = call.await.unwrap();
            if Some(i) == stale {
                assert!(done.unwrap_err().is_lease_lost(), "{i}");
            } else {
                // The second round completes again what the first completed: a retried
                // completion, success.
                done.unwrap();
            }
        }
        for (i, k) in keys.iter().enumerate() {
            let record = store.get(k).await.unwrap().expect("a row");
            match record.state {
                idemkit_core::RecordState::Completed(res) => {
                    assert_ne!(Some(i), stale, "the stale owner completed key {i}");
                    assert_eq!(res.bytes(), format!("em_{i}").as_bytes(), "key {i}");
                }
                idemkit_core::RecordState::Reserved if Some(i) == stale => {}
                other => panic!("key {i}: {other:?}"),
            }
        }
        if stale.is_none() {
            // Each row its own TTL: 60 s plus its index.
            let marks = vec!["?"; keys.len()].join(", ");
            let sql = format!(
                "SELECT COUNT(DISTINCT expires_us - created_us) FROM {TABLE} WHERE `key` IN ({marks})"
            );
            let mut q = sqlx::query_scalar::<_, i64>(&sql);
            for k in &keys {
                q = q.bind(k.as_str());
            }
            assert_eq!(q.fetch_one(&look).await.unwrap(), keys.len() as i64);
        }
    }
}

/// A row lock held by another transaction stalls only its own key's call, not the batch it
/// was queued with: the batch's statement gives up on the lock after its bound (one second),
/// every caller of the batch sends its call alone, the fresh keys are reserved, and the
/// locked key's own statement waits for the lock (the server's usual wait), then takes the
/// expired reservation over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_lock_stalls_only_its_own_key_not_the_batch() {
    let Some(shared) = support::store().await else {
        return;
    };
    let look = shared.pool().clone();
    // Four connections, so the locked key's lone statement, waiting on the lock, leaves
    // the fresh keys' lone statements the others.
    let four = pool_of(4).await;
    let store = MySqlStore::builder()
        .table(TABLE)
        .recheck(Duration::from_secs(60))
        .build(four.clone())
        .unwrap();
    // An expired reservation of the locked key, locked by a transaction of its own.
    let locked = idemkit_test::unique_key("row-lock-locked");
    reserved(
        shared
            .begin(&BeginRequest::new(
                &locked,
                OwnerToken::random(),
                Duration::from_millis(1),
            ))
            .await,
    );
    let mut holder = look.begin().await.unwrap();
    loop {
        let expired: i64 = sqlx::query_scalar(&format!(
            "SELECT CAST(expires_us <= {now} AS SIGNED) FROM {TABLE} WHERE `key` = ? FOR UPDATE",
            now = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
        ))
        .bind(locked.as_str())
        .fetch_one(&mut *holder)
        .await
        .unwrap();
        if expired == 1 {
            break;
        }
    }
    // Every connection of the store's pool held: the first two calls take the two places
    // and wait for one, the locked key and the rest queue for one batch.
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(four.acquire().await.unwrap());
    }
    let fresh = keys("row-lock-fresh", 12);
    let mut calls: Vec<_> = fresh[..2]
        .iter()
        .map(|k| spawn_begin(&store, k, OwnerToken::random()))
        .collect();
    settle().await;
    let stalled = spawn_begin(&store, &locked, OwnerToken::random());
    calls.extend(
        fresh[2..]
            .iter()
            .map(|k| spawn_begin(&store, k, OwnerToken::random())),
    );
    settle().await;
    drop(conns);
    for (i, call) in calls.into_iter().enumerate() {
        // A bound for a hang only: the batch gives up on the lock after one second.
        let claim = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .unwrap_or_else(|_| panic!("fresh key {i} waited on another key's row lock"));
        reserved(claim.unwrap());
    }
    assert!(
        !stalled.is_finished(),
        "the locked key's begin went past the lock"
    );
    holder.commit().await.unwrap();
    // Its own call then takes the expired reservation over.
    reserved(stalled.await.unwrap());
}
