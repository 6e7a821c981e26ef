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

#[test]
fn a_hit_is_one_statement_a_miss_two_and_a_batch_one() {
    let counted = Statements::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(counted.clone()));
    // One thread: every statement of the calls below is sent from here.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
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
