//! Whether a `begin` reads the key with a plain `GET` first. The `begin` script answers every
//! case in one round trip, but a script costs Redis several times what a `GET` does (the
//! figures: docs/benchmarks.md). Replays come in runs (retries of the same requests, a
//! replayed Kafka batch), so the store keeps a score of what recent `begin`s met and, while
//! most of them met a completed record, sends a `GET` first. A completed record of ours is
//! then the answer (the script would return the same bytes unchanged); anything else (no
//! key, a reservation, a tombstone, bytes not ours) goes to the script, which answers it as
//! before: one round trip more, only after a run of replays.

use std::sync::atomic::{AtomicU8, Ordering};

/// The score is 64 times the share of recent `begin`s that a `GET` would have answered, a
/// moving average over about the last eight: each answer keeps seven eighths of the score
/// and adds 8 if it was one.
const FULL: u8 = 64;
/// Read first from three quarters.
const LIKELY: u8 = 48;

/// The score of recent `begin`s, shared by every clone of a store.
#[derive(Debug)]
pub(crate) struct Replays {
    score: AtomicU8,
}

impl Default for Replays {
    fn default() -> Self {
        // No history: the script, one round trip whatever the key holds.
        Replays {
            score: AtomicU8::new(FULL / 2),
        }
    }
}

impl Replays {
    /// Whether the next `begin` should send a `GET` first.
    pub(crate) fn likely(&self) -> bool {
        self.score.load(Ordering::Relaxed) >= LIKELY
    }

    /// A `begin` was answered by a completed record (`replayed`), or by something else.
    pub(crate) fn saw(&self, replayed: bool) {
        // A plain load and store, not an atomic update: concurrent calls may lose each
        // other's steps, which only delays a switch; the score stays in range.
        let s = self.score.load(Ordering::Relaxed);
        let next = (s - s / 8 + if replayed { 8 } else { 0 }).min(FULL);
        if next != s {
            self.score.store(next, Ordering::Relaxed);
        }
    }
}

/// Whether `bytes` (a `GET`'s reply) are a completed record of ours, version 1 or 2, by its
/// header (see `lua/begin.lua` for the format): the one reply of a `GET` that is also what
/// the script answers. Anything else is the script's to answer.
pub(crate) fn completed(bytes: &[u8]) -> bool {
    matches!(bytes, [b'I', b'D', b'K', 1 | 2, 2, ..] if bytes.len() >= 46)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_first_only_after_a_run_of_replays() {
        let r = Replays::default();
        assert!(!r.likely());
        for _ in 0..8 {
            r.saw(true);
        }
        assert!(r.likely());
        // One first delivery in a run of replays does not switch back; a run of them does.
        r.saw(false);
        assert!(r.likely());
        for _ in 0..4 {
            r.saw(false);
        }
        assert!(!r.likely());
        // Nine tenths replays: read first.
        for i in 0..100 {
            r.saw(i % 10 != 0);
        }
        assert!(r.likely());
        // Half and half: the script.
        for i in 0..100 {
            r.saw(i % 2 == 0);
        }
        assert!(!r.likely());
    }

    #[test]
    fn only_a_completed_record_of_ours_is_an_answer() {
        let mut record = b"IDK\x02\x02".to_vec();
        record.resize(46, 0);
        assert!(completed(&record));
        record[3] = 1;
        assert!(completed(&record));
        let mut reservation = record.clone();
        reservation[4] = 1;
        let mut future_version = record.clone();
        future_version[3] = 3;
        for other in [
            &reservation[..],
            &future_version[..],
            &record[..45],
            b"IDK\x01\x03tombstone",
            b"not a record",
            b"",
        ] {
            assert!(!completed(other), "{other:?}");
        }
    }
}
