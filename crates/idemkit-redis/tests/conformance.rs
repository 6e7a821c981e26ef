//! The store and coordinator conformance suites on the machine's Redis (`IDEMKIT_REDIS_URL`), every check in
//! its own key prefix, in parallel. Time passes for real here: leases and TTLs expire by
//! Redis' clock, which the tests cannot pause.

mod support;

use std::time::Duration;

use idemkit_redis::RedisStore;
use idemkit_test::Harness;

struct Standalone;

impl Harness for Standalone {
    type Store = RedisStore;

    async fn store(&self) -> RedisStore {
        support::connect(&support::redis_url())
            .await
            .expect("checked by available()")
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    async fn available(&self) -> bool {
        support::connect(&support::redis_url()).await.is_some()
    }
}

idemkit_test::store_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Standalone
);
idemkit_test::raw_store_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Standalone
);
idemkit_test::scan_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Standalone
);
idemkit_test::coordinator_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Standalone
);
