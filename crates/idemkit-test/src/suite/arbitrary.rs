//! Arbitrary bytes under a key, the way a fuzzer feeds them, on any store: every phase
//! answers, with a claim or a typed error, and a write that fails changes nothing.

use bytes::Bytes;
use idemkit_core::store::{CompleteRequest, Ownership};
use idemkit_core::{
    FencingToken, OwnerToken, RawStore, Record, RecordState, ResultKind, Store, StoreError,
    StoreErrorKind,
};

use super::{LEASE, TTL, req};
use crate::{Harness, unique_key};

/// How many byte strings one run feeds (`IDEMKIT_ARBITRARY_BYTES`).
fn how_many() -> usize {
    std::env::var("IDEMKIT_ARBITRARY_BYTES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200)
}

/// A byte string: random, or a valid record's encoding with a few bytes changed, cut short
/// or extended (the shapes a damaged value or a foreign writer leave).
fn bytes(rng: &mut fastrand::Rng) -> Vec<u8> {
    let valid = Record {
        state: if rng.bool() {
            RecordState::Reserved
        } else {
            RecordState::Completed(idemkit_core::StoredResult::new(
                ResultKind::Value,
                Bytes::from_static(b"\"em_1\""),
            ))
        },
        owner: OwnerToken::random(),
        fencing: FencingToken::new(rng.u64(1..1 << 50)),
        fingerprint: None,
        created_at_ms: 0,
        expires_at_ms: 0,
        // Version 2 (a holder block) as often as version 1.
        holder: rng.bool().then(|| {
            std::sync::Arc::new(idemkit_core::record::Holder::new("host-1", 42, "worker"))
        }),
        lease_ms: Some(30_000),
    }
    .encode();
    let mut b = match rng.u8(..4) {
        0 => (0..rng.usize(..96)).map(|_| rng.u8(..)).collect(),
        _ => valid,
    };
    for _ in 0..rng.usize(..4) {
        match rng.u8(..3) {
            0 if !b.is_empty() => {
                let i = rng.usize(..b.len());
                b[i] ^= 1 << rng.u8(..8);
            }
            1 if !b.is_empty() => b.truncate(rng.usize(..b.len())),
            _ => b.extend((0..rng.usize(1..16)).map(|_| rng.u8(..))),
        }
    }
    b
}

/// The kinds a healthy store may answer for bytes that are not its own live record.
fn typed<T>(what: &str, bytes: &[u8], r: &Result<T, StoreError>) {
    if let Err(e) = r {
        assert!(
            matches!(
                e.kind(),
                StoreErrorKind::Corrupt | StoreErrorKind::LeaseLost | StoreErrorKind::Rejected
            ),
            "{what} on {bytes:?}: {e} ({:?})",
            e.kind()
        );
    }
}

/// Arbitrary bytes under a key: `get`, `begin`, `renew`, `complete` and `release` each answer
/// with a value or a typed error (`Corrupt`, `LeaseLost`, `Rejected`), never a panic nor an
/// outage; a value the store calls corrupt is still corrupt after the writes (they changed
/// nothing). The bytes come from a seed (`IDEMKIT_ARBITRARY_SEED`, printed on failure).
pub async fn arbitrary_bytes_under_a_key_get_typed_answers<H: Harness>(h: &H)
where
    H::Store: RawStore,
{
    let store = h.store().await;
    let seed = std::env::var("IDEMKIT_ARBITRARY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let stranger = Ownership::new(OwnerToken::random(), FencingToken::new(7));
    let done = CompleteRequest::new(ResultKind::Value, Bytes::from_static(b"1"), TTL);
    for _ in 0..how_many() {
        let b = bytes(&mut rng);
        let what = |phase: &str| format!("{phase} (IDEMKIT_ARBITRARY_SEED={seed})");
        let key = unique_key("arbitrary");
        // A store may refuse to keep a record it could not honour (MySQL: a fencing token
        // above 2^62 - 1); then there is nothing under the key to answer for.
        match store.put_raw(&key, Bytes::from(b.clone()), TTL).await {
            Ok(()) => {}
            Err(e) if e.kind() == StoreErrorKind::Rejected => {
                assert_eq!(
                    store.get(&key).await.map(|r| r.is_none()).ok(),
                    Some(true),
                    "{}: a refused put_raw left something under the key",
                    what("put_raw")
                );
                continue;
            }
            Err(e) => panic!("{}: {e}", what("put_raw")),
        }
        let first = store.get(&key).await;
        typed(&what("get"), &b, &first);
        typed(
            &what("renew"),
            &b,
            &store.renew(&key, &stranger, LEASE).await,
        );
        typed(
            &what("complete"),
            &b,
            &store.complete(&key, &stranger, &done).await,
        );
        typed(&what("release"), &b, &store.release(&key, &stranger).await);
        let again = store.get(&key).await;
        typed(&what("get again"), &b, &again);
        if first
            .as_ref()
            .is_err_and(|e| e.kind() == StoreErrorKind::Corrupt)
        {
            assert!(
                again
                    .as_ref()
                    .is_err_and(|e| e.kind() == StoreErrorKind::Corrupt),
                "{}: a stranger's write changed corrupt bytes {b:?}: {again:?}",
                what("get")
            );
        }
        typed(&what("begin"), &b, &store.begin(&req(&key)).await);
        let _ = store.purge(&key).await;
    }
}
