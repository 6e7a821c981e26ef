//! Sequential idemkit calls against PostgreSQL, one at a time, beside the same number of
//! primary-key `SELECT`s through the same one-connection pool: the load for comparing what a
//! call costs with the floor (time here; instructions on the client or the server under
//! callgrind).
//!
//! ```sh
//! cargo run --release -p idemkit-postgres --example sequential_calls -- postgres://postgres@127.0.0.1/test 2000 hit
//! ```
//!
//! `miss` runs and completes a fresh key each time (begin + complete); `hit` replays one
//! completed key (begin); `select` reads one row of the records table by its key (the floor).

use std::process::ExitCode;
use std::time::Duration;

use tokio::time::Instant;

use idemkit::postgres::PgStore;
use idemkit::{Coordinator, Key, Operation, StorageKey};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(Ok(calls)), Some(mode @ ("hit" | "miss" | "select"))) = (
        args.first(),
        args.get(1).map(|n| n.parse::<usize>()),
        args.get(2).map(String::as_str),
    ) else {
        eprintln!("usage: sequential_calls <postgres-url> <calls> <hit|miss|select>");
        return ExitCode::FAILURE;
    };
    let store = match PgStore::builder()
        .schema("idemkit_examples")
        .max_connections(2)
        .connect(url)
        .await
    {
        Ok(store) => store,
        Err(e) => {
            eprintln!("cannot connect to {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = store.migrate().await {
        eprintln!("cannot migrate: {e}");
        return ExitCode::FAILURE;
    }
    let coordinator = Coordinator::new(store.clone());
    let op = Operation::new("sequential").expect("a valid operation name");
    let run = format!("{:x}", fastrand::u64(..));
    let hit = Key::new("hit").expect("a valid key");
    let call = |key: Key| {
        let coordinator = coordinator.clone();
        let op = op.clone();
        async move {
            coordinator
                .call(&op, &key)
                .ttl(Duration::from_secs(600))
                .run(|_| async { Ok::<_, std::io::Error>(1u32) })
                .await
                .expect("the call")
        }
    };
    call(hit.clone()).await;
    let select = "SELECT version, state, owner, fencing, fingerprint, kind, result \
                  FROM idemkit_examples.idemkit_records WHERE key = $1";
    let hit_key = StorageKey::new(&op, None, &hit);
    let started = Instant::now();
    for i in 0..calls {
        match mode {
            "hit" => {
                call(hit.clone()).await;
            }
            "miss" => {
                call(Key::new(format!("miss-{run}-{i}")).expect("a valid key")).await;
            }
            _ => {
                sqlx::query(select)
                    .bind(hit_key.as_str())
                    .fetch_optional(store.pool())
                    .await
                    .expect("select");
            }
        }
    }
    let per_call = started.elapsed() / calls.max(1) as u32;
    println!(
        "{mode}: {calls} calls, {:.1} µs per call",
        per_call.as_secs_f64() * 1e6
    );
    ExitCode::SUCCESS
}
