//! Once under realistic timing (issue 20): the coordinator's defects that only show when an
//! action, a store call or a lease takes real time. Every test runs in paused tokio time on
//! `MemoryStore` behind a `Probe` that delays, fails or loses store replies, so leases,
//! renewals and completions interleave exactly where each test says. Each failed before its
//! fix; the comment on each says how.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkit_core::{
    Attempt, Coordinator, Error, InFlight, Key, LeaseLost, MemoryStore, Operation, Phase, Policy,
    Source,
};
use idemkit_test::{Fault, Mailer, Probe};
use tokio::time::{Instant, sleep};

fn op() -> Operation {
    Operation::new("mail.invoice").unwrap()
}

fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

/// Item 4: the store is down from the action's end until just before the lease ends.
///
/// Before: the completion gave up as soon as its next backoff step (50 ms doubling) would
/// pass the lease's end, at 750 ms of a 1 s lease; the store came back at 900 ms with the
/// reservation still live, nothing was stored, and the next delivery sent a second mail.
#[tokio::test(start_paused = true)]
async fn the_completion_is_retried_until_the_lease_has_really_ended() {
    let store = Probe::new(MemoryStore::new());
    let lease = Duration::from_millis(1_000);
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(lease))
        .build();
    let mailer = Mailer::default();
    let down = {
        let store = store.clone();
        move |on| {
            store.fail(Fault::Complete, on);
            store.fail(Fault::Renew, on);
        }
    };
    let healer = {
        let down = down.clone();
        async move {
            sleep(Duration::from_millis(900)).await;
            down(false);
        }
    };
    let (op, k) = (op(), key("k"));
    let (first, ()) = tokio::join!(
        c.call(&op, &k).run(|_| {
            down(true);
            mailer.send(Duration::ZERO)
        }),
        healer
    );
    let first = first.unwrap();
    assert_eq!(first.source, Source::Fresh);
    assert!(first.stored, "the completion landed before the lease ended");
    sleep(lease).await; // the lease is over either way
    let again = c
        .call(&op, &k)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (again.value.as_str(), again.source),
        ("em_1", Source::Replayed)
    );
    assert_eq!(mailer.sent(), 1);
}

/// Item 4, renewals: lease 30 ms, `max_hold` 60 ms, a completion that takes 150 ms, a
/// duplicate at 100 ms.
///
/// Before: renewals stopped at `max_hold` while the completion was on the wire, the lease
/// ended at 90 ms, the duplicate took the key over and ran the effect again (and the slow
/// completion was refused: the record was the duplicate's).
#[tokio::test(start_paused = true)]
async fn renewals_go_on_past_max_hold_while_the_completion_is_on_the_wire() {
    let store = Probe::new(MemoryStore::new());
    let policy = Policy::default()
        .lease(Duration::from_millis(30))
        .max_hold(Duration::from_millis(60))
        .in_flight(InFlight::Reject);
    let c = Coordinator::builder(store.clone()).policy(policy).build();
    let mailer = Mailer::default();
    store.delay(Fault::Complete, Duration::from_millis(150));
    let owner = {
        let mailer = mailer.clone();
        tokio::spawn(
            c.call_owned(op(), key("k"))
                .run(move |_| async move { mailer.send(Duration::ZERO).await }),
        )
    };
    sleep(Duration::from_millis(100)).await;
    let dup = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert!(
        matches!(dup, Err(Error::InFlight { .. })),
        "the duplicate ran while the owner's completion was on the wire: {dup:?}"
    );
    let owner = owner.await.unwrap().unwrap();
    assert_eq!((owner.source, owner.stored), (Source::Fresh, true));
    store.delay(Fault::Complete, Duration::ZERO);
    let again = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(again.source, Source::Replayed);
    assert_eq!(mailer.sent(), 1);
}

/// Item 5: the completion is applied, its reply is lost (the store times it out), and a
/// renewal meets the owner's own completed record.
///
/// Before: the renewal reported "lease lost" (a warning, `idemkit_lease_lost_total`, the
/// action's `lease_lost` fired), and the completion's retry then gave up because the lease
/// was marked lost, although the result was stored.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_meets_the_owners_completed_record_is_not_a_lost_lease() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::builder(store.clone())
        .policy(
            Policy::default()
                .lease(Duration::from_millis(300))
                .store_timeout(Duration::from_millis(250)),
        )
        .build();
    store.lose_reply_next(Fault::Complete, 1);
    let seen: Arc<Mutex<Option<Attempt>>> = Arc::default();
    let out = c
        .call(&op(), &key("k"))
        .run(|attempt| {
            *seen.lock().unwrap() = Some(attempt);
            async { Ok::<_, Infallible>("em_1".to_string()) }
        })
        .await
        .unwrap();
    let attempt = seen.lock().unwrap().take().unwrap();
    assert!(
        !attempt.is_lease_lost(),
        "the renewal after the completion was taken for a lost lease"
    );
    assert!(out.stored, "the result is stored: {out:?}");
    assert!(store.counts().renew >= 1, "{:?}", store.counts());
    assert!(store.counts().complete >= 2, "{:?}", store.counts());
}

/// Found by the simulation (issue 22, `idemkit-sim`): an action that returns after
/// `max_hold` (renewals stopped at 500 ms; the store holds the lease until 700 ms), whose first
/// completion's reply is lost (the store applied it).
///
/// Before: stopping the renewals had moved the lease's end back to 500 ms, so the completion
/// gave up at its first failure (at 600 ms, `stored == false`), although the store held the
/// lease for another 100 ms and a retry would have stored (here: confirmed) the result.
#[tokio::test(start_paused = true)]
async fn a_completion_after_max_hold_is_retried_while_the_store_holds_the_lease() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::builder(store.clone())
        .policy(
            Policy::default()
                .lease(Duration::from_millis(300))
                .max_hold(Duration::from_millis(500))
                .store_timeout(Duration::from_millis(50)),
        )
        .build();
    store.lose_reply_next(Fault::Complete, 1);
    let started = Instant::now();
    let out = c
        .call(&op(), &key("held"))
        .run(|_| async {
            sleep(Duration::from_millis(600)).await;
            Ok::<_, Infallible>("em_1".to_string())
        })
        .await
        .unwrap();
    assert!(
        out.stored,
        "gave up while the store held the lease: {out:?}"
    );
    assert!(store.counts().complete >= 2, "{:?}", store.counts());
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
}

/// Item 6: a `begin` that reserved and then never answered (`store_timeout` 50 ms).
///
/// Before: the reservation it left blocked every retry for the whole lease: the immediate
/// retry got `InFlight` (15 s here; ~1.4 s in the fault run).
#[tokio::test(start_paused = true)]
async fn a_reservation_whose_begin_never_answered_is_released_in_the_background() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::builder(store.clone())
        .policy(
            Policy::default()
                .store_timeout(Duration::from_millis(50))
                .in_flight(InFlight::Reject),
        )
        .build();
    let mailer = Mailer::default();
    store.lose_reply_next(Fault::Begin, 1);
    let lost = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert!(
        matches!(&lost, Err(Error::Store { phase: Phase::Begin, source }) if source.is_unavailable()),
        "{lost:?}"
    );
    sleep(Duration::from_millis(100)).await;
    let retry = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert!(
        matches!(&retry, Ok(r) if r.source == Source::Fresh),
        "the retry was blocked by the lost begin's reservation: {retry:?}"
    );
    assert_eq!(mailer.sent(), 1);
}

/// What the caller must be able to know: whether a fresh result was stored.
///
/// Before: a fresh call whose completion failed returned the same `Ok(Fresh)` as one whose
/// result was stored; the fault run's worker had to `Store::get` after every call.
#[tokio::test(start_paused = true)]
async fn a_receipt_says_whether_its_result_was_stored() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(Duration::from_millis(300)))
        .build();
    let stored = c
        .call(&op(), &key("stored"))
        .run(|_| async { Ok::<_, Infallible>(1) })
        .await
        .unwrap();
    assert_eq!((stored.source, stored.stored), (Source::Fresh, true));
    store.fail(Fault::Complete, true);
    store.fail(Fault::Renew, true);
    let unstored = c
        .call(&op(), &key("unstored"))
        .run(|_| async { Ok::<_, Infallible>(2) })
        .await
        .unwrap();
    assert_eq!((unstored.source, unstored.stored), (Source::Fresh, false));
    store.fail(Fault::Complete, false);
    store.fail(Fault::Renew, false);
    let replayed = c
        .call(&op(), &key("stored"))
        .run(|_| async { Ok::<_, Infallible>(3) })
        .await
        .unwrap();
    assert_eq!((replayed.source, replayed.stored), (Source::Replayed, true));
}

/// What the caller must be able to know: how much lease is left, as the coordinator knows
/// it, and a way to stop before an irreversible step without inventing an error type.
#[tokio::test(start_paused = true)]
async fn an_attempt_knows_its_lease_deadline_and_can_refuse_a_late_step() {
    let store = Probe::new(MemoryStore::new());
    let lease = Duration::from_millis(300);
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(lease))
        .build();
    let started = Instant::now();
    let out = c
        .call(&op(), &key("k"))
        .run(|attempt| async move {
            let deadline = attempt.lease_deadline().expect("a protected attempt");
            assert_eq!(deadline, started + lease);
            assert_eq!(attempt.lease_left(), Some(lease));
            attempt.check_lease(Duration::from_millis(100))?;
            // Renewed every 100 ms: after 250 ms the deadline has moved on.
            sleep(Duration::from_millis(250)).await;
            assert!(attempt.lease_deadline().unwrap() >= started + Duration::from_millis(500));
            // The store stops answering: no renewal is confirmed any more.
            store.fail(Fault::Renew, true);
            sleep(Duration::from_millis(300)).await;
            let left = attempt.lease_left().unwrap();
            assert!(left < Duration::from_millis(100), "{left:?}");
            let refused = attempt.check_lease(Duration::from_millis(100));
            assert!(refused.is_err());
            store.fail(Fault::Renew, false);
            refused.map(|()| "sent".to_string())
        })
        .await;
    match out {
        Err(Error::Action(LeaseLost { .. })) => {}
        other => panic!("expected the action's LeaseLost, got {other:?}"),
    }
    // An unprotected attempt has no lease to check.
    let free = Attempt::unprotected();
    assert_eq!((free.lease_deadline(), free.lease_left()), (None, None));
    assert!(free.check_lease(Duration::from_secs(1)).is_ok());
}

/// Review M2: a store that answers renewals but whose completion never answers, and which
/// declares a call bound of its own (as RedisStore does), so that the coordinator set no
/// timer on `complete`. Lease 300 ms, the default `max_hold` (an hour).
///
/// Before: the call never returned: the completion waited for ever, the renewals went on
/// past `max_hold` while it did, and every retry of the key got `InFlight`. Now the
/// completion is bounded by `store_timeout` like every store call and tried for one lease
/// from the action's end: the caller gets its value with `stored == false`, the renewals
/// stop, and the key is taken over once its lease ends (row 21's window).
#[tokio::test(start_paused = true)]
async fn a_completion_that_never_answers_returns_the_value_unstored() {
    let store = Probe::new(MemoryStore::new());
    store.declare_call_timeout(Some(Duration::from_secs(1)));
    let lease = Duration::from_millis(300);
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(lease).in_flight(InFlight::Reject))
        .build();
    let mailer = Mailer::default();
    store.hang_next(Fault::Complete, usize::MAX);
    let (op, k) = (op(), key("k"));
    let first = tokio::time::timeout(
        Duration::from_secs(60),
        c.call(&op, &k).run(|_| mailer.send(Duration::ZERO)),
    )
    .await
    .expect("the call never returned")
    .unwrap();
    assert_eq!((first.value.as_str(), first.stored), ("em_1", false));
    let renewals = store.counts().renew;
    sleep(lease + Duration::from_millis(10)).await;
    assert_eq!(
        store.counts().renew,
        renewals,
        "renewals went on after the call returned"
    );
    store.hang_next(Fault::Complete, 0);
    let next = c
        .call(&op, &k)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .expect("the key is free once the lease ended");
    assert_eq!(next.source, Source::Fresh);
}

/// Review M2: a store that answers renewals but fails every completion. Lease 300 ms, the
/// default `max_hold` (an hour), the default `store_timeout` (5 s).
///
/// Before: the completion was retried, and the lease renewed, until `max_hold`: the caller
/// waited an hour, the key `InFlight` for everyone. Now no try starts later than one lease
/// after the action returned.
#[tokio::test(start_paused = true)]
async fn a_completion_that_always_fails_is_given_up_after_a_lease() {
    let store = Probe::new(MemoryStore::new());
    let lease = Duration::from_millis(300);
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(lease))
        .build();
    let mailer = Mailer::default();
    store.fail(Fault::Complete, true);
    let (op, k) = (op(), key("k"));
    let started = Instant::now();
    let first = tokio::time::timeout(
        Duration::from_secs(60),
        c.call(&op, &k).run(|_| mailer.send(Duration::ZERO)),
    )
    .await
    .expect("the call answered only at max_hold")
    .unwrap();
    let took = started.elapsed();
    assert!(!first.stored);
    assert!(
        took <= lease,
        "the completion was tried for {took:?}, past one lease"
    );
    assert!(store.counts().complete >= 3, "{:?}", store.counts());
}

/// Review L4: a call dropped while its `begin` is on the wire (an HTTP waiter aborted with
/// its client, a runner's call cut short) whose `begin` reserved the key: the reservation
/// belongs to nobody, and is released in the background as a lost `begin`'s is (row 19).
///
/// Before: nothing released it, and every retry waited out its lease (15 s by default).
#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_its_begin_is_on_the_wire_leaves_no_reservation() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().in_flight(InFlight::Reject))
        .build();
    let mailer = Mailer::default();
    let (op, k) = (op(), key("k"));
    // The begin reaches the store and reserves; its reply never comes back.
    store.lose_reply_next(Fault::Begin, 1);
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        c.call(&op, &k).run(|_| mailer.send(Duration::ZERO)),
    )
    .await;
    assert!(dropped.is_err(), "the call answered: {dropped:?}");
    sleep(Duration::from_millis(50)).await;
    let retry = c
        .call(&op, &k)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .expect("the dropped call's reservation was left to its lease");
    assert_eq!(retry.source, Source::Fresh);
    assert_eq!(mailer.sent(), 1);
}
