//! The store and coordinator conformance suites on the machine's MariaDB or MySQL
//! (`IDEMKIT_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`), each check on its own
//! keys, in parallel. Time passes for real: leases and TTLs expire by the server's clock.

use std::time::Duration;

mod support;

use idemkit_mysql::MySqlStore;
use idemkit_test::Harness;
use support::store;

struct MySql;

impl Harness for MySql {
    type Store = MySqlStore;

    async fn store(&self) -> MySqlStore {
        store().await.expect("checked by available()")
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    async fn available(&self) -> bool {
        store().await.is_some()
    }
}

idemkit_test::store_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    MySql
);
idemkit_test::raw_store_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    MySql
);
idemkit_test::coordinator_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    MySql
);
idemkit_test::scan_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    MySql
);
