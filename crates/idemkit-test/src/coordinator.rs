//! The coordinator conformance checks: end-to-end scenarios that race real tasks through a
//! [`Coordinator`] on the store under test. Each takes a [`Harness`] and panics on a violation;
//! [`coordinator_conformance!`](crate::coordinator_conformance) wraps each in a test.
//!
//! Durations are short (leases of a few hundred milliseconds) so that a network store, whose
//! clock cannot be paused, runs the whole list in seconds.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{
    BeginRequest, Claim, Coordinator, Error, ErrorKind, Fingerprint, InFlight, Key, OnCancel,
    Operation, OwnerToken, Policy, RawStore, Source, StorageKey, Store,
};
use tokio::sync::Notify;

use crate::{Fault, Harness, Mailer, Probe, assert_fails_closed_then_open};

mod prepared;
pub use prepared::{
    a_prepared_batch_runs_each_effect_once,
    a_prepared_claim_under_a_longer_call_lease_is_confirmed_first,
    a_prepared_claim_under_a_shorter_call_lease_counts_on_the_call_lease,
    a_stale_prepared_claim_runs_on_a_renewed_lease,
};

fn operation() -> Operation {
    Operation::new("coordinator.conformance").expect("valid operation")
}

/// A key no other check uses.
fn fresh_key(name: &str) -> Key {
    Key::new(format!("{name}.{:016x}", fastrand::u64(..))).expect("valid key")
}

fn policy(lease_ms: u64) -> Policy {
    Policy::default().lease(Duration::from_millis(lease_ms))
}

type Call = tokio::task::JoinHandle<Result<idemkit_core::Receipt<String>, Error<Infallible>>>;

/// `n` concurrent calls on `key` whose mail takes 200 ms.
fn spawn_callers<S: Store>(c: &Coordinator<S>, key: &Key, mailer: &Mailer, n: usize) -> Vec<Call> {
    (0..n)
        .map(|_| {
            let mailer = mailer.clone();
            tokio::spawn(
                c.call_owned(operation(), key.clone())
                    .run(move |_| async move { mailer.send(Duration::from_millis(200)).await }),
            )
        })
        .collect()
}

/// The first call runs the action; every later call with the key replays its result.
pub async fn a_replay_returns_the_first_result_without_running<H: Harness>(h: &H) {
    let c = Coordinator::new(h.store().await);
    let (op, key) = (operation(), fresh_key("replay"));
    let mailer = Mailer::default();
    let first = c.call(&op, &key).run(|_| mailer.send(Duration::ZERO)).await;
    let again = c.call(&op, &key).run(|_| mailer.send(Duration::ZERO)).await;
    let (first, again) = (first.expect("first"), again.expect("again"));
    assert_eq!(
        (first.source, again.source),
        (Source::Fresh, Source::Replayed)
    );
    assert_eq!(
        (first.value.as_str(), again.value.as_str()),
        ("em_1", "em_1")
    );
    assert_eq!(mailer.sent(), 1);
}

/// 64 concurrent callers in wait mode: one runs, all get its result.
pub async fn concurrent_waiters_get_one_result<H: Harness>(h: &H) {
    let c = Coordinator::builder(h.store().await)
        .policy(policy(1_000))
        .build();
    let mailer = Mailer::default();
    let tasks = spawn_callers(&c, &fresh_key("waiters"), &mailer, 64);
    for t in tasks {
        let out = t.await.expect("task").expect("call");
        assert_eq!(out.value, "em_1");
    }
    assert_eq!(mailer.sent(), 1);
}

/// 64 concurrent callers in reject mode: one runs, every other is told "in progress" with a
/// retry hint within the lease.
pub async fn concurrent_callers_in_reject_mode_run_once<H: Harness>(h: &H) {
    let lease = Duration::from_millis(1_000);
    let c = Coordinator::builder(h.store().await)
        .policy(Policy::default().lease(lease).in_flight(InFlight::Reject))
        .build();
    let mailer = Mailer::default();
    let tasks = spawn_callers(&c, &fresh_key("reject"), &mailer, 64);
    let (mut fresh, mut rejected) = (0, 0);
    for t in tasks {
        match t.await.expect("task") {
            Ok(out) if out.source == Source::Fresh => fresh += 1,
            Err(Error::InFlight { retry_after, .. }) => {
                assert!(retry_after <= lease, "retry_after {retry_after:?}");
                rejected += 1;
            }
            // A caller that began after the owner completed replays.
            Ok(out) => assert_eq!(out.source, Source::Replayed),
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(fresh, 1);
    assert!(rejected > 0, "no caller overlapped the owner");
    assert_eq!(mailer.sent(), 1);
}

/// A reservation whose owner died (it never renews) is taken over once its lease ends, by a
/// waiter, which then runs the action.
pub async fn a_dead_owner_is_taken_over_after_its_lease<H: Harness>(h: &H) {
    let store = h.store().await;
    let (op, key) = (operation(), fresh_key("dead-owner"));
    let sk = StorageKey::new(&op, None, &key);
    let dead = BeginRequest::new(&sk, OwnerToken::random(), Duration::from_millis(400));
    assert!(matches!(
        store.begin(&dead).await.expect("begin"),
        Claim::Reserved { .. }
    ));
    let c = Coordinator::new(store);
    let mailer = Mailer::default();
    let out = c
        .call(&op, &key)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .expect("the waiter takes over");
    assert_eq!((out.value.as_str(), out.source), ("em_1", Source::Fresh));
}

/// An owner whose key was taken from it (purged, then reserved by a successor) is told its
/// lease is lost, and its late result never overwrites the successor's.
pub async fn a_stale_owner_cannot_clobber_its_successor<H: Harness>(h: &H)
where
    H::Store: RawStore,
{
    let store = h.store().await;
    let c = Coordinator::builder(store.clone())
        .policy(policy(300))
        .build();
    let (op, key) = (operation(), fresh_key("stale"));
    let started = Arc::new(Notify::new());
    let stale = {
        let (c, key, started) = (c.clone(), key.clone(), started.clone());
        tokio::spawn(async move {
            c.call_owned(operation(), key)
                .run(move |attempt| async move {
                    started.notify_one();
                    attempt.lease_lost().await;
                    Ok::<_, Infallible>("stale".to_string())
                })
                .await
        })
    };
    wait_started(&started, "the owner").await;
    store
        .purge(&StorageKey::new(&op, None, &key))
        .await
        .expect("purge");
    let successor = c
        .call(&op, &key)
        .run(|_| async { Ok::<_, Infallible>("successor".to_string()) })
        .await
        .expect("successor");
    assert_eq!(successor.source, Source::Fresh);
    // The stale owner finishes (its action returns) but cannot store.
    let stale = stale.await.expect("task").expect("stale call");
    assert_eq!(stale.value, "stale");
    let later = c
        .call(&op, &key)
        .run(|_| async { Ok::<_, Infallible>("third".to_string()) })
        .await
        .expect("later");
    assert_eq!(
        (later.value.as_str(), later.source),
        ("successor", Source::Replayed)
    );
}

/// Waits for an action to signal that it runs; bounded, so that a scenario that went wrong
/// fails instead of hanging.
async fn wait_started(signal: &Notify, who: &str) {
    tokio::time::timeout(Duration::from_secs(30), signal.notified())
        .await
        .unwrap_or_else(|_| panic!("{who}'s action never started"));
}

/// An owner whose renewals fail loses its lease while it works; a later caller takes the key
/// over, a waiter that arrives meanwhile gets the new owner's result (pushed), and the stale
/// owner's late result never replaces it.
pub async fn an_owner_whose_renewals_fail_loses_to_its_successor<H: Harness>(h: &H) {
    let store = h.store().await;
    let policy = policy(600);
    let stale_store = Probe::new(store.clone());
    stale_store.fail(Fault::Renew, true);
    let stale = Coordinator::builder(stale_store).policy(policy).build();
    let c = Coordinator::builder(store).policy(policy).build();
    let (op, key) = (operation(), fresh_key("renewals-fail"));
    let a_started = Arc::new(Notify::new());
    let a = {
        let started = a_started.clone();
        tokio::spawn(
            stale
                .call_owned(operation(), key.clone())
                .run(move |_| async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(2_000)).await;
                    Ok::<_, Infallible>("from A".to_string())
                }),
        )
    };
    wait_started(&a_started, "A").await;
    h.advance(Duration::from_millis(800)).await; // A's lease is gone
    let b_started = Arc::new(Notify::new());
    let b = {
        let started = b_started.clone();
        tokio::spawn(
            c.call_owned(operation(), key.clone())
                .in_flight(InFlight::Reject)
                .run(move |_| async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Ok::<_, Infallible>("from B".to_string())
                }),
        )
    };
    wait_started(&b_started, "B").await; // B holds the key now
    let waited = c
        .call(&op, &key)
        .run(|_| async { Ok::<_, Infallible>("from W".to_string()) })
        .await
        .expect("waiter");
    assert_eq!(
        (waited.value.as_str(), waited.source),
        ("from B", Source::Replayed)
    );
    assert_eq!(b.await.expect("task").expect("B").source, Source::Fresh);
    // A's caller gets A's value (the action did run); the record stays B's.
    assert_eq!(a.await.expect("task").expect("A").value, "from A");
    let after = c
        .call(&op, &key)
        .run(|_| async { Ok::<_, Infallible>("x".to_string()) })
        .await
        .expect("after");
    assert_eq!(after.value, "from B");
}

/// A key reused with another fingerprint is refused while the first request runs and after
/// it completed; the same fingerprint replays.
pub async fn a_reused_key_is_refused_in_flight_and_after<H: Harness>(h: &H) {
    let c = Coordinator::builder(h.store().await)
        .policy(policy(1_000))
        .build();
    let (op, key) = (operation(), fresh_key("reused"));
    let (a, b) = (Fingerprint::of(b"amount=1"), Fingerprint::of(b"amount=2"));
    let mailer = Mailer::default();
    // The owner's action holds until the in-flight check is done: an event, not a race of
    // a 50 ms sleep against the owner's `begin` (which a busy machine lost: the second
    // caller reserved first and ran).
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let owner = {
        let (c, key, mailer) = (c.clone(), key.clone(), mailer.clone());
        tokio::spawn(async move {
            c.call_owned(operation(), key)
                .fingerprint(a)
                .run(move |_| async move {
                    let _ = started_tx.send(());
                    let _ = released.await;
                    mailer.send(Duration::ZERO).await
                })
                .await
        })
    };
    started.await.expect("the owner's action started");
    let in_flight = c
        .call(&op, &key)
        .fingerprint(b)
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert_eq!(in_flight.unwrap_err().kind(), ErrorKind::KeyReused);
    let _ = release.send(());
    owner.await.expect("task").expect("owner");
    let after = c
        .call(&op, &key)
        .fingerprint(b)
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert_eq!(after.unwrap_err().kind(), ErrorKind::KeyReused);
    let same = c
        .call(&op, &key)
        .fingerprint(a)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .expect("same request");
    assert_eq!(same.source, Source::Replayed);
    assert_eq!(mailer.sent(), 1);
}

/// A call dropped while its action runs keeps its key until the lease ends, as a crashed
/// owner would: the cancelled effect may still be landing downstream, so a retry must not
/// run it at once. Once the lease ends (it is no longer renewed), the next call runs.
pub async fn a_dropped_call_keeps_its_key_for_the_lease<H: Harness>(h: &H) {
    let lease = Duration::from_millis(600);
    let c = Coordinator::builder(h.store().await)
        .policy(Policy::default().lease(lease).in_flight(InFlight::Reject))
        .build();
    let (op, key) = (operation(), fresh_key("dropped"));
    let call = spawn_pending_owner(&c, &key).await;
    call.abort();
    let _ = call.await;
    h.advance(Duration::from_millis(100)).await;
    let next = c
        .call(&op, &key)
        .run(|_| async { Ok::<_, Infallible>("next".to_string()) })
        .await;
    assert!(
        matches!(next, Err(Error::InFlight { .. })),
        "a dropped call gave its key up before its lease ended: {next:?}"
    );
    h.advance(lease).await;
    let next = c
        .call(&op, &key)
        .run(|_| async { Ok::<_, Infallible>("next".to_string()) })
        .await
        .expect("the lease ended");
    assert_eq!(next.source, Source::Fresh);
}

/// With `OnCancel::Release`, a call dropped while its action runs releases its key from a
/// background task, so the next delivery runs at once rather than after the lease.
pub async fn a_dropped_call_releases_its_key_when_asked<H: Harness>(h: &H) {
    let c = Coordinator::builder(h.store().await)
        .policy(
            Policy::default()
                .in_flight(InFlight::Reject)
                .on_cancel(OnCancel::Release),
        )
        .build();
    let (op, key) = (operation(), fresh_key("dropped-release"));
    let call = spawn_pending_owner(&c, &key).await;
    call.abort();
    let _ = call.await;
    assert_runs_soon(h, &c, &op, &key, "the dropped call's key was not released").await;
}

/// An action that panics releases its key (the panic goes on to the caller): like an
/// action that failed, its retry runs at once, not after the lease.
pub async fn a_panicking_action_releases_its_key<H: Harness>(h: &H) {
    let c = Coordinator::builder(h.store().await)
        .policy(Policy::default().in_flight(InFlight::Reject))
        .build();
    let (op, key) = (operation(), fresh_key("panics"));
    let call = tokio::spawn(c.call_owned(operation(), key.clone()).run(|_| async {
        // Always true; opaque to the compiler, so the `Ok` below is not unreachable code.
        if std::hint::black_box(true) {
            panic!("the handler panicked");
        }
        Ok::<_, Infallible>("never".to_string())
    }));
    let joined = call.await;
    assert!(
        joined.as_ref().is_err_and(|e| e.is_panic()),
        "the panic reaches the caller: {joined:?}"
    );
    assert_runs_soon(h, &c, &op, &key, "a panicking action kept its key").await;
}

/// A call on `key` whose action never ends, once its action runs.
async fn spawn_pending_owner<S: Store>(
    c: &Coordinator<S>,
    key: &Key,
) -> tokio::task::JoinHandle<Result<idemkit_core::Receipt<String>, Error<Infallible>>> {
    let started = Arc::new(Notify::new());
    let call = {
        let started = started.clone();
        tokio::spawn(
            c.call_owned(operation(), key.clone())
                .run(move |_| async move {
                    started.notify_one();
                    std::future::pending::<Result<String, Infallible>>().await
                }),
        )
    };
    wait_started(&started, "the owner").await;
    call
}

/// The next call of `key` runs fresh within a few moments (a release in the background),
/// far below the 15 s lease.
async fn assert_runs_soon<H: Harness>(
    h: &H,
    c: &Coordinator<H::Store>,
    op: &Operation,
    key: &Key,
    failure: &str,
) {
    for _ in 0..100 {
        match c
            .call(op, key)
            .run(|_| async { Ok::<_, Infallible>("next".to_string()) })
            .await
        {
            Ok(out) => {
                assert_eq!(out.source, Source::Fresh);
                return;
            }
            Err(Error::InFlight { .. }) => h.advance(Duration::from_millis(20)).await,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    panic!("{failure}");
}

/// A waiter dropped mid-wait (a timeout, a disconnected client) changes nothing: the owner
/// completes, and the next caller replays.
pub async fn a_cancelled_waiter_changes_nothing<H: Harness>(h: &H) {
    let c = Coordinator::builder(h.store().await)
        .policy(policy(1_000))
        .build();
    let (op, key) = (operation(), fresh_key("cancelled-waiter"));
    let mailer = Mailer::default();
    // The owner holds its action until the waiter was cancelled: events, not a 50 ms sleep
    // racing the owner's `begin`.
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let owner = {
        let (c, key, mailer) = (c.clone(), key.clone(), mailer.clone());
        tokio::spawn(async move {
            c.call_owned(operation(), key)
                .run(move |_| async move {
                    let _ = started_tx.send(());
                    let _ = released.await;
                    mailer.send(Duration::ZERO).await
                })
                .await
        })
    };
    started.await.expect("the owner's action started");
    let waited = tokio::time::timeout(
        Duration::from_millis(50),
        c.call(&op, &key).run(|_| mailer.send(Duration::ZERO)),
    )
    .await;
    assert!(waited.is_err(), "the waiter should have been cancelled");
    let _ = release.send(());
    assert_eq!(owner.await.expect("task").expect("owner").value, "em_1");
    let next = c
        .call(&op, &key)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .expect("next");
    assert_eq!(
        (next.value.as_str(), next.source),
        ("em_1", Source::Replayed)
    );
    assert_eq!(mailer.sent(), 1);
}

/// A completion that fails for less than a lease is retried and stored; the next delivery
/// replays instead of running the effect again.
pub async fn a_short_outage_at_completion_is_retried<H: Harness>(h: &H) {
    let store = Probe::new(h.store().await);
    let c = Coordinator::builder(store.clone())
        .policy(policy(2_000))
        .build();
    let (op, key) = (operation(), fresh_key("completion-outage"));
    let mailer = Mailer::default();
    store.fail(Fault::Complete, true);
    let healer = {
        let store = store.clone();
        let advance = h.advance(Duration::from_millis(300));
        async move {
            advance.await;
            store.fail(Fault::Complete, false);
        }
    };
    let (first, ()) = tokio::join!(
        c.call(&op, &key).run(|_| mailer.send(Duration::ZERO)),
        healer
    );
    assert_eq!(first.expect("first").source, Source::Fresh);
    let again = c
        .call(&op, &key)
        .in_flight(InFlight::Reject)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .expect("again");
    assert_eq!(
        (again.value.as_str(), again.source),
        ("em_1", Source::Replayed)
    );
    assert!(store.counts().complete >= 2, "{:?}", store.counts());
    assert_eq!(mailer.sent(), 1);
}

/// With the store down: fail-closed runs nothing, fail-open runs unprotected.
pub async fn a_store_outage_fails_closed_or_open<H: Harness>(h: &H) {
    let store = Probe::new(h.store().await);
    store.fail(Fault::Begin, true);
    assert_fails_closed_then_open(store).await;
}

/// A permanent error is stored and replayed without running the action again.
pub async fn a_permanent_error_is_stored_and_replayed<H: Harness>(h: &H) {
    let c = Coordinator::new(h.store().await);
    let (op, key) = (operation(), fresh_key("permanent"));
    let runs = AtomicUsize::new(0);
    let declined = |_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Err::<String, _>("card declined".to_string())
    };
    let first = c.call(&op, &key).store_errors(|_| true).run(declined).await;
    assert!(matches!(first, Err(Error::ActionStored(_))), "{first:?}");
    let again = c.call(&op, &key).store_errors(|_| true).run(declined).await;
    assert!(
        matches!(again, Err(Error::ReplayedAction(ref e)) if e == "card declined"),
        "{again:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A zero TTL is a configuration error before anything runs; the longest TTL is kept.
pub async fn durations_at_the_extremes<H: Harness>(h: &H) {
    let c = Coordinator::new(h.store().await);
    let mailer = Mailer::default();
    let (op, key) = (operation(), fresh_key("extremes"));
    let zero = c
        .call(&op, &key)
        .ttl(Duration::ZERO)
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert_eq!(zero.unwrap_err().kind(), ErrorKind::Config);
    for _ in 0..2 {
        let out = c
            .call(&op, &key)
            .ttl(Duration::MAX)
            .run(|_| mailer.send(Duration::ZERO))
            .await
            .expect("a TTL of Duration::MAX");
        assert_eq!(out.value, "em_1");
    }
    assert_eq!(mailer.sent(), 1);
}

/// Review M2, on every store: a store that answers renewals but whose completions fail every
/// time, or never answer (while it declares a call bound of its own, so that the
/// coordinator had set no timer): the caller gets its value with `stored == false` once the
/// completion was tried for a lease (a hung try ends at `store_timeout`), not at `max_hold`
/// (an hour by default), and the key is taken over once the lease it was left with ends.
///
/// Before: both calls held their callers and their keys until `max_hold` (the hung one for
/// ever), the renewals going on all the while.
pub async fn a_completion_that_never_lands_answers_within_its_bound<H: Harness>(h: &H) {
    let store = Probe::new(h.store().await);
    store.declare_call_timeout(Some(Duration::from_secs(1)));
    let lease = Duration::from_millis(300);
    let c = Coordinator::builder(store.clone())
        .policy(policy(300).store_timeout(Duration::from_secs(2)))
        .build();
    let mailer = Mailer::default();
    let op = operation();
    let bound = Duration::from_secs(20);
    for hang in [false, true] {
        let key = fresh_key("completion-never-lands");
        if hang {
            store.hang_next(Fault::Complete, usize::MAX);
        } else {
            store.fail(Fault::Complete, true);
        }
        let first = tokio::time::timeout(
            bound,
            c.call(&op, &key).run(|_| mailer.send(Duration::ZERO)),
        )
        .await
        .unwrap_or_else(|_| panic!("hang {hang}: the call held its caller past {bound:?}"))
        .expect("the action's value");
        assert!(!first.stored, "hang {hang}: {first:?}");
        store.fail(Fault::Complete, false);
        store.hang_next(Fault::Complete, 0);
        h.advance(lease + Duration::from_millis(100)).await;
        let next = c
            .call(&op, &key)
            .in_flight(InFlight::Reject)
            .run(|_| mailer.send(Duration::ZERO))
            .await
            .unwrap_or_else(|e| panic!("hang {hang}: the key was not left to its lease: {e:?}"));
        assert_eq!(next.source, Source::Fresh, "hang {hang}");
    }
}
