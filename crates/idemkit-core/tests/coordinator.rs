//! The coordinator on a `MemoryStore`, beyond the coordinator conformance suite
//! (tests/conformance.rs runs it on this store): round trips, scopes, renewed leases,
//! unstorable results, stored errors, metrics and cancellation after success.
//!
//! Time-dependent tests run in paused tokio time (`start_paused`): leases, renewals and TTLs
//! advance only when every task is idle, so the interleavings are exact and nothing sleeps.
//! The 64-caller tests run on a multi-threaded runtime so the races are real.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{
    BoxError, Codec, Coordinator, Error, ErrorKind, Fingerprint, InFlight, JsonCodec, Key,
    MemoryStore, OnStoreError, Operation, Policy, RawStore, Source, StorageKey, Store,
    StoreErrorKind,
};
use idemkit_test::{Fault, Mailer, Probe, assert_fails_closed_then_open};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use proptest::prelude::*;
use tokio::time::sleep;

fn op() -> Operation {
    Operation::new("mail.invoice").unwrap()
}

fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

fn counter(snapshotter: &Snapshotter, name: &str) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == name)
        .map(|(.., v)| match v {
            DebugValue::Counter(c) => c,
            _ => 0,
        })
        .sum()
}

/// Starts an owner of key "k" whose mail takes `delay`, and returns once it holds the key.
async fn start_owner<S: Store>(
    c: &Coordinator<S>,
    mailer: &Mailer,
    delay: Duration,
    fingerprint: Option<Fingerprint>,
) -> tokio::task::JoinHandle<Result<idemkit_core::Receipt<String>, Error<Infallible>>> {
    let (c, mailer) = (c.clone(), mailer.clone());
    let owner = tokio::spawn(async move {
        let (op, k) = (op(), key("k"));
        let call = c.call(&op, &k);
        let call = match fingerprint {
            Some(f) => call.fingerprint(f),
            None => call,
        };
        call.run(|_| mailer.send(delay)).await
    });
    sleep(Duration::from_millis(10)).await;
    owner
}

// ===== replay, round trips =====

#[tokio::test(start_paused = true)]
async fn replay_returns_the_first_result_without_running() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::new(store.clone());
    let mailer = Mailer::default();
    let (op, k) = (op(), key("order-9.invoice"));

    let first = c
        .call(&op, &k)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    // A miss is two store calls: begin and complete.
    assert_eq!(
        (
            store.counts().begin,
            store.counts().complete,
            store.counts().total()
        ),
        (1, 1, 2)
    );
    store.reset_counts();
    let second = c
        .call(&op, &k)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    // A hit is one: begin.
    assert_eq!((store.counts().begin, store.counts().total()), (1, 1));

    assert_eq!(first.source, Source::Fresh);
    assert_eq!(second.source, Source::Replayed);
    assert_eq!(
        (first.value.as_str(), second.value.as_str()),
        ("em_1", "em_1")
    );
    assert_eq!(first.fencing, second.fencing);
    assert_eq!(mailer.sent(), 1);
}

#[tokio::test(start_paused = true)]
async fn scopes_do_not_share_records() {
    let c = Coordinator::new(MemoryStore::new());
    let mailer = Mailer::default();
    let (op, k) = (op(), key("k"));
    let (a, b) = (
        idemkit_core::Scope::new("tenant-a").unwrap(),
        idemkit_core::Scope::new("tenant-b").unwrap(),
    );
    let ra = c
        .call(&op, &k)
        .scope(&a)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    let rb = c
        .call(&op, &k)
        .scope(&b)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    let rn = c
        .call(&op, &k)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (ra.value.as_str(), rb.value.as_str(), rn.value.as_str()),
        ("em_1", "em_2", "em_3")
    );
}

// ===== 64 concurrent callers =====

// ===== leases: renewal, expiry, stale owners =====

#[tokio::test(start_paused = true)]
async fn waiters_follow_a_renewed_lease_and_get_the_owners_result() {
    // Lease 1 s, the owner works for 3.5 s (renewing every 333 ms), the waiter's overall
    // timeout is 10 s: the waiter must keep waiting across three leases and get em_1.
    let policy = Policy::default()
        .lease(Duration::from_secs(1))
        .wait_timeout(Duration::from_secs(10));
    let c = Coordinator::builder(MemoryStore::new())
        .policy(policy)
        .build();
    let mailer = Mailer::default();
    let owner = start_owner(&c, &mailer, Duration::from_millis(3_500), None).await;
    let waiter = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    let owner = owner.await.unwrap().unwrap();
    assert_eq!(
        (owner.source, waiter.source),
        (Source::Fresh, Source::Replayed)
    );
    assert_eq!(
        (owner.value.as_str(), waiter.value.as_str()),
        ("em_1", "em_1")
    );
    assert_eq!(mailer.sent(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gives_up_after_its_timeout_with_in_progress() {
    let policy = Policy::default()
        .lease(Duration::from_secs(1))
        .wait_timeout(Duration::from_secs(2));
    let c = Coordinator::builder(MemoryStore::new())
        .policy(policy)
        .build();
    let mailer = Mailer::default();
    let owner = start_owner(&c, &mailer, Duration::from_secs(5), None).await;
    let waited = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert!(matches!(waited, Err(Error::InFlight { .. })), "{waited:?}");
    assert_eq!(owner.await.unwrap().unwrap().value, "em_1");
    assert_eq!(mailer.sent(), 1);
}

// ===== fingerprints =====

// ===== invalid keys =====

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// The seed's bug cannot happen: for any text, either the key is refused with a typed
    /// error before anything runs, or the action runs protected (once, then replayed).
    #[test]
    fn no_key_leaves_an_action_unprotected(raw in "\\PC{0,3}|.{0,600}|[:.\\\\\\x00-\\x1f]{0,6}") {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let c = Coordinator::new(MemoryStore::new());
            let mailer = Mailer::default();
            for _ in 0..2 {
                match Key::new(raw.clone()) {
                    Err(e) => {
                        // A typed error, and the action is never reachable without a Key.
                        let err: Error<Infallible> = e.into();
                        assert_eq!(err.kind(), ErrorKind::InvalidInput);
                    }
                    Ok(k) => {
                        let out = c.call(&op(), &k).run(|_| mailer.send(Duration::ZERO)).await.unwrap();
                        assert_ne!(out.source, Source::Unprotected);
                    }
                }
            }
            let runs = mailer.sent();
            assert!(runs <= 1, "{raw:?} ran the action {runs} times");
            assert_eq!(runs == 1, Key::new(raw.clone()).is_ok());
        });
    }
}

// ===== results that cannot be stored =====

#[tokio::test(start_paused = true)]
async fn a_result_too_large_to_store_is_never_run_again() {
    let c = Coordinator::builder(MemoryStore::new())
        .policy(Policy::default().max_result_bytes(16))
        .build();
    let runs = AtomicUsize::new(0);
    let action = |_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Infallible>("x".repeat(100))
    };
    let first = c.call(&op(), &key("k")).run(action).await.unwrap();
    assert_eq!((first.value.len(), first.source), (100, Source::Fresh));
    for _ in 0..3 {
        let again = c.call(&op(), &key("k")).run(action).await;
        match again {
            Err(Error::ResultUnavailable { reason }) => {
                assert!(reason.contains("exceeds"), "{reason}")
            }
            other => panic!("expected ResultUnavailable, got {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

struct FailingCodec;

impl Codec<String> for FailingCodec {
    fn encode(&self, _: &String) -> Result<Vec<u8>, BoxError> {
        Err("cannot encode".into())
    }
    fn decode(&self, b: &[u8]) -> Result<String, BoxError> {
        JsonCodec.decode(b)
    }
}

#[tokio::test(start_paused = true)]
async fn an_unencodable_result_is_never_run_again() {
    let c = Coordinator::new(MemoryStore::new());
    let mailer = Mailer::default();
    let first = c
        .call(&op(), &key("k"))
        .codec(FailingCodec)
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert_eq!(first.unwrap().value, "em_1");
    let again = c
        .call(&op(), &key("k"))
        .codec(FailingCodec)
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert_eq!(again.unwrap_err().kind(), ErrorKind::ResultUnavailable);
    assert_eq!(mailer.sent(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_stored_result_of_another_type_is_a_decode_error_not_a_rerun() {
    let c = Coordinator::new(MemoryStore::new());
    let runs = AtomicUsize::new(0);
    c.call(&op(), &key("k"))
        .run(|_| async { Ok::<_, Infallible>("text".to_string()) })
        .await
        .unwrap();
    let as_number = c
        .call(&op(), &key("k"))
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u64, Infallible>(1)
        })
        .await;
    assert_eq!(as_number.unwrap_err().kind(), ErrorKind::Decode);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

// ===== action errors =====

#[tokio::test(start_paused = true)]
async fn an_action_error_releases_the_key_so_a_retry_runs() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::new(store.clone());
    let failed = c
        .call(&op(), &key("k"))
        .run(|_| async { Err::<String, _>("smtp 451") })
        .await;
    assert!(matches!(failed, Err(Error::Action("smtp 451"))));
    assert_eq!(store.counts().release, 1);
    let retried = c
        .call(&op(), &key("k"))
        .run(|_| async { Ok::<_, &str>("em_2".to_string()) })
        .await;
    assert_eq!(retried.unwrap().source, Source::Fresh);
}

#[tokio::test(start_paused = true)]
async fn permanent_errors_are_stored_and_replayed_others_released() {
    let c = Coordinator::new(MemoryStore::new());
    let runs = AtomicUsize::new(0);
    let is_permanent = |e: &String| e.starts_with("declined");
    let act = |msg: &'static str| {
        let runs = &runs;
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<String, String>(msg.to_string())
        }
    };
    let transient = c
        .call(&op(), &key("k"))
        .store_errors(is_permanent)
        .run(act("timeout"))
        .await;
    assert!(matches!(transient, Err(Error::Action(_))));
    let permanent = c
        .call(&op(), &key("k"))
        .store_errors(is_permanent)
        .run(act("declined: card"))
        .await;
    assert!(matches!(permanent, Err(Error::ActionStored(ref e)) if e == "declined: card"));
    let replayed = c
        .call(&op(), &key("k"))
        .store_errors(is_permanent)
        .run(act("declined: other"))
        .await;
    assert!(
        matches!(replayed, Err(Error::ReplayedAction(ref e)) if e == "declined: card"),
        "{replayed:?}"
    );
    // A plain `run` cannot decode the stored error; it still must not run the action.
    let plain = c.call(&op(), &key("k")).run(act("x")).await;
    assert_eq!(plain.unwrap_err().kind(), ErrorKind::Decode);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

// ===== policies: reject, run, fail open / closed =====

#[tokio::test(start_paused = true)]
async fn run_mode_runs_the_duplicate_unprotected() {
    let c = Coordinator::new(MemoryStore::new());
    let mailer = Mailer::default();
    let owner = start_owner(&c, &mailer, Duration::from_secs(1), None).await;
    let dup = c
        .call(&op(), &key("k"))
        .in_flight(InFlight::Run)
        .run(|a| {
            assert!(!a.is_protected());
            mailer.send(Duration::ZERO)
        })
        .await
        .unwrap();
    assert_eq!((dup.source, dup.fencing), (Source::Unprotected, None));
    assert_eq!(owner.await.unwrap().unwrap().value, "em_1");
    assert_eq!(mailer.sent(), 2);
}

#[test]
fn fail_closed_runs_nothing_and_fail_open_runs_unprotected_and_counts() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = Probe::new(MemoryStore::new());
            store.fail(Fault::Begin, true);
            assert_fails_closed_then_open(store).await;
        });
    });
    assert_eq!(
        counter(&snapshotter, idemkit_core::observe::UNPROTECTED_RUNS),
        1
    );
    assert_eq!(
        counter(&snapshotter, idemkit_core::observe::STORE_ERRORS),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_record_fails_closed_even_when_failing_open() {
    let store = MemoryStore::new();
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().on_store_error(OnStoreError::FailOpen))
        .build();
    let sk = StorageKey::new(&op(), None, &key("k"));
    store
        .put_raw(&sk, "{\"foreign\":true}".into(), Duration::from_secs(60))
        .await
        .unwrap();
    let mailer = Mailer::default();
    let r = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    match r {
        Err(Error::Store { source, .. }) => assert_eq!(source.kind(), StoreErrorKind::Corrupt),
        other => panic!("expected a corrupt-record error, got {other:?}"),
    }
    assert_eq!(mailer.sent(), 0);
    // Nothing was lost: the foreign bytes are still there for an operator.
    assert_eq!(
        store.get(&sk).await.unwrap_err().kind(),
        StoreErrorKind::Corrupt
    );
}

#[tokio::test(start_paused = true)]
async fn a_store_outage_at_completion_still_returns_the_result() {
    let store = Probe::new(MemoryStore::new());
    let policy = Policy::default().lease(Duration::from_secs(1));
    let c = Coordinator::builder(store.clone()).policy(policy).build();
    let mailer = Mailer::default();
    store.fail(Fault::Complete, true);
    let out = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!((out.value.as_str(), out.source), ("em_1", Source::Fresh));
    store.fail(Fault::Complete, false);
    // The documented window: the reservation expires with its lease and a retry runs again.
    sleep(Duration::from_millis(1_100)).await;
    let retry = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (retry.value.as_str(), retry.source),
        ("em_2", Source::Fresh)
    );
}

// ===== TTL =====

#[tokio::test(start_paused = true)]
async fn an_exact_sub_second_ttl_is_honoured() {
    let c = Coordinator::new(MemoryStore::new());
    let mailer = Mailer::default();
    let ttl = Duration::from_millis(1_500);
    let (op, k) = (op(), key("k"));
    let call = || {
        c.call(&op, &k)
            .ttl(ttl)
            .run(|_| mailer.send(Duration::ZERO))
    };
    assert_eq!(call().await.unwrap().source, Source::Fresh);
    sleep(Duration::from_millis(1_499)).await;
    assert_eq!(call().await.unwrap().source, Source::Replayed);
    sleep(Duration::from_millis(1)).await;
    let after = call().await.unwrap();
    assert_eq!(
        (after.value.as_str(), after.source),
        ("em_2", Source::Fresh)
    );
}

// ===== cancellation =====

#[tokio::test(start_paused = true)]
async fn dropping_the_call_after_the_action_succeeded_still_stores_the_result() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::new(store.clone());
    let mailer = Mailer::default();
    store.hold_complete();
    let call = {
        let (c, mailer) = (c.clone(), mailer.clone());
        tokio::spawn(async move {
            c.call(&op(), &key("k"))
                .run(|_| mailer.send(Duration::ZERO))
                .await
        })
    };
    while store.counts().complete == 0 {
        tokio::task::yield_now().await;
    }
    call.abort(); // dropped inside `complete`
    assert!(call.await.unwrap_err().is_cancelled());
    store.open_complete();
    let replay = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (replay.value.as_str(), replay.source),
        ("em_1", Source::Replayed)
    );
    assert_eq!(mailer.sent(), 1);
}

// ===== observability =====

#[test]
fn hits_misses_waits_and_rejections_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let c = Coordinator::new(MemoryStore::new());
            let mailer = Mailer::default();
            let owner = start_owner(&c, &mailer, Duration::from_secs(1), None).await;
            let rejected = c
                .call(&op(), &key("k"))
                .in_flight(InFlight::Reject)
                .run(|_| mailer.send(Duration::ZERO))
                .await;
            assert!(rejected.is_err());
            c.call(&op(), &key("k"))
                .run(|_| mailer.send(Duration::ZERO))
                .await
                .unwrap(); // waits
            owner.await.unwrap().unwrap();
            c.call(&op(), &key("k"))
                .run(|_| mailer.send(Duration::ZERO))
                .await
                .unwrap(); // hit
        });
    });
    let n = |name| counter(&snapshotter, name);
    use idemkit_core::observe::*;
    assert_eq!((n(MISSES), n(REJECTIONS), n(HITS)), (1, 1, 2));
    assert!(n(WAITS) >= 1);
}
