//! The PostgreSQL benchmark: `PgStore` against the round-trip floor, in one run, through one
//! pool.
//!
//! - the floor: a primary-key `SELECT` and a single-row `INSERT`, through the same pool;
//! - idemkit's hit (replaying a completed key) and miss (fresh key: begin, a trivial action,
//!   complete), on a `PgStore` built on that pool;
//!
//! at concurrency 1 and 64. Statements per call are counted by the server: a connection of
//! its own logs every statement (`SET log_statement = 'all'`, as a superuser) and the
//! benchmark counts that backend's `execute`/`statement` lines in the server log. The
//! database's CPU per call is the CPU time of every `postgres` process (from `/proc`) over
//! the case, divided by its calls.

use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_postgres::PgStore;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// One measured case.
#[derive(Debug, Clone)]
pub(crate) struct SqlRow {
    pub(crate) case: &'static str,
    pub(crate) concurrency: usize,
    pub(crate) ops_per_sec: f64,
    pub(crate) p50: Duration,
    p99: Duration,
    /// Statements per call, from the server log (`None` when the log cannot be read).
    pub(crate) statements: Option<f64>,
    /// CPU of all `postgres` processes per call, µs.
    pub(crate) db_cpu_usec: f64,
    /// Round trips per call relative to the floor `SELECT` at the same concurrency (latency
    /// ratio of the medians).
    pub(crate) vs_floor: f64,
}

/// A SQL server's report (PostgreSQL's, MySQL's): rows, each the median of the rounds.
#[derive(Debug, Clone)]
pub(crate) struct SqlReport {
    /// The server, as the table's heading names it.
    pub(crate) server: &'static str,
    pub(crate) rounds: usize,
    /// How statements were counted.
    pub(crate) log: String,
    pub(crate) rows: Vec<SqlRow>,
}

type Case = &'static str;
const SELECT: Case = "floor: PK SELECT";
const INSERT: Case = "floor: 1-row INSERT";
const HIT: Case = "idemkit PgStore hit";
const MISS: Case = "idemkit PgStore miss";
/// The same miss on a store that sends every call alone (`PgStoreBuilder::coalesce(false)`):
/// what coalescing changes, in the same run.
const MISS_ALONE: Case = "idemkit PgStore miss, coalescing off";
/// The table a user would write by hand: a first delivery inserts its key (`ON CONFLICT DO
/// NOTHING`), runs, and updates the same row with its result. No owner check, no lease, no
/// fencing, no replay path: the floor of two statements per first delivery.
const PEER: Case = "hand-written table miss";

/// The hand-written peer's first delivery of `key`.
async fn peer_miss(pool: &PgPool, key: &str) {
    let inserted = sqlx::query(
        "INSERT INTO idemkit_bench.peer (key, state, expires_at) \
         VALUES ($1, 1, now() + interval '60 seconds') ON CONFLICT DO NOTHING",
    )
    .bind(key)
    .execute(pool)
    .await
    .expect("peer insert");
    assert_eq!(inserted.rows_affected(), 1, "a first delivery");
    sqlx::query(
        "UPDATE idemkit_bench.peer SET state = 2, result = $2, \
         expires_at = now() + interval '60 seconds' WHERE key = $1",
    )
    .bind(key)
    .bind(&b"1"[..])
    .execute(pool)
    .await
    .expect("peer update");
}

/// The bench's store on `pool`, sending every call alone.
fn without_coalescing(pool: &PgPool) -> Result<Coordinator<PgStore>, String> {
    let store = PgStore::builder()
        .schema("idemkit_bench")
        .coalesce(false)
        .build(pool.clone())
        .map_err(|e| e.to_string())?;
    Ok(Coordinator::new(store))
}

/// Runs every case `rounds` times (interleaved) and keeps each case's median round.
pub(crate) async fn run(url: &str, ops: usize, rounds: usize) -> Result<SqlReport, String> {
    let err = |e: sqlx::Error| e.to_string();
    let pool = PgPoolOptions::new()
        .max_connections(64)
        .min_connections(64)
        .test_before_acquire(false)
        .connect(url)
        .await
        .map_err(err)?;
    sqlx::raw_sql(
        "CREATE SCHEMA IF NOT EXISTS idemkit_bench;
         CREATE TABLE IF NOT EXISTS idemkit_bench.floor (id bigint PRIMARY KEY, v bytea NOT NULL);
         CREATE TABLE IF NOT EXISTS idemkit_bench.floor_insert (id bigserial PRIMARY KEY, v bytea NOT NULL);
         CREATE TABLE IF NOT EXISTS idemkit_bench.peer (key text COLLATE \"C\" PRIMARY KEY, state smallint NOT NULL, result bytea, expires_at timestamptz NOT NULL);
         INSERT INTO idemkit_bench.floor SELECT g, '\\x01' FROM generate_series(1, 1000) g ON CONFLICT DO NOTHING;",
    )
    .execute(&pool)
    .await
    .map_err(err)?;
    let store = PgStore::builder()
        .schema("idemkit_bench")
        .build(pool.clone())
        .map_err(|e| e.to_string())?;
    store.migrate().await.map_err(|e| e.to_string())?;
    let c = Coordinator::new(store);
    let alone = without_coalescing(&pool)?;
    let op = Operation::new("bench").map_err(|e| e.to_string())?;
    // Keys to replay: completed once, before the timed runs.
    let hits: Arc<Vec<Key>> = Arc::new(
        (0..1000)
            .map(|i| Key::new(format!("hit-{i}")).expect("valid"))
            .collect(),
    );
    for k in hits.iter() {
        c.call(&op, k)
            .ttl(Duration::from_secs(3600))
            .run(|_| async { Ok::<_, std::io::Error>(1u32) })
            .await
            .map_err(|e| e.to_string())?;
    }
    let fresh = Arc::new(AtomicU64::new(0));
    let run_id = fastrand::u64(..);

    let statements = count_statements(url, &op, run_id).await;
    let log = match &statements {
        Ok((path, _)) => format!("statements counted in the server log {path}"),
        Err(e) => format!("statements not counted ({e})"),
    };
    let statements = statements.ok().map(|(_, s)| s);

    let mut all: Vec<Vec<SqlRow>> = Vec::new();
    for _ in 0..rounds.max(1) {
        let mut round = Vec::new();
        for &concurrency in &[1usize, 64] {
            let ops = if concurrency == 1 { ops / 10 } else { ops }.max(100);
            for case in [SELECT, INSERT, HIT, MISS, MISS_ALONE, PEER] {
                let (pool, c, op, hits, fresh) = (
                    pool.clone(),
                    if case == MISS_ALONE { &alone } else { &c }.clone(),
                    op.clone(),
                    hits.clone(),
                    fresh.clone(),
                );
                let call = move |i: usize| {
                    let (pool, c, op, hits, fresh) = (
                        pool.clone(),
                        c.clone(),
                        op.clone(),
                        hits.clone(),
                        fresh.clone(),
                    );
                    async move {
                        match case {
                            SELECT => {
                                let _: (Vec<u8>,) = sqlx::query_as(
                                    "SELECT v FROM idemkit_bench.floor WHERE id = $1",
                                )
                                .bind((i % 1000 + 1) as i64)
                                .fetch_one(&pool)
                                .await
                                .expect("select");
                            }
                            INSERT => {
                                sqlx::query(
                                    "INSERT INTO idemkit_bench.floor_insert (v) VALUES ($1)",
                                )
                                .bind(&b"\x01"[..])
                                .execute(&pool)
                                .await
                                .expect("insert");
                            }
                            HIT => {
                                c.call(&op, &hits[i % hits.len()])
                                    .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                                    .await
                                    .expect("hit");
                            }
                            PEER => {
                                let n = fresh.fetch_add(1, Ordering::Relaxed);
                                peer_miss(&pool, &format!("peer-{run_id:x}-{n}")).await;
                            }
                            _ => {
                                let n = fresh.fetch_add(1, Ordering::Relaxed);
                                let key = Key::new(format!("miss-{run_id:x}-{n}")).expect("valid");
                                c.call(&op, &key)
                                    .ttl(Duration::from_secs(60))
                                    .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                                    .await
                                    .expect("miss");
                            }
                        }
                    }
                };
                let mut row = measure(case, concurrency, ops, call).await?;
                row.statements = statements
                    .as_ref()
                    .and_then(|s| s.iter().find(|(c, _)| *c == case).map(|(_, n)| *n));
                round.push(row);
            }
        }
        all.push(round);
    }
    let rows = medians(&all, SELECT);
    // The bench's misses, purged so that runs do not pile rows up.
    let _ = sqlx::query(
        "DELETE FROM idemkit_bench.idemkit_records WHERE key LIKE 'bench\\_miss-%' ESCAPE '\\'",
    )
    .execute(&pool)
    .await;
    let _ = sqlx::query("TRUNCATE idemkit_bench.floor_insert, idemkit_bench.peer")
        .execute(&pool)
        .await;
    Ok(SqlReport {
        server: "PostgreSQL",
        rounds: rounds.max(1),
        log,
        rows,
    })
}

/// Each case's median round, by throughput, with its median latency against the floor
/// case's (`floor`) at the same concurrency.
pub(crate) fn medians(all: &[Vec<SqlRow>], floor: &str) -> Vec<SqlRow> {
    let mut rows: Vec<SqlRow> = (0..all[0].len())
        .map(|i| {
            let mut of: Vec<SqlRow> = all.iter().map(|r| r[i].clone()).collect();
            of.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
            of[of.len() / 2].clone()
        })
        .collect();
    let floors: Vec<(usize, Duration)> = rows
        .iter()
        .filter(|r| r.case == floor)
        .map(|r| (r.concurrency, r.p50))
        .collect();
    for r in &mut rows {
        if let Some((_, f)) = floors.iter().find(|(c, _)| *c == r.concurrency) {
            r.vs_floor = r.p50.as_secs_f64() / f.as_secs_f64();
        }
    }
    rows
}

async fn measure<F, Fut>(
    case: &'static str,
    concurrency: usize,
    ops: usize,
    call: F,
) -> Result<SqlRow, String>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    measure_on(&["postgres"], case, concurrency, ops, call).await
}

/// One case at one concurrency: every connection warmed first, then `ops` calls timed, and
/// the CPU of the server's processes (named `server`) per call.
pub(crate) async fn measure_on<F, Fut>(
    server: &[&str],
    case: &'static str,
    concurrency: usize,
    ops: usize,
    call: F,
) -> Result<SqlRow, String>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    // Warm every connection's prepared statements first.
    let warm: Vec<_> = (0..concurrency)
        .map(|t| {
            let call = call.clone();
            tokio::spawn(async move {
                for i in 0..4 {
                    call(t * 4 + i).await;
                }
            })
        })
        .collect();
    for w in warm {
        w.await.map_err(|e| e.to_string())?;
    }
    let cpu0 = server_cpu(server);
    let (lat, elapsed) = crate::measure::timed(concurrency, ops, call).await?;
    let cpu = server_cpu(server) - cpu0;
    let calls = lat.len() as f64;
    Ok(SqlRow {
        case,
        concurrency,
        ops_per_sec: calls / elapsed.as_secs_f64(),
        p50: lat[lat.len() / 2],
        p99: lat[lat.len() * 99 / 100],
        statements: None,
        db_cpu_usec: cpu * 1e6 / calls,
        vs_floor: f64::NAN,
    })
}

/// CPU seconds of every process named one of `names` (user + system), from `/proc`.
fn server_cpu(names: &[&str]) -> f64 {
    let ticks = 100.0; // USER_HZ on Linux
    let mut total = 0u64;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        if std::fs::read_to_string(path.join("comm")).is_ok_and(|c| names.contains(&c.trim()))
            && let Ok(stat) = std::fs::read_to_string(path.join("stat"))
            && let Some(rest) = stat.rsplit(')').next()
        {
            // Fields after the command: state is 3; utime 14, stime 15 (1-based in proc(5)).
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ut: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
            let st: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
            total += ut + st;
        }
    }
    total as f64 / ticks
}

/// Statements per call for each case, counted in the server log: a one-connection pool whose
/// backend logs every statement runs 20 calls of each case.
async fn count_statements(
    url: &str,
    op: &Operation,
    run_id: u64,
) -> Result<(String, Vec<(Case, f64)>), String> {
    let err = |e: sqlx::Error| e.to_string();
    let pool: PgPool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .test_before_acquire(false)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET log_statement = 'all'")
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .connect(url)
        .await
        .map_err(err)?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .map_err(err)?;
    let path = log_path(&pool).await?;
    let store = PgStore::builder()
        .schema("idemkit_bench")
        .build(pool.clone())
        .map_err(|e| e.to_string())?;
    let c = Coordinator::new(store);
    let alone = without_coalescing(&pool)?;
    let mut out = Vec::new();
    const CALLS: usize = 20;
    for case in [SELECT, INSERT, HIT, MISS, MISS_ALONE, PEER] {
        // Prepare first: a statement's first use on a connection is parsed separately; and
        // the store's first statement follows what recent calls met (`Guesser` in idemkit_sql::guess, used by
        // idemkit-postgres): 16 calls of the case settle it, as in the timed runs.
        let c = if case == MISS_ALONE { &alone } else { &c };
        for i in 0..16 {
            one(&pool, c, op, case, run_id, i).await;
        }
        let before = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
        for i in 0..CALLS {
            one(&pool, c, op, case, run_id, 100 + i).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut file = std::fs::File::open(&path).map_err(|e| e.to_string())?;
        file.seek(SeekFrom::Start(before))
            .map_err(|e| e.to_string())?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(|e| e.to_string())?;
        let tag = format!("[{pid}]");
        let n = text
            .lines()
            .filter(|l| {
                l.contains(&tag) && (l.contains("LOG:  execute") || l.contains("LOG:  statement:"))
            })
            .count();
        out.push((case, n as f64 / CALLS as f64));
    }
    pool.close().await;
    Ok((path, out))
}

async fn one(
    pool: &PgPool,
    c: &Coordinator<PgStore>,
    op: &Operation,
    case: Case,
    run_id: u64,
    i: usize,
) {
    match case {
        SELECT => {
            let _: (Vec<u8>,) = sqlx::query_as("SELECT v FROM idemkit_bench.floor WHERE id = $1")
                .bind((i % 1000 + 1) as i64)
                .fetch_one(pool)
                .await
                .expect("select");
        }
        INSERT => {
            sqlx::query("INSERT INTO idemkit_bench.floor_insert (v) VALUES ($1)")
                .bind(&b"\x01"[..])
                .execute(pool)
                .await
                .expect("insert");
        }
        HIT => {
            let key = Key::new(format!("hit-{}", i % 1000)).expect("valid");
            c.call(op, &key)
                .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                .await
                .expect("hit");
        }
        PEER => peer_miss(pool, &format!("peer-{run_id:x}-log-{i}")).await,
        _ => {
            let alone = if case == MISS_ALONE { "alone-" } else { "" };
            let key = Key::new(format!("miss-{run_id:x}-log-{alone}{i}")).expect("valid");
            c.call(op, &key)
                .ttl(Duration::from_secs(60))
                .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                .await
                .expect("miss");
        }
    }
}

/// The server's log file: `pg_current_logfile()` with the logging collector, else Debian's
/// `/var/log/postgresql/postgresql-<major>-<cluster>.log`.
async fn log_path(pool: &PgPool) -> Result<String, String> {
    let err = |e: sqlx::Error| e.to_string();
    let current: Option<String> = sqlx::query_scalar("SELECT pg_current_logfile()")
        .fetch_one(pool)
        .await
        .map_err(err)?;
    let data_dir: String = sqlx::query_scalar("SHOW data_directory")
        .fetch_one(pool)
        .await
        .map_err(err)?;
    if let Some(p) = current {
        let full = if p.starts_with('/') {
            p
        } else {
            format!("{data_dir}/{p}")
        };
        return Ok(full);
    }
    let cluster: String = sqlx::query_scalar("SHOW cluster_name")
        .fetch_one(pool)
        .await
        .map_err(err)?;
    let path = format!(
        "/var/log/postgresql/postgresql-{}.log",
        cluster.replace('/', "-")
    );
    if std::path::Path::new(&path).exists() {
        Ok(path)
    } else {
        Err(format!("no readable server log (tried {path})"))
    }
}

impl SqlReport {
    /// The row of `case` at `concurrency`.
    pub(crate) fn row(&self, case: &str, concurrency: usize) -> Option<&SqlRow> {
        self.rows
            .iter()
            .find(|r| r.case == case && r.concurrency == concurrency)
    }
}

impl std::fmt::Display for SqlReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{}, one pool of 64 connections; each row the median of {} round(s); {}",
            self.server, self.rounds, self.log
        )?;
        writeln!(
            f,
            "{:<37}{:>5}{:>12}{:>10}{:>10}{:>12}{:>13}{:>10}",
            "case", "conc", "ops/s", "p50 µs", "p99 µs", "stmts/call", "db cpu µs", "p50/floor"
        )?;
        for r in &self.rows {
            let stmts = r
                .statements
                .map_or("n/a".to_string(), |s| format!("{s:.2}"));
            writeln!(
                f,
                "{:<37}{:>5}{:>12.0}{:>10.1}{:>10.1}{:>12}{:>13.1}{:>10.2}",
                r.case,
                r.concurrency,
                r.ops_per_sec,
                r.p50.as_secs_f64() * 1e6,
                r.p99.as_secs_f64() * 1e6,
                stmts,
                r.db_cpu_usec,
                r.vs_floor
            )?;
        }
        Ok(())
    }
}

/// The server's `server_version`.
///
/// # Errors
///
/// The server cannot be reached.
pub(crate) async fn server_version(url: &str) -> Result<String, String> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| e.to_string())
}
