//! A fixed load on one Redis server, for counting the server's instructions per call under
//! callgrind (`scripts/redis-instructions`): `N` first deliveries (misses) of distinct keys,
//! by 64 concurrent tasks, with coalescing on or off; or in explicit batches of 64
//! (`Coordinator::prepare`, then each key's call). Instruction counts do not depend on the
//! machine's speed or load, so they are the before/after figure of a change.
//!
//! ```text
//! cargo run --release -p idemkit-bench --example redis_load -- PORT coalesced|single|batch N
//! ```

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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port, mode, n] = <[String; 3]>::try_from(args)
        .map_err(|_| "usage: redis_load PORT coalesced|single|batch N")?;
    let n: usize = n.parse()?;
    let store = RedisStore::builder()
        .prefix(format!("load-{:x}", fastrand::u64(..)))
        .coalesce(mode != "single")
        .connect(&format!("redis://127.0.0.1:{port}"))
        .await?;
    let c = Coordinator::new(store);
    let op = Operation::new("load")?;
    let started = tokio::time::Instant::now();
    match mode.as_str() {
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
    println!("{mode}: {n} misses in {secs:.3} s");
    Ok(())
}
