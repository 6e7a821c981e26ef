//! The Rust side of the cross-language tests (tests/python/test_interop.py): one call of
//! `interop.effect` under a key, on Redis or PostgreSQL, whose action appends this worker's
//! name to an effects file, sleeps, and returns `"<name>-receipt"` (JSON, the default codec
//! of both languages). It prints `{"value": ..., "replayed": ...}`.
//!
//! ```text
//! interop_worker STORE_URL PREFIX_OR_TABLE KEY EFFECTS_FILE NAME SLEEP_MS [START_AT_UNIX_MS]
//! ```
//!
//! `START_AT_UNIX_MS` makes the two workers of a race call at the same moment.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemkit_core::{Coordinator, DynStore, Key, Operation};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, namespace, key, effects, name, sleep_ms, rest @ ..] = &args[..] else {
        return Err("usage: interop_worker STORE_URL PREFIX_OR_TABLE KEY EFFECTS_FILE NAME SLEEP_MS [START_AT_UNIX_MS]".into());
    };
    let store = if url.starts_with("postgres") {
        let store = idemkit_postgres::PgStore::builder()
            .table(namespace)
            .connect(url)
            .await?;
        DynStore::with_raw(store)
    } else {
        let store = idemkit_redis::RedisStore::builder()
            .prefix(namespace.as_str())
            .connect(url)
            .await?;
        DynStore::with_raw(store)
    };
    let coordinator = Coordinator::new(store);
    let (operation, key) = (Operation::new("interop.effect")?, Key::new(key.as_str())?);
    if let Some(start_at) = rest.first() {
        #[allow(clippy::disallowed_methods)] // a start time shared with another process
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
        let start_at: u64 = start_at.parse()?;
        tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(now))).await;
    }
    let sleep = Duration::from_millis(sleep_ms.parse()?);
    let receipt = coordinator
        .call(&operation, &key)
        .ttl(Duration::from_secs(600))
        .run(|_attempt| async move {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(effects)?;
            writeln!(file, "{name}")?;
            tokio::time::sleep(sleep).await;
            Ok::<_, std::io::Error>(format!("{name}-receipt"))
        })
        .await?;
    println!(
        "{}",
        serde_json::json!({ "value": receipt.value, "replayed": receipt.is_replay() })
    );
    Ok(())
}
