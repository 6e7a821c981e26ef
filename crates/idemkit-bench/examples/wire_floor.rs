//! The client's floor of a first delivery on the wire, without idemkit: each call is the two
//! writes a miss needs on Valkey 9 (`SET key reservation NX PX lease GET`, then `SET key
//! record IFEQ reservation PX ttl`), sent by 64 concurrent tasks over one shared connection,
//! through redis-rs' multiplexed connection (what the Redis store's lanes are built on) or
//! through `lean`: the least a shared, pipelining client can do (one write buffer and one
//! queue of waiting callers behind a lock, a reader task that parses each reply in place).
//! Counted under callgrind, the difference of two runs divided by the difference in calls,
//! so connecting cancels out; it says how much of a miss's client instructions a client of
//! the store's own could save (docs/benchmarks.md, "The client's floor").
//!
//! ```text
//! cargo run --release -p idemkit-bench --example wire_floor -- PORT redis-rs|lean N
//! ```
//!
//! Needs a server with `SET … IFEQ` (Valkey 9: `scripts/valkey`). The client runs on one
//! thread, as the benchmark runs every library.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};

const TASKS: usize = 64;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [port, mode, n] =
        <[String; 3]>::try_from(args).map_err(|_| "usage: wire_floor PORT redis-rs|lean N")?;
    let n: usize = n.parse()?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(port, mode, n))
}

async fn run(port: String, mode: String, n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let prefix = format!("wire-{:x}", fastrand::u64(..));
    let next = Arc::new(AtomicUsize::new(0));
    let started = tokio::time::Instant::now();
    match mode.as_str() {
        "redis-rs" => {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
            let conn = client.get_multiplexed_async_connection().await?;
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let (mut conn, next, prefix) = (conn.clone(), next.clone(), prefix.clone());
                    tokio::spawn(async move {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= n {
                                break;
                            }
                            let key = format!("{prefix}:{i}");
                            let old: redis::Value = redis::cmd("SET")
                                .arg(&key)
                                .arg(RESERVATION)
                                .arg("NX")
                                .arg("PX")
                                .arg(60_000)
                                .arg("GET")
                                .query_async(&mut conn)
                                .await
                                .expect("the begin");
                            assert_eq!(old, redis::Value::Nil, "a fresh key");
                            let written: redis::Value = redis::cmd("SET")
                                .arg(&key)
                                .arg(RECORD)
                                .arg("IFEQ")
                                .arg(RESERVATION)
                                .arg("PX")
                                .arg(60_000)
                                .query_async(&mut conn)
                                .await
                                .expect("the completion");
                            assert_eq!(written, redis::Value::Okay, "IFEQ wrote");
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await?;
            }
        }
        "lean" => {
            let lean = Lean::connect(&format!("127.0.0.1:{port}")).await?;
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let (lean, next, prefix) = (lean.clone(), next.clone(), prefix.clone());
                    tokio::spawn(async move {
                        let mut key = String::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= n {
                                break;
                            }
                            key.clear();
                            use std::fmt::Write as _;
                            let _ = write!(key, "{prefix}:{i}");
                            let old = lean
                                .call(&[
                                    b"SET",
                                    key.as_bytes(),
                                    RESERVATION.as_bytes(),
                                    b"NX",
                                    b"PX",
                                    b"60000",
                                    b"GET",
                                ])
                                .await;
                            assert!(matches!(old, Reply::Nil), "a fresh key: {old:?}");
                            let written = lean
                                .call(&[
                                    b"SET",
                                    key.as_bytes(),
                                    RECORD.as_bytes(),
                                    b"IFEQ",
                                    RESERVATION.as_bytes(),
                                    b"PX",
                                    b"60000",
                                ])
                                .await;
                            assert!(matches!(written, Reply::Ok), "IFEQ wrote: {written:?}");
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await?;
            }
        }
        other => return Err(format!("unknown mode {other}").into()),
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{mode}: {n} pairs in {secs:.3} s ({:.0}/s)",
        n as f64 / secs
    );
    Ok(())
}

/// The sizes of a miss's reservation and record on the wire (docs/benchmarks.md: 60 and 66
/// bytes).
const RESERVATION: &str = "r1:0123456789abcdef0123456789abcdef:1796647189349181:60000:pid";
const RECORD: &str = "c1:0123456789abcdef0123456789abcdef:1796647189349181:0:u32:0000001";

/// A reply, as far as these two commands answer.
#[derive(Debug)]
enum Reply {
    Nil,
    Ok,
    Other,
}

/// The least a shared, pipelining client does: callers append their command to one buffer
/// and their answer slot to one queue, under one lock, in the same order; a writer task
/// sends what the buffer holds; a reader task parses replies in place and answers the
/// queue's head. `idemkit-redis`' `wire.rs` was built on this design; this one stays bare
/// on purpose (RESP2, two reply shapes, no reconnects or timeouts), so the floor stays a
/// floor.
#[derive(Clone)]
struct Lean {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Notify,
}

#[derive(Default)]
struct Queue {
    out: Vec<u8>,
    waiting: VecDeque<oneshot::Sender<Reply>>,
}

impl Lean {
    async fn connect(addr: &str) -> std::io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (mut rd, mut wr) = stream.into_split();
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
        });
        let writer = shared.clone();
        tokio::spawn(async move {
            let mut sending = Vec::new();
            loop {
                writer.wake.notified().await;
                {
                    let mut q = writer.queue.lock().unwrap_or_else(PoisonError::into_inner);
                    std::mem::swap(&mut q.out, &mut sending);
                }
                if !sending.is_empty() {
                    if wr.write_all(&sending).await.is_err() {
                        return;
                    }
                    sending.clear();
                }
            }
        });
        let reader = shared.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            let (mut start, mut end) = (0, 0);
            loop {
                if start == end {
                    (start, end) = (0, 0);
                } else if end == buf.len() {
                    buf.copy_within(start..end, 0);
                    (start, end) = (0, end - start);
                }
                match rd.read(&mut buf[end..]).await {
                    Ok(0) | Err(_) => return,
                    Ok(read) => end += read,
                }
                while let Some((reply, used)) = parse(&buf[start..end]) {
                    start += used;
                    let head = reader
                        .queue
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .waiting
                        .pop_front();
                    if let Some(tx) = head {
                        let _ = tx.send(reply);
                    }
                }
            }
        });
        Ok(Lean { shared })
    }

    async fn call(&self, args: &[&[u8]]) -> Reply {
        let (tx, rx) = oneshot::channel();
        {
            let mut q = self
                .shared
                .queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let out = &mut q.out;
            out.push(b'*');
            digits(out, args.len());
            out.extend_from_slice(b"\r\n");
            for a in args {
                out.push(b'$');
                digits(out, a.len());
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(a);
                out.extend_from_slice(b"\r\n");
            }
            q.waiting.push_back(tx);
        }
        self.shared.wake.notify_one();
        rx.await.expect("the connection answered")
    }
}

/// One reply at the start of `b` and its length, or `None` if `b` does not hold all of it.
/// These two commands answer a null bulk string (RESP2 `$-1`), `+OK`, or a bulk string.
fn parse(b: &[u8]) -> Option<(Reply, usize)> {
    let line = b.windows(2).position(|w| w == b"\r\n")?;
    match b.first()? {
        b'+' if &b[1..line] == b"OK" => Some((Reply::Ok, line + 2)),
        b'$' if &b[1..line] == b"-1" => Some((Reply::Nil, line + 2)),
        b'$' => {
            let len: usize = std::str::from_utf8(&b[1..line]).ok()?.parse().ok()?;
            let total = line + 2 + len + 2;
            (b.len() >= total).then_some((Reply::Other, total))
        }
        _ => Some((Reply::Other, line + 2)),
    }
}

/// `n` in decimal at the end of `out`.
fn digits(out: &mut Vec<u8>, mut n: usize) {
    let mut tmp = [0u8; 20];
    let mut at = tmp.len();
    loop {
        at -= 1;
        tmp[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[at..]);
}
