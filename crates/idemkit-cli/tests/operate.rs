//! `idemkit list`, `purge` and `stats` against real Redis (one server and a Cluster) and
//! PostgreSQL, run as a user runs them (the built binary), with their exit codes; and a
//! stuck reservation left by a worker process that was really killed, which `list` shows and
//! `release` frees so that the next delivery runs.

mod support;

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{CompleteRequest, Key, Operation, RawStore, ResultKind, StorageKey, Store};
use serde_json::Value;

/// The password of the stores in the `..._password_...` tests: no output may carry it.
const SECRET: &str = "pw-Secret-31337";

/// Runs the binary; every output of every run is checked for [`SECRET`].
fn idemkit_with_input(args: &[String], input: &str) -> Output {
    let out = run_binary(args, input);
    for (what, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let text = String::from_utf8_lossy(text);
        assert!(
            !text.contains(SECRET),
            "idemkit {}: the store password in its {what}: {text}",
            args.first().map_or("", String::as_str)
        );
    }
    out
}

fn run_binary(args: &[String], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idemkit"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `idemkit CMD <store args> EXTRA...` with no input.
struct Cli {
    store: Vec<String>,
}

impl Cli {
    fn args(&self, cmd: &str, extra: &[&str]) -> Vec<String> {
        let mut v = vec![cmd.to_string()];
        v.extend(self.store.iter().cloned());
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    }

    fn run(&self, cmd: &str, extra: &[&str]) -> Output {
        idemkit_with_input(&self.args(cmd, extra), "")
    }

    fn json(&self, cmd: &str, extra: &[&str]) -> Value {
        let mut extra = extra.to_vec();
        extra.push("--json");
        let out = self.run(cmd, &extra);
        assert_eq!(code(&out), 0, "{cmd} {extra:?}: {}", stderr(&out));
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{cmd}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// `list --json` of one operation: the states, in the store's order.
    fn states(&self, op: &str, extra: &[&str]) -> Vec<String> {
        let mut args = vec!["--operation", op];
        args.extend_from_slice(extra);
        let v = self.json("list", &args);
        let mut states: Vec<String> = v
            .as_array()
            .expect("an array")
            .iter()
            .map(|r| r["state"].as_str().unwrap().to_string())
            .collect();
        states.sort();
        states
    }
}

fn count(states: &[String], state: &str) -> usize {
    states.iter().filter(|s| *s == state).count()
}

async fn reserve<S: Store>(store: &S, key: &StorageKey) -> idemkit_core::Ownership {
    idemkit_test::reserve(store, key, Duration::from_secs(3600)).await
}

/// Every command on one store: 3 reservations, 4 completed records and 1 foreign entry of
/// one operation, and 2 completed records of another.
async fn commands<S: Store + RawStore>(store: S, cli: Cli) {
    let op_name = format!("ops-{:x}", fastrand::u64(..));
    let other_name = format!("other-{:x}", fastrand::u64(..));
    let op = Operation::new(op_name.as_str()).unwrap();
    let other = Operation::new(other_name.as_str()).unwrap();
    let key = |op: &Operation, k: String| StorageKey::new(op, None, &Key::new(k).unwrap());
    let done = CompleteRequest::new(
        ResultKind::Value,
        Bytes::from_static(b"\"em_1\""),
        Duration::from_secs(3600),
    );
    for i in 0..3 {
        reserve(&store, &key(&op, format!("r{i}"))).await;
    }
    for (o, n) in [(&op, 4), (&other, 2)] {
        for i in 0..n {
            let k = key(o, format!("c{i}"));
            let lease = reserve(&store, &k).await;
            store.complete(&k, &lease, &done).await.unwrap();
        }
    }
    store
        .put_raw(
            &key(&op, "foreign".into()),
            Bytes::from_static(b"not a record"),
            Duration::from_secs(3600),
        )
        .await
        .unwrap();

    // list: every record of the operation, then by state, age and limit.
    let states = cli.states(&op_name, &[]);
    assert_eq!(states.len(), 8, "{states:?}");
    assert_eq!(count(&states, "reserved"), 3);
    assert_eq!(count(&states, "completed"), 4);
    assert_eq!(count(&states, "unreadable"), 1);
    assert_eq!(cli.states(&op_name, &["--state", "reserved"]).len(), 3);
    assert_eq!(cli.states(&op_name, &["--limit", "2"]).len(), 2);
    assert_eq!(cli.states(&op_name, &["--older-than", "1h"]).len(), 0);
    assert_eq!(cli.states(&op_name, &["--older-than", "0s"]).len(), 7);
    let text = cli.run("list", &["--operation", &op_name, "--state", "completed"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("completed")).count(),
        4,
        "{text}"
    );
    assert!(text.contains(&format!("{op_name}  -  c0")), "{text}");

    // stats: per operation and state.
    let stats = cli.json("stats", &[]);
    let s = &stats["operations"][&op_name];
    assert_eq!(
        (
            s["reserved"].as_u64(),
            s["completed"].as_u64(),
            s["unreadable"].as_u64()
        ),
        (Some(3), Some(4), Some(1)),
        "{stats}"
    );
    assert!(s["bytes"].as_u64().unwrap() > 0);
    assert_eq!(stats["operations"][&other_name]["completed"], 2);

    // purge: dry run, refused, confirmed; only what matches, only the operation's.
    let dry = cli.json(
        "purge",
        &["--operation", &op_name, "--state", "completed", "--dry-run"],
    );
    assert_eq!(
        (dry["matched"].as_u64(), dry["purged"].as_u64()),
        (Some(4), Some(0))
    );
    assert_eq!(count(&cli.states(&op_name, &[]), "completed"), 4);
    let purge = cli.args("purge", &["--operation", &op_name, "--state", "completed"]);
    let refused = idemkit_with_input(&purge, "n\n");
    assert_eq!(code(&refused), 6, "{}", stderr(&refused));
    assert_eq!(count(&cli.states(&op_name, &[]), "completed"), 4);
    let confirmed = idemkit_with_input(&purge, "y\n");
    assert_eq!(code(&confirmed), 0, "{}", stderr(&confirmed));
    assert!(
        String::from_utf8_lossy(&confirmed.stdout).contains("purged 4 records"),
        "{}",
        String::from_utf8_lossy(&confirmed.stdout)
    );
    let states = cli.states(&op_name, &[]);
    assert_eq!(
        (count(&states, "completed"), count(&states, "reserved")),
        (0, 3)
    );
    assert_eq!(
        cli.states(&other_name, &[]).len(),
        2,
        "another operation untouched"
    );
    // What is left are 3 live reservations: refused without --force or --older-than
    // (issue 20: before, a generic prompt and they were gone).
    let live = idemkit_with_input(&cli.args("purge", &["--operation", &op_name, "--yes"]), "");
    assert_eq!(code(&live), 6, "{}", stderr(&live));
    assert!(
        stderr(&live).contains("3 of the 3 records"),
        "{}",
        stderr(&live)
    );
    assert_eq!(count(&cli.states(&op_name, &[]), "reserved"), 3);
    let young = idemkit_with_input(
        &cli.args(
            "purge",
            &["--operation", &op_name, "--older-than", "1h", "--yes"],
        ),
        "",
    );
    assert_eq!(code(&young), 0, "{}", stderr(&young));
    assert_eq!(
        count(&cli.states(&op_name, &[]), "reserved"),
        3,
        "none held for an hour"
    );
    let all = cli.json(
        "purge",
        &["--operation", &op_name, "--yes", "--force", "--batch", "2"],
    );
    assert_eq!(all["purged"], 3, "{all}");
    assert_eq!(
        cli.states(&op_name, &[]),
        vec!["unreadable".to_string()],
        "foreign bytes are never purged"
    );

    // Bad input: one line, a distinct exit code, nothing done.
    for (args, want) in [
        (cli.args("list", &["--operation", "bad op!"]), 2),
        (cli.args("list", &["--older-than", "5 parsecs"]), 2),
        (cli.args("purge", &["--state", "unreadable", "--yes"]), 2),
    ] {
        let out = idemkit_with_input(&args, "");
        assert_eq!(code(&out), want, "{args:?}: {}", stderr(&out));
    }
    assert_eq!(cli.states(&other_name, &[]).len(), 2);
    store.purge(&key(&op, "foreign".into())).await.unwrap();
    cli.json("purge", &["--operation", &other_name, "--yes"]);
}

fn redis_url() -> String {
    std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn postgres_url() -> String {
    std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

const SCHEMA: &str = "idemkit_cli_operate";

fn mysql_url() -> String {
    std::env::var("IDEMKIT_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The machine's MariaDB or MySQL, on the default table (as the worker example uses).
async fn mysql() -> Option<idemkit_mysql::MySqlStore> {
    let store = idemkit_mysql::MySqlStore::builder()
        .max_connections(4)
        .connect(&mysql_url())
        .await;
    if !idemkit_test::require_service("mysql", store.is_ok()) {
        return None;
    }
    let store = store.unwrap();
    store.migrate().await.unwrap();
    Some(store)
}

async fn postgres() -> Option<idemkit_postgres::PgStore> {
    let store = idemkit_postgres::PgStore::builder()
        .schema(SCHEMA)
        .max_connections(4)
        .connect(&postgres_url())
        .await;
    if !idemkit_test::require_service("postgres", store.is_ok()) {
        return None;
    }
    let store = store.unwrap();
    store.migrate().await.unwrap();
    Some(store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_purge_and_stats_on_redis() {
    let prefix = format!("idemkit-cli-ops-{:x}", fastrand::u64(..));
    let store = idemkit_redis::RedisStore::builder()
        .prefix(prefix.as_str())
        .connect(&redis_url())
        .await;
    if !idemkit_test::require_service("redis", store.is_ok()) {
        return;
    }
    let cli = Cli {
        store: vec!["--store".into(), redis_url(), "--prefix".into(), prefix],
    };
    commands(store.unwrap(), cli).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_purge_and_stats_on_postgres() {
    let Some(store) = postgres().await else {
        return;
    };
    let cli = Cli {
        store: vec![
            "--store".into(),
            postgres_url(),
            "--schema".into(),
            SCHEMA.into(),
        ],
    };
    commands(store, cli).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_purge_and_stats_on_mysql() {
    let Some(store) = mysql().await else {
        return;
    };
    let cli = Cli {
        store: vec!["--store".into(), mysql_url()],
    };
    commands(store, cli).await;
}

/// Every command, with the Redis password in the URL: the commands work, and no output
/// (tables, JSON, prompts, progress, errors, the status page) carries the password. The
/// same runs as `list_purge_and_stats_on_redis`, through the checking runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_output_carries_the_redis_password() {
    let server = idemkit_test::redis_server::RedisProcess::start(&[]);
    let port = server.url().rsplit(':').next().unwrap().to_string();
    let set = Command::new("redis-cli")
        .args(["-p", &port, "config", "set", "requirepass", SECRET])
        .output()
        .unwrap();
    assert!(set.status.success() && set.stdout.starts_with(b"OK"));
    let url = format!("redis://:{SECRET}@127.0.0.1:{port}/0");
    let prefix = format!("idemkit-cli-pw-{:x}", fastrand::u64(..));
    let store = idemkit_redis::RedisStore::builder()
        .prefix(prefix.as_str())
        .connect(&url)
        .await
        .expect("the store with its password");
    let cli = Cli {
        store: vec![
            "--store".into(),
            url.clone(),
            "--prefix".into(),
            prefix.clone(),
        ],
    };
    commands(store, cli).await;
    // A wrong password: an error that names the store without any password.
    let wrong = format!("redis://:{SECRET}-wrong@127.0.0.1:{port}/0");
    let out = idemkit_with_input(
        &[
            "list".into(),
            "--store".into(),
            wrong,
            "--prefix".into(),
            prefix.clone(),
        ],
        "",
    );
    assert_ne!(code(&out), 0);
    // The status page and its metrics.
    let page = tokio::task::spawn_blocking(move || {
        let server = support::Server::start(&["--store", &url, "--prefix", &prefix], &[]);
        let get = |path: &str| {
            let out = Command::new("curl")
                .args(["-s", &format!("{}{path}", server.base)])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        (get("/"), get("/metrics"))
    })
    .await
    .unwrap();
    assert!(page.0.contains("127.0.0.1"), "{}", page.0);
    assert!(!page.0.contains(SECRET) && !page.1.contains(SECRET));
}

/// The same on PostgreSQL, the password in the userinfo and as a query parameter (the
/// machine's server trusts loopback, so the password is carried, never checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_output_carries_the_postgres_password() {
    let Some(store) = postgres().await else {
        return;
    };
    let base = postgres_url();
    let url = base.replacen("postgres@", &format!("postgres:{SECRET}@"), 1);
    assert!(url.contains(SECRET), "{base}: a URL with a user");
    let cli = Cli {
        store: vec!["--store".into(), url, "--schema".into(), SCHEMA.into()],
    };
    commands(store, cli).await;
    let out = idemkit_with_input(
        &[
            "stats".into(),
            "--store".into(),
            format!("postgres://postgres@127.0.0.1:1/test?password={SECRET}"),
        ],
        "",
    );
    assert_ne!(code(&out), 0, "nothing listens on port 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_on_a_redis_cluster() {
    let cluster = idemkit_test::redis_server::Cluster::start();
    let prefix = format!("idemkit-cli-ops-{:x}", fastrand::u64(..));
    let store = idemkit_redis::RedisStore::builder()
        .prefix(prefix.as_str())
        .connect_cluster(cluster.urls())
        .await
        .unwrap();
    // Any node names the Cluster; the others are found from it.
    let url = format!("redis+cluster://127.0.0.1:{}", cluster.nodes[0].port);
    let cli = Cli {
        store: vec!["--store".into(), url, "--prefix".into(), prefix.clone()],
    };
    // The keys spread over the three primaries, and `list` finds them all.
    let op = Operation::new("spread").unwrap();
    for i in 0..30 {
        reserve(
            &store,
            &StorageKey::new(&op, None, &Key::new(format!("k{i}")).unwrap()),
        )
        .await;
    }
    for n in &cluster.nodes {
        assert!(idemkit_test::redis_server::dbsize(n.port) > 0);
    }
    assert_eq!(cli.states("spread", &["--limit", "100"]).len(), 30);
    // inspect and release address one record on its node.
    let shown = cli.json("inspect", &["spread", "k7"]);
    assert_eq!(shown["state"], "reserved");
    let released = cli.run("release", &["spread", "k7"]);
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    assert_eq!(code(&cli.run("inspect", &["spread", "k7"])), 3);
    cli.json("purge", &["--operation", "spread", "--yes", "--force"]);
    assert_eq!(cli.states("spread", &[]).len(), 0);

    commands(store, cli).await;
    drop(cluster);
}

#[test]
fn a_store_that_is_down_is_exit_4() {
    for store in [
        "redis://127.0.0.1:1",
        "redis+cluster://127.0.0.1:1",
        "postgres://postgres@127.0.0.1:1/test",
        "mysql://root@127.0.0.1:1/test",
    ] {
        for cmd in [
            vec!["list"],
            vec!["stats"],
            vec!["purge", "--yes"],
            vec!["release", "op", "k"],
        ] {
            let mut args: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
            args.extend(["--store".to_string(), store.to_string()]);
            let out = idemkit_with_input(&args, "");
            assert_eq!(code(&out), 4, "{args:?}: {}", stderr(&out));
            let err = stderr(&out);
            assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
            assert!(!err.contains("panicked"), "{err}");
        }
    }
}

/// The worker example: one delivery of `key`, working for `work`.
fn worker(store: &[&str], key: &str, work: &str) -> std::process::Child {
    Command::new(idemkit_test::example_binary("invoice_worker"))
        .args(store)
        .args(["--key", key, "--work", work])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the invoice_worker example is built by `cargo test`")
}

/// A worker really killed mid-action leaves its reservation; the next delivery is refused
/// (requeued) until `release`, then runs at once with a higher fencing token.
fn stuck_reservation(store: &[&str]) {
    let key = format!("order-{:x}", fastrand::u64(..));
    let cli = Cli {
        store: store.iter().map(|s| s.to_string()).collect(),
    };
    let mut first = worker(store, &key, "1h");
    let mut line = String::new();
    BufReader::new(first.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let stuck: u64 = line
        .strip_prefix("reserved ")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the worker said {line:?}"));
    first.kill().unwrap(); // SIGKILL: no release, no completion, no renewal.
    first.wait().unwrap();

    // The stuck reservation is listed, with the dead owner's fencing token.
    let listed = cli.json(
        "list",
        &["--operation", "mail.invoice", "--state", "reserved"],
    );
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key.as_str())
        .unwrap_or_else(|| panic!("{key} not listed: {listed}"));
    assert_eq!(row["fencing"], stuck);

    // The next delivery is refused while it is stuck...
    let blocked = worker(store, &key, "0s").wait_with_output().unwrap();
    assert_eq!(
        code(&blocked),
        3,
        "{}",
        String::from_utf8_lossy(&blocked.stdout)
    );

    // ... and runs once the operator releases it.
    let released = cli.run("release", &["mail.invoice", &key]);
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    // Said once, with whose reservation it was. Before: on stderr and stdout both.
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&released.stdout),
        stderr(&released)
    );
    assert_eq!(
        said.matches("released the reservation").count(),
        1,
        "{said}"
    );
    assert!(said.contains(&format!("fencing {stuck}")), "{said}");
    let next = worker(store, &key, "0s").wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&next.stdout);
    assert_eq!(code(&next), 0, "{said}");
    let fencing: u64 = said
        .lines()
        .find_map(|l| l.strip_prefix("reserved "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(fencing > stuck, "the fencing token still increases");
    assert!(said.contains(&format!("mailed em_{fencing}")), "{said}");
    let shown = cli.json("inspect", &["mail.invoice", &key]);
    assert_eq!(shown["state"], "completed");
}

/// Runs a worker-process scenario (blocking) against the machine's Redis, under a fresh
/// prefix.
async fn on_redis(scenario: fn(&[&str])) {
    let prefix = format!("idemkit-cli-workers-{:x}", fastrand::u64(..));
    let up = idemkit_redis::RedisStore::connect(&redis_url())
        .await
        .is_ok();
    if !idemkit_test::require_service("redis", up) {
        return;
    }
    let url = redis_url();
    tokio::task::spawn_blocking(move || scenario(&["--store", &url, "--prefix", &prefix]))
        .await
        .unwrap();
}

/// Runs a worker-process scenario (blocking) against the machine's PostgreSQL.
async fn on_postgres(scenario: fn(&[&str])) {
    if postgres().await.is_none() {
        return;
    }
    let url = postgres_url();
    tokio::task::spawn_blocking(move || scenario(&["--store", &url, "--schema", SCHEMA]))
        .await
        .unwrap();
}

/// Runs a worker-process scenario (blocking) against the machine's MariaDB or MySQL.
async fn on_mysql(scenario: fn(&[&str])) {
    if mysql().await.is_none() {
        return;
    }
    let url = mysql_url();
    tokio::task::spawn_blocking(move || scenario(&["--store", &url]))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_reservation_is_listed_and_released_on_mysql() {
    on_mysql(stuck_reservation).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_reservation_is_listed_and_released_on_redis() {
    on_redis(stuck_reservation).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_reservation_is_listed_and_released_on_postgres() {
    on_postgres(stuck_reservation).await;
}

/// `list` and `stats` that find nothing say where they looked and how to look elsewhere.
/// Before: an empty table under a mistyped prefix, and no hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_listing_names_the_prefix_it_read() {
    let prefix = format!("idemkit-cli-typo-{:x}", fastrand::u64(..));
    let up = idemkit_redis::RedisStore::connect(&redis_url()).await;
    if !idemkit_test::require_service("redis", up.is_ok()) {
        return;
    }
    let cli = Cli {
        store: vec![
            "--store".into(),
            redis_url(),
            "--prefix".into(),
            prefix.clone(),
        ],
    };
    for cmd in ["list", "stats"] {
        let out = cli.run(cmd, &[]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let said = stderr(&out);
        assert!(
            said.contains(&format!("{prefix:?}")) && said.contains("--prefix"),
            "{cmd}: {said}"
        );
    }
}

/// One row of `list --json` for `key`.
fn listed(cli: &Cli, key: &str) -> Value {
    listed_if(cli, key).unwrap_or_else(|v| panic!("{key} not listed: {v}"))
}

/// One row of `list --json` for `key`, or the whole listing without it.
fn listed_if(cli: &Cli, key: &str) -> Result<Value, Value> {
    let v = cli.json(
        "list",
        &["--operation", "mail.invoice", "--state", "reserved"],
    );
    let row = v
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .cloned();
    row.ok_or(v)
}

/// A worker whose reservation is renewed every 6 s (lease 18 s): `list` shows its host and
/// process id and does not flag it while it runs; stopped with SIGSTOP (alive, renewing
/// nothing), it is flagged stale once two renewal intervals passed since its last renewal,
/// before its lease ends, by `list` and the page. Watched, not slept on: `list` is read until
/// the row is flagged (a fixed 9.5 s after the stop assumed the last renewal came on time; on
/// a loaded machine a late one let the lease end first, and the row was gone).
fn stale_reservation(store: &[&str]) {
    let key = format!("order-{:x}", fastrand::u64(..));
    let cli = Cli {
        store: store.iter().map(|s| s.to_string()).collect(),
    };
    let mut first = Command::new(idemkit_test::example_binary("invoice_worker"))
        .args(store)
        .args(["--key", &key, "--work", "1h", "--lease", "18s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the invoice_worker example is built by `cargo test`");
    let mut line = String::new();
    BufReader::new(first.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("reserved "), "the worker said {line:?}");
    let host = idemkit_core::record::Holder::this_process().host;
    // Live and slow: over two renewal intervals, never flagged.
    for _ in 0..4 {
        let row = listed(&cli, &key);
        assert_eq!(row["holder"]["pid"], first.id(), "{row}");
        assert_eq!(row["holder"]["host"], host.as_str(), "{row}");
        assert_eq!(row["holder"]["name"], "invoice_worker", "{row}");
        assert_eq!(row["stale"], false, "a live holder renews: {row}");
        std::thread::sleep(Duration::from_secs(3));
    }
    let page = support::Server::start(store, &[]);
    // Stopped: alive, holding the key, renewing nothing.
    let pid = first.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Until `list` flags it: stale 12 s after the last renewal, expired at 18 s.
    let mut polls = 0;
    let row = loop {
        let row = listed_if(&cli, &key)
            .unwrap_or_else(|v| panic!("the lease ended before the row was flagged stale: {v}"));
        if row["stale"] == true {
            break row;
        }
        polls += 1;
        assert!(polls < 300, "never flagged stale: {row}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(row["renewed_ms_ago"].as_u64().unwrap() > 9_000, "{row}");
    let html = http_get::blocking_get(&format!("{}/", page.base));
    let row_html = html
        .split("<tr")
        .find(|r| r.contains(&key))
        .unwrap_or_default()
        .to_string();
    assert!(
        row_html.contains("STALE") && row_html.contains(&format!("pid {pid}")),
        "{html}"
    );
    let text = cli.run(
        "list",
        &["--operation", "mail.invoice", "--state", "reserved"],
    );
    let text = String::from_utf8_lossy(&text.stdout);
    let ours = text.lines().find(|l| l.contains(&key)).unwrap_or_default();
    assert!(
        ours.contains("STALE") && ours.contains(&format!("pid {pid}")),
        "{text}"
    );
    first.kill().unwrap();
    first.wait().unwrap();
}

/// A plain GET with std only (the tests' reqwest has no blocking client).
mod http_get {
    pub(crate) fn blocking_get(url: &str) -> String {
        use std::io::{Read as _, Write as _};
        let rest = url.strip_prefix("http://").unwrap();
        let (host, path) = rest.split_once('/').map_or((rest, ""), |(h, p)| (h, p));
        let mut s = std::net::TcpStream::connect(host).unwrap();
        write!(
            s,
            "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_workers_reservation_is_flagged_stale_on_redis() {
    on_redis(stale_reservation).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_workers_reservation_is_flagged_stale_on_postgres() {
    on_postgres(stale_reservation).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_workers_reservation_is_flagged_stale_on_mysql() {
    on_mysql(stale_reservation).await;
}
