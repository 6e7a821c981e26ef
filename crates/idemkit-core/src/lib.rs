//! The core of idemkit: effects that happen once under at-least-once delivery.
//!
//! A [`Coordinator`] takes an [`Operation`], a [`Key`] naming one effect, a TTL and an async
//! action. It *reserves* the key in a [`Store`] before the action runs, renews the
//! reservation (a lease) while the action runs, stores the encoded result under the key and
//! replays it to every later caller with that key. A concurrent duplicate waits for the
//! first caller's result, or gets [`Error::InFlight`] to requeue ([`InFlight`]).
//!
//! This crate does no network I/O and names no backend: stores live in their own crates.
//! [`MemoryStore`] is here so examples and tests need no service.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
//! let coordinator = Coordinator::new(MemoryStore::new());
//! let invoice = Operation::new("mail.invoice")?;
//!
//! // The key names the effect (the invoice of order 9), not the job that asked for it.
//! let key = Key::compose(["order-9", "invoice"])?;
//! for _delivery in 0..2 {
//!     let receipt = coordinator
//!         .call(&invoice, &key)
//!         .ttl(Duration::from_secs(24 * 3600))
//!         .run(|_| async { Ok::<_, std::io::Error>("em_1".to_string()) /* send the mail */ })
//!         .await?;
//!     assert_eq!(receipt.value, "em_1");
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Modules
//!
//! - [`ident`] holds [`Operation`], [`Key`], [`Scope`] and the injective [`StorageKey`].
//! - [`store`] holds the [`Store`] contract, one atomic call per phase; [`DynStore`] erases
//!   a store's type, to choose it at run time.
//! - [`memory`] holds the [`MemoryStore`].
//! - [`record`] holds what a store keeps, and its versioned byte format.
//! - [`options`] holds the type-state of a [`Call`]'s options (`store_errors`, `completer`,
//!   `prepared`): one call builder, one [`run`](Call::run).
//! - [`scan`] holds the operators' listing and fenced removal, which a store may offer.
//! - [`downstream`] derives a receiver's idempotency key from the effect.
//! - [`observe`] names the metrics.
//! - [`clock`] is the one place that reads time.
//!
//! A store author reads [`store`], [`record`] and [`ident`] (and [`scan`] for the operators'
//! tools), then runs `idemkit-test`'s conformance suites; the coordinator is the store's
//! only caller. The consumers' runner skeleton is the crate `idemkit-runner`; what the SQL
//! stores share (the transactional call, the inbox) is the crate `idemkit-sql`.
#![forbid(unsafe_code)]

#[doc(hidden)]
#[path = "sync.rs"]
pub mod __sync;
pub mod clock;
mod codec;
mod coordinator;
pub mod downstream;
mod dynamic;
mod error;
pub mod fault;
mod fingerprint;
pub mod ident;
pub mod memory;
pub mod observe;
mod phase;
mod policy;
pub mod record;
pub mod scan;
pub mod store;
pub mod unwind;

pub use codec::{BytesCodec, Codec, JsonCodec};
pub use coordinator::options;
pub use coordinator::{
    Attempt, Call, Completer, Coordinator, CoordinatorBuilder, Prepared, Receipt, Source,
};
pub use downstream::{DownstreamKey, DownstreamSecret, SecretTooShort};
pub use dynamic::DynStore;
pub use error::{Disposition, Error, ErrorKind, LeaseLost};
pub use fingerprint::Fingerprint;
pub use ident::{IdentKind, Key, KeyError, Operation, Scope, StorageKey};
pub use memory::MemoryStore;
pub use phase::Phase;
pub use policy::{InFlight, OnCancel, OnStoreError, Policy};
pub use record::{
    FencingToken, OwnerToken, Record, RecordError, RecordState, ResultKind, StoredResult,
};
pub use store::{
    BeginRequest, BoxError, Claim, CompleteRequest, Ownership, RawStore, Replay, Store, StoreError,
    StoreErrorKind,
};
