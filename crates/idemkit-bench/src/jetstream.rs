//! The JetStream consumer case: messages per second through the JetStream runner
//! (idemkit-nats) with idemkit on Redis, beside the same runner with idempotency off, with
//! an empty handler and with a 1 ms one, in one run.
//!
//! One stream holds `messages` orders (distinct keys). Each case consumes them with a new
//! durable pull consumer (16 messages at once, the runner's default) and a store prefix of
//! its own. Throughput is timed from the first settled message to the last. Cases run
//! `rounds` times, interleaved; each row is the median round.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_nats::JetStreamRunner;
use idemkit_nats::async_nats;
use idemkit_nats::async_nats::jetstream::{self, Message, consumer::pull, stream};
use idemkit_redis::RedisStore;
use idemkit_runner::Processor;
use tokio::time::Instant;

use crate::kafka::ConsumerRow;

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
            format!("JetStream runner + idemkit (Redis){handler}")
        } else {
            format!("JetStream runner, idempotency off{handler}")
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

/// Runs the JetStream cases; the report's text and its rows.
pub(crate) async fn run(
    nats_url: &str,
    redis_url: &str,
    messages: usize,
    rounds: usize,
    max_rounds: usize,
) -> Result<(String, Vec<ConsumerRow>), String> {
    let client = async_nats::connect(nats_url)
        .await
        .map_err(|e| e.to_string())?;
    let js = jetstream::new(client);
    let name = format!("IDEMKIT_BENCH_{:X}", fastrand::u64(..));
    let subject = format!("idemkit.bench.{:x}", fastrand::u64(..));
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    eprintln!("jetstream: publishing {messages} messages to {subject}");
    for chunk in (0..messages).collect::<Vec<_>>().chunks(500) {
        let mut acks = Vec::with_capacity(chunk.len());
        for i in chunk {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("order", format!("order-{i}").as_str());
            acks.push(
                js.publish_with_headers(subject.clone(), headers, "paid".into())
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        for ack in acks {
            ack.await.map_err(|e| e.to_string())?;
        }
    }
    let (js, name) = (&js, &name);
    let results = crate::paired::interleaved(
        &MODES,
        rounds,
        max_rounds,
        |round, mode: Mode| async move {
            eprintln!("jetstream: round {}: {}", round + 1, mode.name());
            let n = crate::kafka::messages_for(mode.handler, messages);
            let stream = js.get_stream(name).await.map_err(|e| e.to_string())?;
            consume(&stream, redis_url, n, mode).await
        },
        |results: &[Vec<f64>]| {
            let modes = MODES.iter().map(|m| (m.protected, m.handler));
            crate::kafka::runner_undecided(modes, results)
        },
    )
    .await?;
    let _ = js.delete_stream(name).await;
    let rounds = results[0].len();
    let cases: Vec<(String, bool, Duration, Vec<f64>)> = MODES
        .iter()
        .zip(results)
        .map(|(mode, rounds)| (mode.name(), mode.protected, mode.handler, rounds))
        .collect();
    Ok(crate::kafka::runner_table(
        format!(
            "JetStream consumer: {messages} messages, concurrency 16, server {nats_url}, store {redis_url}; median of {rounds} interleaved rounds"
        ),
        &cases,
    ))
}

/// Consumes `n` messages with a new durable consumer; messages per second between the
/// first and the last settlement.
async fn consume(
    stream: &jetstream::stream::Stream,
    redis_url: &str,
    n: usize,
    mode: Mode,
) -> Result<f64, String> {
    let durable = format!("bench-{:x}", fastrand::u64(..));
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(durable.clone()),
            ack_wait: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
    let store = RedisStore::builder()
        .prefix(format!("idemkit-bench-jetstream-{:x}", fastrand::u64(..)))
        .connect(redis_url)
        .await
        .map_err(|e| e.to_string())?;
    let processor = Processor::new(
        Coordinator::new(store),
        Operation::new("bench.consume").expect("valid"),
        |m: &Message| {
            let order = m
                .headers
                .as_ref()
                .and_then(|h| h.get("order"))
                .map_or("", |v| v.as_str());
            Key::new(order)
        },
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
    let runner = JetStreamRunner::new(consumer, processor).on_settled(move |_| {
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
    let _ = stream.delete_consumer(&durable).await;
    let (first, last) = *times.lock().expect("lock");
    let (Some(first), Some(last)) = (first, last) else {
        return Err("nothing consumed".into());
    };
    Ok(n.saturating_sub(1) as f64 / last.duration_since(first).as_secs_f64())
}
