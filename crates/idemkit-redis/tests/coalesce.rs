//! Coalesced calls on a Redis server this test owns, counted by Redis itself
//! (`INFO commandstats`): concurrent begins and completes go out as far fewer script calls
//! than calls, each key is still answered exactly as alone (concurrent duplicates included),
//! a cancelled call never wedges the queue, and with coalescing off every call is its own.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::record::{Holder, SharedHolder};
use idemkit_core::store::Reservation;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, Fingerprint, Key, Operation, OwnerToken, ResultKind,
    StorageKey, Store,
};
use idemkit_redis::RedisStore;
use support::RedisProcess;

/// Calls of `command` so far that did not fail, from the server's own counters (a script
/// call answered `NOSCRIPT`, then sent again after loading it, counts once).
fn calls(port: u16, command: &str) -> u64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "commandstats"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = text.lines().find_map(|l| l.strip_prefix(&prefix)) else {
        return 0;
    };
    let field = |name: &str| -> u64 {
        line.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .map_or(0, |n| n.trim().parse().unwrap())
    };
    field("calls") - field("failed_calls")
}

/// `EVALSHA` calls so far.
fn evalsha_calls(port: u16) -> u64 {
    calls(port, "evalsha")
}

/// What 64 concurrent begins and completes cost Redis: script calls for the begins, script
/// calls and plain `SET`s (`SET … IFEQ`, where the server has it) for the completes.
#[derive(Debug, PartialEq, Eq)]
struct Sent {
    began: u64,
    completed: u64,
    plain: u64,
}

async fn store(server: &RedisProcess, coalesce: bool) -> RedisStore {
    RedisStore::builder()
        .prefix(format!("coalesce-{:x}", fastrand::u64(..)))
        .coalesce(coalesce)
        .connect(&server.url())
        .await
        .unwrap()
}

fn keys(n: usize) -> Vec<StorageKey> {
    let op = Operation::new("mail.invoice").unwrap();
    (0..n)
        .map(|i| StorageKey::new(&op, None, &Key::new(format!("order-{i}")).unwrap()))
        .collect()
}

/// `CLIENT PAUSE ms ALL`: Redis holds every client's commands for `ms`.
fn pause(port: u16, ms: u32) {
    let paused = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &port.to_string(),
            "client",
            "pause",
            &ms.to_string(),
            "all",
        ])
        .output()
        .unwrap();
    assert!(paused.stdout.starts_with(b"OK"), "{paused:?}");
}

/// What key `i` of a mixed batch reserves with: a fingerprint for even keys, a holder for
/// every third (so the batch's reservations differ past their owner: sent key by key).
fn reserved_with(i: usize, mix: bool) -> (Option<Fingerprint>, Option<SharedHolder>) {
    let fingerprint =
        (mix && i.is_multiple_of(2)).then(|| Fingerprint::of(format!("{i}").as_bytes()));
    let holder = (!mix || i.is_multiple_of(3)).then(|| HOLDER.clone());
    (fingerprint, holder)
}

static HOLDER: std::sync::LazyLock<SharedHolder> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(Holder::new("host", 7, "coalesce")));

/// 64 tasks begin 64 keys at once, then complete them at once; the script calls Redis saw.
/// With `mix`, keys reserve with and without fingerprints and holders, and complete with the
/// right hint of what they reserved with, a wrong one, or none (`CompleteRequest::
/// reservation`): each completed record keeps its reservation's fingerprint and holder.
async fn begin_and_complete_64(store: &RedisStore, port: u16, mix: bool) -> Sent {
    let keys = keys(64);
    let before = evalsha_calls(port);
    // All 64 start together (a loaded machine would otherwise run the first ones before the
    // last are spawned, and "at once" would not be what is measured), while Redis holds
    // every command for 200 ms: the first calls' replies cannot come back before the last
    // ones arrive, however the machine schedules the tasks.
    pause(port, 200);
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let begins: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let (store, k, start) = (store.clone(), k.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let (fingerprint, holder) = reserved_with(i, mix);
                let req = BeginRequest::new(&k, OwnerToken::random(), Duration::from_secs(30))
                    .with_fingerprint(fingerprint)
                    .with_holder(holder.as_ref());
                match store.begin(&req).await.unwrap() {
                    Claim::Reserved { ownership, .. } => (k, ownership),
                    other => panic!("{k}: {other:?}"),
                }
            })
        })
        .collect();
    let mut leases = Vec::new();
    for b in begins {
        leases.push(b.await.unwrap());
    }
    let began = evalsha_calls(port) - before;
    let (before, sets) = (evalsha_calls(port), calls(port, "set"));
    pause(port, 200);
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let completes: Vec<_> = leases
        .iter()
        .enumerate()
        .map(|(i, (k, lease))| {
            let (store, k, lease, start) = (store.clone(), k.clone(), *lease, start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let (fingerprint, holder) = reserved_with(i, mix);
                let hint = match i % 4 {
                    _ if !mix => Some(Reservation::new(None, holder, Duration::from_secs(30))),
                    0 | 3 => Some(Reservation::new(
                        fingerprint,
                        holder,
                        Duration::from_secs(30),
                    )),
                    1 => Some(Reservation::new(None, None, Duration::from_secs(5))),
                    _ => None,
                };
                let done = CompleteRequest::new(
                    ResultKind::Value,
                    Bytes::from(format!("em_{k}")),
                    Duration::from_secs(60),
                )
                .with_reservation(hint);
                store.complete(&k, &lease, &done).await.unwrap();
            })
        })
        .collect();
    for c in completes {
        c.await.unwrap();
    }
    let (completed, plain) = (evalsha_calls(port) - before, calls(port, "set") - sets);
    // Every key holds its own result, under its own fencing token, with the fingerprint and
    // holder it reserved with.
    for (i, (k, lease)) in leases.iter().enumerate() {
        let r = store.get(k).await.unwrap().expect("completed");
        assert_eq!(r.fencing, lease.fencing);
        let (fingerprint, holder) = reserved_with(i, mix);
        assert_eq!(r.fingerprint, fingerprint, "{k}");
        assert_eq!(r.holder, holder, "{k}");
        match r.state {
            idemkit_core::RecordState::Completed(res) => {
                assert_eq!(res.bytes(), format!("em_{k}").as_bytes());
            }
            other => panic!("{k}: {other:?}"),
        }
    }
    Sent {
        began,
        completed,
        plain,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_go_out_as_few_script_calls() {
    let server = RedisProcess::start(&[]);
    for mix in [false, true] {
        let coalesced = store(&server, true).await;
        let plain = coalesced.conditional_set() == Some(true);
        let sent = begin_and_complete_64(&coalesced, server.port, mix).await;
        eprintln!("coalesced (mixed: {mix}, plain SET: {plain}): {sent:?}");
        assert!(sent.began < 32, "64 concurrent begins: {sent:?}");
        assert!(sent.completed < 32, "64 concurrent completes: {sent:?}");

        // The same without coalescing: one call per call. Where the server has `SET … IFEQ`,
        // a completion with its reservation's exact bytes is one plain `SET`; one with a
        // wrong hint (some of every fourth key of a mixed batch) is a `SET` that writes
        // nothing, then the script; one without a hint (every fourth) the script alone.
        let single = store(&server, false).await;
        let sent = begin_and_complete_64(&single, server.port, mix).await;
        // A wrong hint (no fingerprint, no holder) is right for an odd key that reserved
        // without a holder: only those with one (every third) are wrong in their bytes.
        let wrong = (0..64).filter(|i| i % 4 == 1 && i % 3 == 0).count() as u64;
        let expected = match (plain, mix) {
            (false, _) => (64, 0),
            (true, false) => (0, 64),
            (true, true) => (16 + wrong, 48),
        };
        assert_eq!(
            (sent.began, sent.completed, sent.plain),
            (64, expected.0, expected.1),
            "without coalescing (mixed: {mix}, plain SET: {plain})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_in_one_batch_are_answered_as_one_after_the_other() {
    let server = RedisProcess::start(&[]);
    let store = store(&server, true).await;
    let key = keys(1).remove(0);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (store, key) = (store.clone(), key.clone());
            tokio::spawn(async move {
                let req = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(30));
                store.begin(&req).await.unwrap()
            })
        })
        .collect();
    let mut kinds: HashMap<&str, usize> = HashMap::new();
    let mut fencing = None;
    for t in tasks {
        match t.await.unwrap() {
            Claim::Reserved { ownership, .. } => {
                *kinds.entry("reserved").or_default() += 1;
                fencing = Some(ownership.fencing);
            }
            Claim::InFlight { fencing: seen, .. } => {
                *kinds.entry("in flight").or_default() += 1;
                assert!(fencing.is_none_or(|f| f == seen));
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(kinds.get("reserved"), Some(&1), "{kinds:?}");
    assert_eq!(kinds.get("in flight"), Some(&63), "{kinds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_never_wedge_the_queue() {
    let server = RedisProcess::start(&[]);
    let store = store(&server, true).await;
    for round in 0..20 {
        // Many begins at once, half of them cancelled at once: leaders and queued alike.
        let keys = keys(32);
        let tasks: Vec<_> = keys
            .iter()
            .map(|k| {
                let (store, k) = (store.clone(), k.clone());
                tokio::spawn(async move {
                    let req = BeginRequest::new(&k, OwnerToken::random(), Duration::from_secs(1));
                    store.begin(&req).await
                })
            })
            .collect();
        for (i, t) in tasks.iter().enumerate() {
            if i % 2 == round % 2 {
                t.abort();
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        // The next call still gets its answer.
        let fresh = StorageKey::new(
            &Operation::new("after").unwrap(),
            None,
            &Key::new(format!("k-{round}")).unwrap(),
        );
        let req = BeginRequest::new(&fresh, OwnerToken::random(), Duration::from_secs(1));
        let answered = tokio::time::timeout(Duration::from_secs(5), store.begin(&req)).await;
        assert!(
            matches!(answered, Ok(Ok(Claim::Reserved { .. }))),
            "round {round}: {answered:?}"
        );
    }
}

/// A runtime of its own (the one that survives in the runtime-shutdown tests) and a store
/// with one connection on it: every call takes the same lane.
fn one_lane(server: &RedisProcess) -> (tokio::runtime::Runtime, RedisStore) {
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = main.block_on(async {
        RedisStore::builder()
            .prefix(format!("coalesce-{:x}", fastrand::u64(..)))
            .connections(1)
            .connect(&server.url())
            .await
            .unwrap()
    });
    (main, store)
}

/// Issue 20, item 11: a flush task dropped before its first poll (its runtime shut down
/// right after a call queued) must not leave its lane wedged.
///
/// Before: the guard that abandons the queue was built inside the task, so an unpolled
/// task never built it: the lane stayed "flushing" with the dropped job queued, and every
/// later call on it queued behind a flush that never came (this test's begin hung).
#[test]
fn a_flush_task_dropped_before_its_first_poll_leaves_no_wedge() {
    use std::future::Future;
    use std::task::Poll;

    let server = RedisProcess::start(&[]);
    let (main, store) = one_lane(&server);
    let keys = keys(3);
    let reqs: Vec<_> = keys
        .iter()
        .map(|k| BeginRequest::new(k, OwnerToken::random(), Duration::from_secs(30)))
        .collect();
    // Redis holds every client's commands for 300 ms: the lead's reply cannot come back
    // while the test polls (on a loaded machine it once did, within the first poll, and then
    // the second call led too and no flush task was spawned).
    pause(server.port, 300);
    // A runtime that lives just long enough for one call to lead and one to queue, which
    // spawns the flush task on it; the runtime is dropped before that task ever runs.
    let doomed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    doomed.block_on(async {
        let mut lead = std::pin::pin!(store.begin(&reqs[0]));
        let mut queued = std::pin::pin!(store.begin(&reqs[1]));
        std::future::poll_fn(|cx| {
            assert!(
                lead.as_mut().poll(cx).is_pending(),
                "the lead answered at once"
            );
            assert!(
                queued.as_mut().poll(cx).is_pending(),
                "the queued call answered at once"
            );
            Poll::Ready(())
        })
        .await;
    });
    drop(doomed);
    let later = main.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), store.begin(&reqs[2])).await
    });
    assert!(
        matches!(later, Ok(Ok(Claim::Reserved { .. }))),
        "the lane is wedged: {later:?}"
    );
}

/// Review M2 (the wedge): a batch task spawned by a flush but dropped before its first poll
/// (its runtime shut down mid-flush) must give its place on the wire back. Each round here
/// lets a doomed runtime run its flush task a different number of scheduler turns before
/// it is dropped, so some round drops it between `take_all` and the batch task's first poll.
///
/// Before: the batch's guard was built inside the spawned task, so an unpolled batch kept
/// its place for ever; two such leaks left no room on the lane's wire, and every later call
/// on it queued behind a flush that never came (this test's last begin hung).
#[test]
fn a_batch_dropped_before_its_first_poll_gives_its_place_back() {
    use std::future::Future;
    use std::task::Poll;

    let server = RedisProcess::start(&[]);
    let (main, store) = one_lane(&server);
    let keys = keys(200);
    let reqs: Vec<_> = keys
        .iter()
        .map(|k| BeginRequest::new(k, OwnerToken::random(), Duration::from_secs(30)))
        .collect();
    let mut next = reqs.iter();
    for turns in 0..12 {
        for _ in 0..2 {
            pause(server.port, 200);
            // One task per scheduler tick, then the block_on future again: so the doomed
            // runtime can end between the flush task's tick and its batch task's first.
            let doomed = tokio::runtime::Builder::new_current_thread()
                .event_interval(1)
                .enable_all()
                .build()
                .unwrap();
            let (a, b, c) = (
                next.next().unwrap(),
                next.next().unwrap(),
                next.next().unwrap(),
            );
            doomed.block_on(async {
                let mut calls = [
                    std::pin::pin!(store.begin(a)),
                    std::pin::pin!(store.begin(b)),
                    std::pin::pin!(store.begin(c)),
                ];
                std::future::poll_fn(|cx| {
                    for call in &mut calls {
                        let _ = call.as_mut().poll(cx);
                    }
                    Poll::Ready(())
                })
                .await;
                // The flush task's turns: it yields once, then takes the queue and spawns
                // its batches.
                for _ in 0..turns {
                    tokio::task::yield_now().await;
                }
            });
            drop(doomed);
        }
    }
    let last = next.next().unwrap();
    let later = main
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), store.begin(last)).await });
    assert!(
        matches!(later, Ok(Ok(Claim::Reserved { .. }))),
        "the lane is wedged: {later:?}"
    );
}
