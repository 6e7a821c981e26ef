//! The messages a pull brought at once, claimed together: one `begin_many` for those the
//! runner had tickets for, then each handled as soon as a handler is free
//! (`idemkit_runner::handle_together`, as the RabbitMQ runner does).

use std::sync::Arc;

use async_nats::jetstream::Message;
use idemkit_core::Store;
use idemkit_runner::{Handle, Ticket, Turn, handle_together};
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;

use crate::{Shared, handle};

/// A message with its place in the runner and its ticket.
pub(crate) type Taken = (Message, OwnedSemaphorePermit, Ticket);

/// Starts the handling of `batch` (in the order pulled), in one task: claimed together when
/// there are several (or every handler is busy), each then in a task of its own.
pub(crate) fn dispatch<S, K, H>(
    tasks: &mut JoinSet<()>,
    shared: &Arc<Shared<S, K, H>>,
    batch: Vec<Taken>,
) where
    S: Store + Send + Sync + 'static,
    K: idemkit_runner::KeyOf<Message> + Send + Sync + 'static,
    H: Handle<Message> + 'static,
{
    let shared = shared.clone();
    tasks.spawn(async move {
        let each = {
            let shared = shared.clone();
            move |message, place, claim, turn: Turn| {
                let shared = shared.clone();
                async move {
                    // The place goes with the ack.
                    handle(&shared, message, claim, turn).await;
                    drop::<OwnedSemaphorePermit>(place);
                }
            }
        };
        handle_together(shared.settler.processor(), &shared.slots, batch, each).await;
    });
}
