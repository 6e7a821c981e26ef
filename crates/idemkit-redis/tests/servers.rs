//! Completions follow the server behind the connection: plain `SET … IFEQ` on a server
//! that has it (Valkey 9), the script on one that does not (Redis 7), through failovers
//! from one to the other and back on the same address. Needs both binaries: `redis-server`
//! and Valkey's (`IDEMKIT_VALKEY_SERVER`, which `scripts/test` sets from `scripts/valkey`).

mod support;

use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation, RecordState, Source, StorageKey, Store};
use idemkit_redis::RedisStore;
use support::{RedisProcess, cli, client_commands, valkey};

/// Calls of `command` the server answered with an error (`INFO commandstats`).
fn failed_calls(port: u16, command: &str) -> u64 {
    let text = cli(port, &["info", "commandstats"]);
    let prefix = format!("cmdstat_{command}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|line| {
            line.split(',')
                .find_map(|f| f.strip_prefix("failed_calls="))
        })
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// The server's script cache holds the scripts a call uses already (`begin.lua`,
/// `complete.lua`, and `peek.lua` for the read), as a promoted replica's may: no `NOSCRIPT`
/// tells the store that the server changed.
fn load_scripts(port: u16) {
    for source in [
        include_str!("../lua/begin.lua"),
        include_str!("../lua/complete.lua"),
        include_str!("../lua/peek.lua"),
    ] {
        let sha = cli(port, &["script", "load", source]);
        assert_eq!(sha.len(), 40, "SCRIPT LOAD: {sha}");
    }
}

/// One call of `k` that runs its action, as a redelivered job would be tried again while
/// the connection comes back after the server's restart.
async fn runs(c: &Coordinator<RedisStore>, k: &str) {
    let (op, key) = (Operation::new("failover").unwrap(), Key::new(k).unwrap());
    for _ in 0..50 {
        match c
            .call(&op, &key)
            .run(|_| async { Ok::<_, std::io::Error>(format!("em_{k}")) })
            .await
        {
            Ok(r) => {
                assert_eq!(r.source, Source::Fresh);
                assert!(r.stored, "{k}: the result was not stored");
                let sk = StorageKey::new(&op, None, &key);
                let record = c.store().get(&sk).await.unwrap().expect("a record");
                match record.state {
                    RecordState::Completed(res) => {
                        assert_eq!(res.bytes(), format!("\"em_{k}\"").as_bytes());
                    }
                    other => panic!("{k}: {other:?}"),
                }
                return;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("{k}: no call succeeded after the restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_follow_the_server_through_failovers_between_versions() {
    let Some(valkey) = valkey() else { return };
    let mut server = RedisProcess::start(&[]);
    server.stop();
    server.restart_as(&valkey);
    let store = RedisStore::builder()
        .prefix(support::prefix())
        .response_timeout(Duration::from_millis(500))
        .connect(&server.url())
        .await
        .unwrap();
    assert_eq!(
        store.conditional_set(),
        Some(true),
        "Valkey 9 has SET … IFEQ"
    );
    let c = Coordinator::new(store.clone());
    // Twice: each script's first call meets NOSCRIPT, and the next completion asks again.
    runs(&c, "on-valkey").await;
    runs(&c, "on-valkey-2").await;
    // Then: the begin a script, the completion one plain SET, the read a script.
    let plain = ["EVALSHA", "SET", "EVALSHA"];
    let sent = client_commands(server.port, runs(&c, "on-valkey-again")).await;
    assert_eq!(sent, plain);

    // A failover to Redis 7 that has our scripts already (a promoted replica may): no
    // NOSCRIPT says the server changed, so the first completion tries its plain SET, which
    // Redis 7 refuses as a syntax error, writing nothing; the script completes.
    server.stop();
    server.restart_as("redis-server");
    load_scripts(server.port);
    runs(&c, "on-redis-7").await;
    assert_eq!(store.conditional_set(), Some(false), "Redis 7 has none");
    assert_eq!(failed_calls(server.port, "set"), 1, "the one refused SET");
    let sent = client_commands(server.port, runs(&c, "on-redis-7-again")).await;
    assert_eq!(sent, ["EVALSHA"; 3], "scripts only, no SET tried since");

    // Back to Valkey, empty: the first script call meets NOSCRIPT, so the store asks the
    // server again, and completes with a plain SET from then on.
    server.stop();
    server.restart_as(&valkey);
    runs(&c, "back-on-valkey").await;
    runs(&c, "back-on-valkey-2").await;
    assert_eq!(store.conditional_set(), Some(true));
    let sent = client_commands(server.port, runs(&c, "back-on-valkey-again")).await;
    assert_eq!(sent, plain);
}
