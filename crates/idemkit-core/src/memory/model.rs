//! Model checks (loom) of MemoryStore's shard locks and wake-ups: loom runs each test's
//! threads in every interleaving their synchronisation allows. Built only with
//! `--cfg idemkit_loom`; `scripts/loom` runs them, then shows that each fails on a copy of
//! the code with one lock or one wake-up taken out.
//!
//! Time does not pass in the model (no timers; leases are an hour), so a wait ends only by
//! its wake-up: a lost wake-up is a deadlock, which loom reports as a failure.

use ::loom::future::block_on;
use ::loom::thread;

use super::*;
use crate::ident::{Key, Operation};
use crate::record::ResultKind;

const LONG: Duration = Duration::from_secs(3600);

/// Every interleaving with up to three preemptions (tokio's loom tests bound theirs the
/// same way: the bugs found in practice need few; unbounded, three threads' lock
/// operations are more orders than a run can visit).
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = ::loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

fn key() -> StorageKey {
    StorageKey::new(
        &Operation::new("op").unwrap(),
        None,
        &Key::new("k").unwrap(),
    )
}

fn reserve(store: &MemoryStore, k: &StorageKey) -> Ownership {
    match block_on(store.begin(&BeginRequest::new(k, OwnerToken::random(), LONG))).unwrap() {
        Claim::Reserved { ownership, .. } => ownership,
        other => panic!("not reserved: {other:?}"),
    }
}

/// A thread that waits on `k` while `seen` holds it.
fn wait(store: &MemoryStore, k: &StorageKey, seen: FencingToken) -> thread::JoinHandle<()> {
    let (store, k) = (store.clone(), k.clone());
    thread::spawn(move || block_on(store.wait(&k, seen, LONG)).unwrap())
}

/// A waiter that saw the reservation wakes when the owner completes, in every order of the
/// waiter's check and the completion: its `Notified` is created under the shard lock, so a
/// completion right after the check reaches it.
#[test]
fn a_completion_wakes_a_waiter_that_saw_the_reservation() {
    model(|| {
        let store = MemoryStore::new();
        let k = key();
        let lease = reserve(&store, &k);
        let waiter = wait(&store, &k, lease.fencing);
        let done = CompleteRequest::new(ResultKind::Value, "1", LONG);
        block_on(store.complete(&k, &lease, &done)).unwrap();
        waiter.join().unwrap();
        let record = block_on(store.get(&k))
            .unwrap()
            .expect("the completed record");
        assert!(matches!(record.state, RecordState::Completed(_)));
    });
}

/// The same for a release (the owner's action failed): the waiter wakes to try again.
#[test]
fn a_release_wakes_a_waiter_that_saw_the_reservation() {
    model(|| {
        let store = MemoryStore::new();
        let k = key();
        let lease = reserve(&store, &k);
        let waiter = wait(&store, &k, lease.fencing);
        block_on(store.release(&k, &lease)).unwrap();
        waiter.join().unwrap();
    });
}

/// Two callers begin on one free key at once: exactly one reserves it, the other is told
/// it is in flight under that reservation's fencing token (the shard lock makes the check
/// and the insert one step).
#[test]
fn two_concurrent_begins_reserve_once() {
    model(|| {
        let store = MemoryStore::new();
        let k = key();
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let (store, k) = (store.clone(), k.clone());
                thread::spawn(move || {
                    block_on(store.begin(&BeginRequest::new(&k, OwnerToken::random(), LONG)))
                        .unwrap()
                })
            })
            .collect();
        let claims: Vec<Claim> = callers.into_iter().map(|c| c.join().unwrap()).collect();
        let reserved: Vec<FencingToken> = claims
            .iter()
            .filter_map(|c| match c {
                Claim::Reserved { ownership, .. } => Some(ownership.fencing),
                _ => None,
            })
            .collect();
        assert_eq!(reserved.len(), 1, "{claims:?}");
        assert!(
            claims
                .iter()
                .any(|c| matches!(c, Claim::InFlight { fencing, .. } if *fencing == reserved[0])),
            "{claims:?}"
        );
    });
}
