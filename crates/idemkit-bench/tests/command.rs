//! The benchmark command end to end, small: `idemkit-bench --out DIR` against a Redis
//! server this test starts (no PostgreSQL, no Python peer) writes `results.md` with every
//! section and a ratio for each target it can measure, and four SVG plots with one bar per
//! measured case. The figures themselves are not judged here: timing claims belong to the
//! benchmark's own run. The MemoryStore's bytes per entry come from the
//! `memory_entry_bytes` example, which `cargo test -p idemkit-bench` builds beside the binary.

use idemkit_test::redis_server::RedisProcess;

#[test]
fn the_benchmark_writes_its_tables_and_plots() {
    let server = RedisProcess::start(&[]);
    let dir = std::env::temp_dir().join(format!("idemkit-bench-{:x}", fastrand::u64(..)));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_idemkit-bench"));
    cmd.args([
        "--store",
        &server.url(),
        "--ops",
        "640",
        "--rounds",
        "1",
        // One round whatever the figures: a target whose middle half straddles it would run
        // a second (`--max-rounds` defaults to twice `--rounds`), and the slice counts
        // checked below are one round's (a fresh clone's run of `660bea8` ran two).
        "--max-rounds",
        "1",
        // Short head-to-head slices: this checks what the command writes, not its figures.
        "--slice-ms",
        "5",
        "--out",
    ])
    .arg(&dir);
    // The second server, Valkey 9 (scripts/test provides it: IDEMKIT_VALKEY_SERVER).
    let valkey = std::env::var("IDEMKIT_VALKEY_SERVER").ok();
    let found = valkey
        .as_deref()
        .is_some_and(|b| std::path::Path::new(b).exists());
    let second = idemkit_test::require_service("valkey-server (IDEMKIT_VALKEY_SERVER)", found)
        .then(|| RedisProcess::start_as(valkey.as_deref().unwrap(), &[]));
    if let Some(second) = &second {
        cmd.args(["--valkey", &second.url()]);
    }
    // The consumer cases, on the brokers scripts/test provides (small).
    let brokers = std::env::var("IDEMKIT_KAFKA_BROKERS").ok();
    let nats = std::env::var("IDEMKIT_NATS_URL").ok();
    if let (Some(b), Some(n)) = (&brokers, &nats) {
        cmd.args(["--kafka", b, "--jetstream", n, "--kafka-messages", "500"]);
    }
    // The RabbitMQ runner and the MySQL store (the machine's, or scripts/test's URLs): their
    // tables and targets are written too (issue 51).
    let amqp = std::env::var("IDEMKIT_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let mysql = std::env::var("IDEMKIT_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let reachable = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
    let rabbitmq = idemkit_test::require_service(
        "RabbitMQ (IDEMKIT_AMQP_URL)",
        std::env::var_os("IDEMKIT_AMQP_URL").is_some() || reachable(5672),
    );
    if rabbitmq {
        cmd.args(["--rabbitmq", &amqp]);
        if brokers.is_none() || nats.is_none() {
            // Small, as the Kafka and JetStream cases above (which set it when they run).
            cmd.args(["--kafka-messages", "500"]);
        }
    }
    let with_mysql = idemkit_test::require_service(
        "MySQL or MariaDB (IDEMKIT_MYSQL_URL)",
        std::env::var_os("IDEMKIT_MYSQL_URL").is_some() || reachable(3306),
    );
    if with_mysql {
        cmd.args(["--mysql", &mysql]);
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Progress is shown, case by case.
    assert!(stderr.contains("idemkit miss, c=64, 640 calls"), "{stderr}");

    let results = std::fs::read_to_string(dir.join("results.md")).unwrap();
    let mut servers = vec!["Redis "];
    if second.is_some() {
        servers.push("Valkey 9");
        assert!(
            results.contains("## Redis 7"),
            "no side-by-side table in\n{results}"
        );
        assert!(results.contains(" and Valkey 9."), "{results}");
    }
    for server in servers {
        for what in [
            "c=64 misses/s: idemkit / the fastest Rust peer | ",
            "c=64 hits/s: idemkit / the fastest Rust peer | ",
            "c=1 hit p50 / one GET's p50 (interleaved) | ",
            "c=1 miss p50 / two GETs' p50 (interleaved) | ",
            "server CPU per coalesced miss, c=64 (`INFO cpu`) | ",
        ] {
            let line = results
                .lines()
                .find(|l| l.starts_with(&format!("| {server}")) && l.contains(what));
            assert!(line.is_some(), "no {server}…{what:?} in\n{results}");
            // Decided slice by slice: the median ratio, the middle half, ten slices a round
            // (one round here), and the median rounds' rows.
            if what.contains("peer") {
                let line = line.unwrap();
                assert!(
                    line.contains("×, 10 slices; the median rounds' rows "),
                    "{line}"
                );
            }
        }
    }
    for line in [
        "| idemkit MemoryStore hit, one task (wall time per call, calls not timed one by one) | ",
        "| idemkit MemoryStore miss, one task (wall time per call, calls not timed one by one) | ",
        "| Encryption (idemkit-seal) on a MemoryStore hit: time per call, encrypted / plain | ",
        "| Encryption (idemkit-seal) on Redis, c=64 misses/s: encrypted / plain | ",
        "| idemkit miss, batches of 64 | 64 | ",
        "| idempotent miss | 64 | ",
        "| idemkit MemoryStore | 1.00 | ",
        "| idempotency-kit | 2.00 | ",
        "![redis-throughput-c64.svg](redis-throughput-c64.svg)",
    ] {
        assert!(results.contains(line), "no {line:?} in\n{results}");
    }
    if brokers.is_some() && nats.is_some() {
        for line in [
            "| Kafka runner, 1 ms handler: idemkit (Redis) / idempotency off | ",
            "| JetStream runner, 1 ms handler: idemkit (Redis) / idempotency off | ",
            "## Kafka consumer",
            "| runner + idemkit (Redis), batch 64, 1 ms handler | ",
            "## JetStream consumer",
            "| JetStream runner + idemkit (Redis) | ",
        ] {
            assert!(results.contains(line), "no {line:?} in\n{results}");
        }
    }
    if rabbitmq {
        for line in [
            "| RabbitMQ runner, empty handler: idemkit (Redis) / idempotency off | ",
            "| RabbitMQ runner, 1 ms handler: idemkit (Redis) / idempotency off | ",
            "## RabbitMQ consumer",
            "| RabbitMQ runner + idemkit (Redis) | ",
        ] {
            assert!(results.contains(line), "no {line:?} in\n{results}");
        }
    }
    if with_mysql {
        assert!(
            results.contains("\n## MySQL\n"),
            "no MySQL section in\n{results}"
        );
        assert!(
            results
                .lines()
                .any(|l| l.contains(": c=64 misses/s / the hand-written table's | ")),
            "no MySQL target in\n{results}"
        );
    }
    // Without --python, no Python ratio is claimed.
    assert!(!results.contains("(Python)"), "{results}");
    // Every ratio row has a measured figure: "1.23× (…)".
    let ratios = results
        .lines()
        .filter(|l| l.contains(": c=64 ") && l.contains("peer"))
        .count();
    assert_eq!(
        ratios,
        2 * if second.is_some() { 2 } else { 1 },
        "{results}"
    );

    // One bar per case: c=64 throughput has the floor, idemkit's hit and miss, the miss
    // with coalescing on, the miss with every begin the script, the batches, and both Rust
    // peers' hit and miss.
    let svg = std::fs::read_to_string(dir.join("redis-throughput-c64.svg")).unwrap();
    assert!(svg.starts_with("<svg "), "{svg}");
    let bars = svg.matches("<rect x=\"200\"").count();
    assert_eq!(bars, 10, "{svg}");
    for plot in [
        "redis-latency-c1.svg",
        "redis-cpu-c64.svg",
        "record-bytes.svg",
    ] {
        let svg = std::fs::read_to_string(dir.join(plot)).unwrap();
        assert!(
            svg.contains("</svg>") && svg.contains("<rect x=\"200\""),
            "{plot}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
