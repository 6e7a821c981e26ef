//! The consumer case: messages per second through the Kafka runner (idemkit-kafka) on a
//! Kafka-protocol broker, with idemkit on Redis, batch reservation on and off, beside the
//! same runner with idempotency off, in one run.
//!
//! One topic of 4 partitions holds `messages` orders (distinct keys). Each case consumes
//! all of them with a new consumer group and a store prefix of its own; the handler does no
//! work (a small value is stored), so the figure is the runner's and the store's cost per
//! message. Throughput is timed from the first settled message to the last (group joins are
//! not counted). Redis commands per message come from `INFO commandstats` deltas. Cases run
//! `rounds` times, interleaved; each row is the median round.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_kafka::KafkaRunner;

use crate::paired::Paired;
use idemkit_redis::RedisStore;
use idemkit_runner::Processor;
use rdkafka::ClientConfig;
use rdkafka::Message as _;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord};

const PARTITIONS: i32 = 4;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Mode {
    /// idemkit on (on Redis) or off.
    protected: bool,
    /// Batch reservation (`KafkaRunner::batch`; 1: off).
    batch: usize,
    /// What the handler does: nothing, or sleeps this long (a call to another service).
    handler: Duration,
}

impl Mode {
    fn name(self) -> String {
        let handler = if self.handler.is_zero() {
            String::new()
        } else {
            format!(", {} ms handler", self.handler.as_millis())
        };
        match (self.protected, self.batch) {
            (false, _) => format!("runner, idempotency off{handler}"),
            (true, 1) => format!("runner + idemkit (Redis), batch off{handler}"),
            (true, batch) => format!("runner + idemkit (Redis), batch {batch}{handler}"),
        }
    }
}

/// The cases: an empty handler (the runner's and the store's cost per message) with
/// idempotency off, on without and with batch reservation; and a 1 ms handler (a call to
/// another service) off and on.
const MODES: [Mode; 5] = [
    Mode {
        protected: false,
        batch: 1,
        handler: Duration::ZERO,
    },
    Mode {
        protected: true,
        batch: 1,
        handler: Duration::ZERO,
    },
    Mode {
        protected: true,
        batch: 64,
        handler: Duration::ZERO,
    },
    Mode {
        protected: false,
        batch: 64,
        handler: Duration::from_millis(1),
    },
    Mode {
        protected: true,
        batch: 64,
        handler: Duration::from_millis(1),
    },
];

/// One consumer case's median: for the targets in results.md.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerRow {
    pub(crate) case: String,
    pub(crate) per_sec: f64,
    /// Against idempotency off with the same handler, round by round (empty for a case
    /// with idempotency off); the target decides on their median.
    pub(crate) vs_off: Paired,
}

/// The ratio of each protected case to idempotency off with the same handler, round by
/// round. `cases`: whether idemkit is on, the handler's time, the messages/s per round.
pub(crate) fn vs_off(cases: &[(bool, Duration, &[f64])]) -> Vec<Paired> {
    cases
        .iter()
        .map(|(protected, handler, rounds)| {
            let off = cases.iter().find(|(p, h, _)| !p && h == handler);
            match off {
                Some((_, _, off)) if *protected => {
                    let some = |r: &[f64]| r.iter().map(|x| Some(*x)).collect::<Vec<_>>();
                    Paired::of(&some(rounds), &some(off))
                }
                _ => Paired::default(),
            }
        })
        .collect()
}

/// Whether a runner's rounds so far disagree on a target: a protected case's ratio to
/// idempotency off lies on both sides of `target(handler)` (`None`: no target for that
/// handler).
pub(crate) fn undecided(
    cases: &[(bool, Duration, &[f64])],
    target: impl Fn(Duration) -> Option<f64>,
) -> bool {
    cases
        .iter()
        .zip(vs_off(cases))
        .any(|((_, handler, _), p)| target(*handler).is_some_and(|t| p.straddles(t)))
}

/// [`undecided`] for a runner whose cases are `modes` (whether idemkit is on, the
/// handler's time), against [`runner_target`].
pub(crate) fn runner_undecided(
    modes: impl Iterator<Item = (bool, Duration)>,
    results: &[Vec<f64>],
) -> bool {
    let cases: Vec<_> = modes
        .zip(results)
        .map(|((p, h), r)| (p, h, &r[..]))
        .collect();
    undecided(&cases, runner_target)
}

/// Messages a case consumes: all of them with an empty handler; a fifth (at least 100)
/// with a 1 ms one, which is bounded by the handlers (a fifth is enough to measure it).
pub(crate) fn messages_for(handler: Duration, messages: usize) -> usize {
    if handler.is_zero() {
        messages
    } else {
        (messages / 5).max(100)
    }
}

/// The JetStream and RabbitMQ runners' targets (issue 51): at least 0.7× idempotency off
/// with an empty handler, 0.9× with a 1 ms one.
pub(crate) fn runner_target(handler: Duration) -> Option<f64> {
    Some(if handler.is_zero() { 0.7 } else { 0.9 })
}

/// A runner's cases as a table and rows: each case's median round, the spread of its rounds
/// (slowest to fastest) beside it, and its ratio to idempotency off with the same handler:
/// the median of the ratios round by round (rounds are interleaved, so round `i` of both
/// cases ran side by side), with their spread. `cases`: each case's name, whether idemkit
/// is on, its handler's time, and its messages/s per round.
pub(crate) fn runner_table(
    title: String,
    cases: &[(String, bool, Duration, Vec<f64>)],
) -> (String, Vec<ConsumerRow>) {
    let median = |r: &[f64]| {
        let mut r = r.to_vec();
        r.sort_by(f64::total_cmp);
        r.get(r.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let spread = |r: &[f64]| {
        let lo = r.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    };
    let mut out = format!(
        "{title}\n\n| case | messages/s (median) | rounds' spread | vs idempotency off (median of the rounds' ratios) | its spread |\n|---|---|---|---|---|\n"
    );
    let ratios = vs_off(
        &cases
            .iter()
            .map(|(_, p, h, r)| (*p, *h, &r[..]))
            .collect::<Vec<_>>(),
    );
    let mut rows = Vec::new();
    for ((name, _, _, rounds), vs_off) in cases.iter().zip(ratios) {
        let per_sec = median(rounds);
        let (lo, hi) = spread(rounds);
        let (median, ratio_spread) = match (vs_off.median(), vs_off.spread()) {
            (Some(m), Some((a, b))) => (format!("{m:.2}×"), format!("{a:.2}–{b:.2}×")),
            _ => ("-".to_string(), "-".to_string()),
        };
        out.push_str(&format!(
            "| {name} | {per_sec:.0} | {lo:.0}–{hi:.0} | {median} | {ratio_spread} |\n"
        ));
        rows.push(ConsumerRow {
            case: name.clone(),
            per_sec,
            vs_off,
        });
    }
    (out, rows)
}

struct Measured {
    per_sec: f64,
    /// Script calls (`EVALSHA`): the store's round trips.
    round_trips: f64,
    /// Every command Redis ran, those inside scripts included.
    commands: f64,
}

/// Runs the consumer cases; the report's text and its rows.
pub(crate) async fn run(
    brokers: &str,
    redis_url: &str,
    messages: usize,
    rounds: usize,
    max_rounds: usize,
) -> Result<(String, Vec<ConsumerRow>), String> {
    let topic = format!("idemkit-bench-{:x}", fastrand::u64(..));
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| e.to_string())?;
    admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .create()
        .map_err(|e| e.to_string())?;
    eprintln!("kafka: producing {messages} messages to {topic}");
    let send = |i: usize| {
        let key = format!("order-{i}");
        let producer = producer.clone();
        let topic = topic.clone();
        async move {
            producer
                .send(
                    FutureRecord::to(&topic)
                        .partition(i as i32 % PARTITIONS)
                        .key(&key)
                        .payload("paid"),
                    Duration::from_secs(30),
                )
                .await
                .map(drop)
                .map_err(|(e, _)| e.to_string())
        }
    };
    for start in (0..messages).step_by(1000) {
        let chunk = (start..(start + 1000).min(messages)).map(send);
        for r in futures_util::future::join_all(chunk).await {
            r?;
        }
    }
    let redis = redis::Client::open(redis_url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;

    let modes = MODES;
    let redis = &redis;
    let (topic, max) = (&topic, max_rounds);
    let results = crate::paired::interleaved(
        &modes,
        rounds,
        max,
        |round, mode: Mode| async move {
            eprintln!("kafka: round {}: {}", round + 1, mode.name());
            let before = crate::measure::commandstats(redis).await?;
            // A 1 ms handler is bounded by the partitions (one message at a time each).
            let n = messages_for(mode.handler, messages);
            let per_sec = consume(brokers, redis_url, topic, n, mode).await?;
            let after = crate::measure::commandstats(redis).await?;
            let calls = |s: &crate::measure::Stats, only: Option<&str>| -> u64 {
                s.iter()
                    .filter(|(name, _)| name.as_str() != "info")
                    .filter(|(name, _)| only.is_none_or(|o| name.as_str() == o))
                    .map(|(_, (calls, _))| calls)
                    .sum()
            };
            let per =
                |only| calls(&after, only).saturating_sub(calls(&before, only)) as f64 / n as f64;
            Ok(Measured {
                per_sec,
                round_trips: per(Some("evalsha")),
                commands: per(None),
            })
        },
        |results: &[Vec<Measured>]| {
            let per_sec: Vec<Vec<f64>> = results
                .iter()
                .map(|r| r.iter().map(|m| m.per_sec).collect())
                .collect();
            undecided(&cases_of(&modes, &per_sec), |h| {
                (!h.is_zero()).then_some(0.8)
            })
        },
    )
    .await?;
    let per_sec: Vec<Vec<f64>> = results
        .iter()
        .map(|r| r.iter().map(|m| m.per_sec).collect())
        .collect();
    let paired = vs_off(&cases_of(&modes, &per_sec));
    let rounds = results[0].len();
    let mut results = results;
    let mut out = format!(
        "Kafka consumer: {messages} messages, {PARTITIONS} partitions, broker {brokers}, store {redis_url}; median of {rounds} interleaved rounds\n\n\
         | case | messages/s | vs idempotency off (median of the rounds' ratios, their spread) | store round trips per message | Redis commands per message (scripts' included) |\n|---|---|---|---|---|\n"
    );
    let medians: Vec<&Measured> = results
        .iter_mut()
        .map(|r| {
            r.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
            &r[r.len() / 2]
        })
        .collect();
    let mut rows = Vec::new();
    for ((mode, m), vs_off) in modes.iter().zip(&medians).zip(paired) {
        // Each against idempotency off with the same handler, round by round.
        out.push_str(&format!(
            "| {} | {:.0} | {} | {:.2} | {:.2} |\n",
            mode.name(),
            m.per_sec,
            vs_off.show(),
            m.round_trips,
            m.commands
        ));
        rows.push(ConsumerRow {
            case: mode.name(),
            per_sec: m.per_sec,
            vs_off,
        });
    }
    out.push_str(&format!(
        "\nbatch reservation on / off: {:.2}× messages/s, {:.2} vs {:.2} round trips per message\n",
        medians[2].per_sec / medians[1].per_sec,
        medians[2].round_trips,
        medians[1].round_trips
    ));
    Ok((out, rows))
}

/// The cases as `vs_off` and `undecided` take them.
fn cases_of<'a>(modes: &[Mode], per_sec: &'a [Vec<f64>]) -> Vec<(bool, Duration, &'a [f64])> {
    modes
        .iter()
        .zip(per_sec)
        .map(|(m, r)| (m.protected, m.handler, &r[..]))
        .collect()
}

/// Consumes every message of `topic` once with a new group; messages per second between
/// the first and the last settlement.
async fn consume(
    brokers: &str,
    redis_url: &str,
    topic: &str,
    messages: usize,
    mode: Mode,
) -> Result<f64, String> {
    let prefix = format!("idemkit-bench-consumer-{:x}", fastrand::u64(..));
    let store = RedisStore::builder()
        .prefix(prefix)
        .connect(redis_url)
        .await
        .map_err(|e| e.to_string())?;
    let processor = Processor::new(
        Coordinator::new(store),
        Operation::new("bench.consume").expect("valid"),
        |m: &OwnedMessage| Key::new(String::from_utf8_lossy(m.key().unwrap_or_default())),
        move |_m: OwnedMessage, _| async move {
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
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("bench-{:x}", fastrand::u64(..)))
        .set("auto.offset.reset", "earliest")
        .set("auto.commit.interval.ms", "500")
        // tansu answers a fetch only after this wait when it has fewer bytes than
        // `fetch.min.bytes` to give at once: librdkafka's 500 ms default made every case
        // the broker's (2,000 messages a second, whatever the runner did).
        .set("fetch.wait.max.ms", "10");
    let runner = KafkaRunner::new(config, [topic.to_string()], processor)
        .batch(mode.batch)
        .on_settled(move |_| {
            let now = Instant::now();
            let mut times = t.lock().expect("lock");
            times.0.get_or_insert(now);
            times.1 = Some(now);
            if s.fetch_add(1, Ordering::Relaxed) + 1 == messages {
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
    Ok((messages.saturating_sub(1)) as f64 / last.duration_since(first).as_secs_f64())
}
