//! Coalescing: concurrent `begin`s (and `complete`s) queued behind the two running ones go
//! out as one statement. Each test builds its store on a pool of one connection and holds
//! that connection while the calls arrive: the first two calls take the two slots and wait
//! for the connection, the rest queue, and releasing it lets everything go at once, so
//! what queued is known, not a matter of timing.

mod support;

use idemkit_test::{reserved, spawn_begin, unique_keys as keys};

use std::time::Duration;

use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, OwnerToken, Ownership, RecordState, ResultKind,
    StorageKey, Store, StoreErrorKind,
};
use idemkit_postgres::PgStore;
use sqlx::PgPool;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPoolOptions;

/// A store on a pool of one connection, that connection held, and a second pool to look
/// at the table with.
async fn held(coalesce: bool) -> Option<(PgStore, PoolConnection<sqlx::Postgres>, PgPool)> {
    let look = support::pool().await?;
    // Migrated through the other pool, so the one connection is free to be held.
    support::store().await?;
    let one = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&support::url())
        .await
        .unwrap();
    let store = PgStore::builder()
        .schema("idemkit_test")
        .table("records")
        .recheck(Duration::from_secs(60))
        .coalesce(coalesce)
        .build(one.clone())
        .unwrap();
    let conn = one.acquire().await.unwrap();
    Some((store, conn, look))
}

/// Lets the spawned calls reach their lane (they do no I/O before it).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

async fn distinct_clocks(look: &PgPool, keys: &[StorageKey]) -> i64 {
    let keys: Vec<&str> = keys.iter().map(StorageKey::as_str).collect();
    sqlx::query_scalar(
        "SELECT count(DISTINCT created_at) FROM idemkit_test.records WHERE key = ANY($1)",
    )
    .bind(&keys)
    .fetch_one(look)
    .await
    .unwrap()
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
        for call in calls {
            reserved(call.await.unwrap());
        }
        // A statement reads the clock once for all its rows (`begin_many`'s `now`): two
        // calls sent alone, then one batch of the ten that queued.
        let clocks = distinct_clocks(&look, &keys).await;
        if coalesce {
            assert_eq!(clocks, 3, "two lone begins and one batch");
        } else {
            assert_eq!(clocks, 12, "one statement per begin");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_call_whose_caller_left_is_never_sent() {
    let Some((store, conn, look)) = held(true).await else {
        return;
    };
    let keys = keys("caller-left", 8);
    // The first two take the slots (and wait for the connection); the rest queue.
    let mut calls: Vec<_> = keys[..2]
        .iter()
        .map(|k| spawn_begin(&store, k, OwnerToken::random()))
        .collect();
    settle().await;
    calls.extend(
        keys[2..]
            .iter()
            .map(|k| spawn_begin(&store, k, OwnerToken::random())),
    );
    settle().await;
    // The callers of the last four (queued) give up, as a timeout would drop them.
    for call in &calls[4..] {
        call.abort();
    }
    settle().await;
    drop(conn);
    for (i, call) in calls.into_iter().enumerate() {
        match call.await {
            Ok(claim) => {
                assert!(i < 4, "call {i} was aborted");
                reserved(claim);
            }
            Err(e) => assert!(e.is_cancelled() && i >= 4, "call {i}: {e}"),
        }
    }
    for (i, key) in keys.iter().enumerate() {
        let held = store.get(key).await.unwrap().is_some();
        assert_eq!(held, i < 4, "key {i}: reserved for nobody");
    }
    assert_eq!(distinct_clocks(&look, &keys[..4]).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_in_the_queue_are_answered_one_after_the_other() {
    let Some((store, conn, _look)) = held(true).await else {
        return;
    };
    let fill = keys("dup-fill", 2);
    let key = &keys("dup", 1)[0];
    let mut calls: Vec<_> = fill
        .iter()
        .map(|k| spawn_begin(&store, k, OwnerToken::random()))
        .collect();
    settle().await;
    // Three callers of one key, queued together: one statement cannot reserve a row twice.
    let dups: Vec<_> = (0..3)
        .map(|_| spawn_begin(&store, key, OwnerToken::random()))
        .collect();
    settle().await;
    drop(conn);
    for call in calls.drain(..) {
        reserved(call.await.unwrap());
    }
    let mut claims = Vec::new();
    for call in dups {
        claims.push(call.await.unwrap().unwrap());
    }
    let won = claims
        .iter()
        .filter(|c| matches!(c, Claim::Reserved { .. }))
        .count();
    let waiting = claims
        .iter()
        .filter(|c| matches!(c, Claim::InFlight { .. }))
        .count();
    assert_eq!((won, waiting), (1, 2), "{claims:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_gives_every_caller_its_typed_error() {
    let Some(look) = support::pool().await else {
        return;
    };
    let schema = format!("idemkit_nomigrate_{:x}", fastrand::u32(..));
    let one = PgPoolOptions::new()
        .max_connections(1)
        .connect(&support::url())
        .await
        .unwrap();
    // Never migrated: every statement fails, the batch's as well as the lone ones'.
    let store = PgStore::builder()
        .schema(&schema)
        .build(one.clone())
        .unwrap();
    let conn = one.acquire().await.unwrap();
    let keys = keys("failed-batch", 6);
    let calls: Vec<_> = keys
        .iter()
        .map(|k| spawn_begin(&store, k, OwnerToken::random()))
        .collect();
    settle().await;
    drop(conn);
    for call in calls {
        let e = call.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Rejected, "{e}");
        assert!(e.to_string().contains("migrate()"), "{e}");
    }
    drop(look);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_completions_store_wake_their_waiters_and_refuse_a_stale_owner() {
    let Some((store, conn, _look)) = held(true).await else {
        return;
    };
    drop(conn);
    let keys = keys("complete-batch", 6);
    let mut owners = Vec::new();
    for k in &keys {
        owners.push(reserved(
            spawn_begin(&store, k, OwnerToken::random()).await.unwrap(),
        ));
    }
    // A waiter on key 2 (through a store of its own pool, as another process's), which
    // only a notification wakes within the test (re-check 60 s).
    let other = PgStore::builder()
        .schema("idemkit_test")
        .table("records")
        .recheck(Duration::from_secs(60))
        .build(support::pool().await.unwrap())
        .unwrap();
    let waiter = {
        let (other, key, seen) = (other.clone(), keys[2].clone(), owners[2].fencing);
        tokio::spawn(async move { other.wait(&key, seen, Duration::from_secs(60)).await })
    };
    // Until it has flagged the row (its completion must notify).
    for _ in 0..100 {
        if other.waiting_keys() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    settle().await;
    let conn = store.pool().acquire().await.unwrap();
    // Key 5's completion comes from a stale owner (a fencing token not the row's).
    owners[5] = Ownership::new(owners[5].owner, idemkit_core::FencingToken::new(1));
    let calls: Vec<_> = keys
        .iter()
        .zip(&owners)
        .map(|(k, o)| {
            let (store, key, o) = (store.clone(), k.clone(), *o);
            tokio::spawn(async move {
                let req = CompleteRequest::new(
                    ResultKind::Value,
                    bytes::Bytes::from_static(b"done"),
                    Duration::from_secs(60),
                );
                store.complete(&key, &o, &req).await
            })
        })
        .collect();
    settle().await;
    drop(conn);
    for (i, call) in calls.into_iter().enumerate() {
        let done = call.await.unwrap();
        if i == 5 {
            assert!(done.unwrap_err().is_lease_lost());
        } else {
            done.unwrap();
        }
    }
    tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter was not notified")
        .unwrap()
        .unwrap();
    for (i, k) in keys.iter().enumerate() {
        let state = store.get(k).await.unwrap().unwrap().state;
        assert_eq!(
            matches!(state, RecordState::Completed(_)),
            i != 5,
            "key {i}: {state:?}"
        );
    }
}

/// Review M1 (of `e047556`), the Redis coalescer's wedge in PostgreSQL's: a call holding a
/// slot ends on a runtime that is being dropped, and the batch task its slot hands over to
/// (spawned on that runtime) is dropped before its first poll. Each round leaks one slot
/// without the fix; after two, nothing is ever sent again.
///
/// Before: the task's guard was built inside the task, at its first poll, so the slot was
/// never freed and this test's last `begin` waited for ever (its timeout here).
#[test]
fn a_batch_task_dropped_before_its_first_poll_gives_its_slot_back() {
    use std::future::Future;
    use std::task::Poll;

    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let Some((store, conn, _look)) = main.block_on(held(true)) else {
        return;
    };
    let keys = keys("unpolled-batch", 13);
    let reqs: Vec<_> = keys
        .iter()
        .map(|k| BeginRequest::new(k, OwnerToken::random(), Duration::from_secs(30)))
        .collect();
    let mut next = reqs.iter();
    for _ in 0..4 {
        let doomed = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (a, b, c) = (
            next.next().unwrap(),
            next.next().unwrap(),
            next.next().unwrap(),
        );
        doomed.block_on(async {
            // `a` and `b` take the two slots (and wait for the held connection), `c` queues.
            let mut calls = [
                Some(Box::pin(store.begin(a))),
                Some(Box::pin(store.begin(b))),
                Some(Box::pin(store.begin(c))),
            ];
            std::future::poll_fn(|cx| {
                for call in calls.iter_mut().flatten() {
                    let _ = call.as_mut().poll(cx);
                }
                Poll::Ready(())
            })
            .await;
            // `a` goes first, while `c` still waits: its slot hands `c`'s batch to a task
            // on this runtime, which `block_on` returns before polling.
            for call in &mut calls {
                drop(call.take());
            }
        });
        drop(doomed);
    }
    // sqlx gives a connection back from a task of the runtime it is dropped in.
    main.block_on(async { drop(conn) });
    let last = next.next().unwrap();
    let later = main
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), store.begin(last)).await });
    assert!(
        matches!(later, Ok(Ok(Claim::Reserved { .. }))),
        "the begin lane is wedged: {later:?}"
    );
}

/// Review M2 (of `e047556`): a coalesced batch meets a row another transaction holds (an
/// expired reservation locked `FOR UPDATE`, as a transactional call's completion or a
/// caller's own lock would). The batch's statement gives up after its bound and each call
/// goes alone: the fresh keys queued with it are reserved while the lock is still held, and
/// only the locked key's own call waits for it.
///
/// Before: the batch statement waited on the lock with every caller in it, and the lane's
/// slot with it: the fresh keys waited until the holder committed (this test's timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_lock_stalls_only_its_own_key_not_the_batch() {
    let Some(look) = support::pool().await else {
        return;
    };
    support::store().await.expect("migrated");
    let four = PgPoolOptions::new()
        .max_connections(4)
        .test_before_acquire(false)
        .connect(&support::url())
        .await
        .unwrap();
    let store = PgStore::builder()
        .schema("idemkit_test")
        .table("records")
        .recheck(Duration::from_secs(60))
        .build(four.clone())
        .unwrap();
    // An expired reservation of K, locked by another transaction.
    let locked = idemkit_test::unique_key("row-lock-locked");
    reserved(
        store
            .begin(&BeginRequest::new(
                &locked,
                OwnerToken::random(),
                Duration::from_millis(1),
            ))
            .await,
    );
    let mut holder = look.begin().await.unwrap();
    loop {
        let live: bool = sqlx::query_scalar(
            "SELECT expires_at > clock_timestamp() FROM idemkit_test.records WHERE key = $1 FOR UPDATE",
        )
        .bind(locked.as_str())
        .fetch_one(&mut *holder)
        .await
        .unwrap();
        if !live {
            break;
        }
    }
    // Every connection of the store's pool held: the first two begins take the slots and
    // wait for one, the rest (K among them) queue for one batch.
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(four.acquire().await.unwrap());
    }
    let fresh = keys("row-lock-fresh", 20);
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
        let claim = tokio::time::timeout(Duration::from_secs(10), call)
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
