//! A single-server store spreads its calls over its connections (`RedisStoreBuilder::
//! connections`), on a Redis server this test owns: every connection the store opened runs
//! store calls once calls race. A key's completion takes its key's lane; begins take the lanes
//! in turn (ARCHITECTURE row 35), so which store command a lane ran last varies.

mod support;

use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_redis::RedisStore;
use support::RedisProcess;

/// `CLIENT LIST`: each connection's id and last command (redis-cli's own left out).
fn clients(port: u16) -> Vec<(u64, String)> {
    clients_named(port)
        .into_iter()
        .map(|(id, cmd, _)| (id, cmd))
        .collect()
}

/// `CLIENT LIST`: each connection's id, last command and name (redis-cli's own left out).
fn clients_named(port: u16) -> Vec<(u64, String, String)> {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "client", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(name))
                    .map(str::to_string)
            };
            Some((
                field("id=")?.parse().ok()?,
                field("cmd=")?,
                field("name=").unwrap_or_default(),
            ))
        })
        .filter(|(_, cmd, _)| cmd != "client|list")
        .collect()
}

/// The store's connections (those opened while it connected) and how many of them last ran a
/// store call (a script; the `GET` of a replay after a run of replays; the `TIME` around a
/// batch of plain begins; the plain `SET … IFEQ` completion on a server that has it, Valkey
/// 9), after 200 concurrent first deliveries and a replay of each.
/// `connections: None` leaves the builder's default.
async fn lanes_used(
    server: &RedisProcess,
    connections: impl Into<Option<usize>>,
    own: bool,
) -> (usize, usize) {
    let before: Vec<u64> = clients(server.port).into_iter().map(|(id, _)| id).collect();
    let mut builder = RedisStore::builder()
        .prefix(format!("lanes-{:x}", fastrand::u64(..)))
        .own_client(own);
    if let Some(n) = connections.into() {
        builder = builder.connections(n);
    }
    let store = builder.connect(&server.url()).await.unwrap();
    let c = Coordinator::new(store);
    let op = Operation::new("mail.invoice").unwrap();
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let (c, op) = (c.clone(), op.clone());
            tokio::spawn(async move {
                let key = Key::new(format!("order-{i}")).unwrap();
                let first = c
                    .call(&op, &key)
                    .ttl(Duration::from_secs(60))
                    .run(|_| async move { Ok::<_, std::io::Error>(i) })
                    .await
                    .unwrap();
                // The same key again: its record is there, on whichever lane wrote it.
                let again = c
                    .call(&op, &key)
                    .run(|_| async move { Ok::<_, std::io::Error>(i + 1_000) })
                    .await
                    .unwrap();
                assert!(!first.is_replay() && again.is_replay());
                assert_eq!((first.value, again.value), (i, i));
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let mine: Vec<(u64, String, String)> = clients_named(server.port)
        .into_iter()
        .filter(|(id, _, _)| !before.contains(id))
        .collect();
    // With its own client, the lanes are the connections it names.
    let scripting = mine
        .iter()
        .filter(|(_, _, name)| !own || name == "idemkit-lane")
        .filter(|(_, cmd, _)| matches!(cmd.as_str(), "evalsha" | "get" | "time" | "set"))
        .count();
    (mine.len(), scripting)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_spread_over_every_connection_of_the_store() {
    let server = RedisProcess::start(&[]);
    assert_eq!(lanes_used(&server, 3, false).await, (3, 3));
    assert_eq!(lanes_used(&server, 2, false).await, (2, 2));
    assert_eq!(lanes_used(&server, 1, false).await, (1, 1));
    // At least one connection, whatever is asked.
    assert_eq!(lanes_used(&server, 0, false).await, (1, 1));
    // By default two on redis-rs: one connection would make Redis and the client take turns.
    assert_eq!(lanes_used(&server, None, false).await, (2, 2));
}

/// With the store's own client, the lanes are its own connections (named `idemkit-lane`),
/// and one redis-rs connection more carries subscriptions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_its_own_client_calls_spread_over_every_lane() {
    let server = RedisProcess::start(&[]);
    assert_eq!(lanes_used(&server, 3, true).await, (4, 3));
    assert_eq!(lanes_used(&server, 1, true).await, (2, 1));
    assert_eq!(lanes_used(&server, 0, true).await, (2, 1));
    // By default one lane: its callers send early, so one connection keeps Redis busy.
    assert_eq!(lanes_used(&server, None, true).await, (2, 1));
}
