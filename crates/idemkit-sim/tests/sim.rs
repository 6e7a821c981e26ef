//! The simulation's seeds, run and checked. `IDEMKIT_SIM_SEEDS=N` runs seeds `0..N` (CI's
//! default below); `IDEMKIT_SIM_SEED=S` replays seed `S` alone and prints its history.

use std::time::{Duration, Instant};

use idemkit_sim::{Outcome, StoreEvent, Violation, Window, check, run};

/// What CI runs when the environment asks for nothing else.
const CI_SEEDS: u64 = 20_000;

fn seeds() -> std::ops::Range<u64> {
    if let Ok(one) = std::env::var("IDEMKIT_SIM_SEED") {
        let s: u64 = one.parse().expect("IDEMKIT_SIM_SEED is a number");
        return s..s + 1;
    }
    let n = std::env::var("IDEMKIT_SIM_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CI_SEEDS);
    0..n
}

#[test]
fn every_seed_keeps_every_guarantee() {
    idemkit_sim::quiet_deliberate_panics();
    #[allow(clippy::disallowed_methods)] // the run's real duration, for the report
    let started = Instant::now();
    let replaying = std::env::var("IDEMKIT_SIM_SEED").is_ok();
    let mut windows = std::collections::BTreeMap::<Window, usize>::new();
    // `IDEMKIT_SIM_COUNT=1`: count the failing seeds instead of stopping at the first (to
    // measure how quickly a reintroduced defect is caught).
    let counting = std::env::var("IDEMKIT_SIM_COUNT").is_ok();
    let mut failed: Vec<(u64, Violation)> = Vec::new();
    let (mut effects, mut answers, mut forgot, mut runs) = (0, 0, 0, 0);
    for seed in seeds() {
        let history = run(seed);
        if replaying {
            eprintln!("{history:#?}");
        }
        match check(&history) {
            Ok(tally) => {
                effects += tally.effects;
                answers += tally.answers;
                for (w, n) in tally.duplicates {
                    *windows.entry(w).or_default() += n;
                }
                forgot += history
                    .store
                    .iter()
                    .filter(|e| matches!(e, StoreEvent::Forgot { .. }))
                    .count();
                runs += 1;
            }
            Err(v) if counting => failed.push((seed, v)),
            Err(v) => panic!(
                "seed {seed} broke a guarantee: {v}\nreplay it: IDEMKIT_SIM_SEED={seed} cargo test -p idemkit-sim --test sim -- --nocapture"
            ),
        }
    }
    eprintln!(
        "{runs} seeds in {:.1} s: {effects} effects, {answers} answers, {forgot} store restarts without data, second effects by window {windows:?}",
        started.elapsed().as_secs_f64()
    );
    if counting {
        eprintln!(
            "{} failing seeds; the first: {:?}",
            failed.len(),
            failed.iter().take(5).collect::<Vec<_>>()
        );
        assert!(failed.is_empty());
    }
    assert!(runs > 0);
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [3, 41, 977] {
        let (a, b) = (run(seed), run(seed));
        assert_eq!(
            format!("{a:?}"),
            format!("{b:?}"),
            "seed {seed} ran twice differently"
        );
    }
}

/// The checker fails where it must: each violation, on a history written by hand from a
/// real run's.
#[test]
fn the_checker_names_what_went_wrong() {
    let base = run(3);
    assert!(check(&base).is_ok(), "{:?}", check(&base));
    let key = base.answers[0].key.clone();

    let mut stale = base.clone();
    stale.store.push(StoreEvent::StaleAccepted {
        key: key.clone(),
        fencing: 1,
        what: "complete",
        at: Duration::from_millis(5),
    });
    assert!(matches!(check(&stale), Err(Violation::StaleWrite { .. })));

    let mut again = base.clone();
    again.store.extend([
        StoreEvent::Granted {
            key: "k".into(),
            fencing: 1,
            sent: Duration::from_millis(1),
            at: Duration::from_millis(1),
            seq: 1000,
        },
        StoreEvent::Completed {
            key: "k".into(),
            fencing: 1,
            sent: Duration::from_millis(2),
            at: Duration::from_millis(2),
        },
        StoreEvent::Granted {
            key: "k".into(),
            fencing: 2,
            sent: Duration::from_millis(3),
            at: Duration::from_millis(3),
            seq: 1001,
        },
    ]);
    assert!(matches!(
        check(&again),
        Err(Violation::ReservedAfterCompletion { .. })
    ));
    let mut forgotten = again.clone();
    forgotten.store.insert(
        forgotten.store.len() - 1,
        StoreEvent::Forgot {
            from: Duration::from_millis(2),
            at: Duration::from_millis(2),
        },
    );
    assert!(check(&forgotten).is_ok(), "a store that forgot explains it");

    let mut outside = base.clone();
    outside.store.extend([
        StoreEvent::Granted {
            key: "k".into(),
            fencing: 1,
            sent: Duration::from_millis(1),
            at: Duration::from_millis(1),
            seq: 1002,
        },
        StoreEvent::Granted {
            key: "k".into(),
            fencing: 2,
            sent: Duration::from_millis(3),
            at: Duration::from_millis(3),
            seq: 1003,
        },
    ]);
    outside.effects.push(idemkit_sim::Effect {
        key: "k".into(),
        fencing: 1,
        at: Duration::from_millis(4),
        seq: 2_000,
        told_live: true,
    });
    assert!(matches!(
        check(&outside),
        Err(Violation::EffectOutsideLease { .. })
    ));

    let mut cut = base.clone();
    cut.store.extend([
        StoreEvent::Granted {
            key: "k".into(),
            fencing: 1,
            sent: Duration::from_millis(1),
            at: Duration::from_millis(1),
            seq: 1_000,
        },
        StoreEvent::Confirmed {
            key: "k".into(),
            fencing: 1,
            until: Duration::from_millis(100),
        },
        StoreEvent::Refused {
            key: "k".into(),
            fencing: 1,
            what: "renew",
            at: Duration::from_millis(50),
        },
    ]);
    assert!(matches!(check(&cut), Err(Violation::LeaseCutShort { .. })));

    let mut early = base.clone();
    early.store.push(StoreEvent::Confirmed {
        key: "k".into(),
        fencing: 7,
        until: Duration::from_millis(200),
    });
    let mut gave_up = early.answers[0].clone();
    gave_up.key = "k".into();
    gave_up.started = Duration::from_millis(5);
    gave_up.at = Duration::from_millis(10);
    gave_up.completer = false;
    gave_up.outcome = Outcome::Fresh {
        fencing: 7,
        stored: false,
    };
    early.answers.push(gave_up.clone());
    assert!(matches!(check(&early), Err(Violation::GaveUpEarly { .. })));

    // An owner answered later than a lease and a store call after its action returned.
    let mut late = base.clone();
    let mut held = gave_up;
    held.returned = Some(Duration::from_millis(5));
    held.at = held.lease + late.setup.policy.store_timeout + Duration::from_millis(100);
    held.outcome = Outcome::Fresh {
        fencing: 7,
        stored: true,
    };
    late.store.push(StoreEvent::Completed {
        key: "k".into(),
        fencing: 7,
        sent: Duration::from_millis(6),
        at: Duration::from_millis(6),
    });
    late.answers.push(held);
    assert!(matches!(
        check(&late),
        Err(Violation::CompletedTooLate { .. })
    ));

    let mut wrong = base.clone();
    let a = wrong
        .answers
        .iter_mut()
        .find(|a| matches!(a.outcome, Outcome::Replayed { .. } | Outcome::Fresh { .. }));
    if let Some(a) = a {
        let (Outcome::Replayed { fencing, .. } | Outcome::Fresh { fencing, .. }) = a.outcome else {
            unreachable!("found by its outcome")
        };
        a.outcome = Outcome::Replayed {
            fencing,
            value: "something else".into(),
        };
        assert!(matches!(check(&wrong), Err(Violation::WrongReplay { .. })));
    }

    let mut panicked = base.clone();
    panicked.answers[0].outcome = Outcome::Panicked("index out of bounds".into());
    assert!(matches!(
        check(&panicked),
        Err(Violation::UnexpectedPanic { .. })
    ));

    let mut hung = base.clone();
    hung.unfinished.push(0);
    assert!(matches!(check(&hung), Err(Violation::NeverAnswered { .. })));
}
