//! Writing one run's results: `results.md` (the machine, the versions, the command, every
//! table, and the ratios against the targets) and the plots as SVG, into one directory that
//! `docs/benchmarks.md` embeds.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::duel::Duel;
use crate::kafka::ConsumerRow;
use crate::measure::{Report, Row};
use crate::paired::Paired;
use crate::plots::plots;
use crate::postgres::SqlReport;
use crate::suite::RecordBytes;

/// The consumer runners' reports (their text and rows), when the run measured them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Consumers {
    pub(crate) kafka: Option<(String, Vec<ConsumerRow>)>,
    pub(crate) jetstream: Option<(String, Vec<ConsumerRow>)>,
    pub(crate) rabbitmq: Option<(String, Vec<ConsumerRow>)>,
    /// The MySQL (or MariaDB) store's cases, with the server's version.
    pub(crate) mysql: Option<(String, SqlReport)>,
}

/// The Kafka runner's messages per second with an empty handler on Redis (batch 64) before
/// issue 26 (`docs/benchmarks.md`, the run of `c44eedd`'s successor): the "4× today" target.
const KAFKA_BEFORE: f64 = 10_254.0;

/// What the run was, for the reader of the results.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meta {
    pub(crate) command: String,
    pub(crate) redis_version: String,
    /// The second server's (`--valkey`), if the run had one.
    pub(crate) second_version: Option<String>,
    pub(crate) postgres_version: Option<String>,
    pub(crate) python: Option<String>,
}

/// Writes `results.md` and the SVG plots into `dir`.
///
/// # Errors
///
/// The directory cannot be written.
pub(crate) fn write(
    dir: &Path,
    meta: &Meta,
    report: &Report,
    // The interleaved c=1 latencies on the first server and on the second (empty without).
    [c1, c1_second]: [&[(&'static str, Vec<Duration>)]; 2],
    bytes: &[RecordBytes],
    pg: Option<&SqlReport>,
    consumers: &Consumers,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let plots = plots(report, c1, bytes);
    for (file, svg) in &plots {
        std::fs::write(dir.join(file), svg)?;
    }
    let servers = Servers::of(
        report,
        &meta.redis_version,
        meta.second_version.as_ref(),
        [c1, c1_second],
    );
    std::fs::write(
        dir.join("results.md"),
        markdown(meta, report, &servers, bytes, pg, consumers, &plots),
    )
}

/// One server's Redis cases: its name and version, its rows (each the median round's),
/// its interleaved c=1 latencies, and idemkit against the peers in slices.
type OnServer<'a> = (
    &'a String,
    &'a [Row],
    &'a [(&'static str, Vec<Duration>)],
    &'a [Duel],
);

/// The servers the Redis cases ran on: the first (`--store`) and the second (`--valkey`).
struct Servers<'a> {
    first: OnServer<'a>,
    second: Option<OnServer<'a>>,
}

impl<'a> Servers<'a> {
    fn of(
        report: &'a Report,
        first: &'a String,
        second: Option<&'a String>,
        [c1, c1_second]: [&'a [(&'static str, Vec<Duration>)]; 2],
    ) -> Self {
        Servers {
            first: (first, &report.rows, c1, &report.duels),
            second: second.map(|v| (v, &report.second[..], c1_second, &report.second_duels[..])),
        }
    }

    fn each(&self) -> impl Iterator<Item = OnServer<'a>> {
        std::iter::once(self.first).chain(self.second)
    }
}

pub(crate) fn find<'a>(rows: &'a [Row], case: &str, concurrency: usize) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.case == case && r.concurrency == concurrency)
}

fn ops(report: &Report, case: &str, concurrency: usize) -> Option<f64> {
    ops_in(&report.rows, case, concurrency)
}

fn ops_in(rows: &[Row], case: &str, concurrency: usize) -> Option<f64> {
    find(rows, case, concurrency).map(|r| r.ops_per_sec)
}

/// A case's throughput in each round.
fn ops_per_round(rounds: &[Vec<Row>], case: &str, concurrency: usize) -> Vec<Option<f64>> {
    rounds
        .iter()
        .map(|rows| ops_in(rows, case, concurrency))
        .collect()
}

/// The targets decided within rounds (`redis_undecided`'s), one line each, for the
/// terminal.
pub(crate) fn redis_summary(report: &Report, first: &String, second: Option<&String>) -> String {
    let servers = Servers::of(report, first, second, [&[], &[]]);
    let mut s = String::from("\nTargets decided within rounds:\n");
    for t in redis_targets(&servers) {
        let _ = writeln!(s, "  {}: {} (target {})", t.what, t.measured, t.target);
    }
    s
}

/// Whether the Redis rounds so far disagree on one of the targets decided within rounds
/// (idemkit against the fastest Rust peer, the Valkey server's CPU per miss): another
/// round is due (`paired::more_rounds`). `first` and `second` are the servers' names, as
/// `results.md` gives them (`Valkey …` for Valkey).
pub(crate) fn redis_undecided(report: &Report, first: &String, second: Option<&String>) -> bool {
    let servers = Servers::of(report, first, second, [&[], &[]]);
    redis_targets(&servers).iter().any(|t| t.undecided)
}

/// A percentile of an interleaved case's sorted latencies, µs.
pub(crate) fn c1_us(c1: &[(&'static str, Vec<Duration>)], case: &str, p: usize) -> Option<f64> {
    let (_, l) = c1.iter().find(|(name, l)| *name == case && !l.is_empty())?;
    Some(l[(l.len() * p / 100).min(l.len() - 1)].as_secs_f64() * 1e6)
}

/// One line of the targets table: what, the measured ratio, the target, met or not.
struct Target {
    what: String,
    measured: String,
    target: &'static str,
    met: Option<bool>,
    /// The rounds disagree on it (`Paired::straddles`): more rounds would decide it.
    undecided: bool,
}

impl Target {
    /// A ratio decided within each round: met when the median of the rounds' ratios is
    /// at least `at_least`; `detail` follows the spread (the median rounds' figures).
    fn paired(
        what: String,
        p: &Paired,
        detail: String,
        target: &'static str,
        at_least: f64,
    ) -> Option<Self> {
        let median = p.median()?;
        Some(Target {
            what,
            measured: p.show_with(&detail),
            target,
            met: Some(median >= at_least),
            undecided: p.straddles(at_least),
        })
    }
}

/// The targets on each Redis server decided slice by slice (`duel`): idemkit's c=64
/// misses and hits against the faster Rust peer of the same slice (issues 35 and 51), and
/// the server's CPU per miss over idemkit's miss slices.
fn redis_targets(servers: &Servers<'_>) -> Vec<Target> {
    let mut out = Vec::new();
    for (server, rows, _, duels) in servers.each() {
        let valkey = server.starts_with("Valkey");
        // Issue 51's targets: Valkey 9.1 at least 1.5×, Redis 7.0 at least 1.1×.
        let misses = if valkey {
            ("≥ 1.50×", 1.5)
        } else {
            ("≥ 1.10×", 1.1)
        };
        for (kind, (target, at_least)) in [("miss", misses), ("hit", ("≥ 1.50×", 1.5))] {
            let Some(duel) = duels.iter().find(|d| d.kind == kind) else {
                continue;
            };
            let rows = match (
                ops_in(rows, &format!("idemkit {kind}"), 64),
                ops_in(rows, &format!("idempotency-kit {kind}"), 64),
                ops_in(rows, &format!("idempotent {kind}"), 64),
            ) {
                (Some(i), Some(a), Some(b)) => {
                    format!("the median rounds' rows {i:.0} / {:.0}", a.max(b))
                }
                _ => String::new(),
            };
            out.extend(Target::paired(
                format!("{server}: c=64 {kind}es/s: idemkit / the fastest Rust peer")
                    .replace("hites", "hits"),
                &Paired::slices(duel.ratios()),
                rows,
                target,
                at_least,
            ));
        }
        let miss = Paired::slices(
            duels
                .iter()
                .find(|d| d.kind == "miss")
                .map(|d| d.idemkit_cpu_us.clone())
                .unwrap_or_default(),
        );
        let per_get = find(rows, "floor: GET", 64).map(|r| r.redis_cpu_usec_per_call);
        if let (Some(us), Some((lo, hi)), Some(per_get)) = (miss.median(), miss.spread(), per_get) {
            out.push(Target {
                what: format!("{server}: server CPU per coalesced miss, c=64 (`INFO cpu`)"),
                measured: format!(
                    "{us:.2} µs ({lo:.2}–{hi:.2} µs, {} slices; {:.1} GETs' worth at c=64: {per_get:.2} µs each)",
                    miss.ratios.len(),
                    us / per_get
                ),
                target: if valkey { "≤ 4 µs" } else { "(measured)" },
                met: valkey.then_some(us <= 4.0),
                undecided: valkey && miss.straddles(4.0),
            });
        }
    }
    out
}

fn targets(
    report: &Report,
    servers: &Servers<'_>,
    pg: Option<&SqlReport>,
    consumers: &Consumers,
) -> Vec<Target> {
    let mut out = redis_targets(servers);
    let rounds = &report.per_round[..];
    let mut ratio = |what: String, num: &str, den: &str, target, at_least: f64| {
        let paired = Paired::of(
            &ops_per_round(rounds, num, 64),
            &ops_per_round(rounds, den, 64),
        );
        let medians = match (ops(report, num, 64), ops(report, den, 64)) {
            (Some(n), Some(d)) => format!("median rounds {n:.0} / {d:.0}"),
            _ => String::new(),
        };
        out.extend(Target::paired(what, &paired, medians, target, at_least));
    };
    for kind in ["hit", "miss"] {
        ratio(
            format!("c=64 {kind}es/s: idemkit / idempotency-kit (Python)").replace("hites", "hits"),
            &format!("idemkit {kind}"),
            &format!("idempotency-kit (Python) {kind}"),
            "≥ 45×",
            45.0,
        );
    }
    // The Python package, issue 27: the same asyncio driver, the same Redis.
    for kind in ["hit", "miss"] {
        ratio(
            format!("c=64 {kind}es/s: idemkit (Python) / idempotency-kit (Python)")
                .replace("hites", "hits"),
            &format!("idemkit (Python) {kind}"),
            &format!("idempotency-kit (Python) {kind}"),
            "≥ 5×",
            5.0,
        );
    }
    for (server, _, c1, _) in servers.each() {
        let get = c1_us(c1, "floor: GET", 50);
        if let (Some(hit), Some(get)) = (c1_us(c1, "idemkit hit", 50), get) {
            let r = hit / get;
            out.push(Target {
                what: format!("{server}: c=1 hit p50 / one GET's p50 (interleaved)"),
                measured: format!("{r:.2}× ({hit:.1} / {get:.1} µs)"),
                target: "≤ 1.10×",
                met: Some(r <= 1.1),
                undecided: false,
            });
        }
        // Two GETs: one call of two sequential round trips where the run has it (what a
        // miss is made of), and twice one GET's p50 beside it.
        let two = c1_us(c1, "floor: two GETs", 50);
        if let (Some(miss), Some(get)) = (c1_us(c1, "idemkit miss", 50), get) {
            let (r, measured) = match two {
                Some(two) => (
                    miss / two,
                    format!(
                        "{:.2}× ({miss:.1} / {two:.1} µs; against twice one GET's p50, {get:.1} µs: {:.2}×)",
                        miss / two,
                        miss / (2.0 * get)
                    ),
                ),
                None => (
                    miss / (2.0 * get),
                    format!("{:.2}× ({miss:.1} / 2 × {get:.1} µs)", miss / (2.0 * get)),
                ),
            };
            out.push(Target {
                what: format!("{server}: c=1 miss p50 / two GETs' p50 (interleaved)"),
                measured,
                target: "≤ 1.20×",
                met: Some(r <= 1.2),
                undecided: false,
            });
        }
    }
    // PostgreSQL.
    if let Some(pg) = pg {
        let row = |case: &str, c: usize| pg.row(case, c);
        if let (Some(miss), Some(peer)) = (
            row("idemkit PgStore miss", 1),
            row("hand-written table miss", 1),
        ) {
            let r = miss.p50.as_secs_f64() / peer.p50.as_secs_f64();
            out.push(Target {
                what: "PostgreSQL c=1 miss p50 / the hand-written table's (insert, then update)"
                    .into(),
                measured: format!(
                    "{r:.2}× ({:.0} / {:.0} µs)",
                    miss.p50.as_secs_f64() * 1e6,
                    peer.p50.as_secs_f64() * 1e6
                ),
                target: "≤ 1.50×",
                met: Some(r <= 1.5),
                undecided: false,
            });
            let r = miss.db_cpu_usec / peer.db_cpu_usec;
            out.push(Target {
                what: "PostgreSQL c=1 miss database CPU / the hand-written table's".into(),
                measured: format!(
                    "{r:.2}× ({:.0} / {:.0} µs)",
                    miss.db_cpu_usec, peer.db_cpu_usec
                ),
                target: "≤ 1.50×",
                met: Some(r <= 1.5),
                undecided: false,
            });
        }
        if let (Some(miss), Some(insert)) = (
            row("idemkit PgStore miss", 64),
            row("floor: 1-row INSERT", 64),
        ) {
            let r = miss.ops_per_sec / insert.ops_per_sec;
            out.push(Target {
                what: "PostgreSQL c=64 misses/s / one-row INSERTs/s".into(),
                measured: format!(
                    "{r:.2}× ({:.0} / {:.0})",
                    miss.ops_per_sec, insert.ops_per_sec
                ),
                target: "≥ 1.00×",
                met: Some(r >= 1.0),
                undecided: false,
            });
        }
        if let (Some(hit), Some(select)) =
            (row("idemkit PgStore hit", 1), row("floor: PK SELECT", 1))
        {
            let r = hit.p50.as_secs_f64() / select.p50.as_secs_f64();
            out.push(Target {
                what: "PostgreSQL c=1 hit p50 / primary-key SELECT p50".into(),
                measured: format!(
                    "{r:.2}× ({:.0} / {:.0} µs)",
                    hit.p50.as_secs_f64() * 1e6,
                    select.p50.as_secs_f64() * 1e6
                ),
                target: "≤ 1.30×",
                met: Some(r <= 1.3),
                undecided: false,
            });
        }
    }
    // The consumer runners.
    if let Some((_, rows)) = &consumers.kafka {
        let find = |case: &str| rows.iter().find(|r| r.case == case);
        if let Some(r) = find("runner + idemkit (Redis), batch 64") {
            let x = r.per_sec / KAFKA_BEFORE;
            out.push(Target {
                what: "Kafka runner, empty handler, Redis, batch 64: messages/s / before issue 26 (10,254)".into(),
                measured: format!("{x:.2}× ({:.0}/s)", r.per_sec),
                target: "≥ 4×",
                met: Some(x >= 4.0),
                undecided: false,
            });
        }
        if let Some(r) = find("runner + idemkit (Redis), batch 64, 1 ms handler") {
            out.extend(Target::paired(
                "Kafka runner, 1 ms handler: idemkit (Redis) / idempotency off".into(),
                &r.vs_off,
                format!("{:.0}/s in the median round", r.per_sec),
                "≥ 0.80×",
                0.8,
            ));
        }
    }
    // The JetStream and RabbitMQ runners, issue 51: batch claims.
    for (runner, found) in [
        ("JetStream", &consumers.jetstream),
        ("RabbitMQ", &consumers.rabbitmq),
    ] {
        let Some((_, rows)) = found else { continue };
        for (handler, at_least, target) in
            [("", 0.7, "≥ 0.70×"), (", 1 ms handler", 0.9, "≥ 0.90×")]
        {
            let case = format!("{runner} runner + idemkit (Redis){handler}");
            if let Some(r) = rows.iter().find(|r| r.case == case) {
                let what = if handler.is_empty() {
                    ", empty handler"
                } else {
                    handler
                };
                out.extend(Target::paired(
                    format!("{runner} runner{what}: idemkit (Redis) / idempotency off"),
                    &r.vs_off,
                    format!("{:.0}/s in the median round", r.per_sec),
                    target,
                    at_least,
                ));
            }
        }
    }
    // MySQL, issue 51: first deliveries at least as fast as the hand-written table.
    if let Some((server, report)) = &consumers.mysql
        && let (Some(miss), Some(peer)) = (
            report.row("idemkit MySqlStore miss", 64),
            report.row("hand-written table miss", 64),
        )
    {
        let r = miss.ops_per_sec / peer.ops_per_sec;
        out.push(Target {
            what: format!("{server}: c=64 misses/s / the hand-written table's"),
            measured: format!(
                "{r:.2}× ({:.0} / {:.0})",
                miss.ops_per_sec, peer.ops_per_sec
            ),
            target: "≥ 1.00×",
            met: Some(r >= 1.0),
            undecided: false,
        });
    }
    // MemoryStore.
    for (case, limit_ns, target) in [
        ("idemkit MemoryStore hit", 200.0, "≤ 200 ns"),
        ("idemkit MemoryStore miss", 600.0, "≤ 600 ns"),
    ] {
        if let Some(o) = ops(report, case, 1) {
            let ns = 1e9 / o;
            out.push(Target {
                what: format!("{case}, one task (wall time per call, calls not timed one by one)"),
                measured: format!("{ns:.0} ns"),
                target,
                met: Some(ns <= limit_ns),
                undecided: false,
            });
        }
    }
    // The encryption option's cost: no target, its price.
    for (kind, c) in [("hit", 1), ("miss", 1)] {
        if let (Some(plain), Some(sealed)) = (
            ops(report, &format!("idemkit MemoryStore {kind}"), c),
            ops(report, &format!("idemkit MemoryStore {kind}, encrypted"), c),
        ) {
            out.push(Target {
                what: format!("Encryption (idemkit-seal) on a MemoryStore {kind}: time per call, encrypted / plain"),
                measured: format!("{:.2}× ({:.0} / {:.0} ns)", plain / sealed, 1e9 / sealed, 1e9 / plain),
                target: "(its cost)",
                met: None,
                undecided: false,
            });
        }
    }
    for kind in ["hit", "miss"] {
        if let (Some(plain), Some(sealed)) = (
            ops(report, &format!("idemkit {kind}"), 64),
            ops(report, &format!("idemkit {kind}, encrypted"), 64),
        ) {
            out.push(Target {
                what: format!(
                    "Encryption (idemkit-seal) on Redis, c=64 {kind}es/s: encrypted / plain"
                )
                .replace("hites", "hits"),
                measured: format!("{:.2}× ({sealed:.0} / {plain:.0})", sealed / plain),
                target: "(its cost)",
                met: None,
                undecided: false,
            });
        }
    }
    out.push(Target {
        what: "Redis instructions per miss, coalesced at c=64 / per key in a batch of 64".into(),
        measured: "`scripts/redis-instructions` (callgrind), not part of this run".into(),
        target: "(counted)",
        met: None,
        undecided: false,
    });
    out
}

fn num(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.decimals$}")
    }
}

fn markdown(
    meta: &Meta,
    report: &Report,
    servers: &Servers<'_>,
    bytes: &[RecordBytes],
    pg: Option<&SqlReport>,
    consumers: &Consumers,
    plots: &[(&'static str, String)],
) -> String {
    let mut s = String::new();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let _ = writeln!(s, "# Benchmark results\n");
    let _ = writeln!(
        s,
        "Written by `idemkit-bench`; do not edit. `docs/benchmarks.md` explains each case.\n"
    );
    let _ = writeln!(s, "- **Command:** `{}`", meta.command);
    let _ = writeln!(
        s,
        "- **Machine:** {cores} cores, {cpu}, Linux {}",
        kernel.trim()
    );
    let _ = writeln!(
        s,
        "- **Versions:** idemkit {}, {}{}{}, idempotency-kit 1.0.1 and idempotent 0.3.0 (Rust){}",
        env!("CARGO_PKG_VERSION"),
        meta.redis_version,
        meta.second_version
            .as_ref()
            .map_or(String::new(), |v| format!(" and {v}")),
        meta.postgres_version
            .as_ref()
            .map_or(String::new(), |v| format!(", PostgreSQL {v}")),
        meta.python
            .as_ref()
            .map_or(String::new(), |p| format!(", idempotency-kit 0.5.0 on {p}")),
    );
    let _ = writeln!(
        s,
        "- **Client:** {} tokio worker thread(s) for every library; each row is the round with the median throughput of {} interleaved round(s), the cases' order turned from round to round.\n",
        report.workers, report.rounds
    );

    let c1 = servers.first.2;
    let _ = writeln!(s, "## Against the targets\n");
    let _ = writeln!(
        s,
        "A ratio given with a spread and a count of slices or rounds is decided pair by pair: the median of its ratios taken within each slice (idemkit and the Rust peers in turns of a fraction of a second, `duel`) or within each round (idemkit and its yardstick of the same round), then the middle half of them (the lower and the upper quartile; with three pairs, the lowest and the highest), and how many. Where a target's middle half lay on both sides of it after `--rounds`, more rounds ran (up to `--max-rounds`); *rounds split* marks a target still split at the end.\n"
    );
    let _ = writeln!(s, "| ratio | measured | target | met |\n|---|---|---|---|");
    for t in targets(report, servers, pg, consumers) {
        let met = match (t.met, t.undecided) {
            (Some(true), false) => "yes",
            (Some(true), true) => "yes (rounds split)",
            (Some(false), false) => "**no**",
            (Some(false), true) => "**no** (rounds split)",
            (None, _) => "-",
        };
        let _ = writeln!(s, "| {} | {} | {} | {met} |", t.what, t.measured, t.target);
    }

    if let Some((second, rows, _, _)) = servers.second {
        let first = servers.first.0;
        let _ = writeln!(s, "\n## {first} and {second}, side by side\n");
        let _ = writeln!(
            s,
            "The Redis cases on each server, in the same rounds (each round runs one server's cases, then the other's). `cpu µs`: the server's CPU per call (`INFO cpu`).\n"
        );
        let _ = writeln!(
            s,
            "| case | conc | {first} ops/s | {second} ops/s | {first} cpu µs | {second} cpu µs | {first} busy | {second} busy |\n|---|---|---|---|---|---|---|---|"
        );
        for r in &report.rows {
            let Some(v) = find(rows, r.case, r.concurrency) else {
                continue;
            };
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} | {:.0} | {} | {} | {:.0}% | {:.0}% |",
                r.case,
                r.concurrency,
                r.ops_per_sec,
                v.ops_per_sec,
                num(r.redis_cpu_usec_per_call, 2),
                num(v.redis_cpu_usec_per_call, 2),
                r.redis_busy * 100.0,
                v.redis_busy * 100.0,
            );
        }
        let _ = writeln!(
            s,
            "\n{second}, concurrency 1, interleaved (ratios to one `GET`):\n"
        );
        c1_table(&mut s, servers.second.map_or(&[][..], |s| s.2));
    }

    let _ = writeln!(s, "\n## Every case\n");
    let _ = writeln!(
        s,
        "`cmd/call`: client commands per call (Redis `MONITOR`); `redis cpu`: Redis' CPU per call, µs (`INFO cpu`); `busy`: Redis' CPU over the case's wall time. `-`: not a Redis case.\n"
    );
    let _ = writeln!(
        s,
        "| case | conc | ops/s | p50 µs | p99 µs | cmd/call | redis cpu µs | busy |\n|---|---|---|---|---|---|---|---|"
    );
    for r in &report.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.1} | {:.1} | {} | {} | {} |",
            r.case,
            r.concurrency,
            r.ops_per_sec,
            r.p50.as_secs_f64() * 1e6,
            r.p99.as_secs_f64() * 1e6,
            num(r.commands_per_call, 2),
            num(r.redis_cpu_usec_per_call, 2),
            if r.redis_busy.is_nan() {
                "-".into()
            } else {
                format!("{:.0}%", r.redis_busy * 100.0)
            },
        );
    }
    let _ = writeln!(
        s,
        "\nThe batch row's p50 and p99 are per batch of 64. Waiter wake-up (owner's action returns → waiter returns), {} trials: p50 {:.0} µs, p95 {:.0} µs.",
        report.wakeups.len(),
        pct(report, 50),
        pct(report, 95)
    );

    let _ = writeln!(
        s,
        "\n## Concurrency 1, interleaved\n\nEach case's calls in turns of 20 with the other cases', so that every case meets the same stretches of this VM's wake-up latency. Ratios are to one `GET`.\n"
    );
    c1_table(&mut s, c1);

    let _ = writeln!(s, "\n## Bytes per stored record (a 100-byte result)\n");
    let _ = writeln!(
        s,
        "| library | keys per record | bytes per record |\n|---|---|---|"
    );
    for b in bytes {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {:.0} |",
            b.library, b.keys_per_record, b.bytes
        );
    }
    if let Some(pg) = pg {
        let _ = writeln!(s, "\n## PostgreSQL\n\n```text\n{pg}```");
    }
    if let Some((text, _)) = &consumers.kafka {
        let _ = writeln!(s, "\n## Kafka consumer\n\n{text}");
    }
    if let Some((text, _)) = &consumers.jetstream {
        let _ = writeln!(s, "\n## JetStream consumer\n\n{text}");
    }
    if let Some((text, _)) = &consumers.rabbitmq {
        let _ = writeln!(s, "\n## RabbitMQ consumer\n\n{text}");
    }
    if let Some((server, report)) = &consumers.mysql {
        let _ = writeln!(s, "\n## MySQL\n\n{server}\n\n```text\n{report}```");
    }
    let _ = writeln!(s, "\n## Plots\n");
    for (file, _) in plots {
        let _ = writeln!(s, "![{file}]({file})\n");
    }
    s
}

/// The interleaved c=1 latencies of one server as a table, each case's p50 against one
/// `GET`'s.
fn c1_table(s: &mut String, c1: &[(&'static str, Vec<Duration>)]) {
    let get = c1_us(c1, "floor: GET", 50);
    let _ = writeln!(
        s,
        "| case | calls | p50 µs | p99 µs | p50 / GET |\n|---|---|---|---|---|"
    );
    for (case, l) in c1 {
        let (Some(p50), Some(p99)) = (c1_us(c1, case, 50), c1_us(c1, case, 99)) else {
            continue;
        };
        let _ = writeln!(
            s,
            "| {case} | {} | {p50:.1} | {p99:.1} | {} |",
            l.len(),
            get.map_or("-".into(), |g| format!("{:.2}", p50 / g))
        );
    }
}

/// The `p`th percentile of the waiter wake-up latencies, µs.
fn pct(report: &Report, p: usize) -> f64 {
    let w = &report.wakeups;
    if w.is_empty() {
        return f64::NAN;
    }
    w[(w.len() * p / 100).min(w.len() - 1)].as_secs_f64() * 1e6
}
