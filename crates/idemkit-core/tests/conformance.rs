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
}
