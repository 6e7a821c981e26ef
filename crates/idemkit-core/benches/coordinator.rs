//! The coordinator on `MemoryStore`: hit (replay) and miss (reserve, run, complete), single
//! task and 64 contending tasks.
//!
//! Run with: `cargo bench -p idemkit-core --bench coordinator`
//!
//! The action is trivial (returns a short string), so the figures are idemkit's own cost per
//! call: key encoding, the store's phases, the codec, metrics and tracing (no recorder and no
//! subscriber installed, as in a service that has not enabled them).
#![allow(missing_docs)]
// A benchmark measures wall time on purpose.
#![allow(clippy::disallowed_methods)]

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use idemkit_core::{Coordinator, Key, MemoryStore, Operation};

const TASKS: u64 = 64;
/// Miss keys expire quickly so the store's sweep keeps the benchmark's memory flat.
const MISS_TTL: Duration = Duration::from_millis(10);

async fn action() -> Result<String, Infallible> {
    Ok("em_1".to_string())
}

/// A coordinator on a fresh `MemoryStore` whose hit key is already completed.
fn setup(rt: &tokio::runtime::Runtime) -> (Coordinator<MemoryStore>, Operation, Key) {
    let coordinator = Coordinator::new(MemoryStore::new());
    let op = Operation::new("mail.invoice").unwrap();
    let hit_key = Key::new("order-9.invoice").unwrap();
    rt.block_on(coordinator.call(&op, &hit_key).run(|_| action()))
        .unwrap();
    (coordinator, op, hit_key)
}

fn single(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (coordinator, op, hit_key) = setup(&rt);

    let mut g = c.benchmark_group("single");
    g.bench_function("hit", |b| {
        b.to_async(&rt).iter(|| async {
            let out = coordinator
                .call(&op, &hit_key)
                .run(|_| action())
                .await
                .unwrap();
            black_box(out);
        })
    });
    let n = AtomicU64::new(0);
    g.bench_function("miss", |b| {
        b.to_async(&rt).iter(|| async {
            let i = n.fetch_add(1, Ordering::Relaxed);
            let key = Key::new(format!("order-{i}.invoice")).unwrap();
            let out = coordinator
                .call(&op, &key)
                .ttl(MISS_TTL)
                .run(|_| action())
                .await
                .unwrap();
            black_box(out);
        })
    });
    g.finish();
}

/// 64 tasks on a 2-worker runtime; reports time per call (total time / calls).
fn contended(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let (coordinator, op, hit_key) = setup(&rt);
    let next = Arc::new(AtomicU64::new(0));

    let mut g = c.benchmark_group("contended64");
    for miss in [false, true] {
        g.bench_function(if miss { "miss" } else { "hit" }, |b| {
            b.iter_custom(|iters| {
                let per_task = iters.div_ceil(TASKS);
                rt.block_on(async {
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..TASKS)
                        .map(|_| {
                            let (coordinator, op, hit_key, next) = (
                                coordinator.clone(),
                                op.clone(),
                                hit_key.clone(),
                                next.clone(),
                            );
                            tokio::spawn(async move {
                                for _ in 0..per_task {
                                    if miss {
                                        let i = next.fetch_add(1, Ordering::Relaxed);
                                        let key = Key::new(format!("order-{i}.invoice")).unwrap();
                                        let out = coordinator.call(&op, &key).ttl(MISS_TTL);
                                        black_box(out.run(|_| action()).await.unwrap());
                                    } else {
                                        let out = coordinator.call(&op, &hit_key);
                                        black_box(out.run(|_| action()).await.unwrap());
                                    }
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap();
                    }
                    // Scale to exactly `iters` calls.
                    start
                        .elapsed()
                        .mul_f64(iters as f64 / (per_task * TASKS) as f64)
                })
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = single, contended
}
criterion_main!(benches);
