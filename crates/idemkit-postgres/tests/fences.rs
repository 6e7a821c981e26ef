//! Fenced writes on a real PostgreSQL: a stale and a fresh writer raced in real tasks and
//! transactions, each ordering, with the tokens of real reservations; and the same race
//! without the fence, where the stale write lands.

mod support;

use std::time::Duration;

use idemkit_core::{FencingToken, Key, Operation, StorageKey, Store};
use idemkit_postgres::Fences;
use sqlx::PgPool;
use tokio::sync::oneshot;

const SCHEMA: &str = "idemkit_fences_test";

async fn setup() -> Option<(PgPool, Fences, String)> {
    let pool = support::pool().await?;
    let fences = Fences::new().schema(SCHEMA).unwrap();
    fences.migrate(&pool).await.unwrap();
    // Under a lock: concurrent `CREATE TABLE IF NOT EXISTS` can still collide.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('idemkit_fences_test'))")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {SCHEMA}.accounts (id text PRIMARY KEY, plan text NOT NULL, writer bigint NOT NULL)"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let account = format!("account-{:x}", fastrand::u64(..));
    sqlx::query(&format!(
        "INSERT INTO {SCHEMA}.accounts (id, plan, writer) VALUES ($1, 'free', 0)"
    ))
    .bind(&account)
    .execute(&pool)
    .await
    .unwrap();
    Some((pool, fences, account))
}

/// One writer: in a transaction, (optionally) advance the fence, then set the plan.
/// `hold` keeps the transaction open after the fence until it fires. Returns whether it
/// wrote.
async fn write(
    pool: PgPool,
    fences: Option<Fences>,
    account: String,
    plan: &'static str,
    token: FencingToken,
    advanced: Option<oneshot::Sender<()>>,
    hold: Option<oneshot::Receiver<()>>,
) -> bool {
    let mut tx = pool.begin().await.unwrap();
    if let Some(fences) = &fences
        && !fences.advance(&mut tx, &account, token).await.unwrap()
    {
        tx.rollback().await.unwrap();
        return false;
    }
    if let Some(advanced) = advanced {
        let _ = advanced.send(());
    }
    if let Some(hold) = hold {
        let _ = hold.await;
    }
    sqlx::query(&format!(
        "UPDATE {SCHEMA}.accounts SET plan = $2, writer = $3 WHERE id = $1"
    ))
    .bind(&account)
    .bind(plan)
    .bind(token.get() as i64)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    true
}

async fn plan(pool: &PgPool, account: &str) -> (String, i64) {
    sqlx::query_as(&format!(
        "SELECT plan, writer FROM {SCHEMA}.accounts WHERE id = $1"
    ))
    .bind(account)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Two reservations of one key on the records table: the stale one (its lease ran out while
/// its owner stalled) and the one that took the key over. Real tokens, in the real order.
async fn stale_and_fresh() -> Option<(FencingToken, FencingToken)> {
    let store = support::store().await?;
    let op = Operation::new("account.upgrade").unwrap();
    let key = StorageKey::new(
        &op,
        None,
        &Key::new(format!("upgrade-{:x}", fastrand::u64(..))).unwrap(),
    );
    let stale = idemkit_test::reserve(&store, &key, Duration::from_millis(200)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fresh = idemkit_test::reserve(&store, &key, Duration::from_secs(30)).await;
    assert!(store.get(&key).await.unwrap().is_some());
    assert!(fresh.fencing > stale.fencing);
    Some((stale.fencing, fresh.fencing))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_after_the_fresh_one_is_refused() {
    let (Some((pool, fences, account)), Some((stale, fresh))) =
        (setup().await, stale_and_fresh().await)
    else {
        return;
    };
    // The fresh attempt writes; the stale one wakes up afterwards and tries.
    assert!(
        write(
            pool.clone(),
            Some(fences.clone()),
            account.clone(),
            "pro",
            fresh,
            None,
            None
        )
        .await
    );
    assert!(
        !write(
            pool.clone(),
            Some(fences.clone()),
            account.clone(),
            "free",
            stale,
            None,
            None
        )
        .await
    );
    assert_eq!(
        plan(&pool, &account).await,
        ("pro".into(), fresh.get() as i64)
    );
    // The same token may write again (its own retry); a larger one always may.
    let mut tx = pool.begin().await.unwrap();
    assert!(fences.advance(&mut tx, &account, fresh).await.unwrap());
    tx.rollback().await.unwrap();

    // Without the fence, the same order lets the stale write land over the fresh one.
    let (pool, _, account) = setup().await.unwrap();
    assert!(
        write(
            pool.clone(),
            None,
            account.clone(),
            "pro",
            fresh,
            None,
            None
        )
        .await
    );
    assert!(
        write(
            pool.clone(),
            None,
            account.clone(),
            "free",
            stale,
            None,
            None
        )
        .await
    );
    assert_eq!(
        plan(&pool, &account).await,
        ("free".into(), stale.get() as i64),
        "unfenced: the stale write won"
    );
}

/// Two fenced writers of one account, raced: `first` takes the fence and holds its
/// transaction open; `second` starts meanwhile and must wait on the resource's row; then
/// `first` commits. Returns whether each wrote.
async fn race(
    pool: &PgPool,
    fences: &Fences,
    account: &str,
    first: (&'static str, FencingToken),
    second: (&'static str, FencingToken),
) -> (bool, bool) {
    let (advanced_tx, advanced) = oneshot::channel();
    let (release, hold) = oneshot::channel();
    let first_task = tokio::spawn(write(
        pool.clone(),
        Some(fences.clone()),
        account.to_string(),
        first.0,
        first.1,
        Some(advanced_tx),
        Some(hold),
    ));
    advanced.await.unwrap();
    let second_task = tokio::spawn(write(
        pool.clone(),
        Some(fences.clone()),
        account.to_string(),
        second.0,
        second.1,
        None,
        None,
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !second_task.is_finished(),
        "the second writer waits for the first transaction"
    );
    release.send(()).unwrap();
    (first_task.await.unwrap(), second_task.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_end_with_the_fresh_write_whoever_goes_first() {
    let (Some((pool, fences, account)), Some((stale, fresh))) =
        (setup().await, stale_and_fresh().await)
    else {
        return;
    };
    // The stale writer first: it commits, then the fresh one writes over it.
    let wrote = race(&pool, &fences, &account, ("free", stale), ("pro", fresh)).await;
    assert_eq!(wrote, (true, true), "both write, the fresh one last");
    assert_eq!(
        plan(&pool, &account).await,
        ("pro".into(), fresh.get() as i64)
    );

    // The fresh writer first: the stale one, waiting meanwhile, is refused once it commits.
    let (pool, fences, account) = setup().await.unwrap();
    let wrote = race(&pool, &fences, &account, ("pro", fresh), ("free", stale)).await;
    assert_eq!(wrote, (true, false), "the stale writer is refused");
    assert_eq!(
        plan(&pool, &account).await,
        ("pro".into(), fresh.get() as i64)
    );
}

#[tokio::test]
async fn a_fence_that_rolls_back_leaves_no_mark() {
    let Some((pool, fences, account)) = setup().await else {
        return;
    };
    let mut tx = pool.begin().await.unwrap();
    assert!(
        fences
            .advance(&mut tx, &account, FencingToken::new(1_000))
            .await
            .unwrap()
    );
    tx.rollback().await.unwrap();
    // The rolled-back mark is gone: a smaller token may write.
    let mut tx = pool.begin().await.unwrap();
    assert!(
        fences
            .advance(&mut tx, &account, FencingToken::new(10))
            .await
            .unwrap()
    );
    tx.commit().await.unwrap();
    // Bad input is refused before anything is sent.
    let mut conn = pool.acquire().await.unwrap();
    let e = fences
        .advance(&mut conn, "", FencingToken::new(1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), idemkit_core::StoreErrorKind::Rejected);
    let long = "r".repeat(1025);
    assert!(
        fences
            .advance(&mut conn, &long, FencingToken::new(1))
            .await
            .is_err()
    );
}
