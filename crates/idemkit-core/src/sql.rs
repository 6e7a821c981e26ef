//! The record as the SQL stores keep it: a row of columns (`idemkit-postgres`,
//! `idemkit-mysql`). Not part of the public API: a shared piece of those crates, hidden from
//! the docs, that may change with them.
//!
//! A row has `version` (1), `state` (1 reserved, 2 completed), `owner` (16 bytes),
//! `fencing` (positive), `fingerprint` (16 bytes or none), `kind` and `result` (completed);
//! the times and the holder are each store's own. A row that no writer of this version
//! produces is `Corrupt`, with what is wrong and where.

use std::time::Duration;

use bytes::Bytes;

use crate::fingerprint::Fingerprint;
use crate::ident::StorageKey;
use crate::record::{FencingToken, OwnerToken, Record, RecordState, ResultKind, StoredResult};
use crate::store::{BeginRequest, Claim, Ownership, Replay, StoreError};

/// A row's record columns, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    pub version: i16,
    pub state: i16,
    pub owner: Option<Vec<u8>>,
    pub fencing: i64,
    pub fingerprint: Option<Vec<u8>>,
    pub kind: Option<i16>,
    pub result: Option<Vec<u8>>,
}

/// A row in one of our states, checked field by field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    Reserved {
        owner: OwnerToken,
        fencing: FencingToken,
        fingerprint: Option<Fingerprint>,
    },
    Completed {
        owner: OwnerToken,
        fencing: FencingToken,
        fingerprint: Option<Fingerprint>,
        result: StoredResult,
    },
}

/// The columns a `put_raw` writes for `bytes`: a record's fields when they decode as one, or
/// a version-0 row holding the bytes in `result` (read back as `Corrupt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub columns: Columns,
    /// The record's holder block, if it has a holder.
    pub holder: Option<Vec<u8>>,
    /// The decoded record's fencing token (raises the store's high-water mark), if it decoded.
    pub fencing: Option<FencingToken>,
}

impl Columns {
    /// Checks every field.
    pub fn check(self, key: &StorageKey) -> Result<Checked, StoreError> {
        let bad = |what: &str| {
            StoreError::corrupt(format!(
                "the row under {:?} is not a record this version reads: {what}",
                key.as_str()
            ))
        };
        if self.version != 1 {
            return Err(bad(&format!("row version {}", self.version)));
        }
        let owner = self
            .owner
            .as_deref()
            .and_then(|o| <[u8; 16]>::try_from(o).ok())
            .map(|o| OwnerToken::from_u128(u128::from_be_bytes(o)))
            .ok_or_else(|| bad("owner is not 16 bytes"))?;
        let fencing = u64::try_from(self.fencing)
            .ok()
            .filter(|&f| f > 0)
            .map(FencingToken::new)
            .ok_or_else(|| bad("fencing token is not positive"))?;
        let fingerprint = match self.fingerprint.as_deref() {
            None => None,
            Some(f) => Some(Fingerprint::from_bytes(
                <[u8; 16]>::try_from(f).map_err(|_| bad("fingerprint is not 16 bytes"))?,
            )),
        };
        match self.state {
            1 => Ok(Checked::Reserved {
                owner,
                fencing,
                fingerprint,
            }),
            2 => {
                let kind = self
                    .kind
                    .and_then(|k| u8::try_from(k).ok())
                    .and_then(ResultKind::from_byte)
                    .ok_or_else(|| bad("result kind"))?;
                let bytes = self
                    .result
                    .ok_or_else(|| bad("completed without a result"))?;
                Ok(Checked::Completed {
                    owner,
                    fencing,
                    fingerprint,
                    result: StoredResult::new(kind, Bytes::from(bytes)),
                })
            }
            s => Err(bad(&format!("state {s}"))),
        }
    }

    /// What `put_raw` writes for `bytes`.
    pub fn written(bytes: &[u8]) -> Written {
        match Record::decode(bytes) {
            Ok(r) => {
                let (state, kind, result) = match &r.state {
                    RecordState::Reserved => (1, None, None),
                    RecordState::Completed(o) => (
                        2,
                        Some(i16::from(o.kind().to_byte())),
                        Some(o.bytes().to_vec()),
                    ),
                };
                Written {
                    columns: Columns {
                        version: 1,
                        state,
                        owner: Some(r.owner.as_u128().to_be_bytes().to_vec()),
                        // A token beyond the column's range cannot match any row.
                        fencing: i64::try_from(r.fencing.get()).unwrap_or(-1),
                        fingerprint: r.fingerprint.map(|f| f.to_bytes().to_vec()),
                        kind,
                        result,
                    },
                    holder: r.holder.as_ref().map(|h| h.block(r.lease_ms.unwrap_or(0))),
                    fencing: Some(r.fencing),
                }
            }
            Err(_) => Written {
                columns: Columns {
                    version: 0,
                    state: 0,
                    owner: Some(vec![0; 16]),
                    fencing: 0,
                    fingerprint: None,
                    kind: None,
                    result: Some(bytes.to_vec()),
                },
                holder: None,
                fencing: None,
            },
        }
    }
}

impl Checked {
    /// The claim a `begin` that met this live row answers: a replay, a mismatch, the caller's
    /// own reservation (asked for twice), or another owner's in flight (`left` of its lease,
    /// `held` since it was reserved).
    pub fn claim(self, req: &BeginRequest<'_>, left: Duration, held: Duration) -> Claim {
        match self {
            Checked::Reserved { fingerprint, .. } | Checked::Completed { fingerprint, .. }
                if fingerprint != req.fingerprint =>
            {
                Claim::Mismatch
            }
            Checked::Completed {
                fencing, result, ..
            } => Claim::Replay(Replay::new(fencing, result)),
            Checked::Reserved { owner, fencing, .. } if owner == req.owner => Claim::Reserved {
                ownership: Ownership::new(owner, fencing),
                took_over: false,
            },
            Checked::Reserved { fencing, .. } => Claim::InFlight {
                retry_after: left,
                fencing,
                held_for: Some(held),
            },
        }
    }

    /// The record, with its times in Unix ms (a negative time reads as 0).
    pub fn into_record(self, created_at_ms: i64, expires_at_ms: i64) -> Record {
        let ms = |v: i64| u64::try_from(v).unwrap_or(0);
        let (state, owner, fencing, fingerprint) = match self {
            Checked::Reserved {
                owner,
                fencing,
                fingerprint,
            } => (RecordState::Reserved, owner, fencing, fingerprint),
            Checked::Completed {
                owner,
                fencing,
                fingerprint,
                result,
            } => (RecordState::Completed(result), owner, fencing, fingerprint),
        };
        Record {
            state,
            owner,
            fencing,
            fingerprint,
            created_at_ms: ms(created_at_ms),
            expires_at_ms: ms(expires_at_ms),
            holder: None,
            lease_ms: None,
        }
    }
}

/// Attaches a holder column's block to `record`; bytes that are not one holder block are
/// `Corrupt`.
pub fn with_holder(
    mut record: Record,
    block: Option<&[u8]>,
    key: &StorageKey,
) -> Result<Record, StoreError> {
    if let Some(block) = block {
        let (h, lease, rest) = crate::record::Holder::from_block(block)
            .ok()
            .filter(|(_, _, rest)| rest.is_empty())
            .ok_or_else(|| {
                StoreError::corrupt(format!(
                    "the row under {:?} has a holder column that is not a holder",
                    key.as_str()
                ))
            })?;
        let _ = rest;
        record.holder = Some(std::sync::Arc::new(h));
        record.lease_ms = Some(lease);
    }
    Ok(record)
}

/// The caller's connection in a transactional call, used in turn by the action and by the
/// completion written in the same transaction.
pub type Slot<'c, Conn> = std::sync::Mutex<Option<&'c mut Conn>>;

/// Takes the connection out of `slot` for one use.
pub fn take<'c, Conn>(slot: &Slot<'c, Conn>) -> &'c mut Conn {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
        .expect("the action and the completion use the connection in turn")
}

/// Puts the connection back after its use.
pub fn put<'c, Conn>(slot: &Slot<'c, Conn>, conn: &'c mut Conn) {
    *slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(conn);
}

/// Runs the user's action on the connection in `slot`, noting in `ran` that it ran (so a
/// failed call knows the transaction holds the action's writes).
pub async fn act<'c, Conn, T, E, F>(
    slot: &Slot<'c, Conn>,
    ran: &std::sync::atomic::AtomicBool,
    action: F,
    attempt: crate::coordinator::Attempt,
) -> Result<T, E>
where
    F: for<'t> FnOnce(
        &'t mut Conn,
        crate::coordinator::Attempt,
    ) -> crate::inbox::TxFuture<'t, Result<T, E>>,
{
    ran.store(true, std::sync::atomic::Ordering::SeqCst);
    let conn = take(slot);
    let result = action(&mut *conn, attempt).await;
    put(slot, conn);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> StorageKey {
        let op = crate::ident::Operation::new("sql").unwrap();
        StorageKey::new(&op, None, &crate::ident::Key::new("k").unwrap())
    }

    #[test]
    fn a_record_round_trips_through_its_columns_and_foreign_bytes_are_corrupt() {
        let record = Record {
            state: RecordState::Completed(StoredResult::new(ResultKind::Value, &b"v"[..])),
            owner: OwnerToken::from_u128(7),
            fencing: FencingToken::new(9),
            fingerprint: Some(Fingerprint::from_bytes([3; 16])),
            created_at_ms: 0,
            expires_at_ms: 0,
            holder: None,
            lease_ms: None,
        };
        let written = Columns::written(&record.encode());
        assert_eq!(written.fencing, Some(FencingToken::new(9)));
        let back = written.columns.check(&key()).unwrap().into_record(0, 0);
        assert_eq!(back, record);
        let foreign = Columns::written(b"not a record");
        assert_eq!(foreign.fencing, None);
        assert_eq!(
            foreign.columns.check(&key()).unwrap_err().kind(),
            crate::store::StoreErrorKind::Corrupt
        );
        let mut bad_owner = Columns::written(&record.encode()).columns;
        bad_owner.owner = Some(vec![1, 2, 3]);
        let e = bad_owner.check(&key()).unwrap_err();
        assert!(e.to_string().contains("owner is not 16 bytes"), "{e}");
    }
}
// Which `begin` statement to send first (PostgreSQL: read, insert or `begin`; MySQL: read or
// the upsert). `begin` answers every case in one statement, but
// pays for all of them (reading the row, the guarded upsert, a union of both answers): a
// first delivery or a replay costs the database more through it than through the plain
// insert or read that would answer it (the figures: docs/benchmarks.md). Most workloads are mostly one or the other: first
// deliveries (a queue's), or replays (retries of the same requests). So the store keeps a
// score of what recent `begin`s met and sends, for each call:
//
// - `begin_read` when most met a live row: a replay or an owner in flight answered by a
//   primary-key read; an absent or expired key then costs a second statement (`begin`);
// - `begin_insert` when most met no live row: a fresh reservation by a plain insert; a key
//   already there then costs a second statement;
// - `begin` itself in between, one statement whatever the key holds.
//
// A guess only chooses statements: every answer is what `begin` would give (the fast
// statements return its row shape, and anything they cannot decide goes to it).

/// The score is 64 times the share of recent `begin`s that met a live row, a moving
/// average over about the last eight: each answer keeps seven eighths of the score and adds
/// 8 if it met a live row.
const FULL: u8 = 64;
/// Read first from three quarters live, insert first up to a quarter.
const LIVE: u8 = 48;
const ABSENT: u8 = 16;

/// The score of recent `begin`s, shared by every clone of a store.
#[derive(Debug)]
pub struct Guesser {
    score: std::sync::atomic::AtomicU8,
}

impl Default for Guesser {
    fn default() -> Self {
        // No history: half, which is `begin` itself.
        Guesser {
            score: std::sync::atomic::AtomicU8::new(FULL / 2),
        }
    }
}

/// What the next `begin` will likely meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guess {
    /// A live row: read first.
    Live,
    /// No live row: insert first.
    Absent,
    /// Either: `begin`.
    Either,
}

impl Guesser {
    pub fn guess(&self) -> Guess {
        match self.score.load(std::sync::atomic::Ordering::Relaxed) {
            s if s >= LIVE => Guess::Live,
            s if s <= ABSENT => Guess::Absent,
            _ => Guess::Either,
        }
    }

    /// A `begin` answered: a reservation means the key had no live row.
    pub fn saw(&self, claim: &Claim) {
        // A plain load and store, not an atomic update: concurrent calls may lose each
        // other's steps, which only delays a switch; the score stays in range.
        let s = self.score.load(std::sync::atomic::Ordering::Relaxed);
        let live = !matches!(claim, Claim::Reserved { .. });
        let next = (s - s / 8 + if live { 8 } else { 0 }).min(FULL);
        if next != s {
            self.score.store(next, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod guess_tests {
    use super::{Guess, Guesser};
    use crate::record::{FencingToken, OwnerToken};
    use crate::store::{Claim, Ownership};

    fn reserved() -> Claim {
        Claim::Reserved {
            ownership: Ownership::new(OwnerToken::from_u128(1), FencingToken::new(1)),
            took_over: false,
        }
    }

    #[test]
    fn the_guess_follows_what_begins_meet() {
        let g = Guesser::default();
        assert_eq!(g.guess(), Guess::Either);
        let (live, absent) = (Claim::Mismatch, reserved());
        for _ in 0..32 {
            g.saw(&live);
        }
        assert_eq!(g.guess(), Guess::Live);
        for _ in 0..32 {
            g.saw(&absent);
        }
        assert_eq!(g.guess(), Guess::Absent);
        // Half and half, from either end, settles on `begin`: one statement for either.
        for start in [&live, &absent] {
            for _ in 0..32 {
                g.saw(start);
            }
            for i in 0..64 {
                g.saw(if i % 2 == 0 { &live } else { &absent });
            }
            assert_eq!(g.guess(), Guess::Either);
        }
        // Nine tenths replays: read first.
        for i in 0..100 {
            g.saw(if i % 10 == 0 { &absent } else { &live });
        }
        assert_eq!(g.guess(), Guess::Live);
    }
}
