//! `idemkit`: the operator's tool: `inspect`, `list`, `release`, `purge`, `stats`, and
//! `serve` for a status page with `/metrics`. (The seed's demo is its own binary,
//! `idemkit-demo`.)
//!
//! Run with: `cargo run --release --bin idemkit -- list --store redis://127.0.0.1:6379`

use std::process::ExitCode;

mod listing;
mod ops;
mod serve;
mod templates;

use clap::{Parser, Subcommand};

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
    /// The seed's demo moved to its own binary: says so, and exits 2.
    #[command(hide = true)]
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
    /// Show one record: state, owner, fencing token, age, time left, fingerprint, result.
    /// Exit codes: 0 shown, 2 bad arguments, 3 no live record, 4 store down, 5 not a record
    /// of ours, 7 other store error.
    Inspect {
        #[command(flatten)]
        store: ops::StoreArgs,
        #[command(flatten)]
        record: ops::RecordArgs,
    },
    /// Release a stuck reservation (an owner killed mid-action), so the next delivery runs
    /// at once instead of after the lease. A completed record is refused (exit 6) unless
    /// `--force`, which removes it if it is still the record read (exit 9 if it changed
    /// meanwhile: nothing removed). Other exit codes as for `inspect`.
    Release {
        #[command(flatten)]
        store: ops::StoreArgs,
        #[command(flatten)]
        record: ops::RecordArgs,
        /// Also remove a completed record (its effect may then run again).
        #[arg(long)]
        force: bool,
    },
    /// List records, a bounded page at a time (Redis `SCAN`, node by node on a Cluster;
    /// keyset pages on PostgreSQL): state, age, time left, fencing token, size, operation,
    /// scope, key. Exit codes as for `inspect`.
    List {
        #[command(flatten)]
        store: ops::StoreArgs,
        #[command(flatten)]
        filter: listing::Filter,
        /// Show at most this many records.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print one JSON array instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Remove the records that match, after a confirmation (or `--yes`), in bounded
    /// batches with a progress bar and a final count. Each record is removed only if it is
    /// still the one listed (same fencing token). Exit 6 when not confirmed.
    Purge {
        #[command(flatten)]
        store: ops::StoreArgs,
        #[command(flatten)]
        args: listing::PurgeArgs,
    },
    /// Records per operation and state, bytes, completed records expiring soon, the oldest
    /// reservation; on Redis the eviction policy (exit 8 unless `noeviction`), on PostgreSQL
    /// the table's size.
    Stats {
        #[command(flatten)]
        store: ops::StoreArgs,
        /// "Expiring soon" means within this: `90s`, `15m`, `2h`.
        #[arg(long, default_value = "5m", value_parser = listing::parse_duration)]
        soon: std::time::Duration,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Serve a status page (in-flight reservations oldest first, stats, and with
    /// `--allow-writes` release and purge behind a confirmation) and `/metrics` for
    /// Prometheus. Bound to loopback unless `--allow-remote`.
    Serve {
        #[command(flatten)]
        store: ops::StoreArgs,
        #[command(flatten)]
        args: serve::ServeArgs,
    },
}

// Two worker threads: an operator's command is one walk of the store at a time.
#[tokio::main(worker_threads = 2)]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo { .. } => {
            eprintln!(
                "idemkit: the demo is its own binary now: cargo run --release --bin idemkit-demo"
            );
            ExitCode::from(2)
        }
        Command::Inspect { store, record } => ops::inspect(&store, &record).await.into(),
        Command::Release {
            store,
            record,
            force,
        } => ops::release(&store, &record, force).await.into(),
        Command::List {
            store,
            filter,
            limit,
            json,
        } => listing::list(&store, &filter, limit, json).await.into(),
        Command::Purge { store, args } => listing::purge(&store, &args).await.into(),
        Command::Stats { store, soon, json } => listing::stats(&store, soon, json).await.into(),
        Command::Serve { store, args } => serve::serve(&store, &args).await.into(),
    }
}
