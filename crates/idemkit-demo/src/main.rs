//! `idemkit-demo`: the seed's experiments, reproduced, and their tables printed: the queue
//! with and without idemkit (one mail against two), wait against raise, the "two, two, one"
//! of crashes mid-action, the consumer's ledger row and email (experiment 4), and one effect
//! key across three hops (experiment 5).
//!
//! Run with: `cargo run --release --bin idemkit-demo` (add `-- --store redis://...`,
//! `-- --store postgres://...` or `-- --store mysql://...` to run it on a server).

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Parser;
use idemkit_core::MemoryStore;

/// Run the seed's three experiments and the consumer experiment, and print their tables.
#[derive(Debug, Parser)]
#[command(name = "idemkit-demo", version)]
struct Cli {
    /// Where records live: `memory` (in-process), a `redis://`, a `postgres://` or a
    /// `mysql://` URL (MySQL or MariaDB). On Redis each run uses its own key prefix, and its
    /// records expire with their TTL (one hour); on PostgreSQL each run uses its own schema,
    /// dropped at the end; on MySQL its own tables in the URL's database, dropped at the end.
    #[arg(long, default_value = "memory")]
    store: String,
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
            eprintln!("idemkit-demo: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.store.as_str() {
        "memory" => runtime.block_on(async {
            let report = idemkit_demo::demo::run(MemoryStore::new).await;
            let db = idemkit_demo::consumer::MemoryDb::default();
            let consumer = idemkit_demo::consumer::run(&db, MemoryStore::new).await;
            let chain = idemkit_demo::chain::run(MemoryStore::new).await;
            print!("{report}\n{consumer}\n{chain}");
            ExitCode::SUCCESS
        }),
        url if url.starts_with("redis://") || url.starts_with("rediss://") => {
            runtime.block_on(demo_on_redis(url))
        }
        url if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            runtime.block_on(demo_on_postgres(url))
        }
        url if url.starts_with("mysql://") || url.starts_with("mariadb://") => {
            runtime.block_on(demo_on_mysql(url))
        }
        other => {
            eprintln!(
                "idemkit-demo: unsupported store {other:?}; supported: memory, redis://HOST:PORT, postgres://USER@HOST/DB, mysql://USER@HOST/DB"
            );
            ExitCode::from(2)
        }
    }
}

/// A store per experiment row: the same server, a key prefix per row.
async fn demo_on_redis(url: &str) -> ExitCode {
    let store = match idemkit_redis::RedisStore::connect(url).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("idemkit-demo: cannot connect to {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let run = format!("idemkit-demo:{:016x}", std::process::id() as u64 ^ nanos());
    let row = AtomicUsize::new(0);
    let next = || {
        let n = row.fetch_add(1, Ordering::Relaxed);
        store.with_prefix(format!("{run}:{n}"))
    };
    let report = idemkit_demo::demo::run(&next).await;
    let db = idemkit_demo::consumer::MemoryDb::default();
    let consumer = idemkit_demo::consumer::run(&db, &next).await;
    let chain = idemkit_demo::chain::run(&next).await;
    print!("{report}\n{consumer}\n{chain}");
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
            eprintln!("idemkit-demo: cannot connect to {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let schema = format!("idemkit_demo_{:016x}", std::process::id() as u64 ^ nanos());
    let result: Result<_, Box<dyn std::error::Error>> = async {
        // The demo's rows (7), experiment 4's handlers (5) and experiment 5's rows (3, three
        // stores each), each on its own table.
        let mut stores = Vec::new();
        for n in 0..21 {
            let store = PgStore::builder()
                .schema(&schema)
                .table(&format!("records_{n}"))
                .build(pool.clone())?;
            store.migrate().await?;
            stores.push(store);
        }
        let db = idemkit_demo::postgres::PgDb::create(pool.clone(), &schema).await?;
        let row = AtomicUsize::new(0);
        let next = || stores[row.fetch_add(1, Ordering::Relaxed) % stores.len()].clone();
        let report = idemkit_demo::demo::run(&next).await;
        let consumer = idemkit_demo::consumer::run(&db, &next).await;
        let chain = idemkit_demo::chain::run(&next).await;
        Ok((report, consumer, chain))
    }
    .await;
    let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(&pool)
        .await;
    match result {
        Ok((report, consumer, chain)) => {
            print!("{report}\n{consumer}\n{chain}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idemkit-demo: the demo failed on {url}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A table per experiment row, named after this run in the URL's database (dropped at the
/// end); experiment 4's ledger and inbox are real tables there.
async fn demo_on_mysql(url: &str) -> ExitCode {
    use idemkit_mysql::MySqlStore;
    let pool = match sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(8)
        .test_before_acquire(false)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect(url)
        .await
    {
        Ok(pool) => pool,
        Err(e) => {
            eprintln!("idemkit-demo: cannot connect to {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let run = format!("idemkit_demo_{:016x}", std::process::id() as u64 ^ nanos());
    let mut tables = Vec::new();
    let result: Result<_, Box<dyn std::error::Error>> = async {
        // The demo's rows (7), experiment 4's handlers (5) and experiment 5's rows (3, three
        // stores each), each on its own table.
        let mut stores = Vec::new();
        for n in 0..21 {
            let table = format!("{run}_r{n}");
            let store = MySqlStore::builder().table(&table).build(pool.clone())?;
            tables.push(format!("{table}_fencing"));
            tables.push(table);
            store.migrate().await?;
            stores.push(store);
        }
        let db = idemkit_demo::mysql::MySqlDb::create(pool.clone(), &run).await?;
        tables.extend(db.tables().map(str::to_owned));
        let row = AtomicUsize::new(0);
        let next = || stores[row.fetch_add(1, Ordering::Relaxed) % stores.len()].clone();
        let report = idemkit_demo::demo::run(&next).await;
        let consumer = idemkit_demo::consumer::run(&db, &next).await;
        let chain = idemkit_demo::chain::run(&next).await;
        Ok((report, consumer, chain))
    }
    .await;
    for table in &tables {
        let _ = sqlx::query(&format!("DROP TABLE IF EXISTS `{table}`"))
            .execute(&pool)
            .await;
    }
    match result {
        Ok((report, consumer, chain)) => {
            print!("{report}\n{consumer}\n{chain}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idemkit-demo: the demo failed on {url}: {e}");
            ExitCode::FAILURE
        }
    }
}
