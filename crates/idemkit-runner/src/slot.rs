//! The handler slot a message holds in a runner: taken before the message is received (so
//! the runner takes no more messages than it has handlers for), given back as soon as the
//! handler's value is there, or at the latest with the message's settlement. A retry in
//! place runs in the slot of its first try (review L5 of `aee2f71`: the slot went with the
//! first try's end, and retries ran beside the handlers that took it). One type for every
//! runner that bounds its handlers with a semaphore (JetStream, RabbitMQ).

use std::sync::{Mutex, PoisonError};

use tokio::sync::OwnedSemaphorePermit;

/// A handler slot held by one message: taken before the message is received, given back as
/// soon as the handler's value is there, or at the latest with the message's settlement (a
/// retry in place runs in the slot of its first try).
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use idemkit_runner::HandlerSlot;
/// use tokio::sync::Semaphore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let slots = Arc::new(Semaphore::new(1));
/// let slot = HandlerSlot::new(slots.clone().acquire_owned().await.unwrap());
/// assert_eq!(slots.available_permits(), 0);
/// slot.give_back(); // the handler's value is there
/// assert_eq!(slots.available_permits(), 1);
/// slot.give_back(); // again, at the settlement: nothing more
/// drop(slot);
/// assert_eq!(slots.available_permits(), 1);
/// # }
/// ```
#[derive(Debug)]
pub struct HandlerSlot {
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl HandlerSlot {
    /// The slot `permit` stands for.
    pub fn new(permit: OwnedSemaphorePermit) -> Self {
        HandlerSlot {
            permit: Mutex::new(Some(permit)),
        }
    }

    /// Gives the slot back (once; later calls do nothing). Dropping the slot gives it back
    /// too.
    pub fn give_back(&self) {
        drop(
            self.permit
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }
}
