//! The seed's consumer on RabbitMQ (`examples/rabbitmq_paid_orders.rs`) killed at each point of its
//! order of effects, with its keys on Redis and on PostgreSQL, and on MariaDB with its
//! invoices and inbox there too (MySQL's `Inbox::handler`): after the invoice's commit,
//! after the email, and before the ack. Each time a second worker gets the message again,
//! and the order ends with one invoice row and one email.

mod support;

use std::time::Duration;

use idemkit_test::faults::{FaultPoint, stop_at_tokio, stopped};
use support::{channel, publish, queue, ready, redis_url, server, unique};

fn postgres_url() -> String {
    std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn mysql_url() -> String {
    std::env::var("IDEMKIT_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// One message for a fresh order; a worker stopped at `point`, then a second one that
/// settles the redelivery. The order's invoices, emails and mail API calls.
async fn killed_at(uri: &str, keys: &str, database: &str, point: FaultPoint) -> (i64, i64, i64) {
    let (q, order) = (unique("paid"), unique("order"));
    let ch = channel(uri).await;
    queue(&ch, &q, false, None).await;
    publish(&ch, &q, &order).await;
    let worker = || {
        let mut c =
            tokio::process::Command::new(idemkit_test::example_binary("rabbitmq_paid_orders"));
        c.args(["--uri", uri, "--queue", &q])
            .args(["--keys", keys, "--database", database])
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
        .expect("the first worker got the message")
        .unwrap();
    assert!(stopped(&first), "{point}: stopped where told: {first}");
    let second = tokio::time::timeout(Duration::from_secs(90), worker().status())
        .await
        .expect("the second worker got the message again")
        .unwrap();
    assert!(second.success(), "{point}: {second}");
    assert_eq!(ready(&ch, &q).await, 0, "{point}: acked in the end");
    if database.starts_with("mysql") {
        mysql_counts(database, &order).await
    } else {
        counts(&order).await
    }
}

async fn mysql_counts(database: &str, order: &str) -> (i64, i64, i64) {
    use idemkit_mysql::sqlx;
    let pool = sqlx::MySqlPool::connect(database).await.unwrap();
    let invoices: i64 = sqlx::query_scalar("SELECT count(*) FROM paid_invoices WHERE order_id = ?")
        .bind(order)
        .fetch_one(&pool)
        .await
        .unwrap();
    let (emails, calls): (i64, i64) = sqlx::query_as(
        "SELECT count(*), CAST(coalesce(sum(calls), 0) AS SIGNED) FROM paid_mail_api WHERE order_id = ?",
    )
    .bind(order)
    .fetch_one(&pool)
    .await
    .unwrap();
    (invoices, emails, calls)
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

async fn every_point(keys: &str, database: &str) {
    let Some(uri) = server() else { return };
    let (after_commit, after_email, before_ack) = tokio::join!(
        killed_at(&uri, keys, database, FaultPoint::AfterInboxCommit),
        killed_at(&uri, keys, database, FaultPoint::AfterAction),
        killed_at(&uri, keys, database, FaultPoint::BeforeAck),
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
    // Killed before the ack: the redelivery is a replay; nothing runs.
    assert_eq!(before_ack, (1, 1, 1), "before the ack ({keys})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_invoice_and_one_email_wherever_the_worker_dies_keys_on_redis() {
    every_point(&redis_url(), &postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_invoice_and_one_email_wherever_the_worker_dies_keys_on_postgres() {
    every_point(&postgres_url(), &postgres_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_invoice_and_one_email_wherever_the_worker_dies_on_mariadb() {
    // The invoices, the inbox and the keys on MariaDB: MySQL's `Inbox::handler`.
    let up = std::net::TcpStream::connect("127.0.0.1:3306").is_ok()
        || std::env::var("IDEMKIT_MYSQL_URL").is_ok();
    if !idemkit_test::require_service("MariaDB (IDEMKIT_MYSQL_URL or 127.0.0.1:3306)", up) {
        return;
    }
    every_point(&mysql_url(), &mysql_url()).await;
}
