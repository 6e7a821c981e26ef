//! The runner skeleton idemkit's queue and stream runners share: the settlement of one
//! delivery, the retry budget, the dead letter, the `on_settled` hook and panic isolation.
//! A transport (Kafka, NATS JetStream, a job framework) supplies only what is its own: how
//! messages arrive, how they are acknowledged, where a dead letter goes ([`Transport`]).
//!
//! A runner (Kafka, NATS JetStream, a job framework) receives a message, asks a
//! [`Processor`] to run the user's handler under the coordinator, and gets back a
//! [`Settlement`]: acknowledge, deliver again after a delay, or dead-letter. The mapping is
//! the table below, read from [`Error::disposition`] and a [`RetryPolicy`]; every runner
//! applies it the same way, so no user writes it again.
//!
//! | the call ended with | settlement | counts against `max_deliveries` |
//! |---|---|---|
//! | the action's value, fresh or replayed | `Ack` | - |
//! | [`Error::ResultUnavailable`] (the effect happened, its result was not stored) | `Ack` | - |
//! | [`Error::InFlight`] (reject mode, or a wait past `wait_timeout`: another worker holds the key) | `Retry` after the hint (a runner waits for the owner's key meanwhile) | no |
//! | [`Error::Store`] with the store unavailable (fail-closed) | `Retry` after the backoff | no |
//! | [`Error::Action`] (the handler failed, its key released) | `Retry` after the backoff, then `DeadLetter` | yes |
//! | the key function failed ([`KeyError`]) | `DeadLetter` | - |
//! | [`Error::KeyReused`], [`Error::ActionStored`], [`Error::ReplayedAction`], [`Error::Decode`], [`Error::Config`], any other store error | `DeadLetter` | - |
//!
//! A store outage and a concurrent duplicate are not the message's fault, so they never
//! dead-letter it: the runner keeps retrying with the backoff (capped at
//! [`RetryPolicy::backoff`]'s maximum). Only the handler's own failures use up the budget.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use idemkit_runner::{Processor, RetryPolicy, Settlement};
//! use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
//! let processor = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("mail.invoice")?)
//!     // The effect's identity, from the message: the order's invoice, not the delivery.
//!     .key(|order: &String| Key::compose([order.as_str(), "invoice"]))
//!     .handler(|order: String, _attempt| async move { Ok::<_, std::io::Error>(format!("em_{order}")) })
//!     .retry(RetryPolicy::new().max_deliveries(3));
//!
//! let first = processor.process(&"order-9".to_string(), 1).await;
//! let again = processor.process(&"order-9".to_string(), 1).await; // the producer's duplicate
//! assert_eq!(first.settlement, Settlement::Ack);
//! assert!(again.receipt.unwrap().is_replay());
//!
//! let blank = processor.process(&String::new(), 1).await; // no order id: no key
//! assert!(matches!(blank.settlement, Settlement::DeadLetter { .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Modules
//!
//! - `settlement`: [`Settlement`] and the [`RetryPolicy`] that reads the table above;
//! - `processor`: [`Processor`] (the handler under the coordinator) and [`Handle`];
//! - `settle`: the loop every runner settles a delivery with ([`Settler`]): retries in
//!   place, the dead letter through the [`Transport`], the hook ([`Settled`]) with its panics
//!   caught.
//!
//! [`Error::disposition`]: idemkit_core::Error::disposition
//! [`Error::ResultUnavailable`]: idemkit_core::Error::ResultUnavailable
//! [`Error::InFlight`]: idemkit_core::Error::InFlight
//! [`Error::Store`]: idemkit_core::Error::Store
//! [`Error::Action`]: idemkit_core::Error::Action
//! [`KeyError`]: idemkit_core::KeyError
//! [`Error::KeyReused`]: idemkit_core::Error::KeyReused
//! [`Error::ActionStored`]: idemkit_core::Error::ActionStored
//! [`Error::ReplayedAction`]: idemkit_core::Error::ReplayedAction
//! [`Error::Decode`]: idemkit_core::Error::Decode
//! [`Error::Config`]: idemkit_core::Error::Config
#![forbid(unsafe_code)]

mod claim;
mod handle;
mod key;
mod processor;
mod settle;
mod settlement;
mod slot;

pub use claim::handle_together;
pub use handle::Handle;
pub use key::{DedupeId, KeyOf};
pub use processor::{Processed, Processor, ProcessorBuilder};
pub use settle::{Final, Settled, Settler, Transport};
pub use settlement::{RetryPolicy, Settlement};
pub use slot::{HandlerSlot, HandlerSlots, Ticket, Turn};
