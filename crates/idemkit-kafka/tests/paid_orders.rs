//! The seed's consumer (`examples/paid_orders.rs`) killed at each point of its order of
//! effects, with its keys on Redis and on PostgreSQL: after the invoice's commit, after the
//! email, and before the offset's commit. Each time a second worker gets the event again,
//! and the order ends with one invoice row and one email.

mod support;

use std::time::Duration;

use idemkit_test::faults::{FaultPoint, stop_at_tokio, stopped};
use support::{brokers, create_topic, produce, producer, redis_url, unique};

fn postgres_url() -> String {
    std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// One event for a fresh order; a worker stopped at `point`, then a second one that settles
/// the redelivery. The order's invoices, emails and mail API calls.
async fn killed_at(brokers: &str, keys: &str, point: FaultPoint) -> (i64, i64, i64) {
    let (topic, group, order) = (unique("paid"), unique("billing"), unique("order"));
    create_topic(brokers, &topic, 1).await;
    produce(&producer(brokers), &topic, 0, &order, "paid").await;
    let worker = || {
        let mut c = tokio::process::Command::new(idemkit_test::example_binary("paid_orders"));
        c.args(["--brokers", brokers, "--topic", &topic, "--group", &group])
            .args(["--keys", keys, "--database", &postgres_url()])
            // A short lease: the second worker waits out the dead one's reservation.
            .args(["--lease-ms", "1500", "--exit-after", "1"])
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        c
    };
    let mut first = worker();
    stop_at_tokio(&mut first, point);
    let first = tokio::time::timeout(Duration::from_secs(90), first.status())
        .await
        .expect("the first worker got the event")
        .unwrap();
    assert!(stopped(&first), "{point}: stopped where told: {first}");
    let second = tokio::time::timeout(Duration::from_secs(90), worker().status())
        .await
        .expect("the second worker got the event again")
        .unwrap();
    assert!(second.success(), "{point}: {second}");
    counts(&order).await
}

async fn counts(order: &str) -> (i64, i64, i64) {
    let pool = idemkit_postgres::sqlx::PgPool::connect(&postgres_url())
        .await
        .unwrap();
    let invoices: i64 = idemkit_postgres::sqlx::query_scalar(
        "SELECT count(*) FROM paid_invoices WHERE order_id = $1",
    )
    .bind(order)
    .fetch_one(&pool)
    .await
    .unwrap();
    let (emails, calls): (i64, i64) = idemkit_postgres::sqlx::query_as(
        "SELECT count(*), coalesce(sum(calls), 0)::bigint FROM paid_mail_api WHERE order_id = $1",
    )
    .bind(order)
    .fetch_one(&pool)
    .await
    .unwrap();
    (invoices, emails, calls)
}

async fn every_point(keys: &str) {
    let Some(brokers) = brokers() else { return };
    let (after_commit, after_email, before_ack) = tokio::join!(
        killed_at(&brokers, keys, FaultPoint::AfterInboxCommit),
        killed_at(&brokers, keys, FaultPoint::AfterAction),
        killed_at(&brokers, keys, FaultPoint::BeforeAck),
    );
    // Killed after the commit: the second run finds the claim, skips the invoice, sends.
    assert_eq!(
        after_commit,
        (1, 1, 1),
        "after the invoice's commit ({keys})"
    );
    // Killed after the email, before the completion: the second run sends again with the
    // same downstream key, and the mail API answers it without a second email.
    assert_eq!(after_email, (1, 1, 2), "after the email ({keys})");
    // Killed before the offset's commit: the redelivery is a replay; nothing runs.
    assert_eq!(before_ack, (1, 1, 1), "before the offset's commit ({keys})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_invoice_and_one_email_wherever_the_worker_dies_keys_on_redis() {
    every_point(&redis_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_invoice_and_one_email_wherever_the_worker_dies_keys_on_postgres() {
    every_point(&postgres_url()).await;
}
