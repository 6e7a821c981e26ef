//! Messages that arrived together, claimed together: one store round trip for their keys
//! (`Store::begin_many`), then each handled at once in a task of its own. What the RabbitMQ
//! and JetStream runners do with the deliveries a channel or a pull holds at once (the
//! Kafka runner claims a partition's batch in order instead: `process_batch`).

use std::future::Future;

use idemkit_core::{Prepared, Store};
use tokio::task::JoinSet;

use crate::{Handle, KeyOf, Processor};

/// Handles `batch` (messages in the order received, each with what its runner keeps beside
/// it: a handler slot, an acknowledger) through `each(message, kept, claim)`. Several
/// messages have their keys claimed in one store round trip first (`claim`: the message's
/// reservation, or its replay), then each runs in a task of its own, at once: a claim never
/// waits for a handler slot (each message came with one), so it is used within its lease
/// as a single call's reservation is. A lone message is not claimed first (`claim` is
/// `None`: its call reserves its key, one round trip as before). Returns once every message
/// was handled; a panic of `each` (not of a handler: the processor catches those) goes on.
///
/// # Example
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
/// use idemkit_runner::{Processor, handle_together};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let p = Arc::new(Processor::new(
///     Coordinator::new(MemoryStore::new()),
///     Operation::new("mail.invoice")?,
///     |order: &String| Key::compose([order.as_str(), "invoice"]),
///     |order: String, _| async move { Ok::<_, std::io::Error>(format!("em_{order}")) },
/// ));
/// let sent = Arc::new(Mutex::new(Vec::new()));
/// let batch = vec![("order-1".to_string(), 1), ("order-2".to_string(), 2)];
/// let (q, log) = (p.clone(), sent.clone());
/// handle_together(&p, batch, move |order, n, claim| {
///     let (p, log) = (q.clone(), log.clone());
///     async move {
///         let done = p.process_prepared(&order, claim, 1).await;
///         log.lock().unwrap().push((n, done.receipt.map(|r| r.value)));
///     }
/// })
/// .await;
/// let mut sent = sent.lock().unwrap().clone();
/// sent.sort();
/// assert_eq!(sent, [(1, Some("em_order-1".into())), (2, Some("em_order-2".into()))]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub async fn handle_together<S, K, H, M, X, F, Fut>(
    processor: &Processor<S, K, H>,
    batch: Vec<(M, X)>,
    each: F,
) where
    S: Store,
    K: KeyOf<M>,
    H: Handle<M>,
    F: Fn(M, X, Option<Prepared<S>>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    if batch.len() < 2 {
        for (message, kept) in batch {
            each(message, kept, None).await;
        }
        return;
    }
    let (messages, kept): (Vec<M>, Vec<X>) = batch.into_iter().unzip();
    let claims = processor.prepare(&messages).await;
    let mut running = JoinSet::new();
    for ((message, kept), claim) in messages.into_iter().zip(kept).zip(claims) {
        running.spawn(each(message, kept, claim));
    }
    while let Some(done) = running.join_next().await {
        if let Err(e) = done
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}
