//! A RabbitMQ invoice worker: the runner, a Redis store, one "mail" per order however often
//! the order is delivered.
//!
//! ```text
//! # RabbitMQ on 127.0.0.1:5672 (guest/guest) and Redis on 6379:
//! cargo run -p idemkit-rabbitmq --example rabbitmq_worker -- --demo
//! ```
//!
//! With `--demo` it declares the queue, publishes three orders (order-9 twice, as a
//! retrying publisher would), consumes them and prints each settlement: order-9's duplicate
//! is a replay, one mail per order. Without it, it consumes until Ctrl-C (or `--exit-after
//! N` settled messages); a message's body is its order id.
//!
//! The tests drive it as a child process, stopped at a fault point (`IDEMKIT_STOP_AT`, see
//! `idemkit_test::faults`): `before-ack` after the mail and its completion, before the ack;
//! `after-action` after the mail, before the completion. `--unprotected` runs without
//! idempotency, for comparison; `--slow-ms` makes the handler take that long after the mail.
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemkit::rabbitmq::lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use idemkit::rabbitmq::lapin::types::FieldTable;
use idemkit::rabbitmq::lapin::{BasicProperties, Connection, ConnectionProperties};
use idemkit::rabbitmq::{Message, RabbitRunner};
use idemkit::redis::RedisStore;
use idemkit::runner::{Processor, Settlement};
use idemkit::{Coordinator, Key, Operation, Policy};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let flag = |name: &str| args.iter().any(|a| a == name);
    let uri = opt("--uri").unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let queue = opt("--queue").unwrap_or_else(|| "idemkit-example-orders".into());
    let redis_url = opt("--redis").unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let prefix = opt("--prefix").unwrap_or_else(|| "idemkit-example".into());
    let mails = opt("--mails").unwrap_or_else(|| format!("{prefix}:mails"));
    let ms = |name: &str, default: u64| -> Result<Duration, std::num::ParseIntError> {
        Ok(Duration::from_millis(
            opt(name).map(|n| n.parse()).transpose()?.unwrap_or(default),
        ))
    };
    let (lease, slow) = (ms("--lease-ms", 15_000)?, ms("--slow-ms", 0)?);
    let exit_after: Option<u32> = opt("--exit-after").map(|n| n.parse()).transpose()?;
    let demo = flag("--demo");

    if demo {
        let connection = Connection::connect(&uri, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        for order in ["order-7", "order-9", "order-9"] {
            channel
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    order.as_bytes(),
                    BasicProperties::default(),
                )
                .await?
                .await?;
        }
    }

    let store = RedisStore::builder()
        .prefix(prefix)
        .connect(&redis_url)
        .await?;
    let redis = redis::Client::open(redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let processor = Processor::builder(
        Coordinator::builder(store)
            .policy(Policy::new().lease(lease))
            .build(),
        Operation::new("mail.invoice")?,
    )
    // The effect: this order's invoice, not the delivery.
    .key(|m: &Message| Key::compose([m.text().unwrap_or(""), "invoice"]))
    .handler(move |m: Message, _attempt| {
        let (mut redis, mails) = (redis.clone(), mails.clone());
        async move {
            let order = m.text().unwrap_or("").to_string();
            // The external effect: "send" the mail (recorded, so it can be counted).
            redis::cmd("RPUSH")
                .arg(&mails)
                .arg(&order)
                .query_async::<()>(&mut redis)
                .await?;
            tokio::time::sleep(slow).await;
            Ok::<_, redis::RedisError>(format!("em_{order}_{}", std::process::id()))
        }
    })
    .protected(!flag("--unprotected"));

    let settled = Arc::new(AtomicU32::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (s, d) = (settled.clone(), done.clone());
    let runner = RabbitRunner::new(uri, queue, processor).on_settled(move |settled| {
        let how = match (&settled.processed.settlement, &settled.processed.receipt) {
            (Settlement::Ack, Some(r)) => format!("ack {:?} {}", r.source, r.value),
            (other, _) => format!("{other:?}"),
        };
        println!(
            "{} (delivery {}): {how}",
            settled.message.text().unwrap_or(""),
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
    println!("settled {} messages", settled.load(Ordering::SeqCst));
    Ok(())
}
