//! The seed's consumer on RabbitMQ, in one piece: an "order paid" message writes the order's
//! invoice row to PostgreSQL (or MySQL/MariaDB) and emails the invoice, once, however often
//! RabbitMQ delivers the message and wherever the worker dies. The same building block as the
//! Kafka and JetStream consumers: a [`Processor`] running an [`Inbox::handler`] (PostgreSQL's
//! or MySQL's: the same handler).
//!
//! ```text
//! # RabbitMQ on 127.0.0.1:5672 (guest/guest), PostgreSQL on 5432:
//! cargo run -p idemkit-rabbitmq --example rabbitmq_paid_orders -- --demo
//! cargo run -p idemkit-rabbitmq --example rabbitmq_paid_orders -- --demo --keys redis://127.0.0.1:6379
//! # RabbitMQ and MariaDB (the invoices, the inbox and the keys):
//! cargo run -p idemkit-rabbitmq --example rabbitmq_paid_orders -- --demo --database mysql://root@127.0.0.1:3306/test
//! ```
//!
//! One [`Processor`] on the effect's key (`order-9.invoice`) runs an [`Inbox::handler`]: one
//! transaction claims the inbox for the order and inserts the invoice row, it commits, then
//! the "mail API" is called with the attempt's downstream key. The mail API stands for a real
//! one that takes an idempotency key: a table with that key as its primary key, counting
//! the calls it got. The keys live in the database (`--database`, PostgreSQL by default or
//! `mysql://...`), or on Redis with `--keys redis://...`.
//! A message's body is its order id.
//!
//! With `--demo` it publishes order-7 once and order-9 twice (a retrying publisher: two
//! messages, one effect), consumes them, and prints the invoices and emails: one each per
//! order (anything else is an error). Without it, it consumes until Ctrl-C or
//! `--exit-after N` settled messages. The crash tests (`tests/paid_orders.rs`) stop it at
//! each fault point.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemkit::mysql::MySqlStore;
use idemkit::mysql::sqlx::MySqlPool;
use idemkit::postgres::sqlx::{self, PgPool};
use idemkit::postgres::{Inbox, PgStore};
use idemkit::rabbitmq::lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use idemkit::rabbitmq::lapin::types::FieldTable;
use idemkit::rabbitmq::lapin::{BasicProperties, Connection, ConnectionProperties};
use idemkit::rabbitmq::{Message, RabbitRunner};
use idemkit::runner::{Handle, Processor, Settlement};
use idemkit::{Attempt, Coordinator, Key, KeyError, Operation, Policy, Store};

/// The effect a message asks for: this order's invoice. The key and the inbox claim both.
fn invoice_of(m: &Message) -> Result<Key, KeyError> {
    Key::compose([m.text().unwrap_or(""), "invoice"])
}

fn order_of(m: &Message) -> String {
    m.text().unwrap_or("").to_string()
}

struct Args {
    uri: String,
    queue: String,
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
        uri: opt("--uri").unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into()),
        queue: opt("--queue").unwrap_or_else(|| "orders.paid".into()),
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
    } else if is_mysql(&args.keys) {
        let store = MySqlStore::connect(&args.keys).await?;
        store.migrate().await?;
        run(store, policy, &args).await
    } else {
        let store = PgStore::connect(&args.keys).await?;
        store.migrate().await?;
        run(store, policy, &args).await
    }
}

fn is_mysql(url: &str) -> bool {
    url.starts_with("mysql://") || url.starts_with("mariadb://")
}

/// The database of the invoices, the inbox and the mail API's table.
enum Db {
    Postgres(PgPool),
    MySql(MySqlPool),
}

async fn run<S: Store + Clone>(
    store: S,
    policy: Policy,
    args: &Args,
) -> Result<(), Box<dyn std::error::Error>> {
    if is_mysql(&args.database) {
        let pool = MySqlPool::connect(&args.database).await?;
        setup_mysql(&pool).await?;
        let handler = idemkit::mysql::Inbox::new().handler(
            pool.clone(),
            "billing",
            invoice_of,
            // The database effect, in the inbox's transaction: the invoice row.
            |m: &Message, conn| {
                let order = order_of(m);
                Box::pin(async move {
                    sqlx::query("INSERT INTO paid_invoices (order_id) VALUES (?)")
                        .bind(order)
                        .execute(conn)
                        .await?;
                    Ok::<_, sqlx::Error>(())
                })
            },
            // The external effect: the email, through a mail API that takes our downstream
            // key.
            {
                let db = Arc::new(Db::MySql(pool.clone()));
                move |m: Message, attempt: Attempt| {
                    let db = db.clone();
                    async move {
                        db.mail_api(&downstream_of(&m, &attempt), &order_of(&m))
                            .await
                    }
                }
            },
        )?;
        return consume(store, policy, args, handler, &Db::MySql(pool)).await;
    }
    let pool = PgPool::connect(&args.database).await?;
    setup(&pool).await?;
    let handler = Inbox::new().handler(
        pool.clone(),
        "billing",
        invoice_of,
        // The database effect, in the inbox's transaction: the invoice row.
        |m: &Message, conn| {
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
            let db = Arc::new(Db::Postgres(pool.clone()));
            move |m: Message, attempt: Attempt| {
                let db = db.clone();
                async move {
                    db.mail_api(&downstream_of(&m, &attempt), &order_of(&m))
                        .await
                }
            }
        },
    )?;
    consume(store, policy, args, handler, &Db::Postgres(pool)).await
}

/// The key the mail API gets: the attempt's downstream key (the same on every attempt).
fn downstream_of(m: &Message, attempt: &Attempt) -> String {
    attempt
        .downstream_key()
        .map(|k| k.to_string())
        .unwrap_or_else(|| format!("unprotected-{}", m.delivery_tag))
}

/// Consumes the queue with `handler` under the order's key; with `--demo`, publishes the
/// demo's orders first and checks their counts after.
async fn consume<S, H>(
    store: S,
    policy: Policy,
    args: &Args,
    handler: H,
    db: &Db,
) -> Result<(), Box<dyn std::error::Error>>
where
    S: Store + Clone,
    H: Handle<Message, Output = String> + 'static,
{
    // The demo's orders are this run's own (`order-9-<run>`), so a rerun on the same
    // database counts its own rows.
    let run_id = format!("{:x}", std::process::id());
    let (seven, nine) = (format!("order-7-{run_id}"), format!("order-9-{run_id}"));
    if args.demo {
        publish(args, &[&seven, &nine, &nine]).await?;
    }
    let processor = Processor::new(
        Coordinator::builder(store).policy(policy).build(),
        Operation::new("invoice.send")?,
        invoice_of,
        handler,
    );
    let settled = Arc::new(AtomicU32::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (s, d, exit_after, demo) = (settled.clone(), done.clone(), args.exit_after, args.demo);
    let runner = RabbitRunner::new(&args.uri, &args.queue, processor).on_settled(move |settled| {
        let how = match (&settled.processed.settlement, &settled.processed.receipt) {
            (Settlement::Ack, Some(r)) => format!("ack {:?} {}", r.source, r.value),
            (other, _) => format!("{other:?}"),
        };
        println!(
            "{} (delivery {}): {how}",
            order_of(settled.message),
            settled.delivered
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
            let (invoices, emails, calls) = db.counts(order).await?;
            println!("{order}: {invoices} invoice, {emails} email ({calls} mail API call)");
            if (invoices, emails) != (1, 1) {
                return Err(format!("{order}: {invoices} invoices, {emails} emails").into());
            }
        }
    }
    Ok(())
}

/// The tables: the inbox's, the invoices (no unique constraint: a second insert would
/// show), and the mail API's (its idempotency key is its primary key). Under a lock:
/// workers starting together on a database without the tables would collide in `CREATE
/// TABLE IF NOT EXISTS`.
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

/// MySQL's tables, as [`setup`]'s (`CREATE TABLE IF NOT EXISTS` takes a metadata lock there:
/// workers starting together do not collide).
async fn setup_mysql(pool: &MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
    idemkit::mysql::Inbox::new().migrate(pool).await?;
    for ddl in [
        "CREATE TABLE IF NOT EXISTS paid_invoices (order_id VARCHAR(200) NOT NULL, \
         at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB",
        "CREATE TABLE IF NOT EXISTS paid_mail_api (idempotency_key VARCHAR(200) PRIMARY KEY, \
         order_id VARCHAR(200) NOT NULL, calls INT NOT NULL DEFAULT 1) ENGINE = InnoDB",
    ] {
        sqlx::query(ddl).execute(pool).await?;
    }
    Ok(())
}

impl Db {
    /// The mail API: one email per idempotency key; a repeated call is answered with the
    /// same email, counted as a call.
    async fn mail_api(&self, key: &str, order: &str) -> Result<String, sqlx::Error> {
        match self {
            Db::Postgres(pool) => {
                sqlx::query(
                    "INSERT INTO paid_mail_api (idempotency_key, order_id) VALUES ($1, $2)
                     ON CONFLICT (idempotency_key) DO UPDATE SET calls = paid_mail_api.calls + 1",
                )
                .bind(key)
                .bind(order)
                .execute(pool)
                .await?;
            }
            Db::MySql(pool) => {
                sqlx::query(
                    "INSERT INTO paid_mail_api (idempotency_key, order_id) VALUES (?, ?)
                     ON DUPLICATE KEY UPDATE calls = calls + 1",
                )
                .bind(key)
                .bind(order)
                .execute(pool)
                .await?;
            }
        }
        Ok(format!("em_{order}"))
    }

    /// Invoices, emails and mail API calls for one order.
    async fn counts(&self, order: &str) -> Result<(i64, i64, i64), sqlx::Error> {
        const INVOICES: &str = "SELECT count(*) FROM paid_invoices WHERE order_id = ";
        const EMAILS: &str = "SELECT count(*), CAST(coalesce(sum(calls), 0) AS SIGNED) FROM paid_mail_api WHERE order_id = ";
        match self {
            Db::Postgres(pool) => {
                let invoices: i64 = sqlx::query_scalar(&format!("{INVOICES}$1"))
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
            Db::MySql(pool) => {
                let invoices: i64 = sqlx::query_scalar(&format!("{INVOICES}?"))
                    .bind(order)
                    .fetch_one(pool)
                    .await?;
                let (emails, calls): (i64, i64) = sqlx::query_as(&format!("{EMAILS}?"))
                    .bind(order)
                    .fetch_one(pool)
                    .await?;
                Ok((invoices, emails, calls))
            }
        }
    }
}

/// Declares the queue (durable: paid orders outlive a broker restart) and publishes the
/// orders with publisher confirms.
async fn publish(args: &Args, orders: &[&str]) -> Result<(), Box<dyn std::error::Error>> {
    let connection = Connection::connect(&args.uri, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel.confirm_select(Default::default()).await?;
    channel
        .queue_declare(
            args.queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    for order in orders {
        channel
            .basic_publish(
                "".into(),
                args.queue.as_str().into(),
                BasicPublishOptions::default(),
                order.as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?
            .await?;
    }
    Ok(())
}
