//! What a first delivery's `begin` costs the server in each shape issue 51 asks about: the
//! store's script (`lua/begin.lua`, as `RedisStore` sends it), a `MULTI`/`EXEC` of `SET key
//! reservation NX PX lease GET` and `TIME`, the same for eight keys at once (a coalesced
//! batch), and the bare `SET … NX PX … GET` (the floor: no fencing token from the server).
//! Each shape reserves `N` fresh keys from 64 concurrent tasks on one multiplexed connection;
//! the server's CPU (`INFO cpu`, user and system) per key is the figure, with the calls per
//! second beside it. A `GET` of an absent key is the yardstick.
//!
//! ```text
//! cargo run --release -p idemkit-bench --example begin_shapes -- PORT N [ROUNDS [SHAPE]]
//! ```
//!
//! With a `SHAPE`, only that one: `scripts/redis-instructions --shapes` runs each under
//! callgrind on a server of its own, for instruction counts that do not depend on the load.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use redis::aio::MultiplexedConnection;

const SCRIPT: &str = include_str!("../../idemkit-redis/lua/begin.lua");
const SCRIPT_MANY: &str = include_str!("../../idemkit-redis/lua/begin_many.lua");
const LEASE_MS: u64 = 30_000;

/// A reservation's bytes as the store writes them: head (22), fencing (8), created and
/// expires (16), a version-2 holder block (lease, pid, host, name).
fn reservation(owner: u128, fencing: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(96);
    v.extend_from_slice(b"IDK\x02\x01\x00");
    v.extend_from_slice(&owner.to_be_bytes());
    v.extend_from_slice(&fencing.to_be_bytes());
    v.extend_from_slice(&[0u8; 16]);
    v.extend_from_slice(&LEASE_MS.to_be_bytes());
    v.extend_from_slice(&4242u32.to_be_bytes());
    for text in ["bench-host", "worker-1"] {
        v.push(text.len() as u8);
        v.extend_from_slice(text.as_bytes());
    }
    v
}

async fn one(conn: &mut MultiplexedConnection, shape: &str, sha: &str, key: &str) {
    let owner = fastrand::u128(..);
    let r = match shape {
        "get" => redis::cmd("GET")
            .arg(key)
            .query_async::<redis::Value>(conn)
            .await
            .map(drop),
        "script" => {
            let v = reservation(owner, 0);
            redis::cmd("EVALSHA")
                .arg(sha)
                .arg(1)
                .arg(key)
                .arg(&v[..22])
                .arg(LEASE_MS)
                .arg(&v[30..])
                .query_async::<redis::Value>(conn)
                .await
                .map(drop)
        }
        "set" => set_nx(key, owner)
            .query_async::<redis::Value>(conn)
            .await
            .map(drop),
        "multi" | "pipe" => {
            batch(conn, &[key.to_owned()], shape == "multi").await;
            Ok(())
        }
        other => panic!("unknown shape {other}"),
    };
    r.expect("the server answers");
}

/// Eight keys in one `begin_many.lua` call, their shared rest sent once: the store's
/// coalesced batch.
async fn many(conn: &mut MultiplexedConnection, sha: &str, keys: &[String]) {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(keys.len());
    for key in keys {
        cmd.arg(key);
    }
    let v = reservation(0, 0);
    cmd.arg(LEASE_MS).arg(&v[30..]);
    for _ in keys {
        let v = reservation(fastrand::u128(..), 0);
        cmd.arg(&v[..22]);
    }
    cmd.query_async::<redis::Value>(conn)
        .await
        .expect("the server answers");
}

/// `SET key reservation NX PX lease GET`: a plain begin's write.
fn set_nx(key: &str, owner: u128) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key)
        .arg(reservation(owner, 0))
        .arg("NX")
        .arg("PX")
        .arg(LEASE_MS)
        .arg("GET");
    cmd
}

/// Keys in one `MULTI`/`EXEC` with one `TIME` (`atomic`), or in a plain pipeline between
/// two `TIME`s: the plain begin's shapes, alone or for a coalesced batch.
async fn batch(conn: &mut MultiplexedConnection, keys: &[String], atomic: bool) {
    let mut pipe = redis::pipe();
    if atomic {
        pipe.atomic();
    } else {
        pipe.cmd("TIME");
    }
    for key in keys {
        pipe.add_command(set_nx(key, fastrand::u128(..)));
    }
    pipe.cmd("TIME");
    pipe.query_async::<redis::Value>(conn)
        .await
        .expect("the server answers");
}

async fn cpu(conn: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| *k == "used_cpu_user" || *k == "used_cpu_sys")
        .map(|(_, v)| v.trim().parse::<f64>().unwrap_or(0.0))
        .sum()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let port = args.first().ok_or("usage: begin_shapes PORT N [ROUNDS]")?;
    let n: usize = args.get(1).map_or(Ok(100_000), |s| s.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(3), |s| s.parse())?;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query_async(&mut conn)
        .await?;
    let sha_many: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT_MANY)
        .query_async(&mut conn)
        .await?;
    let run = fastrand::u64(..);
    let only = args.get(3).map(String::as_str);
    println!("shape   round  keys/s     server µs/key");
    for round in 0..rounds {
        for shape in [
            "get", "script", "multi", "pipe", "many8", "multi8", "pipe8", "set",
        ] {
            if only.is_some_and(|o| o != shape) {
                continue;
            }
            let before = cpu(&mut conn).await;
            let started = tokio::time::Instant::now();
            let next = Arc::new(AtomicUsize::new(0));
            let tasks: Vec<_> = (0..64)
                .map(|_| {
                    let (mut conn, next, sha, sha_many) =
                        (conn.clone(), next.clone(), sha.clone(), sha_many.clone());
                    let prefix = format!("shapes:{run:x}:{round}:{shape}");
                    tokio::spawn(async move {
                        let step = if shape.ends_with('8') { 8 } else { 1 };
                        loop {
                            let i = next.fetch_add(step, Ordering::Relaxed);
                            if i >= n {
                                break;
                            }
                            if step == 8 {
                                let keys: Vec<String> =
                                    (i..i + 8).map(|j| format!("{prefix}:{j}")).collect();
                                if shape == "many8" {
                                    many(&mut conn, &sha_many, &keys).await;
                                } else {
                                    batch(&mut conn, &keys, shape == "multi8").await;
                                }
                            } else {
                                one(&mut conn, shape, &sha, &format!("{prefix}:{i}")).await;
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await?;
            }
            let secs = started.elapsed().as_secs_f64();
            let used = cpu(&mut conn).await - before;
            println!(
                "{shape:7} {round:5}  {:9.0}  {:6.2}",
                n as f64 / secs,
                used * 1e6 / n as f64
            );
        }
    }
    Ok(())
}
