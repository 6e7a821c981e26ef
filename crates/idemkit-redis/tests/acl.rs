//! An ACL user limited to the store's own keys and channels, as a managed Redis hands out:
//! every phase works, and nothing the store sends is refused (the server's `ACL LOG` stays
//! empty), the capability probe of `SET … IFEQ` included, whose answer is kept.

mod support;

use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation, Source};
use idemkit_redis::RedisStore;
use idemkit_test::Mailer;
use support::{RedisProcess, cli};

fn op() -> Operation {
    Operation::new("mail.invoice").unwrap()
}

/// A server with a user `worker` (password `s3cret`) that may touch only keys and channels
/// in the store's own shape, `{prefix}:{<hash tag>}:…`, and may not run the dangerous
/// commands (`CONFIG`, `KEYS`, `FLUSHALL`…); the default user is left as it is for
/// `redis-cli`.
fn server_with_user(prefix: &str) -> RedisProcess {
    let server = RedisProcess::start(&[]);
    let keys = format!("~{prefix}:{{*");
    let channels = format!("&{prefix}:{{*");
    let ok = cli(
        server.port,
        &[
            "acl",
            "setuser",
            "worker",
            "on",
            ">s3cret",
            "resetkeys",
            &keys,
            "resetchannels",
            &channels,
            "+@all",
            "-@dangerous",
        ],
    );
    assert_eq!(ok, "OK", "ACL SETUSER");
    server
}

/// What the server refused (`ACL LOG`: each entry's object, a key, a channel or a command),
/// but the eviction check's `CONFIG GET`, which a user without `@dangerous` may be refused
/// (the store then warns and goes on).
fn denials(port: u16) -> Vec<String> {
    let log = cli(port, &["acl", "log"]);
    let lines: Vec<&str> = log.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "object" && w[1] != "config|get")
        .map(|w| w[1].to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_the_stores_keys_runs_every_phase_unrefused() {
    let prefix = support::prefix();
    let server = server_with_user(&prefix);
    // The user in the URL.
    let store = RedisStore::builder()
        .prefix(prefix.clone())
        .connect(&format!("redis://worker:s3cret@127.0.0.1:{}", server.port))
        .await
        .expect("connect as worker");
    let c = Coordinator::new(store);
    let mailer = Mailer::default();

    // A miss and its replay, several times (each completion would ask again if the probe's
    // answer were not kept).
    for i in 0..5 {
        let key = Key::new(format!("order-{i}.invoice")).unwrap();
        for expected in [Source::Fresh, Source::Replayed] {
            let out = c
                .call(&op(), &key)
                .run(|_| mailer.send(Duration::ZERO))
                .await
                .unwrap();
            assert_eq!(out.source, expected);
        }
    }
    // A failed action releases its key; the next call runs.
    let key = Key::new("order-x.invoice").unwrap();
    let failed = c
        .call(&op(), &key)
        .run(|_| async { Err::<String, _>(std::io::Error::other("smtp down")) })
        .await;
    assert!(failed.is_err());
    c.call(&op(), &key)
        .run(|_| mailer.send(Duration::ZERO))
        .await
        .unwrap();
    // A waiter woken by the owner's completion (its channel is the user's too).
    let key = Key::new("order-w.invoice").unwrap();
    let (owner, waiter) = support::owner_and_waiter(&c, &key, &mailer, || {
        support::subscribed(server.port, &prefix)
    })
    .await;
    assert_eq!(owner.source, Source::Fresh);
    assert_eq!(waiter.source, Source::Replayed);

    assert_eq!(mailer.sent(), 5 + 1 + 1, "one email per key");
    // The probe's answer is known and kept: Redis 7 has no `SET … IFEQ`.
    assert_eq!(
        c.store().conditional_set(),
        Some(support::has_ifeq(server.port))
    );
    let denied = denials(server.port);
    assert!(
        denied.is_empty(),
        "the server refused commands of the store: {denied:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builders_credentials_and_a_wrong_password() {
    let prefix = support::prefix();
    let server = server_with_user(&prefix);
    let url = server.url();
    let store = RedisStore::builder()
        .prefix(prefix.clone())
        .user("worker", "s3cret")
        .connect(&url)
        .await
        .expect("connect as worker through the builder");
    let c = Coordinator::new(store);
    let mailer = Mailer::default();
    let key = Key::new("k").unwrap();
    for expected in [Source::Fresh, Source::Replayed] {
        let out = c
            .call(&op(), &key)
            .run(|_| mailer.send(Duration::ZERO))
            .await
            .unwrap();
        assert_eq!(out.source, expected);
    }
    let denied = denials(server.port);
    assert!(denied.is_empty(), "refused: {denied:?}");
    // A wrong password fails the connect: no store, so no action can run unprotected.
    let e = RedisStore::builder()
        .prefix(prefix)
        .user("worker", "wrong")
        .connect(&url)
        .await
        .expect_err("a wrong password");
    assert!(!e.is_unavailable(), "a wrong password is no outage: {e:?}");
}
