//! The inbox on MySQL/MariaDB: concurrent claims of one message (a wait on the first's row
//! lock; a deadlock when several wait on one that rolls back), REPEATABLE READ, retention,
//! purge, typed errors, and `deliver`'s order of effects.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Disposition, Key, Operation, Source};
use idemkit_mysql::Inbox;
use idemkit_sql::{DeliverError, InboxError, Seen};

async fn inbox() -> Option<(sqlx::MySqlPool, Inbox)> {
    let pool = support::pool().await?;
    let inbox = Inbox::new().table("idemkit_test_inbox").unwrap();
    inbox.migrate(&pool).await.unwrap();
    Some((pool, inbox))
}

/// The second transaction waits on the first's uncommitted row: a duplicate once the first
/// commits, new (it goes on) once the first rolls back. Both transactions are REPEATABLE
/// READ (InnoDB's default) and took their snapshot before the first claim: the claim reads
/// the latest committed row all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_claim_waits_then_sees_the_first_commit_or_rollback() {
    let Some((pool, inbox)) = inbox().await else {
        return;
    };
    for first_commits in [true, false] {
        let message = support::order("concurrent");
        let mut first = pool.begin().await.unwrap();
        let level: String = sqlx::query_scalar("SELECT @@tx_isolation")
            .fetch_one(&mut *first)
            .await
            .unwrap();
        assert_eq!(level, "REPEATABLE-READ");
        let (snapshot_tx, snapshot) = tokio::sync::oneshot::channel();
        let (claimed_tx, claimed) = tokio::sync::oneshot::channel::<()>();
        let second = {
            let (pool, inbox, message) = (pool.clone(), inbox.clone(), message.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                // A consistent read: the snapshot is taken now, before the first claim.
                let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idemkit_test_inbox")
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                let _ = snapshot_tx.send(());
                claimed.await.unwrap();
                let seen = inbox.claim(&mut tx, "billing", &message).await.unwrap();
                tx.commit().await.unwrap();
                seen
            })
        };
        snapshot.await.unwrap();
        assert_eq!(
            inbox.claim(&mut first, "billing", &message).await.unwrap(),
            Seen::New
        );
        claimed_tx.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "the second claim must wait on the first transaction"
        );
        if first_commits {
            first.commit().await.unwrap();
        } else {
            first.rollback().await.unwrap();
        }
        let seen = tokio::time::timeout(Duration::from_secs(20), second)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            seen,
            if first_commits {
                Seen::Duplicate
            } else {
                Seen::New
            },
            "first_commits={first_commits}"
        );
    }
}

/// Eight deliveries of one message at once, the first of each round rolling back after the
/// others queued on its row: InnoDB may end some waiters with a deadlock (gap and
/// insert-intention locks). Each such claim is a typed `Unavailable` error whose
/// transaction InnoDB rolled back, the delivery is retried, and the ledger ends with exactly
/// one row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_queued_behind_a_rollback_deadlock_at_worst_and_credit_once() {
    let Some((pool, inbox)) = inbox().await else {
        return;
    };
    support::ledger(&pool).await;
    let message = support::order("deadlock");
    let deadlocks = Arc::new(AtomicUsize::new(0));
    let mut first = pool.begin().await.unwrap();
    assert_eq!(
        inbox.claim(&mut first, "billing", &message).await.unwrap(),
        Seen::New
    );
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (pool, inbox, message, deadlocks) = (
            pool.clone(),
            inbox.clone(),
            message.clone(),
            deadlocks.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let mut tx = pool.begin().await.unwrap();
                match inbox.claim(&mut tx, "billing", &message).await {
                    Ok(Seen::New) => {
                        support::credit(&mut tx, &message).await.unwrap();
                        tx.commit().await.unwrap();
                        return;
                    }
                    Ok(_) => {
                        tx.commit().await.unwrap();
                        return;
                    }
                    Err(InboxError::Store(e)) => {
                        assert!(e.is_unavailable(), "{e}");
                        deadlocks.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.rollback().await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(support::ledger_rows(&pool, &message).await, 1);
    eprintln!(
        "{} claims ended by a deadlock, retried",
        deadlocks.load(Ordering::SeqCst)
    );
}

/// Rows are kept for the retention, exactly; after it a delivery counts as new again, and
/// the purge removes the expired rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_and_purge() {
    let Some((pool, _)) = inbox().await else {
        return;
    };
    let table = format!("inbox_{:x}", fastrand::u32(..));
    let inbox = Inbox::new()
        .table(&table)
        .unwrap()
        .retention(Duration::from_millis(300));
    inbox.migrate(&pool).await.unwrap();
    let claim = |m: &'static str| {
        let (pool, inbox) = (pool.clone(), inbox.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            let seen = inbox.claim(&mut tx, "billing", m).await.unwrap();
            tx.commit().await.unwrap();
            seen
        }
    };
    assert_eq!(claim("m1").await, Seen::New);
    assert_eq!(claim("m1").await, Seen::Duplicate);
    assert_eq!(claim("m2").await, Seen::New);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(claim("m1").await, Seen::New, "past the retention");
    assert_eq!(claim("m1").await, Seen::Duplicate, "renewed");
    assert_eq!(
        inbox.purge_expired(&pool, 1).await.unwrap(),
        1,
        "m2 only: m1 was renewed"
    );
    let left: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 1);
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

/// A missing table, invalid ids and names: typed errors before any effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_and_invalid_ids_are_typed_errors() {
    let Some((pool, inbox)) = inbox().await else {
        return;
    };
    let missing = Inbox::new().table("idemkit_never_migrated").unwrap();
    let mut tx = pool.begin().await.unwrap();
    let err = missing.claim(&mut tx, "billing", "m").await.unwrap_err();
    assert!(err.to_string().contains("Inbox::migrate"), "{err}");
    for (consumer, message) in [
        ("", "m"),
        ("bad\u{7}consumer", "m"),
        ("billing", ""),
        ("billing", "a\nb"),
    ] {
        assert!(
            matches!(
                inbox.claim(&mut tx, consumer, message).await,
                Err(InboxError::InvalidId(_))
            ),
            "{consumer:?} {message:?}"
        );
    }
    assert!(Inbox::new().table("Inbox; DROP").is_err());
}

/// `deliver`: the database effect once, the external effect on every delivery under its own
/// key (so a delivery that died between the commit and the email sends it); a failing
/// database effect rolls the inbox row back and skips the email.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_runs_the_email_on_every_delivery_and_the_credit_once() {
    let Some((pool, inbox)) = inbox().await else {
        return;
    };
    support::ledger(&pool).await;
    let store = support::store().await.unwrap();
    let keys = Coordinator::new(store);
    let order = support::order("deliver");
    let claim = format!("{order}.invoice");
    let mail = Operation::new("mail.invoice").unwrap();
    let key = Key::new(&claim).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));

    // A first delivery whose database effect fails: nothing committed, no email.
    let failed = inbox
        .deliver(
            &pool,
            "billing",
            &claim,
            |conn| {
                let order = order.clone();
                Box::pin(async move {
                    support::credit(conn, &order).await?;
                    Err::<(), sqlx::Error>(sqlx::Error::Protocol("ledger refused".into()))
                })
            },
            keys.call(&mail, &key),
            |_| async { Ok::<_, sqlx::Error>("never".to_string()) },
        )
        .await;
    assert!(matches!(failed, Err(DeliverError::Database(_))));
    assert_eq!(
        failed.unwrap_err().disposition(),
        Disposition::Retry { after: None }
    );
    assert_eq!(support::ledger_rows(&pool, &order).await, 0);

    for delivery in 0..3 {
        let sent = sent.clone();
        let order = order.clone();
        let done = inbox
            .deliver(
                &pool,
                "billing",
                &claim,
                |conn| Box::pin(async move { support::credit(conn, &order).await.map(drop) }),
                keys.call(&mail, &key),
                |_| async move {
                    sent.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, sqlx::Error>("em_1".to_string())
                },
            )
            .await
            .unwrap();
        let want = if delivery == 0 {
            (Seen::New, Source::Fresh)
        } else {
            (Seen::Duplicate, Source::Replayed)
        };
        assert_eq!((done.seen, done.external.source), want);
        assert_eq!(done.external.value, "em_1");
    }
    assert_eq!(support::ledger_rows(&pool, &order).await, 1);
    assert_eq!(sent.load(Ordering::SeqCst), 1);
}
