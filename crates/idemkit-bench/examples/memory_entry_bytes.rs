//! The heap one completed `MemoryStore` entry holds: 10,000 records of a 100-byte result,
//! stored through the coordinator, the allocator's live bytes counted before and after
//! (the map's own growth included), divided by 10,000. `idemkit-bench --out` runs it in a
//! process of its own, so the counting allocator slows no measured call.
//!
//! ```text
//! cargo run --release -p idemkit-bench --example memory_entry_bytes
//! ```

use std::alloc::System;
use std::convert::Infallible;
use std::time::Duration;

use idemkit_core::{BytesCodec, Coordinator, Key, MemoryStore, Operation};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const ENTRIES: usize = 10_000;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let c = Coordinator::new(MemoryStore::new());
    let op = Operation::new("mail.invoice")?;
    // The caller's keys are the caller's: built before counting.
    let keys: Vec<Key> = (0..ENTRIES)
        .map(|i| Key::new(format!("order-{i:06}")))
        .collect::<Result<_, _>>()?;
    let region = Region::new(GLOBAL);
    for k in &keys {
        c.call(&op, k)
            .codec(BytesCodec)
            .ttl(Duration::from_secs(60))
            .run(|_| async { Ok::<Vec<u8>, Infallible>(vec![b'r'; 100]) })
            .await?;
    }
    let stats = region.change();
    let live =
        stats.bytes_allocated as isize - stats.bytes_deallocated as isize + stats.bytes_reallocated;
    println!(
        "{} bytes per entry ({ENTRIES} entries)",
        live as f64 / ENTRIES as f64
    );
    Ok(())
}
