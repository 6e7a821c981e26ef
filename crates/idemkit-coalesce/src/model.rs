//! Model checks (loom) of the lane: enter, flush and reply, in every interleaving of three
//! callers (up to three preemptions). Built only with `--cfg idemkit_loom`; `scripts/loom`
//! runs them, then shows that they fail on a copy of the code with one wake-up taken out.

use std::sync::Arc;

use ::loom::sync::Mutex;
use ::loom::thread;

use crate::Limits;
use crate::lane::{Entered, Job, Lane};

impl Job for usize {
    fn key(&self) -> &str {
        ""
    }
    fn abandoned(&self) -> bool {
        false
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = ::loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

type Sent = Arc<Mutex<Vec<usize>>>;
type Flushes = Arc<Mutex<Vec<thread::JoinHandle<()>>>>;

/// A flush task: sends what the wire has room for; each reply may schedule the next flush.
fn spawn_flush(lane: &Arc<Lane<usize>>, sent: &Sent, flushes: &Flushes) {
    let (lane2, sent2, flushes2) = (lane.clone(), sent.clone(), flushes.clone());
    let flush = thread::spawn(move || {
        for batch in lane2.take() {
            sent2.lock().unwrap().extend(batch);
            replied(&lane2, &sent2, &flushes2); // the batch's reply came
        }
    });
    flushes.lock().unwrap().push(flush);
}

/// A call (lone or batched) answered: its place on the wire is free.
fn replied(lane: &Arc<Lane<usize>>, sent: &Sent, flushes: &Flushes) {
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
        // The Redis store's limits: 16 keys a batch, two places on the wire.
        let lane = Arc::new(Lane::<usize>::new(Limits::new(16, 2)));
        let sent: Sent = Arc::new(Mutex::new(Vec::new()));
        let flushes: Flushes = Arc::new(Mutex::new(Vec::new()));
        let call = {
            let (lane, sent, flushes) = (lane.clone(), sent.clone(), flushes.clone());
            move |i: usize| match lane.enter(|| i) {
                Entered::Alone => {
                    sent.lock().unwrap().push(i);
                    replied(&lane, &sent, &flushes); // its reply came
                }
                Entered::Queued { flush: true } => spawn_flush(&lane, &sent, &flushes),
                Entered::Queued { flush: false } => {}
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
