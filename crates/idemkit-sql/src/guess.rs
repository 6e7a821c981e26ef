//! Which `begin` statement a SQL store sends first.

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

use idemkit_core::store::Claim;

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
    /// What the next `begin` will likely meet.
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
    use idemkit_core::record::{FencingToken, OwnerToken};
    use idemkit_core::store::{Claim, Ownership};

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
