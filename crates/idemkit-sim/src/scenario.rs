//! One simulated run: from a seed, a policy, a fault mix and a crowd of callers racing on a
//! few keys, on paused time. Callers redeliver what failed, as a queue would; their actions
//! take random time (some past the lease), some panic, some are killed mid-run; some come in
//! a batch (`Coordinator::prepare`), some complete through a `Completer`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idemkit_core::store::{CompleteRequest, Ownership};
use idemkit_core::{
    Attempt, Completer, Coordinator, Error, InFlight, Key, OnCancel, Operation, Policy, RawStore,
    Source, StorageKey, Store, StoreError,
};
use tokio::time::Instant;

use crate::store::{Faults, SimStore, StoreEvent};

/// The panic message of the actions that panic on purpose.
pub const DELIBERATE: &str = "sim: the action panicked on purpose";

/// Keeps the actions' own panics (expected by the run) out of the output; other panics are
/// printed as usual.
pub fn quiet_deliberate_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let deliberate = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|m| m == DELIBERATE);
        if !deliberate {
            default(info);
        }
    }));
}

/// An effect an action performed: a mail sent, a row written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub key: String,
    pub fencing: u64,
    pub at: Duration,
    /// Its place in the run's one sequence (see `StoreEvent::Granted`).
    pub seq: u64,
    /// The action checked its lease (`Attempt::check_lease`) just before, and was told it
    /// holds it.
    pub told_live: bool,
}

/// How one attempt of a caller ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Fresh { fencing: u64, stored: bool },
    Replayed { fencing: u64, value: String },
    Error(String),
    Panicked(String),
    Killed,
}

/// One attempt's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub caller: usize,
    pub key: String,
    pub started: Duration,
    pub at: Duration,
    pub outcome: Outcome,
    /// Whether the action ran in this attempt.
    pub ran: bool,
    /// When the action returned its value (the completion starts then).
    pub returned: Option<Duration>,
    /// Whether a `Completer` stored the result (no retries by design).
    pub completer: bool,
    pub in_flight: InFlight,
    /// The call's lease: the operation's, or one of the call's own policy (a batch's call
    /// may run with another lease than the batch reserved with: review M1).
    pub lease: Duration,
}

/// The run's settings, drawn from its seed.
#[derive(Debug, Clone)]
pub struct Setup {
    pub seed: u64,
    pub policy: Policy,
    pub faults: Faults,
    pub keys: usize,
    pub callers: usize,
}

/// Everything that happened in one run.
#[derive(Debug, Clone)]
pub struct History {
    pub setup: Setup,
    pub store: Vec<StoreEvent>,
    pub effects: Vec<Effect>,
    pub answers: Vec<Answer>,
    /// Callers that had not answered when the run's time ran out.
    pub unfinished: Vec<usize>,
    /// Run against a server in real time (timings carry scheduling noise).
    pub real_time: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ms(rng: &mut fastrand::Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.u64(lo..=hi))
}

/// `IDEMKIT_SIM_FORGET=0`: no run makes its store forget (to tell a lost record from the
/// faults that explain one).
fn no_forgetting() -> bool {
    std::env::var("IDEMKIT_SIM_FORGET").is_ok_and(|v| v == "0")
}

/// The settings of `seed`.
pub fn setup(seed: u64) -> Setup {
    let mut rng = fastrand::Rng::with_seed(seed);
    let lease = ms(&mut rng, 30, 200);
    let lease_ms = lease.as_millis() as u64;
    let policy = Policy::default()
        .lease(lease)
        .ttl(Duration::from_secs(3600))
        .store_timeout(ms(&mut rng, lease_ms / 8 + 1, lease_ms / 3 + 2))
        .wait_timeout(ms(&mut rng, lease_ms, lease_ms * 4))
        .max_hold(ms(&mut rng, lease_ms * 3, lease_ms * 12))
        .on_cancel(if rng.bool() {
            OnCancel::KeepLease
        } else {
            OnCancel::Release
        });
    let faults = if rng.u8(..) < 32 {
        Faults::NONE
    } else {
        Faults {
            delay: (rng.f64() * 0.5, ms(&mut rng, 0, lease_ms / 4)),
            fail_before: rng.f64() * 0.1,
            lose_reply: rng.f64() * 0.1,
            apply_late: (rng.f64() * 0.05, ms(&mut rng, 0, lease_ms)),
            outage: (rng.f64() * 0.02, ms(&mut rng, 0, lease_ms * 2)),
            forget: if rng.u8(..) < 16 && !no_forgetting() {
                0.002
            } else {
                0.0
            },
            stall: (rng.f64() * 0.01, ms(&mut rng, 0, lease_ms * 2)),
            // Drawn below, after everything else.
            hang_complete: 0.0,
            slow_complete: (0.0, Duration::ZERO),
        }
    };
    let mut setup = Setup {
        seed,
        policy,
        faults,
        keys: rng.usize(1..=3),
        callers: rng.usize(4..=14),
    };
    // Drawn last, so that the settings above stay what they were for every seed.
    if setup.faults.fail_before > 0.0 || setup.faults.delay.0 > 0.0 {
        // A store that renews and never completes, and completions slower than the lease.
        setup.faults.hang_complete = rng.f64() * 0.05;
        setup.faults.slow_complete = (rng.f64() * 0.05, ms(&mut rng, lease_ms, lease_ms * 2));
    }
    if rng.u8(..) < 32 {
        // A store call may take longer than the lease.
        setup.policy = setup
            .policy
            .store_timeout(ms(&mut rng, lease_ms, lease_ms * 3));
    }
    setup
}

/// Completes through the store itself, once: a stand-in for a transaction's completion.
struct Direct<S>(SimStore<S>);

impl<S: RawStore> Completer for Direct<S> {
    async fn complete(
        &mut self,
        key: &StorageKey,
        ownership: &Ownership,
        request: &CompleteRequest,
    ) -> Result<(), StoreError> {
        self.0.complete(key, ownership, request).await
    }
}

struct Run {
    start: Instant,
    seq: Arc<std::sync::atomic::AtomicU64>,
    effects: Mutex<Vec<Effect>>,
    answers: Mutex<Vec<Answer>>,
}

impl Run {
    fn now(&self) -> Duration {
        Instant::now() - self.start
    }
}

/// What one action does, drawn per attempt.
#[derive(Clone, Copy)]
struct Plan {
    before: Duration,
    after: Duration,
    careful: bool,
    panic_before: bool,
    panic_after: bool,
}

fn plan(rng: &mut fastrand::Rng, lease: Duration) -> Plan {
    let l = lease.as_millis() as u64;
    // Mostly short actions; one in six runs past the lease.
    let long = rng.u8(..) < 42;
    Plan {
        before: ms(rng, 0, if long { l * 2 } else { l / 3 }),
        after: ms(rng, 0, if long { l * 2 } else { l / 3 }),
        careful: rng.bool(),
        panic_before: rng.u8(..) < 8,
        panic_after: rng.u8(..) < 8,
    }
}

/// The action: work, (a careful one checks its lease), the effect, more work, its value.
async fn act(
    run: Arc<Run>,
    key: String,
    p: Plan,
    attempt: Attempt,
    returned: Arc<Mutex<Option<Duration>>>,
) -> Result<String, String> {
    tokio::time::sleep(p.before).await;
    if p.panic_before {
        panic!("{DELIBERATE}");
    }
    let fencing = attempt.fencing_token().map_or(0, |f| f.get());
    if p.careful && attempt.check_lease(Duration::ZERO).is_err() {
        return Err("lease lost before the effect".into());
    }
    lock(&run.effects).push(Effect {
        key: key.clone(),
        fencing,
        at: run.now(),
        seq: run.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
        told_live: p.careful,
    });
    if p.panic_after {
        panic!("{DELIBERATE}");
    }
    tokio::time::sleep(p.after).await;
    *lock(&returned) = Some(run.now());
    Ok(format!("{key}#{fencing}"))
}

fn outcome(result: Result<idemkit_core::Receipt<String>, Error<String>>) -> Outcome {
    match result {
        Ok(r) => {
            let fencing = r.fencing.map_or(0, |f| f.get());
            match r.source {
                Source::Replayed => Outcome::Replayed {
                    fencing,
                    value: r.value,
                },
                _ => Outcome::Fresh {
                    fencing,
                    stored: r.stored,
                },
            }
        }
        Err(e) => Outcome::Error(format!("{:?}", e.kind())),
    }
}

/// One caller: up to `tries` deliveries of its message until one answers with a value.
#[allow(clippy::too_many_arguments)]
async fn caller<S: RawStore>(
    run: Arc<Run>,
    c: Coordinator<SimStore<S>>,
    id: usize,
    key: Key,
    mut rng: fastrand::Rng,
    lease: Duration,
    completer: bool,
    kill: bool,
) {
    let op = Operation::new("sim.effect").expect("a valid name");
    let storage = StorageKey::new(&op, None, &key).as_str().to_owned();
    for _ in 0..rng.usize(1..=4) {
        let p = plan(&mut rng, lease);
        let in_flight = if rng.bool() {
            InFlight::Wait
        } else {
            InFlight::Reject
        };
        let started = run.now();
        let ran = Arc::new(Mutex::new(false));
        let returned = Arc::new(Mutex::new(None));
        let (r, k, s, marker) = (run.clone(), storage.clone(), c.store().clone(), ran.clone());
        let done_at = returned.clone();
        let call = c.call_owned(op.clone(), key.clone()).in_flight(in_flight);
        let action = move |attempt: Attempt| {
            *lock(&marker) = true;
            act(r, k, p, attempt, done_at)
        };
        let task = if completer {
            tokio::spawn(async move { outcome(call.completer(Direct(s)).run(action).await) })
        } else {
            tokio::spawn(async move { outcome(call.run(action).await) })
        };
        let killed_after = kill.then(|| ms(&mut rng, 0, lease.as_millis() as u64 * 2));
        let outcome = match killed_after {
            Some(after) => match tokio::time::timeout(after, task).await {
                Ok(joined) => joined,
                Err(_) => Ok(Outcome::Killed),
            },
            None => task.await,
        };
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                let text = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                Outcome::Panicked(text)
            }
            Err(e) => Outcome::Error(e.to_string()),
        };
        let done = matches!(outcome, Outcome::Fresh { .. } | Outcome::Replayed { .. });
        lock(&run.answers).push(Answer {
            caller: id,
            key: storage.clone(),
            started,
            at: run.now(),
            ran: *lock(&ran),
            returned: *lock(&returned),
            completer,
            in_flight,
            outcome,
            lease,
        });
        if done {
            return;
        }
        // The redelivery comes after a while (a visibility timeout, a backoff).
        tokio::time::sleep(ms(&mut rng, 0, lease.as_millis() as u64 * 2)).await;
    }
}

/// A batch: the keys reserved at once, then handled one after the other (later claims go
/// stale while the earlier ones run).
async fn batch<S: RawStore>(
    run: Arc<Run>,
    c: Coordinator<SimStore<S>>,
    id: usize,
    keys: Vec<Key>,
    mut rng: fastrand::Rng,
    lease: Duration,
) {
    let op = Operation::new("sim.effect").expect("a valid name");
    let prepared = c.prepare(&op, &keys).await;
    for (key, claim) in keys.iter().zip(prepared) {
        let p = plan(&mut rng, lease);
        let storage = StorageKey::new(&op, None, key).as_str().to_owned();
        let started = run.now();
        let (r, k) = (run.clone(), storage.clone());
        let mut call = c
            .call_owned(op.clone(), key.clone())
            .in_flight(InFlight::Reject)
            .prepared(claim);
        // Half the calls run with a lease of their own, shorter or longer than the one the
        // batch reserved with (review M1).
        let call_lease = if rng.bool() {
            let l = lease.as_millis() as u64;
            let own = ms(&mut rng, l / 2, l * 4);
            call = call.policy(c.policy_for(&op).lease(own));
            own
        } else {
            lease
        };
        let returned = Arc::new(Mutex::new(None));
        let done_at = returned.clone();
        let task =
            tokio::spawn(async move { outcome(call.run(move |a| act(r, k, p, a, done_at)).await) });
        let outcome = match task.await {
            Ok(o) => o,
            Err(e) if e.is_panic() => Outcome::Panicked(DELIBERATE.into()),
            Err(e) => Outcome::Error(e.to_string()),
        };
        lock(&run.answers).push(Answer {
            caller: id,
            key: storage,
            started,
            at: run.now(),
            ran: true,
            returned: *lock(&returned),
            completer: false,
            in_flight: InFlight::Reject,
            outcome,
            lease: call_lease,
        });
    }
}

/// Runs `seed` to its end (at most a simulated minute) and returns what happened.
pub fn run(seed: u64) -> History {
    let setup = setup(seed);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut rng = fastrand::Rng::with_seed(setup.seed ^ 0x5eed);
        let start = Instant::now();
        let store = SimStore::new(setup.faults, rng.fork(), start);
        simulate(setup, store, rng, "", start).await
    })
}

/// Runs `seed` on `inner` (Redis, PostgreSQL) in real time, inside the caller's runtime:
/// the same callers and faults, not the same timings (a server does not follow paused
/// time), so a run does not replay exactly. `namespace` keeps this run's keys apart from
/// every other's on a shared server.
pub async fn run_on<S: RawStore>(seed: u64, inner: S, namespace: &str) -> History {
    let setup = setup(seed);
    let mut rng = fastrand::Rng::with_seed(setup.seed ^ 0x5eed);
    // One origin for the store's log and the callers' answers: they are compared.
    let start = Instant::now();
    let store = SimStore::over(inner, setup.faults, rng.fork(), start, false);
    let mut history = simulate(setup, store, rng, namespace, start).await;
    history.real_time = true;
    history
}

async fn simulate<S: RawStore>(
    setup: Setup,
    store: SimStore<S>,
    mut rng: fastrand::Rng,
    namespace: &str,
    start: Instant,
) -> History {
    let c = Coordinator::builder(store.clone())
        .policy(setup.policy)
        .build();
    let run = Arc::new(Run {
        start,
        seq: store.ticker(),
        effects: Mutex::new(Vec::new()),
        answers: Mutex::new(Vec::new()),
    });
    let lease = setup.policy.lease;
    let keys: Vec<Key> = (0..setup.keys)
        .map(|i| Key::new(format!("{namespace}order-{i}")).expect("a valid key"))
        .collect();
    let mut tasks = Vec::new();
    for id in 0..setup.callers {
        let delay = ms(&mut rng, 0, lease.as_millis() as u64 * 3);
        let (run, c, r) = (run.clone(), c.clone(), rng.fork());
        if rng.u8(..) < 40 && keys.len() > 1 {
            let mut group = keys.clone();
            rng.shuffle(&mut group);
            tasks.push((
                id,
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    batch(run, c, id, group, r, lease).await;
                }),
            ));
        } else {
            let key = keys[rng.usize(..keys.len())].clone();
            let completer = rng.u8(..) < 40;
            let kill = rng.u8(..) < 40;
            tasks.push((
                id,
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    caller(run, c, id, key, r, lease, completer, kill).await;
                }),
            ));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut unfinished = Vec::new();
    for (id, task) in tasks {
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => unfinished.push(id),
        }
    }
    // Let background work (completions of dropped calls, releases) land.
    tokio::time::sleep(lease * 4).await;
    History {
        setup,
        store: store.log(),
        effects: lock(&run.effects).clone(),
        answers: lock(&run.answers).clone(),
        unfinished,
        real_time: false,
    }
}
