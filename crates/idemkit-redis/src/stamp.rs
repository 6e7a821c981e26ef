//! Plain begins: a batch of first deliveries' `begin`s as one pipeline of plain commands,
//! `TIME` / `SET key reservation NX PX lease GET` (one per key) / `TIME`, instead of a
//! `begin` script (issue 51, ARCHITECTURE row R13).
//!
//! A script call costs Redis about twice the same writes as plain commands (the scripting
//! engine's entry, the reservation assembled in Lua: docs/benchmarks.md). The script exists
//! for the fencing token, which must exceed every token issued for the key before, also after
//! the key expired, so it is the server's clock read inside the atomic step. A plain `SET`
//! cannot put the server's clock into the bytes it writes, so the client **stamps** the
//! token: its estimate of the server's clock when the command runs. The two `TIME`s around
//! the `SET`s (one connection: Redis runs its commands in order) say what the clock was
//! before and after, and the stamp is kept only when it is proven greater than every earlier
//! token of the key:
//!
//! - the `SET … NX` wrote, so the key held nothing: every record it held before has expired
//!   (a release's and a purge's one-second tombstones too). Redis expires a key when its
//!   command clock, in milliseconds, is *past* the expiry, so a key written with `PX n` lives
//!   more than `n` ms after the command that wrote it started. The last record of an earlier
//!   token `T` was written with `PX` at least 1 ms (a completed record: the smallest TTL), by
//!   a command that started after the one that issued `T` ran (a completion follows its
//!   reservation's reply), or with the lease, at least 3 ms, by the command that issued `T`
//!   (a script reads `TIME` first; a plain `SET` runs after the `TIME` its stamp is at most).
//!   Every token is at most the clock when the command that wrote its reservation started.
//!   So the `SET` ran more than 1 ms past every earlier token of the key, and the `TIME`
//!   after it later still;
//! - the stamp is at most the `TIME` before (so at most the clock when its `SET` ran: the
//!   rule the next token's argument needs) and more than the `TIME` after less
//!   [`WINDOW_US`] (1 ms): greater than every earlier token.
//!
//! A stamp outside that window (the client's estimate off: a stall between stamping and the
//! server running the commands, another client's slow command between them, a server clock
//! that moved) leaves a reservation whose token is not proven, which nobody has been told of
//! yet: the same call takes the token again from the server's clock, in one script call
//! more for all the keys that shared the stamp (`restamp_many.lua`, which finds each
//! caller's reservation under the stamp and writes the clock in its place; `begin.lua` with
//! the stale stamp for a lone `begin`). Everything that is not a fresh key (a completed record: a
//! replay, answered from the `GET`; a live reservation, a tombstone, the caller's own
//! reservation, foreign bytes, a key of another type) wrote nothing and goes to the script,
//! which answers it as it always did.
//!
//! The estimate is the server's clock less the local clock (`Instant`), the lowest one a
//! reply allows (the server's `TIME` less the local time the reply arrived: the command ran
//! before that), raised by every reply, and lowered when a stamp came out ahead of the
//! server. It is learnt from the first reservation a script makes; until then every `begin`
//! is the script.
//!
//! Who sends them: coalesced batches and `begin_many` (which form under load, where the
//! server's time is the throughput), and every `begin` of a store without coalescing. A
//! `begin` that goes alone to an idle lane stays the script: the pipeline's three replies
//! cost the client more than the script's one (docs/benchmarks.md), and an idle server has
//! time to spare. One server only (single node, Sentinel), without the durability guard: a
//! Cluster keeps the script (its client routes a pipeline's commands by key, so the
//! `TIME`s could run on another node), and the guard's replay variant is a script of its
//! own.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use idemkit_core::StoreError;
use redis::Value;

use crate::conn::Conn;
use crate::errors::map_err;
use crate::replays;
use crate::resp::Arg;
use crate::scripts::{self, Parts};

/// How far under the server's clock a stamp may be and still be proven newer than every
/// earlier token of a fresh key: the shortest life of a record, a completed one's 1 ms
/// TTL, which a fresh key's `TIME` is past (see the module's docs).
pub(crate) const WINDOW_US: u64 = 1_000;

/// The offset's value before the first estimate.
const UNKNOWN: i64 = i64::MIN;

/// The local clock of the estimates: microseconds since the first use. The real monotonic
/// clock, not tokio's (which a test may pause): it is compared with the server's, which
/// never pauses.
#[allow(clippy::disallowed_methods)] // compared with the server's clock, not a deadline
static BASE: LazyLock<Instant> = LazyLock::new(Instant::now);

#[allow(clippy::disallowed_methods)] // as above
fn local_us() -> i64 {
    BASE.elapsed().as_micros() as i64
}

/// A store's estimate of its server's clock, and whether plain begins are on.
#[derive(Debug)]
pub(crate) struct Clock {
    /// The server's clock less the local one (µs), a lower bound; [`UNKNOWN`] before the
    /// first reply that carries the server's clock.
    offset: AtomicI64,
    /// Added to every stamp: tests move the estimate off the server's clock with it.
    skew: AtomicI64,
    /// Plain begins on: the builder's choice, off for good once the server refused `TIME`
    /// to the store's user (`NOPERM`).
    on: AtomicBool,
    /// Stamps found outside the window, for tests and diagnostics.
    stale: AtomicU64,
    /// Plain begins sent, for tests and diagnostics.
    sent: AtomicU64,
}

impl Clock {
    pub(crate) fn new(on: bool) -> Self {
        Clock {
            offset: AtomicI64::new(UNKNOWN),
            skew: AtomicI64::new(0),
            on: AtomicBool::new(on),
            stale: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }

    /// The token to stamp now, or `None`: plain begins off, or no estimate yet.
    fn stamp(&self) -> Option<u64> {
        if !self.on.load(Ordering::Relaxed) {
            return None;
        }
        let offset = self.offset.load(Ordering::Relaxed);
        if offset == UNKNOWN {
            return None;
        }
        let token = local_us()
            .saturating_add(offset)
            .saturating_add(self.skew.load(Ordering::Relaxed));
        u64::try_from(token).ok().filter(|t| *t > 0)
    }

    /// A reply said the server's clock was `server_us` when the command ran: the estimate
    /// rises to it if that is higher.
    pub(crate) fn learn(&self, server_us: u64) {
        let sample = (server_us as i64).saturating_sub(local_us());
        self.offset.fetch_max(sample, Ordering::Relaxed);
    }

    /// Whether `token`, stamped into a reservation a `SET … NX` wrote between the server's
    /// clock reading `before` and `after`, is proven newer than every earlier token of the
    /// key (see the module's docs). A stamp ahead of the server lowers the estimate to this
    /// reply's.
    fn judge(&self, token: u64, before: u64, after: u64) -> bool {
        if token > before {
            let sample = (before as i64).saturating_sub(local_us());
            self.offset.store(sample, Ordering::Relaxed);
        } else {
            self.learn(after);
        }
        token <= before && token + WINDOW_US > after
    }

    pub(crate) fn skew(&self, by_us: i64) {
        self.skew.store(by_us, Ordering::Relaxed);
    }

    /// Plain begins sent, and stamps found outside the window.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.stale.load(Ordering::Relaxed),
        )
    }
}

/// What a plain `begin` found for one key.
pub(crate) enum Found {
    /// The reply `begin.lua` would have given (`claim_of` reads it): a reservation's token,
    /// or a completed record.
    Answer(Value),
    /// Nothing answered: the script decides, with the stamp to take again if the key holds
    /// the caller's reservation under it (a stamp outside the window).
    Script { stale: Option<u64> },
}

/// One or more keys' plain begins (distinct keys, or a key again, which then finds the
/// reservation before it), as one pipeline: `None` when there is no estimate yet or plain
/// begins are off (the script then, for every key), else each key's [`Found`]. A `TIME` the
/// server refuses answers every key `Script` (the script's reply reports what is wrong); one
/// refused to the store's user (`NOPERM`) turns plain begins off.
pub(crate) async fn begin<'a>(
    clock: &Clock,
    conn: &mut Conn,
    items: impl ExactSizeIterator<Item = (&'a str, Parts<'a>, u64)>,
) -> Result<Option<Vec<Found>>, StoreError> {
    let Some(token) = clock.stamp() else {
        return Ok(None);
    };
    let n = items.len();
    // The keys' parts first (the commands borrow them), then each key's command: a few
    // buffers a batch, written where they are sent (`resp`).
    let items: Vec<(&str, Parts<'_>, u64)> = items.collect();
    let sets: Vec<[Arg<'_>; 7]> = items
        .iter()
        .map(|(rkey, parts, lease_ms)| {
            [
                Arg::Bytes(b"SET"),
                Arg::from(*rkey),
                Arg::Mine(parts, token),
                Arg::Bytes(b"NX"),
                Arg::Bytes(b"PX"),
                Arg::Int(*lease_ms),
                Arg::Bytes(b"GET"),
            ]
        })
        .collect();
    let time = [Arg::Bytes(b"TIME")];
    let mut commands: Vec<&[Arg<'_>]> = Vec::with_capacity(n + 2);
    commands.push(&time);
    commands.extend(sets.iter().map(|c| &c[..]));
    commands.push(&time);
    clock.sent.fetch_add(n as u64, Ordering::Relaxed);
    // A command's own error (`WRONGTYPE`: a key of another type) comes back in its place,
    // and the script reports it as it always did.
    let replies = crate::resp::query_all(conn, &commands)
        .await
        .map_err(map_err)?;
    let mut replies = replies.into_iter();
    let (first, last) = (replies.next(), replies.next_back());
    if let Some(Value::ServerError(e)) = first.as_ref().or(last.as_ref()) {
        if e.code() == "NOPERM" {
            tracing::info!(error = ?e, "the store's user may not send TIME: begins are scripts");
            clock.on.store(false, Ordering::Relaxed);
        }
        return Ok(Some(
            (0..n).map(|_| Found::Script { stale: None }).collect(),
        ));
    }
    let time = |v: Option<Value>| match v {
        Some(Value::Array(t)) => time_us(&t),
        _ => None,
    };
    let (Some(before), Some(after)) = (time(first), time(last)) else {
        return Err(crate::errors::unexpected(None));
    };
    if replies.len() != n {
        return Err(crate::errors::unexpected(None));
    }
    let proven = clock.judge(token, before, after);
    Ok(Some(
        replies
            .map(|reply| match reply {
                Value::Nil if proven => Found::Answer(Value::Int(token as i64)),
                Value::Nil => {
                    clock.stale.fetch_add(1, Ordering::Relaxed);
                    Found::Script { stale: Some(token) }
                }
                Value::BulkString(bytes) if replays::completed(&bytes) => {
                    Found::Answer(Value::BulkString(bytes))
                }
                _ => Found::Script { stale: None },
            })
            .collect(),
    ))
}

/// Takes the tokens of a batch's stale keys again from the server's clock: one
/// `restamp_many.lua` call for the keys that share `stale` (`rkeys` and `owners` side by
/// side). Each key's new token, or `None` for a key that no longer holds the caller's
/// reservation under the stamp (the caller sends it to the `begin` script).
pub(crate) async fn restamp(
    conn: &mut Conn,
    stale: u64,
    keys: impl ExactSizeIterator<Item = (&str, u128)> + Clone,
) -> Result<Vec<Option<u64>>, StoreError> {
    let n = keys.len();
    let mut cmd = redis::Cmd::with_capacity(3 + 2 * n, 64 * n);
    cmd.arg("EVALSHA")
        .arg(scripts::RESTAMP_MANY.script.get_hash())
        .arg(n);
    for (rkey, _) in keys.clone() {
        cmd.arg(rkey);
    }
    cmd.arg(&stale.to_be_bytes()[..]);
    for (_, owner) in keys {
        cmd.arg(&owner.to_be_bytes()[..]);
    }
    let tokens: Vec<i64> = scripts::query_loading(conn, &cmd, &scripts::RESTAMP_MANY).await?;
    if tokens.len() != n {
        return Err(crate::errors::unexpected(None));
    }
    Ok(tokens
        .into_iter()
        .map(|t| u64::try_from(t).ok().filter(|t| *t > 0))
        .collect())
}

/// `TIME`'s reply in microseconds.
fn time_us(t: &[Value]) -> Option<u64> {
    let num = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse::<u64>().ok(),
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    };
    match t {
        [s, us] => Some(num(s)?.checked_mul(1_000_000)? + num(us)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_is_kept_only_within_the_window_under_the_servers_clock() {
        let clock = Clock::new(true);
        assert!(clock.stamp().is_none(), "no estimate yet");
        clock.learn(10_000_000);
        let server = 10_000_000;
        assert!(clock.judge(server, server, server));
        // 1 ms: a completed record's shortest TTL (the module's argument), not the lease.
        assert!(clock.judge(server - 999, server, server));
        assert!(!clock.judge(server - 1_000, server, server), "too old");
        assert!(
            !clock.judge(server + 1, server, server),
            "ahead of the server"
        );
    }

    #[test]
    fn a_stamp_ahead_of_the_server_lowers_the_estimate() {
        let clock = Clock::new(true);
        clock.learn(50_000_000);
        let ahead = clock.stamp().expect("an estimate");
        // The server's clock turned out 10 ms behind that.
        assert!(!clock.judge(ahead, ahead - 10_000, ahead - 10_000));
        let next = clock.stamp().expect("an estimate");
        assert!(next < ahead, "the estimate came down: {next} >= {ahead}");
    }

    #[test]
    fn time_replies_are_read_in_microseconds() {
        let t = [
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"123456".to_vec()),
        ];
        assert_eq!(time_us(&t), Some(1_700_000_000_123_456));
        assert_eq!(time_us(&t[..1]), None);
    }
}
