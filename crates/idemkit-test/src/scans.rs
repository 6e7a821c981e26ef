//! Conformance checks for stores that implement [`Scan`] (the operators' listing and fenced
//! removal): run them with [`scan_conformance!`](crate::scan_conformance).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::scan::{Listed, Scan, ScanCursor};
use idemkit_core::{
    CompleteRequest, Key, Operation, RawStore, RecordState, ResultKind, StorageKey, Store,
};

use crate::Harness;

const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(600);

/// An operation no other test uses, so that a scan of it sees this check's records only.
fn unique_operation(name: &str) -> Operation {
    Operation::new(format!("{name}-{:016x}", fastrand::u64(..))).expect("valid operation")
}

fn key_of(op: &Operation, name: &str) -> StorageKey {
    StorageKey::new(op, None, &Key::new(name).expect("valid key"))
}

async fn reserve<S: Store>(store: &S, key: &StorageKey) -> idemkit_core::Ownership {
    crate::reserve(store, key, LEASE).await
}

/// Every entry of `op`, walked page by page with pages of about `count`; and the number of
/// pages the walk took. Keyed by storage key: Redis' `SCAN` may return a key twice.
pub async fn walk<S: Scan>(
    store: &S,
    op: Option<&Operation>,
    count: usize,
) -> (BTreeMap<StorageKey, Listed>, usize) {
    let mut cursor: Option<ScanCursor> = None;
    let mut found = BTreeMap::new();
    let mut pages = 0;
    loop {
        let page = store.scan(op, cursor.as_ref(), count).await.expect("scan");
        pages += 1;
        assert!(pages < 100_000, "the walk does not end");
        for entry in page.entries {
            found.insert(entry.key.clone(), entry);
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => return (found, pages),
        }
    }
}

/// A walk over an operation lists each of its records once, with its state, its fencing
/// token and its times on the store's clock; foreign bytes are listed as unreadable; another
/// operation's records are not listed; the walk takes more than one page.
pub async fn a_scan_lists_each_record_of_the_operation_once<H: Harness>(h: &H)
where
    H::Store: Scan,
{
    let store = h.store().await;
    let op = unique_operation("scan");
    let other = unique_operation("scan-other");
    let mut expected = BTreeMap::new();
    for i in 0..8 {
        let key = key_of(&op, &format!("reserved-{i}"));
        let lease = reserve(&store, &key).await;
        expected.insert(key, (Some(false), lease.fencing.get()));
    }
    for i in 0..8 {
        let key = key_of(&op, &format!("completed-{i}"));
        let lease = reserve(&store, &key).await;
        let done = CompleteRequest::new(ResultKind::Value, Bytes::from_static(b"receipt"), TTL);
        store.complete(&key, &lease, &done).await.expect("complete");
        expected.insert(key, (Some(true), lease.fencing.get()));
    }
    for i in 0..3 {
        let key = key_of(&op, &format!("foreign-{i}"));
        store
            .put_raw(&key, Bytes::from_static(b"not ours"), TTL)
            .await
            .expect("put_raw");
        expected.insert(key, (None, 0));
    }
    for i in 0..5 {
        reserve(&store, &key_of(&other, &format!("k-{i}"))).await;
    }

    let (found, pages) = walk(&store, Some(&op), 5).await;
    assert!(pages >= 2, "19 records in pages of 5 took {pages} page(s)");
    assert_eq!(
        found.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "exactly the operation's records"
    );
    #[allow(clippy::disallowed_methods)] // a sanity bound on the store's clock
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    for (key, (completed, fencing)) in &expected {
        let entry = &found[key];
        assert!(entry.size > 0, "{key}: size {}", entry.size);
        match (completed, &entry.record) {
            (None, None) => {}
            (Some(completed), Some(r)) => {
                assert_eq!(r.fencing.get(), *fencing, "{key}: fencing token");
                match (&r.state, completed) {
                    (RecordState::Reserved, false) => {
                        assert!(r.expires_at_ms > r.created_at_ms, "{key}: lease");
                    }
                    (RecordState::Completed(res), true) => {
                        assert_eq!(&res.bytes()[..], b"receipt", "{key}: result");
                    }
                    (state, _) => panic!("{key}: state {state:?}"),
                }
                // Times on the store's clock; a paused test clock stays near the wall's start.
                assert!(r.created_at_ms.abs_diff(wall) < 3_600_000, "{key}: created");
            }
            (want, got) => panic!("{key}: expected completed={want:?}, listed {got:?}"),
        }
    }
    // Every operation: both operations' records are among them.
    let (all, _) = walk(&store, None, 50).await;
    assert!(expected.keys().all(|k| all.contains_key(k)));
    assert_eq!(
        all.keys()
            .filter(|k| k.as_str().starts_with(&format!("{}:", other.as_str())))
            .count(),
        5
    );
}

/// [`Scan::remove`] deletes a record only while its fencing token is the one given: never a
/// later reservation of the key, never foreign bytes; a removed key's next reservation gets a
/// larger fencing token.
pub async fn remove_is_fenced<H: Harness>(h: &H)
where
    H::Store: Scan,
{
    let store = h.store().await;
    let op = unique_operation("remove");
    let key = key_of(&op, "k");
    let first = reserve(&store, &key).await;
    store.release(&key, &first).await.expect("release");
    let second = reserve(&store, &key).await;
    assert!(
        !store.remove(&key, first.fencing).await.expect("remove"),
        "a stale fencing token removed a later reservation"
    );
    assert!(store.get(&key).await.expect("get").is_some());
    assert!(store.remove(&key, second.fencing).await.expect("remove"));
    assert_eq!(store.get(&key).await.expect("get"), None);
    assert!(
        !store.remove(&key, second.fencing).await.expect("remove"),
        "removed twice"
    );
    let third = reserve(&store, &key).await;
    assert!(third.fencing > second.fencing, "fencing went backwards");

    // A completed record is removed with its fencing token.
    let done = CompleteRequest::new(ResultKind::Value, Bytes::from_static(b"1"), TTL);
    store.complete(&key, &third, &done).await.expect("complete");
    assert!(store.remove(&key, third.fencing).await.expect("remove"));
    assert_eq!(store.get(&key).await.expect("get"), None);

    // Foreign bytes are never removed by a fenced remove.
    let foreign = key_of(&op, "foreign");
    store
        .put_raw(&foreign, Bytes::from_static(b"not ours"), TTL)
        .await
        .expect("put_raw");
    for fencing in [first.fencing, third.fencing] {
        assert!(!store.remove(&foreign, fencing).await.expect("remove"));
    }
    assert!(
        store.get(&foreign).await.is_err(),
        "the foreign bytes are still there"
    );
    store.purge(&foreign).await.expect("purge");
}

/// A waiter returns when an operator removes the reservation under its fencing token
/// (`idemkit purge`, `idemkit release --force`, the status page), long before its timeout.
pub async fn remove_wakes_waiters<H: Harness>(h: &H)
where
    H::Store: Scan,
{
    crate::suite::wait_wakes_on(h, |store, key, lease| async move {
        assert!(store.remove(&key, lease.fencing).await.expect("remove"));
    })
    .await;
}
