//! The messages a pull brought at once, claimed together: one `begin_many` for those that
//! found a free handler slot (`idemkit_runner::handle_together`, as the RabbitMQ runner
//! does).

use std::sync::Arc;

use async_nats::jetstream::Message;
use idemkit_core::Store;
use idemkit_runner::{Handle, HandlerSlot, handle_together};
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;

use crate::{Shared, handle};

/// A message with its handler slot and its place in the runner.
pub(crate) type Taken = (Message, OwnedSemaphorePermit, OwnedSemaphorePermit);

/// Starts the handling of `batch` (in the order pulled), in one task: claimed together when
/// there are several, each then in a task of its own.
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
        let batch = batch
            .into_iter()
            .map(|(message, slot, place)| (message, (slot, place)))
            .collect();
        let each = {
            let shared = shared.clone();
            move |message, (slot, place), claim| {
                let shared = shared.clone();
                async move {
                    // The slot goes with the handler's value, or with the settlement; the
                    // place with the ack.
                    let slot = HandlerSlot::new(slot);
                    handle(&shared, message, claim, || slot.give_back()).await;
                    drop(slot);
                    drop::<OwnedSemaphorePermit>(place);
                }
            }
        };
        handle_together(shared.settler.processor(), batch, each).await;
    });
}
