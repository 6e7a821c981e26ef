//! The Lua scripts (`lua/*.lua`, one per phase) and the arguments the client builds for them.

use std::sync::LazyLock;

use idemkit_core::record::Holder;
use idemkit_core::{CompleteRequest, Ownership};
use redis::{RedisWrite, Script, ToRedisArgs};

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
}

macro_rules! lua {
    ($file:literal) => {
        LazyLock::new(|| Lua::new(include_str!($file)))
    };
    (sharded $file:literal) => {
        LazyLock::new(|| Lua::sharded(include_str!($file)))
    };
}

pub(crate) static BEGIN: LazyLock<Lua> = lua!("../lua/begin.lua");
pub(crate) static BEGIN_MANY: LazyLock<Lua> = lua!("../lua/begin_many.lua");
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

/// `begin.lua`'s first argument: the new record's flags byte and owner token, built here so
/// the script copies them in one piece.
pub(crate) struct OwnerWithFlags {
    pub(crate) owner: u128,
    pub(crate) fingerprint: bool,
}

impl ToRedisArgs for OwnerWithFlags {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = [0u8; 17];
        arg[0] = u8::from(self.fingerprint);
        arg[1..].copy_from_slice(&self.owner.to_be_bytes());
        out.write_arg(&arg);
    }
}

/// `begin.lua`'s holder argument: the record's version-2 holder block (the reserving
/// process and the lease), written straight into the command; empty without a holder
/// (version 1).
pub(crate) struct HolderArg<'a>(pub(crate) Option<&'a Holder>, pub(crate) u64);

impl ToRedisArgs for HolderArg<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        let mut w = out.writer_for_next_arg();
        if let Some(h) = self.0 {
            // Writing into the command's own buffer cannot fail; texts are under 256 bytes.
            let _ = w.write_all(&self.1.to_be_bytes());
            let _ = w.write_all(&h.pid.to_be_bytes());
            for text in [&h.host, &h.name] {
                let _ = w.write_all(&[text.len() as u8]);
                let _ = w.write_all(text.as_bytes());
            }
        }
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

/// `complete.lua`'s outcome argument: the completed record's tail (kind, length, bytes),
/// written straight into the command without an intermediate buffer.
pub(crate) struct RecordTail<'a>(pub(crate) &'a CompleteRequest);

impl ToRedisArgs for RecordTail<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        use std::io::Write as _;
        let CompleteRequest { kind, bytes, .. } = self.0;
        // The record format's length field is 32 bits; `complete` refuses larger results
        // before building the command.
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        let mut w = out.writer_for_next_arg();
        // Writing into the command's own buffer cannot fail.
        let _ = w.write_all(&[kind.to_byte()]);
        let _ = w.write_all(&len.to_be_bytes());
        let _ = w.write_all(bytes);
    }
}

/// Clears the Redis-only "watched" flag of a reservation (see `lua/begin.lua`) so that the
/// bytes are exactly idemkit's record format.
pub(crate) fn clear_watched(bytes: &mut [u8]) {
    if bytes.len() > 5 && (bytes.starts_with(b"IDK\x01\x01") || bytes.starts_with(b"IDK\x02\x01")) {
        bytes[5] &= 1;
    }
}
