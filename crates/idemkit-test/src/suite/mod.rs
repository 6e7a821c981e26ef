//! The conformance checks. Each takes a [`Harness`](crate::Harness) and panics on a violation of the
//! `Store` contract; [`store_conformance!`](crate::store_conformance) wraps each in a test.

use std::time::Duration;

use bytes::Bytes;
use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, OwnerToken, Ownership, ResultKind, StorageKey, Store,
    StoreErrorKind,
};

mod arbitrary;
mod lifecycle;
mod owners;
mod records;
mod waits;

pub use arbitrary::*;
pub use lifecycle::*;
pub use owners::*;
pub use records::*;
pub use waits::*;

pub(super) const LEASE: Duration = Duration::from_millis(1_000);
pub(super) const TTL: Duration = Duration::from_secs(60);

pub(super) fn req(key: &StorageKey) -> BeginRequest<'_> {
    BeginRequest::new(key, OwnerToken::random(), LEASE)
}

pub(super) async fn reserve<S: Store>(store: &S, key: &StorageKey) -> Ownership {
    match store.begin(&req(key)).await.expect("begin") {
        Claim::Reserved {
            ownership: lease, ..
        } => lease,
        other => panic!("expected a reservation, got {other:?}"),
    }
}

pub(super) fn value(bytes: &'static str) -> CompleteRequest {
    CompleteRequest::new(ResultKind::Value, Bytes::from_static(bytes.as_bytes()), TTL)
}

pub(super) fn assert_lease_lost<T: std::fmt::Debug>(
    r: Result<T, idemkit_core::StoreError>,
    what: &str,
) {
    match r {
        Err(e) if e.kind() == StoreErrorKind::LeaseLost => {}
        other => panic!("{what}: expected LeaseLost, got {other:?}"),
    }
}
