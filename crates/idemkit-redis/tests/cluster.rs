//! The conformance suite on a real Redis Cluster of three masters, started by this test on
//! free loopback ports (`redis-server --cluster-enabled yes` + `redis-cli --cluster create`)
//! and stopped at its end.

mod support;

use std::sync::Arc;
use std::time::Duration;

use idemkit_core::{BeginRequest, Claim, Key, Operation, OwnerToken, StorageKey, Store};
use idemkit_redis::RedisStore;
use idemkit_test::Harness;
use idemkit_test::redis_server::{Cluster, dbsize};

struct OnCluster {
    urls: Vec<String>,
}

impl Harness for OnCluster {
    type Store = RedisStore;

    async fn store(&self) -> RedisStore {
        RedisStore::builder()
            .prefix(support::prefix())
            .connect_cluster(self.urls.clone())
            .await
            .unwrap()
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_on_a_three_master_cluster() {
    let cluster = Cluster::start();
    let harness = Arc::new(OnCluster {
        urls: cluster.urls(),
    });

    // The cluster is really used: keys spread over all three masters.
    let store = harness.store().await;
    let op = Operation::new("spread").unwrap();
    for i in 0..60 {
        let k = StorageKey::new(&op, None, &Key::new(format!("k{i}")).unwrap());
        let req = BeginRequest::new(&k, OwnerToken::random(), Duration::from_secs(30));
        assert!(matches!(
            store.begin(&req).await.unwrap(),
            Claim::Reserved { .. }
        ));
    }
    for n in &cluster.nodes {
        assert!(dbsize(n.port) > 0, "node {} holds no keys", n.port);
    }

    // Listing walks every primary, node by node.
    idemkit_test::scans::a_scan_lists_each_record_of_the_operation_once(&*harness).await;
    idemkit_test::scans::remove_is_fenced(&*harness).await;
    let (listed, pages) = idemkit_test::scans::walk(&store, Some(&op), 10).await;
    assert_eq!(listed.len(), 60, "the 60 keys over three primaries");
    assert!(pages >= 3, "one walk per primary at least: {pages} page(s)");

    idemkit_test::run_all(harness).await;
    drop(cluster);
}
