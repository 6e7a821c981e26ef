//! Model checks (loom) of the Redis store's client-side synchronisation: the waiter
//! registry (the coalescing queue's are idemkit-coalesce's own). loom runs each test's threads in every
//! interleaving (up to three preemptions). Built only with `--cfg idemkit_loom`;
//! `scripts/loom` runs them, then shows that each fails on a copy of the code with one lock
//! or one wake-up taken out.

use std::sync::Arc;

use ::loom::future::block_on;
use ::loom::sync::Mutex;
use ::loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use ::loom::thread;

use crate::wake::Waiters;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = ::loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// Two waiters on one channel: one leaves (its wait was cancelled) while the other joins
/// and waits; a push comes once the second waiter's wake-up exists. In every interleaving
/// the second waiter is woken (the channel's entry outlives any waiter on it), and the
/// last waiter to leave unsubscribes, once.
#[test]
fn a_push_wakes_the_waiters_of_a_channel_while_others_leave() {
    model(|| {
        let waiters = Arc::new(Waiters::default());
        let unsubscribed = Arc::new(AtomicUsize::new(0));
        let leave = |unsubscribed: &Arc<AtomicUsize>| {
            let unsubscribed = unsubscribed.clone();
            move |_: String| {
                unsubscribed.fetch_add(1, Ordering::SeqCst);
            }
        };
        let ready = Arc::new(AtomicBool::new(false));
        let cancelled = {
            let (waiters, leave) = (waiters.clone(), leave(&unsubscribed));
            thread::spawn(move || drop(waiters.join("ch".into(), leave)))
        };
        let waiting = {
            let (waiters, leave, ready) = (waiters.clone(), leave(&unsubscribed), ready.clone());
            thread::spawn(move || {
                let registration = waiters.join("ch".into(), leave);
                let notify = registration.notify.clone();
                let woken = notify.notified();
                ready.store(true, Ordering::SeqCst);
                block_on(woken);
                drop(registration);
            })
        };
        // The connection's push handler: a publication after the waiter's check.
        while !ready.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        waiters.notify(b"ch");
        cancelled.join().unwrap();
        waiting.join().unwrap();
        assert_eq!(waiters.len(), 0, "a channel left with no waiter");
        let n = unsubscribed.load(Ordering::SeqCst);
        assert!((1..=2).contains(&n), "unsubscribed {n} times");
    });
}
