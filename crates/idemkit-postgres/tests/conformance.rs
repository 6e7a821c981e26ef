//! The store and coordinator conformance suites on the machine's PostgreSQL
//! (`IDEMKIT_POSTGRES_URL`), each check on its own keys, in parallel. Time passes for real:
//! leases and TTLs expire by the database's clock.

mod support;

use std::time::Duration;

use idemkit_postgres::PgStore;
use idemkit_test::Harness;

struct Postgres;

impl Harness for Postgres {
    type Store = PgStore;

    async fn store(&self) -> PgStore {
        support::store().await.expect("checked by available()")
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    async fn available(&self) -> bool {
        support::pool().await.is_some()
    }
}

idemkit_test::store_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Postgres
);
idemkit_test::raw_store_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Postgres
);
idemkit_test::scan_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Postgres
);
idemkit_test::coordinator_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Postgres
);
