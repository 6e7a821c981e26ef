//! One delivery of one message, as a queue worker handles it: mail the invoice of `--key`
//! under idemkit on a Redis, PostgreSQL or MySQL store. For the operator's tools: kill it while it
//! mails (`--work 1h`) and its reservation is stuck until its lease ends; `idemkit list`
//! shows it, `idemkit release` frees it, and the next delivery runs at once.
//!
//! ```text
//! cargo run -p idemkit-cli --example invoice_worker -- --store redis://127.0.0.1:6379 --key order-9 --work 1h
//! ```
//!
//! Prints `reserved <fencing token>` once the key is reserved, then `mailed <receipt>` (or
//! `replayed <receipt>`). Exits 0 when mailed or replayed, 3 when another owner holds the
//! key (the delivery would be requeued), 1 on any other error.

use std::process::ExitCode;
use std::time::Duration;

use idemkit::{Coordinator, DynStore, ErrorKind, InFlight, Key, Operation, Policy, Source};

struct Args {
    store: String,
    prefix: String,
    schema: String,
    operation: String,
    key: String,
    work: Duration,
    lease: Duration,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        store: "redis://127.0.0.1:6379".into(),
        prefix: "idemkit".into(),
        schema: "public".into(),
        operation: "mail.invoice".into(),
        key: String::new(),
        work: Duration::ZERO,
        lease: Duration::from_secs(600),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--store" => a.store = value,
            "--prefix" => a.prefix = value,
            "--schema" => a.schema = value,
            "--operation" => a.operation = value,
            "--key" => a.key = value,
            "--work" | "--lease" => {
                let (n, unit) = value.split_at(value.trim_end_matches(char::is_alphabetic).len());
                let n: u64 = n
                    .parse()
                    .map_err(|_| format!("{flag} {value}: like 500ms, 5s, 1h"))?;
                let d = match unit {
                    "ms" => Duration::from_millis(n),
                    "s" => Duration::from_secs(n),
                    "h" => Duration::from_secs(n * 3600),
                    _ => return Err(format!("{flag} {value}: the unit is ms, s or h")),
                };
                if flag == "--work" {
                    a.work = d;
                } else {
                    a.lease = d;
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

async fn store(a: &Args) -> Result<DynStore, Box<dyn std::error::Error>> {
    if a.store.starts_with("postgres") {
        let store = idemkit::postgres::PgStore::builder()
            .schema(&a.schema)
            .max_connections(2)
            .connect(&a.store)
            .await?;
        store.migrate().await?;
        Ok(DynStore::new(store))
    } else if a.store.starts_with("mysql") {
        let store = idemkit::mysql::MySqlStore::builder()
            .max_connections(2)
            .connect(&a.store)
            .await?;
        store.migrate().await?;
        Ok(DynStore::new(store))
    } else {
        let store = idemkit::redis::RedisStore::builder()
            .prefix(a.prefix.as_str())
            .connect(&a.store)
            .await?;
        Ok(DynStore::new(store))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("invoice_worker: {e}");
            return ExitCode::from(2);
        }
    };
    let store = match store(&args).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("invoice_worker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (Ok(op), Ok(key)) = (
        Operation::new(args.operation.as_str()),
        Key::new(args.key.as_str()),
    ) else {
        eprintln!("invoice_worker: invalid operation or key");
        return ExitCode::from(2);
    };
    // Reject mode: a delivery that finds the key held is requeued, as a queue worker's
    // would be; the lease is long, so a dead owner's reservation stays until released.
    let coordinator = Coordinator::builder(store)
        .policy(Policy::new().lease(args.lease).in_flight(InFlight::Reject))
        .build();
    let work = args.work;
    let result = coordinator
        .call(&op, &key)
        .run(|attempt| async move {
            let fencing = attempt.fencing_token().map_or(0, |f| f.get());
            println!("reserved {fencing}");
            tokio::time::sleep(work).await;
            Ok::<_, std::io::Error>(format!("em_{fencing}"))
        })
        .await;
    match result {
        Ok(receipt) => {
            let verb = match receipt.source {
                Source::Fresh => "mailed",
                _ => "replayed",
            };
            println!("{verb} {}", receipt.value);
            ExitCode::SUCCESS
        }
        Err(e) if e.kind() == ErrorKind::InFlight => {
            println!("in progress: {e}");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("invoice_worker: {e}");
            ExitCode::FAILURE
        }
    }
}
