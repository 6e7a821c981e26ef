//! Where a runner's message goes: `N` messages through the JetStream or the RabbitMQ runner
//! with an empty handler, idempotency off (`off`), on with keys on Redis (`on`) or on with
//! keys in a `MemoryStore` (`mem`), and the CPU each process spent a message (this client,
//! the broker, the Redis server: `/proc/<pid>/stat`), with the Redis server's commands,
//! reads and writes a message (`INFO`). The machine's idle share is the rest of two cores.
//!
//! Run with:
//! `cargo run --release -p idemkit-bench --example runner_profile -- js|amqp BROKER_URL BROKER_PID REDIS_PORT N off|on|mem [rounds]`
//! (`BROKER_PID`: nats-server's, or RabbitMQ's `beam.smp`). The client is one thread, as in
//! `idemkit-bench`. `RUNNER_PROFILE_COALESCE=1` (or `0`) sets the Redis store's coalescing
//! (`RedisStoreBuilder::coalesce`) instead of its default. docs/benchmarks.md has what it
//! showed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, KeyError, MemoryStore, Operation, Store};
use idemkit_nats::JetStreamRunner;
use idemkit_nats::async_nats;
use idemkit_nats::async_nats::jetstream::{self, consumer::pull, stream};
use idemkit_rabbitmq::RabbitRunner;
use idemkit_rabbitmq::lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use idemkit_rabbitmq::lapin::types::FieldTable;
use idemkit_rabbitmq::lapin::{BasicProperties, Connection, ConnectionProperties};
use idemkit_redis::RedisStore;
use idemkit_runner::{KeyOf, Processor};
use tokio::sync::Notify;

type Error = Box<dyn std::error::Error>;
type Run = Pin<Box<dyn Future<Output = Result<(), String>>>>;

/// A process's CPU so far, in clock ticks (utime + stime).
fn ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime: fields 14 and 15 of the line, 12 and 13 after the name.
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// The server's command calls (`cmdstat_*`) and its read, write and command totals.
async fn counters(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, f64)> {
    let text: String = redis::cmd("INFO")
        .arg("all")
        .query_async(conn)
        .await
        .unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let Some(cmd) = name.strip_prefix("cmdstat_") {
            let calls = value
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|c| c.parse().ok())
                .unwrap_or(0.0);
            out.push((cmd.to_string(), calls));
        } else if matches!(name, "total_reads_processed" | "total_writes_processed") {
            out.push((name.to_string(), value.trim().parse().unwrap_or(0.0)));
        }
    }
    out
}

fn main() -> Result<(), Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [
        transport,
        broker,
        broker_pid,
        redis_port,
        n,
        mode,
        rest @ ..,
    ] = &args[..]
    else {
        return Err(
            "usage: runner_profile js|amqp BROKER_URL BROKER_PID REDIS_PORT N off|on|mem [rounds]"
                .into(),
        );
    };
    let n: usize = n.parse()?;
    let rounds: usize = rest.first().map_or(Ok(1), |r| r.parse())?;
    let redis_url = format!("redis://127.0.0.1:{redis_port}");
    let mut info = redis::Client::open(redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let server: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut info)
        .await?;
    let redis_pid = server
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap_or("0")
        .trim()
        .to_string();
    let me = std::process::id().to_string();
    let mut source = Source::open(transport, broker, n).await?;
    for _ in 0..rounds {
        // Outside the measurement: a queue filled for this round (RabbitMQ).
        let queue = source.fill(n).await?;
        let before = (ticks(&me), ticks(broker_pid), ticks(&redis_pid));
        let was = counters(&mut info).await;
        let started = tokio::time::Instant::now();
        match mode.as_str() {
            "mem" => source.consume(&queue, n, MemoryStore::new(), true).await?,
            "on" | "off" => {
                let mut builder = RedisStore::builder()
                    .prefix(format!("idemkit-profile-{:x}", fastrand::u64(..)));
                if let Ok(on) = std::env::var("RUNNER_PROFILE_COALESCE") {
                    builder = builder.coalesce(on == "1");
                }
                let store = builder.connect(&redis_url).await?;
                source.consume(&queue, n, store, mode == "on").await?;
            }
            other => return Err(format!("no mode {other}").into()),
        }
        let took = started.elapsed();
        let after = (ticks(&me), ticks(broker_pid), ticks(&redis_pid));
        let now = counters(&mut info).await;
        // Clock ticks are 10 ms.
        let per = |a: u64, b: u64| (b - a) as f64 * 10_000.0 / n as f64;
        let (client, broker, redis) = (
            per(before.0, after.0),
            per(before.1, after.1),
            per(before.2, after.2),
        );
        let wall = took.as_secs_f64() * 1e6 / n as f64;
        println!(
            "{transport} {mode}: {:.0} messages/s; µs a message: client {client:.1}, broker {broker:.1}, redis {redis:.1}; idle {:.0}%",
            n as f64 / took.as_secs_f64(),
            (100.0 - (client + broker + redis) / (2.0 * wall) * 100.0).max(0.0),
        );
        let mut line = String::new();
        for (name, value) in &now {
            let old = was.iter().find(|(k, _)| k == name).map_or(0.0, |(_, v)| *v);
            let d = (value - old) / n as f64;
            if d > 0.001 && name != "info" {
                line.push_str(&format!(" {name} {d:.3}"));
            }
        }
        if !line.is_empty() {
            println!("  Redis a message:{line}");
        }
    }
    source.close().await;
    Ok(())
}

/// Where the messages are: a stream (refilled by a new durable consumer each round) or a
/// queue (filled again each round).
enum Source {
    Js {
        js: jetstream::Context,
        // Boxed: a stream's handle is large beside a queue's.
        stream: Box<jetstream::stream::Stream>,
        name: String,
    },
    Amqp {
        uri: String,
        channel: idemkit_rabbitmq::lapin::Channel,
        _connection: Connection,
    },
}

/// The key of a message: the order it names.
struct Order;

impl KeyOf<async_nats::jetstream::Message> for Order {
    fn key_of(&self, m: &async_nats::jetstream::Message) -> Result<Key, KeyError> {
        let order = m.headers.as_ref().and_then(|h| h.get("order"));
        Key::new(order.map_or("", |v| v.as_str()))
    }
}

impl KeyOf<idemkit_rabbitmq::Message> for Order {
    fn key_of(&self, m: &idemkit_rabbitmq::Message) -> Result<Key, KeyError> {
        Key::new(m.text().unwrap_or(""))
    }
}

fn processor<S: Store, M: Send + 'static>(
    store: S,
    protected: bool,
) -> Processor<S, Order, impl idemkit_runner::Handle<M, Output = u32> + 'static> {
    let handler = |_m: M, _| async { Ok::<_, std::convert::Infallible>(1u32) };
    Processor::new(
        Coordinator::new(store),
        Operation::new("bench.consume").expect("valid"),
        Order,
        handler,
    )
    .protected(protected)
}

/// A settlement hook that notifies `done` at the `n`th message.
fn counting<M>(
    n: usize,
    done: Arc<Notify>,
) -> impl Fn(&idemkit_runner::Settled<'_, M, u32>) + Send + Sync + 'static {
    let settled = AtomicUsize::new(0);
    move |_: &idemkit_runner::Settled<'_, M, u32>| {
        if settled.fetch_add(1, Ordering::Relaxed) + 1 == n {
            done.notify_one();
        }
    }
}

impl Source {
    async fn open(transport: &str, broker: &str, n: usize) -> Result<Source, Error> {
        match transport {
            "js" => {
                let js = jetstream::new(async_nats::connect(broker).await?);
                let name = format!("IDEMKIT_PROFILE_{:X}", fastrand::u64(..));
                let subject = format!("idemkit.profile.{:x}", fastrand::u64(..));
                let stream = js
                    .create_stream(stream::Config {
                        name: name.clone(),
                        subjects: vec![subject.clone()],
                        ..Default::default()
                    })
                    .await?;
                for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
                    let mut acks = Vec::with_capacity(chunk.len());
                    for i in chunk {
                        let mut headers = async_nats::HeaderMap::new();
                        headers.insert("order", format!("order-{i}").as_str());
                        acks.push(
                            js.publish_with_headers(subject.clone(), headers, "paid".into())
                                .await?,
                        );
                    }
                    for ack in acks {
                        ack.await?;
                    }
                }
                Ok(Source::Js {
                    js,
                    stream: Box::new(stream),
                    name,
                })
            }
            "amqp" => {
                let connection =
                    Connection::connect(broker, ConnectionProperties::default()).await?;
                let channel = connection.create_channel().await?;
                Ok(Source::Amqp {
                    uri: broker.to_string(),
                    channel,
                    _connection: connection,
                })
            }
            other => Err(format!("no transport {other}").into()),
        }
    }

    /// A new queue of `n` orders for RabbitMQ, published with confirms (empty for JetStream,
    /// whose stream is consumed anew by each round's consumer).
    async fn fill(&self, n: usize) -> Result<String, Error> {
        let Source::Amqp { channel, .. } = self else {
            return Ok(String::new());
        };
        let queue = format!("idemkit-profile-{:x}", fastrand::u64(..));
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
            let mut confirms = Vec::with_capacity(chunk.len());
            for i in chunk {
                confirms.push(
                    channel
                        .basic_publish(
                            "".into(),
                            queue.as_str().into(),
                            BasicPublishOptions::default(),
                            format!("order-{i}").as_bytes(),
                            BasicProperties::default(),
                        )
                        .await?,
                );
            }
            for c in confirms {
                c.await?;
            }
        }
        Ok(queue)
    }

    async fn consume<S: Store + Send + Sync + 'static>(
        &mut self,
        queue: &str,
        n: usize,
        store: S,
        protected: bool,
    ) -> Result<(), Error> {
        let done = Arc::new(Notify::new());
        let stop = {
            let done = done.clone();
            async move { done.notified().await }
        };
        let run: Run = match self {
            Source::Js { stream, .. } => {
                let durable = format!("profile-{:x}", fastrand::u64(..));
                let consumer = stream
                    .create_consumer(pull::Config {
                        durable_name: Some(durable),
                        ack_wait: Duration::from_secs(30),
                        ..Default::default()
                    })
                    .await?;
                let runner = JetStreamRunner::new(consumer, processor(store, protected))
                    .on_settled(counting(n, done));
                Box::pin(async move { runner.run(stop).await.map_err(|e| e.to_string()) })
            }
            Source::Amqp { uri, .. } => {
                let runner =
                    RabbitRunner::new(uri.as_str(), queue.to_string(), processor(store, protected))
                        .on_settled(counting(n, done));
                Box::pin(async move { runner.run(stop).await.map_err(|e| e.to_string()) })
            }
        };
        run.await?;
        Ok(())
    }

    async fn close(self) {
        if let Source::Js { js, name, .. } = self {
            let _ = js.delete_stream(&name).await;
        }
    }
}
