//! Model checks (loom) of the Redis store's client-side synchronisation: the coalescing
//! queue of a lane and the waiter registry. loom runs each test's threads in every
//! interleaving (up to three preemptions). Built only with `--cfg idemkit_loom`;
//! `scripts/loom` runs them, then shows that each fails on a copy of the code with one lock
//! or one wake-up taken out.

use std::sync::Arc;

use ::loom::future::block_on;
use ::loom::sync::Mutex;
use ::loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use ::loom::thread;

use crate::coalesce::{Coalescer, Entered};
use crate::wake::Waiters;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = ::loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

type Sent = Arc<Mutex<Vec<usize>>>;
type Flushes = Arc<Mutex<Vec<thread::JoinHandle<()>>>>;

/// A flush task: sends what the wire has room for; each reply may schedule the next flush.
fn spawn_flush(lane: &Arc<Coalescer<usize>>, sent: &Sent, flushes: &Flushes) {
    let (lane2, sent2, flushes2) = (lane.clone(), sent.clone(), flushes.clone());
    let flush = thread::spawn(move || {
        for batch in lane2.take_all() {
            sent2.lock().unwrap().extend(batch);
            replied(&lane2, &sent2, &flushes2); // the batch's reply came
        }
    });
    flushes.lock().unwrap().push(flush);
}

/// A call (lone or batched) answered: its place on the wire is free.
fn replied(lane: &Arc<Coalescer<usize>>, sent: &Sent, flushes: &Flushes) {
    if lane.done() {
        spawn_flush(lane, sent, flushes);
    }
}

/// Three calls of one kind arrive at once on a lane: each is sent alone (when nothing of
/// its kind is on the wire or queued) or queued, and a queued call is sent by a flush
/// task, which the first call queued since the last flush schedules, or, when the wire was
/// full, the reply that makes room. In every interleaving each call is sent exactly once
/// and the lane ends idle: no call is left in a queue that no flush will take.
#[test]
fn every_queued_call_is_sent_once() {
    model(|| {
        let lane = Arc::new(Coalescer::<usize>::default());
        let sent: Sent = Arc::new(Mutex::new(Vec::new()));
        let flushes: Flushes = Arc::new(Mutex::new(Vec::new()));
        let call = {
            let (lane, sent, flushes) = (lane.clone(), sent.clone(), flushes.clone());
            move |i: usize| match lane.enter(|| i) {
                Entered::Lead => {
                    sent.lock().unwrap().push(i);
                    replied(&lane, &sent, &flushes); // its reply came
                }
                Entered::Queued { spawn_flush: true } => spawn_flush(&lane, &sent, &flushes),
                Entered::Queued { spawn_flush: false } => {}
            }
        };
        let callers: Vec<_> = (1..3)
            .map(|i| {
                let call = call.clone();
                thread::spawn(move || call(i))
            })
            .collect();
        call(0);
        for c in callers {
            c.join().unwrap();
        }
        // Flushes spawned by callers and by replies; join them as they appear.
        loop {
            let next = flushes.lock().unwrap().pop();
            match next {
                Some(f) => f.join().unwrap(),
                None => break,
            }
        }
        let mut sent = sent.lock().unwrap().clone();
        sent.sort_unstable();
        assert_eq!(sent, [0, 1, 2], "every call sent exactly once");
        assert!(
            lane.is_idle(),
            "a call left queued, or a flush left scheduled"
        );
    });
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
