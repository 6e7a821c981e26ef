//! The `idemkit` binary as a user runs it.

use std::process::Command;

fn idemkit(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_idemkit"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn demo_prints_the_three_tables() {
    let out = idemkit(&["demo", "--store", "memory"]);
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
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

#[test]
fn an_unknown_store_is_a_usage_error() {
    let out = idemkit(&["demo", "--store", "carrier-pigeon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unsupported store"));
}
