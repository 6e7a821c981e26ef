//! What a worker process writes down, one line per event, and what the checker reads back.
//!
//! Each line is one `write` to a file opened for appending, so a worker killed with
//! `SIGKILL` loses nothing it wrote: the kernel has it. The checker never trusts a worker's
//! memory, only these lines, the ledger and the store.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Unix milliseconds: the one clock every process of a run shares.
#[allow(
    clippy::disallowed_methods,
    reason = "wall-clock time across processes, never paused"
)]
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One worker's event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// The effect (a ledger row) was written under `fencing`: the insert started at `start`
    /// and its commit was confirmed at `at`.
    Effect {
        job: u32,
        fencing: u64,
        start: u64,
        at: u64,
    },
    /// The effect's insert failed (it may still have committed: a cut connection loses the
    /// reply, not the row).
    EffectFailed { job: u32, at: u64 },
    /// The call returned a value: the job is acknowledged. `fencing` is the reservation that
    /// produced the value; `stored` is the receipt's promise that the store holds it.
    Done {
        job: u32,
        fencing: u64,
        fresh: bool,
        stored: bool,
        at: u64,
    },
    /// The call failed (`kind` is the error's kind): the job is not acknowledged and comes
    /// back.
    Failed { job: u32, kind: String, at: u64 },
}

impl Event {
    pub(crate) fn job(&self) -> u32 {
        match self {
            Event::Effect { job, .. }
            | Event::EffectFailed { job, .. }
            | Event::Done { job, .. }
            | Event::Failed { job, .. } => *job,
        }
    }

    fn line(&self) -> String {
        match self {
            Event::Effect {
                job,
                fencing,
                start,
                at,
            } => format!("E {job} {fencing} {start} {at}\n"),
            Event::EffectFailed { job, at } => format!("F {job} {at}\n"),
            Event::Done {
                job,
                fencing,
                fresh,
                stored,
                at,
            } => format!(
                "C {job} {fencing} {} {} {at}\n",
                *fresh as u8, *stored as u8
            ),
            Event::Failed { job, kind, at } => format!("X {job} {at} {kind}\n"),
        }
    }

    fn parse(line: &str) -> Option<Event> {
        let mut f = line.split(' ');
        let tag = f.next()?;
        let mut num = || f.next()?.parse::<u64>().ok();
        Some(match tag {
            "E" => Event::Effect {
                job: num()? as u32,
                fencing: num()?,
                start: num()?,
                at: num()?,
            },
            "F" => Event::EffectFailed {
                job: num()? as u32,
                at: num()?,
            },
            "C" => Event::Done {
                job: num()? as u32,
                fencing: num()?,
                fresh: num()? == 1,
                stored: num()? == 1,
                at: num()?,
            },
            "X" => {
                let job = num()? as u32;
                let at = num()?;
                let kind = f.collect::<Vec<_>>().join(" ");
                Event::Failed { job, kind, at }
            }
            _ => return None,
        })
    }
}

/// A worker's event log (one file per worker process).
#[derive(Debug)]
pub(crate) struct EventLog {
    file: File,
}

impl EventLog {
    pub(crate) fn create(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(EventLog { file })
    }

    /// Appends one event: one `write` call, so the line is whole or absent.
    pub(crate) fn write(&self, event: &Event) {
        // A log that cannot be written makes the run unverifiable: stop the worker loudly.
        (&self.file)
            .write_all(event.line().as_bytes())
            .expect("writing the event log");
    }
}

/// Every whole line of a worker's log (a torn last line, impossible with one `write` per
/// line but cheap to tolerate, is skipped).
pub(crate) fn read(path: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(Event::parse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_reads_back_as_written() {
        let events = [
            Event::Effect {
                job: 7,
                fencing: 42,
                start: 1,
                at: 2,
            },
            Event::EffectFailed { job: 7, at: 3 },
            Event::Done {
                job: 7,
                fencing: 42,
                fresh: true,
                stored: false,
                at: 4,
            },
            Event::Failed {
                job: 7,
                kind: "StoreUnavailable after 2 tries".into(),
                at: 5,
            },
        ];
        for e in events {
            assert_eq!(Event::parse(e.line().trim_end()), Some(e));
        }
        assert_eq!(Event::parse("Z 1 2"), None);
        assert_eq!(Event::parse("E 1 2"), None);
    }
}
