//! The machine's PostgreSQL for tests: `IDEMKIT_POSTGRES_URL`, default the local server's
//! `test` database. Tests live in their own schema (`idemkit_test`) and keys.
#![allow(dead_code, unreachable_pub)]

use idemkit_postgres::PgStore;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

pub fn url() -> String {
    std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A pool on the test database, or `None` (a skip) when it is down and `CI` is unset.
pub async fn pool() -> Option<PgPool> {
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .test_before_acquire(false)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect(&url())
        .await;
    if !idemkit_test::require_service(&format!("PostgreSQL at {}", url()), pool.is_ok()) {
        return None;
    }
    Some(pool.expect("checked"))
}

/// A migrated store in `idemkit_test.records`.
pub async fn store() -> Option<PgStore> {
    let store = PgStore::builder()
        .schema("idemkit_test")
        .table("records")
        .build(pool().await?)
        .unwrap();
    store.migrate().await.expect("migrate");
    Some(store)
}

/// The ledger the scenario handlers write: one row per database effect.
pub async fn ledger(pool: &PgPool) {
    // Under a lock: concurrent `CREATE TABLE IF NOT EXISTS` can still collide.
    sqlx::raw_sql(
        "BEGIN;
         SELECT pg_advisory_xact_lock(hashtext('idemkit_test.ledger'));
         CREATE SCHEMA IF NOT EXISTS idemkit_test;
         CREATE TABLE IF NOT EXISTS idemkit_test.ledger (
             id bigserial PRIMARY KEY,
             order_id text NOT NULL,
             amount bigint NOT NULL DEFAULT 0
         );
         COMMIT;",
    )
    .execute(pool)
    .await
    .expect("ledger table");
}

/// How many ledger rows an order has.
pub async fn ledger_rows(pool: &PgPool, order: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM idemkit_test.ledger WHERE order_id = $1")
        .bind(order)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// A fresh order id.
pub fn order(name: &str) -> String {
    format!("{name}-{:x}", fastrand::u64(..))
}
