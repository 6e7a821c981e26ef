//! The `idemkit-demo` binary as a user runs it.

use std::process::{Command, Output};

fn demo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idemkit-demo"))
        .args(args)
        .output()
        .unwrap()
}

fn assert_tables(out: Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "plain handler                                deliveries=2  mails sent=2",
        "handler under an idempotency key = job id    deliveries=2  mails sent=1",
        "in_flight='wait'     {'A': 'em_1', 'B': 'em_1'}                  mails sent=1",
        "in_flight='reject'   {'A': 'em_1', 'B': 'in progress, requeue'}  mails sent=1",
        "key = job id: two jobs for order-9           -> mails sent=2",
        "key = 'order-9:invoice': the same two jobs   -> mails sent=1",
        "key = 'order-9.invoice': the same two jobs   -> mails sent=1",
        "key = '' (order id field missing)            -> mails sent=0  dead-lettered=2",
        "plain handler                            ledger rows=3  mails sent=2",
        "inbox only                               ledger rows=1  mails sent=2",
        "inbox, return early on a duplicate       ledger rows=1  mails sent=0",
        "key on the email only                    ledger rows=3  mails sent=1",
        "inbox + key, email on every delivery     ledger rows=1  mails sent=1",
        "ids name the delivery             messages=2  mails sent=2  charges=4",
        "dedupe id on the publish only     messages=1  mails sent=1  charges=2",
        "one effect key, every hop         messages=1  mails sent=1  charges=1",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

#[test]
fn demo_prints_the_three_tables() {
    assert_tables(demo(&["--store", "memory"]));
}

#[test]
fn demo_on_redis_prints_the_same_tables() {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let up = std::net::TcpStream::connect(url.trim_start_matches("redis://")).is_ok();
    if idemkit_test::require_service(&format!("redis at {url}"), up) {
        assert_tables(demo(&["--store", &url]));
    }
}

#[test]
fn demo_on_postgres_prints_the_same_tables_with_real_tables_for_experiment_4() {
    let url = std::env::var("IDEMKIT_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let up = std::net::TcpStream::connect("127.0.0.1:5432").is_ok();
    if idemkit_test::require_service(&format!("PostgreSQL at {url}"), up) {
        let out = demo(&["--store", &url]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            text.contains("(database: PostgreSQL, tables ledger and idemkit_demo_"),
            "{text}"
        );
        assert_tables(out);
    }
}

#[test]
fn demo_on_mysql_prints_the_same_tables_with_real_tables_for_experiment_4() {
    let url = std::env::var("IDEMKIT_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let up = std::net::TcpStream::connect("127.0.0.1:3306").is_ok();
    if idemkit_test::require_service(&format!("MySQL at {url}"), up) {
        let out = demo(&["--store", &url]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            text.contains("(database: MySQL, tables idemkit_demo_"),
            "{text}"
        );
        assert_tables(out);
    }
}

#[test]
fn an_unreachable_mysql_is_a_clear_failure() {
    let out = demo(&["--store", "mysql://root@127.0.0.1:1/test"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}

#[test]
fn an_unreachable_postgres_is_a_clear_failure() {
    let out = demo(&["--store", "postgres://postgres@127.0.0.1:1/test"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}

#[test]
fn an_unknown_store_is_a_usage_error() {
    let out = demo(&["--store", "carrier-pigeon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unsupported store"));
}

#[test]
fn an_unreachable_redis_is_a_clear_failure() {
    let out = demo(&["--store", "redis://127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}
