//! One hop of a chain of idemkit consumers (issue 52), as its own process, so that a test
//! can kill it anywhere (`tests/chain.rs` stops it at each fault point):
//!
//! ```text
//! Kafka "order paid" ──▶ hop a ──▶ RabbitMQ "invoice requested" ──▶ hop b
//!                          │                                        │
//!                          ├─ a row, through the inbox (PostgreSQL)  ├─ a row, through the inbox
//!                          └─ POST /charges ──┐                      └─ POST /emails ──┐
//!                                             ▼                                        ▼
//!                              the services, behind idemkit's HTTP layer (`--services`)
//! ```
//!
//! - **a** consumes Kafka with the [`KafkaRunner`], keyed by the record's dedupe id
//!   ([`dedupe_key`]: its producer's `idemkit-dedupe-id` header). Its inbox transaction writes
//!   the order's row; then, as its external effects, it publishes "invoice requested" to
//!   RabbitMQ with [`publish_once`] and charges the card (`POST {services}/charges`, with an
//!   `Idempotency-Key`).
//! - **b** consumes that queue with the [`RabbitRunner`], keyed by the message's `message_id`
//!   (the default: no key function). Its inbox transaction writes its row; then it sends the
//!   email (`POST {services}/emails`, with an `Idempotency-Key`).
//!
//! With `--ids effect` (the default) every id a hop sends is derived from its effect's
//! downstream key: the publish's `message_id` is the key itself, the charge's key its child
//! `charge`, the email's its child `email`; so a hop that dies after its external effects and
//! runs them again repeats the same ids. With `--ids delivery` each attempt sends fresh ids,
//! as a client that names the delivery would: the chain's test shows what that repeats.
//!
//! ```text
//! cargo run -p idemkit-kafka --example chain_hop -- --role a --brokers 127.0.0.1:9092 \
//!   --topic orders.paid --group chain-a --amqp amqp://guest:guest@127.0.0.1:5672/%2f \
//!   --queue invoices --keys redis://127.0.0.1:6379 --services http://127.0.0.1:8080
//! ```
//!
//! It stops after `--exit-after N` settled messages (or Ctrl-C), with exit status 3 if any
//! message was dead-lettered (an effect left undone is a failure of the chain too).
//! `--setup-only` creates the tables and exits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use idemkit::kafka::rdkafka::ClientConfig;
use idemkit::kafka::rdkafka::message::OwnedMessage;
use idemkit::kafka::{KafkaRunner, dedupe_key};
use idemkit::postgres::Inbox;
use idemkit::postgres::sqlx::{self, PgConnection, PgPool};
use idemkit::rabbitmq::lapin::{BasicProperties, Connection, ConnectionProperties};
use idemkit::rabbitmq::{Message, RabbitRunner, publish_once};
use idemkit::redis::RedisStore;
use idemkit::runner::{Processor, RetryPolicy, Settlement};
use idemkit::{Attempt, Coordinator, Operation, Policy};

struct Args {
    role: String,
    brokers: String,
    topic: String,
    group: String,
    amqp: String,
    queue: String,
    keys: String,
    database: String,
    services: String,
    effect_ids: bool,
    lease: Duration,
    exit_after: u32,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        argv.iter()
            .position(|a| a == name)
            .and_then(|i| argv.get(i + 1).cloned())
    };
    let args = Args {
        role: opt("--role").ok_or("--role a|b")?,
        brokers: opt("--brokers").unwrap_or_else(|| "127.0.0.1:9092".into()),
        topic: opt("--topic").unwrap_or_else(|| "orders.paid".into()),
        group: opt("--group").unwrap_or_else(|| "chain-a".into()),
        amqp: opt("--amqp").unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into()),
        queue: opt("--queue").unwrap_or_else(|| "invoices".into()),
        keys: opt("--keys").unwrap_or_else(|| "redis://127.0.0.1:6379".into()),
        database: opt("--database")
            .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into()),
        services: opt("--services").unwrap_or_else(|| "http://127.0.0.1:8080".into()),
        effect_ids: opt("--ids").is_none_or(|ids| ids != "delivery"),
        lease: Duration::from_millis(opt("--lease-ms").map_or(Ok(30_000), |s| s.parse())?),
        exit_after: opt("--exit-after").map_or(Ok(u32::MAX), |s| s.parse())?,
    };
    // Connections cut while it starts (the chain's test cuts them again and again) are
    // retried, as a supervisor would restart a worker that could not start.
    let mut tries = 0;
    let (pool, store) = loop {
        match start(&args).await {
            Ok(started) => break started,
            Err(e) if tries < 100 => {
                tries += 1;
                eprintln!("starting: {e}; again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    };
    if argv.iter().any(|a| a == "--setup-only") {
        return Ok(());
    }
    let coordinator = Coordinator::builder(store)
        .policy(Policy::new().lease(args.lease))
        .build();
    // A store outage is retried without using up a message's budget; a database error in
    // the inbox's transaction is a failing handler: a budget that outlasts a burst of them.
    let retry = RetryPolicy::new()
        .max_deliveries(1_000)
        .backoff(Duration::from_millis(20), Duration::from_millis(200));
    let settled = Arc::new(Settled::default());
    match args.role.as_str() {
        "a" => hop_a(&args, pool, coordinator, retry, settled.clone()).await?,
        "b" => hop_b(&args, pool, coordinator, retry, settled.clone()).await?,
        other => return Err(format!("--role {other:?}: a or b").into()),
    }
    if settled.dead.load(Ordering::SeqCst) {
        std::process::exit(3);
    }
    Ok(())
}

/// The database (its tables created) and the store.
async fn start(args: &Args) -> Result<(PgPool, RedisStore), Error> {
    let pool = PgPool::connect(&args.database).await?;
    setup(&pool).await?;
    Ok((pool, RedisStore::connect(&args.keys).await?))
}

/// Settled messages, and whether one was dead-lettered; `done` once `--exit-after` is reached.
#[derive(Default)]
struct Settled {
    count: AtomicU32,
    dead: AtomicBool,
    done: tokio::sync::Notify,
}

impl Settled {
    fn one(&self, what: &Settlement, exit_after: u32) {
        if matches!(what, Settlement::DeadLetter { .. }) {
            eprintln!("dead-lettered: {what:?}");
            self.dead.store(true, Ordering::SeqCst);
        }
        if self.count.fetch_add(1, Ordering::SeqCst) + 1 >= exit_after {
            self.done.notify_one();
        }
    }

    async fn stop(&self) {
        tokio::select! {
            _ = self.done.notified() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
}

/// The order a message is about: its payload.
fn order_of(payload: &[u8]) -> String {
    String::from_utf8_lossy(payload).into_owned()
}

/// The id an effect sends: a child of the effect's downstream key, or with `--ids delivery`
/// a fresh one per attempt.
fn effect_id(args_effect_ids: bool, attempt: &Attempt, part: &str) -> String {
    match attempt.downstream_key() {
        Some(key) if args_effect_ids && part.is_empty() => key.into_string(),
        Some(key) if args_effect_ids => key.child(part).into_string(),
        _ => format!("attempt-{:016x}", fastrand::u64(..)),
    }
}

async fn hop_a(
    args: &Args,
    pool: PgPool,
    coordinator: Coordinator<RedisStore>,
    retry: RetryPolicy,
    settled: Arc<Settled>,
) -> Result<(), Error> {
    let amqp = Connection::connect(&args.amqp, ConnectionProperties::default()).await?;
    let channel = amqp.create_channel().await?;
    channel.confirm_select(Default::default()).await?;
    let http = reqwest::Client::new();
    let (queue, charges, effect_ids) = (
        args.queue.clone(),
        format!("{}/charges", args.services),
        args.effect_ids,
    );
    let handler = Inbox::new().handler(
        pool.clone(),
        "chain-a",
        dedupe_key,
        |m: &OwnedMessage, conn| {
            let order = order_of(idemkit::kafka::rdkafka::Message::payload(m).unwrap_or_default());
            Box::pin(insert_row("a", order, conn))
        },
        move |m: OwnedMessage, attempt: Attempt| {
            let (channel, queue, charges, http) = (
                channel.clone(),
                queue.clone(),
                charges.clone(),
                http.clone(),
            );
            async move {
                let order =
                    order_of(idemkit::kafka::rdkafka::Message::payload(&m).unwrap_or_default());
                let id = effect_id(effect_ids, &attempt, "");
                publish_once(
                    &channel,
                    "",
                    &queue,
                    &id,
                    order.as_bytes(),
                    BasicProperties::default(),
                )
                .await?;
                let key = effect_id(effect_ids, &attempt, "charge");
                post(&http, &charges, &key, order).await
            }
        },
    )?;
    let processor = Processor::new(
        coordinator,
        Operation::new("invoice.request")?,
        dedupe_key,
        handler,
    )
    .retry(retry);
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", &args.group)
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("auto.commit.interval.ms", "200");
    let (s, exit_after) = (settled.clone(), args.exit_after);
    KafkaRunner::new(config, [args.topic.clone()], processor)
        .on_settled(move |done| s.one(&done.processed.settlement, exit_after))
        .run(async move { settled.stop().await })
        .await?;
    Ok(())
}

async fn hop_b(
    args: &Args,
    pool: PgPool,
    coordinator: Coordinator<RedisStore>,
    retry: RetryPolicy,
    settled: Arc<Settled>,
) -> Result<(), Error> {
    let (effect_ids, emails) = (args.effect_ids, format!("{}/emails", args.services));
    let http = reqwest::Client::new();
    let handler = Inbox::new().handler(
        pool,
        "chain-b",
        // The message's dedupe id, its `message_id`: what the runner keys on by default.
        (),
        |m: &Message, conn| {
            let order = order_of(&m.data);
            Box::pin(insert_row("b", order, conn))
        },
        move |m: Message, attempt: Attempt| {
            let (http, emails) = (http.clone(), emails.clone());
            async move {
                let key = effect_id(effect_ids, &attempt, "email");
                post(&http, &emails, &key, order_of(&m.data)).await
            }
        },
    )?;
    let processor = Processor::builder(coordinator, Operation::new("invoice.send")?)
        .handler(handler)
        .retry(retry);
    let (s, exit_after) = (settled.clone(), args.exit_after);
    RabbitRunner::new(args.amqp.clone(), args.queue.clone(), processor)
        // One message at a time: a process stopped at a point has settled nothing before it.
        .concurrency(1)
        .on_settled(move |done| s.one(&done.processed.settlement, exit_after))
        .run(async move { settled.stop().await })
        .await?;
    Ok(())
}

/// The inbox's table and the hops' rows (no unique constraint: a second insert would show),
/// under a lock: workers starting together would collide in `CREATE TABLE IF NOT EXISTS`.
async fn setup(pool: &PgPool) -> Result<(), Error> {
    Inbox::new().migrate(pool).await?;
    sqlx::raw_sql(
        "BEGIN;
         SELECT pg_advisory_xact_lock(hashtext('idemkit.examples.chain_hop'));
         CREATE TABLE IF NOT EXISTS chain_rows (hop text NOT NULL, order_id text NOT NULL);
         COMMIT;",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A hop's database effect, in its inbox's transaction: its row for the order.
async fn insert_row(hop: &str, order: String, conn: &mut PgConnection) -> Result<(), Error> {
    sqlx::query("INSERT INTO chain_rows (hop, order_id) VALUES ($1, $2)")
        .bind(hop)
        .bind(order)
        .execute(conn)
        .await?;
    Ok(())
}

/// An external effect at a service that deduplicates on its `Idempotency-Key`: the order
/// posted under `key`; the service's answer.
async fn post(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    order: String,
) -> Result<String, Error> {
    let answer = http
        .post(url)
        .header("idempotency-key", key)
        .body(order)
        .send()
        .await?;
    if !answer.status().is_success() {
        return Err(format!("{url} answered {}", answer.status()).into());
    }
    Ok(answer.text().await?)
}
