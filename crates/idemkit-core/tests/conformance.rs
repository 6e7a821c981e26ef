//! The store conformance suite on [`MemoryStore`], in paused tokio time: leases and TTLs are
//! exercised by advancing the clock, not by sleeping.

use std::time::Duration;

use idemkit_core::MemoryStore;
use idemkit_test::Harness;

struct Memory;

impl Harness for Memory {
    type Store = MemoryStore;

    async fn store(&self) -> MemoryStore {
        MemoryStore::new()
    }

    async fn advance(&self, d: Duration) {
        tokio::time::advance(d).await;
    }
}

idemkit_test::store_conformance!(
    #[tokio::test(start_paused = true)]
    Memory
);
idemkit_test::raw_store_conformance!(
    #[tokio::test(start_paused = true)]
    Memory
);
idemkit_test::scan_conformance!(
    #[tokio::test(start_paused = true)]
    Memory
);

/// The coordinator's scenarios on `MemoryStore`: in paused time, and on two worker threads so
/// that the races are real.
mod coordinator {
    use super::*;

    idemkit_test::coordinator_conformance!(
        #[tokio::test(start_paused = true)]
        Memory
    );

    mod multi_thread {
        use super::*;

        struct RealTime;

        impl Harness for RealTime {
            type Store = MemoryStore;

            async fn store(&self) -> MemoryStore {
                MemoryStore::new()
            }

            async fn advance(&self, d: Duration) {
                tokio::time::sleep(d).await;
            }
        }

        idemkit_test::coordinator_conformance!(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            RealTime
        );
    }
}

/// The suite through a `Probe` wrapper too: the wrapper used by the coordinator tests must
/// not change the store's behaviour.
mod through_probe {
    use super::*;
    use idemkit_test::Probe;

    struct Probed;

    impl Harness for Probed {
        type Store = Probe<MemoryStore>;

        async fn store(&self) -> Probe<MemoryStore> {
            Probe::new(MemoryStore::new())
        }

        async fn advance(&self, d: Duration) {
            tokio::time::advance(d).await;
        }
    }

    idemkit_test::store_conformance!(
        #[tokio::test(start_paused = true)]
        Probed
    );
    idemkit_test::raw_store_conformance!(
        #[tokio::test(start_paused = true)]
        Probed
    );
}

/// The suite through a `DynStore`: erasing the type must not change the behaviour.
mod through_dyn_store {
    use super::*;
    use idemkit_core::DynStore;

    struct Erased;

    impl Harness for Erased {
        type Store = DynStore;

        async fn store(&self) -> DynStore {
            DynStore::with_raw(MemoryStore::new())
        }

        async fn advance(&self, d: Duration) {
            tokio::time::advance(d).await;
        }
    }

    idemkit_test::store_conformance!(
        #[tokio::test(start_paused = true)]
        Erased
    );
    idemkit_test::raw_store_conformance!(
        #[tokio::test(start_paused = true)]
        Erased
    );
    idemkit_test::coordinator_conformance!(
        #[tokio::test(start_paused = true)]
        Erased
    );

    #[tokio::test]
    async fn without_raw_access_raw_calls_are_refused() {
        let store = DynStore::new(MemoryStore::new());
        let key = idemkit_test::unique_key("raw");
        use idemkit_core::RawStore as _;
        assert_eq!(
            store.purge(&key).await.unwrap_err().kind(),
            idemkit_core::StoreErrorKind::Rejected
        );
    }
}
