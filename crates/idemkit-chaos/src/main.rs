//! `idemkit-chaos`: the fault run (`scripts/chaos`).
//!
//! `idemkit-chaos run` runs six scenarios one after another: worker processes take jobs
//! from a real at-least-once queue (a PostgreSQL table with visibility leases, or a Kafka
//! topic through the Kafka runner) and run each job's effect, a ledger row with its
//! fencing token, under idemkit on Redis (AOF on) or PostgreSQL; meanwhile workers are
//! killed (`SIGKILL`) and paused past their lease (`SIGSTOP`), the queue's and the store's
//! connections are cut, the store restarts cleanly and crashes, and Redis fails over to a
//! lagging replica with and without the durability guard. Then the checker (`check.rs`)
//! explains every duplicate by a fault or counts it as unexplained, and counts stale
//! overwrites, lost jobs, fencing inversions, results acknowledged but not stored, and
//! stored results that vanished. The exit status is 1 on any unexplained duplicate, stale
//! overwrite, lost job, panic, or vanished result no fault accounts for.
//!
//! `idemkit-chaos worker ...` is one worker process (the run starts them).
#![allow(missing_docs)]

mod check;
mod events;
mod run;
mod servers;
mod worker;

use std::path::PathBuf;
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;

/// `--name value` arguments.
#[derive(Debug, Clone)]
pub(crate) struct Args(Vec<String>);

impl Args {
    fn opt(&self, name: &str) -> Option<String> {
        let i = self.0.iter().position(|a| a == name)?;
        self.0.get(i + 1).cloned()
    }

    pub(crate) fn get(&self, name: &str) -> Result<String, String> {
        self.opt(name).ok_or_else(|| format!("{name} is required"))
    }

    pub(crate) fn number(&self, name: &str) -> Result<u64, String> {
        self.get(name)?.parse().map_err(|e| format!("{name}: {e}"))
    }

    fn number_or(&self, name: &str, default: u64) -> Result<u64, String> {
        match self.opt(name) {
            Some(_) => self.number(name),
            None => Ok(default),
        }
    }

    pub(crate) fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }
}

const USAGE: &str = "usage: idemkit-chaos run [--jobs N] [--workers N] [--lease-ms MS] \
[--every-ms MS] [--deadline-s S] [--seed N] [--only NAME] [--out DIR] [--report FILE] [--unprotected]
  --jobs N      jobs per scenario (default 2000; six scenarios)
  --workers N   worker processes per scenario (default 3)
  --lease-ms    idemkit's lease (default 1000)
  --every-ms    mean time between two faults (default 700)
  --deadline-s  a scenario gives up after this long; its jobs not done are lost (default 300)
  --only NAME   only the scenarios whose name contains NAME (or any of NAME,NAME...)
  --report FILE also write the figures as a Markdown table
  --unprotected the workers run their effects without idemkit: the checker's own check
                (it must report unexplained duplicates and fail)";

#[tokio::main]
async fn main() {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    let command = if argv.is_empty() {
        "run".to_string()
    } else {
        argv.remove(0)
    };
    let args = Args(argv);
    let result = match command.as_str() {
        "worker" => worker::main(args).await.map(|()| true),
        "run" => run(args).await,
        _ => Err(USAGE.into()),
    };
    match result {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("idemkit-chaos: {e}");
            std::process::exit(2);
        }
    }
}

async fn run(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    if args.flag("--help") {
        println!("{USAGE}");
        return Ok(true);
    }
    let seed = args.number_or("--seed", fastrand::u64(..1_000_000))?;
    let db_url = std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let db = PgPoolOptions::new()
        .max_connections(4)
        .connect(&db_url)
        .await
        .map_err(|e| format!("the queue's PostgreSQL ({db_url}): {e}"))?;
    run::prepare(&db).await?;
    let only = args.opt("--only");
    let scenarios: Vec<(usize, run::Scenario)> = run::SCENARIOS
        .into_iter()
        .enumerate()
        .filter(|(_, s)| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|o| s.name.contains(o)))
        })
        .collect();
    let brokers = if scenarios.iter().any(|(_, s)| s.queue == run::Queue::Kafka) {
        Some(idemkit_test::brokers::kafka().ok_or("a Kafka-protocol broker (tansu)")?)
    } else {
        None
    };
    let dir = match args.opt("--out") {
        Some(d) => PathBuf::from(d),
        None => std::env::temp_dir().join(format!("idemkit-chaos-{seed}")),
    };
    std::fs::create_dir_all(&dir)?;
    let settings = run::Settings {
        dir: dir.clone(),
        db_url,
        db,
        brokers,
        jobs: args.number_or("--jobs", 2000)? as u32,
        workers: args.number_or("--workers", 3)? as usize,
        lease: Duration::from_millis(args.number_or("--lease-ms", 1000)?),
        every: Duration::from_millis(args.number_or("--every-ms", 700)?),
        deadline: Duration::from_secs(args.number_or("--deadline-s", 300)?),
        seed,
        unprotected: args.flag("--unprotected"),
    };
    println!("idemkit-chaos: seed {seed}, logs in {}", dir.display());
    let mut reports = Vec::new();
    for (i, sc) in scenarios {
        let history = run::scenario(&settings, sc, i).await;
        let report = check::check(&history);
        print!("{}", report.render());
        reports.push(report);
    }
    let failures: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.failures()
                .into_iter()
                .map(move |f| format!("{}: {f}", r.scenario))
        })
        .collect();
    if let Some(path) = args.opt("--report") {
        std::fs::write(&path, markdown(&reports, seed))?;
    }
    if failures.is_empty() {
        println!("idemkit-chaos: passed (seed {seed})");
        Ok(true)
    } else {
        for f in &failures {
            println!("FAILED {f}");
        }
        println!(
            "idemkit-chaos: failed (seed {seed}; logs in {})",
            dir.display()
        );
        Ok(false)
    }
}

/// The figures as a Markdown table (docs/chaos.md quotes one).
fn markdown(reports: &[check::Report], seed: u64) -> String {
    let mut s = format!(
        "Seed {seed}.\n\n| scenario | jobs | s | effects | faults | duplicates by class | unexplained | stale overwrites | lost | fencing inversions | acked, stored=false | stored results vanished | refused as unavailable |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in reports {
        let faults: Vec<String> = r.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let dups: Vec<String> = r
            .duplicates
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        s.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scenario,
            r.jobs,
            r.seconds,
            r.effects,
            faults.join(", "),
            if dups.is_empty() {
                "none".into()
            } else {
                dups.join(", ")
            },
            r.unexplained.len(),
            r.stale_overwrites,
            r.lost,
            r.fencing_inversions,
            r.acked_not_stored,
            r.vanished,
            r.refused
        ));
    }
    s
}
