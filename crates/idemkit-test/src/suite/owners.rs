//! The owner's own requests: `begin` sent again by its owner (a renewal), a reused owner
//! token, `begin_many` key by key, a completion's reservation hint, a renewal after the
//! owner's own completion.

use std::time::Duration;

use idemkit_core::{BeginRequest, Claim, Fingerprint, OwnerToken, Ownership, RecordState, Store};

use super::{LEASE, TTL, assert_lease_lost, req, reserve, value};
use crate::{Harness, unique_key};

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
/// ([`CompleteRequest::reservation`](idemkit_core::CompleteRequest::reservation)) completes the reservation the store holds, whether the
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
    super::waits::wait_wakes_on(h, |store, key, lease| async move {
        let hint = Reservation::new(None, None, LEASE);
        store
            .complete(&key, &lease, &value("1").with_reservation(Some(hint)))
            .await
            .expect("complete");
    })
    .await;
}

/// A claim that finds another owner's live reservation points to it (issue 52): its fencing
/// token (the original attempt's id) and its holder, the one that reservation was made
/// with, never the asking call's; `begin_many` the same.
pub async fn an_in_flight_claim_points_to_the_original<H: Harness>(h: &H) {
    use idemkit_core::record::Holder;
    use std::sync::Arc;
    let store = h.store().await;
    let holder = Arc::new(Holder::new("host-a", 7, "original"));
    let other = Arc::new(Holder::new("host-b", 8, "duplicate"));
    let key = unique_key("pointer");
    let original = reserve_with(&store, &req(&key).with_holder(Some(&holder))).await;
    let check = |claim: Claim, what: &str| match claim {
        Claim::InFlight {
            fencing, holder: h, ..
        } => {
            assert_eq!(fencing, original.fencing, "{what}: the original's attempt");
            let h = h.unwrap_or_else(|| panic!("{what}: no holder reported"));
            assert_eq!(*h, *holder, "{what}: another holder than the original's");
        }
        other => panic!("{what}: expected in flight, got {other:?}"),
    };
    let dup = req(&key).with_holder(Some(&other));
    check(store.begin(&dup).await.expect("begin"), "begin");
    // In a batch of two (a lone request may go as a plain `begin`).
    let fresh = unique_key("pointer-fresh");
    let reqs = [
        req(&key).with_holder(Some(&other)),
        req(&fresh).with_holder(Some(&other)),
    ];
    let claim = store.begin_many(&reqs).await.swap_remove(0);
    check(claim.expect("begin_many"), "begin_many");
}
