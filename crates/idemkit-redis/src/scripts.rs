//! The Lua scripts (`lua/*.lua`, one per phase) and the arguments the client builds for them.

use std::sync::LazyLock;

use idemkit_core::record::Holder;
use idemkit_core::{Ownership, ResultKind, StoreError};
use redis::{Cmd, RedisWrite, Script, ToRedisArgs, Value};

use crate::conn::Conn;
use crate::errors::map_err;
use crate::plain;
use crate::resp::Arg;

/// One of our Lua scripts: its SHA for `EVALSHA`, and its source for `SCRIPT LOAD` when the
/// server does not know it (after a restart).
pub(crate) struct Lua {
    pub(crate) script: Script,
    pub(crate) source: String,
}

impl Lua {
    fn new(source: &str) -> Self {
        Lua {
            script: Script::new(source),
            source: source.to_owned(),
        }
    }

    /// The Cluster variant of a script that wakes waiters: sharded pub/sub (`SPUBLISH`),
    /// whose channel lives in the key's slot. Scripts name the command literally rather
    /// than taking it as an argument: every argument costs Redis time.
    fn sharded(source: &str) -> Self {
        assert!(source.contains("'PUBLISH'"), "a script that publishes");
        Lua::new(&source.replace("'PUBLISH'", "'SPUBLISH'"))
    }

    /// The durability guard's variant of `begin.lua`: a completed record it returns has its
    /// expiry written again, unchanged (`PEXPIREAT` of its own `PEXPIRETIME`). That is a
    /// write Redis replicates after the record's own, so the `WAIT` the guard sends after
    /// the script counts replicas that have the record: a replay is confirmed durable as a
    /// completion is, or reported unconfirmed (ARCHITECTURE row 43).
    fn guarded(source: &str) -> Self {
        const REPLAY: &str = "    if state == 2 then\n      return v\n";
        assert!(source.contains(REPLAY), "begin.lua's replay");
        Lua::new(&source.replacen(
            REPLAY,
            "    if state == 2 then\n      local at = redis.call('PEXPIRETIME', key)\n      \
             if at > 0 then redis.call('PEXPIREAT', key, at) end\n      return v\n",
            1,
        ))
    }
}

macro_rules! lua {
    ($file:literal) => {
        LazyLock::new(|| Lua::new(include_str!($file)))
    };
    (sharded $file:literal) => {
        LazyLock::new(|| Lua::sharded(include_str!($file)))
    };
    (guarded $file:literal) => {
        LazyLock::new(|| Lua::guarded(include_str!($file)))
    };
}

pub(crate) static BEGIN: LazyLock<Lua> = lua!("../lua/begin.lua");
pub(crate) static BEGIN_GUARDED: LazyLock<Lua> = lua!(guarded "../lua/begin.lua");
pub(crate) static BEGIN_MANY: LazyLock<Lua> = lua!("../lua/begin_many.lua");
pub(crate) static RESTAMP_MANY: LazyLock<Lua> = lua!("../lua/restamp_many.lua");
pub(crate) static RENEW: LazyLock<Lua> = lua!("../lua/renew.lua");
pub(crate) static COMPLETE: LazyLock<Lua> = lua!("../lua/complete.lua");
pub(crate) static COMPLETE_SHARDED: LazyLock<Lua> = lua!(sharded "../lua/complete.lua");
pub(crate) static RELEASE: LazyLock<Lua> = lua!("../lua/release.lua");
pub(crate) static RELEASE_SHARDED: LazyLock<Lua> = lua!(sharded "../lua/release.lua");
pub(crate) static WATCH: LazyLock<Lua> = lua!("../lua/watch.lua");
pub(crate) static COMPLETE_MANY: LazyLock<Lua> = lua!("../lua/complete_many.lua");
pub(crate) static PEEK: LazyLock<Lua> = lua!("../lua/peek.lua");
pub(crate) static REMOVE: LazyLock<Lua> = lua!("../lua/remove.lua");
pub(crate) static REMOVE_SHARDED: LazyLock<Lua> = lua!(sharded "../lua/remove.lua");

/// What the client knows of a reservation's bytes before Redis picks its fencing token (see
/// `lua/begin.lua` for the format): everything else. The arguments below are written from it
/// straight into the command, without a buffer of their own.
#[derive(Clone, Copy)]
pub(crate) struct Parts<'a> {
    pub(crate) owner: u128,
    pub(crate) fingerprint: Option<&'a [u8; 16]>,
    /// The holder block's process and the lease it records (version 2), or `None` (version 1).
    pub(crate) holder: Option<(&'a Holder, u64)>,
}

impl Parts<'_> {
    /// Bytes 1-22: "IDK", version, `state`, flags, owner token.
    pub(crate) fn head(&self, state: u8) -> [u8; 22] {
        let mut head = [0u8; 22];
        head[..3].copy_from_slice(b"IDK");
        head[3] = if self.holder.is_some() { 2 } else { 1 };
        head[4] = state;
        head[5] = u8::from(self.fingerprint.is_some());
        head[6..].copy_from_slice(&self.owner.to_be_bytes());
        head
    }

    /// Bytes 1-30 (with `state`) then from 31 on, assembled on the stack and written at once
    /// (each write into a command's buffer has a cost of its own, and this is on every call).
    fn write_all(&self, state: u8, fencing: u64, w: &mut impl std::io::Write) {
        let (buf, len) = self.record(state, fencing);
        let _ = w.write_all(&buf[..len]);
    }

    /// The whole reservation (or, with state 2, the completed record's head), `buf[..len]`.
    pub(crate) fn record(&self, state: u8, fencing: u64) -> ([u8; 256], usize) {
        let (mut buf, len) = self.rest();
        // The rest sits at 30 in `buf`, the head and fencing token go before it.
        buf[..22].copy_from_slice(&self.head(state));
        buf[22..30].copy_from_slice(&fencing.to_be_bytes());
        (buf, len)
    }

    /// `buf[30..len]` holds bytes from 31 on (`buf[..30]` is left for the head and fencing
    /// token). At most 30 + 16 + 16 + 8 + 4 + 2 * (1 + 64) bytes: a holder's texts are at
    /// most 64 bytes each (`Holder`'s cleaning).
    pub(crate) fn rest(&self) -> ([u8; 256], usize) {
        let mut buf = [0u8; 256];
        // Created and expires: 16 zero bytes, already there.
        let mut at = 46;
        let mut put = |bytes: &[u8]| {
            buf[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        if let Some(f) = self.fingerprint {
            put(f);
        }
        if let Some((h, lease_ms)) = self.holder {
            put(&lease_ms.to_be_bytes());
            put(&h.pid.to_be_bytes());
            for text in [&h.host, &h.name] {
                // `Holder` keeps each text within 64 bytes; a longer one is cut here
                // rather than overflow (the record would then not match: the script
                // completes from what Redis holds).
                let t = &text.as_bytes()[..text.len().min(Holder::MAX_TEXT)];
                put(&[t.len() as u8]);
                put(t);
            }
        }
        (buf, at)
    }

    /// Whether two reservations have the same bytes from 31 on (a batch sends them once).
    pub(crate) fn same_rest(&self, other: &Parts<'_>) -> bool {
        self.fingerprint == other.fingerprint
            && match (self.holder, other.holder) {
                (None, None) => true,
                (Some((a, la)), Some((b, lb))) => la == lb && (std::ptr::eq(a, b) || a == b),
                _ => false,
            }
    }
}

/// `begin.lua`'s reservation head: bytes 1-22 of the new reservation.
pub(crate) struct Head<'a>(pub(crate) &'a Parts<'a>);

impl ToRedisArgs for Head<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg(&self.0.head(1));
    }
}

/// `begin.lua`'s reservation rest: the new reservation's bytes from 31 on.
pub(crate) struct Rest<'a>(pub(crate) &'a Parts<'a>);

impl ToRedisArgs for Rest<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let (buf, len) = self.0.rest();
        out.write_arg(&buf[30..len]);
    }
}

/// `complete.lua`'s reservation: the caller's reservation, every byte (owner and fencing
/// tokens at 7-30 always; the rest as far as the caller said what it reserved with).
pub(crate) struct Mine<'a>(pub(crate) &'a Parts<'a>, pub(crate) u64);

impl ToRedisArgs for Mine<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.0.write_all(1, self.1, &mut out.writer_for_next_arg());
    }
}

/// `complete.lua`'s completed record: [`Mine`] with state 2, then the outcome (kind, length,
/// bytes).
pub(crate) struct Done<'a> {
    pub(crate) parts: &'a Parts<'a>,
    pub(crate) fencing: u64,
    pub(crate) kind: ResultKind,
    pub(crate) bytes: &'a [u8],
}

impl ToRedisArgs for Done<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        let mut w = out.writer_for_next_arg();
        self.parts.write_all(2, self.fencing, &mut w);
        // The record format's length field is 32 bits; `complete` refuses larger results
        // before building the command.
        let len = u32::try_from(self.bytes.len()).unwrap_or(u32::MAX);
        let _ = w.write_all(&[self.kind.to_byte()]);
        let _ = w.write_all(&len.to_be_bytes());
        let _ = w.write_all(self.bytes);
    }
}

/// The owner-checked scripts' first argument: owner token and fencing token, exactly the
/// record's bytes 7-30, so one comparison checks both.
pub(crate) struct LeaseArg<'a>(pub(crate) &'a Ownership);

impl ToRedisArgs for LeaseArg<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = [0u8; 24];
        arg[..16].copy_from_slice(&self.0.owner.as_u128().to_be_bytes());
        arg[16..].copy_from_slice(&self.0.fencing.get().to_be_bytes());
        out.write_arg(&arg);
    }
}

/// Clears the Redis-only "watched" flag of a reservation (see `lua/begin.lua`) so that the
/// bytes are exactly idemkit's record format.
pub(crate) fn clear_watched(bytes: &mut [u8]) {
    if bytes.len() > 5 && (bytes.starts_with(b"IDK\x01\x01") || bytes.starts_with(b"IDK\x02\x01")) {
        bytes[5] &= 1;
    }
}

/// `begin_many.lua`'s arguments after its keys: the lease, then the reservations' parts,
/// their shared rest sent once when every key has the same (see the script).
pub(crate) fn begin_many_args(cmd: &mut redis::Cmd, lease_ms: u64, parts: &[Parts<'_>]) {
    cmd.arg(lease_ms);
    let shared = parts.windows(2).all(|w| w[0].same_rest(&w[1]));
    match parts.first() {
        Some(first) if shared => {
            cmd.arg(Rest(first));
            for p in parts {
                cmd.arg(Head(p));
            }
        }
        _ => {
            cmd.arg("");
            for p in parts {
                cmd.arg(Head(p)).arg(Rest(p));
            }
        }
    }
}

/// `EVALSHA` of `lua` on `rkey` with `args`: one round trip. After a server restart
/// (`NOSCRIPT`) the script is loaded and the call sent again. Built as one command rather
/// than through `Script::invoke_async`, which copies every argument twice.
pub(crate) async fn eval_on<T: redis::FromRedisValue>(
    conn: &mut Conn,
    lua: &Lua,
    rkey: &str,
    args: impl FnOnce(&mut Cmd),
) -> Result<T, StoreError> {
    // Sized for the largest call (complete: the key, three arguments, one of them the
    // result), so the argument buffer is rarely grown while writing.
    let mut cmd = Cmd::with_capacity(10, 128 + 2 * rkey.len());
    cmd.arg("EVALSHA")
        .arg(lua.script.get_hash())
        .arg(1)
        .arg(rkey);
    args(&mut cmd);
    query_loading(conn, &cmd, lua).await
}

/// `EVALSHA` of `lua` on `rkey` with `args`, as [`eval_on`] does, but sent as an argument
/// list (`crate::resp`): written straight into the store's own client's buffer, no `Cmd`.
/// For the scripts of a first delivery: a lone `begin`, a completion.
pub(crate) async fn eval_args(
    conn: &mut Conn,
    lua: &Lua,
    rkey: &str,
    args: &[Arg<'_>],
) -> Result<Value, StoreError> {
    let head = [
        Arg::Bytes(b"EVALSHA"),
        Arg::from(lua.script.get_hash()),
        Arg::Bytes(b"1"),
        Arg::from(rkey),
    ];
    match crate::resp::query(conn, &[&head, args]).await {
        Err(e) if is_noscript(&e) => {
            load(conn, lua).await?;
            crate::resp::query(conn, &[&head, args])
                .await
                .map_err(map_err)
        }
        other => other.map_err(map_err),
    }
}

/// A whole `EVALSHA` of `lua` as an argument list (`crate::resp`), its keys counted in it;
/// after a server restart (`NOSCRIPT`) the script is loaded and the call sent again.
pub(crate) async fn eval_list(
    conn: &mut Conn,
    lua: &Lua,
    args: &[Arg<'_>],
) -> Result<Value, StoreError> {
    match crate::resp::query(conn, &[args]).await {
        Err(e) if is_noscript(&e) => {
            load(conn, lua).await?;
            crate::resp::query(conn, &[args]).await.map_err(map_err)
        }
        other => other.map_err(map_err),
    }
}

fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Loads `lua` into a server whose script cache lacks it (`NOSCRIPT`: a restart, or another
/// server after a failover).
async fn load(conn: &mut Conn, lua: &Lua) -> Result<(), StoreError> {
    tracing::debug!("script not in the server's cache (restarted?): loading it");
    // Perhaps another server (a failover): ask again what it has.
    plain::reloaded();
    // On a Cluster redis-rs sends SCRIPT LOAD to every primary.
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(&lua.source)
        .query_async::<String>(conn)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// Sends `cmd`, an `EVALSHA` of `lua`; after a server restart (`NOSCRIPT`) loads the script
/// and sends it again.
pub(crate) async fn query_loading<T: redis::FromRedisValue>(
    conn: &mut Conn,
    cmd: &Cmd,
    lua: &Lua,
) -> Result<T, StoreError> {
    match cmd.query_async(conn).await {
        Err(e) if is_noscript(&e) => {
            load(conn, lua).await?;
            cmd.query_async(conn).await.map_err(map_err)
        }
        other => other.map_err(map_err),
    }
}
