//! The machine's MariaDB or MySQL for tests: `IDEMKIT_MYSQL_URL`, default the local server's
//! `test` database. Tests share the table `idemkit_test_records` and use their own keys.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use idemkit_mysql::MySqlStore;

pub fn url() -> String {
    std::env::var("IDEMKIT_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// A migrated store, or `None` (a skip) when the server is down and `CI` is unset.
pub async fn store() -> Option<MySqlStore> {
    let store = MySqlStore::builder()
        .table("idemkit_test_records")
        .recheck(Duration::from_millis(20))
        .connect(&url())
        .await;
    if !idemkit_test::require_service(&format!("MySQL at {}", url()), store.is_ok()) {
        return None;
    }
    let store = store.expect("checked");
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A pool on the test database, or `None` (a skip) when the server is down and `CI` is
/// unset.
pub async fn pool() -> Option<sqlx::MySqlPool> {
    Some(store().await?.pool().clone())
}

/// A unique order id.
pub fn order(what: &str) -> String {
    format!("order-{what}-{:x}", fastrand::u64(..))
}

/// The tests' ledger: one row per credit.
pub async fn ledger(pool: &sqlx::MySqlPool) {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS idemkit_test_ledger \
         (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, order_id VARCHAR(200) NOT NULL, \
          amount INT NOT NULL, INDEX by_order (order_id)) ENGINE = InnoDB",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Credits `order` on `conn`: the ledger row's id.
pub async fn credit(conn: &mut sqlx::MySqlConnection, order: &str) -> Result<i64, sqlx::Error> {
    let done = sqlx::query("INSERT INTO idemkit_test_ledger (order_id, amount) VALUES (?, 100)")
        .bind(order)
        .execute(conn)
        .await?;
    Ok(done.last_insert_id() as i64)
}

/// How many ledger rows `order` has, committed.
pub async fn ledger_rows(pool: &sqlx::MySqlPool, order: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idemkit_test_ledger WHERE order_id = ?")
        .bind(order)
        .fetch_one(pool)
        .await
        .unwrap()
}
