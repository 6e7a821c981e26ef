//! A fixed load on PostgreSQL, for seeing where a miss's time goes on the server: `N` first
//! deliveries (misses) of distinct keys by 64 concurrent tasks through a pool of 64
//! connections, with coalescing on or off, while this program samples `pg_stat_activity`
//! every 10 ms from a connection of its own and prints, at the end, the calls per second and
//! what the busy backends were doing (their wait events; `CPU` when none).
//!
//! ```text
//! cargo run --release -p idemkit-bench --example pg_load -- URL coalesced|single N
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_postgres::PgStore;
use sqlx::postgres::PgPoolOptions;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, mode, n] =
        <[String; 3]>::try_from(args).map_err(|_| "usage: pg_load URL coalesced|single N")?;
    let n: usize = n.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(64)
        .min_connections(64)
        .test_before_acquire(false)
        .connect(&url)
        .await?;
    let store = PgStore::builder()
        .schema("idemkit_bench")
        .coalesce(mode != "single")
        .build(pool.clone())?;
    store.migrate().await?;
    let c = Coordinator::new(store);
    let op = Operation::new("load")?;
    let run = fastrand::u64(..);

    // The sampler: what every active backend of this database (but itself) waits on.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (url, done) = (url.clone(), done.clone());
        tokio::spawn(async move {
            let own = PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await?;
            let mut seen: BTreeMap<String, usize> = BTreeMap::new();
            let mut samples = 0usize;
            while !done.load(Ordering::Relaxed) {
                let rows: Vec<(Option<String>, Option<String>)> = sqlx::query_as(
                    "SELECT wait_event_type, wait_event FROM pg_stat_activity \
                     WHERE datname = current_database() AND state = 'active' \
                       AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                )
                .fetch_all(&own)
                .await?;
                for (kind, event) in rows {
                    let name = match (kind, event) {
                        (Some(k), Some(e)) => format!("{k}:{e}"),
                        _ => "CPU".to_string(),
                    };
                    *seen.entry(name).or_default() += 1;
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, sqlx::Error>((samples, seen))
        })
    };

    let next = Arc::new(AtomicUsize::new(0));
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (c, op, next) = (c.clone(), op.clone(), next.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    let k = Key::new(format!("l{run:x}-{}", fastrand::u64(..))).expect("valid");
                    c.call(&op, &k)
                        .ttl(Duration::from_secs(60))
                        .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                        .await
                        .expect("a first delivery runs");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    let elapsed = start.elapsed();
    done.store(true, Ordering::Relaxed);
    let (samples, seen) = sampler.await??;
    println!(
        "{mode}: {n} misses in {:.2} s: {:.0}/s",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64()
    );
    let total: usize = seen.values().sum();
    println!(
        "{samples} samples; busy backends per sample {:.1}:",
        total as f64 / samples.max(1) as f64
    );
    let mut by: Vec<_> = seen.into_iter().collect();
    by.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    for (name, count) in by {
        println!(
            "  {name:<32} {:>5.1}%",
            100.0 * count as f64 / total.max(1) as f64
        );
    }
    sqlx::query("DELETE FROM idemkit_bench.idemkit_records WHERE key LIKE 'load:%'")
        .execute(&pool)
        .await?;
    Ok(())
}
