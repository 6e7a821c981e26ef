//! The inbox on its own: concurrent claims of one message, retention, purge.

mod support;

use std::time::Duration;

use idemkit_postgres::{Inbox, Seen};

async fn inbox() -> Option<(sqlx::PgPool, Inbox)> {
    let pool = support::pool().await?;
    let inbox = Inbox::new().schema("idemkit_test").unwrap();
    inbox.migrate(&pool).await.unwrap();
    Some((pool, inbox))
}

/// The second transaction waits on the first's uncommitted row: a duplicate once the first
/// commits, new (it goes on) once the first rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_claim_waits_then_sees_the_first_commit_or_rollback() {
    let Some((pool, inbox)) = inbox().await else {
        return;
    };
    for first_commits in [true, false] {
        let message = support::order("concurrent");
        let mut first = pool.begin().await.unwrap();
        assert_eq!(
            inbox.claim(&mut first, "billing", &message).await.unwrap(),
            Seen::New
        );
        let second = {
            let (pool, inbox, message) = (pool.clone(), inbox.clone(), message.clone());
            tokio::spawn(async move {
                let mut tx = pool.begin().await.unwrap();
                let seen = inbox.claim(&mut tx, "billing", &message).await.unwrap();
                tx.commit().await.unwrap();
                seen
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !second.is_finished(),
            "the second claim must wait on the first transaction"
        );
        if first_commits {
            first.commit().await.unwrap();
        } else {
            first.rollback().await.unwrap();
        }
        let seen = tokio::time::timeout(Duration::from_secs(10), second)
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

/// Rows are kept for the retention, exactly; after it a delivery counts as new again, and
/// the purge removes the expired rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_and_purge() {
    let Some((pool, _)) = inbox().await else {
        return;
    };
    let table = format!("inbox_{:x}", fastrand::u32(..));
    let inbox = Inbox::new()
        .schema("idemkit_test")
        .unwrap()
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
    assert_eq!(
        inbox.purge_expired(&pool, 1).await.unwrap(),
        1,
        "m2 only: m1 was renewed"
    );
    let left: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM idemkit_test.{table}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 1);
    sqlx::query(&format!("DROP TABLE idemkit_test.{table}"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_inbox_table_names_the_migration() {
    let Some(pool) = support::pool().await else {
        return;
    };
    let inbox = Inbox::new().schema("idemkit_never_migrated").unwrap();
    let mut tx = pool.begin().await.unwrap();
    let err = inbox.claim(&mut tx, "billing", "m").await.unwrap_err();
    assert!(err.to_string().contains("Inbox::migrate"), "{err}");
}
