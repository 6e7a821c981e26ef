//! The Prometheus recipe of docs/metrics.md: the example's scrape holds every metric of the
//! table with the counts its calls imply, and every metric the Grafana dashboard queries is
//! either in the scrape or one of `idemkit serve`'s.

use std::collections::BTreeSet;
use std::path::Path;

fn value(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn the_example_exports_every_metric_the_docs_and_the_dashboard_name() {
    let out = std::process::Command::new(idemkit_test::example_binary("prometheus"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let scrape = String::from_utf8(out.stdout).unwrap();

    // The counts the example's calls imply: 3 misses (two keys and the reused key's first
    // request), 2 hits (the replay and the waiter), 1 wait, 1 rejection, 1 reused key.
    let op = "{operation=\"mail.invoice\"}";
    for (metric, want) in [
        ("idemkit_misses_total", 3.0),
        ("idemkit_hits_total", 2.0),
        ("idemkit_waits_total", 1.0),
        ("idemkit_rejections_total", 1.0),
        ("idemkit_key_reuse_total", 1.0),
        ("idemkit_lease_lost_total", 0.0),
    ] {
        assert_eq!(
            value(&scrape, &format!("{metric}{op}")),
            Some(want),
            "{metric}\n{scrape}"
        );
    }
    assert!(
        scrape.contains("# TYPE idemkit_phase_seconds histogram"),
        "{scrape}"
    );

    // The docs' table names exactly the metrics in `observe`, and the scrape has them all.
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/metrics.md"),
    )
    .unwrap();
    let documented: BTreeSet<&str> = docs
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    use idemkit_core::observe::*;
    for name in [
        HITS,
        MISSES,
        TAKEOVERS,
        WAITS,
        REJECTIONS,
        KEY_REUSE,
        STORE_ERRORS,
        UNPROTECTED_RUNS,
        LEASE_LOST,
        COMPLETION_FAILED,
        RESULTS_UNAVAILABLE,
        PHASE_SECONDS,
    ] {
        assert!(
            documented.contains(name),
            "{name} is not in docs/metrics.md"
        );
        assert!(
            scrape.contains(&format!("# TYPE {name} ")),
            "{name} is not exported"
        );
    }

    // Every metric a dashboard panel queries exists.
    let dashboard = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/grafana-dashboard.json"),
    )
    .unwrap();
    let mut queried = BTreeSet::new();
    for (i, _) in dashboard.match_indices("idemkit_") {
        let name: String = dashboard[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        queried.insert(name.trim_end_matches("_bucket").to_string());
    }
    queried.remove("idemkit_"); // the dashboard's uid and tag
    assert!(queried.len() >= 15, "{queried:?}");
    for name in &queried {
        let in_scrape = scrape.contains(&format!("# TYPE {name} "));
        assert!(
            in_scrape || (name.starts_with("idemkit_store_") && documented.contains(name.as_str())),
            "the dashboard queries {name}, which nothing exports"
        );
    }
}
