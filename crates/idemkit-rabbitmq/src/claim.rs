//! The deliveries the channel holds at once, claimed together: one `begin_many` for the
//! prefetch window's messages the runner had tickets for, then each handled as soon as a
//! handler is free (`idemkit_runner::handle_together`, as the JetStream runner does).

use std::sync::Arc;

use idemkit_core::Store;
use idemkit_runner::{Handle, Ticket, Turn, handle_together};
use lapin::message::Delivery;
use tokio::task::JoinSet;

use crate::{Message, Session, Shared, handle};

/// Starts the handling of `batch` (deliveries in the order received, each with its ticket),
/// in one task: claimed together when there are several (or every handler is busy), each
/// then in a task of its own.
pub(crate) fn dispatch<S, K, H>(
    tasks: &mut JoinSet<()>,
    shared: &Arc<Shared<S, K, H>>,
    session: &Arc<Session>,
    batch: Vec<(Delivery, Ticket)>,
) where
    S: Store + Send + Sync + 'static,
    K: idemkit_runner::KeyOf<Message> + Send + Sync + 'static,
    H: Handle<Message> + 'static,
{
    let (shared, session) = (shared.clone(), session.clone());
    tasks.spawn(async move {
        let batch = batch
            .into_iter()
            .map(|(delivery, ticket)| {
                let (message, acker) = Message::split(delivery);
                (message, acker, ticket)
            })
            .collect();
        let each = {
            let shared = shared.clone();
            move |message, acker: lapin::Acker, claim, turn: Turn| {
                let (shared, session) = (shared.clone(), session.clone());
                async move {
                    // Shutting down before it found a handler: not started, back to the
                    // queue at once (its claim is released as it drops).
                    let Some(slot) = turn.slot().await else {
                        let _ = acker.nack(crate::requeue()).await;
                        return;
                    };
                    // The slot goes with the handler's value, or with the settlement.
                    handle(&shared, &session, message, acker, claim, || {
                        slot.give_back()
                    })
                    .await;
                    drop(slot);
                }
            }
        };
        handle_together(shared.settler.processor(), &shared.slots, batch, each).await;
    });
}
