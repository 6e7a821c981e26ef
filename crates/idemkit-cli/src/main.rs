//! `idemkit`: the seed's demo, and operator tools.
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
        /// Where records live: `memory` (in-process).
        #[arg(long, default_value = "memory")]
        store: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
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
            other => {
                eprintln!("idemkit: unsupported store {other:?}; supported: memory");
                ExitCode::from(2)
            }
        },
    }
}
