//! The coordinator checks of batch reservations (`Coordinator::prepare`, `Call::prepared`):
//! each effect once, a stale claim confirmed before it is trusted, and the lease a claim's
//! call counts on, longer or shorter than its batch's (ARCHITECTURE row 31).

use super::*;

/// A batch reserved with `prepare`: each effect runs once (a key given twice runs once, a
/// completed key replays), and a prepared reservation that no call takes is released when
/// dropped, rather than left to block its key for the lease.
pub async fn a_prepared_batch_runs_each_effect_once<H: Harness>(h: &H) {
    let store = h.store().await;
    // A long lease: only a release frees the unused reservation within the check's time.
    let c = Coordinator::builder(store.clone())
        .policy(policy(60_000))
        .build();
    let op = operation();
    let (a, b, done) = (
        fresh_key("batch-a"),
        fresh_key("batch-b"),
        fresh_key("batch-done"),
    );
    c.call(&op, &done)
        .run(|_| async { Ok::<_, Infallible>("first".to_string()) })
        .await
        .expect("the completed key");
    let keys = [a.clone(), done.clone(), a.clone(), b.clone()];
    let prepared = c.prepare(&op, &keys).await;
    assert_eq!(prepared.len(), 4);
    let reserved: Vec<bool> = prepared.iter().map(|p| p.is_reserved()).collect();
    assert_eq!(reserved, [true, false, false, true], "{prepared:?}");
    let runs = AtomicUsize::new(0);
    let mut prepared = prepared.into_iter();
    let mut values = Vec::new();
    for key in &keys[..3] {
        let p = prepared.next().expect("one per key");
        let receipt = c
            .call(&op, key)
            .prepared(p)
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>(format!("v-{key}"))
            })
            .await
            .expect("call");
        values.push((receipt.value, receipt.source));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "only a's first copy ran: {values:?}"
    );
    assert_eq!(values[0], (format!("v-{a}"), Source::Fresh));
    assert_eq!(values[1], ("first".to_string(), Source::Replayed));
    assert_eq!(values[2], (format!("v-{a}"), Source::Replayed));
    // b's reservation is dropped unused: released (from a background task).
    drop(prepared);
    let b_key = StorageKey::new(&op, None, &b);
    let mut released = false;
    for _ in 0..250 {
        if store.get(&b_key).await.expect("get").is_none() {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(released, "an unused prepared reservation is released");
    let r = c
        .call(&op, &b)
        .in_flight(InFlight::Reject)
        .run(|_| async { Ok::<_, Infallible>("b".to_string()) })
        .await
        .expect("b is free");
    assert_eq!(r.source, Source::Fresh);
}

/// A prepared reservation that waited longer than a renewal interval (its batch's earlier
/// messages were slow) is confirmed by a `begin` with its owner token, which renews it: the
/// action then runs on a lease that lasts. A duplicate at the batch's original lease end is
/// refused, the owner is not told its lease is lost, and its result is stored.
///
/// Before the fix, the confirming `begin` left the store's lease where the batch had set it
/// while the coordinator counted a fresh one from the confirmation: the duplicate ran too.
pub async fn a_stale_prepared_claim_runs_on_a_renewed_lease<H: Harness>(h: &H) {
    let store = h.store().await;
    let lease = Duration::from_millis(600);
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(lease))
        .build();
    let op = operation();
    let key = fresh_key("batch-stale");
    let mut prepared = c.prepare(&op, std::slice::from_ref(&key)).await;
    let p = prepared.pop().expect("one");
    assert!(p.is_reserved());
    // The batch's earlier messages took 0.8 of a lease.
    h.advance(lease * 4 / 5).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let lost_at_old_expiry = Arc::new(std::sync::Mutex::new(None));
    let started = Arc::new(Notify::new());
    let owner = {
        let (runs, lost, started) = (runs.clone(), lost_at_old_expiry.clone(), started.clone());
        tokio::spawn(c.call_owned(operation(), key.clone()).prepared(p).run(
            move |attempt| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                started.notify_one();
                // Past the batch's lease end (1.07 leases after the prepare).
                tokio::time::sleep(lease / 4 + Duration::from_millis(10)).await;
                *lost.lock().expect("lock") = Some(attempt.is_lease_lost());
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok::<_, Infallible>("once".to_string())
            },
        ))
    };
    wait_started(&started, "the batch's owner").await;
    // 1.1 leases after the prepare: the batch's lease would have ended.
    h.advance(lease / 4 + Duration::from_millis(30)).await;
    let dup = c
        .call(&op, &key)
        .in_flight(InFlight::Reject)
        .run(|_| async { Ok::<_, Infallible>("dup".to_string()) })
        .await;
    assert!(
        matches!(dup, Err(Error::InFlight { .. })),
        "a duplicate ran beside the batch's owner: {dup:?}"
    );
    let r = owner.await.expect("task").expect("the prepared call");
    assert_eq!((r.value.as_str(), r.source), ("once", Source::Fresh));
    assert!(r.stored, "the owner's result is stored");
    assert_eq!(
        *lost_at_old_expiry.lock().expect("lock"),
        Some(false),
        "the owner was told its lease was lost"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let again = c
        .call(&op, &key)
        .run(|_| async { Ok::<_, Infallible>("again".to_string()) })
        .await
        .expect("replay");
    assert_eq!(
        (again.value.as_str(), again.source),
        ("once", Source::Replayed)
    );
}

/// A prepared claim whose call runs with a longer lease than the batch reserved with is
/// confirmed by a `begin` before the action runs: the store held the batch's lease, not the
/// call's, so a claim still "fresh" by the call's renewal interval may have ended already.
///
/// Before the fix (review M1), the claim aged 1.2 batch leases was trusted because it was
/// younger than a third of the call's lease: the duplicate took the key over and ran too.
pub async fn a_prepared_claim_under_a_longer_call_lease_is_confirmed_first<H: Harness>(h: &H) {
    let store = h.store().await;
    let batch_lease = Duration::from_millis(500);
    let call_lease = Duration::from_millis(2_000);
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(batch_lease))
        .build();
    let (op, key) = (operation(), fresh_key("batch-longer-call-lease"));
    let p = c
        .prepare(&op, std::slice::from_ref(&key))
        .await
        .pop()
        .expect("one");
    assert!(p.is_reserved());
    // The batch's lease is over; 600 ms is still under a third of the call's lease.
    h.advance(Duration::from_millis(600)).await;
    let started = Arc::new(Notify::new());
    let owner = {
        let started = started.clone();
        tokio::spawn(
            c.call_owned(op.clone(), key.clone())
                .policy(Policy::default().lease(call_lease))
                .prepared(p)
                .run(move |attempt| async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Ok::<_, Infallible>(attempt.is_lease_lost())
                }),
        )
    };
    wait_started(&started, "the batch's owner").await;
    h.advance(Duration::from_millis(100)).await;
    let dup = c
        .call(&op, &key)
        .in_flight(InFlight::Reject)
        .run(|_| async { Ok::<_, Infallible>(false) })
        .await;
    assert!(
        matches!(dup, Err(Error::InFlight { .. })),
        "a duplicate ran beside the batch's owner: {dup:?}"
    );
    let r = owner.await.expect("task").expect("the prepared call");
    assert_eq!(r.source, Source::Fresh);
    assert!(!r.value, "the owner was told its lease was lost");
    assert!(r.stored, "the owner's result is stored");
}

/// Review M6 (of `e047556`), on every store: a prepared claim handed to a call whose lease is
/// *shorter* than the batch's. The call's first renewal sets the store's end to the call's
/// lease (every store's renew sets the end, it does not extend it), so from then on the store
/// holds no more than that: the owner must count on no more either (core invariant 2). Here
/// every renewal after the first fails; once a duplicate has taken the key over, the owner's
/// `is_lease_lost()` must say so.
///
/// Before: the owner counted on the batch's 6 s lease from the claim's send, so its action saw
/// its lease as held for seconds after another caller had reserved the key and run.
pub async fn a_prepared_claim_under_a_shorter_call_lease_counts_on_the_call_lease<H: Harness>(
    h: &H,
) {
    let store = Probe::new(h.store().await);
    let batch_lease = Duration::from_secs(6);
    let call_lease = Duration::from_millis(600);
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(batch_lease))
        .build();
    let (op, key) = (operation(), fresh_key("batch-shorter-call-lease"));
    let p = c
        .prepare(&op, std::slice::from_ref(&key))
        .await
        .pop()
        .expect("one");
    assert!(p.is_reserved());
    h.advance(Duration::from_millis(50)).await;
    let started = Arc::new(Notify::new());
    let check = Arc::new(Notify::new());
    let owner = {
        let (started, check) = (started.clone(), check.clone());
        tokio::spawn(
            c.call_owned(op.clone(), key.clone())
                .policy(Policy::default().lease(call_lease))
                .prepared(p)
                .run(move |attempt| async move {
                    started.notify_one();
                    check.notified().await;
                    Ok::<_, Infallible>(attempt.is_lease_lost())
                }),
        )
    };
    wait_started(&started, "the batch's owner").await;
    // The first renewal (a third of the call's lease after the claim's send) goes through and
    // sets the store's end to the call's lease from then; every later one fails.
    let mut waited = Duration::ZERO;
    while store.counts().renew == 0 {
        assert!(waited < Duration::from_secs(5), "the owner never renewed");
        h.advance(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    store.fail(Fault::Renew, true);
    // A duplicate reserves once the store has let the key go (well before the batch's lease
    // would end).
    let mut waited = Duration::ZERO;
    loop {
        let dup = c
            .call(&op, &key)
            .in_flight(InFlight::Reject)
            .run(|_| async { Ok::<_, Infallible>(false) })
            .await;
        match dup {
            Ok(r) => {
                assert_eq!(r.source, Source::Fresh, "{r:?}");
                break;
            }
            Err(Error::InFlight { .. }) => {}
            Err(e) => panic!("the duplicate: {e:?}"),
        }
        assert!(
            waited < Duration::from_secs(3),
            "the store kept the key past the call's lease"
        );
        h.advance(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }
    check.notify_one();
    let r = owner.await.expect("task").expect("the prepared call");
    assert!(
        r.value,
        "the owner counted on its lease after another caller had taken the key over"
    );
    store.fail(Fault::Renew, false);
}
