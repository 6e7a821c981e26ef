//! The `idemkit` binary's own surface: the operator's commands, and where the demo went.

use std::process::Command;

fn idemkit(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_idemkit"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_demo_moved_to_its_own_binary() {
    let out = idemkit(&["demo", "--store", "memory"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("idemkit-demo"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "the demo must not run here");
}

#[test]
fn help_lists_the_operators_commands_only() {
    let out = idemkit(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for command in ["inspect", "release", "list", "purge", "stats", "serve"] {
        assert!(text.contains(command), "{command} missing from:\n{text}");
    }
    assert!(!text.contains("demo"), "{text}");
}
