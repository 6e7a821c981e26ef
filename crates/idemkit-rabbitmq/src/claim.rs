//! The deliveries the channel holds at once, claimed together: one `begin_many` for the
//! prefetch window's messages that found a free handler slot
//! (`idemkit_runner::handle_together`, as the JetStream runner does).

use std::sync::Arc;

use idemkit_core::Store;
use idemkit_runner::{Handle, HandlerSlot, handle_together};
use lapin::message::Delivery;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;

use crate::{Message, Session, Shared, handle};

/// Starts the handling of `batch` (deliveries in the order received, each with its handler
/// slot), in one task: claimed together when there are several, each then in a task of its
/// own.
pub(crate) fn dispatch<S, K, H>(
    tasks: &mut JoinSet<()>,
    shared: &Arc<Shared<S, K, H>>,
    session: &Arc<Session>,
    batch: Vec<(Delivery, OwnedSemaphorePermit)>,
) where
    S: Store + Send + Sync + 'static,
    K: idemkit_runner::KeyOf<Message> + Send + Sync + 'static,
    H: Handle<Message> + 'static,
{
    let (shared, session) = (shared.clone(), session.clone());
    tasks.spawn(async move {
        let batch = batch
            .into_iter()
            .map(|(delivery, slot)| {
                let (message, acker) = Message::split(delivery);
                (message, (acker, slot))
            })
            .collect();
        let each = {
            let shared = shared.clone();
            move |message, (acker, slot), claim| {
                let (shared, session) = (shared.clone(), session.clone());
                async move {
                    // The slot goes with the handler's value, or with the settlement.
                    let slot = HandlerSlot::new(slot);
                    handle(&shared, &session, message, acker, claim, || {
                        slot.give_back()
                    })
                    .await;
                    drop(slot);
                }
            }
        };
        handle_together(shared.settler.processor(), batch, each).await;
    });
}
