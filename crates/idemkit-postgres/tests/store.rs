//! PgStore beyond the conformance suite: push wake-ups through one LISTEN connection, a
//! missing table, rows written by something else, fencing after a purge, the purge.

mod support;

use std::time::Duration;

use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, Key, Operation, OwnerToken, Ownership, RawStore,
    ResultKind, StorageKey, Store, StoreErrorKind,
};
use idemkit_postgres::NameError;
use idemkit_postgres::PgStore;
use sqlx::PgPool;

fn key(name: &str) -> StorageKey {
    idemkit_test::unique_key(name)
}

async fn reserve(store: &PgStore, key: &StorageKey, lease: Duration) -> Ownership {
    match store
        .begin(&BeginRequest::new(key, OwnerToken::random(), lease))
        .await
        .unwrap()
    {
        Claim::Reserved { ownership, .. } => ownership,
        other => panic!("expected a reservation, got {other:?}"),
    }
}

/// A store whose waiters would only wake by themselves after a minute: a test that returns
/// sooner was woken by a notification.
async fn slow_recheck_store(pool: PgPool) -> PgStore {
    let store = PgStore::builder()
        .schema("idemkit_test")
        .table("records")
        .recheck(Duration::from_secs(60))
        .build(pool)
        .unwrap();
    store.migrate().await.unwrap();
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_notify_through_one_listening_connection() {
    let Some(pool) = support::pool().await else {
        return;
    };
    let app = format!("idemkit-listen-{:x}", fastrand::u64(..));
    let pool_with_name = sqlx::postgres::PgPoolOptions::new()
        .max_connections(6)
        .connect_with(
            support::url()
                .parse::<sqlx::postgres::PgConnectOptions>()
                .unwrap()
                .application_name(&app),
        )
        .await
        .unwrap();
    let store = slow_recheck_store(pool_with_name).await;
    let keys: Vec<_> = (0..3).map(|i| key(&format!("push{i}"))).collect();
    let mut waiters = Vec::new();
    let mut owners = Vec::new();
    for k in &keys {
        let lease = reserve(&store, k, Duration::from_secs(60)).await;
        owners.push(lease);
        let (store, k) = (store.clone(), k.clone());
        waiters.push(tokio::spawn(async move {
            store.wait(&k, lease.fencing, Duration::from_secs(60)).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listening: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'",
    )
    .bind(&app)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(listening, 1, "one LISTEN connection for three waiters");
    assert_eq!(store.waiting_keys(), 3);

    for (k, lease) in keys.iter().zip(&owners) {
        let done = CompleteRequest::new(ResultKind::Value, "1", Duration::from_secs(60));
        store.complete(k, lease, &done).await.unwrap();
    }
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(20), w)
            .await
            .expect("a waiter was not woken by its notification")
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        store.waiting_keys(),
        0,
        "finished waits leave no registration"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_and_a_cancelled_wait_leaves_nothing() {
    let Some(pool) = support::pool().await else {
        return;
    };
    let store = slow_recheck_store(pool).await;
    let k = key("release-wake");
    let lease = reserve(&store, &k, Duration::from_secs(60)).await;
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        store.wait(&k, lease.fencing, Duration::from_secs(60)),
    )
    .await;
    assert!(cancelled.is_err(), "the wait should still be waiting");
    assert_eq!(
        store.waiting_keys(),
        0,
        "the cancelled waiter is still registered"
    );
    let waiter = {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move { store.wait(&k, lease.fencing, Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    store.release(&k, &lease).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter was not woken by the release")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_an_error_that_names_the_migration() {
    let Some(pool) = support::pool().await else {
        return;
    };
    let store = PgStore::builder()
        .schema("idemkit_never_migrated")
        .build(pool)
        .unwrap();
    let k = key("missing");
    let err = store
        .begin(&BeginRequest::new(
            &k,
            OwnerToken::random(),
            Duration::from_secs(5),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::Rejected);
    let text = err.to_string();
    assert!(text.contains("PgStore::migrate()"), "{text}");
    assert!(
        text.contains("idemkit_never_migrated.idemkit_records"),
        "{text}"
    );
    // And through the coordinator: a typed error, the action never runs.
    let c = idemkit_core::Coordinator::new(store);
    let (op, k) = (Operation::new("op").unwrap(), Key::new("k").unwrap());
    let ran = std::sync::atomic::AtomicBool::new(false);
    let r = c
        .call(&op, &k)
        .run(|_| async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>(1)
        })
        .await;
    assert!(
        matches!(&r, Err(idemkit_core::Error::Store { source, .. }) if source.kind() == StoreErrorKind::Rejected),
        "{r:?}"
    );
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
}

/// Rows written under the table by something else (another version, garbage fields) are
/// `Corrupt` from every call, never a panic, and are not overwritten while they live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_rows_are_corrupt_not_a_panic() {
    let Some(store) = support::store().await else {
        return;
    };
    let insert = "INSERT INTO idemkit_test.records \
        (key, version, state, owner, fencing, fingerprint, created_at, expires_at, kind, result, holder) \
        VALUES ($1, $2, $3, $4, $5, $6, now(), now() + interval '1 hour', $7, $8, $9)";
    // version, state, owner, fencing, fingerprint, kind, result, holder
    type Columns = (
        i16,
        i16,
        Vec<u8>,
        i64,
        Option<Vec<u8>>,
        Option<i16>,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
    );
    let rows: &[Columns] = &[
        (2, 1, vec![1; 16], 1, None, None, None, None), // a future version
        (1, 9, vec![1; 16], 1, None, None, None, None), // an unknown state
        (1, 1, vec![1; 3], 1, None, None, None, None),  // a short owner
        (1, 1, vec![1; 16], -5, None, None, None, None), // a negative fencing token
        (1, 1, vec![1; 16], 1, Some(vec![0; 2]), None, None, None), // a short fingerprint
        (1, 2, vec![1; 16], 1, None, Some(7), Some(vec![1]), None), // an unknown result kind
        (1, 2, vec![1; 16], 1, None, Some(1), None, None), // completed without a result
        // Another's reservation whose holder column is not a holder block: the refused
        // duplicate's `begin` reads it (to point to the original) and says `Corrupt`.
        (1, 1, vec![1; 16], 1, None, None, None, Some(vec![9; 5])),
    ];
    for (version, state, owner, fencing, fp, kind, result, holder) in rows {
        let k = key("foreign");
        sqlx::query(insert)
            .bind(k.as_str())
            .bind(version)
            .bind(state)
            .bind(owner)
            .bind(fencing)
            .bind(fp)
            .bind(kind)
            .bind(result)
            .bind(holder)
            .execute(store.pool())
            .await
            .unwrap();
        let begin = store
            .begin(&BeginRequest::new(
                &k,
                OwnerToken::random(),
                Duration::from_secs(5),
            ))
            .await;
        assert_eq!(
            begin.as_ref().map_err(|e| e.kind()).unwrap_err(),
            StoreErrorKind::Corrupt,
            "{version} {state}: {begin:?}"
        );
        assert_eq!(
            store.get(&k).await.unwrap_err().kind(),
            StoreErrorKind::Corrupt
        );
        let still: i16 =
            sqlx::query_scalar("SELECT version FROM idemkit_test.records WHERE key = $1")
                .bind(k.as_str())
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(still, *version, "the foreign row was overwritten");
        assert!(store.purge(&k).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_keep_increasing_after_a_purge() {
    let Some(store) = support::store().await else {
        return;
    };
    let k = key("fence-purge");
    let first = reserve(&store, &k, Duration::from_secs(30)).await;
    assert!(store.purge(&k).await.unwrap());
    let second = reserve(&store, &k, Duration::from_secs(30)).await;
    assert!(second.fencing > first.fencing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_expired_removes_only_expired_rows_in_batches() {
    let Some(pool) = support::pool().await else {
        return;
    };
    let table = format!("purge_{:x}", fastrand::u32(..));
    let store = PgStore::builder()
        .schema("idemkit_test")
        .table(&table)
        .build(pool.clone())
        .unwrap();
    store.migrate().await.unwrap();
    for i in 0..7 {
        reserve(
            &store,
            &key(&format!("short{i}")),
            Duration::from_millis(20),
        )
        .await;
    }
    let live = key("long");
    reserve(&store, &live, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(store.purge_expired(3).await.unwrap(), 7);
    let left: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM idemkit_test.{table}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 1, "the live reservation stays");
    assert!(store.get(&live).await.unwrap().is_some());
    // The background purger does the same on its own.
    reserve(&store, &key("short-bg"), Duration::from_millis(20)).await;
    let purger = store.spawn_purger(Duration::from_millis(50), 10);
    let mut left: i64 = 2;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = sqlx::query_scalar(&format!("SELECT count(*) FROM idemkit_test.{table}"))
            .fetch_one(&pool)
            .await
            .unwrap();
        if left == 1 {
            break;
        }
    }
    drop(purger);
    assert_eq!(
        left, 1,
        "the background purger did not remove the expired row"
    );
    sqlx::query(&format!("DROP TABLE idemkit_test.{table}"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_concurrent_calls_agree() {
    let Some(store) = support::store().await else {
        return;
    };
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let s = store.clone();
            tokio::spawn(async move { s.migrate().await })
        })
        .collect();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    let applied: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idemkit_test.idemkit_migrations WHERE name = 'records'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    // Each of the records table's two migrations (the table; the holder column), once.
    assert_eq!(applied, 2);
}

/// Checked at the end, by `build` and `connect` (sqlx's `PgPoolOptions` way): `connect`
/// refuses a bad name before it connects to anything (the URL here has no server).
#[tokio::test]
async fn invalid_names_are_refused_before_any_sql() {
    for bad in [
        "",
        "Upper",
        "semi;colon",
        "quote\"d",
        "9lives",
        &"x".repeat(31),
    ] {
        let pool = PgPool::connect_lazy("postgres://postgres@127.0.0.1:1/test").unwrap();
        let e = PgStore::builder()
            .table(bad)
            .build(pool.clone())
            .unwrap_err();
        assert_eq!((e.what(), e.name()), ("table", bad));
        let e = PgStore::builder().schema(bad).build(pool).unwrap_err();
        assert_eq!((e.what(), e.name()), ("schema", bad));
        let e = PgStore::builder()
            .schema(bad)
            .connect("postgres://postgres@127.0.0.1:1/test")
            .await
            .unwrap_err();
        assert_eq!(
            e.kind(),
            StoreErrorKind::Other,
            "a name error, not an outage: {e}"
        );
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<NameError>());
        assert!(source.is_some(), "{e:?}");
    }
}

#[tokio::test]
async fn a_bad_url_and_an_unreachable_server_are_typed_errors() {
    let bad = PgStore::connect("not a url").await.unwrap_err();
    assert_eq!(bad.kind(), StoreErrorKind::Other, "{bad}");
    let down = PgStore::connect("postgres://postgres@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert_eq!(down.kind(), StoreErrorKind::Unavailable, "{down}");
}

/// `took_over` is true when `begin` replaced an expired reservation (its owner died), false
/// when it replaced an expired completed record (the retention ended) or found nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_of_an_expired_reservation_is_reported() {
    let Some(store) = support::store().await else {
        return;
    };
    let begin = |k: StorageKey| {
        let store = store.clone();
        async move {
            store
                .begin(&BeginRequest::new(
                    &k,
                    OwnerToken::random(),
                    Duration::from_millis(50),
                ))
                .await
                .unwrap()
        }
    };
    let dead = key("dead-owner");
    assert!(matches!(
        begin(dead.clone()).await,
        Claim::Reserved {
            took_over: false,
            ..
        }
    ));
    let done = key("retention-over");
    let lease = reserve(&store, &done, Duration::from_secs(5)).await;
    let short = CompleteRequest::new(ResultKind::Value, "1", Duration::from_millis(50));
    store.complete(&done, &lease, &short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(matches!(
        begin(dead).await,
        Claim::Reserved {
            took_over: true,
            ..
        }
    ));
    assert!(matches!(
        begin(done).await,
        Claim::Reserved {
            took_over: false,
            ..
        }
    ));
}

/// Issue 20, item 8: a record written by hand (`RawStore::put_raw`) with a fencing token
/// ahead of the table's sequence keeps later tokens increasing, as on every other store.
///
/// Before: `put_raw` did not advance the sequence: a record written with token 1,000,000
/// expired, and the next `begin` got a token from the sequence (in the hundreds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_written_by_hand_keeps_fencing_tokens_increasing() {
    use idemkit_core::{
        BeginRequest, Claim, FencingToken, OwnerToken, RawStore, Record, RecordState,
    };
    let Some(store) = support::store().await else {
        return;
    };
    let key = idemkit_test::unique_key("put-raw-fencing");
    let ahead: i64 = sqlx::query_scalar("SELECT last_value FROM idemkit_test.records_fencing")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let written = FencingToken::new(ahead as u64 + 1_000_000);
    let record = Record {
        state: RecordState::Reserved,
        owner: OwnerToken::random(),
        fencing: written,
        fingerprint: None,
        created_at_ms: 0,
        expires_at_ms: 0,
        holder: None,
        lease_ms: None,
    };
    store
        .put_raw(&key, record.encode().into(), Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(5));
    match store.begin(&req).await.unwrap() {
        Claim::Reserved { ownership, .. } => assert!(
            ownership.fencing > written,
            "the fencing token went backwards: {:?} after {written:?}",
            ownership.fencing
        ),
        other => panic!("{other:?}"),
    }
}

/// Review L10: a completion whose notification never went out (its call dropped, or timed
/// out, between the `UPDATE` and the `NOTIFY`, which is a statement of its own) is retried
/// (the coordinator's retry, or a dropped call's guard), and the retry, finding the row
/// completed by its own lease, wakes the waiters the row says there are.
///
/// Before: the retry answered success without notifying, and the waiter slept until its
/// re-check (here a minute; 2 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_completion_wakes_the_waiters_the_first_did_not() {
    let Some(pool) = support::pool().await else {
        return;
    };
    let store = slow_recheck_store(pool.clone()).await;
    let k = key("lost-notify");
    let lease = reserve(&store, &k, Duration::from_secs(60)).await;
    let waiter = {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move { store.wait(&k, lease.fencing, Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The first completion's UPDATE, and no NOTIFY after it.
    let updated = sqlx::query(
        "UPDATE idemkit_test.records SET state = 2, kind = $2, result = '\\x31', \
           expires_at = clock_timestamp() + interval '60 seconds' \
         WHERE key = $1 AND state = 1 RETURNING waiting",
    )
    .bind(k.as_str())
    .bind(i16::from(ResultKind::Value.to_byte()))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        sqlx::Row::get::<bool, _>(&updated, 0),
        "the waiter flagged the row"
    );
    let done = CompleteRequest::new(ResultKind::Value, "1", Duration::from_secs(60));
    store.complete(&k, &lease, &done).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the retried completion did not wake the waiter")
        .unwrap()
        .unwrap();
}
