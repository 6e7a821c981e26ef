//! The conformance checks. Each takes a [`Harness`] and panics on a violation of the
//! `Store` contract; [`store_conformance!`](crate::store_conformance) wraps each in a test.

use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, FencingToken, Fingerprint, OwnerToken, Ownership,
    RawStore, Record, RecordState, ResultKind, StorageKey, Store, StoreErrorKind,
};

use crate::{Harness, unique_key};

mod arbitrary;
mod waits;

pub use arbitrary::*;
pub use waits::*;

const LEASE: Duration = Duration::from_millis(1_000);
const TTL: Duration = Duration::from_secs(60);

fn req(key: &StorageKey) -> BeginRequest<'_> {
    BeginRequest::new(key, OwnerToken::random(), LEASE)
}

async fn reserve<S: Store>(store: &S, key: &StorageKey) -> Ownership {
    match store.begin(&req(key)).await.expect("begin") {
        Claim::Reserved {
            ownership: lease, ..
        } => lease,
        other => panic!("expected a reservation, got {other:?}"),
    }
}

fn value(bytes: &'static str) -> CompleteRequest {
    CompleteRequest::new(ResultKind::Value, Bytes::from_static(bytes.as_bytes()), TTL)
}

fn assert_lease_lost<T: std::fmt::Debug>(r: Result<T, idemkit_core::StoreError>, what: &str) {
    match r {
        Err(e) if e.kind() == StoreErrorKind::LeaseLost => {}
        other => panic!("{what}: expected LeaseLost, got {other:?}"),
    }
}

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

/// A `begin` sent again by the owner that already holds the key (its first reply was lost,
/// a client retried it) gets its own reservation back, not "in flight".
pub async fn begin_is_idempotent_for_its_own_owner<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("begin-twice");
    let first = req(&key);
    let lease = match store.begin(&first).await.expect("begin") {
        Claim::Reserved {
            ownership: lease, ..
        } => lease,
        other => panic!("expected a reservation, got {other:?}"),
    };
    match store.begin(&first).await.expect("begin again") {
        Claim::Reserved {
            ownership: again, ..
        } => assert_eq!(again, lease),
        other => panic!("the owner's own retried begin got {other:?}"),
    }
    // Anybody else still sees it in flight.
    assert!(matches!(
        store.begin(&req(&key)).await.expect("begin"),
        Claim::InFlight { .. }
    ));
    store
        .complete(&key, &lease, &value("1"))
        .await
        .expect("complete");
}

/// A lease is its owner token *and* its fencing token: an owner token used again for a later
/// reservation of the key (a fixed worker id) cannot renew, complete or release that later
/// reservation with the earlier lease.
pub async fn a_reused_owner_token_cannot_act_on_a_later_reservation<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("reused-owner");
    let owner = OwnerToken::random();
    let begin = |key| BeginRequest::new(key, owner, LEASE);
    let stale = match store.begin(&begin(&key)).await.expect("begin") {
        Claim::Reserved {
            ownership: lease, ..
        } => lease,
        other => panic!("{other:?}"),
    };
    h.advance(LEASE + Duration::from_millis(100)).await;
    let fresh = match store.begin(&begin(&key)).await.expect("begin") {
        Claim::Reserved {
            ownership: lease, ..
        } => lease,
        other => panic!("{other:?}"),
    };
    assert_eq!(fresh.owner, stale.owner);
    assert!(fresh.fencing > stale.fencing);
    assert_lease_lost(store.renew(&key, &stale, LEASE).await, "stale renew");
    assert_lease_lost(
        store.complete(&key, &stale, &value("\"stale\"")).await,
        "stale complete",
    );
    assert_lease_lost(store.release(&key, &stale).await, "stale release");
    // The later reservation is untouched and still works.
    store
        .complete(&key, &fresh, &value("\"fresh\""))
        .await
        .expect("fresh complete");
    match store.begin(&req(&key)).await.expect("begin") {
        Claim::Replay(c) => assert_eq!(c.fencing, fresh.fencing),
        other => panic!("{other:?}"),
    }
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

/// `begin_many` answers each key as `begin` would, in order: a completed key is replayed,
/// a key another owner holds is in flight, a fresh key is reserved for its request's owner;
/// an empty batch is answered with nothing.
pub async fn begin_many_answers_each_key_as_begin_would<H: Harness>(h: &H) {
    let store = h.store().await;
    let (done, held, fresh) = (
        unique_key("many-done"),
        unique_key("many-held"),
        unique_key("many-fresh"),
    );
    let d = reserve(&store, &done).await;
    store
        .complete(&done, &d, &value("\"em_1\""))
        .await
        .expect("complete");
    let other = reserve(&store, &held).await;
    let reqs = [req(&done), req(&held), req(&fresh)];
    let claims = store.begin_many(&reqs).await;
    assert_eq!(claims.len(), 3, "one claim per key: {claims:?}");
    match &claims[0] {
        Ok(Claim::Replay(r)) => {
            assert_eq!(r.fencing, d.fencing);
            assert_eq!(&r.outcome.bytes()[..], b"\"em_1\"");
        }
        other => panic!("a completed key: expected a replay, got {other:?}"),
    }
    match &claims[1] {
        Ok(Claim::InFlight { fencing, .. }) => assert_eq!(*fencing, other.fencing),
        other => panic!("a held key: expected in flight, got {other:?}"),
    }
    let mine = match &claims[2] {
        Ok(Claim::Reserved { ownership, .. }) => *ownership,
        other => panic!("a fresh key: expected a reservation, got {other:?}"),
    };
    assert_eq!(
        mine.owner, reqs[2].owner,
        "reserved for its request's owner"
    );
    // The batch's reservation is a real one: its owner completes it, and a second batch
    // with the same owner token is answered as that reservation (a retried batch).
    let again = store.begin_many(&[reqs[2]]).await;
    assert!(
        matches!(&again[0], Ok(Claim::Reserved { ownership, .. }) if *ownership == mine),
        "{again:?}"
    );
    store
        .complete(&fresh, &mine, &value("\"em_2\""))
        .await
        .expect("the batch's owner completes");
    assert!(store.begin_many(&[]).await.is_empty());
}

/// A `begin` sent again by the key's owner is a renewal: it extends the lease to its
/// `lease` from now, as `renew` would. A claim confirmed late (a batch's reservation, a
/// `begin` whose reply was lost) then runs on the lease its caller believes in.
pub async fn begin_by_its_own_owner_renews_the_lease<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("begin-renews");
    let first = req(&key);
    let lease = reserve_with(&store, &first).await;
    h.advance(Duration::from_millis(600)).await;
    match store.begin(&first).await.expect("begin again") {
        Claim::Reserved { ownership, .. } => assert_eq!(ownership, lease),
        other => panic!("the owner's own begin got {other:?}"),
    }
    h.advance(Duration::from_millis(600)).await;
    // 1.2 s after reserving with a 1 s lease: alive only because the second begin renewed it.
    match store.begin(&req(&key)).await.expect("begin") {
        Claim::InFlight { fencing, .. } => assert_eq!(fencing, lease.fencing),
        other => panic!("expected the renewed lease in flight, got {other:?}"),
    }
    // The same through a batch: two keys reserved together, confirmed together later.
    let (a, b) = (unique_key("batch-renews-a"), unique_key("batch-renews-b"));
    let reqs = [req(&a), req(&b)];
    let claims = store.begin_many(&reqs).await;
    assert!(
        claims
            .iter()
            .all(|c| matches!(c, Ok(Claim::Reserved { .. }))),
        "{claims:?}"
    );
    h.advance(Duration::from_millis(600)).await;
    let again = store.begin_many(&reqs).await;
    for (claim, first) in again.iter().zip(&claims) {
        match (claim, first) {
            (Ok(Claim::Reserved { ownership, .. }), Ok(Claim::Reserved { ownership: o, .. })) => {
                assert_eq!(ownership, o)
            }
            other => panic!("the batch's own begin got {other:?}"),
        }
    }
    h.advance(Duration::from_millis(600)).await;
    for key in [&a, &b] {
        assert!(
            matches!(
                store.begin(&req(key)).await.expect("begin"),
                Claim::InFlight { .. }
            ),
            "a batch's reservation confirmed by its owner's begin_many expired with its first lease"
        );
    }
}

/// A renewal that meets its owner's own completed record (a completion and a renewal on the
/// wire together, the completion first) succeeds and changes nothing: the owner's lease was
/// not lost, its result is stored.
pub async fn renew_after_its_own_completion_succeeds<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("renew-completed");
    let lease = reserve(&store, &key).await;
    store
        .complete(&key, &lease, &value("\"em_1\""))
        .await
        .expect("complete");
    store
        .renew(&key, &lease, LEASE)
        .await
        .expect("a renewal after the owner's own completion");
    match store.begin(&req(&key)).await.expect("begin") {
        Claim::Replay(r) => assert_eq!(&r.outcome.bytes()[..], b"\"em_1\""),
        other => panic!("the completed record changed: {other:?}"),
    }
    // Someone else's completed record is still refused.
    let other = Ownership::new(OwnerToken::random(), lease.fencing);
    assert_lease_lost(
        store.renew(&key, &other, LEASE).await,
        "a stranger's renewal",
    );
    h.advance(Duration::ZERO).await;
}

async fn reserve_with<S: Store>(store: &S, req: &BeginRequest<'_>) -> Ownership {
    match store.begin(req).await.expect("begin") {
        Claim::Reserved { ownership, .. } => ownership,
        other => panic!("expected a reservation, got {other:?}"),
    }
}

/// A completion that says what its reservation was made with
/// ([`CompleteRequest::reservation`]) completes the reservation the store holds, whether the
/// hint is right or wrong: the fingerprint and holder of the completed record are the
/// reservation's, a stale owner's hinted completion changes nothing, and a waiter is woken.
pub async fn a_completion_keeps_the_reservation_it_completes<H: Harness>(h: &H) {
    use idemkit_core::record::Holder;
    use idemkit_core::store::Reservation;
    use std::sync::Arc;
    let store = h.store().await;
    let a = Some(Fingerprint::of(b"amount=100"));
    let holder = Arc::new(Holder::new("host-a", 7, "worker"));
    let other = Arc::new(Holder::new("host-b", 8, "other"));
    let hints = [
        // What the caller did reserve with (the coordinator's hint).
        Some(Reservation::new(a, Some(holder.clone()), LEASE)),
        // Wrong in every part: the store must go by what it holds.
        Some(Reservation::new(None, Some(other.clone()), TTL)),
        Some(Reservation::new(a, None, LEASE)),
        Some(Reservation::new(
            Some(Fingerprint::of(b"x")),
            Some(holder.clone()),
            LEASE,
        )),
        None,
    ];
    for (i, hint) in hints.into_iter().enumerate() {
        let key = unique_key("hinted");
        let begin = req(&key).with_fingerprint(a).with_holder(Some(&holder));
        let lease = reserve_with(&store, &begin).await;
        let done = value("\"em_1\"").with_reservation(hint.clone());
        store
            .complete(&key, &lease, &done)
            .await
            .unwrap_or_else(|e| panic!("hint {i}: complete: {e}"));
        match store
            .begin(&req(&key).with_fingerprint(a))
            .await
            .expect("begin")
        {
            Claim::Replay(r) => assert_eq!(&r.outcome.bytes()[..], b"\"em_1\"", "hint {i}"),
            other => panic!("hint {i}: expected a replay, got {other:?}"),
        }
        assert_eq!(
            store.begin(&req(&key)).await.expect("begin"),
            Claim::Mismatch,
            "hint {i}: the completed record lost its fingerprint"
        );
        let rec = store.get(&key).await.expect("get").expect("record");
        assert_eq!(rec.fingerprint, a, "hint {i}");
        assert_eq!(rec.holder.as_deref(), Some(&*holder), "hint {i}: holder");
        // Retried with the same hint: the same owner's completion succeeds, changes nothing.
        store
            .complete(&key, &lease, &value("\"em_2\"").with_reservation(hint))
            .await
            .unwrap_or_else(|e| panic!("hint {i}: retried complete: {e}"));
        match store.get(&key).await.expect("get").expect("record").state {
            RecordState::Completed(o) => assert_eq!(&o.bytes()[..], b"\"em_1\"", "hint {i}"),
            other => panic!("hint {i}: expected completed, got {other:?}"),
        }
    }

    // A stale owner with a hint that describes its own reservation exactly cannot complete
    // its successor's.
    let key = unique_key("hinted-stale");
    let begin = req(&key).with_holder(Some(&holder));
    let stale = reserve_with(&store, &begin).await;
    h.advance(LEASE + Duration::from_millis(200)).await;
    let next = reserve_with(&store, &req(&key).with_holder(Some(&holder))).await;
    let hinted = value("\"stale\"").with_reservation(Some(begin.reservation()));
    assert_lease_lost(
        store.complete(&key, &stale, &hinted).await,
        "a stale owner's hinted completion",
    );
    let rec = store.get(&key).await.expect("get").expect("record");
    assert_eq!(
        (rec.state, rec.fencing),
        (RecordState::Reserved, next.fencing)
    );

    // A waiter on a reservation is woken by a hinted completion.
    waits::wait_wakes_on(h, |store, key, lease| async move {
        let hint = Reservation::new(None, None, LEASE);
        store
            .complete(&key, &lease, &value("1").with_reservation(Some(hint)))
            .await
            .expect("complete");
    })
    .await;
}
