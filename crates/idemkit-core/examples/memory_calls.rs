//! Sequential calls on a `MemoryStore`: the load for counting instructions per call.
//!
//! Run with: `cargo run --release -p idemkit-core --example memory_calls -- 10000 hit`
//!
//! `hit`: one key completed once, then replayed N times. `miss`: N fresh keys. Run it under
//! `valgrind --tool=callgrind` for two values of N; the difference divided by the difference
//! in N is the cost of one call, without start-up (docs/benchmarks.md). It prints the calls'
//! wall time per call (an A/B of two builds, alternated).

use std::convert::Infallible;

use idemkit_core::{Coordinator, Key, MemoryStore, Operation};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let hit = args.next().as_deref() != Some("miss");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let c = Coordinator::new(MemoryStore::new());
        let op = Operation::new("mail.invoice").expect("valid");
        let keys: Vec<Key> = (0..n)
            .map(|i| Key::new(format!("order-{}.invoice", if hit { 0 } else { i })).expect("valid"))
            .collect();
        let mut sum = 0u64;
        let started = tokio::time::Instant::now();
        for key in &keys {
            let out = c
                .call(&op, key)
                .run(|_| async { Ok::<_, Infallible>(7u64) })
                .await
                .expect("call");
            sum += out.value;
        }
        assert_eq!(sum, 7 * n as u64);
        // The calls only (the keys are built before, the store dropped after).
        eprintln!(
            "{} ns per call",
            started.elapsed().as_nanos() / n.max(1) as u128
        );
    });
}
