//! The RabbitMQ consumer case: messages per second through the RabbitMQ runner
//! (idemkit-rabbitmq) with idemkit on Redis, beside the same runner with idempotency off,
//! with an empty handler and with a 1 ms one, in one run.
//!
//! Each case consumes `messages` orders (distinct keys; the 1 ms cases a fifth of them)
//! published to a queue of its own beforehand, with the runner's defaults (16 handlers,
//! prefetch 32) and a store prefix of its own. Throughput is timed from the first settled
//! message to the last. Cases run `rounds` times, interleaved; each row is the median round.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_rabbitmq::lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use idemkit_rabbitmq::lapin::types::FieldTable;
use idemkit_rabbitmq::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use idemkit_rabbitmq::{Message, RabbitRunner};
use idemkit_redis::RedisStore;
use idemkit_runner::Processor;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Mode {
    protected: bool,
    handler: Duration,
}

impl Mode {
    fn name(self) -> String {
        let handler = if self.handler.is_zero() {
            String::new()
        } else {
            format!(", {} ms handler", self.handler.as_millis())
        };
        if self.protected {
            format!("RabbitMQ runner + idemkit (Redis){handler}")
        } else {
            format!("RabbitMQ runner, idempotency off{handler}")
        }
    }
}

const MODES: [Mode; 4] = [
    Mode {
        protected: false,
        handler: Duration::ZERO,
    },
    Mode {
        protected: true,
        handler: Duration::ZERO,
    },
    Mode {
        protected: false,
        handler: Duration::from_millis(1),
    },
    Mode {
        protected: true,
        handler: Duration::from_millis(1),
    },
];

/// Runs the RabbitMQ cases; the report's text.
pub(crate) async fn run(
    uri: &str,
    redis_url: &str,
    messages: usize,
    rounds: usize,
    max_rounds: usize,
) -> Result<(String, Vec<crate::kafka::ConsumerRow>), String> {
    let connection = Connection::connect(uri, ConnectionProperties::default())
        .await
        .map_err(|e| e.to_string())?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    channel
        .confirm_select(Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let channel = &channel;
    let results = crate::paired::interleaved(
        &MODES,
        rounds,
        max_rounds,
        |round, mode: Mode| async move {
            eprintln!("rabbitmq: round {}: {}", round + 1, mode.name());
            let n = crate::kafka::messages_for(mode.handler, messages);
            let queue = fill(channel, n).await?;
            let per_sec = consume(uri, &queue, redis_url, n, mode).await?;
            let _ = channel
                .queue_delete(queue.as_str().into(), Default::default())
                .await;
            Ok(per_sec)
        },
        |results: &[Vec<f64>]| {
            let modes = MODES.iter().map(|m| (m.protected, m.handler));
            crate::kafka::runner_undecided(modes, results)
        },
    )
    .await?;
    let rounds = results[0].len();
    let cases: Vec<(String, bool, Duration, Vec<f64>)> = MODES
        .iter()
        .zip(results)
        .map(|(mode, rounds)| (mode.name(), mode.protected, mode.handler, rounds))
        .collect();
    Ok(crate::kafka::runner_table(
        format!(
            "RabbitMQ consumer: {messages} messages, concurrency 16, prefetch 32 (the default: twice the concurrency), classic queue, broker {uri}, store {redis_url}; median of {rounds} interleaved rounds"
        ),
        &cases,
    ))
}

/// A new queue holding `n` orders, published with confirms.
async fn fill(channel: &Channel, n: usize) -> Result<String, String> {
    let queue = format!("idemkit-bench-{:x}", fastrand::u64(..));
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let run = fastrand::u64(..);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut confirms = Vec::with_capacity(chunk.len());
        for i in chunk {
            confirms.push(
                channel
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        format!("order-{run:x}-{i}").as_bytes(),
                        BasicProperties::default(),
                    )
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        for c in confirms {
            c.await.map_err(|e| e.to_string())?;
        }
    }
    Ok(queue)
}

/// Consumes `n` messages from `queue`; messages per second between the first and the last
/// settlement.
async fn consume(
    uri: &str,
    queue: &str,
    redis_url: &str,
    n: usize,
    mode: Mode,
) -> Result<f64, String> {
    let store = RedisStore::builder()
        .prefix(format!("idemkit-bench-rabbitmq-{:x}", fastrand::u64(..)))
        .connect(redis_url)
        .await
        .map_err(|e| e.to_string())?;
    let processor = Processor::new(
        Coordinator::new(store),
        Operation::new("bench.consume").expect("valid"),
        |m: &Message| Key::new(m.text().unwrap_or("")),
        move |_m: Message, _| async move {
            if !mode.handler.is_zero() {
                tokio::time::sleep(mode.handler).await;
            }
            Ok::<_, std::convert::Infallible>(1u32)
        },
    )
    .protected(mode.protected);
    let settled = Arc::new(AtomicUsize::new(0));
    let times = Arc::new(std::sync::Mutex::new((None::<Instant>, None::<Instant>)));
    let done = Arc::new(tokio::sync::Notify::new());
    let (s, t, d) = (settled.clone(), times.clone(), done.clone());
    let runner = RabbitRunner::new(uri, queue, processor).on_settled(move |_| {
        let now = Instant::now();
        let mut times = t.lock().expect("lock");
        times.0.get_or_insert(now);
        times.1 = Some(now);
        if s.fetch_add(1, Ordering::Relaxed) + 1 == n {
            d.notify_one();
        }
    });
    let timeout = Duration::from_secs(300);
    tokio::time::timeout(timeout, runner.run(async move { done.notified().await }))
        .await
        .map_err(|_| format!("the consumer did not finish within {timeout:?}"))?
        .map_err(|e| e.to_string())?;
    let (first, last) = *times.lock().expect("lock");
    let (Some(first), Some(last)) = (first, last) else {
        return Err("nothing consumed".into());
    };
    Ok(n.saturating_sub(1) as f64 / last.duration_since(first).as_secs_f64())
}
