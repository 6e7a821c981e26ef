//! [`MemoryStore`]: the embedded default store.

use std::hash::{BuildHasher, RandomState};
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

// std's and tokio's, or loom's under `--cfg idemkit_loom` (the model checks, model.rs).
use crate::__sync::{Arc, AtomicU64, Mutex, MutexGuard, Notify};
use crate::clock::Clock;
use crate::clock::after;
use crate::fingerprint::Fingerprint;
use crate::ident::StorageKey;
use crate::record::{FencingToken, OwnerToken, Record, RecordState, SharedHolder, StoredResult};
use crate::store::{BeginRequest, Claim, CompleteRequest, Ownership, Replay, Store, StoreError};

#[cfg(all(test, idemkit_loom))]
mod model;
mod raw;
mod table;
#[cfg(test)]
mod tests;

use table::{MIN_SWEEP, Shard, Table};

/// Number of independently locked shards. Each lock is held for a hash-map operation only
/// (never across an `.await`), so a few dozen shards keep contention negligible on any core
/// count this store is meant for.
#[cfg(not(idemkit_loom))]
const SHARDS: usize = 32;
/// Under the model checker every lock is a state to explore: two shards are enough.
#[cfg(idemkit_loom)]
const SHARDS: usize = 2;

/// An in-process store: a sharded hash map with lease and TTL expiry on the tokio clock and
/// push wake-ups for waiters.
///
/// It gives the same owner and fencing guarantees as the network stores, within one process:
/// use it for tests, examples, single-instance services and as a first tier. Records are lost
/// when the process exits. Cloning shares the same records.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let coordinator = Coordinator::new(MemoryStore::new());
/// let op = Operation::new("mail.invoice")?;
/// let key = Key::new("order-9.invoice")?;
/// let first = coordinator.call(&op, &key).ttl(Duration::from_secs(3600))
///     .run(|_| async { Ok::<_, std::io::Error>("em_1".to_string()) }).await?;
/// let second = coordinator.call(&op, &key).ttl(Duration::from_secs(3600))
///     .run(|_| async { Ok::<_, std::io::Error>("em_2".to_string()) }).await?;
/// assert_eq!((first.value.as_str(), second.value.as_str()), ("em_1", "em_1"));
/// assert!(second.is_replay());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Mutex<Shard>]>,
    /// Hashes each storage key once per call: bits 32-36 pick the shard, and the shard's
    /// table uses the same hash (hashbrown's low and top bits). Randomly seeded per store,
    /// like `HashMap`'s own hasher, so that keys
    /// chosen by clients (HTTP) cannot be aimed at one shard.
    hasher: RandomState,
    /// The next fencing token. One counter for all keys: it only has to increase per key, and
    /// a key's reservations are serialised by its shard lock, so taking the next value inside
    /// that lock gives every key a strictly increasing sequence, across evictions too.
    next_fencing: AtomicU64,
    clock: Clock,
}

#[derive(Debug)]
enum Entry {
    Record(Slot),
    /// Bytes put with [`RawStore::put_raw`] that are not a record: kept as they are so every
    /// call on the key reports them as corrupt, until they expire or are purged.
    Foreign {
        bytes: Bytes,
        expires: Instant,
    },
}

#[derive(Debug)]
struct Slot {
    state: State,
    owner: OwnerToken,
    fencing: FencingToken,
    fingerprint: Option<Fingerprint>,
    /// The reserving process and its lease, if the reserving call said (`Record::holder`).
    holder: Option<(SharedHolder, u64)>,
    created: Instant,
    /// End of the lease (reserved) or of the retention (completed), on the store's clock.
    expires: Instant,
    /// Waiters' wake-up, created by the first waiter only: an uncontended reservation
    /// allocates nothing for it.
    waiters: Option<Arc<Notify>>,
}

#[derive(Debug)]
enum State {
    Reserved,
    Completed(StoredResult),
}

impl Entry {
    fn expires(&self) -> Instant {
        match self {
            Entry::Record(slot) => slot.expires,
            Entry::Foreign { expires, .. } => *expires,
        }
    }
}

impl Slot {
    /// The record as a store reports it, its instants as Unix milliseconds.
    fn record(&self, clock: &Clock) -> Record {
        Record {
            state: match &self.state {
                State::Reserved => RecordState::Reserved,
                State::Completed(o) => RecordState::Completed(o.clone()),
            },
            owner: self.owner,
            fencing: self.fencing,
            fingerprint: self.fingerprint,
            created_at_ms: clock.unix_ms(self.created),
            expires_at_ms: clock.unix_ms(self.expires),
            holder: self.holder.as_ref().map(|(h, _)| h.clone()),
            lease_ms: self.holder.as_ref().map(|(_, lease)| *lease),
        }
    }

    fn owned_by(&self, lease: &Ownership) -> bool {
        self.owner == lease.owner && self.fencing == lease.fencing
    }

    fn wake_waiters(&mut self) {
        if let Some(n) = self.waiters.take() {
            n.notify_waiters();
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store.
    ///
    /// # Example
    ///
    /// ```
    /// let store = idemkit_core::MemoryStore::new();
    /// assert_eq!(store.len(), 0);
    /// ```
    pub fn new() -> Self {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    map: Table::default(),
                    sweep_at: MIN_SWEEP,
                })
            })
            .collect();
        MemoryStore {
            inner: Arc::new(Inner {
                shards,
                hasher: RandomState::new(),
                next_fencing: AtomicU64::new(1),
                clock: Clock::system(),
            }),
        }
    }

    /// Entries held, expired ones not yet swept included.
    ///
    /// # Example
    ///
    /// ```
    /// assert!(idemkit_core::MemoryStore::new().is_empty());
    /// ```
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether no entries are held.
    ///
    /// # Example
    ///
    /// ```
    /// assert!(idemkit_core::MemoryStore::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired entry now and returns how many were dropped. Not needed for
    /// bounded memory (inserts sweep as they go), but useful before measuring.
    ///
    /// # Example
    ///
    /// ```
    /// assert_eq!(idemkit_core::MemoryStore::new().purge_expired(), 0);
    /// ```
    pub fn purge_expired(&self) -> usize {
        let now = self.inner.clock.now();
        self.inner
            .shards
            .iter()
            .map(|s| {
                let mut s = lock(s);
                let before = s.map.len();
                s.map.retain(|e| e.expires() > now);
                before - s.map.len()
            })
            .sum()
    }

    /// The key's shard, locked, the key's hash for that shard's table, and the time, read
    /// once the lock is held: operations on a key then see time in the order they run, so
    /// a reported remaining lease never exceeds the lease (a clock read before waiting for
    /// the lock could predate the reservation it then reports on).
    fn shard(&self, key: &StorageKey) -> (MutexGuard<'_, Shard>, u64, Instant) {
        let h = self.inner.hasher.hash_one(key.as_str());
        let shard = lock(&self.inner.shards[(h >> 32) as usize % SHARDS]);
        (shard, h, self.inner.clock.now())
    }

    fn next_fencing(&self) -> FencingToken {
        FencingToken::new(self.inner.next_fencing.fetch_add(1, Ordering::Relaxed))
    }

    fn new_slot(&self, req: &BeginRequest<'_>, now: Instant) -> Slot {
        Slot {
            state: State::Reserved,
            owner: req.owner,
            fencing: self.next_fencing(),
            fingerprint: req.fingerprint,
            holder: req.holder.map(|h| {
                (
                    h.clone(),
                    req.lease.as_millis().try_into().unwrap_or(u64::MAX),
                )
            }),
            created: now,
            expires: after(now, req.lease),
            waiters: None,
        }
    }
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // Nothing under a shard lock can panic on input (deadlines saturate, see `after`); if
    // something ever did, keep serving rather than fail every later call of the shard.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn corrupt(bytes: &Bytes) -> StoreError {
    match Record::decode(bytes) {
        Err(e) => StoreError::corrupt(e),
        Ok(_) => StoreError::corrupt("unreadable record"),
    }
}

impl Store for MemoryStore {
    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Claim, StoreError> {
        let (mut shard, h, now) = self.shard(req.key);
        match shard.map.get_mut(h, req.key.as_str()) {
            Some(Entry::Record(slot)) if slot.expires > now => {
                if slot.fingerprint != req.fingerprint {
                    return Ok(Claim::Mismatch);
                }
                Ok(match &slot.state {
                    // Our own reservation, asked for again (a retried `begin`, a batch's
                    // claim confirmed): a renewal, so the lease its caller counts from now
                    // is the store's.
                    State::Reserved if slot.owner == req.owner => {
                        slot.expires = after(now, req.lease);
                        Claim::Reserved {
                            ownership: Ownership::new(slot.owner, slot.fencing),
                            took_over: false,
                        }
                    }
                    State::Reserved => Claim::InFlight {
                        retry_after: slot.expires - now,
                        fencing: slot.fencing,
                        held_for: Some(now - slot.created),
                        holder: slot.holder.as_ref().map(|(h, _)| h.clone()),
                    },
                    State::Completed(o) => Claim::Replay(Replay::new(slot.fencing, o.clone())),
                })
            }
            Some(Entry::Foreign { bytes, expires }) if *expires > now => Err(corrupt(bytes)),
            Some(entry) => {
                // Expired: a lease whose owner stopped renewing, or a record past its TTL.
                // Reuse the map slot; the old owner's later writes fail its owner check.
                let took_over =
                    matches!(entry, Entry::Record(s) if matches!(s.state, State::Reserved));
                if let Entry::Record(old) = entry {
                    old.wake_waiters();
                }
                let slot = self.new_slot(req, now);
                let lease = Ownership::new(slot.owner, slot.fencing);
                *entry = Entry::Record(slot);
                Ok(Claim::Reserved {
                    ownership: lease,
                    took_over,
                })
            }
            None => {
                shard.sweep_if_due(now);
                let slot = self.new_slot(req, now);
                let lease = Ownership::new(slot.owner, slot.fencing);
                shard.map.insert(h, req.key, Entry::Record(slot));
                Ok(Claim::Reserved {
                    ownership: lease,
                    took_over: false,
                })
            }
        }
    }

    async fn renew(
        &self,
        key: &StorageKey,
        lease: &Ownership,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let (mut shard, h, now) = self.shard(key);
        match shard.map.get_mut(h, key.as_str()) {
            Some(Entry::Record(slot))
                if slot.owned_by(lease)
                    && matches!(slot.state, State::Reserved)
                    && slot.expires > now =>
            {
                slot.expires = after(now, ttl);
                Ok(())
            }
            // Completed by this very lease (the renewal crossed the completion on the way):
            // nothing to extend, nothing lost.
            Some(Entry::Record(slot))
                if slot.owned_by(lease)
                    && matches!(slot.state, State::Completed(_))
                    && slot.expires > now =>
            {
                Ok(())
            }
            _ => Err(StoreError::lease_lost()),
        }
    }

    async fn complete(
        &self,
        key: &StorageKey,
        lease: &Ownership,
        completion: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let (mut shard, h, now) = self.shard(key);
        match shard.map.get_mut(h, key.as_str()) {
            Some(Entry::Record(slot)) if slot.owned_by(lease) => match slot.state {
                State::Reserved if slot.expires > now => {
                    slot.state = State::Completed(StoredResult::new(
                        completion.kind,
                        completion.bytes.clone(),
                    ));
                    slot.expires = after(now, completion.ttl);
                    slot.wake_waiters();
                    Ok(())
                }
                // Our own completion, retried: already done.
                State::Completed(_) => Ok(()),
                State::Reserved => Err(StoreError::lease_lost()),
            },
            _ => Err(StoreError::lease_lost()),
        }
    }

    async fn release(&self, key: &StorageKey, lease: &Ownership) -> Result<(), StoreError> {
        let (mut shard, h, now) = self.shard(key);
        match shard.map.get_mut(h, key.as_str()) {
            Some(Entry::Record(slot))
                if slot.owned_by(lease)
                    && matches!(slot.state, State::Reserved)
                    && slot.expires > now =>
            {
                slot.wake_waiters();
                shard.map.remove(h, key.as_str());
                Ok(())
            }
            _ => Err(StoreError::lease_lost()),
        }
    }

    async fn wait(
        &self,
        key: &StorageKey,
        seen: FencingToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let notify: Arc<Notify>;
        let notified;
        let until;
        {
            let (mut shard, h, now) = self.shard(key);
            match shard.map.get_mut(h, key.as_str()) {
                Some(Entry::Record(slot))
                    if slot.fencing == seen
                        && matches!(slot.state, State::Reserved)
                        && slot.expires > now =>
                {
                    notify = slot.waiters.get_or_insert_with(Default::default).clone();
                    // Created under the lock: `notify_waiters` reaches a `Notified` from the
                    // moment it exists, so a completion right after we unlock is not missed.
                    notified = notify.notified();
                    // Wake at the lease's end at the latest: expiry has no event to push.
                    until = slot.expires.min(after(now, timeout));
                }
                _ => return Ok(()),
            }
        }
        // The model checker has no timers: there a wait ends by its wake-up alone, so a
        // lost wake-up is a deadlock it reports.
        #[cfg(idemkit_loom)]
        let _ = (until, notified.await);
        #[cfg(not(idemkit_loom))]
        let _ = tokio::time::timeout_at(until, notified).await;
        Ok(())
    }

    async fn get(&self, key: &StorageKey) -> Result<Option<Record>, StoreError> {
        let (shard, h, now) = self.shard(key);
        let clock = &self.inner.clock;
        match shard.map.get(h, key.as_str()) {
            Some(Entry::Record(slot)) if slot.expires > now => Ok(Some(slot.record(clock))),
            Some(Entry::Foreign { bytes, expires }) if *expires > now => Err(corrupt(bytes)),
            _ => Ok(None),
        }
    }
}
