//! `purge_expired` beside reservations: it never holds the fencing high-water row while it
//! waits on or scans the records table (review M3 of `e047556`), and every token it deletes
//! is kept by the mark, so a key reserved again draws a larger one (review L4).

mod support;

use std::time::Duration;

use idemkit_core::{BeginRequest, Claim, OwnerToken, Store};
use idemkit_mysql::MySqlStore;

/// A store on a table of this test's own, so that the lock waits it looks for are its own.
async fn own_store(name: &str) -> Option<MySqlStore> {
    let shared = support::store().await?;
    let store = MySqlStore::builder()
        .table(name)
        .build(shared.pool().clone())
        .unwrap();
    store.migrate().await.expect("migrate");
    Some(store)
}

/// Review M3: a purge that waits on one expired row's lock (another session holds it) must
/// not stall every reservation. Before, the purge raised the high-water mark first, in its
/// own transaction, and held that row's exclusive lock while its `DELETE` waited (or
/// scanned a backlog); every `begin` reads the mark under a shared lock, so a fresh key's
/// `begin` waited with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_waiting_on_a_row_lock_does_not_stall_reservations() {
    let table = format!("idemkit_test_purge_{:x}", fastrand::u32(..));
    let Some(store) = own_store(&table).await else {
        return;
    };
    let pool = store.pool().clone();
    // Expired reservations, one of which another session locks.
    let keys: Vec<_> = (0..20)
        .map(|i| idemkit_test::unique_key(&format!("expired-{i}")))
        .collect();
    for key in &keys {
        let r = store
            .begin(&BeginRequest::new(
                key,
                OwnerToken::random(),
                Duration::from_millis(1),
            ))
            .await
            .unwrap();
        assert!(matches!(r, Claim::Reserved { .. }), "{r:?}");
    }
    // Each expires once the server's clock is past its millisecond.
    loop {
        let live: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {table} WHERE expires_us > CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
        ))
        .fetch_one(&pool)
        .await
        .unwrap();
        if live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let before: i64 = sqlx::query_scalar(&format!("SELECT MAX(fencing) FROM {table}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut holder = pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT 1 FROM {table} WHERE `key` = ? FOR UPDATE"))
        .bind(keys[7].as_str())
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let purge = tokio::spawn({
        let store = store.clone();
        async move { store.purge_expired(1000).await }
    });
    // Until the purge's statement runs: it cannot end while the row is held. (MariaDB does not
    // always list an autocommit statement's lock wait in `innodb_trx`; the process list has
    // every running statement.)
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE id <> CONNECTION_ID() AND command <> 'Sleep' AND info LIKE ?",
        )
        .bind(format!("%{table}%"))
        .fetch_one(&pool)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            !purge.is_finished(),
            "the purge ended without waiting on the held row"
        );
        // A condition polled, not a timing assumed: the purge's statement reaches the lock.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fresh = idemkit_test::unique_key("fresh");
    let begun = tokio::time::timeout(
        Duration::from_secs(10),
        store.begin(&BeginRequest::new(
            &fresh,
            OwnerToken::random(),
            Duration::from_secs(30),
        )),
    )
    .await
    .expect("a fresh key's begin waited on the purge");
    assert!(matches!(begun, Ok(Claim::Reserved { .. })), "{begun:?}");
    holder.commit().await.unwrap();
    let removed = purge.await.unwrap().unwrap();
    assert_eq!(removed, 20, "every expired row, the held one too");
    // Review L4: the deleted tokens are kept by the mark; the keys' next tokens are larger.
    let again = store
        .begin(&BeginRequest::new(
            &keys[7],
            OwnerToken::random(),
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    let Claim::Reserved { ownership, .. } = again else {
        panic!("{again:?}");
    };
    assert!(
        ownership.fencing.get() > u64::try_from(before).unwrap(),
        "a purged key drew token {} again at or below {before}",
        ownership.fencing.get()
    );
    sqlx::query(&format!("DROP TABLE {table}, {table}_fencing"))
        .execute(&pool)
        .await
        .unwrap();
}
