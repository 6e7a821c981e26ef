//! The downstream key: the documented format and test vectors (checked against idemkit and
//! against an independent implementation), distinct effects get distinct keys and one
//! effect the same key in every process, and every attempt of one effect gets the same key.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use idemkit_core::{
    Coordinator, DownstreamKey, DownstreamSecret, Key, MemoryStore, OnStoreError, Operation,
    Policy, Scope, StorageKey,
};
use idemkit_test::{Fault, Probe};
use proptest::prelude::*;
use proptest::strategy::ValueTree as _;

/// The rows of docs/downstream-key.md's table: (operation, scope, key, secret, expected).
fn documented_vectors() -> Vec<[String; 5]> {
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/downstream-key.md"),
    )
    .unwrap();
    let vectors: Vec<[String; 5]> = docs
        .lines()
        .skip_while(|l| !l.starts_with("## Test vectors"))
        .filter(|l| l.starts_with("| `") || l.starts_with("| |"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect();
            cells.try_into().expect("five cells")
        })
        .collect();
    assert!(vectors.len() >= 4, "{vectors:?}");
    vectors
}

fn derive(op: &str, scope: &str, key: &str, secret: &str) -> DownstreamKey {
    let sk = StorageKey::new(
        &Operation::new(op).unwrap(),
        (!scope.is_empty())
            .then(|| Scope::new(scope).unwrap())
            .as_ref(),
        &Key::new(key).unwrap(),
    );
    let secret = (!secret.is_empty()).then(|| DownstreamSecret::new(secret).unwrap());
    DownstreamKey::of_storage_key(&sk, secret.as_ref())
}

/// The documented format, written again in Python from the docs alone.
const PYTHON: &str = r#"
import base64, hashlib, hmac, sys
for line in sys.stdin.read().splitlines():
    op, scope, key, secret = line.split("\t")
    sk = f"{op}:{len(scope.encode())}:{scope}:{key}".encode()
    msg = b"idemkit downstream key v1\0" + sk
    if secret:
        prefix, digest = "idk1s_", hmac.new(secret.encode(), msg, hashlib.sha256).digest()
    else:
        prefix, digest = "idk1_", hashlib.sha256(msg).digest()
    print(prefix + base64.b32encode(digest).decode().rstrip("=").lower())
"#;

#[test]
fn the_documented_vectors_hold_in_idemkit_and_in_an_independent_implementation() {
    let vectors = documented_vectors();
    for [op, scope, key, secret, want] in &vectors {
        assert_eq!(
            derive(op, scope, key, secret).as_str(),
            want,
            "{op} {scope} {key}"
        );
    }
    let python = Command::new("python3")
        .args(["-c", PYTHON])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn();
    let Ok(mut python) = python else {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 is needed under CI"
        );
        return;
    };
    let input: String = vectors
        .iter()
        .map(|[op, scope, key, secret, _]| format!("{op}\t{scope}\t{key}\t{secret}\n"))
        .collect();
    python
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = python.wait_with_output().unwrap();
    assert!(out.status.success());
    let theirs: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let ours: Vec<String> = vectors.iter().map(|v| v[4].clone()).collect();
    assert_eq!(theirs, ours);
}

fn ident() -> impl Strategy<Value = String> {
    "[a-z0-9._-]{1,12}"
}

fn effect() -> impl Strategy<Value = (String, Option<String>, String)> {
    (
        ident(),
        proptest::option::of(ident()),
        "[A-Za-z0-9._:/-]{1,24}",
    )
}

fn key_of((op, scope, key): &(String, Option<String>, String)) -> DownstreamKey {
    derive(op, scope.as_deref().unwrap_or(""), key, "")
}

proptest! {
    /// Distinct effects get distinct keys, and one effect always the same key, of the
    /// documented shape.
    #[test]
    fn distinct_effects_get_distinct_keys(effects in proptest::collection::vec(effect(), 1..64)) {
        let mut seen: HashMap<DownstreamKey, &(String, Option<String>, String)> = HashMap::new();
        for e in &effects {
            let k = key_of(e);
            prop_assert_eq!(&k, &key_of(e));
            prop_assert_eq!(k.as_str().len(), 57);
            prop_assert!(k.as_str().bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
            if let Some(other) = seen.insert(k.clone(), e) {
                prop_assert_eq!(other, e, "two effects share {}", k);
            }
        }
    }
}

#[test]
fn the_same_effect_gets_the_same_key_in_another_process() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let effects: Vec<_> = (0..64)
        .map(|_| effect().new_tree(&mut runner).unwrap().current())
        .collect();
    let secret = "a secret shared by every worker";
    for keyed in [false, true] {
        let mut child = Command::new(idemkit_test::example_binary("downstream_key"))
            .args(keyed.then_some(secret))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let input: String = effects
            .iter()
            .map(|(op, scope, key)| format!("{op}\t{}\t{key}\n", scope.as_deref().unwrap_or("")))
            .collect();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let theirs = String::from_utf8(out.stdout).unwrap();
        let ours: Vec<String> = effects
            .iter()
            .map(|(op, scope, key)| {
                derive(
                    op,
                    scope.as_deref().unwrap_or(""),
                    key,
                    if keyed { secret } else { "" },
                )
                .into_string()
            })
            .collect();
        assert_eq!(theirs.lines().collect::<Vec<_>>(), ours, "keyed: {keyed}");
    }
}

#[tokio::test]
async fn every_attempt_of_an_effect_passes_the_same_key_and_a_new_fencing_token() {
    let c = Coordinator::new(MemoryStore::new());
    let (op, key) = (
        Operation::new("mail.invoice").unwrap(),
        Key::new("order-9.invoice").unwrap(),
    );
    // The first attempt fails (the send timed out): the key is released, the retry runs.
    let first =
        c.call(&op, &key)
            .run(|a| async move {
                Err::<(), _>((a.downstream_key().unwrap(), a.fencing_token().unwrap()))
            })
            .await;
    let Err(idemkit_core::Error::Action((first_key, first_fencing))) = first else {
        panic!("{first:?}")
    };
    let second = c
        .call(&op, &key)
        .run(|a| async move {
            Ok::<_, std::io::Error>((
                a.downstream_key().unwrap().into_string(),
                a.fencing_token().unwrap().get(),
            ))
        })
        .await
        .unwrap()
        .value;
    assert_eq!(second.0, first_key.as_str(), "the same downstream key");
    assert!(second.1 > first_fencing.get(), "a new fencing token");
    assert_eq!(first_key, DownstreamKey::of(&op, None, &key));

    // Another tenant's effect has another key.
    let t2 = Scope::new("tenant-2").unwrap();
    let scoped = c
        .call(&op, &key)
        .scope(&t2)
        .run(|a| async move { Ok::<_, std::io::Error>(a.downstream_key().unwrap().into_string()) })
        .await
        .unwrap()
        .value;
    assert_ne!(scoped, first_key.as_str());
    assert_eq!(scoped, DownstreamKey::of(&op, Some(&t2), &key).as_str());
}

#[tokio::test(start_paused = true)]
async fn an_unprotected_run_still_passes_the_key() {
    // Fail open with the store down: the action runs unprotected, and the receiver can
    // still deduplicate it.
    let store = Probe::new(MemoryStore::new());
    store.fail(Fault::Begin, true);
    let c = Coordinator::builder(store)
        .policy(
            Policy::default()
                .on_store_error(OnStoreError::FailOpen)
                .store_timeout(Duration::from_millis(100)),
        )
        .build();
    let (op, key) = (Operation::new("op").unwrap(), Key::new("k").unwrap());
    let out = c
        .call(&op, &key)
        .run(|a| async move {
            Ok::<_, std::io::Error>((
                a.is_protected(),
                a.downstream_key().map(|k| k.into_string()),
            ))
        })
        .await
        .unwrap();
    assert!(!out.value.0, "unprotected");
    assert_eq!(
        out.value.1.as_deref(),
        Some(DownstreamKey::of(&op, None, &key).as_str())
    );
}

#[tokio::test]
async fn a_secret_keys_it_the_same_on_every_coordinator_and_store() {
    let secret = DownstreamSecret::new(b"a secret shared by every worker".to_vec()).unwrap();
    let (op, key) = (Operation::new("op").unwrap(), Key::new("k").unwrap());
    let mut keys = Vec::new();
    for _ in 0..2 {
        // Two workers: their own store handles and coordinators, one secret.
        let c = Coordinator::builder(MemoryStore::new())
            .downstream_secret(secret.clone())
            .build();
        let k =
            c.call(&op, &key)
                .run(|a| async move {
                    Ok::<_, std::io::Error>(a.downstream_key().unwrap().into_string())
                })
                .await
                .unwrap()
                .value;
        assert_eq!(k, c.downstream_key(&op, None, &key).as_str());
        keys.push(k);
    }
    assert_eq!(keys[0], keys[1]);
    assert!(keys[0].as_str().starts_with("idk1s_"));
    assert_eq!(
        keys[0],
        DownstreamKey::keyed(&secret, &op, None, &key).as_str()
    );
    assert_ne!(
        keys[0],
        DownstreamKey::of(&op, None, &key).as_str(),
        "keyed differs"
    );
    let other = DownstreamSecret::new(b"another secret, another key set".to_vec()).unwrap();
    assert_ne!(
        keys[0],
        DownstreamKey::keyed(&other, &op, None, &key).as_str()
    );
}

/// docs/downstream-key.md's child vectors, in idemkit and in Python from the docs alone.
#[test]
fn child_keys_follow_the_documented_format() {
    let parent = derive("mail.invoice", "", "order-9.invoice", "");
    let want = [
        (
            "shipped",
            "idk1_rxe3dvx36a3eoxbbk2vjlrnyy6pkniqicawpmvev4wxpj7az5ctq",
        ),
        (
            "message-1",
            "idk1_x77bclhvamnxum3xisyflisqqxcppsdpfpoeue34vzhm65nchucq",
        ),
    ];
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/downstream-key.md"),
    )
    .unwrap();
    for (part, key) in want {
        assert_eq!(parent.child(part).as_str(), key, "{part}");
        assert!(docs.contains(key), "{key} is not the documented vector");
        let python = Command::new("python3")
            .args([
                "-c",
                "import base64, hashlib, sys\n\
                 d = hashlib.sha256(b'idemkit downstream child key v1\\0' + sys.argv[1].encode() + b'\\0' + sys.argv[2].encode()).digest()\n\
                 print('idk1_' + base64.b32encode(d).decode().rstrip('=').lower())",
                parent.as_str(),
                part,
            ])
            .output()
            .expect("python3");
        assert_eq!(
            String::from_utf8_lossy(&python.stdout).trim(),
            key,
            "{part}"
        );
    }
    // Under a secret, a child keeps the keyed prefix.
    let keyed = derive(
        "mail.invoice",
        "",
        "order-9.invoice",
        "correct horse battery staple",
    );
    assert!(keyed.child("shipped").as_str().starts_with("idk1s_"));
    assert_ne!(keyed.child("shipped"), parent.child("shipped"));
}
