//! Sequential idemkit calls against a Redis server, one at a time: the load for counting
//! what one call costs (instructions on the server under callgrind, or on this client).
//!
//! ```sh
//! cargo run --release -p idemkit-redis --example sequential_calls -- redis://127.0.0.1:6379 1000 miss
//! ```
//!
//! `miss` runs and completes a fresh key each time (begin + complete); `hit` replays one
//! completed key (begin); `get` is the yardstick: a bare `GET` through redis-rs' multiplexed
//! connection, as the benchmark's floor. docs/benchmarks.md shows how the per-call figures
//! were taken: the difference between a run of 3,000 calls and one of 1,000, divided by
//! 2,000, so that connecting and loading the scripts cancel out. `SEQUENTIAL_PLAIN=0` sends
//! every `begin` as the script (`RedisStoreBuilder::plain_begins`); `SEQUENTIAL_COALESCE=0`
//! turns coalescing off, so that a lone `begin` is a plain one; `SEQUENTIAL_OWN=0` puts the
//! lanes on redis-rs instead of the store's own client (`RedisStoreBuilder::own_client`, on
//! by default).

use std::convert::Infallible;
use std::process::ExitCode;
use std::time::Duration;

use idemkit::redis::RedisStore;
use idemkit::{Coordinator, Key, Operation};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(Ok(calls)), Some(mode @ ("hit" | "miss" | "get"))) = (
        args.first(),
        args.get(1).map(|n| n.parse::<usize>()),
        args.get(2).map(String::as_str),
    ) else {
        eprintln!("usage: sequential_calls <redis-url> <calls> <hit|miss|get>");
        return ExitCode::FAILURE;
    };
    if mode == "get" {
        return floor(url, calls).await;
    }
    let store = match RedisStore::builder()
        .prefix(format!("sequential-calls:{:x}", fastrand::u64(..)))
        .plain_begins(std::env::var("SEQUENTIAL_PLAIN").as_deref() != Ok("0"))
        .coalesce(std::env::var("SEQUENTIAL_COALESCE").as_deref() != Ok("0"))
        .own_client(std::env::var("SEQUENTIAL_OWN").as_deref() != Ok("0"))
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

/// `calls` bare `GET`s, one at a time, through redis-rs' multiplexed connection.
async fn floor(url: &str, calls: usize) -> ExitCode {
    let mut conn = match redis::Client::open(url) {
        Ok(c) => match c.get_multiplexed_async_connection().await {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("cannot connect to {url}: {e}");
                return ExitCode::FAILURE;
            }
        },
        Err(e) => {
            eprintln!("not a Redis URL {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    for i in 0..calls {
        let got: redis::RedisResult<Option<Vec<u8>>> = redis::cmd("GET")
            .arg("sequential-calls:floor")
            .query_async(&mut conn)
            .await;
        if let Err(e) = got {
            eprintln!("GET {i} failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
