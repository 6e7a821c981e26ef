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

/// The README's synopsis of each command names every option the command takes (the store's
/// own, `--store`, `--prefix`, `--schema`, `--table`, stand behind `$S`) and every value of
/// its `--state` it accepts. Before: `purge`'s line left out `--state reserved`, `list`'s
/// nothing, `release`'s `--scope` and `--json`, `serve`'s `--allow-remote` and `--soon`.
#[test]
fn the_readmes_synopsis_names_every_option() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    for command in ["inspect", "list", "release", "purge", "stats", "serve"] {
        let line = readme
            .lines()
            .find(|l| l.starts_with(&format!("idemkit {command} ")))
            .unwrap_or_else(|| panic!("no synopsis of {command}"));
        let help = idemkit(&[command, "--help"]);
        let help = String::from_utf8_lossy(&help.stdout);
        for option in help
            .split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']')
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()))
        {
            if ["--help", "--store", "--prefix", "--schema", "--table"].contains(&option) {
                continue;
            }
            assert!(
                line.contains(&format!("{option} ")) || line.contains(&format!("{option}]")),
                "{command}: {option} is missing from the README's synopsis: {line}"
            );
        }
        if help.contains("--state <STATE>") {
            // `purge --state unreadable` is refused (exit 2): foreign bytes are never purged.
            let states = match command {
                "purge" => &["reserved", "completed", "expired"][..],
                _ => &["reserved", "completed", "expired", "unreadable"][..],
            };
            for state in states {
                assert!(
                    line.contains(state),
                    "{command}: --state {state} is missing from the README's synopsis: {line}"
                );
            }
        }
    }
}
