//! `idemkit`: the seed's demo (operator tools follow).
//!
//! Run with: `cargo run --release --bin idemkit -- demo`

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use idemkit_core::MemoryStore;

#[derive(Debug, Parser)]
#[command(
    name = "idemkit",
    version,
    about = "Effects that happen once under at-least-once delivery"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the seed's three experiments and print their tables.
    Demo {
        /// Where records live: `memory` (in-process) or a `redis://` URL. On Redis each run
        /// uses its own key prefix, and its records expire with their TTL (one hour).
        #[arg(long, default_value = "memory")]
        store: String,
    },
}

/// A run id component: distinct demo runs must not share keys.
fn nanos() -> u64 {
    #[allow(clippy::disallowed_methods)] // an identifier, not a deadline
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo runs its workers on two threads.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("idemkit: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Demo { store } => match store.as_str() {
            "memory" => {
                let report = runtime.block_on(idemkit_cli::demo::run(MemoryStore::new));
                print!("{report}");
                ExitCode::SUCCESS
            }
            url if url.starts_with("redis://") || url.starts_with("rediss://") => {
                runtime.block_on(async {
                    let store = match idemkit_redis::RedisStore::connect(url).await {
                        Ok(store) => store,
                        Err(e) => {
                            eprintln!("idemkit: cannot connect to {url}: {e}");
                            return ExitCode::FAILURE;
                        }
                    };
                    let run = format!("idemkit-demo:{:016x}", std::process::id() as u64 ^ nanos());
                    let row = std::sync::atomic::AtomicUsize::new(0);
                    let report = idemkit_cli::demo::run(|| {
                        let n = row.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        store.with_prefix(format!("{run}:{n}"))
                    })
                    .await;
                    print!("{report}");
                    ExitCode::SUCCESS
                })
            }
            other => {
                eprintln!(
                    "idemkit: unsupported store {other:?}; supported: memory, redis://HOST:PORT"
                );
                ExitCode::from(2)
            }
        },
    }
}
