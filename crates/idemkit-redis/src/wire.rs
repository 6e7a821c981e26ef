//! The store's own connection for its lanes (`RedisStoreBuilder::own_client`): one plain TCP
//! connection to one server, shared by every caller, pipelining. A caller appends its
//! packed command to one buffer and its answer slot to one queue, under one lock and in the
//! same order; a writer task sends what the buffer holds, a reader task parses each reply in
//! place and answers the queue's head. Redis answers a connection's commands in order, so
//! the queue's head is always the caller of the next reply.
//!
//! Why: redis-rs' multiplexed connection costs the client several times what a bare
//! pipelining connection does a command (`examples/wire_floor.rs` under callgrind; the
//! figures are in docs/benchmarks.md), and a first delivery at c=64 is bound by the client.
//!
//! What it does not do, so the store keeps redis-rs for it: subscriptions (push messages:
//! the store's first connection, a redis-rs one, carries them; a push arriving here is
//! skipped), TLS, Sentinel, Cluster, and transactions (`MULTI` pipelines: the store sends
//! none). It speaks RESP3 (`HELLO 3`) as the store's other connections do, so scripts'
//! replies read the same; the reply types the store's commands answer are parsed here, the
//! rest (errors, doubles, maps...) by redis-rs' parser, on the reply's bytes.
//!
//! A connection that fails (a read or write error, the server closing it) answers every
//! caller waiting on it with the error (`Unavailable`), and the next call connects again,
//! as redis-rs' connection manager does; a call is bounded by the response timeout (within
//! an eighth more: one watchdog a connection times its requests, `watch`).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::{Cmd, Pipeline, RedisError, RedisResult, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, oneshot};

/// One server's address and what a new connection says first.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
    pub(crate) connection_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

/// The store's own connection (see the module's docs); clones share it.
#[derive(Clone)]
pub(crate) struct Wire {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    /// The connection now, if one is up (a failed one is replaced on the next call).
    line: Mutex<Option<Arc<Line>>>,
    /// One connect at a time.
    connecting: tokio::sync::Mutex<()>,
    /// The connects that ended so far (connected or failed).
    attempts: AtomicU64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The store is gone: the writer shuts the socket, the server closes it, the reader
        // ends.
        if let Some(line) = self.line.get_mut().unwrap_or_else(PoisonError::into_inner) {
            line.close(io::ErrorKind::NotConnected);
        }
    }
}

/// One TCP connection: its queue and its writer's wake-up.
struct Line {
    queue: Mutex<Queue>,
    wake: Notify,
    /// The watchdog's ticks so far (see [`watch`]): a request notes the count it was queued
    /// at, rather than read the clock.
    ticks: AtomicU64,
}

struct Queue {
    out: Vec<u8>,
    /// Requests in `out`, not yet handed to the socket.
    unsent: usize,
    waiting: VecDeque<Waiting>,
    /// The connection failed or was closed: nothing more is sent on it.
    closed: bool,
    /// The writer holds bytes it has not written yet: nobody else writes meanwhile.
    writing: bool,
    /// The socket's write half, for a caller's own send (see [`SEND_AT`]); the writer
    /// holds it too. Taken out when the line closes, so the writer's copy is the last and
    /// its end shuts the socket.
    socket: Option<Arc<OwnedWriteHalf>>,
}

/// How many requests may gather in the buffer before the caller that adds the last sends
/// them itself, rather than leave them all to the writer. On one connection the writer
/// runs after every caller woken by a batch of replies has queued its next request, so
/// Redis would idle while the client handles a whole batch, and the client while Redis
/// runs it; sending the first requests early lets Redis start on them while the client
/// handles the rest (measured in docs/benchmarks.md, "One connection").
const SEND_AT: usize = 16;

/// A caller's answer slot: one reply (`many: None`) or `count` of them, queued at the
/// watchdog's tick `born` (see [`watch`]). `tx` is `None` once the caller was answered with
/// a timeout: the slot stays in the queue for its reply, which is read and dropped.
struct Waiting {
    many: Option<(usize, Vec<Value>)>,
    born: u64,
    tx: Option<oneshot::Sender<RedisResult<Answer>>>,
}

enum Answer {
    One(Value),
    Many(Vec<Value>),
}

impl Line {
    /// Fails every waiting caller and refuses new ones; wakes the writer to shut the socket.
    fn close(&self, kind: io::ErrorKind) {
        let waiting = {
            let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            q.closed = true;
            q.out.clear();
            q.socket = None;
            std::mem::take(&mut q.waiting)
        };
        for w in waiting {
            if let Some(tx) = w.tx {
                let _ = tx.send(Err(dropped(kind)));
            }
        }
        self.wake.notify_one();
    }

    fn is_closed(&self) -> bool {
        self.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed
    }
}

fn dropped(kind: io::ErrorKind) -> RedisError {
    RedisError::from(io::Error::new(kind, "the connection to Redis ended"))
}

impl Wire {
    /// Connects now (an unreachable server fails here, as redis-rs' connection manager
    /// does at connect).
    pub(crate) async fn connect(settings: Settings) -> RedisResult<Wire> {
        let wire = Wire {
            inner: Arc::new(Inner {
                settings,
                line: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                attempts: AtomicU64::new(0),
            }),
        };
        wire.line().await?;
        Ok(wire)
    }

    pub(crate) fn db(&self) -> i64 {
        self.inner.settings.db
    }

    /// Whether no request waits for its reply on this connection now (none is up: idle).
    pub(crate) fn idle(&self) -> bool {
        let line = self
            .inner
            .line
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        line.as_ref().is_none_or(|l| {
            l.queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .waiting
                .is_empty()
        })
    }

    /// The live connection, connecting if there is none.
    async fn line(&self) -> RedisResult<Arc<Line>> {
        if let Some(line) = self.live() {
            return Ok(line);
        }
        // Read before waiting for the turn: a connect that ends meanwhile changes it.
        let tried = self.inner.attempts.load(Ordering::Acquire);
        let _one = self.inner.connecting.lock().await;
        if let Some(line) = self.live() {
            return Ok(line); // another caller connected meanwhile
        }
        if self.inner.attempts.load(Ordering::Acquire) != tried {
            // Another caller's connect failed while this one waited for its turn: fail as
            // it did rather than wait a connect more (callers would wait one each).
            return Err(dropped(io::ErrorKind::ConnectionRefused));
        }
        let s = &self.inner.settings;
        let opened = tokio::time::timeout(s.connection_timeout, open(s)).await;
        // Counted once ended: a caller that read the count while this one ran sees it move.
        self.inner.attempts.fetch_add(1, Ordering::AcqRel);
        let stream =
            opened.map_err(|_| RedisError::from(io::Error::from(io::ErrorKind::TimedOut)))??;
        let (rd, wr) = stream.into_split();
        let wr = Arc::new(wr);
        let line = Arc::new(Line {
            queue: Mutex::new(Queue {
                out: Vec::new(),
                unsent: 0,
                waiting: VecDeque::new(),
                closed: false,
                writing: false,
                socket: Some(wr.clone()),
            }),
            wake: Notify::new(),
            ticks: AtomicU64::new(0),
        });
        tokio::spawn(write(line.clone(), wr));
        tokio::spawn(read(line.clone(), rd));
        tokio::spawn(watch(Arc::downgrade(&line), s.response_timeout));
        *self
            .inner
            .line
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(line.clone());
        Ok(line)
    }

    fn live(&self) -> Option<Arc<Line>> {
        let line = self
            .inner
            .line
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        line.as_ref().filter(|l| !l.is_closed()).cloned()
    }

    /// Sends what `pack` writes as one request and waits for its answer (bounded by the
    /// response timeout: the line's watchdog answers a request that is past it, see
    /// [`watch`]).
    async fn request(
        &self,
        many: Option<usize>,
        pack: impl FnOnce(&mut Vec<u8>),
    ) -> RedisResult<Answer> {
        let line = self.line().await?;
        let (tx, rx) = oneshot::channel();
        {
            let mut q = line.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if q.closed {
                return Err(dropped(io::ErrorKind::ConnectionReset));
            }
            pack(&mut q.out);
            q.waiting.push_back(Waiting {
                many: many.map(|n| (n, Vec::with_capacity(n))),
                born: line.ticks.load(Ordering::Relaxed),
                tx: Some(tx),
            });
            q.unsent += 1;
            if q.unsent >= SEND_AT && !q.writing {
                q.send_now();
            }
        }
        line.wake.notify_one();
        rx.await
            .unwrap_or_else(|_| Err(dropped(io::ErrorKind::ConnectionReset)))
    }

    /// Sends the one command `pack` writes (RESP) and waits for its reply (`crate::resp`).
    pub(crate) async fn call(&self, pack: impl FnOnce(&mut Vec<u8>)) -> RedisResult<Value> {
        match self.request(None, pack).await? {
            Answer::One(v) => v.extract_error(),
            Answer::Many(_) => unreachable!("one reply asked"),
        }
    }

    /// Sends the `count` commands `pack` writes as one request and waits for their replies,
    /// each command's own error in its place (`crate::resp`).
    pub(crate) async fn call_many(
        &self,
        count: usize,
        pack: impl FnOnce(&mut Vec<u8>),
    ) -> RedisResult<Vec<Value>> {
        if count == 0 {
            return Ok(Vec::new());
        }
        match self.request(Some(count), pack).await? {
            Answer::Many(values) => Ok(values),
            Answer::One(_) => unreachable!("many replies asked"),
        }
    }

    pub(crate) async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self
            .request(None, |out| cmd.write_packed_command(out))
            .await?
        {
            Answer::One(v) => v.extract_error(),
            Answer::Many(_) => unreachable!("one reply asked"),
        }
    }

    pub(crate) async fn pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        if offset != 0 || pipeline.is_transaction() {
            return Err(RedisError::from((
                redis::ErrorKind::Client,
                "the store's own connection sends no transactions",
            )));
        }
        if count == 0 {
            return Ok(Vec::new());
        }
        let packed = pipeline.get_packed_pipeline();
        match self
            .request(Some(count), |out| out.extend_from_slice(&packed))
            .await?
        {
            Answer::Many(values) => Ok(values),
            Answer::One(_) => unreachable!("many replies asked"),
        }
    }
}

/// The name each of these connections gives itself (`CLIENT LIST`'s `name=`).
pub(crate) const CLIENT_NAME: &str = "idemkit-lane";

/// A TCP connection that has said `HELLO 3` (with `AUTH`, and its name) and `SELECT`ed its
/// database.
async fn open(s: &Settings) -> RedisResult<TcpStream> {
    let mut stream = TcpStream::connect((s.host.as_str(), s.port)).await?;
    stream.set_nodelay(true)?;
    let mut hello = redis::cmd("HELLO");
    hello.arg(3);
    if let Some(password) = &s.password {
        hello
            .arg("AUTH")
            .arg(s.username.as_deref().unwrap_or("default"))
            .arg(password);
    }
    // Named, so an operator's `CLIENT LIST` tells the store's lanes apart.
    hello.arg("SETNAME").arg(CLIENT_NAME);
    let mut out = hello.get_packed_command();
    let mut replies = 1;
    if s.db != 0 {
        redis::cmd("SELECT")
            .arg(s.db)
            .write_packed_command(&mut out);
        replies += 1;
    }
    stream.write_all(&out).await?;
    let mut buf = Vec::with_capacity(1024);
    let mut start = 0;
    while replies > 0 {
        match frame(&buf[start..]) {
            Some(len) => {
                value(&buf[start..start + len])?.extract_error()?;
                start += len;
                replies -= 1;
            }
            None => {
                let mut chunk = [0u8; 1024];
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Err(dropped(io::ErrorKind::UnexpectedEof));
                }
                buf.extend_from_slice(&chunk[..n]);
            }
        }
    }
    Ok(stream)
}

impl Queue {
    /// A caller's own send of what the buffer holds, without waiting: what the socket takes
    /// now leaves the buffer, the rest stays for the writer (woken after). Only while the
    /// writer holds nothing unwritten, so the bytes keep their order.
    fn send_now(&mut self) {
        let Some(socket) = &self.socket else { return };
        if let Ok(n) = socket.try_write(&self.out) {
            self.out.drain(..n);
        }
        // A full socket or a failed write: the writer sends the rest (and reports a
        // failure), and the next caller tries sixteen requests later, not at once.
        self.unsent = 0;
    }
}

/// The writer: sends what the queue's buffer holds each time it is woken. Its end (the
/// line closed, a failed write) drops the last handle of the write half, which shuts the
/// socket: the server closes it, the reader ends.
async fn write(line: Arc<Line>, wr: Arc<OwnedWriteHalf>) {
    let mut sending = Vec::new();
    loop {
        line.wake.notified().await;
        let closed = {
            let mut q = line.queue.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::swap(&mut q.out, &mut sending);
            q.unsent = 0;
            q.writing = !sending.is_empty();
            q.closed
        };
        if closed {
            return;
        }
        if sending.is_empty() {
            continue;
        }
        let mut at = 0;
        while at < sending.len() {
            let written = match wr.writable().await {
                Ok(()) => match wr.try_write(&sending[at..]) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    written => written,
                },
                Err(e) => Err(e),
            };
            match written {
                Ok(n) => at += n,
                Err(_) => return line.close(io::ErrorKind::BrokenPipe),
            }
        }
        sending.clear();
        line.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .writing = false;
    }
}

/// The reader: parses replies in place and answers the queue's head with each.
async fn read(line: Arc<Line>, mut rd: OwnedReadHalf) {
    let mut buf = vec![0u8; 16 * 1024];
    let (mut start, mut end) = (0, 0);
    loop {
        if start == end {
            (start, end) = (0, 0);
        } else if end == buf.len() {
            if start > 0 {
                buf.copy_within(start..end, 0);
                (start, end) = (0, end - start);
            } else {
                // One reply larger than the buffer (a large result): grow it.
                buf.resize(buf.len() * 2, 0);
            }
        }
        match rd.read(&mut buf[end..]).await {
            Ok(0) => return line.close(io::ErrorKind::UnexpectedEof),
            Err(e) => return line.close(e.kind()),
            Ok(n) => end += n,
        }
        while let Some(len) = frame(&buf[start..end]) {
            let bytes = &buf[start..start + len];
            start += len;
            if bytes[0] == b'>' {
                continue; // a push: this connection subscribes to nothing (see the module)
            }
            match value(bytes) {
                Ok(reply) => answer(&line, reply),
                // Not a reply (a corrupt stream): nothing after it can be matched to a caller.
                Err(_) => return line.close(io::ErrorKind::InvalidData),
            }
        }
    }
}

/// Hands one reply to the queue's head (a pipeline's slot takes several).
fn answer(line: &Line, reply: Value) {
    let mut q = line.queue.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(head) = q.waiting.front_mut() else {
        return; // a reply nobody waits for: the line was closed meanwhile
    };
    let done = match &mut head.many {
        None => Some(Ok(Answer::One(reply))),
        Some((count, values)) => {
            values.push(reply);
            (values.len() == *count).then(|| Ok(Answer::Many(std::mem::take(values))))
        }
    };
    if let Some(done) = done {
        let head = q.waiting.pop_front().expect("the head");
        drop(q);
        if let Some(tx) = head.tx {
            let _ = tx.send(done);
        }
    }
}

/// How often a line's watchdog looks for requests past their response timeout: an eighth of
/// it, so a request is answered within an eighth more than the timeout.
fn watch_every(timeout: Duration) -> Duration {
    (timeout / TICKS as u32).max(Duration::from_millis(1))
}

/// The watchdog's ticks in a response timeout.
const TICKS: u64 = 8;

/// The line's watchdog: ticks every [`watch_every`] and answers each request queued more
/// than [`TICKS`] ticks ago with a timeout (`Unavailable`): it waited at least the response
/// timeout, and at most an eighth more. Its slot stays in the queue for its reply (read and
/// dropped when it comes, so every later reply still reaches its own caller). One timer a
/// connection, and a request reads no clock (it notes the tick count): a request's own
/// timer (registered in tokio's timer wheel, then cancelled) was a large part of what the
/// client spent on a call (measured in docs/benchmarks.md). A tick the runtime could not
/// run in time is run as soon as it can (`interval`'s burst), so late ticks still count
/// the time that passed. Requests are queued in tick order, so the scan stops at the first
/// one not due. Ends with the line.
async fn watch(line: std::sync::Weak<Line>, timeout: Duration) {
    let mut ticks = tokio::time::interval(watch_every(timeout));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    // An interval's first tick is at once: the count starts with it.
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(line) = line.upgrade() else { return };
        let now = line.ticks.fetch_add(1, Ordering::Relaxed) + 1;
        let late: Vec<_> = {
            let mut q = line.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if q.closed {
                return;
            }
            q.waiting
                .iter_mut()
                .take_while(|w| now - w.born > TICKS)
                .filter_map(|w| w.tx.take())
                .collect()
        };
        for tx in late {
            let _ = tx.send(Err(RedisError::from(io::Error::from(
                io::ErrorKind::TimedOut,
            ))));
        }
    }
}

/// The length of the RESP3 frame at the start of `b`, or `None` if `b` does not hold all
/// of it yet.
fn frame(b: &[u8]) -> Option<usize> {
    let line = line_end(b)?;
    let head = b.get(1..line).unwrap_or_default();
    let after = line + 2;
    match *b.first()? {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(after),
        b'$' | b'!' | b'=' => {
            let len = number(head)?;
            if len < 0 {
                return Some(after); // a null bulk string (RESP2's `$-1`)
            }
            let total = after + len as usize + 2;
            (b.len() >= total).then_some(total)
        }
        t @ (b'*' | b'~' | b'>' | b'%' | b'|') => {
            let n = number(head)?;
            if n < 0 {
                return Some(after);
            }
            // A map or an attribute holds pairs; an attribute precedes the value it is about.
            let items = if matches!(t, b'%' | b'|') { 2 * n } else { n } as usize;
            let mut at = after;
            for _ in 0..items {
                at += frame(&b[at..])?;
            }
            if t == b'|' {
                at += frame(&b[at..])?;
            }
            Some(at)
        }
        _ => Some(after), // not RESP: `value` reports it
    }
}

fn line_end(b: &[u8]) -> Option<usize> {
    let at = memchr(b'\r', b)?;
    (b.get(at + 1) == Some(&b'\n')).then_some(at)
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&c| c == needle)
}

fn number(digits: &[u8]) -> Option<i64> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// The value of one whole frame: the types the store's commands answer read here, as
/// redis-rs reads them; the rest by redis-rs' parser.
fn value(b: &[u8]) -> RedisResult<Value> {
    let line = line_end(b).unwrap_or(b.len());
    let head = b.get(1..line).unwrap_or_default();
    let after = line + 2;
    let fast = match b.first().copied().unwrap_or_default() {
        b'+' if head == b"OK" => Some(Value::Okay),
        b'+' => std::str::from_utf8(head)
            .ok()
            .map(|s| Value::SimpleString(s.to_owned())),
        b':' => number(head).map(Value::Int),
        b'_' => Some(Value::Nil),
        b'#' => match head {
            b"t" => Some(Value::Boolean(true)),
            b"f" => Some(Value::Boolean(false)),
            _ => None,
        },
        b'$' => match number(head) {
            Some(n) if n < 0 => Some(Value::Nil),
            Some(n) => Some(Value::BulkString(b[after..after + n as usize].to_vec())),
            None => None,
        },
        b'*' => match number(head) {
            Some(n) if n < 0 => Some(Value::Nil),
            Some(n) => {
                let mut items = Vec::with_capacity(n as usize);
                let mut at = after;
                for _ in 0..n {
                    let len = frame(&b[at..]).ok_or_else(incomplete)?;
                    items.push(value(&b[at..at + len])?);
                    at += len;
                }
                Some(Value::Array(items))
            }
            None => None,
        },
        _ => None,
    };
    match fast {
        Some(v) => Ok(v),
        None => redis::parse_redis_value(b),
    }
}

fn incomplete() -> RedisError {
    RedisError::from((redis::ErrorKind::Parse, "an incomplete reply"))
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    /// A peer on a free port that answers `HELLO` like a server (an empty map).
    async fn peer() -> (TcpListener, Settings) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("its address").port();
        let settings = Settings {
            host: "127.0.0.1".into(),
            port,
            username: None,
            password: None,
            db: 0,
            connection_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
        };
        (listener, settings)
    }

    /// Accepts one connection and answers its `HELLO`.
    async fn accept(listener: &TcpListener) -> TcpStream {
        let (mut s, _) = listener.accept().await.expect("a connection");
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).await.expect("HELLO");
        assert!(buf[..n].ends_with(b"$7\r\nSETNAME\r\n$12\r\nidemkit-lane\r\n"));
        s.write_all(b"%0\r\n").await.expect("its reply");
        s
    }

    /// The store dropped: its connection is closed (the server reads its end).
    #[tokio::test]
    async fn a_dropped_wire_closes_its_connection() {
        let (listener, settings) = peer().await;
        let (wire, mut server) = tokio::join!(Wire::connect(settings), accept(&listener));
        drop(wire.expect("connected"));
        let mut buf = [0u8; 16];
        // A bound for a failure only (the socket left open): the end of file comes at once.
        let read = tokio::time::timeout(Duration::from_secs(30), server.read(&mut buf)).await;
        assert_eq!(read.expect("closed").expect("a read"), 0, "end of file");
    }

    /// The caller that adds the sixteenth waiting request sends the buffer itself: the
    /// server reads every request before the writer task has run (this current-thread
    /// runtime runs nothing else until the test awaits), and each caller gets its reply.
    #[tokio::test(flavor = "current_thread")]
    async fn the_request_that_fills_the_batch_is_sent_before_the_writer_runs() {
        use std::io::{Read as _, Write as _};
        use std::task::{Context, Poll, Waker};

        let (listener, settings) = peer().await;
        let (wire, server) = tokio::join!(Wire::connect(settings), accept(&listener));
        let wire = wire.expect("connected");
        let mut server = server.into_std().expect("a std socket");
        server.set_nonblocking(false).expect("blocking");
        // A bound for a failure only (nothing sent): the bytes are there at once.
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("a read timeout");
        let gets: Vec<Cmd> = (0..SEND_AT)
            .map(|i| redis::cmd("GET").arg(format!("k{i}")).clone())
            .collect();
        let mut calls: Vec<_> = gets.iter().map(|g| Box::pin(wire.command(g))).collect();
        let mut cx = Context::from_waker(Waker::noop());
        for call in &mut calls {
            assert!(matches!(call.as_mut().poll(&mut cx), Poll::Pending));
        }
        let sent: Vec<u8> = gets.iter().flat_map(Cmd::get_packed_command).collect();
        let mut read = vec![0u8; sent.len()];
        server
            .read_exact(&mut read)
            .expect("the requests, sent by their caller");
        assert_eq!(read, sent);
        let replies: String = (0..SEND_AT)
            .map(|i| {
                let v = format!("v{i}");
                format!("${}\r\n{v}\r\n", v.len())
            })
            .collect();
        server.write_all(replies.as_bytes()).expect("the replies");
        for (i, call) in calls.into_iter().enumerate() {
            let v = call.await.expect("answered");
            assert_eq!(v, Value::BulkString(format!("v{i}").into_bytes()));
        }
    }

    /// A connection that ends answers its waiting callers with a dropped connection
    /// (`Unavailable` to the store), and the next call connects again.
    #[tokio::test]
    async fn a_call_after_a_dropped_connection_connects_again() {
        let (listener, settings) = peer().await;
        let (wire, server) = tokio::join!(Wire::connect(settings), accept(&listener));
        let (wire, mut server) = (wire.expect("connected"), server);
        let get = redis::cmd("GET").arg("k").clone();
        let cut = async {
            let mut buf = [0u8; 64];
            let n = server.read(&mut buf).await.expect("the GET");
            assert!(n > 0);
            drop(server); // the connection ends with the GET unanswered
        };
        let (first, ()) = tokio::join!(wire.command(&get), cut);
        let e = first.expect_err("the connection ended");
        assert!(e.is_connection_dropped(), "{e:?}");
        let answer = async {
            let mut s = accept(&listener).await;
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).await.expect("the GET again");
            assert!(buf[..n].ends_with(b"$1\r\nk\r\n"));
            s.write_all(b"$1\r\nv\r\n").await.expect("its reply");
            s
        };
        let (second, _s) = tokio::join!(wire.command(&get), answer);
        assert_eq!(second.expect("answered"), Value::BulkString(b"v".to_vec()));
    }

    /// A reply later than the response timeout answers its caller's closed slot, and the
    /// next caller gets its own reply, not the late one.
    #[tokio::test]
    async fn a_late_reply_never_reaches_the_next_caller() {
        let (listener, mut settings) = peer().await;
        // The first call's timeout is the event this test waits for (its reply is held
        // until the second call is on the wire), not a race; long enough that a busy
        // machine answers the second call within it.
        settings.response_timeout = Duration::from_secs(2);
        let (wire, server) = tokio::join!(Wire::connect(settings), accept(&listener));
        let (wire, mut server) = (wire.expect("connected"), server);
        let mut buf = [0u8; 256];
        let (get_a, get_b) = (
            redis::cmd("GET").arg("a").clone(),
            redis::cmd("GET").arg("b").clone(),
        );
        let (first, n) = tokio::join!(wire.command(&get_a), async {
            server.read(&mut buf).await.expect("the first GET")
        });
        assert!(buf[..n].ends_with(b"$1\r\na\r\n"));
        assert!(first.expect_err("no reply in time").is_timeout());
        let answer = async {
            let n = server.read(&mut buf).await.expect("the second GET");
            assert!(buf[..n].ends_with(b"$1\r\nb\r\n"));
            // Both replies, in order: the late one first.
            server
                .write_all(b"$6\r\nlate-a\r\n$6\r\nreal-b\r\n")
                .await
                .expect("the replies");
        };
        let (second, ()) = tokio::join!(wire.command(&get_b), answer);
        assert_eq!(
            second.expect("answered"),
            Value::BulkString(b"real-b".to_vec())
        );
    }

    /// Requests a silent server does not answer are each answered as timed out by the
    /// connection's watchdog, no sooner than the response timeout after it was sent and
    /// within an eighth more (the one timer a connection that replaced one a request), in
    /// the order sent; the connection stays up, and the late replies, when they come, are
    /// read into the closed slots: the next caller gets its own. On tokio's paused clock,
    /// which moves only to the next timer when every task waits.
    #[tokio::test(start_paused = true)]
    async fn requests_past_their_timeout_are_answered_by_the_watchdog() {
        let (listener, mut settings) = peer().await;
        settings.response_timeout = Duration::from_secs(8);
        let (wire, server) = tokio::join!(Wire::connect(settings), accept(&listener));
        let (wire, mut server) = (wire.expect("connected"), server);
        let start = tokio::time::Instant::now();
        // Three requests, sent 0, 3 and 5 s in.
        let calls = [0u64, 3, 5].map(|at| {
            let wire = wire.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(at)).await;
                let sent = start.elapsed();
                let get = redis::cmd("GET").arg(format!("k{at}")).clone();
                let reply = wire.command(&get).await;
                (reply, sent, start.elapsed())
            }
        });
        let [a, b, c] = calls;
        let (a, b, c) = tokio::join!(a, b, c);
        for (reply, sent, answered) in [a, b, c] {
            assert!(reply.expect_err("no reply").is_timeout());
            let waited = answered - sent;
            assert!(
                waited >= Duration::from_secs(8) && waited <= Duration::from_secs(9),
                "sent at {sent:?}, answered at {answered:?}"
            );
        }
        // The three late replies, then the fourth request's own.
        let mut buf = [0u8; 256];
        let mut read = 0;
        while !buf[..read].ends_with(b"$2\r\nk5\r\n") {
            read += server.read(&mut buf[read..]).await.expect("the requests");
        }
        let fourth = async {
            let get = redis::cmd("GET").arg("k9").clone();
            wire.command(&get).await
        };
        let answer = async {
            let n = server.read(&mut buf).await.expect("the fourth request");
            assert!(buf[..n].ends_with(b"$2\r\nk9\r\n"));
            server
                .write_all(b"$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$3\r\nk9!\r\n")
                .await
                .expect("the replies");
        };
        let (fourth, ()) = tokio::join!(fourth, answer);
        assert_eq!(
            fourth.expect("answered"),
            Value::BulkString(b"k9!".to_vec())
        );
    }

    /// Bytes that are not RESP close the connection: its caller fails, the next call
    /// connects again.
    #[tokio::test]
    async fn a_reply_that_is_not_resp_closes_the_connection() {
        let (listener, settings) = peer().await;
        let (wire, server) = tokio::join!(Wire::connect(settings), accept(&listener));
        let (wire, mut server) = (wire.expect("connected"), server);
        let get = redis::cmd("GET").arg("k").clone();
        let garbage = async {
            let mut buf = [0u8; 64];
            let _ = server.read(&mut buf).await.expect("the GET");
            server.write_all(b"?what\r\n").await.expect("garbage");
            server
        };
        let (first, _server) = tokio::join!(wire.command(&get), garbage);
        let e = first.expect_err("not a reply");
        assert_eq!(e.kind(), redis::ErrorKind::Io, "{e:?}");
        let answer = async {
            let mut s = accept(&listener).await;
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf).await.expect("the GET again");
            s.write_all(b"_\r\n").await.expect("its reply");
            s
        };
        let (second, _s) = tokio::join!(wire.command(&get), answer);
        assert_eq!(second.expect("answered"), Value::Nil);
    }

    /// Callers that queue behind a connect that fails fail with it: one connect is tried,
    /// not one per caller (each would wait its own connection timeout).
    #[tokio::test]
    async fn callers_behind_a_failed_connect_do_not_try_again() {
        let (listener, mut settings) = peer().await;
        settings.connection_timeout = Duration::from_secs(2);
        let (wire, server) = tokio::join!(Wire::connect(settings), accept(&listener));
        let wire = wire.expect("connected");
        drop(server); // the connection ends
        let e = wire
            .command(redis::cmd("GET").arg("k"))
            .await
            .expect_err("the connection ended");
        assert!(e.is_connection_dropped(), "{e:?}");
        let before = wire.inner.attempts.load(Ordering::Acquire);
        // From now on the server accepts connections and never answers `HELLO`: every
        // connect times out (the event the callers wait on).
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let calls = (0..8).map(|_| {
            let wire = wire.clone();
            async move { wire.command(redis::cmd("GET").arg("k")).await }
        });
        for r in futures_util::future::join_all(calls).await {
            assert!(r.is_err());
        }
        assert_eq!(wire.inner.attempts.load(Ordering::Acquire), before + 1);
        silent.abort();
    }

    /// Each type as redis-rs' own parser reads it, and each frame's length found whole.
    #[test]
    fn replies_read_as_redis_rs_reads_them() {
        let frames: &[&[u8]] = &[
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b":-42\r\n",
            b"_\r\n",
            b"$-1\r\n",
            b"$5\r\nhe\r\nl\r\n",
            b"$0\r\n\r\n",
            b"*-1\r\n",
            b"*3\r\n:1\r\n$2\r\nab\r\n*1\r\n_\r\n",
            b"#t\r\n",
            b"#f\r\n",
            b"-ERR wrong\r\n",
            b"-NOSCRIPT No matching script\r\n",
            b",1.5\r\n",
            b"%1\r\n+a\r\n:1\r\n",
            b"~2\r\n:1\r\n:2\r\n",
            b"=8\r\ntxt:abcd\r\n",
            b"|1\r\n+k\r\n+v\r\n:7\r\n",
        ];
        for f in frames {
            assert_eq!(frame(f), Some(f.len()), "{:?}", String::from_utf8_lossy(f));
            for cut in 0..f.len() {
                assert_eq!(frame(&f[..cut]), None, "a prefix of {f:?} is incomplete");
            }
            let ours = value(f);
            let theirs = redis::parse_redis_value(f);
            assert_eq!(
                format!("{ours:?}"),
                format!("{theirs:?}"),
                "{:?}",
                String::from_utf8_lossy(f)
            );
        }
    }
}
