//! Batch reservation (ARCHITECTURE.md row 31): the keys of a batch of messages reserved in
//! one store round trip ([`Store::begin_many`]), each claim then handed to its own call,
//! which goes on exactly as if its `begin` had just answered.
//!
//! A prepared claim is the answer of a `begin` sent at `sent_at` with the owner token its
//! call will use. The call trusts it only while it is fresh: a reservation older than a
//! renewal interval (a third of the lease) is confirmed by a `begin` with the same owner
//! token first (a live reservation of that owner is answered as `Reserved` with its fencing
//! token; an expired one is reserved anew or found taken over). So a message that waited
//! behind slow handlers of its batch never runs on a lease that may have run out. A prepared
//! reservation that no call takes (the batch was abandoned: a revocation, a shutdown, an
//! earlier message that must be retried first) is released when it is dropped.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::Coordinator;
use super::lease::Held;
use crate::clock::now;
use crate::ident::{Key, Operation, StorageKey};
use crate::phase::Phase;
use crate::record::OwnerToken;
use crate::store::{BeginRequest, Claim, Store, StoreError, StoreErrorKind};

/// One key of a batch, reserved (or found completed, in flight, ...) ahead of its call by
/// [`Coordinator::prepare`]; give it to the call with [`Call::prepared`](super::Call::prepared).
///
/// Dropped without being used, it releases its reservation (from a background task).
pub struct Prepared<S: Store> {
    store: S,
    key: StorageKey,
    owner: OwnerToken,
    claim: Option<Result<Claim, StoreError>>,
    sent_at: Instant,
    /// The lease the batch reserved with: the store holds the claim this long from no
    /// earlier than `sent_at`, whatever lease the call that takes it runs with.
    lease: Duration,
}

impl<S: Store> fmt::Debug for Prepared<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Prepared")
            .field("key", &self.key)
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

/// A prepared claim as a call uses it: the claim, when its `begin` was sent, the lease the
/// call counts on from then (the call's own, no longer than the batch's: the store holds the
/// reservation at least that long from no earlier than the send, see
/// [`Prepared::take_for`]), and the batch's, which the store holds until a renewal lands (a
/// completion may still land until then). Boxed: it lives in
/// the call's future, which every call moves; unbatched calls pay one pointer.
pub(super) type FirstClaim = Option<Box<(Result<Claim, StoreError>, Instant, Held)>>;

/// What a call takes from its prepared claim.
pub(super) struct Taken {
    pub(super) owner: OwnerToken,
    /// The claim and when its `begin` was sent; `None` when the call must `begin` again
    /// (with this owner token) before trusting it.
    pub(super) claim: FirstClaim,
}

impl<S: Store> Prepared<S> {
    /// Whether the store answered with a reservation for this batch.
    pub fn is_reserved(&self) -> bool {
        matches!(self.claim, Some(Ok(Claim::Reserved { .. })))
    }

    /// Hands the claim to the call of `key`, if it is this one's and no fingerprint is
    /// involved (a batch reserves without fingerprints). The call counts its lease from the
    /// claim's send time with its own policy's `lease`: the claim is trusted as it is only
    /// while it is younger than that lease's renewal interval *and* the batch reserved at
    /// least that lease; otherwise (review M1: a call with a longer lease than its batch's
    /// would count on a reservation the store already let go) a `begin` with the same owner
    /// token confirms it first, which renews it to the call's lease (row 24).
    ///
    /// A trusted claim is counted with the *call's* lease, the shorter of the two: the call's
    /// first renewal sets the store's end to the call's lease from then, so counting on the
    /// batch's would overstate what the store holds (review M6 of `e047556`, invariant 2).
    pub(super) fn take_for(mut self, key: &StorageKey, call_lease: Duration) -> Option<Taken> {
        if &self.key != key {
            return None; // dropped: released
        }
        let claim = self.claim.take()?;
        let fresh = self.lease >= call_lease
            && now().saturating_duration_since(self.sent_at)
                < crate::policy::renew_every(call_lease);
        Some(Taken {
            owner: self.owner,
            claim: match (&claim, fresh) {
                (_, true) => Some(Box::new((
                    claim,
                    self.sent_at,
                    Held {
                        counted: call_lease,
                        stored: self.lease,
                    },
                ))),
                // Stale: a begin with the same owner token confirms (or replaces) it.
                (Ok(Claim::Reserved { .. }), false) => None,
                // Stale news of someone else's record: ask again.
                (_, false) => None,
            },
        })
    }
}

impl<S: Store> Drop for Prepared<S> {
    fn drop(&mut self) {
        let Some(Ok(Claim::Reserved { ownership, .. })) = self.claim.take() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return; // no runtime: the lease expires on its own
        };
        let (store, key) = (self.store.clone(), self.key.clone());
        handle.spawn(async move {
            if let Err(e) = store.release(&key, &ownership).await
                && !e.is_lease_lost()
            {
                tracing::warn!(key = %key, error = %e,
                    "releasing an unused batch reservation failed; it expires with its lease");
            }
        });
    }
}

impl<S: Store> Coordinator<S> {
    /// Reserves the keys of a batch (one message's effect each, in the order given) in one
    /// store round trip where the store can ([`Store::begin_many`]), with `operation`'s
    /// policy lease. Each [`Prepared`] goes to its message's call
    /// ([`Call::prepared`](super::Call::prepared)), which then skips its own `begin`: a batch
    /// of `n` first deliveries costs one `begin` round trip instead of `n`; a redelivered
    /// batch learns all its replays at once.
    ///
    /// A key given twice is reserved once: its later copies get a `Prepared` without a
    /// claim, and their calls `begin` as usual (they find the first copy's record).
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let c = Coordinator::new(MemoryStore::new());
    /// let op = Operation::new("mail.invoice")?;
    /// let keys = [Key::new("order-1.invoice")?, Key::new("order-2.invoice")?];
    /// let prepared = c.prepare(&op, &keys).await;
    /// for (key, p) in keys.iter().zip(prepared) {
    ///     let receipt = c.call(&op, key).prepared(p)
    ///         .run(|_| async { Ok::<_, std::io::Error>("sent".to_string()) })
    ///         .await?;
    ///     assert!(!receipt.is_replay());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn prepare(&self, operation: &Operation, keys: &[Key]) -> Vec<Prepared<S>> {
        let store = self.store();
        let lease = self
            .policy_for(operation)
            .lease
            .min(store.max_ttl())
            .max(crate::policy::MIN_LEASE);
        let storage: Vec<StorageKey> = keys
            .iter()
            .map(|k| StorageKey::new(operation, None, k))
            .collect();
        let owners: Vec<OwnerToken> = keys.iter().map(|_| OwnerToken::random()).collect();
        let holder = self.holder();
        // The first copy of each key goes to the store; later copies get no claim.
        let mut first = Vec::with_capacity(keys.len());
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
        for (i, k) in storage.iter().enumerate() {
            if seen.insert(k) {
                first.push(i);
            }
        }
        let reqs: Vec<BeginRequest<'_>> = first
            .iter()
            .map(|&i| BeginRequest::new(&storage[i], owners[i], lease).with_holder(holder))
            .collect();
        let sent_at = now();
        let mut claims = store.begin_many(&reqs).await.into_iter();
        operation.metrics().timing(Phase::Begin, sent_at);
        drop(reqs);
        let mut out: Vec<Prepared<S>> = storage
            .into_iter()
            .zip(owners)
            .map(|(key, owner)| Prepared {
                store: store.clone(),
                key,
                owner,
                claim: None,
                sent_at,
                lease,
            })
            .collect();
        for i in first {
            out[i].claim = Some(claims.next().unwrap_or_else(|| {
                Err(StoreError::new(
                    StoreErrorKind::Rejected,
                    "the store answered fewer claims than keys",
                ))
            }));
        }
        out
    }
}
