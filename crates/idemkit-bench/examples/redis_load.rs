//! A fixed load on one Redis server, for counting the server's instructions per call under
//! callgrind (`scripts/redis-instructions`): `N` first deliveries (misses) of distinct keys,
//! by 64 concurrent tasks, with coalescing on or off; or in explicit batches of 64
//! (`Coordinator::prepare`, then each key's call); or `hit`: N replays of one completed key
//! by 64 tasks. Instruction counts do not depend on the
//! machine's speed or load, so they are the before/after figure of a change.
//!
//! ```text
//! cargo run --release -p idemkit-bench --example redis_load -- PORT coalesced|single|batch|hit N
//! ```
//!
//! `REDIS_LOAD_THREADS=1` runs the client on a current-thread runtime (default: 2 threads);
//! `REDIS_LOAD_CONNECTIONS=N` sets the store's connections (default 2); `REDIS_LOAD_PLAIN=0`
//! sends every `begin` as the script (`RedisStoreBuilder::plain_begins`); `REDIS_LOAD_OWN=0`
//! puts the lanes on redis-rs instead of the store's own client (`RedisStoreBuilder::own_client`,
//! on by default). It prints the server's CPU, reads and writes per call (`INFO`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_redis::RedisStore;

async fn miss(c: &Coordinator<RedisStore>, op: &Operation, k: &Key) {
    c.call(op, k)
        .ttl(Duration::from_secs(60))
        .run(|_| async { Ok::<_, std::io::Error>(1u32) })
        .await
        .expect("a first delivery runs");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Client threads: 2 by default; 1 is a current-thread runtime, as `idemkit-bench
    // --workers 1` runs every library.
    let threads: usize = std::env::var("REDIS_LOAD_THREADS").map_or(Ok(2), |t| t.parse())?;
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(load(args))
}

async fn load(args: Vec<String>) -> Result<(), Box<dyn std::error::Error>> {
    let [port, mode, n] = <[String; 3]>::try_from(args)
        .map_err(|_| "usage: redis_load PORT coalesced|single|batch|hit N")?;
    let n: usize = n.parse()?;
    // Connections the store spreads calls over (default: the store's default).
    let connections: usize =
        std::env::var("REDIS_LOAD_CONNECTIONS").map_or(Ok(2), |c| c.parse())?;
    let store = RedisStore::builder()
        .prefix(format!("load-{:x}", fastrand::u64(..)))
        .coalesce(mode != "single" && std::env::var("REDIS_LOAD_COALESCE").as_deref() != Ok("0"))
        .connections(connections)
        .plain_begins(std::env::var("REDIS_LOAD_PLAIN").as_deref() != Ok("0"))
        .own_client(std::env::var("REDIS_LOAD_OWN").as_deref() != Ok("0"))
        .connect(&format!("redis://127.0.0.1:{port}"))
        .await?;
    let c = Coordinator::new(store.clone());
    let op = Operation::new("load")?;
    let cpu_before = server_cpu(port.as_str()).await?;
    let io_before = server_io(port.as_str()).await?;
    let started = tokio::time::Instant::now();
    match mode.as_str() {
        "hit" => {
            // One completed key, replayed by 64 tasks.
            let key = Key::new("hit").expect("valid");
            miss(&c, &op, &key).await;
            let next = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let (c, op, next, key) = (c.clone(), op.clone(), next.clone(), key.clone());
                    tokio::spawn(async move {
                        while next.fetch_add(1, Ordering::Relaxed) < n {
                            miss(&c, &op, &key).await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await?;
            }
        }
        "coalesced" | "single" => {
            let next = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let (c, op, next) = (c.clone(), op.clone(), next.clone());
                    tokio::spawn(async move {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= n {
                                break;
                            }
                            miss(&c, &op, &Key::new(format!("k{i}")).expect("valid")).await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await?;
            }
        }
        "batch" => {
            for start in (0..n).step_by(64) {
                let keys: Vec<Key> = (start..(start + 64).min(n))
                    .map(|i| Key::new(format!("b{i}")).expect("valid"))
                    .collect();
                let prepared = c.prepare(&op, &keys).await;
                let calls = keys.iter().zip(prepared).map(|(k, p)| {
                    let (c, op) = (&c, &op);
                    async move {
                        c.call(op, k)
                            .ttl(Duration::from_secs(60))
                            .prepared(p)
                            .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                            .await
                            .expect("a first delivery runs");
                    }
                });
                futures_util::future::join_all(calls).await;
            }
        }
        other => return Err(format!("unknown mode {other}").into()),
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = server_cpu(port.as_str()).await? - cpu_before;
    let io = server_io(port.as_str()).await?;
    let plain = store.plain_begin_counts();
    println!(
        "{mode}: {n} calls in {secs:.3} s ({:.0}/s), server CPU {:.2} µs a call, {:.3} reads and {:.3} writes a call; plain begins {}, stale stamps {}",
        n as f64 / secs,
        cpu * 1e6 / n as f64,
        (io.0 - io_before.0) as f64 / n as f64,
        (io.1 - io_before.1) as f64 / n as f64,
        plain.sent,
        plain.stale
    );
    Ok(())
}

/// The server's reads and writes so far (`INFO stats`: `total_reads_processed`,
/// `total_writes_processed`): on a VM where a system call is dear, most of a call's server
/// time.
async fn server_io(port: &str) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await?;
    let field = |name: &str| {
        info.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((
        field("total_reads_processed"),
        field("total_writes_processed"),
    ))
}

/// The server's CPU time so far (`INFO cpu`: user and system), in seconds.
async fn server_cpu(port: &str) -> Result<f64, Box<dyn std::error::Error>> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut conn).await?;
    Ok(info
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| *k == "used_cpu_user" || *k == "used_cpu_sys")
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum())
}
