//! `idemkit`: the seed's demo, and the operator's tools (`inspect`, `list`, `release`,
//! `purge`, `stats`, and `serve` for a status page with `/metrics`).
//!
//! Run with: `cargo run --release --bin idemkit -- demo`

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};

mod listing;
mod ops;
mod serve;

use clap::{Parser, Subcommand};
use idemkit_core::MemoryStore;

#[derive(Debug, Parser)]
#[command(
    name = "idemkit",
    version,
    about = "Effects that happen once under at-least-once delivery"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the seed's three experiments and the consumer experiment, and print their tables.
    Demo {
        /// Where records live: `memory` (in-process), a `redis://` URL or a `postgres://` URL.
        /// On Redis each run uses its own key prefix, and its records expire with their TTL
        /// (one hour); on PostgreSQL each run uses its own schema, dropped at the end.
        #[arg(long, default_value = "memory")]
        store: String,
    },
    /// Show one record: state, owner, fencing token, age, time left, fingerprint, result.
    /// Exit codes: 0 shown, 2 bad arguments, 3 no live record, 4 store down, 5 not a record
    /// of ours, 7 other store error.
    Inspect {
        #[command(flatten)]
        store: ops::StoreArgs,
        #[command(flatten)]
        record: ops::RecordArgs,
    },
    /// Release a stuck reservation (an owner killed mid-action), so the next delivery runs
    /// at once instead of after the lease. A completed record is refused (exit 6) unless
    /// `--force`, which removes it if it is still the record read (exit 9 if it changed
    /// meanwhile: nothing removed). Other exit codes as for `inspect`.
    Release {
        #[command(flatten)]
        store: ops::StoreArgs,
        #[command(flatten)]
        record: ops::RecordArgs,
        /// Also remove a completed record (its effect may then run again).
        #[arg(long)]
        force: bool,
    },
    /// List records, a bounded page at a time (Redis `SCAN`, node by node on a Cluster;
    /// keyset pages on PostgreSQL): state, age, time left, fencing token, size, operation,
    /// scope, key. Exit codes as for `inspect`.
    List {
        #[command(flatten)]
        store: ops::StoreArgs,
        #[command(flatten)]
        filter: listing::Filter,
        /// Show at most this many records.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print one JSON array instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Remove the records that match, after a confirmation (or `--yes`), in bounded
    /// batches with a progress bar and a final count. Each record is removed only if it is
    /// still the one listed (same fencing token). Exit 6 when not confirmed.
    Purge {
        #[command(flatten)]
        store: ops::StoreArgs,
        #[command(flatten)]
        args: listing::PurgeArgs,
    },
    /// Records per operation and state, bytes, completed records expiring soon, the oldest
    /// reservation; on Redis the eviction policy (exit 8 unless `noeviction`), on PostgreSQL
    /// the table's size.
    Stats {
        #[command(flatten)]
        store: ops::StoreArgs,
        /// "Expiring soon" means within this: `90s`, `15m`, `2h`.
        #[arg(long, default_value = "5m", value_parser = listing::parse_duration)]
        soon: std::time::Duration,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Serve a status page (in-flight reservations oldest first, stats, and with
    /// `--allow-writes` release and purge behind a confirmation) and `/metrics` for
    /// Prometheus. Bound to loopback unless `--allow-remote`.
    Serve {
        #[command(flatten)]
        store: ops::StoreArgs,
        #[command(flatten)]
        args: serve::ServeArgs,
    },
}

/// A run id component: distinct demo runs must not share keys.
fn nanos() -> u64 {
    #[allow(clippy::disallowed_methods)] // an identifier, not a deadline
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo runs its workers on two threads.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idemkit: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Demo { store } => match store.as_str() {
            "memory" => runtime.block_on(async {
                let report = idemkit_cli::demo::run(MemoryStore::new).await;
                let db = idemkit_cli::consumer::MemoryDb::default();
                let consumer = idemkit_cli::consumer::run(&db, MemoryStore::new).await;
                print!("{report}\n{consumer}");
                ExitCode::SUCCESS
            }),
            url if url.starts_with("redis://") || url.starts_with("rediss://") => {
                runtime.block_on(demo_on_redis(url))
            }
            url if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                runtime.block_on(demo_on_postgres(url))
            }
            other => {
                eprintln!(
                    "idemkit: unsupported store {other:?}; supported: memory, redis://HOST:PORT, postgres://USER@HOST/DB"
                );
                ExitCode::from(2)
            }
        },
        Command::Inspect { store, record } => {
            runtime.block_on(ops::inspect(&store, &record)).into()
        }
        Command::Release {
            store,
            record,
            force,
        } => runtime
            .block_on(ops::release(&store, &record, force))
            .into(),
        Command::List {
            store,
            filter,
            limit,
            json,
        } => runtime
            .block_on(listing::list(&store, &filter, limit, json))
            .into(),
        Command::Purge { store, args } => runtime.block_on(listing::purge(&store, &args)).into(),
        Command::Stats { store, soon, json } => {
            runtime.block_on(listing::stats(&store, soon, json)).into()
        }
        Command::Serve { store, args } => runtime.block_on(serve::serve(&store, &args)).into(),
    }
}

/// A store per experiment row: the same server, a key prefix per row.
async fn demo_on_redis(url: &str) -> ExitCode {
    let store = match idemkit_redis::RedisStore::connect(url).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("idemkit: cannot connect to {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let run = format!("idemkit-demo:{:016x}", std::process::id() as u64 ^ nanos());
    let row = AtomicUsize::new(0);
    let next = || {
        let n = row.fetch_add(1, Ordering::Relaxed);
        store.with_prefix(format!("{run}:{n}"))
    };
    let report = idemkit_cli::demo::run(&next).await;
    let db = idemkit_cli::consumer::MemoryDb::default();
    let consumer = idemkit_cli::consumer::run(&db, &next).await;
    print!("{report}\n{consumer}");
    ExitCode::SUCCESS
}

/// A table per experiment row, in a schema of this run's own (dropped at the end); experiment
/// 4's ledger and inbox are real tables there.
async fn demo_on_postgres(url: &str) -> ExitCode {
    use idemkit_postgres::PgStore;
    let pool = match sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .test_before_acquire(false)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect(url)
        .await
    {
        Ok(pool) => pool,
        Err(e) => {
            eprintln!("idemkit: cannot connect to {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let schema = format!("idemkit_demo_{:016x}", std::process::id() as u64 ^ nanos());
    let result: Result<_, Box<dyn std::error::Error>> = async {
        // The demo's rows (7) and experiment 4's handlers (5), each on its own table.
        let mut stores = Vec::new();
        for n in 0..12 {
            let store = PgStore::builder()
                .schema(&schema)?
                .table(&format!("records_{n}"))?
                .build(pool.clone());
            store.migrate().await?;
            stores.push(store);
        }
        let db = idemkit_cli::postgres::PgDb::create(pool.clone(), &schema).await?;
        let row = AtomicUsize::new(0);
        let next = || stores[row.fetch_add(1, Ordering::Relaxed) % stores.len()].clone();
        let report = idemkit_cli::demo::run(&next).await;
        let consumer = idemkit_cli::consumer::run(&db, &next).await;
        Ok((report, consumer))
    }
    .await;
    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(&pool)
        .await;
    match result {
        Ok((report, consumer)) => {
            print!("{report}\n{consumer}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idemkit: the demo failed on {url}: {e}");
            ExitCode::FAILURE
        }
    }
}
