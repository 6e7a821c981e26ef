//! Plain begins (ARCHITECTURE row R13): a fresh key's reservation written by `SET … NX …
//! GET` between two `TIME`s, pipelined, with a fencing token the client stamped, kept only
//! when the `TIME`s prove it greater than every earlier token of the key. These tests move the client's estimate of the server's clock far off (ten seconds
//! early, or late) and check that every token still exceeds the one before it, after an
//! expiry, alone and in coalesced batches, and that the record holds the token its owner was
//! given.

mod support;

use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, Coordinator, Key, Operation, OwnerToken, Ownership,
    RecordState, ResultKind, StorageKey, Store,
};
use idemkit_redis::RedisStore;

/// The shortest lease a call may have: the proof's margin rests on it.
const SHORT: Duration = Duration::from_millis(3);

fn key(name: &str) -> StorageKey {
    let op = Operation::new("mail.invoice").unwrap();
    StorageKey::new(&op, None, &Key::new(name).unwrap())
}

/// `k` reserved by a `begin` sent while another request is on the store's wire (see
/// [`busy_begin`]): a plain one, where the store has an estimate of the server's clock.
async fn reserve(store: &RedisStore, k: &StorageKey, lease: Duration) -> Ownership {
    match busy_begin(store, &BeginRequest::new(k, OwnerToken::random(), lease)).await {
        Claim::Reserved { ownership, .. } => ownership,
        other => panic!("{k}: not reserved: {other:?}"),
    }
}

/// `req`'s `begin`, sent while a read of another key waits for its reply on the same
/// connection (the read is polled first, and this test's current-thread runtime runs
/// nothing else between the two polls, so its request is queued when the `begin` looks).
/// Without coalescing, the store's own client sends a `begin` plain only then: one alone on
/// an idle connection is the script (one reply against three).
async fn busy_begin(store: &RedisStore, req: &BeginRequest<'_>) -> Claim {
    let other = key("another-key");
    let (read, claim) = tokio::join!(store.get(&other), store.begin(req));
    read.unwrap();
    claim.unwrap()
}

/// Waits for `k`'s record to expire by the server's clock (the end of its lease or TTL is
/// the event; each look is one read).
async fn expired(store: &RedisStore, k: &StorageKey) {
    for _ in 0..10_000 {
        if store.get(k).await.unwrap().is_none() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{k} never expired");
}

/// The server's clock in microseconds.
async fn server_us(url: &str) -> u64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    s * 1_000_000 + us
}

/// A store that does not coalesce (its `begin`s plain when sent beside another request,
/// [`busy_begin`]; a lone `begin` to an idle coalescing lane is the script), or one that
/// coalesces.
async fn store(url: &str, coalesce: bool) -> Option<RedisStore> {
    let store = RedisStore::builder()
        .prefix(support::prefix())
        .coalesce(coalesce)
        .connect(url)
        .await;
    if !idemkit_test::require_service(&format!("redis at {url}"), store.is_ok()) {
        return None;
    }
    let store = store.unwrap();
    // A script reservation teaches the store the server's clock; plain begins follow.
    reserve(&store, &key("warm-up"), Duration::from_secs(5)).await;
    Some(store)
}

/// Without coalescing, on the store's own client (the default for `redis://`), a `begin`
/// alone on its idle connection is the script, one sent beside another request plain.
#[tokio::test]
async fn a_lone_begin_on_an_idle_connection_is_the_script_and_a_busy_one_plain() {
    let url = support::redis_url();
    let Some(store) = store(&url, false).await else {
        return;
    };
    let before = store.plain_begin_counts();
    let lone = store
        .begin(&BeginRequest::new(
            &key("lone"),
            OwnerToken::random(),
            SHORT,
        ))
        .await
        .unwrap();
    assert!(matches!(lone, Claim::Reserved { .. }), "{lone:?}");
    assert_eq!(store.plain_begin_counts().sent, before.sent, "the script");
    reserve(&store, &key("busy"), SHORT).await;
    assert_eq!(store.plain_begin_counts().sent, before.sent + 1, "plain");
}

#[tokio::test]
async fn a_stamp_the_servers_clock_does_not_prove_is_taken_again_from_it() {
    let url = support::redis_url();
    let Some(store) = store(&url, false).await else {
        return;
    };
    let k = key("order-9.invoice");

    // A plain begin (its stamp proven, unless the machine is so busy that over 1 ms passed
    // between stamping and running: then taken again, as below).
    let before = store.plain_begin_counts();
    let first = reserve(&store, &k, SHORT).await;
    let after = store.plain_begin_counts();
    assert_eq!(after.sent, before.sent + 1, "a plain begin");
    expired(&store, &k).await;

    // Stamps ten seconds early: the next reservation of the expired key would carry a token
    // under the expired one's. The server's clock refuses the proof; the script takes the
    // token again.
    store.skew_stamps_for_tests(-10_000_000);
    let second = reserve(&store, &k, SHORT).await;
    assert!(
        second.fencing > first.fencing,
        "a token after an expiry must be greater: {} then {}",
        first.fencing.get(),
        second.fencing.get()
    );
    assert_eq!(store.plain_begin_counts().stale, after.stale + 1);
    expired(&store, &k).await;

    // Stamps ten seconds late: ahead of the server's clock, not kept either (a later stamp
    // could fall under them).
    store.skew_stamps_for_tests(10_000_000);
    let now = server_us(&url).await;
    let third = busy_begin(
        &store,
        &BeginRequest::new(&k, OwnerToken::random(), Duration::from_secs(5)),
    )
    .await;
    let Claim::Reserved {
        ownership: third, ..
    } = third
    else {
        panic!("not reserved: {third:?}");
    };
    assert!(third.fencing > second.fencing);
    assert!(
        third.fencing.get() < now + 5_000_000,
        "the token came from the server's clock, not the late stamp"
    );

    // The record holds the token its owner was given, and its owner completes with it.
    let record = store.get(&k).await.unwrap().expect("reserved");
    assert_eq!(record.fencing, third.fencing);
    let done = CompleteRequest::new(ResultKind::Value, Bytes::from_static(b"em_1"), SHORT * 1000);
    store.complete(&k, &third, &done).await.unwrap();
    let record = store.get(&k).await.unwrap().expect("completed");
    assert!(matches!(record.state, RecordState::Completed(_)));
    assert_eq!(record.fencing, third.fencing);
}

/// Coalesced first deliveries with stamps ten seconds early: every batch's keys are reserved
/// once, each action sees the token its record holds, and no token is the early stamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_begins_with_early_stamps_take_their_tokens_from_the_server() {
    let url = support::redis_url();
    let Some(store) = store(&url, true).await else {
        return;
    };
    store.skew_stamps_for_tests(-10_000_000);
    let start = server_us(&url).await;
    let before = store.plain_begin_counts();
    let c = Coordinator::new(store.clone());
    let op = Operation::new("mail.invoice").unwrap();
    let calls = (0..48).map(|i| {
        let (c, op) = (c.clone(), op.clone());
        tokio::spawn(async move {
            let k = Key::new(format!("batch-{i}")).unwrap();
            c.call(&op, &k)
                .run(|attempt| {
                    let fencing = attempt.fencing_token().expect("a fenced store").get();
                    async move { Ok::<_, std::io::Error>(fencing) }
                })
                .await
                .unwrap()
                .value
        })
    });
    let tokens = futures_util::future::join_all(calls).await;
    for (i, token) in tokens.into_iter().enumerate() {
        let token = token.unwrap();
        assert!(
            token >= start,
            "batch-{i}: the early stamp {token} was kept"
        );
        let record = store
            .get(&key(&format!("batch-{i}")))
            .await
            .unwrap()
            .expect("completed");
        assert_eq!(record.fencing.get(), token, "batch-{i}");
    }
    let after = store.plain_begin_counts();
    assert!(
        after.stale > before.stale,
        "no stamp went out (plain begins: {} then {})",
        before.sent,
        after.sent
    );
    assert_eq!(
        after.stale - before.stale,
        after.sent - before.sent,
        "every early stamp was found stale"
    );
}

/// The shortest life a key can have after a token is issued is a completed record's 1 ms
/// TTL, not the lease: a stamp 1.7 ms early is not kept for the key that record leaves free
/// (a window sized by the 3 ms lease kept it; the token then depended on how long the
/// expiry took to be seen), and the token that replaces it is greater.
#[tokio::test]
async fn a_key_freed_by_the_shortest_ttl_still_gets_a_greater_token() {
    let url = support::redis_url();
    let Some(store) = store(&url, false).await else {
        return;
    };
    let k = key("short-ttl");
    for round in 0..10 {
        store.skew_stamps_for_tests(0);
        let first = reserve(&store, &k, Duration::from_secs(5)).await;
        let done = CompleteRequest::new(
            ResultKind::Value,
            Bytes::from_static(b"em_1"),
            Duration::from_millis(1),
        );
        store.complete(&k, &first, &done).await.unwrap();
        store.skew_stamps_for_tests(-1_700);
        expired(&store, &k).await;
        let stale = store.plain_begin_counts().stale;
        let again = reserve(&store, &k, SHORT).await;
        assert_eq!(
            store.plain_begin_counts().stale,
            stale + 1,
            "round {round}: a stamp 1.7 ms early was kept"
        );
        assert!(
            again.fencing > first.fencing,
            "round {round}: {} after {}",
            again.fencing.get(),
            first.fencing.get()
        );
        expired(&store, &k).await;
    }
}
