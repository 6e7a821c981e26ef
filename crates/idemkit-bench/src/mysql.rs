//! The MySQL (MariaDB) benchmark: `MySqlStore` against the round-trip floor and the
//! hand-written table, in one run, through one pool.
//!
//! - the floor: a primary-key `SELECT` and a one-row `INSERT`, through the same pool;
//! - the hand-written table: a first delivery inserts its key (`INSERT IGNORE`), runs, and
//!   updates the same row with its result (no owner check, lease, fencing or replay);
//! - idemkit's hit (replaying a completed key) and miss (a fresh key: begin, a trivial
//!   action, complete), on a `MySqlStore` built on that pool;
//!
//! at concurrency 1 and 64, rounds interleaved, each case's median round kept. Statements
//! per call are counted by the server: the session's `Questions` status on a connection of
//! its own, before and after 20 calls of a case. The database's CPU per call is the CPU time
//! of the `mariadbd` (or `mysqld`) process over the case, divided by its calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_mysql::MySqlStore;
use sqlx::MySqlPool;
use sqlx::mysql::MySqlPoolOptions;

use crate::postgres::{SqlReport, SqlRow, measure_on, medians};

type Case = &'static str;
const SELECT: Case = "floor: PK SELECT";
const INSERT: Case = "floor: 1-row INSERT";
const HIT: Case = "idemkit MySqlStore hit";
const MISS: Case = "idemkit MySqlStore miss";
/// The same miss on a store that sends every `begin` alone (`MySqlStoreBuilder::coalesce(false)`).
const MISS_ALONE: Case = "idemkit MySqlStore miss, coalescing off";
/// The table a user would write by hand: two statements per first delivery.
const PEER: Case = "hand-written table miss";
const CASES: [Case; 6] = [SELECT, INSERT, HIT, MISS, MISS_ALONE, PEER];
const SERVER: [&str; 2] = ["mariadbd", "mysqld"];

/// What one call of a case needs.
#[derive(Clone)]
struct Bench {
    pool: MySqlPool,
    c: Coordinator<MySqlStore>,
    alone: Coordinator<MySqlStore>,
    op: Operation,
    hits: Arc<Vec<Key>>,
    fresh: Arc<AtomicU64>,
    run_id: u64,
}

impl Bench {
    async fn one(&self, case: Case, i: usize) {
        match case {
            SELECT => {
                let _: (Vec<u8>,) =
                    sqlx::query_as("SELECT v FROM idemkit_bench_floor WHERE id = ?")
                        .bind((i % 1000 + 1) as i64)
                        .fetch_one(&self.pool)
                        .await
                        .expect("select");
            }
            INSERT => {
                sqlx::query("INSERT INTO idemkit_bench_floor_insert (v) VALUES (?)")
                    .bind(&b"\x01"[..])
                    .execute(&self.pool)
                    .await
                    .expect("insert");
            }
            HIT => {
                self.c
                    .call(&self.op, &self.hits[i % self.hits.len()])
                    .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                    .await
                    .expect("hit");
            }
            PEER => {
                let n = self.fresh.fetch_add(1, Ordering::Relaxed);
                let key = format!("peer-{:x}-{n}", self.run_id);
                let inserted = sqlx::query(
                    "INSERT IGNORE INTO idemkit_bench_peer (k, state, expires_us) \
                     VALUES (?, 1, CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED) + 60000000)",
                )
                .bind(&key)
                .execute(&self.pool)
                .await
                .expect("peer insert");
                assert_eq!(inserted.rows_affected(), 1, "a first delivery");
                sqlx::query(
                    "UPDATE idemkit_bench_peer SET state = 2, result = ?, \
                     expires_us = CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED) + 60000000 \
                     WHERE k = ?",
                )
                .bind(&b"1"[..])
                .bind(&key)
                .execute(&self.pool)
                .await
                .expect("peer update");
            }
            _ => {
                let n = self.fresh.fetch_add(1, Ordering::Relaxed);
                let key = Key::new(format!("miss-{:x}-{n}", self.run_id)).expect("valid");
                let c = if case == MISS_ALONE {
                    &self.alone
                } else {
                    &self.c
                };
                c.call(&self.op, &key)
                    .ttl(Duration::from_secs(60))
                    .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                    .await
                    .expect("miss");
            }
        }
    }

    /// The bench's store, tables and replayable keys on `pool`.
    async fn new(pool: MySqlPool) -> Result<Self, String> {
        let err = |e: sqlx::Error| e.to_string();
        for statement in [
            "CREATE TABLE IF NOT EXISTS idemkit_bench_floor (id BIGINT PRIMARY KEY, v VARBINARY(16) NOT NULL) ENGINE = InnoDB",
            "CREATE TABLE IF NOT EXISTS idemkit_bench_floor_insert (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARBINARY(16) NOT NULL) ENGINE = InnoDB",
            "CREATE TABLE IF NOT EXISTS idemkit_bench_peer (k VARBINARY(255) PRIMARY KEY, state SMALLINT NOT NULL, result BLOB, expires_us BIGINT NOT NULL) ENGINE = InnoDB",
            "INSERT IGNORE INTO idemkit_bench_floor SELECT seq, x'01' FROM seq_1_to_1000",
        ] {
            sqlx::query(statement).execute(&pool).await.map_err(err)?;
        }
        let store = MySqlStore::builder()
            .table("idemkit_bench_records")
            .build(pool.clone())
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        let c = Coordinator::new(store);
        let alone = Coordinator::new(
            MySqlStore::builder()
                .table("idemkit_bench_records")
                .coalesce(false)
                .build(pool.clone())
                .map_err(|e| e.to_string())?,
        );
        let op = Operation::new("bench").map_err(|e| e.to_string())?;
        let hits: Vec<Key> = (0..1000)
            .map(|i| Key::new(format!("hit-{i}")).expect("valid"))
            .collect();
        for k in &hits {
            c.call(&op, k)
                .ttl(Duration::from_secs(3600))
                .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(Bench {
            pool,
            c,
            alone,
            op,
            hits: Arc::new(hits),
            fresh: Arc::new(AtomicU64::new(0)),
            run_id: fastrand::u64(..),
        })
    }
}

async fn pool(url: &str, size: u32) -> Result<MySqlPool, String> {
    MySqlPoolOptions::new()
        .max_connections(size)
        .min_connections(size)
        .test_before_acquire(false)
        .connect(url)
        .await
        .map_err(|e| e.to_string())
}

/// Runs every case `rounds` times (interleaved) and keeps each case's median round.
pub(crate) async fn run(url: &str, ops: usize, rounds: usize) -> Result<SqlReport, String> {
    let statements = count_statements(url).await;
    let log = match &statements {
        Ok(_) => "statements counted by the session's Questions status".to_string(),
        Err(e) => format!("statements not counted ({e})"),
    };
    let statements = statements.ok();
    let bench = Bench::new(pool(url, 64).await?).await?;
    let mut all: Vec<Vec<SqlRow>> = Vec::new();
    for _ in 0..rounds.max(1) {
        let mut round = Vec::new();
        for &concurrency in &[1usize, 64] {
            let ops = if concurrency == 1 { ops / 10 } else { ops }.max(100);
            for case in CASES {
                let b = bench.clone();
                let call = move |i: usize| {
                    let b = b.clone();
                    async move { b.one(case, i).await }
                };
                let mut row = measure_on(&SERVER, case, concurrency, ops, call).await?;
                row.statements = statements
                    .as_ref()
                    .and_then(|s| s.iter().find(|(c, _)| *c == case).map(|(_, n)| *n));
                round.push(row);
            }
        }
        all.push(round);
    }
    let rows = medians(&all, SELECT);
    // The bench's misses, removed so that runs do not pile rows up.
    for statement in [
        "DELETE FROM idemkit_bench_records WHERE `key` LIKE 'bench:miss-%'",
        "TRUNCATE idemkit_bench_floor_insert",
        "TRUNCATE idemkit_bench_peer",
    ] {
        let _ = sqlx::query(statement).execute(&bench.pool).await;
    }
    Ok(SqlReport {
        server: "MySQL",
        rounds: rounds.max(1),
        log,
        rows,
    })
}

/// Statements per call of each case: on a one-connection pool, the session's `Questions`
/// (every statement the client sent) before and after 20 calls, less the reading itself.
async fn count_statements(url: &str) -> Result<Vec<(Case, f64)>, String> {
    const CALLS: usize = 20;
    let bench = Bench::new(pool(url, 1).await?).await?;
    let questions = |pool: MySqlPool| async move {
        let (_, n): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Questions'")
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string())?;
        n.parse::<u64>().map_err(|e| e.to_string())
    };
    let mut out = Vec::new();
    for case in CASES {
        // Each statement's first use on the connection prepares it: warm first.
        for i in 0..4 {
            bench.one(case, i).await;
        }
        let before = questions(bench.pool.clone()).await?;
        for i in 0..CALLS {
            bench.one(case, 100 + i).await;
        }
        let after = questions(bench.pool.clone()).await?;
        out.push((case, (after - before - 1) as f64 / CALLS as f64));
    }
    bench.pool.close().await;
    Ok(out)
}

/// The server's version.
pub(crate) async fn server_version(url: &str) -> Result<String, String> {
    let pool = pool(url, 1).await?;
    sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&pool)
        .await
        .map_err(|e| e.to_string())
}
