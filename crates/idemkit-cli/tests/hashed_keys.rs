//! `inspect` and `release` on a store whose services hash their key names
//! (`idemkit_seal::Sealed::hash_keys`): given the key and the secret (from an environment
//! variable), they find the record; without the secret, the key names nothing.

use std::process::{Command, Output};
use std::time::Duration;

use idemkit_core::{BeginRequest, Claim, Key, Operation, OwnerToken, StorageKey, Store};
use idemkit_seal::{KeySecret, Sealed};

const SECRET: &str = "the services' key-hashing secret";

fn idemkit(args: &[&str], secret: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_idemkit"));
    c.args(args);
    if secret {
        c.env("IDEMKIT_TEST_KEY_SECRET", SECRET);
    }
    c.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_release_find_a_hashed_key_with_its_secret() {
    let url =
        std::env::var("IDEMKIT_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let prefix = format!("idemkit-cli-hashed-{:x}", fastrand::u64(..));
    let Ok(redis) = idemkit_redis::RedisStore::builder()
        .prefix(prefix.as_str())
        .connect(&url)
        .await
    else {
        idemkit_test::require_service("redis", false);
        return;
    };
    let store = Sealed::new(redis).hash_keys(KeySecret::new(SECRET).unwrap());
    let key = StorageKey::new(
        &Operation::new("mail.welcome").unwrap(),
        None,
        &Key::new("user-42.email").unwrap(),
    );
    let claim = store
        .begin(&BeginRequest::new(
            &key,
            OwnerToken::random(),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Reserved { .. }));

    let record = [
        "mail.welcome",
        "user-42.email",
        "--store",
        &url,
        "--prefix",
        &prefix,
    ];
    let with = |cmd: &'static str| {
        let mut v = vec![cmd];
        v.extend_from_slice(&record);
        v.extend_from_slice(&["--key-secret-env", "IDEMKIT_TEST_KEY_SECRET"]);
        v
    };
    let plain = |cmd: &'static str| {
        let mut v = vec![cmd];
        v.extend_from_slice(&record);
        v
    };
    // Without the secret the key names nothing (exit 3, no live record).
    assert_eq!(idemkit(&plain("inspect"), false).status.code(), Some(3));
    // The option without its variable set: a usage error.
    assert_eq!(idemkit(&with("inspect"), false).status.code(), Some(2));
    let inspected = idemkit(&with("inspect"), true);
    assert_eq!(inspected.status.code(), Some(0), "{inspected:?}");
    assert!(String::from_utf8_lossy(&inspected.stdout).contains("reserved"));
    let released = idemkit(&with("release"), true);
    assert_eq!(released.status.code(), Some(0), "{released:?}");
    assert_eq!(store.get(&key).await.unwrap(), None, "released");
}
