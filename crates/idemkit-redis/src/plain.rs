//! Plain commands where the server has them: a completion as one `SET key record IFEQ
//! reservation PX ttl` instead of `complete.lua`.
//!
//! A completion whose reservation is, byte for byte, the one its caller wrote (the
//! coordinator says what it reserved with: `CompleteRequest::reservation`) needs no script:
//! the comparison is the owner check and the fencing check at once (bytes 7-30 are the
//! owner and fencing tokens), and nobody waits on the key (a waiter's flag would change the
//! bytes), so nobody needs waking. A server with a conditional `SET` does that in one
//! command, which costs it a fraction of a script call (docs/benchmarks.md). Everything
//! else (a waiter's flag, a retried completion, a lost lease, a record of another version)
//! fails the comparison, writes nothing, and goes to `complete.lua` as before: one round
//! trip more, off the path of a first delivery.
//!
//! Which servers: `SET … IFEQ` is in Valkey since 8.1 and in Redis since 8.4. The store asks
//! the server, not its version string: at connect, and again after any script call found
//! the server's script cache empty (`NOSCRIPT`: a restart, or a failover to another
//! server), it sends `SET` with `IFEQ` for a key that does not exist (which writes nothing
//! on a server that has it, and is a syntax error on one that does not). A plain `SET`
//! refused as a syntax error (a failover to an older server) turns the plain path off and
//! goes to the script.
//!
//! Renewals and releases stay scripts: `Store::renew` and `Store::release` are given the
//! lease (owner and fencing tokens), not the reservation's bytes a comparison needs, and
//! they are off the path of a first delivery (a renewal every third of a lease of a long
//! action, a release after a failed one). A batch's `begin`s are plain commands too, on one
//! server (`stamp`): `SET … NX` between two `TIME`s that prove the fencing token the client
//! stamped; the script answers what that does not (a tombstone, a reservation, a stamp not
//! proven).

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use idemkit_core::{ResultKind, StoreError};
use redis::{Cmd, Value};

use crate::conn::Conn;
use crate::errors::map_err;
use crate::resp::Arg;
use crate::scripts::Parts;

/// How many times a script call of this process found a server's script cache empty
/// (`NOSCRIPT`): each one may be another server behind a connection, so the next plain
/// completion asks again. One counter for every store of the process: a reload elsewhere
/// costs a store one probe, no more.
static RELOADS: AtomicUsize = AtomicUsize::new(0);

/// A script call found the server's script cache empty (see [`RELOADS`]).
pub(crate) fn reloaded() {
    RELOADS.fetch_add(1, Ordering::Relaxed);
}

const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

/// Whether the server behind a store's connections has `SET … IFEQ`, and as of which
/// [`RELOADS`] count that was asked. Shared by the stores on the same connections.
#[derive(Debug, Default)]
pub(crate) struct Caps {
    ifeq: AtomicU8,
    asked_at: AtomicUsize,
}

impl Caps {
    /// Whether a completion may be sent as a plain `SET … IFEQ` on `conn`: the answer known,
    /// or asked now (one round trip, at connect and after a reload).
    pub(crate) async fn ifeq(&self, conn: &mut Conn, prefix: &str) -> Result<bool, StoreError> {
        let reloads = RELOADS.load(Ordering::Relaxed);
        let known = self.ifeq.load(Ordering::Relaxed);
        if known != UNKNOWN && self.asked_at.load(Ordering::Relaxed) == reloads {
            return Ok(known == YES);
        }
        match probe(conn, prefix).await? {
            Some(has) => {
                self.ifeq
                    .store(if has { YES } else { NO }, Ordering::Relaxed);
                self.asked_at.store(reloads, Ordering::Relaxed);
                Ok(has)
            }
            // No answer (a read-only replica refuses every write, `READONLY`): the script
            // this time, and the question again next time.
            None => Ok(false),
        }
    }

    /// A plain `SET … IFEQ` was refused: the server has none (any more).
    fn refused(&self) {
        self.ifeq.store(NO, Ordering::Relaxed);
    }

    /// What the last probe found, for tests and diagnostics: `None` before the first.
    pub(crate) fn known(&self) -> Option<bool> {
        match self.ifeq.load(Ordering::Relaxed) {
            UNKNOWN => None,
            v => Some(v == YES),
        }
    }
}

/// Asks the server whether it has `SET … IFEQ`: a conditional `SET` of a key that does not
/// exist writes nothing where the option exists, and is a syntax error where it does not.
/// The key has the shape of the store's own (`{prefix}:{<hash tag>}:…`), so an ACL user
/// limited to the store's keys may send it; one refused anyway (`NOPERM`: a user allowed
/// only some commands or keys) is a "no", kept like any answer, so completions go to the
/// script the user may run rather than ask again each time. `None`: refused for a passing
/// reason (`READONLY` on a replica, `OOM`), no answer.
async fn probe(conn: &mut Conn, prefix: &str) -> Result<Option<bool>, StoreError> {
    let reply = Cmd::new()
        .arg("SET")
        .arg(probe_key(prefix))
        .arg("")
        .arg("IFEQ")
        .arg(&idemkit_core::OwnerToken::random().as_u128().to_be_bytes()[..])
        .query_async::<Value>(conn)
        .await;
    match reply {
        Ok(_) => Ok(Some(true)),
        Err(e) if is_refusal(&e) || e.code() == Some("NOPERM") => Ok(Some(false)),
        Err(e) if e.code().is_some() => Ok(None),
        Err(e) => Err(map_err(e)),
    }
}

/// The probe's key: a record key of the store's shape, for the storage key of an operation
/// named `idemkit.probe`. Were a record there, the probe would leave it as it is: the
/// comparison with a random owner token fails and nothing is written.
fn probe_key(prefix: &str) -> String {
    use idemkit_core::{Key, Operation, StorageKey};
    let op = Operation::new("idemkit.probe").expect("a valid operation name");
    let key = Key::new("ifeq").expect("a valid key");
    crate::keys::key_for(prefix, &StorageKey::new(&op, None, &key))
}

/// A server's refusal of the command itself, `ERR syntax error` (not of its key, nor its
/// connection's failure).
fn is_refusal(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.starts_with("syntax error"))
}

/// One completion's plain command: `SET key record IFEQ reservation PX ttl`.
fn command<'a>(rkey: &'a str, parts: &'a Parts<'a>, done: &'a Completion<'a>) -> [Arg<'a>; 7] {
    [
        Arg::Bytes(b"SET"),
        Arg::from(rkey),
        Arg::Done(parts, done.fencing, done.kind, done.bytes),
        Arg::Bytes(b"IFEQ"),
        Arg::Mine(parts, done.fencing),
        Arg::Bytes(b"PX"),
        Arg::Int(done.ttl_ms),
    ]
}

/// What a completion writes, besides its reservation's parts.
pub(crate) struct Completion<'a> {
    pub(crate) fencing: u64,
    pub(crate) kind: ResultKind,
    pub(crate) bytes: &'a [u8],
    pub(crate) ttl_ms: u64,
}

/// Sends one completion as a plain command. `Ok(true)`: completed. `Ok(false)`: the record
/// is not byte for byte the caller's reservation, or the server refused the command (then
/// `caps` is told): nothing was written, the script decides.
pub(crate) async fn complete(
    caps: &Caps,
    conn: &mut Conn,
    rkey: &str,
    parts: &Parts<'_>,
    done: &Completion<'_>,
) -> Result<bool, StoreError> {
    match crate::resp::query(conn, &[&command(rkey, parts, done)]).await {
        Ok(reply) => Ok(written(&reply)),
        Err(e) if is_refusal(&e) => {
            caps.refused();
            Ok(false)
        }
        Err(e) => Err(map_err(e)),
    }
}

/// A batch of completions as one pipeline of plain commands: for each, whether it was
/// written (`false`: the script decides, as in [`complete`]), or the pipeline's error.
pub(crate) async fn complete_all<'a>(
    caps: &Caps,
    conn: &mut Conn,
    items: impl Iterator<Item = (&'a str, Parts<'a>, Completion<'a>)>,
) -> Result<Vec<bool>, StoreError> {
    // The items first (the commands borrow their parts), then each one's command, written
    // where it is sent (`resp`).
    let items: Vec<(&str, Parts<'_>, Completion<'_>)> = items.collect();
    let commands: Vec<[Arg<'_>; 7]> = items
        .iter()
        .map(|(rkey, parts, done)| command(rkey, parts, done))
        .collect();
    let n = commands.len();
    let all: Vec<&[Arg<'_>]> = commands.iter().map(|c| &c[..]).collect();
    let replies = crate::resp::query_all(conn, &all).await.map_err(map_err)?;
    if replies.len() != n {
        return Err(crate::errors::unexpected(None));
    }
    Ok(replies
        .iter()
        .map(|reply| {
            if let Value::ServerError(e) = reply
                && e.code() == "ERR"
                && e.details().is_some_and(|d| d.starts_with("syntax error"))
            {
                caps.refused();
            }
            written(reply)
        })
        .collect())
}

/// `OK`: written; nil (the comparison failed) or an error: not.
fn written(reply: &Value) -> bool {
    matches!(reply, Value::Okay)
}
