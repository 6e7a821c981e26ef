//! The record's checks: corrupt and foreign bytes, exact TTLs, `get`, `purge`, and the
//! longest durations.

use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, FencingToken, Fingerprint, OwnerToken, RawStore, Record,
    RecordState, ResultKind, Store, StoreErrorKind,
};

use super::{TTL, assert_lease_lost, req, reserve, value};
use crate::{Harness, unique_key};

/// Bytes under a key that are not a record of ours give `Corrupt`, never a panic and never a
/// silent overwrite; purging them frees the key.
pub async fn corrupt_and_foreign_records_are_typed_errors<H: Harness>(h: &H)
where
    H::Store: RawStore,
{
    let store = h.store().await;
    let good = Record {
        state: RecordState::Reserved,
        owner: OwnerToken::random(),
        fencing: FencingToken::new(1),
        fingerprint: None,
        created_at_ms: 0,
        expires_at_ms: 0,
        holder: None,
        lease_ms: None,
    }
    .encode();
    let mut future_version = good.clone();
    future_version[3] = 99;
    let truncated = good[..good.len() - 3].to_vec();
    for bytes in [
        b"garbage".to_vec(),
        b"{\"status\":\"done\"}".to_vec(),
        Vec::new(),
        future_version,
        truncated,
        // A record head too short to hold a record (a damaged value): once a Lua error.
        b"IDK\x01\x01".to_vec(),
        b"IDK\x01\x02".to_vec(),
    ] {
        let key = unique_key("corrupt");
        store
            .put_raw(&key, Bytes::from(bytes.clone()), TTL)
            .await
            .expect("put_raw");
        assert_eq!(
            err_kind(store.begin(&req(&key)).await),
            StoreErrorKind::Corrupt,
            "{bytes:?}"
        );
        assert_eq!(
            err_kind(store.get(&key).await),
            StoreErrorKind::Corrupt,
            "{bytes:?}"
        );
        // Still there after the failed calls: nothing was silently replaced.
        assert_eq!(
            err_kind(store.begin(&req(&key)).await),
            StoreErrorKind::Corrupt,
            "{bytes:?}"
        );
        assert!(store.purge(&key).await.expect("purge"));
        assert!(matches!(
            store.begin(&req(&key)).await.expect("begin"),
            Claim::Reserved { .. }
        ));
    }
}

fn err_kind<T: std::fmt::Debug>(r: Result<T, idemkit_core::StoreError>) -> StoreErrorKind {
    match r {
        Err(e) => e.kind(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

/// A completed record lives exactly its TTL (sub-second, not rounded to seconds or minutes).
pub async fn completed_ttl_is_exact<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("ttl");
    let lease = reserve(&store, &key).await;
    let c = CompleteRequest::new(
        ResultKind::Value,
        Bytes::from_static(b"1"),
        Duration::from_millis(1_500),
    );
    store.complete(&key, &lease, &c).await.expect("complete");
    let rec = store.get(&key).await.expect("get").expect("record");
    h.advance(Duration::from_millis(1_350)).await;
    assert!(
        matches!(
            store.begin(&req(&key)).await.expect("begin"),
            Claim::Replay(_)
        ),
        "expired before its 1.5 s TTL"
    );
    h.advance(Duration::from_millis(300)).await;
    assert!(
        matches!(
            store.begin(&req(&key)).await.expect("begin"),
            Claim::Reserved { .. }
        ),
        "alive after its 1.5 s TTL (expires_at_ms {})",
        rec.expires_at_ms
    );
}

/// `get` shows the live record: state, owner, fencing, fingerprint and times.
pub async fn get_reports_the_record<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("get");
    assert_eq!(store.get(&key).await.expect("get"), None);
    let fp = Fingerprint::of(b"req");
    let r = req(&key).with_fingerprint(Some(fp));
    let Claim::Reserved {
        ownership: lease, ..
    } = store.begin(&r).await.expect("begin")
    else {
        panic!("not reserved")
    };
    let rec = store.get(&key).await.expect("get").expect("record");
    assert_eq!(rec.state, RecordState::Reserved);
    assert_eq!(
        (rec.owner, rec.fencing, rec.fingerprint),
        (lease.owner, lease.fencing, Some(fp))
    );
    let lease_ms = rec.expires_at_ms.saturating_sub(rec.created_at_ms);
    assert!(
        (900..=1_100).contains(&lease_ms),
        "lease of {lease_ms} ms, asked 1000"
    );
    store
        .complete(&key, &lease, &value("\"x\""))
        .await
        .expect("complete");
    let rec = store.get(&key).await.expect("get").expect("record");
    match rec.state {
        RecordState::Completed(o) => assert_eq!(&o.bytes()[..], b"\"x\""),
        other => panic!("expected completed, got {other:?}"),
    }
}

/// `purge` deletes whatever is there, whoever owns it, and says whether there was anything.
pub async fn purge_removes_anything<H: Harness>(h: &H)
where
    H::Store: RawStore,
{
    let store = h.store().await;
    let key = unique_key("purge");
    assert!(!store.purge(&key).await.expect("purge"));
    let lease = reserve(&store, &key).await;
    assert!(store.purge(&key).await.expect("purge"));
    assert_eq!(store.get(&key).await.expect("get"), None);
    // The purged owner's lease is gone with it.
    assert_lease_lost(
        store.complete(&key, &lease, &value("1")).await,
        "complete after purge",
    );
}

/// The longest lease and TTL the store declares are kept, not refused or overflowed.
pub async fn the_longest_durations_are_kept<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("longest");
    let max = store.max_ttl();
    let lease = match store
        .begin(&BeginRequest::new(&key, OwnerToken::random(), max))
        .await
        .expect("begin")
    {
        Claim::Reserved {
            ownership: lease, ..
        } => lease,
        other => panic!("{other:?}"),
    };
    store.renew(&key, &lease, max).await.expect("renew");
    let c = CompleteRequest::new(ResultKind::Value, "1", max);
    store.complete(&key, &lease, &c).await.expect("complete");
    assert!(matches!(
        store.begin(&req(&key)).await.expect("begin"),
        Claim::Replay(_)
    ));
    assert!(store.get(&key).await.expect("get").is_some());
}
