//! A shard of the [`MemoryStore`](super::MemoryStore): its table and its sweep.

use std::sync::Arc;

use hashbrown::HashTable;
use tokio::time::Instant;

use super::Entry;
use crate::ident::StorageKey;

/// A shard sweeps expired entries when it has grown to this many entries, and afterwards when
/// it has doubled since the last sweep. Sweeping is therefore amortised O(1) per insert, and a
/// shard never holds more than about twice the entries that were live at its last sweep.
pub(super) const MIN_SWEEP: usize = 1024;

#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) map: Table,
    /// Sweep expired entries when `map` reaches this size (see [`MIN_SWEEP`]).
    pub(super) sweep_at: usize,
}

/// One shard's entries, looked up with the hash the shard was chosen by: one hash per call.
/// Each entry keeps its hash, so growing or shrinking the table rehashes nothing (SipHash
/// over every key was a tenth of a miss's time while the map grew). The table holds the hash
/// and a box of the key and entry: growing it moves 16 bytes an entry instead of the whole
/// record, and its fresh memory is a tenth of the size (docs/benchmarks.md, "The MemoryStore
/// miss").
#[derive(Debug, Default)]
pub(super) struct Table {
    entries: HashTable<(u64, Box<Item>)>,
}

#[derive(Debug)]
struct Item {
    key: Arc<str>,
    entry: Entry,
}

impl Table {
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn get(&self, hash: u64, key: &str) -> Option<&Entry> {
        self.entries
            .find(hash, |(h, it)| *h == hash && *it.key == *key)
            .map(|(_, it)| &it.entry)
    }

    pub(super) fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        self.entries
            .find_mut(hash, |(h, it)| *h == hash && *it.key == *key)
            .map(|(_, it)| &mut it.entry)
    }

    /// Inserts or replaces; returns the replaced entry. The table keeps the storage key's
    /// shared text: no copy.
    pub(super) fn insert(&mut self, hash: u64, key: &StorageKey, entry: Entry) -> Option<Entry> {
        if let Some(old) = self.get_mut(hash, key.as_str()) {
            return Some(std::mem::replace(old, entry));
        }
        let item = Box::new(Item {
            key: key.shared().clone(),
            entry,
        });
        self.entries.insert_unique(hash, (hash, item), |(h, _)| *h);
        None
    }

    pub(super) fn remove(&mut self, hash: u64, key: &str) -> Option<Entry> {
        let found = self
            .entries
            .find_entry(hash, |(h, it)| *h == hash && *it.key == *key)
            .ok()?;
        Some(found.remove().0.1.entry)
    }

    /// Every key and its entry, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(_, it)| (&*it.key, &it.entry))
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        self.entries.retain(|(_, it)| keep(&it.entry));
    }

    /// Shrinks the table when under a quarter of its capacity is used.
    pub(super) fn shrink_if_sparse(&mut self) {
        if self.entries.len() < self.entries.capacity() / 4 {
            self.entries.shrink_to(self.entries.len() * 2, |(h, _)| *h);
        }
    }
}

impl Shard {
    pub(super) fn sweep_if_due(&mut self, now: Instant) {
        if self.map.len() >= self.sweep_at {
            self.map.retain(|e| e.expires() > now);
            self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP);
            // After a burst, give the memory back: the table keeps its peak capacity
            // otherwise.
            self.map.shrink_if_sparse();
        }
    }
}
