//! The results' plots: bar charts as SVG, drawn from the report's rows (no plotting
//! library: a few rectangles and labels).

use std::fmt::Write as _;
use std::time::Duration;

use crate::measure::{Report, Row};
use crate::publish::{c1_us, find};
use crate::suite::RecordBytes;

/// The libraries in the plots, in order: (label, case prefix).
const LIBRARIES: [(&str, &str); 9] = [
    ("floor: GET", "floor: GET"),
    ("idemkit", "idemkit"),
    ("idemkit, coalescing on", "idemkit miss, coalescing on"),
    ("idemkit, begin script", "idemkit miss, begin script"),
    ("idemkit, batches of 64", "idemkit miss, batches of 64"),
    ("idempotency-kit (Rust)", "idempotency-kit"),
    ("idempotent (Rust)", "idempotent"),
    ("idempotency-kit (Python)", "idempotency-kit (Python)"),
    ("idemkit (Python)", "idemkit (Python)"),
];

fn series(report: &Report, concurrency: usize, value: impl Fn(&Row) -> f64) -> Vec<Bar> {
    let mut bars = Vec::new();
    for (label, prefix) in LIBRARIES {
        let cases: Vec<(String, &'static str)> = if prefix.starts_with("floor") {
            vec![(prefix.to_string(), "floor")]
        } else if prefix.contains(" miss") {
            vec![(prefix.to_string(), "miss")]
        } else {
            vec![
                (format!("{prefix} hit"), "hit"),
                (format!("{prefix} miss"), "miss"),
            ]
        };
        for (case, kind) in cases {
            if let Some(r) = find(&report.rows, &case, concurrency) {
                bars.push(Bar {
                    label: label.to_string(),
                    kind,
                    value: value(r),
                });
            }
        }
    }
    bars
}

pub(crate) fn plots(
    report: &Report,
    c1: &[(&'static str, Vec<Duration>)],
    bytes: &[RecordBytes],
) -> Vec<(&'static str, String)> {
    let mut latency = Vec::new();
    for (case, _) in c1 {
        let (label, kind) = match case.rsplit_once(' ') {
            Some((lib, k @ ("hit" | "miss"))) => (lib, k),
            _ => (*case, "floor"),
        };
        latency.push(Bar {
            label: label.to_string(),
            kind,
            value: c1_us(c1, case, 50).unwrap_or(f64::NAN),
        });
    }
    let mut out = vec![
        (
            "redis-throughput-c64.svg",
            chart(
                "Redis, 64 concurrent calls: calls per second (higher is better)",
                "calls/s",
                &series(report, 64, |r| r.ops_per_sec),
            ),
        ),
        (
            "redis-latency-c1.svg",
            chart(
                "Redis, one call at a time (cases interleaved): median latency, µs (lower is better)",
                "µs",
                &latency,
            ),
        ),
        (
            "redis-cpu-c64.svg",
            chart(
                "Redis' CPU per call at concurrency 64, µs (lower is better)",
                "µs",
                &series(report, 64, |r| r.redis_cpu_usec_per_call),
            ),
        ),
    ];
    let bars: Vec<Bar> = bytes
        .iter()
        .map(|b| Bar {
            label: b.library.to_string(),
            kind: "bytes",
            value: b.bytes,
        })
        .collect();
    out.push((
        "record-bytes.svg",
        chart(
            "Bytes per stored record, 100-byte result (lower is better)",
            "bytes",
            &bars,
        ),
    ));
    out
}

struct Bar {
    label: String,
    kind: &'static str,
    value: f64,
}

fn color(kind: &str) -> &'static str {
    match kind {
        "hit" => "#4c78a8",
        "miss" => "#f58518",
        "floor" => "#9d9d9d",
        _ => "#54a24b",
    }
}

/// A horizontal bar chart: one bar per row, coloured by kind, its value written beside it.
fn chart(title: &str, unit: &str, bars: &[Bar]) -> String {
    const LEFT: f64 = 200.0;
    const WIDTH: f64 = 900.0;
    const ROW: f64 = 22.0;
    const TOP: f64 = 56.0;
    let max = bars
        .iter()
        .map(|b| b.value)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let plot = WIDTH - LEFT - 110.0;
    let height = TOP + ROW * bars.len() as f64 + 20.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="10" y="20" font-size="15" font-weight="bold">{}</text>"#,
        escape(title)
    );
    let mut kinds: Vec<&str> = bars.iter().map(|b| b.kind).collect();
    kinds.dedup();
    kinds.sort_unstable();
    kinds.dedup();
    for (i, kind) in kinds.iter().enumerate() {
        let x = 10.0 + 90.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="30" width="12" height="12" fill="{}"/><text x="{}" y="40">{kind}</text>"#,
            color(kind),
            x + 16.0
        );
    }
    let mut previous = "";
    for (i, b) in bars.iter().enumerate() {
        let y = TOP + ROW * i as f64;
        if b.label != previous {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                LEFT - 8.0,
                y + 15.0,
                escape(&b.label)
            );
            previous = &b.label;
        }
        let w = if b.value.is_finite() {
            (b.value / max * plot).max(1.0)
        } else {
            0.0
        };
        let _ = writeln!(
            s,
            r#"<rect x="{LEFT}" y="{}" width="{w:.1}" height="{}" fill="{}"/><text x="{}" y="{}">{} {unit}</text>"#,
            y + 3.0,
            ROW - 6.0,
            color(b.kind),
            LEFT + w + 6.0,
            y + 15.0,
            human(b.value)
        );
    }
    let _ = writeln!(s, "</svg>");
    s
}

fn human(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
