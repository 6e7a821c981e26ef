//! The transactional call on MySQL/MariaDB: the database effect and its idempotency record
//! commit or roll back together; under every isolation level (REPEATABLE READ, InnoDB's
//! default, with a snapshot older than the reservation and renewals committed outside the
//! transaction); what a concurrent duplicate sees while the first transaction is open.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{
    Coordinator, Error, InFlight, Key, Operation, Phase, Policy, Receipt, Source, StorageKey, Store,
};
use idemkit_mysql::{InTransaction, MySqlStore};
use sqlx::Connection as _;

async fn setup() -> Option<(MySqlStore, Coordinator<MySqlStore>)> {
    let store = support::store().await?;
    support::ledger(store.pool()).await;
    let c = Coordinator::new(store.clone());
    Some((store, c))
}

fn op() -> Operation {
    Operation::new("ledger.credit").unwrap()
}

/// One delivery: a transaction, the call crediting `order`, the commit.
async fn deliver(
    store: &MySqlStore,
    c: &Coordinator<MySqlStore>,
    key: &Key,
    order: &str,
) -> Receipt<i64> {
    let mut tx = store.pool().begin().await.unwrap();
    let o = order.to_owned();
    let r = c
        .call(&op(), key)
        .in_transaction(&mut tx)
        .run(|conn, _| Box::pin(async move { support::credit(conn, &o).await }))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_call_is_replayed_and_its_effect_written_once() {
    let Some((store, c)) = setup().await else {
        return;
    };
    let order = support::order("commit");
    let key = Key::new(&order).unwrap();
    let mut ids = Vec::new();
    for delivery in 0..3 {
        let r = deliver(&store, &c, &key, &order).await;
        let want = if delivery == 0 {
            Source::Fresh
        } else {
            Source::Replayed
        };
        assert_eq!(r.source, want);
        ids.push(r.value);
    }
    assert!(ids.iter().all(|&id| id == ids[0]), "{ids:?}");
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 1);
}

/// Rolled back after the call returned: neither the effect nor the record exists, and the
/// next delivery (once the reservation's lease ends) runs the action again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_call_leaves_nothing_and_runs_again() {
    let Some((store, _)) = setup().await else {
        return;
    };
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(Duration::from_millis(300)))
        .build();
    let order = support::order("rollback");
    let key = Key::new(&order).unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    let o = order.clone();
    let first = c
        .call(&op(), &key)
        .in_transaction(&mut tx)
        .run(|conn, _| Box::pin(async move { support::credit(conn, &o).await }))
        .await
        .unwrap();
    assert_eq!(first.source, Source::Fresh);
    tx.rollback().await.unwrap();
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = deliver(&store, &c, &key, &order).await;
    assert_eq!(second.source, Source::Fresh);
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 1);
}

/// The action failed after its write: its key is released, its write rolled back, and the
/// transaction left read-only, so a later write fails and a caller that commits anyway
/// commits nothing. Before the read-only step, a write after the failed call committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_error_rolls_the_effect_back_and_leaves_the_transaction_read_only() {
    let Some((store, c)) = setup().await else {
        return;
    };
    let order = support::order("poison");
    let key = Key::new(&order).unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    let o = order.clone();
    let r = c
        .call(&op(), &key)
        .in_transaction(&mut tx)
        .run(|conn, _| {
            Box::pin(async move {
                support::credit(conn, &o).await?;
                Err::<i64, sqlx::Error>(sqlx::Error::Protocol("downstream refused".into()))
            })
        })
        .await;
    assert!(matches!(r, Err(Error::Action(_))), "{r:?}");
    let later = support::credit(&mut tx, &order).await;
    assert!(later.is_err(), "a write after the failed call: {later:?}");
    tx.commit().await.unwrap();
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 0);
    assert!(
        store
            .get(&StorageKey::new(&op(), None, &key))
            .await
            .unwrap()
            .is_none()
    );
}

/// The action outlived its lease (renewals stopped by `max_hold`, a duplicate takes the key
/// over): the completion in the transaction is refused, the call fails with a
/// Complete-phase store error, and the effect does not commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_fails_the_call_and_rolls_the_effect_back() {
    let Some((store, _)) = setup().await else {
        return;
    };
    let c = Coordinator::builder(store.clone())
        .policy(
            Policy::default()
                .lease(Duration::from_millis(200))
                .max_hold(Duration::from_millis(50)),
        )
        .build();
    let order = support::order("lost");
    let key = Key::new(&order).unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    let o = order.clone();
    // The successor with the default policy: only the first owner's lease is short (under
    // load a 200 ms lease could also end between the successor's own begin and completion,
    // and the replay below would find nothing: a failed run of two suites at once).
    let (c2, k2) = (Coordinator::new(store.clone()), key.clone());
    let r = c
        .call(&op(), &key)
        .in_transaction(&mut tx)
        .run(|conn, attempt| {
            Box::pin(async move {
                support::credit(conn, &o).await?;
                attempt.lease_lost().await;
                tokio::time::sleep(Duration::from_millis(250)).await;
                let taken = c2
                    .call(&op(), &k2)
                    .run(|_| async { Ok::<i64, std::io::Error>(-7) })
                    .await
                    .unwrap();
                assert_eq!(taken.source, Source::Fresh);
                assert!(taken.stored, "the successor's result is stored");
                Ok::<i64, sqlx::Error>(1)
            })
        })
        .await;
    assert!(
        matches!(&r, Err(Error::Store { phase: Phase::Complete, source }) if source.is_lease_lost()),
        "{r:?}"
    );
    tx.commit().await.unwrap();
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 0);
    let replay = c
        .call(&op(), &key)
        .run(|_| async { Ok::<i64, std::io::Error>(0) })
        .await
        .unwrap();
    assert_eq!(replay.value, -7, "the successor's record stands");
}

/// Under each isolation level, REPEATABLE READ first: the transaction's snapshot is taken
/// (a first consistent read) before the reservation, and the action outlives three renewals
/// committed outside the transaction; the completion in the transaction still sees its
/// reservation, commits with the effect, and the next delivery replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_isolation_level_completes_over_an_older_snapshot_and_renewals() {
    let Some((store, _)) = setup().await else {
        return;
    };
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(Duration::from_millis(300)))
        .build();
    for level in [
        "REPEATABLE READ",
        "READ COMMITTED",
        "SERIALIZABLE",
        "READ UNCOMMITTED",
    ] {
        let order = support::order("isolation");
        let key = Key::new(&order).unwrap();
        let mut conn = store.pool().acquire().await.unwrap().detach();
        sqlx::query(&format!("SET SESSION TRANSACTION ISOLATION LEVEL {level}"))
            .execute(&mut conn)
            .await
            .unwrap();
        let mut tx = conn.begin().await.unwrap();
        // The snapshot, before the reservation (a consistent read of any table fixes it).
        let _: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM idemkit_test_ledger WHERE order_id = ?")
                .bind(&order)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
        let o = order.clone();
        let r = c
            .call(&op(), &key)
            .in_transaction(&mut tx)
            .run(|conn, _| {
                Box::pin(async move {
                    let id = support::credit(conn, &o).await?;
                    // Three renewals (every third of the lease) commit meanwhile.
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    Ok::<i64, sqlx::Error>(id)
                })
            })
            .await
            .unwrap_or_else(|e| panic!("{level}: {e:?}"));
        assert_eq!(r.source, Source::Fresh, "{level}");
        tx.commit().await.unwrap();
        conn.close().await.unwrap();
        let again = deliver(&store, &c, &key, &order).await;
        assert_eq!(
            (again.value, again.source),
            (r.value, Source::Replayed),
            "{level}"
        );
        assert_eq!(
            support::ledger_rows(store.pool(), &order).await,
            1,
            "{level}"
        );
    }
}

/// While the first transaction is open, a concurrent duplicate in reject mode is told to
/// come back, and one in wait mode waits (re-reading the row) and, once the first commits,
/// replays its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_duplicate_waits_for_the_commit_or_is_rejected() {
    let Some((store, c)) = setup().await else {
        return;
    };
    let order = support::order("dup");
    let key = Key::new(&order).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (in_action_tx, in_action) = tokio::sync::oneshot::channel();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (store, c, order, key, runs) = (
            store.clone(),
            c.clone(),
            order.clone(),
            key.clone(),
            runs.clone(),
        );
        tokio::spawn(async move {
            let mut tx = store.pool().begin().await.unwrap();
            let r = c
                .call(&op(), &key)
                .in_transaction(&mut tx)
                .run(|conn, _| {
                    Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let id = support::credit(conn, &order).await?;
                        let _ = in_action_tx.send(());
                        let _ = go.await;
                        Ok::<i64, sqlx::Error>(id)
                    })
                })
                .await
                .unwrap();
            // Still open after the call returned: the duplicate must not replay yet.
            tokio::time::sleep(Duration::from_millis(300)).await;
            tx.commit().await.unwrap();
            r.value
        })
    };
    in_action.await.unwrap();
    let rejected = c
        .call(&op(), &key)
        .in_flight(InFlight::Reject)
        .run(|_| async { Ok::<i64, std::io::Error>(-1) })
        .await;
    assert!(
        matches!(rejected, Err(Error::InFlight { .. })),
        "{rejected:?}"
    );
    let waiter = {
        let (c, key, runs) = (c.clone(), key.clone(), runs.clone());
        tokio::spawn(async move {
            c.call(&op(), &key)
                .in_flight(InFlight::Wait)
                .run(|_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<i64, std::io::Error>(-1)
                })
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    go_tx.send(()).unwrap();
    let id = first.await.unwrap();
    let r = waiter.await.unwrap();
    assert_eq!((r.value, r.source), (id, Source::Replayed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 1);
}

/// Gap locks: a SERIALIZABLE transaction that has read the records table holds shared
/// next-key locks on it, and the reservation, made outside the transaction, waits on them:
/// the call fails with an `Unavailable` store error in its begin phase (the coordinator's
/// store timeout) and its action never runs. The same transaction without that read runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_read_of_the_records_table_blocks_its_own_reservation() {
    let Some((shared, _)) = setup().await else {
        return;
    };
    // A table of its own: the locks this test takes would block every test on the shared one.
    let table = format!("idemkit_test_gap_{:x}", fastrand::u32(..));
    let store = MySqlStore::builder()
        .table(&table)
        .build(shared.pool().clone())
        .unwrap();
    store.migrate().await.unwrap();
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().store_timeout(Duration::from_secs(1)))
        .build();
    let order = support::order("gap");
    let key = Key::new(&order).unwrap();
    let mut conn = store.pool().acquire().await.unwrap().detach();
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        .execute(&mut conn)
        .await
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = {
        let (o, ran) = (order.clone(), ran.clone());
        c.call(&op(), &key)
            .in_transaction(&mut tx)
            .run(|conn, _| {
                Box::pin(async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    support::credit(conn, &o).await
                })
            })
            .await
    };
    assert!(
        matches!(&r, Err(Error::Store { phase: Phase::Begin, source }) if source.is_unavailable()),
        "{r:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the action never ran");
    tx.rollback().await.unwrap();
    conn.close().await.unwrap();
    for t in [table.clone(), format!("{table}_fencing")] {
        sqlx::query(&format!("DROP TABLE {t}"))
            .execute(shared.pool())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_transactional_call_future_is_send() {
    fn is_send<T: Send>(_: &T) {}
    let pool = sqlx::MySqlPool::connect_lazy("mysql://root@127.0.0.1/test").unwrap();
    let store = MySqlStore::builder().build(pool).unwrap();
    let c = Coordinator::new(store.clone());
    let (op, key) = (op(), Key::new("k").unwrap());
    let f = async move {
        let mut tx = store.pool().begin().await.unwrap();
        let _ = c
            .call(&op, &key)
            .in_transaction(&mut tx)
            .run(|conn, _| Box::pin(async move { support::credit(conn, "o").await }))
            .await;
    };
    is_send(&f);
}

/// Review M4 (of `e047556`): the completion in the transaction waits on a row lock past
/// `store_timeout`, so the coordinator drops it mid-statement. The call fails in the
/// Complete phase, and the transaction must still be rolled back and read-only: a later write
/// fails (error 1792) and a `COMMIT` commits nothing.
///
/// Before: the dropped completion took the connection with it, the call could not roll the
/// transaction back, the later write succeeded and the commit committed the action's ledger
/// row without its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_times_out_still_rolls_back_and_spoils_the_transaction() {
    let Some((store, _)) = setup().await else {
        return;
    };
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().store_timeout(Duration::from_millis(200)))
        .build();
    let order = support::order("complete-timeout");
    let key = Key::new(&order).unwrap();
    let storage = StorageKey::new(&op(), None, &key);
    let mut tx = store.pool().begin().await.unwrap();
    let (o, pool, k) = (
        order.clone(),
        store.pool().clone(),
        storage.as_str().to_owned(),
    );
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let (locked_tx, locked) = tokio::sync::oneshot::channel();
    let blocker = tokio::spawn(async move {
        // Another session locks the key's row (once it is reserved: the action asks) from
        // just before the action returns until the completion has long given up (its
        // `store_timeout` is 200 ms).
        go.await.unwrap();
        let mut other = pool.begin().await.unwrap();
        sqlx::query("SELECT 1 FROM idemkit_test_records WHERE `key` = ? FOR UPDATE")
            .bind(k.as_bytes())
            .fetch_optional(&mut *other)
            .await
            .unwrap();
        locked_tx.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        other.commit().await.unwrap();
    });
    let r = c
        .call(&op(), &key)
        .in_transaction(&mut tx)
        .run(|conn, _| {
            Box::pin(async move {
                let id = support::credit(conn, &o).await?;
                go_tx.send(()).unwrap();
                locked.await.unwrap();
                Ok::<i64, sqlx::Error>(id)
            })
        })
        .await;
    assert!(
        matches!(
            &r,
            Err(Error::Store {
                phase: Phase::Complete,
                ..
            })
        ),
        "{r:?}"
    );
    let later = support::credit(&mut tx, &order).await;
    assert!(
        later.is_err(),
        "a write after the failed completion went into the transaction: {later:?}"
    );
    tx.commit().await.unwrap();
    blocker.await.unwrap();
    assert_eq!(
        support::ledger_rows(store.pool(), &order).await,
        0,
        "the action's effect committed without its record"
    );
}

/// Review L3 (of `e047556`): MySQL cannot roll back only the action's writes, so a call that
/// fails after its action rolls back the caller's whole transaction, what it wrote before
/// the call too (as `TxCall` documents), and the caller's commit then commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_call_rolls_back_the_whole_transaction_as_documented() {
    let Some((store, c)) = setup().await else {
        return;
    };
    let (before, order) = (support::order("before-call"), support::order("whole-tx"));
    let key = Key::new(&order).unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    support::credit(&mut tx, &before).await.unwrap();
    let o = order.clone();
    let r = c
        .call(&op(), &key)
        .in_transaction(&mut tx)
        .run(|conn, _| {
            Box::pin(async move {
                support::credit(conn, &o).await?;
                Err::<i64, sqlx::Error>(sqlx::Error::Protocol("downstream refused".into()))
            })
        })
        .await;
    assert!(matches!(r, Err(Error::Action(_))), "{r:?}");
    tx.commit().await.unwrap();
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 0);
    assert_eq!(
        support::ledger_rows(store.pool(), &before).await,
        0,
        "the write made before the call is rolled back with the transaction"
    );
}
