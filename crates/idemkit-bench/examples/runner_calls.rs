//! The runners' per-message machinery on a `MemoryStore` (or a `RedisStore`, below): the
//! load for counting the client instructions a protected message costs beyond an
//! unprotected one (no broker).
//!
//! Run with: `cargo run --release -p idemkit-bench --example runner_calls -- 20000 on`
//! (a third argument, a Redis URL such as `redis://127.0.0.1:6379`, runs them on a
//! `RedisStore` there instead: the client's share of a protected message on Redis).
//!
//! Messages go through `handle_together` in batches of 16 (what a RabbitMQ prefetch window
//! or a JetStream fetch hands the runner), on 16 handler slots, each settled as the runners
//! settle it. `on`:
//! protected; `off`: `protected(false)`. Under `valgrind --tool=callgrind`, two values of N
//! give the cost of one message without start-up (docs/benchmarks.md).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
use idemkit_runner::{HandlerSlots, Processor, Settlement, handle_together};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let protected = args.next().as_deref() != Some("off");
    let redis = args.next();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        match redis {
            Some(url) => {
                let store = idemkit_redis::RedisStore::builder()
                    .prefix(format!("runner-calls-{:x}", std::process::id()))
                    .connect(&url)
                    .await
                    .expect("redis");
                run(Coordinator::new(store), n, protected).await
            }
            None => run(Coordinator::new(MemoryStore::new()), n, protected).await,
        }
    });
}

async fn run<S: idemkit_core::Store + 'static>(
    coordinator: Coordinator<S>,
    n: usize,
    protected: bool,
) {
    let processor = Arc::new(
        Processor::new(
            coordinator,
            Operation::new("bench.consume").expect("valid"),
            |m: &String| Key::new(m.as_str()),
            |_m: String, _| async { Ok::<_, Infallible>(1u32) },
        )
        .protected(protected),
    );
    let acked = Arc::new(AtomicU64::new(0));
    let slots = HandlerSlots::new(16);
    let messages: Vec<String> = (0..n).map(|i| format!("order-{i}")).collect();
    let started = tokio::time::Instant::now();
    for chunk in messages.chunks(16) {
        let mut batch = Vec::with_capacity(chunk.len());
        for m in chunk {
            batch.push((m.clone(), (), slots.enter().await.expect("open")));
        }
        let (p, a) = (processor.clone(), acked.clone());
        handle_together(
            &processor,
            &slots,
            batch,
            move |message, (), claim, turn| {
                let (p, a) = (p.clone(), a.clone());
                async move {
                    let Some(slot) = turn.slot().await else {
                        return;
                    };
                    let done = p
                        .process_signalled(&message, claim, 1, || slot.give_back())
                        .await;
                    if done.settlement == Settlement::Ack {
                        a.fetch_add(1, Ordering::Relaxed);
                    }
                }
            },
        )
        .await;
    }
    assert_eq!(acked.load(Ordering::Relaxed), n as u64);
    eprintln!(
        "{n} messages, protected {protected}: {:.2} µs a message",
        started.elapsed().as_secs_f64() * 1e6 / n as f64
    );
}
