//! The deliveries the channel holds at once, claimed together: one `begin_many` for the
//! prefetch window's messages that found a free handler slot, as the Kafka runner claims a
//! partition's batch (issue 51: a `begin` a message cost the store a round trip each).

use idemkit_core::{Key, KeyError, Store};
use idemkit_runner::Handle;
use lapin::message::Delivery;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;

use crate::{Message, Session, Shared, handle};

/// Starts the handling of `batch` (deliveries in the order received, each with its handler
/// slot). A lone delivery is handled as it is (its call reserves its key); several are
/// claimed in one store round trip first, then each is handled in a task of its own, at
/// once: a claim never waits for a slot (it came with one), so it is used within its lease
/// as a single call's reservation is.
pub(crate) fn dispatch<S, K, H>(
    tasks: &mut JoinSet<()>,
    shared: &std::sync::Arc<Shared<S, K, H>>,
    session: &std::sync::Arc<Session>,
    batch: Vec<(Delivery, OwnedSemaphorePermit)>,
) where
    S: Store + Send + Sync + 'static,
    K: Fn(&Message) -> Result<Key, KeyError> + Send + Sync + 'static,
    H: Handle<Message> + 'static,
{
    let (shared, session) = (shared.clone(), session.clone());
    if let [_] = &batch[..] {
        let (delivery, slot) = batch.into_iter().next().expect("one");
        tasks.spawn(async move {
            let (message, acker) = Message::split(delivery);
            // The slot goes with the handler's value, or with the settlement.
            let slot = idemkit_runner::HandlerSlot::new(slot);
            handle(&shared, &session, message, acker, None, || slot.give_back()).await;
            drop(slot);
        });
        return;
    }
    tasks.spawn(async move {
        let (messages, rest): (Vec<Message>, Vec<_>) = batch
            .into_iter()
            .map(|(delivery, slot)| {
                let (message, acker) = Message::split(delivery);
                (message, (acker, slot))
            })
            .unzip();
        let claims = shared.settler.processor().prepare(&messages).await;
        let mut running = JoinSet::new();
        for ((message, (acker, slot)), claim) in messages.into_iter().zip(rest).zip(claims) {
            let (shared, session) = (shared.clone(), session.clone());
            running.spawn(async move {
                let slot = idemkit_runner::HandlerSlot::new(slot);
                handle(&shared, &session, message, acker, claim, || {
                    slot.give_back()
                })
                .await;
                drop(slot);
            });
        }
        while let Some(done) = running.join_next().await {
            if let Err(e) = done
                && e.is_panic()
            {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    });
}
