//! `idemkit inspect` and `idemkit release` against the machine's Redis and PostgreSQL, run as
//! a user runs them (the built binary), with their exit codes.

use std::process::Output;
use std::time::Duration;

use idemkit_core::{
    BeginRequest, Claim, Coordinator, Key, Operation, OwnerToken, RawStore, Source, StorageKey,
    Store,
};

fn idemkit(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_idemkit"))
        .args(args)
        .output()
        .unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The scenario on one store: `base` is `--store URL` plus its naming options.
async fn scenario<S: Store + RawStore>(store: S, base: &[&str]) {
    let op = Operation::new("mail.invoice").unwrap();
    let k = format!("order-{:x}.invoice", fastrand::u64(..));
    let key = Key::new(k.as_str()).unwrap();
    let sk = StorageKey::new(&op, None, &key);
    let args = |cmd: &str, extra: &[&str]| -> Vec<String> {
        let mut v = vec![cmd.to_string(), "mail.invoice".into(), k.clone()];
        v.extend(base.iter().map(|s| s.to_string()));
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |cmd: &str, extra: &[&str]| {
        let a = args(cmd, extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        idemkit(&a)
    };

    // Nothing there yet.
    assert_eq!(code(&run("inspect", &[])), 3, "no record: exit 3");

    // A stuck reservation: its owner reserved for an hour and died (nobody renews, releases
    // or completes it).
    let stuck = match store
        .begin(&BeginRequest::new(
            &sk,
            OwnerToken::random(),
            Duration::from_secs(3600),
        ))
        .await
        .unwrap()
    {
        Claim::Reserved { ownership, .. } => ownership,
        other => panic!("{other:?}"),
    };
    let c = Coordinator::new(store.clone());
    let blocked = c
        .call(&op, &key)
        .in_flight(idemkit_core::InFlight::Reject)
        .run(|_| async { Ok::<_, std::io::Error>("em_2".to_string()) })
        .await;
    assert!(
        blocked.is_err(),
        "the stuck reservation blocks the next delivery"
    );

    let shown = run("inspect", &[]);
    assert_eq!(
        code(&shown),
        0,
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let text = stdout(&shown);
    assert!(text.contains("state        reserved"), "{text}");
    assert!(
        text.contains(&format!("fencing      {}", stuck.fencing.get())),
        "{text}"
    );
    let json = run("inspect", &["--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["state"], "reserved");
    assert_eq!(v["fencing"], stuck.fencing.get());

    let released = run("release", &[]);
    assert_eq!(
        code(&released),
        0,
        "{}",
        String::from_utf8_lossy(&released.stderr)
    );
    // The next delivery runs at once, with a higher fencing token.
    let next = c
        .call(&op, &key)
        .in_flight(idemkit_core::InFlight::Reject)
        .run(|_| async { Ok::<_, std::io::Error>("em_2".to_string()) })
        .await
        .expect("the next delivery runs");
    assert_eq!(next.source, Source::Fresh);
    assert!(
        next.fencing.unwrap() > stuck.fencing,
        "the fencing token still increases"
    );

    // A completed record is refused without --force, removed with it.
    let refused = run("release", &[]);
    assert_eq!(
        code(&refused),
        6,
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let shown = stdout(&run("inspect", &[]));
    assert!(
        shown.contains("state        completed") && shown.contains("em_2"),
        "{shown}"
    );
    assert_eq!(code(&run("release", &["--force"])), 0);
    assert_eq!(code(&run("inspect", &[])), 3);

    // Bytes that are not a record of ours: reported, not touched.
    store
        .put_raw(
            &sk,
            bytes::Bytes::from_static(b"not a record"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(code(&run("inspect", &[])), 5);
    assert_eq!(code(&run("release", &[])), 5);
    store.purge(&sk).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_release_on_redis() {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("idemkit-cli-test-{:x}", fastrand::u64(..));
    let store = idemkit_redis::RedisStore::builder()
        .prefix(prefix.as_str())
        .connect(&url)
        .await;
    if !idemkit_test::require_service(&format!("redis at {url}"), store.is_ok()) {
        return;
    }
    scenario(store.unwrap(), &["--store", &url, "--prefix", &prefix]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_release_on_postgres() {
    let url = std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let store = idemkit_postgres::PgStore::builder()
        .schema("idemkit_cli_test")
        .max_connections(4)
        .connect(&url)
        .await;
    if !idemkit_test::require_service(&format!("postgres at {url}"), store.is_ok()) {
        return;
    }
    let store = store.unwrap();
    store.migrate().await.unwrap();
    scenario(store, &["--store", &url, "--schema", "idemkit_cli_test"]).await;
}

#[test]
fn bad_input_is_a_one_line_error_and_a_distinct_exit_code() {
    let down = idemkit(&["inspect", "op", "k", "--store", "redis://127.0.0.1:1"]);
    assert_eq!(code(&down), 4, "a store that is down");
    let unknown = idemkit(&["inspect", "op", "k", "--store", "memcached://localhost"]);
    assert_eq!(code(&unknown), 2, "an unknown store URL");
    let blank = idemkit(&["inspect", "op", "   ", "--store", "redis://127.0.0.1:6379"]);
    assert_eq!(code(&blank), 2, "a blank key");
    for o in [&down, &unknown, &blank] {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
