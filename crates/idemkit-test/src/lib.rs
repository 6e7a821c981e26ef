//! Test support for idemkit stores: the conformance suites every [`Store`]
//! passes (the store contract, and the coordinator's scenarios on top of it), and [`Probe`], a
//! store wrapper that counts calls per phase and injects outages.
//!
//! # The conformance suite
//!
//! A store crate implements [`Harness`] (a fresh store in its own namespace, and a way to let
//! time pass on the store's clock) and invokes [`store_conformance!`] and
//! [`coordinator_conformance!`] once each, with the test attribute its runtime needs (and
//! [`raw_store_conformance!`] too if it implements [`RawStore`]):
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
//! // idemkit_test::raw_store_conformance!(#[tokio::test(start_paused = true)] Memory);
//! // idemkit_test::coordinator_conformance!(#[tokio::test(start_paused = true)] Memory);
//! ```
//!
//! Every test uses its own keys (random names), so the suite runs in parallel against one
//! server, and never flushes anything.

use std::future::Future;
use std::time::Duration;

use idemkit_core::{Key, Operation, RawStore, StorageKey, Store};

pub mod brokers;
pub mod coordinator;
mod effects;
#[cfg(feature = "fault-points")]
pub mod faults;
pub mod mysql_server;
pub mod pg_server;
mod probe;
pub mod redis_server;
pub mod scans;
pub mod suite;
pub mod tls;

pub use effects::{Mailer, assert_fails_closed_then_open};
pub use probe::{Fault, Probe, ProbeCounts};

/// What the conformance suite needs from a store under test.
pub trait Harness: Send + Sync + Sized + 'static {
    /// The store type. Checks that write raw bytes ([`raw_store_conformance!`]) and the
    /// coordinator check that purges a key also need [`RawStore`].
    type Store: Store;

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

/// Reserves `key` for a new random owner for `lease`, and returns the reservation.
///
/// # Panics
///
/// Unless the store answers `Reserved`.
///
/// # Example
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let store = idemkit_core::MemoryStore::new();
/// let key = idemkit_test::unique_key("k");
/// let lease = idemkit_test::reserve(&store, &key, std::time::Duration::from_secs(5)).await;
/// assert!(lease.fencing.get() > 0);
/// # });
/// ```
pub async fn reserve<S: Store>(
    store: &S,
    key: &StorageKey,
    lease: Duration,
) -> idemkit_core::Ownership {
    match store
        .begin(&idemkit_core::BeginRequest::new(
            key,
            idemkit_core::OwnerToken::random(),
            lease,
        ))
        .await
        .expect("begin")
    {
        idemkit_core::Claim::Reserved { ownership, .. } => ownership,
        other => panic!("expected a reservation, got {other:?}"),
    }
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

/// `n` fresh keys named `{name}-00`, `{name}-01`, ... (each [`unique_key`]).
///
/// ```
/// let keys = idemkit_test::unique_keys("order", 3);
/// assert_eq!(keys.len(), 3);
/// ```
pub fn unique_keys(name: &str, n: usize) -> Vec<StorageKey> {
    (0..n)
        .map(|i| unique_key(&format!("{name}-{i:02}")))
        .collect()
}

/// Spawns `store.begin` of `key` for `owner` with a 30 s lease: a call that queues in a
/// coalescing store's lane while the test holds its connection.
pub fn spawn_begin<S: idemkit_core::Store + Clone + Send + Sync + 'static>(
    store: &S,
    key: &StorageKey,
    owner: idemkit_core::OwnerToken,
) -> tokio::task::JoinHandle<Result<idemkit_core::Claim, idemkit_core::StoreError>> {
    let (store, key) = (store.clone(), key.clone());
    tokio::spawn(async move {
        store
            .begin(&idemkit_core::BeginRequest::new(
                &key,
                owner,
                std::time::Duration::from_secs(30),
            ))
            .await
    })
}

/// The ownership of a claim that must be a reservation.
///
/// # Panics
///
/// On an error or any other claim: the test's failure, with what came instead.
pub fn reserved(
    claim: Result<idemkit_core::Claim, idemkit_core::StoreError>,
) -> idemkit_core::Ownership {
    match claim {
        Ok(idemkit_core::Claim::Reserved { ownership, .. }) => ownership,
        other => panic!("expected a reservation, got {other:?}"),
    }
}

/// Calls `$then!($($args)*; <every check name>)`: the one list of conformance checks.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_checks {
    ($then:ident!($($args:tt)*)) => {
        $crate::$then! { $($args)*;
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
            completed_ttl_is_exact,
            completion_is_idempotent_for_its_owner,
            fencing_tokens_strictly_increase,
            get_reports_the_record,
            begin_is_idempotent_for_its_own_owner,
            a_reused_owner_token_cannot_act_on_a_later_reservation,
            the_longest_durations_are_kept,
            two_waiters_are_both_woken,
            a_cancelled_wait_leaves_the_key_wakeable,
            complete_after_expiry_before_takeover_is_refused,
            begin_many_answers_each_key_as_begin_would,
            begin_by_its_own_owner_renews_the_lease,
            renew_after_its_own_completion_succeeds,
            a_completion_keeps_the_reservation_it_completes,
            an_in_flight_claim_points_to_the_original
        }
    };
}

/// The checks that need [`RawStore`].
#[doc(hidden)]
#[macro_export]
macro_rules! __with_raw_checks {
    ($then:ident!($($args:tt)*)) => {
        $crate::$then! { $($args)*;
            corrupt_and_foreign_records_are_typed_errors,
            arbitrary_bytes_under_a_key_get_typed_answers,
            purge_removes_anything,
            purge_wakes_waiters
        }
    };
}

/// The coordinator checks: `(module; check, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_coordinator_checks {
    ($then:ident!($($args:tt)*)) => {
        $crate::$then! { $($args)*;
            a_replay_returns_the_first_result_without_running,
            concurrent_waiters_get_one_result,
            concurrent_callers_in_reject_mode_run_once,
            a_dead_owner_is_taken_over_after_its_lease,
            a_stale_owner_cannot_clobber_its_successor,
            an_owner_whose_renewals_fail_loses_to_its_successor,
            a_reused_key_is_refused_in_flight_and_after,
            a_dropped_call_keeps_its_key_for_the_lease,
            a_dropped_call_releases_its_key_when_asked,
            a_panicking_action_releases_its_key,
            a_cancelled_waiter_changes_nothing,
            a_short_outage_at_completion_is_retried,
            a_store_outage_fails_closed_or_open,
            a_permanent_error_is_stored_and_replayed,
            durations_at_the_extremes,
            a_prepared_batch_runs_each_effect_once,
            a_stale_prepared_claim_runs_on_a_renewed_lease,
            a_prepared_claim_under_a_longer_call_lease_is_confirmed_first,
            a_prepared_claim_under_a_shorter_call_lease_counts_on_the_call_lease,
            a_completion_that_never_lands_answers_within_its_bound
        }
    };
}

/// Generates one `#[test]` per store conformance check for a [`Harness`].
///
/// `store_conformance!(#[tokio::test(start_paused = true)] MyHarness);`
#[macro_export]
macro_rules! store_conformance {
    (#[$attr:meta] $harness:expr) => {
        $crate::__with_checks!(__conformance_tests!(
            #[$attr]
            $harness; suite
        ));
    };
}

/// Generates one `#[test]` per check that writes raw bytes (corrupt and foreign records,
/// purge), for a store that implements [`RawStore`].
#[macro_export]
macro_rules! raw_store_conformance {
    (#[$attr:meta] $harness:expr) => {
        $crate::__with_raw_checks!(__conformance_tests!(
            #[$attr]
            $harness; suite
        ));
    };
}

/// The checks that need [`Scan`](idemkit_core::scan::Scan).
#[doc(hidden)]
#[macro_export]
macro_rules! __with_scan_checks {
    ($then:ident!($($args:tt)*)) => {
        $crate::$then! { $($args)*;
            a_scan_lists_each_record_of_the_operation_once,
            remove_is_fenced,
            remove_wakes_waiters
        }
    };
}

/// Generates one `#[test]` per check of listing and fenced removal ([`scans`]), for a store
/// that implements [`Scan`](idemkit_core::scan::Scan).
#[macro_export]
macro_rules! scan_conformance {
    (#[$attr:meta] $harness:expr) => {
        $crate::__with_scan_checks!(__conformance_tests!(
            #[$attr]
            $harness; scans
        ));
    };
}

/// Generates one `#[test]` per coordinator scenario ([`coordinator`]) for a [`Harness`] whose
/// store implements [`RawStore`].
///
/// `coordinator_conformance!(#[tokio::test(start_paused = true)] MyHarness);`
#[macro_export]
macro_rules! coordinator_conformance {
    (#[$attr:meta] $harness:expr) => {
        $crate::__with_coordinator_checks!(__conformance_tests!(
            #[$attr]
            $harness; coordinator
        ));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __spawn_checks {
    ($harness:expr; $module:ident; $($name:ident),* $(,)?) => {{
        let mut tasks = Vec::new();
        $(
            let h = ::std::sync::Arc::clone(&$harness);
            tasks.push((stringify!($name), ::tokio::spawn(async move { $crate::$module::$name(&*h).await })));
        )*
        tasks
    }};
}

/// Runs every conformance check (store, raw store and coordinator) concurrently on one
/// harness, in one test: for a service that a test starts itself and must stop at its end (a
/// Redis Cluster, say). Panics with the names of the checks that failed.
///
/// # Example
///
/// ```no_run
/// # use std::sync::Arc;
/// # struct H;
/// # impl idemkit_test::Harness for H {
/// #     type Store = idemkit_core::MemoryStore;
/// #     async fn store(&self) -> Self::Store { idemkit_core::MemoryStore::new() }
/// #     async fn advance(&self, d: std::time::Duration) { tokio::time::sleep(d).await }
/// # }
/// # async fn t() {
/// idemkit_test::run_all(Arc::new(H)).await;
/// # }
/// ```
pub async fn run_all<H: Harness>(harness: std::sync::Arc<H>)
where
    H::Store: RawStore,
{
    let mut tasks = __with_checks!(__spawn_checks!(harness; suite));
    tasks.extend(__with_raw_checks!(__spawn_checks!(harness; suite)));
    tasks.extend(__with_coordinator_checks!(
        __spawn_checks!(harness; coordinator)
    ));
    let mut failed = Vec::new();
    for (name, task) in tasks {
        if task.await.is_err() {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "conformance checks failed: {failed:?}");
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    (#[$attr:meta] $harness:expr; $module:ident; $($name:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $name() {
                let harness = $harness;
                if $crate::Harness::available(&harness).await {
                    $crate::$module::$name(&harness).await;
                }
            }
        )*
    };
}

/// Polls `cond` every 50 ms until it holds or `within` passes; whether it held. For tests
/// that watch a real broker or server, whose progress they cannot await.
///
/// # Example
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use std::time::Duration;
/// assert!(idemkit_test::eventually(Duration::from_secs(1), || async { true }).await);
/// # });
/// ```
pub async fn eventually<F, Fut>(within: std::time::Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond().await {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The path of example `name` of the package under test, which `cargo test` builds beside
/// its test binaries (`target/<profile>/examples/<name>`): for tests that run an example as a
/// child process (a worker to kill).
///
/// # Panics
///
/// If it was not built (a test run that built no examples, such as `cargo test --test x`).
pub fn example_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(std::path::Path::parent)
        .expect("target/<profile>/deps");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test` (which builds the examples)",
        path.display()
    );
    path
}
