//! The review's findings against the coordinator and `MemoryStore`, one test each (issue 7).
//! Each of these failed before its fix; the comment on each says how.
//!
//! Time-dependent tests run in paused tokio time, so leases, renewals and store delays
//! interleave exactly and nothing sleeps for real.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkit_core::{
    Coordinator, Error, InFlight, Key, KeyError, MemoryStore, OnStoreError, Operation, Policy,
    Scope, Source,
};
use idemkit_test::{Fault, Mailer, Probe};
use tokio::time::sleep;

fn op() -> Operation {
    Operation::new("mail.invoice").unwrap()
}

fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

/// Starts an owner of key "k" whose mail takes `delay`.
fn spawn_owner<S: idemkit_core::Store>(
    c: &Coordinator<S>,
    mailer: &Mailer,
    delay: Duration,
) -> tokio::task::JoinHandle<Result<idemkit_core::Receipt<String>, Error<std::convert::Infallible>>>
{
    let mailer = mailer.clone();
    tokio::spawn(
        c.call_owned(op(), key("k"))
            .run(move |_| async move { mailer.send(delay).await }),
    )
}

// ===== 3. durations at the extremes =====

/// Before: "overflow when adding duration to instant" inside `MemoryStore::complete`, with
/// the shard lock held and the record half-updated.
#[tokio::test(start_paused = true)]
async fn a_ttl_of_duration_max_is_kept_and_replayed() {
    let c = Coordinator::new(MemoryStore::new());
    let mailer = Mailer::default();
    for _ in 0..2 {
        let out = c
            .call(&op(), &key("k"))
            .ttl(Duration::MAX)
            .run(|_| mailer.send(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(out.value, "em_1");
    }
    assert_eq!(mailer.sent(), 1);
}

/// Before: a panic in `MemoryStore::begin` (`now + lease`).
#[tokio::test(start_paused = true)]
async fn a_lease_of_duration_max_reserves_and_completes() {
    let c = Coordinator::builder(MemoryStore::new())
        .policy(Policy::default().lease(Duration::MAX))
        .build();
    let mailer = Mailer::default();
    let out = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!((out.value.as_str(), out.source), ("em_1", Source::Fresh));
}

/// Before: a panic in the coordinator (`started + wait_timeout`) as soon as the caller had
/// to wait.
#[tokio::test(start_paused = true)]
async fn a_wait_timeout_of_duration_max_waits_for_the_owner() {
    let c = Coordinator::builder(MemoryStore::new())
        .policy(Policy::default().wait_timeout(Duration::MAX))
        .build();
    let mailer = Mailer::default();
    let owner = spawn_owner(&c, &mailer, Duration::from_secs(20));
    sleep(Duration::from_millis(10)).await;
    let waiter = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (waiter.value.as_str(), waiter.source),
        ("em_1", Source::Replayed)
    );
    owner.await.unwrap().unwrap();
    assert_eq!(mailer.sent(), 1);
}

/// Before: a zero TTL was accepted and the record expired the moment it was stored, so
/// every retry ran the action again. Now it is a configuration error before anything runs.
#[tokio::test(start_paused = true)]
async fn a_zero_ttl_is_a_configuration_error_before_the_action() {
    let c = Coordinator::new(MemoryStore::new());
    let mailer = Mailer::default();
    let r = c
        .call(&op(), &key("k"))
        .ttl(Duration::ZERO)
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert!(r.is_err(), "a zero TTL must be refused, got {r:?}");
    assert_eq!(mailer.sent(), 0);
}

// ===== 5. warnings name their call =====

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Before: the warning "store unavailable: running unprotected" carried neither operation
/// nor key under an `info` filter (the call's span is `debug`).
#[test]
fn warnings_carry_the_operation_and_key_under_an_info_filter() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = Probe::new(MemoryStore::new());
            store.fail(Fault::Begin, true);
            let c = Coordinator::builder(store)
                .policy(Policy::default().on_store_error(OnStoreError::FailOpen))
                .build();
            c.call(&op(), &key("order-9.invoice"))
                .run(|_| async { Ok::<_, std::io::Error>(1) })
                .await
                .unwrap();
        });
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("WARN"), "no warning logged: {text}");
    assert!(
        text.contains("operation=mail.invoice") && text.contains("key=order-9.invoice"),
        "the warning does not name its call: {text}"
    );
}

// ===== 6. small ones =====

/// Before: `is_retryable()` was true for a permanent error that had just been stored, though
/// every retry replays it.
#[tokio::test(start_paused = true)]
async fn a_stored_permanent_error_is_not_retryable() {
    let c = Coordinator::new(MemoryStore::new());
    let declined = |_| async { Err::<String, _>("card declined".to_string()) };
    let first = c
        .call(&op(), &key("k"))
        .store_errors(|_| true)
        .run(declined)
        .await
        .unwrap_err();
    assert!(!first.is_retryable(), "{first:?}");
    let again = c
        .call(&op(), &key("k"))
        .store_errors(|_| true)
        .run(declined)
        .await
        .unwrap_err();
    assert!(!again.is_retryable(), "{again:?}");
}

/// Before: a permanent error was stored whatever its size: `max_result_bytes` applied to
/// values only.
#[tokio::test(start_paused = true)]
async fn an_oversized_permanent_error_is_not_stored() {
    let c = Coordinator::builder(MemoryStore::new())
        .policy(Policy::default().max_result_bytes(16))
        .build();
    let runs = Arc::new(Mutex::new(0));
    let fail = || {
        let runs = runs.clone();
        move |_| async move {
            *runs.lock().unwrap() += 1;
            Err::<String, _>("x".repeat(100))
        }
    };
    for _ in 0..2 {
        let r = c
            .call(&op(), &key("k"))
            .store_errors(|_| true)
            .run(fail())
            .await;
        assert!(matches!(r, Err(Error::Action(_))), "{r:?}");
    }
    // Not stored, so not replayed: the second call ran the action again.
    assert_eq!(*runs.lock().unwrap(), 2);
}

/// Before: a store failure during the wait was a hard `Error::Store { phase: Wait }` even
/// under fail-open, although nothing had run yet. Decided: fail-open applies to every phase
/// before the action runs, waiting included.
#[tokio::test(start_paused = true)]
async fn fail_open_also_covers_a_store_outage_while_waiting() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().on_store_error(OnStoreError::FailOpen))
        .build();
    let mailer = Mailer::default();
    let owner = spawn_owner(&c, &mailer, Duration::from_secs(5));
    sleep(Duration::from_millis(10)).await;
    store.fail(Fault::Wait, true);
    let waiter = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(waiter.source, Source::Unprotected);
    owner.await.unwrap().unwrap();
}

// ===== 8. a failed completion is retried while the lease lasts =====

/// Before: `complete` was tried once; the key was left to expire with its lease and the next
/// delivery ran the effect again (`em_2`).
#[tokio::test(start_paused = true)]
async fn a_completion_that_fails_for_less_than_a_lease_is_stored_once_the_store_is_back() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(Duration::from_secs(15)))
        .build();
    let mailer = Mailer::default();
    store.fail(Fault::Complete, true);
    let healer = {
        let store = store.clone();
        tokio::spawn(async move {
            sleep(Duration::from_secs(3)).await;
            store.fail(Fault::Complete, false);
        })
    };
    let first = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (first.value.as_str(), first.source),
        ("em_1", Source::Fresh)
    );
    healer.await.unwrap();
    let again = c
        .call(&op(), &key("k"))
        .in_flight(InFlight::Reject)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        (again.value.as_str(), again.source),
        ("em_1", Source::Replayed)
    );
    assert_eq!(mailer.sent(), 1);
}

// ===== 11. store calls are bounded =====

/// Before: the first renewal never answered, so no later renewal was sent; the 300 ms lease
/// ran out and a duplicate at +400 ms ran the action a second time.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_never_answers_does_not_stop_the_next_ones() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(Duration::from_millis(300)))
        .build();
    let mailer = Mailer::default();
    store.hang_next(Fault::Renew, 1);
    let owner = spawn_owner(&c, &mailer, Duration::from_secs(1));
    sleep(Duration::from_millis(400)).await;
    let dup = c
        .call(&op(), &key("k"))
        .in_flight(InFlight::Reject)
        .run(|_| mailer.send(Duration::ZERO))
        .await;
    assert!(
        matches!(dup, Err(Error::InFlight { .. })),
        "the owner's lease ran out: {dup:?}"
    );
    owner.await.unwrap().unwrap();
    assert_eq!(mailer.sent(), 1);
}

/// Before: a `begin` that never answered hung its caller for ever.
#[tokio::test(start_paused = true)]
async fn a_begin_that_never_answers_fails_as_unavailable() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::new(store.clone());
    store.hang_next(Fault::Begin, 1);
    let mailer = Mailer::default();
    let r = tokio::time::timeout(
        Duration::from_secs(3600),
        c.call(&op(), &key("k"))
            .run(|_| mailer.send(Duration::ZERO)),
    )
    .await
    .expect("the call must not hang");
    assert_eq!(
        r.unwrap_err().kind(),
        idemkit_core::ErrorKind::StoreUnavailable
    );
    assert_eq!(mailer.sent(), 0);
}

// ===== 12. the lease lives until the completion answered =====

/// Before: renewals stopped when the action returned; with a 60 ms lease and a 250 ms
/// completion the lease ran out mid-completion and a duplicate ran the action again.
#[tokio::test(start_paused = true)]
async fn the_lease_is_renewed_while_the_completion_is_in_flight() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(Duration::from_millis(60)))
        .build();
    let mailer = Mailer::default();
    store.hold_complete();
    let owner = spawn_owner(&c, &mailer, Duration::from_millis(10));
    sleep(Duration::from_millis(160)).await;
    // Bounded: a duplicate that took the key over would hang on the held completion.
    let dup = tokio::time::timeout(
        Duration::from_secs(60),
        c.call(&op(), &key("k"))
            .in_flight(InFlight::Reject)
            .run(|_| mailer.send(Duration::ZERO)),
    )
    .await;
    assert!(
        matches!(dup, Ok(Err(Error::InFlight { .. }))),
        "the lease ran out during the completion: {dup:?}"
    );
    sleep(Duration::from_millis(100)).await;
    store.open_complete();
    assert_eq!(owner.await.unwrap().unwrap().value, "em_1");
    let after = c
        .call(&op(), &key("k"))
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(after.source, Source::Replayed);
    assert_eq!(mailer.sent(), 1);
}

// ===== 13. a hung action does not hold its key for ever =====

/// Before: a hung action's process kept renewing for ever; a retry an hour later was still
/// told "in progress".
#[tokio::test(start_paused = true)]
async fn a_hung_action_loses_its_key_after_the_maximum_hold() {
    let c = Coordinator::new(MemoryStore::new());
    let hung = {
        let c = c.clone();
        tokio::spawn(async move {
            c.call(&op(), &key("k"))
                .run(|_| std::future::pending::<Result<String, std::io::Error>>())
                .await
        })
    };
    sleep(Duration::from_secs(3600) + Policy::default().lease + Duration::from_secs(1)).await;
    let retry = c
        .call(&op(), &key("k"))
        .in_flight(InFlight::Reject)
        .run(|_| async { Ok::<_, std::io::Error>("em_2".to_string()) })
        .await
        .unwrap();
    assert_eq!(retry.source, Source::Fresh);
    hung.abort();
}

// ===== 14. blank keys =====

/// Before: a whitespace-only key was accepted, so two orders whose id was blank shared a key.
#[test]
fn blank_keys_scopes_and_parts_are_refused() {
    assert!(matches!(Key::new("   "), Err(KeyError::Empty { .. })));
    assert!(matches!(Key::new("\u{3000}"), Err(KeyError::Empty { .. })));
    assert!(matches!(
        Key::compose(["order", " "]),
        Err(KeyError::Empty { .. })
    ));
    assert!(matches!(Scope::new("  "), Err(KeyError::Empty { .. })));
    // Inner and edge spaces in a non-blank key are the caller's text, kept as they are.
    assert_eq!(Key::new(" a b ").unwrap().as_str(), " a b ");
}

// ===== 9. the action learns that its lease is gone =====

/// Before: `Attempt` carried only the fencing token (this test did not compile); an action
/// whose renewals failed went on to its irreversible step after a successor had started.
#[tokio::test(start_paused = true)]
async fn the_action_is_told_when_its_lease_can_no_longer_be_confirmed() {
    let store = Probe::new(MemoryStore::new());
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(Duration::from_millis(300)))
        .build();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let owner = {
        let (c, store, sent) = (c.clone(), store.clone(), sent.clone());
        tokio::spawn(async move {
            c.call(&op(), &key("k"))
                .run(|attempt| async move {
                    assert!(!attempt.is_lease_lost());
                    // The store goes away mid-action: no renewal can be confirmed.
                    store.fail(Fault::Renew, true);
                    attempt.lease_lost().await;
                    assert!(attempt.is_lease_lost());
                    // The pattern: check before the irreversible step.
                    if attempt.is_lease_lost() {
                        return Err("lease lost: not sending");
                    }
                    sent.lock().unwrap().push("owner");
                    Ok("em_1".to_string())
                })
                .await
        })
    };
    let r = owner.await.unwrap();
    assert!(
        matches!(r, Err(Error::Action("lease lost: not sending"))),
        "{r:?}"
    );
    assert!(sent.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_lease_lost_to_a_successor_is_reported_to_the_stale_action() {
    let store = MemoryStore::new();
    let c = Coordinator::builder(store.clone())
        .policy(Policy::default().lease(Duration::from_millis(300)))
        .build();
    let owner = {
        let c = c.clone();
        tokio::spawn(async move {
            c.call(&op(), &key("k"))
                .run(|attempt| async move {
                    attempt.lease_lost().await;
                    Ok::<_, std::io::Error>(attempt.is_lease_lost())
                })
                .await
        })
    };
    sleep(Duration::from_millis(10)).await;
    // An operator purges the key and a successor takes it: the owner's next renewal is
    // refused (LeaseLost), and its action hears of it.
    use idemkit_core::RawStore as _;
    let sk = idemkit_core::StorageKey::new(&op(), None, &key("k"));
    store.purge(&sk).await.unwrap();
    let successor = c
        .call(&op(), &key("k"))
        .run(|_| async { Ok::<_, std::io::Error>(false) })
        .await
        .unwrap();
    assert_eq!(successor.source, Source::Fresh);
    let out = owner.await.unwrap().unwrap();
    assert!(out.value, "the stale action was not told");
}

// ===== what the integrations need =====

#[tokio::test(start_paused = true)]
async fn an_owned_call_can_be_spawned() {
    let c = Coordinator::new(MemoryStore::new());
    let mailer = Mailer::default();
    let spawn = |mailer: Mailer| {
        tokio::spawn(
            c.call_owned(op(), key("k"))
                .scope_owned(Scope::new("tenant-1").unwrap())
                .run(move |_| async move { mailer.send(Duration::ZERO).await }),
        )
    };
    let first = spawn(mailer.clone()).await.unwrap().unwrap();
    let again = spawn(mailer.clone()).await.unwrap().unwrap();
    assert_eq!(
        (first.source, again.source),
        (Source::Fresh, Source::Replayed)
    );
    assert_eq!(mailer.sent(), 1);
}

#[tokio::test(start_paused = true)]
async fn policy_after_ttl_keeps_the_ttl() {
    let c = Coordinator::new(MemoryStore::new());
    let mailer = Mailer::default();
    let (op, k) = (op(), key("k"));
    let call = || {
        c.call(&op, &k)
            .ttl(Duration::from_secs(2))
            .policy(Policy::default())
            .run(|_| mailer.send(Duration::ZERO))
    };
    call().await.unwrap();
    sleep(Duration::from_secs(3)).await;
    // With the policy's 24 h TTL this would replay.
    assert_eq!(call().await.unwrap().source, Source::Fresh);
}

#[tokio::test(start_paused = true)]
async fn a_rejected_duplicate_is_told_the_hint_not_the_whole_lease() {
    let c = Coordinator::builder(MemoryStore::new())
        .policy(Policy::default().retry_hint(Some(Duration::from_millis(300))))
        .build();
    let mailer = Mailer::default();
    let owner = spawn_owner(&c, &mailer, Duration::from_secs(1));
    sleep(Duration::from_millis(100)).await;
    let dup = c
        .call(&op(), &key("k"))
        .in_flight(InFlight::Reject)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap_err();
    match dup {
        Error::InFlight {
            retry_after,
            lease_left,
            held_for,
            ..
        } => {
            assert_eq!(held_for, Some(Duration::from_millis(100)));
            assert_eq!(retry_after, Duration::from_millis(200));
            assert!(lease_left > Duration::from_secs(14), "{lease_left:?}");
        }
        other => panic!("{other:?}"),
    }
    owner.await.unwrap().unwrap();
}

/// Issue 52: a duplicate refused while the original runs is told where the original is: its
/// attempt (the fencing token the original's action sees and its record keeps) and the
/// process running it (the original coordinator's holder), not the duplicate's own.
#[tokio::test(start_paused = true)]
async fn a_rejected_duplicate_points_to_the_original() {
    let store = MemoryStore::new();
    let original = Coordinator::builder(store.clone())
        .holder_name("billing-worker")
        .build();
    let duplicate = Coordinator::builder(store)
        .holder_name("other-worker")
        .build();
    let (started, seen) = tokio::sync::oneshot::channel();
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let owner = tokio::spawn(
        original
            .call_owned(op(), key("k"))
            .run(move |a| async move {
                let _ = started.send(a.fencing_token());
                let _ = finished.await;
                Ok::<_, std::convert::Infallible>("em_1".to_string())
            }),
    );
    let fencing = seen
        .await
        .unwrap()
        .expect("a protected run has a fencing token");
    let dup = duplicate
        .call(&op(), &key("k"))
        .in_flight(InFlight::Reject)
        .run(|_| async { Ok::<_, std::convert::Infallible>("em_2".to_string()) })
        .await
        .unwrap_err();
    match dup {
        Error::InFlight {
            attempt, holder, ..
        } => {
            assert_eq!(attempt, Some(fencing));
            let holder = holder.expect("the MemoryStore reports the holder");
            assert_eq!(holder.name, "billing-worker");
            assert_eq!(holder.pid, std::process::id());
        }
        other => panic!("{other:?}"),
    }
    finish.send(()).unwrap();
    owner.await.unwrap().unwrap();
}

#[test]
fn errors_display_whatever_the_action_error_is() {
    struct NotDisplay;
    let e: Error<NotDisplay> = Error::Action(NotDisplay);
    assert_eq!(e.to_string(), "the action failed; a retry runs it again");
    assert_eq!(
        e.disposition(),
        idemkit_core::Disposition::Retry { after: None }
    );
}
