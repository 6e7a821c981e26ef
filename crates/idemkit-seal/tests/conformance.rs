//! The whole conformance suite (store, raw store, coordinator) through [`Sealed`] with both
//! options on, over MemoryStore (paused time), Redis (one server, and a Cluster of three
//! masters) and PostgreSQL.

use std::time::Duration;

use idemkit_core::MemoryStore;
use idemkit_postgres::PgStore;
use idemkit_redis::RedisStore;
use idemkit_seal::{KeySecret, Keyring, Sealed};
use idemkit_test::Harness;

fn seal<S>(inner: S) -> Sealed<S> {
    Sealed::new(inner)
        .encrypt(Keyring::new(2, [0x42; 32]).decrypt_also(1, [0x17; 32]))
        .hash_keys(KeySecret::new(*b"conformance-key-hashing-secret!!").unwrap())
}

struct Memory;

impl Harness for Memory {
    type Store = Sealed<MemoryStore>;

    async fn store(&self) -> Self::Store {
        seal(MemoryStore::new())
    }

    async fn advance(&self, d: Duration) {
        tokio::time::advance(d).await;
    }
}

mod memory {
    use super::*;

    idemkit_test::store_conformance!(
        #[tokio::test(start_paused = true)]
        Memory
    );
    idemkit_test::raw_store_conformance!(
        #[tokio::test(start_paused = true)]
        Memory
    );
    idemkit_test::coordinator_conformance!(
        #[tokio::test(start_paused = true)]
        Memory
    );
}

fn redis_url() -> String {
    std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

struct OnRedis;

impl Harness for OnRedis {
    type Store = Sealed<RedisStore>;

    async fn store(&self) -> Self::Store {
        let prefix = format!("idemkit-seal-{:x}", fastrand::u64(..));
        seal(
            RedisStore::builder()
                .prefix(prefix)
                .connect(&redis_url())
                .await
                .expect("checked by available()"),
        )
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    async fn available(&self) -> bool {
        let up = RedisStore::builder().connect(&redis_url()).await.is_ok();
        idemkit_test::require_service("redis", up)
    }
}

mod redis {
    use super::*;

    idemkit_test::store_conformance!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        OnRedis
    );
    idemkit_test::raw_store_conformance!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        OnRedis
    );
    idemkit_test::coordinator_conformance!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        OnRedis
    );
}

fn postgres_url() -> String {
    std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

struct OnPostgres;

async fn pg() -> Option<PgStore> {
    let store = PgStore::builder()
        .schema("idemkit_seal_test")
        .max_connections(4)
        .connect(&postgres_url())
        .await
        .ok()?;
    store.migrate().await.ok()?;
    Some(store)
}

impl Harness for OnPostgres {
    type Store = Sealed<PgStore>;

    async fn store(&self) -> Self::Store {
        seal(pg().await.expect("checked by available()"))
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    async fn available(&self) -> bool {
        idemkit_test::require_service("postgres", pg().await.is_some())
    }
}

mod postgres {
    use super::*;

    idemkit_test::store_conformance!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        OnPostgres
    );
    idemkit_test::raw_store_conformance!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        OnPostgres
    );
    idemkit_test::coordinator_conformance!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        OnPostgres
    );
}

/// A Redis Cluster of three masters (started here, stopped at the end): hashed names spread
/// over the slots like any other keys.
struct OnCluster {
    urls: Vec<String>,
}

impl Harness for OnCluster {
    type Store = Sealed<RedisStore>;

    async fn store(&self) -> Self::Store {
        seal(
            RedisStore::builder()
                .prefix(format!("idemkit-seal-{:x}", fastrand::u64(..)))
                .connect_cluster(self.urls.clone())
                .await
                .unwrap(),
        )
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_suite_through_sealed_on_a_redis_cluster() {
    let cluster = idemkit_test::redis_server::Cluster::start();
    idemkit_test::run_all(std::sync::Arc::new(OnCluster {
        urls: cluster.urls(),
    }))
    .await;
}
