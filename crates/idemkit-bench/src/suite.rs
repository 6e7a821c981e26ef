//! The cases beyond the Redis floor-and-peers table of `measure.rs`: idemkit on the
//! in-process `MemoryStore`, explicit Redis batches, bytes per stored record, and the Python
//! peer (idempotency-kit 0.5.0, run as a child process on the same Redis).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idemkit_core::{BytesCodec, Coordinator, Key, MemoryStore, Operation};
use idemkit_redis::RedisStore;
use tokio::time::Instant;

use crate::measure::{Bench, Row, timed};

/// The result every "bytes per record" case stores: 100 bytes.
const RESULT: [u8; 100] = [b'r'; 100];
const TTL: Duration = Duration::from_secs(60);

/// Bytes one stored record takes, per library.
#[derive(Debug, Clone)]
pub(crate) struct RecordBytes {
    pub(crate) library: &'static str,
    /// Keys one record adds to Redis (or entries to the map).
    pub(crate) keys_per_record: f64,
    /// `MEMORY USAGE` of those keys (or the heap the entry holds), per record.
    pub(crate) bytes: f64,
}

async fn call_once<S: idemkit_core::Store>(c: &Coordinator<S>, op: &Operation, key: &Key) {
    c.call(op, key)
        .ttl(TTL)
        .run(|_| async { Ok::<u32, std::convert::Infallible>(1) })
        .await
        .expect("a first delivery runs");
}

/// idemkit on a `MemoryStore` in this process: hit and miss, at concurrency 1 and 64. Each
/// case runs twice: untimed for its throughput (the row's calls per second, so time per call
/// is idemkit's alone), then with every call timed for its latencies. The rows have no
/// Redis columns.
///
/// # Errors
///
/// A task panicked.
pub(crate) async fn memory(ops: usize) -> Result<Vec<Row>, String> {
    let c = Coordinator::new(MemoryStore::new());
    let op = Operation::new("bench").expect("valid");
    let hit = Key::new("hit").expect("valid");
    call_once(&c, &op, &hit).await;
    // Keys are built before timing: the store, not `format!`, is measured. Each miss run
    // has keys of its own (two runs per case and concurrency).
    let keys: Arc<Vec<Key>> = Arc::new(
        (0..ops * 4 + 128)
            .map(|i| Key::new(format!("m{i}")).expect("valid"))
            .collect(),
    );
    let mut rows = Vec::new();
    for (concurrency, offset) in [(1, 0), (64, 2 * ops + 64)] {
        eprintln!("  MemoryStore hit and miss, c={concurrency}, {ops} calls each");
        let (c1, o1, k1) = (c.clone(), op.clone(), hit.clone());
        let hit_call = move |_| {
            let (c, o, k) = (c1.clone(), o1.clone(), k1.clone());
            async move { call_once(&c, &o, &k).await }
        };
        let untimed = crate::measure::untimed(concurrency, ops, hit_call.clone()).await?;
        let (lat, _) = timed(concurrency, ops, hit_call).await?;
        rows.push(in_process(
            "idemkit MemoryStore hit",
            concurrency,
            ops,
            &lat,
            untimed,
        ));
        let miss_call = |from: usize| {
            let (c, o, keys) = (c.clone(), op.clone(), keys.clone());
            move |i: usize| {
                let (c, o, keys) = (c.clone(), o.clone(), keys.clone());
                async move { call_once(&c, &o, &keys[from + i]).await }
            }
        };
        let untimed = crate::measure::untimed(concurrency, ops, miss_call(offset)).await?;
        let (lat, _) = timed(concurrency, ops, miss_call(offset + ops + 32)).await?;
        rows.push(in_process(
            "idemkit MemoryStore miss",
            concurrency,
            ops,
            &lat,
            untimed,
        ));
    }
    Ok(rows)
}

/// The encryption option's cost (`idemkit-seal`'s `Sealed::encrypt`, XChaCha20-Poly1305 and
/// a key id per result): a replay and a first delivery through a sealed store, on the
/// MemoryStore (single task, untimed as above) and on Redis (c=64), beside the same calls
/// unsealed in the other rows.
///
/// # Errors
///
/// Redis cannot be reached, or a task panicked.
pub(crate) async fn sealed(bench: &Bench, url: &str, ops: usize) -> Result<Vec<Row>, String> {
    use idemkit_seal::{Keyring, Sealed};
    let keyring = || Keyring::new(1, [7u8; 32]);
    let mut rows = Vec::new();
    // MemoryStore, one task.
    let c = Coordinator::new(Sealed::new(MemoryStore::new()).encrypt(keyring()));
    let op = Operation::new("bench").expect("valid");
    let hit = Key::new("hit").expect("valid");
    call_once(&c, &op, &hit).await;
    let keys: Arc<Vec<Key>> = Arc::new(
        (0..ops)
            .map(|i| Key::new(format!("s{i}")).expect("valid"))
            .collect(),
    );
    eprintln!("  MemoryStore, encrypted: hit and miss, c=1, {ops} calls each");
    let (c1, o1, k1) = (c.clone(), op.clone(), hit.clone());
    let untimed = crate::measure::untimed(1, ops, move |_| {
        let (c, o, k) = (c1.clone(), o1.clone(), k1.clone());
        async move { call_once(&c, &o, &k).await }
    })
    .await?;
    rows.push(in_process(
        "idemkit MemoryStore hit, encrypted",
        1,
        ops,
        &[],
        untimed,
    ));
    let (c1, o1, keys1) = (c.clone(), op.clone(), keys.clone());
    let untimed = crate::measure::untimed(1, ops, move |i| {
        let (c, o, keys) = (c1.clone(), o1.clone(), keys1.clone());
        async move { call_once(&c, &o, &keys[i]).await }
    })
    .await?;
    rows.push(in_process(
        "idemkit MemoryStore miss, encrypted",
        1,
        ops,
        &[],
        untimed,
    ));
    // Redis, c=64.
    let store = RedisStore::builder()
        .prefix(format!("idemkit-bench-sealed-{:x}", fastrand::u64(..)))
        .connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let c = Coordinator::new(Sealed::new(store).encrypt(keyring()));
    call_once(&c, &op, &hit).await;
    let (c1, o1, k1) = (c.clone(), op.clone(), hit.clone());
    rows.push(
        bench
            .measure("idemkit hit, encrypted", 64, ops, move |_| {
                let (c, o, k) = (c1.clone(), o1.clone(), k1.clone());
                async move { call_once(&c, &o, &k).await }
            })
            .await?,
    );
    let (c1, o1, keys1) = (c.clone(), op.clone(), keys.clone());
    rows.push(
        bench
            .measure("idemkit miss, encrypted", 64, ops, move |i| {
                let (c, o, keys) = (c1.clone(), o1.clone(), keys1.clone());
                async move { call_once(&c, &o, &keys[i % keys.len()]).await }
            })
            .await?,
    );
    Ok(rows)
}

/// An in-process row: calls per second from the untimed run's wall time, latencies from
/// the timed run's.
fn in_process(
    case: &'static str,
    concurrency: usize,
    calls: usize,
    lat: &[Duration],
    untimed: Duration,
) -> Row {
    let pct = |p: usize| lat.get(lat.len() * p / 100).copied().unwrap_or_default();
    Row {
        case,
        concurrency,
        ops_per_sec: calls as f64 / untimed.as_secs_f64(),
        p50: pct(50),
        p99: pct(99),
        commands_per_call: f64::NAN,
        redis_usec_per_call: f64::NAN,
        redis_cpu_usec_per_call: f64::NAN,
        redis_busy: f64::NAN,
    }
}

/// The heap one completed MemoryStore entry holds (100-byte result), measured by the
/// `memory_entry_bytes` example (its own process, with a counting allocator, so this
/// process's calls are not slowed by counting), which is looked for beside this binary
/// (`cargo build --release -p idemkit-bench --examples`).
///
/// # Errors
///
/// The example is not built, or failed.
pub(crate) async fn memory_entry_bytes() -> Result<RecordBytes, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let example = exe
        .parent()
        .map(|d| d.join("examples").join("memory_entry_bytes"))
        .ok_or("no directory beside the binary")?;
    let out = tokio::process::Command::new(&example)
        .output()
        .await
        .map_err(|e| {
            format!(
                "{} ({e}): build the examples too (`cargo build --release -p idemkit-bench --examples`; `cargo test` builds them)",
                example.display()
            )
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let bytes = text
        .split_whitespace()
        .next()
        .and_then(|b| b.parse().ok())
        .ok_or_else(|| format!("memory_entry_bytes printed {text:?}"))?;
    Ok(RecordBytes {
        library: "idemkit MemoryStore",
        keys_per_record: 1.0,
        bytes,
    })
}

/// Explicit batches of 64 first deliveries (`Coordinator::prepare`, then each key's call,
/// completions coalesced), one batch after another. `p50`/`p99` are per batch; the rest per
/// call.
///
/// # Errors
///
/// A Redis error.
pub(crate) async fn redis_batches(bench: &Bench, url: &str, ops: usize) -> Result<Row, String> {
    const BATCH: usize = 64;
    eprintln!("  idemkit explicit batches of {BATCH}, {ops} calls");
    let c = Coordinator::new(
        RedisStore::builder()
            .prefix(format!("idemkit-bench:{:x}", fastrand::u64(..)))
            .connect(url)
            .await
            .map_err(|e| e.to_string())?,
    );
    let op = Operation::new("bench").expect("valid");
    let next = Arc::new(AtomicU64::new(0));
    let batch = move || {
        let (c, op, next) = (c.clone(), op.clone(), next.clone());
        async move {
            let first = next.fetch_add(BATCH as u64, Ordering::Relaxed);
            let keys: Vec<Key> = (first..first + BATCH as u64)
                .map(|i| Key::new(format!("b{i}")).expect("valid"))
                .collect();
            let prepared = c.prepare(&op, &keys).await;
            let calls = keys.iter().zip(prepared).map(|(k, p)| {
                let (c, op) = (&c, &op);
                async move {
                    c.call(op, k)
                        .ttl(TTL)
                        .prepared(p)
                        .run(|_| async { Ok::<u32, std::convert::Infallible>(1) })
                        .await
                        .expect("a first delivery runs");
                }
            });
            futures_util::future::join_all(calls).await;
        }
    };
    batch().await; // loads the scripts
    let b = batch.clone();
    let commands = bench.count_commands(1, move |_| b()).await? / BATCH as f64;
    let cpu0 = bench.redis_cpu().await?;
    let started = Instant::now();
    let mut lat = Vec::with_capacity(ops / BATCH + 1);
    for _ in 0..ops.div_ceil(BATCH) {
        let s = Instant::now();
        batch().await;
        lat.push(s.elapsed());
    }
    let elapsed = started.elapsed();
    let cpu = bench.redis_cpu().await? - cpu0;
    lat.sort();
    let calls = (lat.len() * BATCH) as f64;
    Ok(Row {
        case: "idemkit miss, batches of 64",
        concurrency: BATCH,
        ops_per_sec: calls / elapsed.as_secs_f64(),
        p50: lat[lat.len() / 2],
        p99: lat[lat.len() * 99 / 100],
        commands_per_call: commands,
        redis_usec_per_call: f64::NAN,
        redis_cpu_usec_per_call: cpu * 1e6 / calls,
        redis_busy: cpu / elapsed.as_secs_f64(),
    })
}

/// The Python rows, run by `python` (a virtual environment's interpreter that has
/// idempotency-kit 0.5.0 and the idemkit wheel) on the same Redis: hit and miss at
/// concurrency 1 and 64, for the peer and for the Python package (asyncio tasks, and its
/// blocking API from threads).
///
/// # Errors
///
/// The interpreter cannot run the peer, or a Redis error.
pub(crate) async fn python_peer(
    bench: &Bench,
    python: &Path,
    url: &str,
    ops: usize,
) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (script, hit, miss) in [
        (
            PEER_SCRIPT,
            "idempotency-kit (Python) hit",
            "idempotency-kit (Python) miss",
        ),
        (
            PACKAGE_SCRIPT,
            "idemkit (Python) hit",
            "idemkit (Python) miss",
        ),
        (
            SYNC_SCRIPT,
            "idemkit (Python, run_sync in threads) hit",
            "idemkit (Python, run_sync in threads) miss",
        ),
    ] {
        let prefix = format!("pyik-bench-{:x}:", fastrand::u64(..));
        python_run(python, script, url, &prefix, "warm", 1, 1).await?;
        for concurrency in [1, 64] {
            let n = if concurrency == 1 { ops / 10 } else { ops };
            for (mode, case) in [("hit", hit), ("miss", miss)] {
                eprintln!("  {case}, c={concurrency}, {n} calls");
                // Client commands per call: 100 sequential calls under MONITOR.
                let (py, u, p) = (python.to_path_buf(), url.to_string(), prefix.clone());
                let commands = bench
                    .count_commands(1, move |_| {
                        let (py, u, p) = (py.clone(), u.clone(), p.clone());
                        async move {
                            python_run(&py, script, &u, &p, mode, 1, 100)
                                .await
                                .expect("the Python peer runs");
                        }
                    })
                    .await?
                    / 100.0;
                let cpu0 = bench.redis_cpu().await?;
                let out = python_run(python, script, url, &prefix, mode, concurrency, n).await?;
                let cpu = bench.redis_cpu().await? - cpu0;
                let field = |name: &str| -> Result<f64, String> {
                    let at = out
                        .find(&format!("\"{name}\": "))
                        .ok_or_else(|| format!("the Python peer printed no {name}: {out}"))?;
                    let rest = &out[at + name.len() + 4..];
                    let end = rest.find([',', '}']).unwrap_or(rest.len());
                    rest[..end]
                        .trim()
                        .parse()
                        .map_err(|e| format!("{name}: {e}"))
                };
                let (ops_per_sec, calls) = (field("ops_per_sec")?, field("calls")?);
                let us = |v: f64| Duration::from_nanos((v * 1e3) as u64);
                rows.push(Row {
                    case,
                    concurrency,
                    ops_per_sec,
                    p50: us(field("p50_us")?),
                    p99: us(field("p99_us")?),
                    commands_per_call: commands,
                    redis_usec_per_call: f64::NAN,
                    redis_cpu_usec_per_call: cpu * 1e6 / calls,
                    redis_busy: cpu / (calls / ops_per_sec),
                });
            }
        }
    }
    Ok(rows)
}

/// The scripts' paths (beside this crate's sources, so the command works from a clone).
const PEER_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/python/idempotency_kit_peer.py"
);
const PACKAGE_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/idemkit_python_peer.py");
const SYNC_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/python/idemkit_python_sync_peer.py"
);

async fn python_run(
    python: &Path,
    script: &str,
    url: &str,
    prefix: &str,
    mode: &str,
    concurrency: usize,
    ops: usize,
) -> Result<String, String> {
    let out = tokio::process::Command::new(python)
        .arg(script)
        .args([
            url,
            prefix,
            mode,
            &concurrency.to_string(),
            &ops.to_string(),
        ])
        .output()
        .await
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the Python peer failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Bytes per stored record (a 100-byte result) on Redis, per library: the keys a library
/// adds for 100 completed records, found by `SCAN` before and after, and their
/// `MEMORY USAGE`.
///
/// # Errors
///
/// A Redis error, or the Python peer failed.
pub(crate) async fn redis_record_bytes(
    bench: &Bench,
    url: &str,
    python: Option<&Path>,
) -> Result<Vec<RecordBytes>, String> {
    const N: usize = 100;
    eprintln!("  bytes per stored record (MEMORY USAGE), {N} records per library");
    let mut out = Vec::new();

    let c = Coordinator::new(
        RedisStore::builder()
            .prefix(format!("idemkit-bench:{:x}", fastrand::u64(..)))
            .connect(url)
            .await
            .map_err(|e| e.to_string())?,
    );
    let op = Operation::new("mail.invoice").expect("valid");
    let before = bench.keys().await?;
    for i in 0..N {
        let k = Key::new(format!("order-{i:06}")).expect("valid");
        c.call(&op, &k)
            .codec(BytesCodec)
            .ttl(TTL)
            .run(|_| async { Ok::<Vec<u8>, std::convert::Infallible>(RESULT.to_vec()) })
            .await
            .map_err(|e| e.to_string())?;
    }
    out.push(bench.new_keys_usage("idemkit", &before, N).await?);

    let client = redis027::Client::open(url).map_err(|e| e.to_string())?;
    let manager = client
        .get_connection_manager()
        .await
        .map_err(|e| e.to_string())?;
    let kit = idempotency_kit::RedisStore::new(manager);
    let run = format!("{:x}", fastrand::u64(..));
    let before = bench.keys().await?;
    for i in 0..N {
        let k = idempotency_kit::IdempotencyKey::derive("bench", format!("{run}-{i}").as_bytes())
            .map_err(|e| e.to_string())?;
        idempotency_kit::IdempotencyExecutor::execute(&kit, &k, TTL, || async {
            Ok::<_, std::convert::Infallible>(RESULT.to_vec())
        })
        .await
        .map_err(|e| e.to_string())?;
    }
    out.push(bench.new_keys_usage("idempotency-kit", &before, N).await?);

    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let idem = idempotent::store::valkey::ValkeyStore::with_prefix(
        client,
        Some(&format!("idempotent-bytes-{run}")),
    )
    .await
    .map_err(|e| e.to_string())?;
    let before = bench.keys().await?;
    for i in 0..N {
        use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
        use idempotent::store::{IdempotencyStore, InsertResult};
        let key =
            idempotent::IdempotencyKey::new(format!("order-{i}")).map_err(|e| e.to_string())?;
        let entry = idempotent::IdempotencyEntry::new(
            DefaultFingerprintStrategy.compute("bench", b"body"),
            TTL,
        );
        if let InsertResult::Claimed { fencing_token } =
            store_err(idem.try_insert(&key, entry.clone()).await)?
        {
            let response = idempotent::CachedResponse {
                status_code: 200,
                metadata: idempotent::Metadata::default(),
                body: bytes::Bytes::from_static(&RESULT),
            };
            store_err(
                idem.complete(&key, entry.complete(response), fencing_token)
                    .await,
            )?;
        }
    }
    out.push(bench.new_keys_usage("idempotent", &before, N).await?);

    if let Some(python) = python {
        let before = bench.keys().await?;
        let prefix = format!("pyik-bytes-{run}:");
        python_run(python, PEER_SCRIPT, url, &prefix, "store", 1, N).await?;
        out.push(
            bench
                .new_keys_usage("idempotency-kit (Python)", &before, N)
                .await?,
        );
    }
    Ok(out)
}

fn store_err<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<T, String> {
    r.map_err(|e| e.to_string())
}

impl Bench {
    /// Every key of the server's database (`SCAN`), for finding the keys a case added.
    pub(crate) async fn keys(&self) -> Result<std::collections::HashSet<Vec<u8>>, String> {
        let mut conn = self.raw();
        let mut cursor = 0u64;
        let mut keys = std::collections::HashSet::new();
        loop {
            let (next, page): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            keys.extend(page);
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    }

    /// The keys added since `before`, their number and `MEMORY USAGE`, per record.
    async fn new_keys_usage(
        &self,
        library: &'static str,
        before: &std::collections::HashSet<Vec<u8>>,
        records: usize,
    ) -> Result<RecordBytes, String> {
        let mut conn = self.raw();
        let added: Vec<Vec<u8>> = self
            .keys()
            .await?
            .into_iter()
            .filter(|k| !before.contains(k))
            .collect();
        let mut total = 0u64;
        for k in &added {
            let usage: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(k)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            total += usage.unwrap_or(0);
        }
        Ok(RecordBytes {
            library,
            keys_per_record: added.len() as f64 / records as f64,
            bytes: total as f64 / records as f64,
        })
    }
}

/// One case of [`interleaved_c1`]: its name and one call.
type Case = (
    &'static str,
    Box<dyn Fn(u64) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>,
);

/// Latency at concurrency 1, each case's calls interleaved with the others' in turns of 20
/// calls: this VM's wake-up latency changes over a run (a GET took 11 µs in one stretch and
/// 95 µs in the next), so ratios at concurrency 1 are only fair between calls made in the
/// same stretch. Returns each case's sorted latencies.
///
/// # Errors
///
/// A Redis error.
pub(crate) async fn interleaved_c1(
    bench: &Bench,
    url: &str,
    per_case: usize,
) -> Result<Vec<(&'static str, Vec<Duration>)>, String> {
    eprintln!("  concurrency 1, interleaved: {per_case} calls per case in turns of 20");
    let run = format!("{:x}", fastrand::u64(..));
    let op = Operation::new("bench").expect("valid");
    let idemkit = Coordinator::new(
        RedisStore::builder()
            .prefix(format!("idemkit-bench:{run}"))
            .connect(url)
            .await
            .map_err(|e| e.to_string())?,
    );
    let hit = Key::new("hit").expect("valid");
    call_once(&idemkit, &op, &hit).await;
    let client = redis027::Client::open(url).map_err(|e| e.to_string())?;
    let kit = Arc::new(idempotency_kit::RedisStore::new(
        client
            .get_connection_manager()
            .await
            .map_err(|e| e.to_string())?,
    ));
    let kit_hit = idempotency_kit::IdempotencyKey::derive("bench", format!("{run}-hit").as_bytes())
        .map_err(|e| e.to_string())?;
    crate::kit_call(&kit, &kit_hit).await;
    let idem = Arc::new(
        idempotent::store::valkey::ValkeyStore::with_prefix(
            redis::Client::open(url).map_err(|e| e.to_string())?,
            Some(&format!("idempotent-c1-{run}")),
        )
        .await
        .map_err(|e| e.to_string())?,
    );
    let idem_hit = idempotent::IdempotencyKey::new("hit").map_err(|e| e.to_string())?;
    crate::idem_call(&idem, &idem_hit).await;

    let conn = bench.raw();
    let conn2 = conn.clone();
    let (c1, o1, h1) = (idemkit.clone(), op.clone(), hit.clone());
    let (c2, o2) = (idemkit.clone(), op.clone());
    let (k1, kh) = (kit.clone(), kit_hit.clone());
    let (k2, run2) = (kit.clone(), run.clone());
    let (i1, ih) = (idem.clone(), idem_hit.clone());
    let i2 = idem.clone();
    let cases: Vec<Case> = vec![
        (
            "floor: GET",
            Box::new(move |_| {
                let mut c = conn.clone();
                Box::pin(async move {
                    let _: Option<String> = redis::cmd("GET")
                        .arg("idemkit-bench:floor")
                        .query_async(&mut c)
                        .await
                        .expect("GET");
                })
            }),
        ),
        (
            // A miss's yardstick: two round trips in one call, the second sent when the
            // first has answered, as a miss's `begin` and completion are.
            "floor: two GETs",
            Box::new(move |_| {
                let mut c = conn2.clone();
                Box::pin(async move {
                    for _ in 0..2 {
                        let _: Option<String> = redis::cmd("GET")
                            .arg("idemkit-bench:floor")
                            .query_async(&mut c)
                            .await
                            .expect("GET");
                    }
                })
            }),
        ),
        (
            "idemkit hit",
            Box::new(move |_| {
                let (c, o, k) = (c1.clone(), o1.clone(), h1.clone());
                Box::pin(async move { call_once(&c, &o, &k).await })
            }),
        ),
        (
            "idemkit miss",
            Box::new(move |i| {
                let (c, o) = (c2.clone(), o2.clone());
                let k = Key::new(format!("c1-{i}")).expect("valid");
                Box::pin(async move { call_once(&c, &o, &k).await })
            }),
        ),
        (
            "idempotency-kit hit",
            Box::new(move |_| {
                let (s, k) = (k1.clone(), kh.clone());
                Box::pin(async move { crate::kit_call(&s, &k).await })
            }),
        ),
        (
            "idempotency-kit miss",
            Box::new(move |i| {
                let s = k2.clone();
                let k = idempotency_kit::IdempotencyKey::derive(
                    "bench",
                    format!("{run2}-c1-{i}").as_bytes(),
                )
                .expect("key");
                Box::pin(async move { crate::kit_call(&s, &k).await })
            }),
        ),
        (
            "idempotent hit",
            Box::new(move |_| {
                let (s, k) = (i1.clone(), ih.clone());
                Box::pin(async move { crate::idem_call(&s, &k).await })
            }),
        ),
        (
            "idempotent miss",
            Box::new(move |i| {
                let s = i2.clone();
                let k = idempotent::IdempotencyKey::new(format!("c1-{i}")).expect("key");
                Box::pin(async move { crate::idem_call(&s, &k).await })
            }),
        ),
    ];
    let mut lat: Vec<Vec<Duration>> = vec![Vec::with_capacity(per_case); cases.len()];
    let mut i = 0u64;
    while lat[0].len() < per_case {
        for (n, (_, call)) in cases.iter().enumerate() {
            for _ in 0..20 {
                let s = Instant::now();
                call(i).await;
                lat[n].push(s.elapsed());
                i += 1;
            }
        }
    }
    Ok(cases
        .iter()
        .zip(lat)
        .map(|((name, _), mut l)| {
            l.sort();
            (*name, l)
        })
        .collect())
}
