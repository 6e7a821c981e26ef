//! Statements per call, counted as sqlx sends them (one `sqlx::query` event per statement
//! executed): a hit is one statement, a miss two, a transactional miss three (the
//! transaction's isolation level read on its connection, its begin on the pool, its
//! completion in the caller's transaction). The benchmark counts the same on the
//! server, from its statement log.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idemkit_core::{Coordinator, Key, Operation, Source};
use idemkit_postgres::InTransaction;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, SubscriberExt};

#[derive(Clone, Default)]
struct Statements(Arc<AtomicUsize>);

impl<S: tracing::Subscriber> Layer<S> for Statements {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() == "sqlx::query" {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Statements {
    fn take(&self) -> usize {
        self.0.swap(0, Ordering::SeqCst)
    }
}

/// The statements sent from this thread, counted, and a runtime on this thread alone: every
/// statement of the calls it runs (spawned tasks' too) is sent from here.
fn counting() -> (
    Statements,
    tracing::subscriber::DefaultGuard,
    tokio::runtime::Runtime,
) {
    let counted = Statements::default();
    let guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(counted.clone()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    (counted, guard, rt)
}

#[test]
fn a_hit_is_one_statement_a_miss_two_and_a_batch_one() {
    let (counted, _guard, rt) = counting();
    rt.block_on(async {
        let Some(store) = support::store().await else {
            return;
        };
        support::ledger(store.pool()).await;
        let c = Coordinator::new(store.clone());
        let op = Operation::new("count").unwrap();
        let run = |key: &'static str| {
            let (c, op) = (c.clone(), op.clone());
            async move {
                let key = Key::new(format!("{key}-{:x}", fastrand::u64(..))).unwrap();
                c.call(&op, &key)
                    .run(|_| async { Ok::<_, std::io::Error>(1) })
                    .await
                    .unwrap();
                key
            }
        };
        // Warm up: sqlx prepares each statement once per connection.
        for _ in 0..4 {
            let k = run("warm").await;
            c.call(&op, &k)
                .run(|_| async { Ok::<_, std::io::Error>(1) })
                .await
                .unwrap();
        }
        counted.take();

        let key = run("miss").await;
        assert_eq!(counted.take(), 2, "miss: begin + complete");
        let hit = c
            .call(&op, &key)
            .run(|_| async { Ok::<_, std::io::Error>(2) })
            .await
            .unwrap();
        assert_eq!(hit.source, Source::Replayed);
        assert_eq!(counted.take(), 1, "hit: begin only");
        // And a hit writes nothing: the row keeps its version (xmin) and carries no lock
        // (xmax 0): no WAL, no flush at commit, no contention between replays.
        let version = || async {
            sqlx::query_as::<_, (String, String)>(
                "SELECT xmin::text, xmax::text FROM idemkit_test.records WHERE key = $1",
            )
            .bind(idemkit_core::StorageKey::new(&op, None, &key).as_str())
            .fetch_one(store.pool())
            .await
            .unwrap()
        };
        let before = version().await;
        c.call(&op, &key)
            .run(|_| async { Ok::<_, std::io::Error>(3) })
            .await
            .unwrap();
        let after = version().await;
        assert_eq!(before, after);
        assert_eq!(after.1, "0", "a replay locked the row");
        counted.take();

        // Batch reservation: 8 keys reserved in one statement (then one completion each);
        // the same batch again, all replays, one statement in all.
        let keys: Vec<Key> = (0..8)
            .map(|i| Key::new(format!("batch-{i}-{:x}", fastrand::u64(..))).unwrap())
            .collect();
        for round in 0..3 {
            counted.take();
            let prepared = c.prepare(&op, &keys).await;
            let mut sources = Vec::new();
            for (k, p) in keys.iter().zip(prepared) {
                let out = c
                    .call(&op, k)
                    .prepared(p)
                    .run(|_| async { Ok::<_, std::io::Error>(4) })
                    .await
                    .unwrap();
                sources.push(out.source);
            }
            let n = counted.take();
            if round == 0 {
                assert!(sources.iter().all(|s| *s == Source::Fresh), "{sources:?}");
                assert_eq!(n, 1 + 8, "a fresh batch: one begin_many, 8 completions");
            } else {
                assert!(
                    sources.iter().all(|s| *s == Source::Replayed),
                    "{sources:?}"
                );
                assert_eq!(n, 1, "a replayed batch: one statement");
            }
        }
        counted.take();

        // The transactional call: begin on the pool, the action's own statement, the
        // completion in the transaction (BEGIN and COMMIT are the caller's).
        for round in 0..3 {
            let mut tx = store.pool().begin().await.unwrap();
            let key = Key::new(format!("tx-{:x}", fastrand::u64(..))).unwrap();
            counted.take();
            c.call(&op, &key)
                .in_transaction(&mut tx)
                .run(|conn, _| {
                    Box::pin(async move {
                        sqlx::query("INSERT INTO idemkit_test.ledger (order_id) VALUES ('count')")
                            .execute(conn)
                            .await
                            .map(drop)
                    })
                })
                .await
                .unwrap();
            let n = counted.take();
            tx.commit().await.unwrap();
            if round > 0 {
                assert_eq!(
                    n, 4,
                    "transactional miss: isolation check + begin + the action's insert + complete"
                );
            }
        }
    });
}

/// The store sends first the `begin` statement that recent calls suggest (src/guess.rs): after
/// a run of first deliveries a plain insert, after a run of replays a plain read, each one
/// statement; a wrong guess costs one statement more and answers exactly as `begin` would:
/// replays, mismatches, owners in flight, the caller's own reservation (renewed) and expired
/// reservations (taken over) after a run of first deliveries, and fresh and expired keys
/// after a run of replays.
#[test]
fn the_first_statement_follows_recent_begins_and_every_answer_stays_exact() {
    use std::time::Duration;

    use idemkit_core::{
        BeginRequest, Claim, CompleteRequest, Fingerprint, OwnerToken, ResultKind, StorageKey,
        Store,
    };

    let (counted, _guard, rt) = counting();
    rt.block_on(async {
        let Some(store) = support::store().await else {
            return;
        };
        let op = Operation::new("guess").unwrap();
        let fresh = || {
            let k = Key::new(format!("g-{:x}", fastrand::u64(..))).unwrap();
            StorageKey::new(&op, None, &k)
        };
        let long = Duration::from_secs(30);
        let begin = |key: &StorageKey, owner: OwnerToken, lease: Duration| {
            let (store, key) = (store.clone(), key.clone());
            async move {
                let req = BeginRequest::new(&key, owner, lease);
                store.begin(&req).await.unwrap()
            }
        };
        let reserve = |key: StorageKey, lease: Duration| {
            let begin = &begin;
            async move {
                match begin(&key, OwnerToken::random(), lease).await {
                    Claim::Reserved { ownership, .. } => ownership,
                    other => panic!("{other:?}"),
                }
            }
        };
        let done = CompleteRequest::new(ResultKind::Value, "1", long);
        // A completed key, its reservation made with a fingerprint.
        let completed = fresh();
        let fp = Some(Fingerprint::of(b"body"));
        let owner = OwnerToken::random();
        let Claim::Reserved { ownership, .. } = store
            .begin(&BeginRequest::new(&completed, owner, long).with_fingerprint(fp))
            .await
            .unwrap()
        else {
            panic!("not reserved")
        };
        store.complete(&completed, &ownership, &done).await.unwrap();
        let replays = || {
            let begin = &begin;
            let completed = completed.clone();
            async move {
                for _ in 0..32 {
                    assert!(matches!(
                        begin(&completed, OwnerToken::random(), long).await,
                        Claim::Mismatch
                    ));
                }
            }
        };
        let first_deliveries = || {
            let reserve = &reserve;
            async move {
                for _ in 0..32 {
                    reserve(fresh(), long).await;
                }
            }
        };
        // Warm up: sqlx prepares each statement once per connection.
        first_deliveries().await;
        replays().await;

        // After first deliveries: a fresh key is one insert.
        first_deliveries().await;
        counted.take();
        reserve(fresh(), long).await;
        assert_eq!(counted.take(), 1, "a first delivery after first deliveries");
        // Everything else there: the insert finds a row, then `begin`.
        first_deliveries().await;
        counted.take();
        let hit = store
            .begin(&BeginRequest::new(&completed, OwnerToken::random(), long).with_fingerprint(fp))
            .await
            .unwrap();
        assert!(matches!(hit, Claim::Replay(_)), "{hit:?}");
        assert_eq!(counted.take(), 2, "a replay after first deliveries");
        for live in [false, true] {
            // `live`: the same cases after replays.
            let condition = || async {
                if live {
                    replays().await
                } else {
                    first_deliveries().await
                }
            };
            condition().await;
            assert_eq!(
                begin(&completed, OwnerToken::random(), long).await,
                Claim::Mismatch
            );
            condition().await;
            let held = fresh();
            let theirs = reserve(held.clone(), long).await;
            condition().await;
            match begin(&held, OwnerToken::random(), long).await {
                Claim::InFlight { fencing, .. } => assert_eq!(fencing, theirs.fencing),
                other => panic!("{other:?}"),
            }
            // The caller's own reservation, asked for again: the same, renewed.
            let mine = fresh();
            let me = OwnerToken::random();
            let first = begin(&mine, me, Duration::from_secs(2)).await;
            condition().await;
            let again = begin(&mine, me, long).await;
            assert_eq!(first, again);
            let rec = store.get(&mine).await.unwrap().unwrap();
            assert!(
                rec.expires_at_ms - rec.created_at_ms > 20_000,
                "not renewed: {rec:?}"
            );
            // An expired reservation: taken over with a larger token.
            let expired = fresh();
            let old = reserve(expired.clone(), Duration::from_millis(30)).await;
            tokio::time::sleep(Duration::from_millis(60)).await;
            condition().await;
            match begin(&expired, OwnerToken::random(), long).await {
                Claim::Reserved {
                    ownership,
                    took_over,
                } => {
                    assert!(took_over);
                    assert!(ownership.fencing > old.fencing);
                }
                other => panic!("{other:?}"),
            }
        }
        // After replays: a replay is one read, a fresh key the read then `begin`.
        replays().await;
        counted.take();
        assert_eq!(
            begin(&completed, OwnerToken::random(), long).await,
            Claim::Mismatch
        );
        assert_eq!(counted.take(), 1, "a replay after replays");
        replays().await;
        counted.take();
        reserve(fresh(), long).await;
        assert_eq!(counted.take(), 2, "a first delivery after replays");
    });
}

/// 64 concurrent first deliveries: with coalescing (the default) the calls that queue behind
/// the two statements of each kind on the wire go out together, far fewer statements than
/// the 128 a miss each costs alone; with it off, exactly 128. Every call runs its action
/// once either way.
#[test]
fn concurrent_misses_share_statements_unless_coalescing_is_off() {
    use std::sync::atomic::AtomicU32;

    use idemkit_postgres::PgStore;

    let (counted, _guard, rt) = counting();
    rt.block_on(async {
        let Some(pool) = support::pool().await else {
            return;
        };
        support::store().await.expect("migrated");
        for coalesce in [true, false] {
            let store = PgStore::builder()
                .schema("idemkit_test")
                .table("records")
                .coalesce(coalesce)
                .build(pool.clone())
                .unwrap();
            let c = Coordinator::new(store);
            let op = Operation::new("concurrent").unwrap();
            let ran = Arc::new(AtomicU32::new(0));
            // Warm up the pool's connections (sqlx prepares each statement once per
            // connection), then count.
            for round in 0..2 {
                counted.take();
                let calls: Vec<_> = (0..64)
                    .map(|_| {
                        let (c, op, ran) = (c.clone(), op.clone(), ran.clone());
                        tokio::spawn(async move {
                            let key = Key::new(format!("c-{:x}", fastrand::u64(..))).unwrap();
                            c.call(&op, &key)
                                .run(|_| async move {
                                    ran.fetch_add(1, Ordering::SeqCst);
                                    Ok::<_, std::io::Error>(1)
                                })
                                .await
                                .unwrap()
                                .source
                        })
                    })
                    .collect();
                for call in calls {
                    assert_eq!(call.await.unwrap(), Source::Fresh);
                }
                let n = counted.take();
                if round == 1 {
                    if coalesce {
                        assert!(n <= 16, "{n} statements for 64 coalesced misses");
                    } else {
                        assert_eq!(n, 128, "two statements per miss");
                    }
                }
            }
            assert_eq!(ran.load(Ordering::SeqCst), 128);
        }
    });
}
