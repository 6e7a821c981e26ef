//! The store and coordinator conformance suites on the machine's Redis (`IDEMKIT_REDIS_URL`), every check in
//! its own key prefix, in parallel. Time passes for real here: leases and TTLs expire by
//! Redis' clock, which the tests cannot pause.

mod support;

use std::time::Duration;

use idemkit_redis::RedisStore;
use idemkit_test::Harness;

/// The machine's server, with the calls on the store's own client (the default) or on
/// redis-rs' connections.
struct Standalone {
    own_client: bool,
}

impl Harness for Standalone {
    type Store = RedisStore;

    async fn store(&self) -> RedisStore {
        let builder = RedisStore::builder().own_client(self.own_client);
        support::connect_with(&support::redis_url(), builder)
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
    Standalone { own_client: true }
);
idemkit_test::raw_store_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Standalone { own_client: true }
);
idemkit_test::scan_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Standalone { own_client: true }
);
idemkit_test::coordinator_conformance!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Standalone { own_client: true }
);

/// The same suites with the calls on redis-rs' connections (`own_client(false)`).
mod redis_rs_client {
    use super::*;

    idemkit_test::store_conformance!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        Standalone { own_client: false }
    );
    idemkit_test::raw_store_conformance!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        Standalone { own_client: false }
    );
    idemkit_test::scan_conformance!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        Standalone { own_client: false }
    );
    idemkit_test::coordinator_conformance!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        Standalone { own_client: false }
    );
}
