//! The hot path's commands (a lone `begin`'s script, a completion, a replay's `GET`) as
//! argument lists that go two ways: written straight into the connection's buffer when the
//! lane is the store's own client (`wire`), or built as a redis-rs `Cmd` for the others.
//!
//! Why: on the store's own client a redis-rs `Cmd` cost a call more than the connection
//! itself: two buffers of its own (arguments and offsets), the packing of those into the
//! connection's buffer, and redis-rs' boxed request future (measured in docs/benchmarks.md,
//! "Commands without a `Cmd`"). Here an argument is written once, where it is sent, and
//! every length is known before its bytes (RESP needs it first).

use idemkit_core::ResultKind;
use redis::{Cmd, RedisResult, Value};

use crate::conn::Conn;
use crate::scripts::{Done, Head, Mine, Parts, Rest};

/// One argument of a command.
#[derive(Clone, Copy)]
pub(crate) enum Arg<'a> {
    Bytes(&'a [u8]),
    Int(u64),
    /// `begin.lua`'s reservation head (bytes 1-22, [`Head`]).
    Head(&'a Parts<'a>),
    /// `begin.lua`'s reservation rest (bytes from 31 on, [`Rest`]).
    Rest(&'a Parts<'a>),
    /// The caller's reservation, every byte ([`Mine`]).
    Mine(&'a Parts<'a>, u64),
    /// The completed record: the reservation with state 2, then the outcome ([`Done`]).
    Done(&'a Parts<'a>, u64, ResultKind, &'a [u8]),
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(s: &'a str) -> Self {
        Arg::Bytes(s.as_bytes())
    }
}

impl Arg<'_> {
    /// Adds the argument to a redis-rs command (the same bytes as [`Arg::write`]).
    fn to_cmd(self, cmd: &mut Cmd) {
        match self {
            Arg::Bytes(b) => cmd.arg(b),
            Arg::Int(n) => cmd.arg(n),
            Arg::Head(p) => cmd.arg(Head(p)),
            Arg::Rest(p) => cmd.arg(Rest(p)),
            Arg::Mine(p, fencing) => cmd.arg(Mine(p, fencing)),
            Arg::Done(parts, fencing, kind, bytes) => cmd.arg(Done {
                parts,
                fencing,
                kind,
                bytes,
            }),
        };
    }

    /// Writes the argument as a RESP bulk string: `$len`, the bytes, each line ended.
    fn write(self, out: &mut Vec<u8>) {
        match self {
            Arg::Bytes(b) => bulk(out, b),
            Arg::Int(n) => {
                let (digits, at) = decimal(n);
                bulk(out, &digits[at..]);
            }
            Arg::Head(p) => bulk(out, &p.head(1)),
            Arg::Rest(p) => {
                let (buf, len) = p.rest();
                bulk(out, &buf[30..len]);
            }
            Arg::Mine(p, fencing) => {
                let (buf, len) = p.record(1, fencing);
                bulk(out, &buf[..len]);
            }
            Arg::Done(p, fencing, kind, bytes) => {
                let (buf, len) = p.record(2, fencing);
                // The record format's length field is 32 bits; `complete` refuses larger
                // results before building the command.
                let n = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
                let total = len + 1 + 4 + bytes.len();
                out.reserve(total + 26);
                length(out, b'$', total);
                out.extend_from_slice(&buf[..len]);
                out.push(kind.to_byte());
                out.extend_from_slice(&n.to_be_bytes());
                out.extend_from_slice(bytes);
                out.extend_from_slice(b"\r\n");
            }
        }
    }
}

/// `$len\r\n`, the bytes, `\r\n`.
fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len() + 26);
    length(out, b'$', bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// A RESP length line: `kind`, the number, `\r\n`. Most lengths here have one to three
/// digits: written byte by byte, without a copy call (the client counted it, per
/// argument, in docs/benchmarks.md).
fn length(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.reserve(24);
    out.push(kind);
    if n < 10 {
        out.push(b'0' + n as u8);
    } else if n < 100 {
        out.push(b'0' + (n / 10) as u8);
        out.push(b'0' + (n % 10) as u8);
    } else if n < 1000 {
        out.push(b'0' + (n / 100) as u8);
        out.push(b'0' + (n / 10 % 10) as u8);
        out.push(b'0' + (n % 10) as u8);
    } else {
        let (digits, at) = decimal(n as u64);
        out.extend_from_slice(&digits[at..]);
    }
    out.push(b'\r');
    out.push(b'\n');
}

/// `n` in decimal: the digits are `buf[at..]`.
fn decimal(mut n: u64) -> ([u8; 20], usize) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return (buf, at);
        }
    }
}

/// Writes the command made of `parts`' arguments, one after the other, as RESP.
pub(crate) fn pack(out: &mut Vec<u8>, parts: &[&[Arg<'_>]]) {
    length(out, b'*', parts.iter().map(|p| p.len()).sum());
    for arg in parts.iter().flat_map(|p| p.iter()) {
        arg.write(out);
    }
}

/// The same command as a redis-rs `Cmd`.
fn cmd(parts: &[&[Arg<'_>]]) -> Cmd {
    let mut cmd = Cmd::new();
    for arg in parts.iter().flat_map(|p| p.iter()) {
        arg.to_cmd(&mut cmd);
    }
    cmd
}

/// Sends the command made of `parts`' arguments on `conn` and reads its reply (a server
/// error as an `Err`, as redis-rs' `query_async` does).
pub(crate) async fn query(conn: &mut Conn, parts: &[&[Arg<'_>]]) -> RedisResult<Value> {
    match conn {
        Conn::Own(wire) => wire.call(|out| pack(out, parts)).await,
        other => cmd(parts).query_async(other).await,
    }
}

/// Sends `commands` as one pipeline and reads their replies, each command's own error in
/// its place (as a redis-rs pipeline with `ignore_errors`).
pub(crate) async fn query_all(conn: &mut Conn, commands: &[&[Arg<'_>]]) -> RedisResult<Vec<Value>> {
    match conn {
        Conn::Own(wire) => {
            wire.call_many(commands.len(), |out| {
                for c in commands {
                    pack(out, &[c]);
                }
            })
            .await
        }
        other => {
            let mut pipe = redis::Pipeline::with_capacity(commands.len());
            pipe.ignore_errors();
            for c in commands {
                pipe.add_command(cmd(&[c]));
            }
            pipe.query_async(other).await
        }
    }
}

#[cfg(test)]
mod tests {
    use idemkit_core::record::Holder;

    use super::*;

    /// Every argument packs to exactly the bytes redis-rs packs it to, alone and in a
    /// command of several parts.
    #[test]
    fn arguments_pack_as_redis_rs_packs_them() {
        let holder = Holder::this_process();
        let fingerprint = [7u8; 16];
        let all = [
            Parts {
                owner: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
                fingerprint: None,
                holder: None,
            },
            Parts {
                owner: u128::MAX,
                fingerprint: Some(&fingerprint),
                holder: Some((&holder, 30_000)),
            },
        ];
        for p in &all {
            let args = [
                Arg::Bytes(b"EVALSHA"),
                Arg::from("key"),
                Arg::Int(0),
                Arg::Int(u64::MAX),
                Arg::Head(p),
                Arg::Rest(p),
                Arg::Mine(p, 42),
                Arg::Done(p, 42, ResultKind::Value, b"the result"),
                Arg::Done(p, 1, ResultKind::Value, &[]),
                Arg::Bytes(&[]),
            ];
            let (first, rest) = args.split_at(3);
            let mut ours = Vec::new();
            pack(&mut ours, &[first, rest]);
            let theirs = cmd(&[&args]).get_packed_command();
            assert_eq!(ours, theirs);
        }
    }
}
