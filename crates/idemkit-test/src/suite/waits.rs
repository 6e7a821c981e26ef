//! The wait checks: a waiter woken by each way a reservation ends, bounded by the lease,
//! and left with nothing behind when cancelled.

use std::time::Duration;

use idemkit_core::{Claim, FencingToken, Ownership, RawStore, StorageKey, Store};
use tokio::time::Instant;

use super::{req, reserve, value};
use crate::{Harness, unique_key};

/// A waiter on a reservation renewed far beyond the wait returns long before its timeout
/// when `end` ends the reservation: only a push can wake it.
pub(crate) async fn wait_wakes_on<H, F, Fut>(h: &H, end: F)
where
    H: Harness,
    F: FnOnce(H::Store, StorageKey, Ownership) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let store = h.store().await;
    let key = unique_key("wait");
    let lease = reserve(&store, &key).await;
    let timeout = Duration::from_secs(30);
    // Renew far beyond the wait, so only a push can end it early.
    store
        .renew(&key, &lease, Duration::from_secs(60))
        .await
        .expect("renew");
    let waiter = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            store
                .wait(&key, lease.fencing, timeout)
                .await
                .expect("wait");
            started.elapsed()
        })
    };
    h.advance(Duration::from_millis(50)).await; // let the waiter subscribe
    end(store, key, lease).await;
    let waited = waiter.await.expect("waiter");
    // Woken by the push: PostgreSQL's store re-checks a waited-on row every 2 s, so a wait
    // that took a second or more was not woken by this ending.
    assert!(
        waited < Duration::from_secs(1),
        "the waiter was not woken (waited {waited:?})"
    );
}

/// A waiter returns when the owner completes, long before its timeout.
pub async fn wait_wakes_on_completion<H: Harness>(h: &H) {
    wait_wakes_on(h, |store, key, lease| async move {
        store
            .complete(&key, &lease, &value("1"))
            .await
            .expect("complete");
    })
    .await;
}

/// A waiter returns when the owner releases, long before its timeout.
pub async fn wait_wakes_on_release<H: Harness>(h: &H) {
    wait_wakes_on(h, |store, key, lease| async move {
        store.release(&key, &lease).await.expect("release");
    })
    .await;
}

/// A waiter returns when an operator purges the reservation (`RawStore::purge`), long
/// before its timeout: the next delivery runs at once, not after the dead owner's lease.
pub async fn purge_wakes_waiters<H: Harness>(h: &H)
where
    H::Store: RawStore,
{
    wait_wakes_on(h, |store, key, _| async move {
        assert!(store.purge(&key).await.expect("purge"));
    })
    .await;
}

/// Waiting on a reservation that is already gone (or never was) returns at once.
pub async fn wait_returns_at_once_when_already_changed<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("wait-stale");
    let lease = reserve(&store, &key).await;
    store
        .complete(&key, &lease, &value("1"))
        .await
        .expect("complete");
    let started = Instant::now();
    store
        .wait(&key, lease.fencing, Duration::from_secs(30))
        .await
        .expect("wait");
    store
        .wait(
            &unique_key("absent"),
            FencingToken::new(1),
            Duration::from_secs(30),
        )
        .await
        .expect("wait");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited on a finished key"
    );
}

/// With no push (the owner died), a waiter returns when the lease runs out, and not a
/// millisecond before: the next `begin` reserves. A store expires a key only once its clock
/// is *past* the deadline, and a remaining time it reports is rounded, so a wait that sleeps
/// exactly that time can end on the deadline's millisecond with the key still live. One wait
/// meets that edge now and then; 32 at once, each a separate chance, meet it on most runs of
/// a store whose wait ends early.
pub async fn wait_ends_at_lease_expiry<H: Harness>(h: &H) {
    const KEYS: usize = 32;
    let store = h.store().await;
    let mut waits = Vec::with_capacity(KEYS);
    for _ in 0..KEYS {
        let key = unique_key("wait-expiry");
        let lease = reserve(&store, &key).await;
        let store = store.clone();
        waits.push(tokio::spawn(async move {
            let started = Instant::now();
            store
                .wait(&key, lease.fencing, Duration::from_secs(30))
                .await
                .expect("wait");
            let waited = started.elapsed();
            // The begin right after the wait: what a waiting caller does next.
            let claim = store.begin(&req(&key)).await.expect("begin");
            (waited, claim)
        }));
    }
    for wait in waits {
        let (waited, claim) = wait.await.expect("waiter");
        assert!(
            waited < Duration::from_secs(10),
            "waited {waited:?} past a 1 s lease"
        );
        assert!(
            matches!(claim, Claim::Reserved { .. }),
            "the wait ended while the lease was live (after {waited:?}): {claim:?}"
        );
    }
}

/// Two waiters on one reservation are both woken by its completion, well before the lease
/// would have ended.
pub async fn two_waiters_are_both_woken<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("two-waiters");
    let lease = reserve_for_30s(&store, &key).await;
    let waiters = [
        spawn_waiter(&store, &key, &lease),
        spawn_waiter(&store, &key, &lease),
    ];
    complete_wakes(h, &store, &key, &lease, waiters).await;
}

/// A waiter whose future is dropped mid-wait leaves the key as it was: a later waiter is
/// still woken by the completion.
pub async fn a_cancelled_wait_leaves_the_key_wakeable<H: Harness>(h: &H) {
    let store = h.store().await;
    let key = unique_key("cancelled-wait");
    let lease = reserve_for_30s(&store, &key).await;
    let cancelled = tokio::time::timeout(
        Duration::from_millis(100),
        store.wait(&key, lease.fencing, Duration::from_secs(30)),
    )
    .await;
    assert!(cancelled.is_err(), "the wait should still be waiting");
    let later = spawn_waiter(&store, &key, &lease);
    complete_wakes(h, &store, &key, &lease, [later]).await;
}

/// Reserves `key` and renews it to 30 s, so that only a push wakes its waiters soon.
async fn reserve_for_30s<S: Store>(store: &S, key: &StorageKey) -> Ownership {
    let lease = reserve(store, key).await;
    store
        .renew(key, &lease, Duration::from_secs(30))
        .await
        .expect("renew");
    lease
}

fn spawn_waiter<S: Store>(
    store: &S,
    key: &StorageKey,
    lease: &Ownership,
) -> tokio::task::JoinHandle<()> {
    let (store, key, fencing) = (store.clone(), key.clone(), lease.fencing);
    tokio::spawn(async move {
        store
            .wait(&key, fencing, Duration::from_secs(30))
            .await
            .expect("wait");
    })
}

/// Completes `key` and expects every waiter back within 10 s: far below the 30 s lease, so a
/// waiter that missed the push would still be sleeping.
async fn complete_wakes<H: Harness, const N: usize>(
    h: &H,
    store: &H::Store,
    key: &StorageKey,
    lease: &Ownership,
    waiters: [tokio::task::JoinHandle<()>; N],
) {
    h.advance(Duration::from_millis(200)).await;
    store
        .complete(key, lease, &value("1"))
        .await
        .expect("complete");
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(10), w)
            .await
            .expect("a waiter was not woken")
            .expect("waiter task");
    }
}
