//! The checker: reads a run's history (what the store really did, every effect with its
//! fencing token, every answer a caller got) and names what went wrong. It knows nothing of
//! the coordinator's code, only the guarantees the README and ARCHITECTURE.md write down.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use idemkit_core::InFlight;

use crate::scenario::{Answer, DELIBERATE, History, Outcome};
use crate::store::StoreEvent;

/// The windows in which idemkit documents that an effect may happen twice (the README's
/// guarantee list, ARCHITECTURE.md rows 4, 7, 17, 19, 21, 22): a second effect is explained
/// when the first reservation ended without a stored result, in one of these ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Window {
    /// The first owner's action failed or panicked, and its key was released (a retry is
    /// what the caller wants).
    Released,
    /// The first reservation ended with its lease: its caller was killed or dropped, its
    /// completion could not be stored before the lease ended, or its action ran past a lease
    /// it could not renew (the action was told: `Attempt::is_lease_lost`).
    Expired,
    /// The store forgot its records (a restart without persistence).
    Forgotten,
}

/// A guarantee broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// The store accepted a write from an owner that no longer held the key.
    StaleWrite {
        key: String,
        fencing: u64,
        what: &'static str,
    },
    /// A key was reserved again after it had been completed, the store not having forgotten.
    ReservedAfterCompletion {
        key: String,
        completed: u64,
        granted: u64,
    },
    /// An action was told it held its lease, and did its effect, while another owner held it.
    EffectOutsideLease {
        key: String,
        fencing: u64,
        newer: u64,
    },
    /// A replay answered something else than what the owner of its fencing token stored.
    WrongReplay {
        caller: usize,
        key: String,
        fencing: u64,
        value: String,
    },
    /// A caller was told its fresh result was stored, and the store never completed it.
    FreshNotStored {
        caller: usize,
        key: String,
        fencing: u64,
    },
    /// The store refused an owner's write (its lease gone) before the end the store had
    /// confirmed to it, with no newer owner and nothing forgotten: a lease cut short.
    LeaseCutShort {
        key: String,
        fencing: u64,
        what: &'static str,
        left: Duration,
    },
    /// An owner's answer came later after its action returned than the completion's bound
    /// (a lease and one store call).
    CompletedTooLate {
        caller: usize,
        key: String,
        took: Duration,
        bound: Duration,
    },
    /// A caller was told its result was not stored while its lease was still confirmed for
    /// longer than the last try's margin, less than a lease after its action returned: the
    /// completion gave up early.
    GaveUpEarly {
        caller: usize,
        key: String,
        fencing: u64,
        left: Duration,
    },
    /// A caller that did not run the action (a waiter, a rejection, a replay) answered after
    /// its bound.
    WaitedTooLong {
        caller: usize,
        key: String,
        took: Duration,
        bound: Duration,
    },
    /// A panic other than the actions' own.
    UnexpectedPanic { caller: usize, message: String },
    /// A caller never answered.
    NeverAnswered { caller: usize },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

/// What a run amounted to, when no guarantee was broken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub effects: usize,
    /// Second (and later) effects of one key, by the window that explains them.
    pub duplicates: BTreeMap<Window, usize>,
    pub answers: usize,
}

/// Checks `h`; the first violation found, or the tally.
///
/// # Errors
///
/// The broken guarantee.
pub fn check(h: &History) -> Result<Tally, Violation> {
    if let Some(&caller) = h.unfinished.first() {
        return Err(Violation::NeverAnswered { caller });
    }
    let policy = h.setup.policy;
    // Per key, every grant: (fencing, answered at, sequence, handed to the store at).
    let mut grants: BTreeMap<&str, Vec<(u64, Duration, u64, Duration)>> = BTreeMap::new();
    // (handed to the store at, answered at) of each completion: it applied in between.
    let mut completions: BTreeMap<(&str, u64), (Duration, Duration)> = BTreeMap::new();
    let mut releases: BTreeMap<(&str, u64), Duration> = BTreeMap::new();
    let mut confirmed: BTreeMap<(&str, u64), Duration> = BTreeMap::new();
    let mut forgotten: Vec<(Duration, Duration)> = Vec::new();
    let mut stalls: Vec<(Duration, Duration)> = Vec::new();
    for e in &h.store {
        match e {
            StoreEvent::StaleAccepted {
                key, fencing, what, ..
            } => {
                return Err(Violation::StaleWrite {
                    key: key.clone(),
                    fencing: *fencing,
                    what,
                });
            }
            StoreEvent::Granted {
                key,
                fencing,
                sent,
                at,
                seq,
            } => grants
                .entry(key)
                .or_default()
                .push((*fencing, *at, *seq, *sent)),
            StoreEvent::Completed {
                key,
                fencing,
                sent,
                at,
            } => {
                completions.entry((key, *fencing)).or_insert((*sent, *at));
            }
            // A release counts from when it was handed to the store (a reply can come back
            // after a later call's, from a busy server).
            StoreEvent::Released {
                key, fencing, sent, ..
            } => {
                releases.entry((key, *fencing)).or_insert(*sent);
            }
            StoreEvent::Confirmed {
                key,
                fencing,
                until,
            } => {
                let c = confirmed.entry((key, *fencing)).or_default();
                *c = (*c).max(*until);
            }
            StoreEvent::Forgot { from, at } => forgotten.push((*from, *at)),
            StoreEvent::Refused { .. } => {}
            StoreEvent::Stalled { from, by } => stalls.push((*from, *by)),
        }
    }
    // A forgetting that may have touched the key between `from` and `to`.
    let forgot_between = |from: Duration, to: Duration| {
        forgotten
            .iter()
            .any(|&(start, end)| end >= from && start <= to)
    };

    // Once completed, never reserved again (the TTL is an hour: longer than any run).
    for (key, list) in &grants {
        for &(completed, _, _, _) in list {
            // Reserved again for sure after the completion: handed to the store after the
            // completion's answer came back.
            let Some(&(_, tc)) = completions.get(&(*key, completed)) else {
                continue;
            };
            let again = list
                .iter()
                .find(|&&(f, _, _, sent)| f > completed && sent > tc && !forgot_between(tc, sent));
            if let Some(&(granted, _, _, _)) = again {
                return Err(Violation::ReservedAfterCompletion {
                    key: (*key).to_owned(),
                    completed,
                    granted,
                });
            }
        }
    }

    // An effect done while its action was told it held the lease: nobody else held it.
    for e in h.effects.iter().filter(|e| e.told_live) {
        let Some(list) = grants.get(e.key.as_str()) else {
            continue;
        };
        let own = list.iter().find(|g| g.0 == e.fencing).map(|g| g.1);
        if let Some(&(newer, _, _, _)) = list.iter().find(|&&(f, _, seq, _)| {
            f > e.fencing && seq < e.seq && !own.is_some_and(|t0| forgot_between(t0, e.at))
        }) {
            return Err(Violation::EffectOutsideLease {
                key: e.key.clone(),
                fencing: e.fencing,
                newer,
            });
        }
    }

    // A confirmed lease holds until its end: the store refuses its owner only after it, or
    // once another owner took the key, or after the store forgot.
    for e in &h.store {
        let StoreEvent::Refused {
            key,
            fencing,
            what,
            at,
        } = e
        else {
            continue;
        };
        let until = confirmed
            .get(&(key.as_str(), *fencing))
            .copied()
            .unwrap_or_default();
        let list = grants
            .get(key.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let own = list.iter().find(|g| g.0 == *fencing).map_or(*at, |g| g.1);
        // Refused after its own release (a renewal still on the wire) is no cut either.
        let explained = forgot_between(own, *at)
            || list.iter().any(|g| g.0 > *fencing && g.1 <= *at)
            || releases
                .get(&(key.as_str(), *fencing))
                .is_some_and(|t| t <= at);
        if *at < until && !explained {
            return Err(Violation::LeaseCutShort {
                key: key.clone(),
                fencing: *fencing,
                what,
                left: until - *at,
            });
        }
    }

    for a in &h.answers {
        // The store forgot, or another owner took the key, while this call held it: its
        // completion was refused, not given up.
        let superseded = grants.get(a.key.as_str()).is_some_and(|list| {
            let Outcome::Fresh { fencing, .. } = a.outcome else {
                return false;
            };
            let own = list
                .iter()
                .find(|g| g.0 == fencing)
                .map_or(a.started, |g| g.1);
            forgot_between(own, a.at) || list.iter().any(|g| g.0 > fencing && g.1 <= a.at)
        });
        // A stall freezes the caller too: its time does not count against its bound.
        let stalled: Duration = stalls
            .iter()
            .filter(|&&(from, by)| from + by >= a.started && from <= a.at)
            .map(|&(_, by)| by)
            .sum();
        check_answer(
            a,
            &policy,
            &completions,
            &confirmed,
            superseded,
            h.real_time,
            stalled,
        )?;
    }

    // Duplicates, by the window that explains each.
    let mut tally = Tally {
        effects: h.effects.len(),
        answers: h.answers.len(),
        ..Tally::default()
    };
    let mut by_key: BTreeMap<&str, Vec<&crate::scenario::Effect>> = BTreeMap::new();
    for e in &h.effects {
        by_key.entry(&e.key).or_default().push(e);
    }
    for (key, effects) in by_key {
        for pair in effects.windows(2) {
            let first = pair[0];
            let window = if releases.contains_key(&(key, first.fencing)) {
                Window::Released
            } else if forgot_between(first.at, pair[1].at) {
                Window::Forgotten
            } else {
                Window::Expired
            };
            *tally.duplicates.entry(window).or_default() += 1;
        }
    }
    Ok(tally)
}

fn check_answer(
    a: &Answer,
    policy: &idemkit_core::Policy,
    completions: &BTreeMap<(&str, u64), (Duration, Duration)>,
    confirmed: &BTreeMap<(&str, u64), Duration>,
    superseded: bool,
    real_time: bool,
    stalled: Duration,
) -> Result<(), Violation> {
    // In real time a task can be scheduled late by the machine: allow for it.
    let slack = if real_time {
        Duration::from_millis(25)
    } else {
        Duration::from_millis(1)
    };
    let lease = a.lease;
    match &a.outcome {
        Outcome::Panicked(message) if message != DELIBERATE => {
            return Err(Violation::UnexpectedPanic {
                caller: a.caller,
                message: message.clone(),
            });
        }
        Outcome::Replayed { fencing, value } => {
            let expected = format!("{}#{fencing}", a.key);
            let stored = completions
                .get(&(a.key.as_str(), *fencing))
                // Handed to the store before this answer (applied no later than answered).
                .is_some_and(|&(sent, _)| sent <= a.at);
            if *value != expected || !stored {
                return Err(Violation::WrongReplay {
                    caller: a.caller,
                    key: a.key.clone(),
                    fencing: *fencing,
                    value: value.clone(),
                });
            }
        }
        Outcome::Fresh {
            fencing,
            stored: true,
        } => {
            let stored = completions
                .get(&(a.key.as_str(), *fencing))
                // Handed to the store before this answer (applied no later than answered).
                .is_some_and(|&(sent, _)| sent <= a.at);
            if !stored {
                return Err(Violation::FreshNotStored {
                    caller: a.caller,
                    key: a.key.clone(),
                    fencing: *fencing,
                });
            }
        }
        Outcome::Fresh {
            fencing,
            stored: false,
        } if !a.completer
            && !superseded
            && a.at.saturating_sub(a.returned.unwrap_or(a.started)) + slack < lease =>
        {
            // The last try goes out at the confirmed end minus min(lease/20, 50 ms), unless
            // the completion was tried for a lease (a store that renews but never completes
            // must not hold its caller: review M2).
            let margin = (lease / 20).min(Duration::from_millis(50)) + slack;
            let until = confirmed
                .get(&(a.key.as_str(), *fencing))
                .copied()
                .unwrap_or_default();
            if a.at + margin < until {
                return Err(Violation::GaveUpEarly {
                    caller: a.caller,
                    key: a.key.clone(),
                    fencing: *fencing,
                    left: until - a.at,
                });
            }
        }
        _ => {}
    }
    // An owner has its answer at most a lease and a store call's bound after its action
    // returned: the completion starts no try later than a lease after its first, each try
    // bounded by `store_timeout` (review M2: before, a store that renewed and never
    // completed held the caller until `max_hold`).
    if let (Outcome::Fresh { .. }, Some(returned), false) = (&a.outcome, a.returned, a.completer) {
        let bound = lease + policy.store_timeout + slack * 2 + stalled;
        let took = a.at.saturating_sub(returned);
        if took > bound {
            return Err(Violation::CompletedTooLate {
                caller: a.caller,
                key: a.key.clone(),
                took,
                bound,
            });
        }
    }
    // A call that never ran the action waited at most its bound: the wait timeout, plus a
    // store call's bound for the last wait and the `begin` after it.
    if !a.ran && !matches!(a.outcome, Outcome::Killed) {
        let waits = if a.in_flight == InFlight::Wait {
            policy.wait_timeout
        } else {
            Duration::ZERO
        };
        let bound = waits + policy.store_timeout * 3 + slack * 2 + stalled;
        let took = a.at - a.started;
        if took > bound {
            return Err(Violation::WaitedTooLong {
                caller: a.caller,
                key: a.key.clone(),
                took,
                bound,
            });
        }
    }
    Ok(())
}
