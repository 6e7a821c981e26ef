//! Sequential idemkit calls against a Redis server, one at a time: the load for counting
//! what one call costs (instructions on the server under callgrind, or on this client).
//!
//! ```sh
//! cargo run --release -p idemkit-redis --example sequential_calls -- redis://127.0.0.1:6379 1000 miss
//! ```
//!
//! `miss` runs and completes a fresh key each time (begin + complete); `hit` replays one
//! completed key (begin). docs/benchmarks.md shows how the per-call figures were taken:
//! the difference between a run of 3,000 calls and one of 1,000, divided by 2,000, so
//! that connecting and loading the scripts cancel out. `SEQUENTIAL_PLAIN=0` sends every
//! `begin` as the script (`RedisStoreBuilder::plain_begins`); `SEQUENTIAL_COALESCE=0` turns
//! coalescing off, so that a lone `begin` is a plain one; `SEQUENTIAL_OWN=1` puts the lanes
//! on the store's own client (`RedisStoreBuilder::own_client`).

use std::convert::Infallible;
use std::process::ExitCode;
use std::time::Duration;

use idemkit::redis::RedisStore;
use idemkit::{Coordinator, Key, Operation};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(Ok(calls)), Some(mode @ ("hit" | "miss"))) = (
        args.first(),
        args.get(1).map(|n| n.parse::<usize>()),
        args.get(2).map(String::as_str),
    ) else {
        eprintln!("usage: sequential_calls <redis-url> <calls> <hit|miss>");
        return ExitCode::FAILURE;
    };
    let store = match RedisStore::builder()
        .prefix(format!("sequential-calls:{:x}", fastrand::u64(..)))
        .plain_begins(std::env::var("SEQUENTIAL_PLAIN").as_deref() != Ok("0"))
        .coalesce(std::env::var("SEQUENTIAL_COALESCE").as_deref() != Ok("0"))
        .own_client(std::env::var("SEQUENTIAL_OWN").as_deref() == Ok("1"))
        .connect(url.as_str())
        .await
    {
        Ok(store) => store,
        Err(e) => {
            eprintln!("cannot connect to {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let coordinator = Coordinator::new(store.clone());
    let op = Operation::new("sequential").expect("a valid operation name");
    for i in 0..calls {
        let key = match mode {
            "hit" => Key::new("hit"),
            _ => Key::new(format!("miss-{i}")),
        }
        .expect("a valid key");
        let call = coordinator
            .call(&op, &key)
            .ttl(Duration::from_secs(60))
            .run(|_| async { Ok::<_, Infallible>(1u32) })
            .await;
        if let Err(e) = call {
            eprintln!("call {i} failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    let plain = store.plain_begin_counts();
    eprintln!("plain begins {}, stale stamps {}", plain.sent, plain.stale);
    ExitCode::SUCCESS
}
