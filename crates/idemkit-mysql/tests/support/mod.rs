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
