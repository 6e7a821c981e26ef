//! The transactional call: the database effect and its idempotency record commit or roll
//! back together, and what a concurrent duplicate sees while the first transaction is open.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{
    Coordinator, Error, InFlight, Key, Operation, Phase, Policy, Receipt, Source, Store,
};
use idemkit_postgres::{InTransaction, PgStore};
use sqlx::PgConnection;

async fn setup() -> Option<(PgStore, Coordinator<PgStore>)> {
    let store = support::store().await?;
    support::ledger(store.pool()).await;
    let c = Coordinator::new(store.clone());
    Some((store, c))
}

fn op() -> Operation {
    Operation::new("ledger.credit").unwrap()
}

async fn credit(conn: &mut PgConnection, order: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO idemkit_test.ledger (order_id, amount) VALUES ($1, 100) RETURNING id",
    )
    .bind(order)
    .fetch_one(conn)
    .await
}

/// One delivery: a transaction, the call crediting `order`, the commit.
async fn deliver(
    store: &PgStore,
    c: &Coordinator<PgStore>,
    key: &Key,
    order: &str,
) -> Receipt<i64> {
    let mut tx = store.pool().begin().await.unwrap();
    let o = order.to_owned();
    let r = c
        .call(&op(), key)
        .in_transaction(&mut tx)
        .run(|conn, _| Box::pin(async move { credit(conn, &o).await }))
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
        assert_eq!(
            r.source,
            if delivery == 0 {
                Source::Fresh
            } else {
                Source::Replayed
            }
        );
        ids.push(r.value);
    }
    assert!(ids.iter().all(|&id| id == ids[0]), "{ids:?}");
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 1);
    // An ordinary call replays the committed result too.
    let plain = c
        .call(&op(), &key)
        .run(|_| async { Ok::<i64, std::io::Error>(-1) })
        .await
        .unwrap();
    assert_eq!((plain.value, plain.source), (ids[0], Source::Replayed));
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
        .run(|conn, _| Box::pin(async move { credit(conn, &o).await }))
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

/// A crash mid-action (the task aborted, its transaction dropped): nothing commits, and the
/// redelivery writes the effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_action_commits_nothing_and_the_redelivery_runs_once() {
    let Some((store, c)) = setup().await else {
        return;
    };
    let order = support::order("crash");
    let key = Key::new(&order).unwrap();
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let task = {
        let (store, c, order, key) = (store.clone(), c.clone(), order.clone(), key.clone());
        tokio::spawn(async move {
            let mut tx = store.pool().begin().await.unwrap();
            let _ = c
                .call(&op(), &key)
                .in_transaction(&mut tx)
                .run(|conn, _| {
                    Box::pin(async move {
                        credit(conn, &order).await?;
                        let _ = started_tx.send(());
                        std::future::pending::<()>().await;
                        Ok::<i64, sqlx::Error>(0)
                    })
                })
                .await;
        })
    };
    started.await.unwrap();
    task.abort();
    let _ = task.await;
    // The dropped call released its key; the dropped transaction rolled back.
    let r = deliver(&store, &c, &key, &order).await;
    assert_eq!(r.source, Source::Fresh);
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 1);
}

/// The action failed: its key is released and its transaction poisoned, so even a
/// caller that commits anyway commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_error_poisons_the_transaction() {
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
                credit(conn, &o).await?;
                Err::<i64, sqlx::Error>(sqlx::Error::Protocol("downstream refused".into()))
            })
        })
        .await;
    assert!(matches!(r, Err(Error::Action(_))), "{r:?}");
    // Committing anyway: PostgreSQL answers a COMMIT of a failed transaction with a rollback.
    let _ = tx.commit().await;
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 0);
    assert!(
        store
            .get(&idemkit_core::StorageKey::new(&op(), None, &key))
            .await
            .unwrap()
            .is_none()
    );
}

/// The action outlived its lease (renewals failing is simulated by a lease shorter than the
/// action and a duplicate that takes the key over): the completion in the transaction is
/// refused, the call fails with a Complete-phase store error, and the effect does not commit.
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
                credit(conn, &o).await?;
                // max_hold stops the renewals; once the lease is gone another delivery
                // takes the key over.
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
    let _ = tx.commit().await;
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 0);
    let replay = c
        .call(&op(), &key)
        .run(|_| async { Ok::<i64, std::io::Error>(0) })
        .await
        .unwrap();
    assert_eq!(replay.value, -7, "the successor's record stands");
}

/// While the first transaction is open, a concurrent duplicate in wait mode waits and, once
/// the first commits, replays its value; in reject mode it is told to come back.
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
    let (committed_tx, committed) = tokio::sync::oneshot::channel();
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
                        let id = credit(conn, &order).await?;
                        let _ = in_action_tx.send(());
                        let _ = go.await;
                        Ok::<i64, sqlx::Error>(id)
                    })
                })
                .await
                .unwrap();
            // Still open after the call returned: the duplicate must not replay yet.
            tokio::time::sleep(Duration::from_millis(200)).await;
            tx.commit().await.unwrap();
            let _ = committed_tx.send(());
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
    committed.await.unwrap();
    let r = waiter.await.unwrap();
    assert_eq!((r.value, r.source), (id, Source::Replayed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 1);
}

#[test]
fn the_transactional_call_future_is_send() {
    fn is_send<T: Send>(_: &T) {}
    async fn f(c: Coordinator<PgStore>, mut tx: sqlx::Transaction<'static, sqlx::Postgres>) {
        let (op, key) = (op(), Key::new("k").unwrap());
        let _ = c
            .call(&op, &key)
            .in_transaction(&mut tx)
            .run(|conn, _| Box::pin(async move { credit(conn, "x").await }))
            .await;
    }
    let _ = |c, tx| is_send(&f(c, tx));
}

/// Why the transactional call exists: a plain call around a database effect completes its
/// record on its own, so when the effect's transaction then rolls back (a crash before the
/// commit), the redelivery replays and the effect is lost. The transactional call's record
/// rolls back with the effect, and the redelivery writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_key_loses_a_rolled_back_effect_the_transactional_call_does_not() {
    let Some((store, _)) = setup().await else {
        return;
    };
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(Duration::from_millis(200)))
        .build();
    for transactional in [false, true] {
        let order = support::order(if transactional { "tx" } else { "plain" });
        let key = Key::new(&order).unwrap();
        for delivery in 0..2 {
            let mut tx = store.pool().begin().await.unwrap();
            let o = order.clone();
            if transactional {
                c.call(&op(), &key)
                    .in_transaction(&mut tx)
                    .run(|conn, _| Box::pin(async move { credit(conn, &o).await }))
                    .await
                    .unwrap();
            } else {
                let conn: &mut PgConnection = &mut tx;
                let conn = tokio::sync::Mutex::new(conn);
                c.call(&op(), &key)
                    .run(|_| async {
                        let mut conn = conn.lock().await;
                        credit(&mut conn, &o).await
                    })
                    .await
                    .unwrap();
            }
            if delivery == 0 {
                // The process dies before the commit.
                drop(tx);
                tokio::time::sleep(Duration::from_millis(300)).await;
            } else {
                tx.commit().await.unwrap();
            }
        }
        let rows = support::ledger_rows(store.pool(), &order).await;
        assert_eq!(
            rows,
            if transactional { 1 } else { 0 },
            "transactional={transactional}"
        );
    }
}

/// Issue 20, item 8: the transactional call needs READ COMMITTED, and says so before it
/// reserves anything.
///
/// Before: under REPEATABLE READ, after a first statement had taken the snapshot, the
/// completion could not see the reservation committed outside the transaction:
/// `Err(Store { phase: Complete, LeaseLost })`, which `Error::disposition` dead-lettered
/// although the effect rolled back; and the key stayed reserved for the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_is_not_read_committed_is_refused_before_anything_is_reserved() {
    let Some((store, c)) = setup().await else {
        return;
    };
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let order = support::order("isolation");
        let key = Key::new(&order).unwrap();
        let mut tx = store.pool().begin().await.unwrap();
        sqlx::query(&format!("SET TRANSACTION ISOLATION LEVEL {level}"))
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
        let o = order.clone();
        let ran = Arc::new(AtomicUsize::new(0));
        let r = ran.clone();
        let out = c
            .call(&op(), &key)
            .in_transaction(&mut tx)
            .run(|conn, _| {
                r.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move { credit(conn, &o).await })
            })
            .await;
        assert!(
            matches!(out, Err(Error::Config { .. })),
            "{level}: expected a configuration error, got {out:?}"
        );
        assert_eq!(ran.load(Ordering::SeqCst), 0, "{level}: the action ran");
        tx.rollback().await.unwrap();
        // Nothing was reserved: the next delivery, in a READ COMMITTED transaction, runs.
        let r = deliver(&store, &c, &key, &order).await;
        assert_eq!(r.source, Source::Fresh, "{level}");
        assert_eq!(support::ledger_rows(store.pool(), &order).await, 1);
    }
}

/// A delivery's effect beside its permanent failure: an audit row, then the card declined.
async fn declined(
    conn: &mut PgConnection,
    order: String,
    runs: Arc<AtomicUsize>,
) -> Result<i64, String> {
    runs.fetch_add(1, Ordering::SeqCst);
    credit(conn, &order).await.map_err(|e| e.to_string())?;
    Err("card declined".to_string())
}

/// The transactional call with `store_errors` set on the call (the one `run`, issue 21): a
/// permanent failure is stored in the caller's transaction, so it commits with the
/// transaction's own writes and a redelivery replays it; a transaction that rolls back
/// takes the stored failure with it, and the next delivery runs again (after the lease of
/// the reservation, which was committed outside the transaction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_error_is_stored_in_the_transaction_and_goes_with_it() {
    let Some((store, _)) = setup().await else {
        return;
    };
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(Duration::from_millis(500)))
        .build();
    let order = support::order("declined");
    let key = Key::new(&order).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = |commit: bool| {
        let (store, c, key, order, runs) = (
            store.clone(),
            c.clone(),
            key.clone(),
            order.clone(),
            runs.clone(),
        );
        async move {
            let mut tx = store.pool().begin().await.unwrap();
            let out = c
                .call(&op(), &key)
                .store_errors(|e: &String| e.starts_with("card"))
                .in_transaction(&mut tx)
                .run(move |conn, _| Box::pin(declined(conn, order, runs)))
                .await;
            if commit {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
            }
            out
        }
    };
    // Rolled back: the failure and the row go; the next delivery runs again.
    let first = attempt(false).await;
    assert!(
        matches!(first, Err(Error::ActionStored(ref e)) if e == "card declined"),
        "{first:?}"
    );
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 0);
    // Committed: the failure is stored with the row.
    let second = attempt(true).await;
    assert!(matches!(second, Err(Error::ActionStored(_))), "{second:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the rolled-back delivery ran again"
    );
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 1);
    // A redelivery replays the stored failure without running.
    let third = attempt(true).await;
    assert!(
        matches!(third, Err(Error::ReplayedAction(ref e)) if e == "card declined"),
        "{third:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(support::ledger_rows(store.pool(), &order).await, 1);
}

/// Review M4 (of `e047556`): the completion in the transaction waits on a row lock past
/// `store_timeout`, so the coordinator drops it mid-statement. The call fails in the
/// Complete phase, and the transaction must still be poisoned: a later statement fails and a
/// `COMMIT` rolls back.
///
/// Before: the dropped completion took the connection with it, the call could not poison
/// the transaction, the later write succeeded and the commit committed the action's ledger
/// row without its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_times_out_still_poisons_the_transaction() {
    let Some((store, _)) = setup().await else {
        return;
    };
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().store_timeout(Duration::from_millis(200)))
        .build();
    let order = support::order("complete-timeout");
    let key = Key::new(&order).unwrap();
    let storage = idemkit_core::StorageKey::new(&op(), None, &key);
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
        sqlx::query("SELECT 1 FROM idemkit_test.records WHERE key = $1 FOR UPDATE")
            .bind(&k)
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
                let id = credit(conn, &o).await?;
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
    let later = credit(&mut tx, &order).await;
    assert!(
        later.is_err(),
        "a write after the failed completion went into the transaction: {later:?}"
    );
    let _ = tx.commit().await;
    blocker.await.unwrap();
    assert_eq!(
        support::ledger_rows(store.pool(), &order).await,
        0,
        "the action's effect committed without its record"
    );
}
