//! `idemkit-bench`: idemkit on Redis against the raw round-trip floor and against the Rust
//! crates a user could pick instead, measured in one run on one server with one client
//! runtime.
//!
//! Run with: `cargo run --release -p idemkit-bench -- --workers 1` (and `--workers 2`)
//!
//! Peers, each driven through its own public API:
//! - idempotency-kit 1.0.1 (`IdempotencyExecutor::execute` on its `RedisStore`: plain
//!   commands, no owner check on completion or release);
//! - idempotent 0.3.0 (`ValkeyStore::try_insert` then `complete`: Lua, fenced completion).

use std::convert::Infallible;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
mod duel;
mod http;
mod jetstream;
mod kafka;
mod measure;
mod mysql;
mod paired;
mod plots;
mod postgres;
mod publish;
mod rabbitmq;
mod rounds;
mod suite;

use measure::{Bench, Row};

#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    bench: measure::BenchArgs,
}

const TTL: Duration = Duration::from_secs(60);

async fn peers(url: &str, ops: usize) -> Result<Vec<Row>, String> {
    let bench = Bench::connect(url).await?;
    let run = format!("{:x}", fastrand::u64(..));
    let mut rows = Vec::new();

    // idempotency-kit 1.0.1
    let client = redis027::Client::open(url).map_err(|e| e.to_string())?;
    let manager = client
        .get_connection_manager()
        .await
        .map_err(|e| e.to_string())?;
    let kit = Arc::new(idempotency_kit::RedisStore::new(manager));
    let kit_hit = idempotency_kit::IdempotencyKey::derive("bench", format!("{run}-hit").as_bytes())
        .map_err(|e| e.to_string())?;
    kit_call(&kit, &kit_hit).await;

    // idempotent 0.3.0
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let prefix = format!("idempotent-bench-{run}");
    let idem = Arc::new(
        idempotent::store::valkey::ValkeyStore::with_prefix(client, Some(&prefix))
            .await
            .map_err(|e| e.to_string())?,
    );
    let idem_hit = idempotent::IdempotencyKey::new("hit").map_err(|e| e.to_string())?;
    idem_call(&idem, &idem_hit).await;

    let next = Arc::new(AtomicU64::new(0));
    for concurrency in [1, 64] {
        let n = if concurrency == 1 { ops / 10 } else { ops };
        let (s, k) = (kit.clone(), kit_hit.clone());
        rows.push(
            bench
                .measure("idempotency-kit hit", concurrency, n, move |_| {
                    let (s, k) = (s.clone(), k.clone());
                    async move { kit_call(&s, &k).await }
                })
                .await?,
        );
        let (s, next2, run2) = (kit.clone(), next.clone(), run.clone());
        rows.push(
            bench
                .measure("idempotency-kit miss", concurrency, n, move |_| {
                    let s = s.clone();
                    let i = next2.fetch_add(1, Ordering::Relaxed);
                    let k = idempotency_kit::IdempotencyKey::derive(
                        "bench",
                        format!("{run2}-{i}").as_bytes(),
                    )
                    .expect("key");
                    async move { kit_call(&s, &k).await }
                })
                .await?,
        );
        let (s, k) = (idem.clone(), idem_hit.clone());
        rows.push(
            bench
                .measure("idempotent hit", concurrency, n, move |_| {
                    let (s, k) = (s.clone(), k.clone());
                    async move { idem_call(&s, &k).await }
                })
                .await?,
        );
        let (s, next2) = (idem.clone(), next.clone());
        rows.push(
            bench
                .measure("idempotent miss", concurrency, n, move |_| {
                    let s = s.clone();
                    let i = next2.fetch_add(1, Ordering::Relaxed);
                    let k = idempotent::IdempotencyKey::new(format!("miss-{i}")).expect("key");
                    async move { idem_call(&s, &k).await }
                })
                .await?,
        );
    }
    Ok(rows)
}

pub(crate) async fn kit_call(
    store: &idempotency_kit::RedisStore,
    key: &idempotency_kit::IdempotencyKey,
) {
    idempotency_kit::IdempotencyExecutor::execute(store, key, TTL, || async {
        Ok::<_, Infallible>(b"1".to_vec())
    })
    .await
    .expect("idempotency-kit call");
}

pub(crate) async fn idem_call(
    store: &idempotent::store::valkey::ValkeyStore,
    key: &idempotent::IdempotencyKey,
) {
    use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
    use idempotent::store::{IdempotencyStore, InsertResult};
    let fingerprint = DefaultFingerprintStrategy.compute("bench", b"body");
    let entry = idempotent::IdempotencyEntry::new(fingerprint, TTL);
    match store
        .try_insert(key, entry.clone())
        .await
        .expect("try_insert")
    {
        InsertResult::Claimed { fencing_token } => {
            let response = idempotent::CachedResponse {
                status_code: 200,
                metadata: idempotent::Metadata::default(),
                body: bytes::Bytes::from_static(b"1"),
            };
            store
                .complete(key, entry.complete(response), fencing_token)
                .await
                .expect("complete");
        }
        InsertResult::Exists(existing) => {
            std::hint::black_box(existing);
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let built = measure::runtime(args.bench.workers);
    let Ok(runtime) = built else {
        eprintln!("idemkit-bench: cannot start the runtime");
        return ExitCode::FAILURE;
    };
    let args = &args.bench;
    let mut redis_report = None;
    let mut pg_report = None;
    // One round is idemkit's cases then the peers'; rounds alternate, so a slow spell of the
    // machine falls on every library rather than on one.
    if !args.skip_redis {
        // The servers' names, for the targets the rounds decide (Valkey's are not Redis 7's).
        let names = runtime.block_on(async {
            let first = measure::Bench::connect(&args.store)
                .await?
                .server_version()
                .await?;
            let second = match &args.valkey {
                Some(url) => Some(measure::Bench::connect(url).await?.server_version().await?),
                None => None,
            };
            Ok::<_, String>((first, second))
        });
        let (first, second) = match names {
            Ok(names) => names,
            Err(e) => {
                eprintln!("idemkit-bench: {e}");
                return ExitCode::FAILURE;
            }
        };
        let slice_len = std::time::Duration::from_millis(args.slice_ms);
        let result = runtime.block_on(rounds::rounds(
            args.rounds,
            args.max_rounds(),
            |round| async move {
                eprintln!("round {}: Redis at {}", round + 1, args.store);
                // idemkit's cases and the peers' take turns at going first.
                let (mut report, peer_rows) = if round % 2 == 0 {
                    let report = measure::run(&args.store, args.ops, args.workers, round).await?;
                    (report, peers(&args.store, args.ops).await?)
                } else {
                    let rows = peers(&args.store, args.ops).await?;
                    (
                        measure::run(&args.store, args.ops, args.workers, round).await?,
                        rows,
                    )
                };
                report.rows.extend(peer_rows);
                report.duels = duel::run(&args.store, args.ops, slice_len, round).await?;
                if let Some(valkey) = &args.valkey {
                    eprintln!("round {}: the second server at {valkey}", round + 1);
                    let (second, peer_rows) = if round % 2 == 0 {
                        let second = measure::run(valkey, args.ops, args.workers, round).await?;
                        (second, peers(valkey, args.ops).await?)
                    } else {
                        let rows = peers(valkey, args.ops).await?;
                        (
                            measure::run(valkey, args.ops, args.workers, round).await?,
                            rows,
                        )
                    };
                    report.second = second.rows;
                    report.second.extend(peer_rows);
                    report.second_duels = duel::run(valkey, args.ops, slice_len, round).await?;
                }
                if args.out.is_some() {
                    let bench = measure::Bench::connect(&args.store).await?;
                    report
                        .rows
                        .push(suite::redis_batches(&bench, &args.store, args.ops).await?);
                    if let Some(python) = &args.python {
                        let rows = suite::python_peer(&bench, python, &args.store, args.ops / 10);
                        report.rows.extend(rows.await?);
                    }
                    report.rows.extend(suite::memory(args.ops).await?);
                    report
                        .rows
                        .extend(suite::sealed(&bench, &args.store, args.ops).await?);
                }
                Ok(report)
            },
            |report| publish::redis_undecided(report, &first, second.as_ref()),
        ));
        match result {
            Ok(report) => {
                print!("{report}");
                print!(
                    "{}",
                    publish::redis_summary(&report, &first, second.as_ref())
                );
                redis_report = Some(report);
            }
            Err(e) => {
                eprintln!("idemkit-bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if args.http {
        match runtime.block_on(http::run(&args.store, args.http_requests, args.rounds)) {
            Ok(report) => print!("\n{report}"),
            Err(e) => {
                eprintln!("idemkit-bench: HTTP: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(python) = &args.asgi {
        let python = python.to_string_lossy();
        match runtime.block_on(http::run_asgi(
            &python,
            &args.store,
            args.http_requests,
            args.rounds,
        )) {
            Ok(report) => print!("\n{report}"),
            Err(e) => {
                eprintln!("idemkit-bench: ASGI: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut consumers = publish::Consumers::default();
    if let Some(brokers) = &args.kafka {
        let messages = args.kafka_messages;
        match runtime.block_on(kafka::run(
            brokers,
            &args.store,
            messages,
            args.rounds,
            args.max_rounds(),
        )) {
            Ok((report, rows)) => {
                print!("\n{report}");
                consumers.kafka = Some((report, rows));
            }
            Err(e) => {
                eprintln!("idemkit-bench: Kafka: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(url) = &args.jetstream {
        let messages = args.kafka_messages;
        match runtime.block_on(jetstream::run(
            url,
            &args.store,
            messages,
            args.rounds,
            args.max_rounds(),
        )) {
            Ok((report, rows)) => {
                print!("\n{report}");
                consumers.jetstream = Some((report, rows));
            }
            Err(e) => {
                eprintln!("idemkit-bench: JetStream: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(uri) = &args.rabbitmq {
        let messages = args.kafka_messages;
        match runtime.block_on(rabbitmq::run(
            uri,
            &args.store,
            messages,
            args.rounds,
            args.max_rounds(),
        )) {
            Ok((report, rows)) => {
                print!("\n{report}");
                consumers.rabbitmq = Some((report, rows));
            }
            Err(e) => {
                eprintln!("idemkit-bench: RabbitMQ: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(url) = &args.postgres {
        eprintln!("PostgreSQL at {url}");
        match runtime.block_on(postgres::run(url, args.ops, args.rounds)) {
            Ok(report) => {
                print!("\n{report}");
                pg_report = Some(report);
            }
            Err(e) => {
                eprintln!("idemkit-bench: PostgreSQL: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(url) = &args.mysql {
        eprintln!("MySQL at {url}");
        let version = runtime.block_on(mysql::server_version(url));
        match runtime.block_on(mysql::run(url, args.ops, args.rounds)) {
            Ok(report) => {
                let server = format!("MySQL server {}", version.unwrap_or_default());
                print!("\n{server}\n{report}");
                consumers.mysql = Some((server, report));
            }
            Err(e) => {
                eprintln!("idemkit-bench: MySQL: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let (Some(dir), Some(report)) = (&args.out, &redis_report) {
        let written = runtime.block_on(async {
            let bench = measure::Bench::connect(&args.store).await?;
            let c1 = suite::interleaved_c1(&bench, &args.store, (args.ops / 10).max(100)).await?;
            let (c1_second, second_version) = match &args.valkey {
                Some(url) => {
                    let bench = measure::Bench::connect(url).await?;
                    let c1 = suite::interleaved_c1(&bench, url, (args.ops / 10).max(100)).await?;
                    (c1, Some(bench.server_version().await?))
                }
                None => (Vec::new(), None),
            };
            let mut bytes = vec![suite::memory_entry_bytes().await?];
            bytes.extend(
                suite::redis_record_bytes(&bench, &args.store, args.python.as_deref()).await?,
            );
            let meta = publish::Meta {
                command: std::env::var("IDEMKIT_BENCH_COMMAND")
                    .unwrap_or_else(|_| std::env::args().collect::<Vec<_>>().join(" ")),
                redis_version: bench.server_version().await?,
                second_version,
                postgres_version: match &args.postgres {
                    Some(url) => Some(postgres::server_version(url).await?),
                    None => None,
                },
                python: args.python.as_ref().map(|p| python_version(p)),
            };
            publish::write(
                dir,
                &meta,
                report,
                [&c1, &c1_second],
                &bytes,
                pg_report.as_ref(),
                &consumers,
            )
            .map_err(|e| format!("{}: {e}", dir.display()))
        });
        match written {
            Ok(()) => eprintln!("wrote {}/results.md and its plots", dir.display()),
            Err(e) => {
                eprintln!("idemkit-bench: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// `Python 3.11.7`, as the interpreter says.
fn python_version(python: &std::path::Path) -> String {
    std::process::Command::new(python)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|e| format!("{} ({e})", python.display()))
}
