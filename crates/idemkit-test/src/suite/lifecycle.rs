//! The state machine's checks: one owner under contention, replay, fingerprints, lease
//! expiry and takeover, a stale owner refused, release, renewal, completion and fencing.

use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    Claim, CompleteRequest, FencingToken, Fingerprint, Ownership, RecordState, ResultKind,
    StorageKey, Store,
};

use super::{LEASE, TTL, assert_lease_lost, req, reserve, value};
use crate::{Harness, unique_key};

/// 32 concurrent `begin`s on one key: exactly one reserves, every other sees it in flight.
pub async fn reserve_once_under_contention<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("contention");
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move { store.begin(&req(&key)).await.expect("begin") })
        })
        .collect();
    let mut reserved = 0;
    let mut in_flight = 0;
    for t in tasks {
        match t.await.expect("task") {
            Claim::Reserved { .. } => reserved += 1,
            Claim::InFlight { retry_after, .. } => {
                assert!(
                    retry_after <= LEASE,
                    "retry_after {retry_after:?} beyond the lease"
                );
                in_flight += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((reserved, in_flight), (1, 31));
}

/// A completed key returns its outcome, bytes and fencing token, to any later caller.
pub async fn replay_returns_the_completed_outcome<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("replay");
    let lease = reserve(&store, &key).await;
    store
        .complete(&key, &lease, &value("\"em_1\""))
        .await
        .expect("complete");
    for _ in 0..2 {
        match store.begin(&req(&key)).await.expect("begin") {
            Claim::Replay(c) => {
                assert_eq!(c.fencing, lease.fencing);
                assert_eq!(c.outcome.kind(), ResultKind::Value);
                assert_eq!(&c.outcome.bytes()[..], b"\"em_1\"");
            }
            other => panic!("expected a replay, got {other:?}"),
        }
    }
    // The other outcome kinds round-trip too.
    for kind in [ResultKind::PermanentError, ResultKind::Unavailable] {
        let key = unique_key("replay-kind");
        let lease = reserve(&store, &key).await;
        let c = CompleteRequest::new(kind, Bytes::from_static(b"why"), TTL);
        store.complete(&key, &lease, &c).await.expect("complete");
        match store.begin(&req(&key)).await.expect("begin") {
            Claim::Replay(c) => assert_eq!(c.outcome.kind(), kind),
            other => panic!("expected a replay, got {other:?}"),
        }
    }
}

/// A different fingerprint is refused while the key is reserved and after it completed;
/// "no fingerprint" is a value of its own.
pub async fn fingerprint_mismatch_is_reported<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("fingerprint");
    let a = Some(Fingerprint::of(b"amount=100"));
    let b = Some(Fingerprint::of(b"amount=200"));
    let with = |fp| req(&key).with_fingerprint(fp);
    let Claim::Reserved {
        ownership: lease, ..
    } = store.begin(&with(a)).await.expect("begin")
    else {
        panic!("not reserved")
    };
    assert_eq!(store.begin(&with(b)).await.expect("begin"), Claim::Mismatch);
    assert!(matches!(
        store.begin(&with(a)).await.expect("begin"),
        Claim::InFlight { .. }
    ));
    store
        .complete(&key, &lease, &value("1"))
        .await
        .expect("complete");
    assert_eq!(store.begin(&with(b)).await.expect("begin"), Claim::Mismatch);
    assert_eq!(
        store.begin(&with(None)).await.expect("begin"),
        Claim::Mismatch
    );
    assert!(matches!(
        store.begin(&with(a)).await.expect("begin"),
        Claim::Replay(_)
    ));
}

/// After the lease runs out, the next `begin` takes the key over with a higher fencing token.
pub async fn lease_expiry_allows_takeover<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("takeover");
    let first = reserve(&store, &key).await;
    h.advance(LEASE + Duration::from_millis(100)).await;
    match store.begin(&req(&key)).await.expect("begin") {
        // `took_over` is informational: a store that forgets expired keys (Redis) reports false.
        Claim::Reserved {
            ownership: lease, ..
        } => {
            assert!(lease.fencing > first.fencing);
            assert_ne!(lease.owner, first.owner);
        }
        other => panic!("expected a takeover, got {other:?}"),
    }
}

/// An owner whose lease expired and whose key was taken over can neither extend, overwrite
/// nor delete its successor's reservation or record.
pub async fn stale_owner_cannot_renew_complete_or_release<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("stale");
    let stale = reserve(&store, &key).await;
    // Expired, not yet taken over: the stale owner is already out.
    h.advance(LEASE + Duration::from_millis(100)).await;
    assert_lease_lost(store.renew(&key, &stale, LEASE).await, "renew after expiry");
    let fresh = reserve(&store, &key).await;

    assert_lease_lost(store.renew(&key, &stale, LEASE).await, "stale renew");
    assert_lease_lost(
        store.complete(&key, &stale, &value("\"stale\"")).await,
        "stale complete",
    );
    assert_lease_lost(store.release(&key, &stale).await, "stale release");
    let rec = store
        .get(&key)
        .await
        .expect("get")
        .expect("the fresh reservation is there");
    assert_eq!(
        (rec.state, rec.owner, rec.fencing),
        (RecordState::Reserved, fresh.owner, fresh.fencing)
    );

    store
        .complete(&key, &fresh, &value("\"fresh\""))
        .await
        .expect("fresh complete");
    assert_lease_lost(
        store.complete(&key, &stale, &value("\"stale\"")).await,
        "stale overwrite",
    );
    assert_lease_lost(store.release(&key, &stale).await, "stale delete");
    match store.begin(&req(&key)).await.expect("begin") {
        Claim::Replay(c) => {
            assert_eq!(&c.outcome.bytes()[..], b"\"fresh\"");
            assert_eq!(c.fencing, fresh.fencing);
        }
        other => panic!("expected the fresh owner's record, got {other:?}"),
    }
}

/// Release deletes the owner's reservation: the next caller reserves at once.
pub async fn release_frees_the_key<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("release");
    let first = reserve(&store, &key).await;
    store.release(&key, &first).await.expect("release");
    assert_eq!(store.get(&key).await.expect("get"), None);
    match store.begin(&req(&key)).await.expect("begin") {
        Claim::Reserved {
            ownership: lease,
            took_over,
        } => {
            assert!(!took_over);
            assert!(lease.fencing > first.fencing);
        }
        other => panic!("expected a reservation, got {other:?}"),
    }
    // Releasing twice is not an owner's success: the key is no longer ours.
    assert_lease_lost(store.release(&key, &first).await, "second release");
}

/// Renewal pushes the lease's end out from the moment of renewal.
pub async fn renew_extends_the_lease<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("renew");
    let lease = reserve(&store, &key).await;
    h.advance(Duration::from_millis(600)).await;
    store.renew(&key, &lease, LEASE).await.expect("renew");
    h.advance(Duration::from_millis(600)).await;
    // 1.2 s after reserving with a 1 s lease: alive only because of the renewal.
    match store.begin(&req(&key)).await.expect("begin") {
        Claim::InFlight {
            fencing,
            retry_after,
            ..
        } => {
            assert_eq!(fencing, lease.fencing);
            assert!(
                retry_after <= Duration::from_millis(400),
                "retry_after {retry_after:?}"
            );
        }
        other => panic!("expected the renewed lease in flight, got {other:?}"),
    }
    h.advance(Duration::from_millis(600)).await;
    assert!(matches!(
        store.begin(&req(&key)).await.expect("begin"),
        Claim::Reserved { .. }
    ));
}

/// Completing twice with the same lease succeeds and changes nothing (a retried completion).
pub async fn completion_is_idempotent_for_its_owner<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("complete-twice");
    let lease = reserve(&store, &key).await;
    store
        .complete(&key, &lease, &value("\"a\""))
        .await
        .expect("complete");
    store
        .complete(&key, &lease, &value("\"a\""))
        .await
        .expect("complete again");
    match store.begin(&req(&key)).await.expect("begin") {
        Claim::Replay(c) => assert_eq!(&c.outcome.bytes()[..], b"\"a\""),
        other => panic!("expected a replay, got {other:?}"),
    }
    // A completed key cannot be released by its owner; a renewal changes nothing (see
    // `renew_after_its_own_completion_succeeds`).
    assert_lease_lost(store.release(&key, &lease).await, "release completed");
}

/// Across release, expiry, takeover and TTL expiry, each new reservation's token is larger.
pub async fn fencing_tokens_strictly_increase<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("fencing");
    let first = reserve(&store, &key).await.fencing;
    let mut tokens = vec![first];
    let l = reserve_after_release(&store, &key, first).await;
    tokens.push(l.fencing);
    h.advance(LEASE + Duration::from_millis(100)).await;
    let l = reserve(&store, &key).await;
    tokens.push(l.fencing);
    let c = CompleteRequest::new(
        ResultKind::Value,
        Bytes::from_static(b"1"),
        Duration::from_millis(200),
    );
    store.complete(&key, &l, &c).await.expect("complete");
    h.advance(Duration::from_millis(300)).await;
    tokens.push(reserve(&store, &key).await.fencing);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens {tokens:?}"
    );
}

async fn reserve_after_release<S: Store>(
    store: &S,
    key: &StorageKey,
    seen: FencingToken,
) -> Ownership {
    let rec = store.get(key).await.expect("get").expect("reserved");
    assert_eq!(rec.fencing, seen);
    store
        .release(key, &Ownership::new(rec.owner, rec.fencing))
        .await
        .expect("release");
    reserve(store, key).await
}

/// An owner whose lease expired cannot complete, even while nobody has taken the key over
/// yet; the key is then free for the next caller.
pub async fn complete_after_expiry_before_takeover_is_refused<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("late-complete");
    let lease = reserve(&store, &key).await;
    h.advance(LEASE + Duration::from_millis(100)).await;
    assert_lease_lost(
        store.complete(&key, &lease, &value("\"late\"")).await,
        "late complete",
    );
    assert!(matches!(
        store.begin(&req(&key)).await.expect("begin"),
        Claim::Reserved { .. }
    ));
}
