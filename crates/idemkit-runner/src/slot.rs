//! A runner's handler slots. A message takes a [`Ticket`] before it is received (so the
//! runner takes no more messages than it can hold: twice its handlers), its key is claimed,
//! and it then waits for a free handler in its turn: the claim's round trip overlaps the
//! handlers still running instead of delaying the next one (issue 51; the figures are in
//! docs/benchmarks.md). The slot, ticket and handler together, is given back as soon as the handler's value is there, or at the latest with
//! the message's settlement. A retry in place runs in the slot of its first try (review L5 of
//! `aee2f71`: the slot went with the first try's end, and retries ran beside the handlers
//! that took it). One type for every runner that bounds its handlers with a semaphore
//! (JetStream, RabbitMQ).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A runner's handlers (`concurrency` of them) and the messages it holds for them: at most
/// twice as many, those beyond the running handlers claimed ahead and waiting their turn.
///
/// # Example
///
/// ```
/// use idemkit_runner::HandlerSlots;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let slots = HandlerSlots::new(1);
/// let first = slots.enter().await.unwrap();
/// let second = slots.try_enter().unwrap(); // claimed ahead, waits for the handler
/// assert!(slots.try_enter().is_none()); // two messages held for one handler
/// drop((first, second));
/// assert!(slots.try_enter().is_some());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct HandlerSlots {
    handlers: Arc<Semaphore>,
    held: Arc<Semaphore>,
}

/// A message's place among those its runner holds (from [`HandlerSlots::enter`]): taken
/// before the message is received, given back with its [`HandlerSlot`].
#[derive(Debug)]
pub struct Ticket(OwnedSemaphorePermit);

impl HandlerSlots {
    /// `concurrency` handlers (at least one), and twice as many messages held.
    pub fn new(concurrency: usize) -> Self {
        let n = concurrency.max(1);
        HandlerSlots {
            handlers: Arc::new(Semaphore::new(n)),
            held: Arc::new(Semaphore::new(n.saturating_mul(2))),
        }
    }

    /// A ticket for one more message, once the runner holds fewer than it may; `None` once
    /// [closed](Self::close).
    pub async fn enter(&self) -> Option<Ticket> {
        self.held.clone().acquire_owned().await.ok().map(Ticket)
    }

    /// A ticket now, if the runner may hold one more message.
    pub fn try_enter(&self) -> Option<Ticket> {
        self.held.clone().try_acquire_owned().ok().map(Ticket)
    }

    /// Whether a handler is free now: a message that comes alone then runs at once, its key
    /// reserved by its call; when none is, it is claimed while it waits.
    pub fn handler_free(&self) -> bool {
        self.handlers.available_permits() > 0
    }

    /// The message holding `ticket`'s turn for a handler ([`Turn::slot`]).
    pub fn turn(&self, ticket: Ticket) -> Turn {
        Turn {
            handlers: self.handlers.clone(),
            ticket,
        }
    }

    /// The runner is shutting down: no message waiting for a handler starts (it is left to
    /// the broker, its claim released), and no more tickets are given. Running handlers
    /// finish.
    pub fn close(&self) {
        self.handlers.close();
        self.held.close();
    }
}

/// A message's turn for a handler of its [`HandlerSlots`]: [`slot`](Turn::slot) waits for
/// it. Dropped unused, it gives its ticket back.
#[derive(Debug)]
pub struct Turn {
    handlers: Arc<Semaphore>,
    ticket: Ticket,
}

impl Turn {
    /// A free handler, waited for in turn (first come, first served); `None` once the slots
    /// are [closed](HandlerSlots::close): the message is not started.
    pub async fn slot(self) -> Option<HandlerSlot> {
        let handler = self.handlers.acquire_owned().await.ok()?;
        Some(HandlerSlot {
            permits: Mutex::new(Some((self.ticket.0, Some(handler)))),
        })
    }
}

/// A handler slot held by one message: given back as soon as the handler's value is there,
/// or at the latest with the message's settlement (a retry in place runs in the slot of its
/// first try).
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
    permits: Mutex<Option<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>)>>,
}

impl HandlerSlot {
    /// The slot `permit` stands for.
    pub fn new(permit: OwnedSemaphorePermit) -> Self {
        HandlerSlot {
            permits: Mutex::new(Some((permit, None))),
        }
    }

    /// Gives the slot back (once; later calls do nothing). Dropping the slot gives it back
    /// too.
    pub fn give_back(&self) {
        drop(
            self.permits
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }
}
