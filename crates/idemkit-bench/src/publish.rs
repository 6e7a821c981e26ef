//! Writing one run's results: `results.md` (the machine, the versions, the command, every
//! table, and the ratios against the targets) and the plots as SVG, into one directory that
//! `docs/benchmarks.md` embeds.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::kafka::ConsumerRow;
use crate::measure::{Report, Row};
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
    let servers = Servers {
        first: (&meta.redis_version, &report.rows, c1),
        second: meta
            .second_version
            .as_ref()
            .map(|v| (v, &report.second[..], c1_second)),
    };
    std::fs::write(
        dir.join("results.md"),
        markdown(meta, report, &servers, bytes, pg, consumers, &plots),
    )
}

/// One server's Redis cases: its name and version, its rows, its interleaved c=1 latencies.
type OnServer<'a> = (&'a String, &'a [Row], &'a [(&'static str, Vec<Duration>)]);

/// The servers the Redis cases ran on: the first (`--store`) and the second (`--valkey`).
struct Servers<'a> {
    first: OnServer<'a>,
    second: Option<OnServer<'a>>,
}

impl<'a> Servers<'a> {
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
}

fn targets(
    report: &Report,
    servers: &Servers<'_>,
    pg: Option<&SqlReport>,
    consumers: &Consumers,
) -> Vec<Target> {
    let mut out = Vec::new();
    let mut ratio = |what: String, num: Option<f64>, den: Option<f64>, target, at_least: f64| {
        if let (Some(n), Some(d)) = (num, den) {
            let r = n / d;
            out.push(Target {
                what,
                measured: format!("{r:.2}× ({n:.0} / {d:.0})"),
                target,
                met: Some(r >= at_least),
            });
        }
    };
    // Redis and Valkey, issue 35: first deliveries ahead of every peer on each server.
    for (server, rows, _) in servers.each() {
        let valkey = server.starts_with("Valkey");
        // Issue 51's targets: Valkey 9.1 at least 1.5×, Redis 7.0 at least 1.1×.
        let misses = if valkey {
            ("≥ 1.50×", 1.5)
        } else {
            ("≥ 1.10×", 1.1)
        };
        for (kind, (target, at_least)) in [("miss", misses), ("hit", ("≥ 1.50×", 1.5))] {
            let ik = ops_in(rows, &format!("idempotency-kit {kind}"), 64);
            let idem = ops_in(rows, &format!("idempotent {kind}"), 64);
            let fastest = match (ik, idem) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
            ratio(
                format!("{server}: c=64 {kind}es/s: idemkit / the fastest Rust peer")
                    .replace("hites", "hits"),
                ops_in(rows, &format!("idemkit {kind}"), 64),
                fastest,
                target,
                at_least,
            );
        }
    }
    for kind in ["hit", "miss"] {
        ratio(
            format!("c=64 {kind}es/s: idemkit / idempotency-kit (Python)").replace("hites", "hits"),
            ops(report, &format!("idemkit {kind}"), 64),
            ops(report, &format!("idempotency-kit (Python) {kind}"), 64),
            "≥ 45×",
            45.0,
        );
    }
    // The Python package, issue 27: the same asyncio driver, the same Redis.
    for kind in ["hit", "miss"] {
        ratio(
            format!("c=64 {kind}es/s: idemkit (Python) / idempotency-kit (Python)")
                .replace("hites", "hits"),
            ops(report, &format!("idemkit (Python) {kind}"), 64),
            ops(report, &format!("idempotency-kit (Python) {kind}"), 64),
            "≥ 5×",
            5.0,
        );
    }
    for (server, rows, c1) in servers.each() {
        let valkey = server.starts_with("Valkey");
        if let (Some(miss), Some(get)) =
            (find(rows, "idemkit miss", 64), find(rows, "floor: GET", 64))
        {
            let (us, per_get) = (miss.redis_cpu_usec_per_call, get.redis_cpu_usec_per_call);
            out.push(Target {
                what: format!("{server}: server CPU per coalesced miss, c=64 (`INFO cpu`)"),
                measured: format!(
                    "{us:.2} µs ({:.1} GETs' worth at c=64: {per_get:.2} µs each)",
                    us / per_get
                ),
                target: if valkey { "≤ 4 µs" } else { "(measured)" },
                met: valkey.then_some(us <= 4.0),
            });
        }
        let get = c1_us(c1, "floor: GET", 50);
        if let (Some(hit), Some(get)) = (c1_us(c1, "idemkit hit", 50), get) {
            let r = hit / get;
            out.push(Target {
                what: format!("{server}: c=1 hit p50 / one GET's p50 (interleaved)"),
                measured: format!("{r:.2}× ({hit:.1} / {get:.1} µs)"),
                target: "≤ 1.10×",
                met: Some(r <= 1.1),
            });
        }
        if let (Some(miss), Some(get)) = (c1_us(c1, "idemkit miss", 50), get) {
            let r = miss / (2.0 * get);
            out.push(Target {
                what: format!("{server}: c=1 miss p50 / two GETs' p50 (interleaved)"),
                measured: format!("{r:.2}× ({miss:.1} / 2 × {get:.1} µs)"),
                target: "≤ 1.20×",
                met: Some(r <= 1.2),
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
            });
        }
        if let Some(r) = find("runner + idemkit (Redis), batch 64, 1 ms handler") {
            out.push(Target {
                what: "Kafka runner, 1 ms handler: idemkit (Redis) / idempotency off".into(),
                measured: format!("{:.2}× ({:.0}/s)", r.vs_off, r.per_sec),
                target: "≥ 0.80×",
                met: Some(r.vs_off >= 0.8),
            });
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
                out.push(Target {
                    what: format!("{runner} runner{what}: idemkit (Redis) / idempotency off"),
                    measured: format!("{:.2}× ({:.0}/s)", r.vs_off, r.per_sec),
                    target,
                    met: Some(r.vs_off >= at_least),
                });
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
            });
        }
    }
    out.push(Target {
        what: "Redis instructions per miss, coalesced at c=64 / per key in a batch of 64".into(),
        measured: "`scripts/redis-instructions` (callgrind), not part of this run".into(),
        target: "(counted)",
        met: None,
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
        "- **Client:** {} tokio worker thread(s) for every library; each row is the round with the median throughput of {} interleaved round(s).\n",
        report.workers, report.rounds
    );

    let c1 = servers.first.2;
    let _ = writeln!(s, "## Against the targets\n");
    let _ = writeln!(s, "| ratio | measured | target | met |\n|---|---|---|---|");
    for t in targets(report, servers, pg, consumers) {
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        let _ = writeln!(s, "| {} | {} | {} | {met} |", t.what, t.measured, t.target);
    }

    if let Some((second, rows, _)) = servers.second {
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
