//! Test support for idemkit stores: the conformance suite every [`Store`](idemkit_core::Store) passes, and
//! [`Probe`], a store wrapper that counts calls per phase and injects outages.
//!
//! # The conformance suite
//!
//! A store crate implements [`Harness`] (a fresh store in its own namespace, and a way to let
//! time pass on the store's clock) and invokes [`store_conformance!`] once, with the test
//! attribute its runtime needs:
//!
//! ```
//! use std::time::Duration;
//! use idemkit_core::MemoryStore;
//! use idemkit_test::Harness;
//!
//! struct Memory;
//!
//! impl Harness for Memory {
//!     type Store = MemoryStore;
//!     async fn store(&self) -> MemoryStore { MemoryStore::new() }
//!     // The memory store runs on tokio's clock: pause it and jump.
//!     async fn advance(&self, d: Duration) { tokio::time::advance(d).await }
//! }
//!
//! // In a test file:
//! // idemkit_test::store_conformance!(#[tokio::test(start_paused = true)] Memory);
//! ```
//!
//! Every test uses its own keys (random names), so the suite runs in parallel against one
//! server, and never flushes anything.

use std::future::Future;
use std::time::Duration;

use idemkit_core::{Key, Operation, RawStore, StorageKey};

mod probe;
pub mod suite;

pub use probe::{Fault, Probe, ProbeCounts};

/// What the conformance suite needs from a store under test.
pub trait Harness: Send + Sync + Sized + 'static {
    /// The store type.
    type Store: RawStore;

    /// A store handle whose keys no other test touches.
    fn store(&self) -> impl Future<Output = Self::Store> + Send;

    /// Lets `d` pass on the store's clock (advance paused time, or sleep for a server).
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send;

    /// Whether the store's service can be reached. A harness returns `false` only to skip
    /// on a developer machine without the service; when the `CI` environment variable is
    /// set it must panic instead (see [`require_service`]).
    fn available(&self) -> impl Future<Output = bool> + Send {
        async { true }
    }
}

/// For a harness's [`Harness::available`]: `true` if `up`; otherwise panics when `CI` is
/// set (a missing service is a failure there, never a skip) and returns `false` after
/// saying what is skipped.
///
/// # Example
///
/// ```
/// assert!(idemkit_test::require_service("redis at 127.0.0.1:6379", true));
/// ```
pub fn require_service(what: &str, up: bool) -> bool {
    if up {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{what} is not reachable, and CI is set: service tests must not skip");
    }
    eprintln!("skipping: {what} is not reachable (set CI to make this a failure)");
    false
}

/// A storage key no other test uses: `op` `conformance`, key `name` plus random bits.
///
/// # Example
///
/// ```
/// let a = idemkit_test::unique_key("k");
/// assert_ne!(a, idemkit_test::unique_key("k"));
/// ```
pub fn unique_key(name: &str) -> StorageKey {
    let op = Operation::new("conformance").expect("valid operation");
    let key = Key::new(format!("{name}.{:016x}", fastrand::u64(..))).expect("valid key");
    StorageKey::new(&op, None, &key)
}

/// Generates one `#[test]` per conformance check for a [`Harness`].
///
/// `store_conformance!(#[tokio::test(start_paused = true)] MyHarness);`
#[macro_export]
macro_rules! store_conformance {
    (#[$attr:meta] $harness:expr) => {
        $crate::__conformance_tests!(#[$attr] $harness;
            reserve_once_under_contention,
            replay_returns_the_completed_outcome,
            fingerprint_mismatch_is_reported,
            lease_expiry_allows_takeover,
            stale_owner_cannot_renew_complete_or_release,
            release_frees_the_key,
            renew_extends_the_lease,
            wait_wakes_on_completion,
            wait_wakes_on_release,
            wait_returns_at_once_when_already_changed,
            wait_ends_at_lease_expiry,
            corrupt_and_foreign_records_are_typed_errors,
            completed_ttl_is_exact,
            completion_is_idempotent_for_its_owner,
            fencing_tokens_strictly_increase,
            get_reports_the_record,
            purge_removes_anything
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    (#[$attr:meta] $harness:expr; $($name:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $name() {
                let harness = $harness;
                if $crate::Harness::available(&harness).await {
                    $crate::suite::$name(&harness).await;
                }
            }
        )*
    };
}
