//! Statements per call, counted by the server (the session's `Questions` on a store of one
//! connection): a replay is one statement once recent calls were replays (the store reads
//! first), a first delivery's reservation one statement otherwise, and a wrong guess costs
//! one statement more with the same answer.

mod support;

use std::time::Duration;

use idemkit_core::{
    BeginRequest, Claim, Coordinator, Key, Operation, OwnerToken, Source, StorageKey, Store,
};
use idemkit_mysql::MySqlStore;
use sqlx::mysql::MySqlPoolOptions;

async fn one_connection() -> Option<(MySqlStore, sqlx::MySqlPool)> {
    support::store().await?;
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&support::url())
        .await
        .unwrap();
    let store = MySqlStore::builder()
        .table("idemkit_test_records")
        .build(pool.clone())
        .unwrap();
    Some((store, pool))
}

async fn questions(pool: &sqlx::MySqlPool) -> u64 {
    let (_, n): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Questions'")
        .fetch_one(pool)
        .await
        .unwrap();
    n.parse().unwrap()
}

/// Statements the call sent (the reading of `Questions` itself taken out).
async fn counted<F: std::future::Future<Output = Source>>(
    pool: &sqlx::MySqlPool,
    call: F,
) -> (u64, Source) {
    let before = questions(pool).await;
    let source = call.await;
    (questions(pool).await - before - 1, source)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_statement_follows_recent_begins_and_every_answer_stays_exact() {
    let Some((store, pool)) = one_connection().await else {
        return;
    };
    let c = Coordinator::new(store);
    let op = Operation::new(format!("rt{:x}", fastrand::u64(..))).unwrap();
    let call = |k: String| {
        let (c, op) = (c.clone(), op.clone());
        async move {
            c.call(&op, &Key::new(k).unwrap())
                .ttl(Duration::from_secs(60))
                .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                .await
                .unwrap()
                .source
        }
    };
    // First deliveries: the upsert first. A miss is the upsert and the completion.
    for i in 0..16 {
        call(format!("m{i}")).await;
    }
    assert_eq!(
        counted(&pool, call("m-next".into())).await,
        (2, Source::Fresh)
    );
    // A replay after first deliveries: the upsert meets the row, then the read.
    assert_eq!(
        counted(&pool, call("m0".into())).await,
        (2, Source::Replayed)
    );
    // Replays: the read first, one statement.
    for i in 0..16 {
        call(format!("m{i}")).await;
    }
    assert_eq!(
        counted(&pool, call("m1".into())).await,
        (1, Source::Replayed)
    );
    // A first delivery after replays: the read finds nothing, the upsert reserves, the
    // completion: one statement more, the same answer.
    assert_eq!(
        counted(&pool, call("fresh".into())).await,
        (3, Source::Fresh)
    );
    assert_eq!(
        counted(&pool, call("fresh".into())).await,
        (1, Source::Replayed)
    );

    // Still reading first (the guess moves slowly): an expired reservation is taken over, and
    // a `begin` by the owner of a live one renews it, as the upsert would answer.
    let store = MySqlStore::builder()
        .table("idemkit_test_records")
        .build(pool.clone())
        .unwrap();
    let c2 = Coordinator::new(store.clone());
    // 32 replays: the score near full, so that the three `begin`s below all read first.
    for i in 0..32 {
        c2.call(&op, &Key::new(format!("m{}", i % 16)).unwrap())
            .run(|_| async { Ok::<_, std::io::Error>(1u32) })
            .await
            .unwrap();
    }
    let key = StorageKey::new(&op, None, &Key::new("lease").unwrap());
    let owner = OwnerToken::random();
    let short = BeginRequest::new(&key, owner, Duration::from_millis(200));
    let Claim::Reserved {
        ownership,
        took_over: false,
    } = store.begin(&short).await.unwrap()
    else {
        panic!("a fresh key is reserved")
    };
    let Claim::Reserved {
        ownership: again, ..
    } = store.begin(&short).await.unwrap()
    else {
        panic!("the owner's own reservation")
    };
    assert_eq!(
        again.fencing, ownership.fencing,
        "a renewal, not a new reservation"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = BeginRequest::new(&key, OwnerToken::random(), Duration::from_secs(5));
    let Claim::Reserved {
        ownership: taken,
        took_over: true,
    } = store.begin(&other).await.unwrap()
    else {
        panic!("an expired reservation is taken over")
    };
    assert!(taken.fencing > ownership.fencing);
}
