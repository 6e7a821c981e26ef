//! The settle loop every runner shares: retries in place until final, the dead letter
//! through the transport, then the `on_settled` hook with its panics caught.

use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use idemkit_core::Store;

use crate::handle::Handle;
use crate::key::KeyOf;
use crate::processor::{Processed, Processor};
use crate::settlement::Settlement;

/// What a runner's `on_settled` hook is shown: one settled message, before the transport
/// acknowledges it (commits its offset, acks, terms).
///
/// # Example
///
/// See [`Settler`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Settled<'a, M, T> {
    /// The message.
    pub message: &'a M,
    /// Which delivery of it this is: the broker's count where it keeps one (JetStream), 1
    /// otherwise (Kafka). Retries in this process do not change it: they are one delivery.
    pub delivered: u32,
    /// Its settlement and the call's receipt.
    pub processed: &'a Processed<T>,
}

/// What a transport supplies to the settle loop: where a dead letter goes.
///
/// # Example
///
/// See [`Settler`].
pub trait Transport<M>: Sync {
    /// Parks a dead-lettered message (a dead-letter topic or subject), retrying as the
    /// transport sees fit. True once it is stored (or when there is nowhere to park it and
    /// the transport logged it instead); false if it could not be, so that the transport
    /// delivers the message again rather than lose it.
    fn dead_letter(&self, message: &M, reason: &str) -> impl Future<Output = bool> + Send;

    /// Where a message came from, for the logs (a topic, partition and offset; a stream
    /// and sequence).
    fn describe(&self, message: &M) -> String;
}

type Hook<M, T> = Arc<dyn Fn(&Settled<'_, M, T>) + Send + Sync>;

/// A [`Processor`] and the `on_settled` hook: the part of a runner that is the same for
/// every transport. A runner receives a message, asks the processor for its first
/// [`Processed`] (alone, or with a batch's claim), and hands it to
/// [`settle`](Settler::settle), which returns the final settlement for the transport to
/// apply.
///
/// # Example
///
/// ```
/// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
/// use idemkit_runner::{Processor, Settled, Settlement, Settler, Transport};
///
/// /// A transport that has nowhere to park a dead letter: it logs it.
/// struct Log;
/// impl Transport<String> for Log {
///     async fn dead_letter(&self, message: &String, reason: &str) -> bool {
///         eprintln!("dead letter {message}: {reason}");
///         true
///     }
///     fn describe(&self, message: &String) -> String {
///         message.clone()
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// let processor = Processor::new(
///     Coordinator::new(MemoryStore::new()),
///     Operation::new("mail.invoice")?,
///     |order: &String| Key::compose([order.as_str(), "invoice"]),
///     |order: String, _attempt| async move { Ok::<_, std::io::Error>(format!("em_{order}")) },
/// );
/// let settler = Settler::new(processor).on_settled(|s: &Settled<'_, String, String>| {
///     assert_eq!(s.processed.settlement, Settlement::Ack);
/// });
/// let message = "order-9".to_string();
/// let first = settler.processor().process(&message, 1).await;
/// let done = settler.settle(&Log, &message, 1, first, || true).await.unwrap();
/// assert!(done.parked);
/// assert_eq!(done.processed.settlement, Settlement::Ack);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Settler<S, K, H: Handle<M>, M> {
    processor: Processor<S, K, H>,
    on_settled: Option<Hook<M, H::Output>>,
}

impl<S: fmt::Debug, K, H: Handle<M>, M> fmt::Debug for Settler<S, K, H, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settler")
            .field("processor", &self.processor)
            .field("on_settled", &self.on_settled.is_some())
            .finish()
    }
}

/// A delivery settled for good: what the transport applies.
///
/// # Example
///
/// See [`Settler`].
#[derive(Debug)]
#[non_exhaustive]
pub struct Final<T> {
    /// The final settlement (`Ack` or `DeadLetter`) and the call's receipt.
    pub processed: Processed<T>,
    /// False when a dead letter could not be parked: deliver the message again rather
    /// than acknowledge it (the hook was not shown it).
    pub parked: bool,
}

impl<S, K, H, M> Settler<S, K, H, M>
where
    S: Store,
    K: KeyOf<M>,
    H: Handle<M>,
    M: Clone,
{
    /// The settle loop around `processor`, without a hook.
    pub fn new(processor: Processor<S, K, H>) -> Self {
        Settler {
            processor,
            on_settled: None,
        }
    }

    /// Called with every settled message, before the transport acknowledges it: for
    /// logging, metrics and tests. A hook that panics makes it a failure of the message:
    /// processed again (a replay) until the retry budget is spent, then dead-lettered.
    pub fn on_settled(
        mut self,
        hook: impl Fn(&Settled<'_, M, H::Output>) + Send + Sync + 'static,
    ) -> Self {
        self.on_settled = Some(Arc::new(hook));
        self
    }

    /// The processor.
    pub fn processor(&self) -> &Processor<S, K, H> {
        &self.processor
    }

    /// Settles one delivery, from its first [`Processed`]: retried in place until final
    /// (see [`Processor::settle_in_place`]), dead-lettered through `transport` if so, then
    /// shown to the hook. `delivered` is the broker's delivery count (1 where it keeps
    /// none), shown to the hook as it is. `go_on` is asked before each try; `None` once it
    /// says no (a revoked partition, a shutdown): the delivery is left to the broker.
    pub async fn settle<T: Transport<M>>(
        &self,
        transport: &T,
        message: &M,
        delivered: u32,
        mut processed: Processed<H::Output>,
        go_on: impl Fn() -> bool,
    ) -> Option<Final<H::Output>> {
        let processor = &self.processor;
        let mut failures = 0u32;
        loop {
            let settled = processor
                .settle_in_place(message, processed, &mut failures, &go_on)
                .await?;
            if let Settlement::DeadLetter { reason } = &settled.settlement
                && !transport.dead_letter(message, reason).await
            {
                if !go_on() {
                    return None;
                }
                return Some(Final {
                    processed: settled,
                    parked: false,
                });
            }
            // A test's crash point: settled, not yet acknowledged to the broker.
            idemkit_core::fault::hit(idemkit_core::fault::FaultPoint::BeforeAck);
            let Some(hook) = &self.on_settled else {
                return Some(Final {
                    processed: settled,
                    parked: true,
                });
            };
            let shown = catch_unwind(AssertUnwindSafe(|| {
                hook(&Settled {
                    message,
                    delivered,
                    processed: &settled,
                });
            }));
            let Err(panic) = shown else {
                return Some(Final {
                    processed: settled,
                    parked: true,
                });
            };
            let what = idemkit_core::unwind::message(&*panic);
            tracing::warn!(
                message = transport.describe(message),
                panic = what,
                "runner: the on_settled hook panicked"
            );
            if matches!(settled.settlement, Settlement::DeadLetter { .. }) {
                return Some(Final {
                    processed: settled,
                    parked: true,
                });
            }
            failures += 1;
            let retry = processor.retry_policy();
            if failures >= retry.deliveries() {
                // Parked like a handler that keeps failing; the hook is shown the dead letter.
                processed = settled;
                processed.settlement = Settlement::DeadLetter {
                    reason: format!("the on_settled hook panicked on delivery {failures}: {what}"),
                };
                continue;
            }
            tokio::time::sleep(retry.delay(failures)).await;
            if !go_on() {
                return None;
            }
            processed = processor.process(message, failures + 1).await;
        }
    }
}
