//! What sealing costs per call: hit (replay, one open) and miss (reserve, run, complete,
//! one seal) on `MemoryStore`, plain, encrypted, and encrypted with hashed key names, with
//! a 200-byte result (an HTTP response's size, roughly). MemoryStore is the fastest store,
//! so these are the largest ratios; on Redis or PostgreSQL a round trip dwarfs them.
//!
//! The Redis cases run the same calls on Redis, where the round trips dominate.
//!
//! Run with: `cargo bench -p idemkit-seal --bench seal` (docs/benchmarks.md has one run's
//! figures and ratios).
#![allow(missing_docs)]

use std::convert::Infallible;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use idemkit_core::{Coordinator, Key, MemoryStore, Operation, Store};
use idemkit_seal::{KeySecret, Keyring, Sealed};

/// Miss keys expire quickly so the store's sweep keeps the benchmark's memory flat.
const MISS_TTL: Duration = Duration::from_millis(10);

async fn action() -> Result<String, Infallible> {
    Ok("x".repeat(200))
}

fn case<S: Store>(c: &mut Criterion, name: &str, store: S) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let coordinator = Coordinator::new(store);
    let op = Operation::new("http.payments").unwrap();
    let hit = Key::new("user-42.payment").unwrap();
    rt.block_on(coordinator.call(&op, &hit).run(|_| action()))
        .unwrap();
    let mut g = c.benchmark_group(name);
    g.bench_function("hit", |b| {
        b.to_async(&rt).iter(|| async {
            let out = coordinator.call(&op, &hit).run(|_| action()).await.unwrap();
            black_box(out);
        })
    });
    let n = AtomicU64::new(0);
    g.bench_function("miss", |b| {
        b.to_async(&rt).iter(|| async {
            let key = Key::new(format!("k{}", n.fetch_add(1, Ordering::Relaxed))).unwrap();
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

fn all(c: &mut Criterion) {
    let keys = || Keyring::new(1, [0x42; 32]);
    case(c, "plain", MemoryStore::new());
    case(
        c,
        "encrypted",
        Sealed::new(MemoryStore::new()).encrypt(keys()),
    );
    case(
        c,
        "encrypted+hashed",
        Sealed::new(MemoryStore::new())
            .encrypt(keys())
            .hash_keys(KeySecret::new([7u8; 32]).unwrap()),
    );
}

/// The same on Redis (a round trip per phase): what sealing adds where a store call costs
/// tens of microseconds. Skipped without a Redis on `IDEMKIT_REDIS_URL` (default 6379).
fn on_redis(c: &mut Criterion) {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let connect = |prefix: &str| {
        rt.block_on(
            idemkit_redis::RedisStore::builder()
                .prefix(format!("{prefix}-{:x}", fastrand::u64(..)))
                .connect(&url),
        )
    };
    let Ok(plain) = connect("bench-seal-plain") else {
        eprintln!("no Redis at {url}: the Redis cases are skipped");
        return;
    };
    let sealed = connect("bench-seal-sealed").unwrap();
    case(c, "redis/plain", plain);
    case(
        c,
        "redis/encrypted",
        Sealed::new(sealed).encrypt(Keyring::new(1, [0x42; 32])),
    );
}

criterion_group!(benches, all, on_redis);
criterion_main!(benches);
