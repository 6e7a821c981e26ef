//! Raw access and listing for the [`MemoryStore`](super::MemoryStore): `RawStore` (tests and
//! operators) and `Scan`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::{Entry, MemoryStore, Slot, State, lock};
use crate::clock::after;
use crate::ident::{Operation, StorageKey};
use crate::record::{FencingToken, Record, RecordState};
use crate::scan::{Listed, Scan, ScanCursor, ScanPage};
use crate::store::{RawStore, StoreError};

impl RawStore for MemoryStore {
    async fn put_raw(
        &self,
        key: &StorageKey,
        bytes: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let now = self.inner.clock.now();
        let expires = after(now, ttl);
        let entry = match Record::decode(&bytes) {
            Ok(r) => {
                // Keep the fencing sequence above anything written by hand.
                self.inner
                    .next_fencing
                    .fetch_max(r.fencing.get().saturating_add(1), Ordering::Relaxed);
                Entry::Record(Slot {
                    state: match r.state {
                        RecordState::Completed(o) => State::Completed(o),
                        _ => State::Reserved,
                    },
                    owner: r.owner,
                    fencing: r.fencing,
                    fingerprint: r.fingerprint,
                    holder: r.holder.map(|h| (h, r.lease_ms.unwrap_or(0))),
                    created: now,
                    expires,
                    waiters: None,
                })
            }
            Err(_) => Entry::Foreign { bytes, expires },
        };
        let (mut shard, h, _) = self.shard(key);
        shard.sweep_if_due(now);
        if let Some(Entry::Record(mut old)) = shard.map.insert(h, key, entry) {
            old.wake_waiters();
        }
        Ok(())
    }

    async fn purge(&self, key: &StorageKey) -> Result<bool, StoreError> {
        let (mut shard, h, _) = self.shard(key);
        match shard.map.remove(h, key.as_str()) {
            Some(Entry::Record(mut old)) => {
                old.wake_waiters();
                Ok(true)
            }
            Some(Entry::Foreign { .. }) => Ok(true),
            None => Ok(false),
        }
    }
}

/// A page is the next `count` keys in key order after the cursor (the last key of the
/// previous page): every page looks at every entry, which is fine for the embedded store's
/// sizes and keeps a walk exact while the store changes.
impl Scan for MemoryStore {
    async fn scan(
        &self,
        operation: Option<&Operation>,
        cursor: Option<&ScanCursor>,
        count: usize,
    ) -> Result<ScanPage, StoreError> {
        let clock = &self.inner.clock;
        let now_ms = clock.unix_ms(clock.now());
        let after = cursor.map(ScanCursor::as_str);
        let prefix = operation.map(|op| format!("{}:", op.as_str()));
        let count = count.max(1);
        let mut found: Vec<Listed> = Vec::new();
        for shard in &self.inner.shards {
            let shard = lock(shard);
            for (name, entry) in shard.map.iter() {
                if after.is_some_and(|a| name <= a)
                    || prefix.as_deref().is_some_and(|p| !name.starts_with(p))
                {
                    continue;
                }
                let Some((op, scope, key)) = StorageKey::parse(name) else {
                    continue;
                };
                let key = StorageKey::new(&op, scope.as_ref(), &key);
                found.push(match entry {
                    Entry::Record(slot) => {
                        let record = slot.record(clock);
                        let size = record.encode().len() as u64;
                        Listed::new(key, Some(record), size)
                    }
                    Entry::Foreign { bytes, .. } => Listed::new(key, None, bytes.len() as u64),
                });
            }
            // Keep only the `count` smallest keys seen so far: bounded memory per page.
            if found.len() > count {
                found.sort_unstable_by(|a, b| a.key.cmp(&b.key));
                found.truncate(count);
            }
        }
        found.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        let next = (found.len() == count)
            .then(|| found.last().map(|l| ScanCursor::new(l.key.as_str())))
            .flatten();
        Ok(ScanPage::new(found, next, now_ms))
    }

    async fn remove(&self, key: &StorageKey, fencing: FencingToken) -> Result<bool, StoreError> {
        let (mut shard, h, _) = self.shard(key);
        match shard.map.get(h, key.as_str()) {
            Some(Entry::Record(slot)) if slot.fencing == fencing => {}
            _ => return Ok(false),
        }
        if let Some(Entry::Record(mut old)) = shard.map.remove(h, key.as_str()) {
            old.wake_waiters();
        }
        Ok(true)
    }
}
