//! MemoryStore's own tests (the store contract is checked by the conformance suite).

use super::*;
use crate::ident::{Key, Operation};
use crate::record::ResultKind;

fn key(i: usize) -> StorageKey {
    StorageKey::new(
        &Operation::new("op").unwrap(),
        None,
        &Key::new(format!("k{i}")).unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_is_reported_as_taken_over() {
    let store = MemoryStore::new();
    let k = key(0);
    let lease = Duration::from_secs(1);
    let first = store
        .begin(&BeginRequest::new(&k, OwnerToken::random(), lease))
        .await
        .unwrap();
    assert!(matches!(
        first,
        Claim::Reserved {
            took_over: false,
            ..
        }
    ));
    tokio::time::advance(Duration::from_millis(1_001)).await;
    let second = store
        .begin(&BeginRequest::new(&k, OwnerToken::random(), lease))
        .await
        .unwrap();
    assert!(
        matches!(
            second,
            Claim::Reserved {
                took_over: true,
                ..
            }
        ),
        "{second:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn memory_stays_bounded_under_ttl_churn() {
    let store = MemoryStore::new();
    let ttl = Duration::from_secs(1);
    let mut peak = 0;
    // 40 rounds of 5,000 fresh keys, each completed with a 1 s TTL, then 2 s pass: only
    // one round is ever live, so the store must not keep all 200,000.
    for round in 0..40 {
        for i in 0..5_000 {
            let k = key(round * 5_000 + i);
            let req = BeginRequest::new(&k, OwnerToken::random(), ttl);
            let Claim::Reserved {
                ownership: lease, ..
            } = store.begin(&req).await.unwrap()
            else {
                panic!("fresh key not reserved")
            };
            let c = CompleteRequest::new(ResultKind::Value, "1", ttl);
            store.complete(&k, &lease, &c).await.unwrap();
        }
        peak = peak.max(store.len());
        tokio::time::advance(Duration::from_secs(2)).await;
    }
    // Live at any time: 5,000. Bound: about twice the live set per shard plus the floor.
    assert!(
        peak <= 2 * 5_000 + SHARDS * MIN_SWEEP,
        "peak {peak} entries"
    );
    assert!(
        peak < 200_000 / 4,
        "peak {peak} entries: expired records are not evicted"
    );
    store.purge_expired();
    assert_eq!(store.len(), 0, "every record is past its TTL");
}
