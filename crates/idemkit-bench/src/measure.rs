//! The measurements: idemkit on Redis against the physical floor, measured in one run.
//!
//! For each concurrency (1 and 64 tasks) it times, on the same server and through the same
//! client library:
//!
//! - the floor: a plain `GET`, and an `EVALSHA` of a script that only returns;
//! - idemkit's hit path (replaying a completed key) and miss path (fresh key: begin, a
//!   trivial action, complete);
//!
//! and it reads from Redis itself (`INFO commandstats` deltas) how many commands each call
//! sent and how much Redis CPU each script took. Last, the waiter wake-up latency: an owner
//! runs a 100 ms action, a second caller arrives 10 ms later in wait mode, and the time from
//! the owner's action returning to the waiter returning is recorded over 50 trials.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_redis::RedisStore;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

/// The benchmark's command-line arguments, of `idemkit-bench`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchArgs {
    /// The Redis server.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub(crate) store: String,
    /// Operations per case at concurrency 64 (a tenth of it at concurrency 1).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) ops: usize,
    /// Tokio worker threads for the client: 1 is a current-thread runtime, which leaves
    /// the second core to Redis.
    #[arg(long, default_value_t = 1)]
    pub(crate) workers: usize,
    /// Rounds: every case runs this many times, the cases of one round after another (in an
    /// order that turns from round to round), and each row reports the round with the
    /// median throughput. On a noisy machine one round can be off by a third; interleaved
    /// rounds keep the comparison fair, and each target's ratio is the median of ratios
    /// taken side by side: within each round, or (idemkit against the Rust peers) within
    /// each slice of a round (`duel`).
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// At most this many rounds (default: twice `--rounds`): after `--rounds`, more rounds
    /// run while the middle half of some target's ratios (`paired`) lies on both sides of
    /// it.
    #[arg(long)]
    pub(crate) max_rounds: Option<usize>,
    /// About how long each contender's slice of the head-to-head lasts, in milliseconds (at
    /// least a tenth of `--ops` calls): shorter slices favour the slower contender, since
    /// starting 64 tasks and waiting for the last weigh most on the fastest (the smoke
    /// test runs with a few).
    #[arg(long, default_value_t = 200)]
    pub(crate) slice_ms: u64,
    /// Also measure PostgreSQL (`PgStore` against a primary-key `SELECT` and a one-row
    /// `INSERT`) on this server, e.g. `postgres://postgres@127.0.0.1:5432/test`. Counting
    /// statements reads the server log and needs a superuser (`SET log_statement`).
    #[arg(long)]
    pub(crate) postgres: Option<String>,
    /// Also measure MySQL or MariaDB (`MySqlStore` against a primary-key `SELECT`, a one-row
    /// `INSERT` and a hand-written table) on this server, e.g.
    /// `mysql://root@127.0.0.1:3306/test`.
    #[arg(long)]
    pub(crate) mysql: Option<String>,
    /// Skip the Redis cases (with `--postgres` or `--mysql`: those only).
    #[arg(long)]
    pub(crate) skip_redis: bool,
    /// Also measure the Kafka consumer runner (idempotency off, idemkit on `--store` with
    /// batch reservation off and on; an empty handler and a 1 ms one) on this
    /// Kafka-protocol broker, e.g. `127.0.0.1:9092`.
    #[arg(long)]
    pub(crate) kafka: Option<String>,
    /// Also measure the JetStream runner (idempotency off and idemkit on `--store`; an
    /// empty handler and a 1 ms one) on this NATS server, e.g. `nats://127.0.0.1:4222`.
    #[arg(long)]
    pub(crate) jetstream: Option<String>,
    /// Also measure the RabbitMQ runner (idempotency off and idemkit on `--store`; an
    /// empty handler and a 1 ms one) on this broker, e.g.
    /// `amqp://guest:guest@127.0.0.1:5672/%2f`.
    #[arg(long)]
    pub(crate) rabbitmq: Option<String>,
    /// Also measure the HTTP layer (an axum app with and without it, keys on `--store`).
    #[arg(long)]
    pub(crate) http: bool,
    /// Also measure idemkit's Python ASGI middleware (a FastAPI app on uvicorn with and
    /// without it, keys on `--store`), with this Python interpreter (it has idemkit,
    /// FastAPI and uvicorn: `target/python/env/bin/python` after `scripts/python test`).
    #[arg(long)]
    pub(crate) asgi: Option<std::path::PathBuf>,
    /// Requests per HTTP case.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) http_requests: usize,
    /// Messages per consumer case (a fifth of it with the 1 ms handler).
    #[arg(long, default_value_t = 20_000)]
    pub(crate) kafka_messages: usize,
    /// Write `results.md` and the plots (SVG) into this directory, and add the cases that
    /// only the full run has: explicit batches, the MemoryStore, bytes per record.
    #[arg(long)]
    pub(crate) out: Option<std::path::PathBuf>,
    /// A second server (Valkey 9, `scripts/valkey`), e.g. `redis://127.0.0.1:6390`: the
    /// Redis cases (the floor, idemkit, the Rust peers) run on it too, in the same rounds
    /// (each round one server after the other), and the results show both servers side by
    /// side.
    #[arg(long)]
    pub(crate) valkey: Option<String>,
    /// A Python interpreter that has `idempotency-kit[redis]==0.5.0` (the Python peer;
    /// `scripts/bench` makes a throwaway virtual environment for it). Needs `--out`.
    #[arg(long)]
    pub(crate) python: Option<std::path::PathBuf>,
}

/// The client runtime a benchmark runs on: a current-thread runtime for `workers <= 1`
/// (which leaves the second core to Redis), else that many worker threads.
///
/// # Errors
///
/// The runtime cannot start.
///
/// # Example
///
/// ```
/// let rt = idemkit_bench::runtime(1).unwrap();
/// assert_eq!(rt.block_on(async { 1 + 1 }), 2);
/// ```
pub(crate) fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    }
}

/// One measured row.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// What was measured.
    pub(crate) case: &'static str,
    /// Concurrent tasks.
    pub(crate) concurrency: usize,
    /// Operations per second.
    pub(crate) ops_per_sec: f64,
    /// Median latency.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Client commands per call: counted by `MONITOR` on a sequential sample (commands run
    /// inside scripts are not client commands and are not counted).
    pub(crate) commands_per_call: f64,
    /// Redis CPU per call in µs, from `INFO commandstats` deltas: the scripts' time (which
    /// includes the commands they run) or, for a case without scripts, all its commands.
    pub(crate) redis_usec_per_call: f64,
    /// All of Redis' CPU per call in µs (`INFO cpu`: user + system, main thread and
    /// background): the scripts plus reading, parsing and answering the commands.
    pub(crate) redis_cpu_usec_per_call: f64,
    /// Redis' CPU over the case's wall time: near 100% means Redis was the bottleneck.
    pub(crate) redis_busy: f64,
}

/// The whole report.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    /// Tokio worker threads the client ran on.
    pub(crate) workers: usize,
    /// Rounds folded into this report (see [`Report::median_of`]).
    pub(crate) rounds: usize,
    /// The throughput and latency rows.
    pub(crate) rows: Vec<Row>,
    /// Waiter wake-up latencies, sorted.
    pub(crate) wakeups: Vec<Duration>,
    /// The Redis cases on the second server (`--valkey`), folded as `rows` are; empty
    /// without one.
    pub(crate) second: Vec<Row>,
    /// Every round's rows, in round order (one round: `rows` itself): the targets' ratios
    /// are taken within each round (`paired`).
    pub(crate) per_round: Vec<Vec<Row>>,
    /// idemkit against the Rust peers in slices (`duel`), every round's slices together.
    pub(crate) duels: Vec<crate::duel::Duel>,
    /// The same on the second server.
    pub(crate) second_duels: Vec<crate::duel::Duel>,
}

/// Runs `ops` calls spread over `concurrency` tasks (task `t` passes `t * per_task + i`, so
/// every call gets its own index); returns each call's latency, sorted, and the wall time.
///
/// # Errors
///
/// A task panicked.
pub(crate) async fn timed<F, Fut>(
    concurrency: usize,
    ops: usize,
    call: F,
) -> Result<(Vec<Duration>, Duration), String>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let per_task = ops.div_ceil(concurrency);
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let s = Instant::now();
                    call(t * per_task + i).await;
                    lat.push(s.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(per_task * concurrency);
    for t in tasks {
        lat.extend(t.await.map_err(|e| e.to_string())?);
    }
    let elapsed = started.elapsed();
    lat.sort();
    Ok((lat, elapsed))
}

/// [`timed`] without timing each call: the wall time of `ops` calls over `concurrency`
/// tasks, for in-process calls whose per-call clock reads would be a fifth of what is
/// measured (two reads of this VM's clock, about 45 ns, against a 200 ns replay).
///
/// # Errors
///
/// A task panicked.
pub(crate) async fn untimed<F, Fut>(
    concurrency: usize,
    ops: usize,
    call: F,
) -> Result<Duration, String>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let per_task = ops.div_ceil(concurrency);
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|t| {
            let call = call.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    call(t * per_task + i).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    Ok(started.elapsed() * ops as u32 / (per_task * concurrency) as u32)
}

/// A connection for measuring: raw commands, `INFO`, `MONITOR`.
///
/// # Example
///
/// ```no_run
/// # async fn run() -> Result<(), String> {
/// use idemkit_bench::Bench;
///
/// let bench = Bench::connect("redis://127.0.0.1:6379").await?;
/// let conn = bench.raw();
/// let row = bench
///     .measure("GET", 64, 10_000, move |_| {
///         let mut c = conn.clone();
///         async move {
///             let _: Option<String> = redis::cmd("GET").arg("k").query_async(&mut c).await.unwrap();
///         }
///     })
///     .await?;
/// println!("{} ops/s, {} commands per call", row.ops_per_sec, row.commands_per_call);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub(crate) struct Bench {
    client: redis::Client,
    raw: MultiplexedConnection,
}

impl Bench {
    /// Connects to the server under test.
    ///
    /// # Errors
    ///
    /// The server cannot be reached.
    pub(crate) async fn connect(url: &str) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let raw = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        Ok(Bench { client, raw })
    }

    /// A plain connection through the same client library (for the floor).
    pub(crate) fn raw(&self) -> MultiplexedConnection {
        self.raw.clone()
    }

    /// The server and its version: `Redis 7.0.15`, or `Valkey 9.1.2` (whose `INFO` also
    /// says `redis_version`, the Redis version it is compatible with).
    pub(crate) async fn server_version(&self) -> Result<String, String> {
        let info = info(&self.raw, "server").await?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
        };
        Ok(match (field("valkey_version:"), field("redis_version:")) {
            (Some(v), _) => format!("Valkey {v}"),
            (None, Some(v)) => format!("Redis {v}"),
            (None, None) => "unknown".into(),
        })
    }

    /// Redis' CPU seconds so far.
    pub(crate) async fn redis_cpu(&self) -> Result<f64, String> {
        redis_cpu(&self.raw).await
    }

    /// Times `ops` calls spread over `concurrency` tasks, and counts the client commands
    /// one call sends on a sequential sample of 20 calls.
    ///
    /// # Errors
    ///
    /// A Redis error from `INFO` or `MONITOR`.
    pub(crate) async fn measure<F, Fut>(
        &self,
        case: &'static str,
        concurrency: usize,
        ops: usize,
        call: F,
    ) -> Result<Row, String>
    where
        F: Fn(usize) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        eprintln!("  {case}, c={concurrency}, {ops} calls");
        let commands_per_call = self.count_commands(20, call.clone()).await?;
        let before = commandstats(&self.raw).await?;
        let cpu_before = redis_cpu(&self.raw).await?;
        let (lat, elapsed) = timed(concurrency, ops, call).await?;
        let cpu = redis_cpu(&self.raw).await? - cpu_before;
        let after = commandstats(&self.raw).await?;
        let calls = lat.len() as f64;
        // Top-level commands this case sends (commands run inside scripts are counted by Redis
        // under their own names, so only EVALSHA and the floor's GET are client commands here).
        let delta = |name: &str| {
            let (c1, u1) = after.get(name).copied().unwrap_or_default();
            let (c0, u0) = before.get(name).copied().unwrap_or_default();
            (c1 - c0, u1 - u0)
        };
        let (evalsha, evalsha_usec) = delta("evalsha");
        let (eval, eval_usec) = delta("eval");
        let usec = if evalsha + eval > 0 {
            // A script's time includes the commands it runs; count only the scripts.
            evalsha_usec + eval_usec
        } else {
            after
                .keys()
                .filter(|k| *k != "info")
                .map(|k| delta(k).1)
                .sum()
        };
        Ok(Row {
            case,
            concurrency,
            ops_per_sec: calls / elapsed.as_secs_f64(),
            p50: lat[lat.len() / 2],
            p99: lat[lat.len() * 99 / 100],
            commands_per_call,
            redis_usec_per_call: usec as f64 / calls,
            redis_cpu_usec_per_call: cpu * 1e6 / calls,
            redis_busy: cpu / elapsed.as_secs_f64(),
        })
    }

    /// Client commands per call, read from `MONITOR` (lines of commands run by scripts are
    /// marked `lua` there and skipped).
    pub(crate) async fn count_commands<F, Fut>(&self, calls: usize, call: F) -> Result<f64, String>
    where
        F: Fn(usize) -> Fut,
        Fut: Future<Output = ()>,
    {
        use futures_util::StreamExt as _;
        let monitor = self
            .client
            .get_async_monitor()
            .await
            .map_err(|e| e.to_string())?;
        let mut lines = monitor.into_on_message::<String>();
        let start = format!("idemkit-bench-start-{:x}", fastrand::u64(..));
        let end = format!("idemkit-bench-end-{:x}", fastrand::u64(..));
        let (started_tx, mut started) = tokio::sync::watch::channel(false);
        let reader = {
            let (start, end) = (start.clone(), end.clone());
            tokio::spawn(async move {
                let mut commands = 0usize;
                while let Some(line) = lines.next().await {
                    if line.contains(&start) {
                        let _ = started_tx.send(true);
                    } else if line.contains(&end) {
                        break;
                    } else if *started_tx.borrow()
                        && !line.contains(" lua]")
                        && !CONNECTION_SETUP.iter().any(|c| line.contains(c))
                    {
                        commands += 1;
                    }
                }
                commands
            })
        };
        // MONITOR may not be active yet: repeat the start marker until the reader sees it.
        while !*started.borrow() {
            let _: String = redis::cmd("ECHO")
                .arg(&start)
                .query_async(&mut self.raw.clone())
                .await
                .map_err(|e| e.to_string())?;
            let _ = tokio::time::timeout(Duration::from_millis(5), started.changed()).await;
        }
        for i in 0..calls {
            call(i).await;
        }
        let _: String = redis::cmd("ECHO")
            .arg(&end)
            .query_async(&mut self.raw.clone())
            .await
            .map_err(|e| e.to_string())?;
        let commands = reader.await.map_err(|e| e.to_string())?;
        Ok(commands as f64 / calls as f64)
    }
}

/// Commands a client sends when it opens a connection (redis-py's `CLIENT SETINFO`), not
/// per call: a child process's calls are counted with its connection's opening.
const CONNECTION_SETUP: [&str; 3] = ["\"CLIENT\"", "\"client\"", "\"HELLO\""];

/// Runs the benchmark against a Redis URL with `ops` operations per concurrent case:
/// the floor, idemkit's hit and miss paths, and waiter wake-ups; `round` (counted from 0)
/// turns the order of the miss variants.
///
/// # Example
///
/// ```no_run
/// # async fn run() -> Result<(), String> {
/// let report = idemkit_bench::run("redis://127.0.0.1:6379", 100_000, 1, 0).await?;
/// println!("{report}");
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// A Redis error (connection refused...), as text.
pub(crate) async fn run(
    url: &str,
    ops: usize,
    workers: usize,
    round: usize,
) -> Result<Report, String> {
    let bench = Bench::connect(url).await?;
    let store = RedisStore::builder()
        .prefix(format!("idemkit-bench:{:x}", fastrand::u64(..)))
        .connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let coordinator = Coordinator::new(store);
    // The same store with coalescing on (off by default on the store's own client): the
    // two in one run.
    let single = Coordinator::new(
        RedisStore::builder()
            .prefix(format!("idemkit-bench:{:x}", fastrand::u64(..)))
            .coalesce(true)
            .connect(url)
            .await
            .map_err(|e| e.to_string())?,
    );
    // The same store with every `begin` the script (`plain_begins(false)`): issue 51's
    // comparison of the plain begin against the script, in one run.
    let scripted = Coordinator::new(
        RedisStore::builder()
            .prefix(format!("idemkit-bench:{:x}", fastrand::u64(..)))
            .plain_begins(false)
            .connect(url)
            .await
            .map_err(|e| e.to_string())?,
    );
    let op = Operation::new("bench").expect("valid");
    let noop = redis::Script::new("return 1");
    let hit_key = Key::new("hit").expect("valid");
    coordinator
        .call(&op, &hit_key)
        .run(|_| action())
        .await
        .map_err(|e| e.to_string())?;
    // Load the miss path's scripts.
    let warm = Key::new("warm").expect("valid");
    coordinator
        .call(&op, &warm)
        .run(|_| action())
        .await
        .map_err(|e| e.to_string())?;
    let _: i64 = noop
        .invoke_async(&mut bench.raw())
        .await
        .map_err(|e| e.to_string())?;

    let mut rows = Vec::new();
    let next = Arc::new(AtomicU64::new(0));
    let next_single = Arc::new(AtomicU64::new(0));
    let next_scripted = Arc::new(AtomicU64::new(0));
    for concurrency in [1, 64] {
        let n = if concurrency == 1 { ops / 10 } else { ops };
        let conn = bench.raw();
        rows.push(
            bench
                .measure("floor: GET", concurrency, n, move |_| {
                    let mut c = conn.clone();
                    async move {
                        let _: Option<String> = redis::cmd("GET")
                            .arg("idemkit-bench:floor")
                            .query_async(&mut c)
                            .await
                            .expect("GET");
                    }
                })
                .await?,
        );
        let (conn, script) = (bench.raw(), Arc::new(noop.clone()));
        rows.push(
            bench
                .measure("floor: EVALSHA return 1", concurrency, n, move |_| {
                    let (mut c, script) = (conn.clone(), script.clone());
                    async move {
                        let _: i64 = script.invoke_async(&mut c).await.expect("EVALSHA");
                    }
                })
                .await?,
        );
        let (c, o, k) = (coordinator.clone(), op.clone(), hit_key.clone());
        rows.push(
            bench
                .measure("idemkit hit", concurrency, n, move |_| {
                    let (c, o, k) = (c.clone(), o.clone(), k.clone());
                    async move {
                        c.call(&o, &k).run(|_| action()).await.expect("hit");
                    }
                })
                .await?,
        );
        // The three miss variants in an order of the round's (`paired::rotated`): the
        // first after the hits meets a server whose memory the hits left warm.
        let variants = [
            ("idemkit miss", &coordinator, &next),
            ("idemkit miss, coalescing on", &single, &next_single),
            ("idemkit miss, begin script", &scripted, &next_scripted),
        ];
        for (case, c, next) in crate::paired::rotated(&variants, round) {
            let (c, o, next) = (c.clone(), op.clone(), next.clone());
            rows.push(
                bench
                    .measure(case, concurrency, n, move |_| {
                        let (c, o) = (c.clone(), o.clone());
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let k = Key::new(format!("{case}-{i}").replace([' ', ','], "-"))
                            .expect("valid");
                        async move {
                            c.call(&o, &k)
                                .ttl(Duration::from_secs(60))
                                .run(|_| action())
                                .await
                                .expect("miss");
                        }
                    })
                    .await?,
            );
        }
    }
    let wakeups = wakeups(&coordinator, &op, 50).await?;
    Ok(Report {
        workers,
        rounds: 1,
        per_round: vec![rows.clone()],
        rows,
        wakeups,
        second: Vec::new(),
        duels: Vec::new(),
        second_duels: Vec::new(),
    })
}

async fn action() -> Result<u32, Infallible> {
    Ok(1)
}

/// One section of `INFO`.
async fn info(conn: &MultiplexedConnection, section: &str) -> Result<String, String> {
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn.clone())
        .await
        .map_err(|e| e.to_string())
}

/// Redis' CPU seconds so far (`used_cpu_user` + `used_cpu_sys`).
async fn redis_cpu(conn: &MultiplexedConnection) -> Result<f64, String> {
    Ok(info(conn, "cpu")
        .await?
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            matches!(name, "used_cpu_user" | "used_cpu_sys")
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum())
}

pub(crate) type Stats = HashMap<String, (u64, u64)>;

/// `cmdstat_<name>:calls=..,usec=..` → name → (calls, usec).
pub(crate) async fn commandstats(conn: &MultiplexedConnection) -> Result<Stats, String> {
    let info = info(conn, "commandstats").await?;
    let mut out = HashMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let field = |f: &str| {
            fields
                .split(',')
                .find_map(|kv| kv.strip_prefix(f).and_then(|v| v.parse::<u64>().ok()))
                .unwrap_or(0)
        };
        out.insert(name.to_string(), (field("calls="), field("usec=")));
    }
    Ok(out)
}

async fn wakeups(
    c: &Coordinator<RedisStore>,
    op: &Operation,
    trials: usize,
) -> Result<Vec<Duration>, String> {
    let mut out = Vec::with_capacity(trials);
    for trial in 0..trials {
        let key = Key::new(format!("wake-{trial}")).expect("valid");
        let returned = Arc::new(std::sync::Mutex::new(None));
        let owner = {
            let (c, op, key, returned) = (c.clone(), op.clone(), key.clone(), returned.clone());
            tokio::spawn(async move {
                c.call(&op, &key)
                    .run(|_| async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        *returned.lock().expect("lock") = Some(Instant::now());
                        Ok::<_, Infallible>(1u32)
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let waited = c
            .call(op, &key)
            .run(|_| action())
            .await
            .map_err(|e| e.to_string())?;
        let done = Instant::now();
        owner
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if !waited.is_replay() {
            return Err("the waiter did not get the owner's result".into());
        }
        let t0 = returned.lock().expect("lock").ok_or("owner did not run")?;
        out.push(done.saturating_duration_since(t0));
    }
    out.sort();
    Ok(out)
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "client runtime: {} tokio worker thread(s); each row the median of {} round(s)",
            self.workers, self.rounds
        )?;
        writeln!(
            f,
            "{:<26}{:>5}{:>12}{:>10}{:>10}{:>10}{:>12}{:>11}{:>7}",
            "case", "conc", "ops/s", "p50 µs", "p99 µs", "cmd/call", "cmd µs", "redis cpu", "busy"
        )?;
        let second = self.second.iter().map(|r| (" (2nd server)", r));
        for (server, r) in self.rows.iter().map(|r| ("", r)).chain(second) {
            writeln!(
                f,
                "{:<26}{:>5}{:>12.0}{:>10.1}{:>10.1}{:>10.2}{:>12.2}{:>11.2}{:>6.0}%",
                format!("{}{server}", r.case),
                r.concurrency,
                r.ops_per_sec,
                r.p50.as_secs_f64() * 1e6,
                r.p99.as_secs_f64() * 1e6,
                r.commands_per_call,
                r.redis_usec_per_call,
                r.redis_cpu_usec_per_call,
                r.redis_busy * 100.0
            )?;
        }
        let pct =
            |p: usize| self.wakeups[(self.wakeups.len() * p / 100).min(self.wakeups.len() - 1)];
        writeln!(
            f,
            "waiter wake-up (owner's action returns -> waiter returns), {} trials: p50 {:.0} µs, p95 {:.0} µs",
            self.wakeups.len(),
            pct(50).as_secs_f64() * 1e6,
            pct(95).as_secs_f64() * 1e6
        )
    }
}
