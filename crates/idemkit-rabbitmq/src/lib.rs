//! A RabbitMQ runner for idemkit: give it the broker's URI, a queue and a [`Processor`] (the
//! effect's key from the message, your handler as the action) and it consumes with manual
//! acks, the effect once.
//!
//! RabbitMQ delivers again whatever a consumer did not acknowledge: a worker that dies
//! between its effect and its ack, a channel closed because a delivery outlived the
//! broker's `consumer_timeout`, a lost connection. The runner acknowledges a message only
//! after its result is stored under the effect's key, so every such redelivery replays the
//! result instead of repeating the effect.
//!
//! What the runner does:
//!
//! - **Manual acks, from one table** ([`idemkit_runner`]): `Ack` → `basic.ack`; `DeadLetter`
//!   → published to the [dead-letter exchange](RabbitRunner::dead_letter_exchange) and
//!   confirmed by the broker, then `basic.ack`, so a dead letter is never lost (at least once:
//!   should the original's ack fail after the copy was confirmed, a channel closed between the
//!   two, the original is delivered again and parked a second time); without one,
//!   `basic.reject` without requeue (the queue's own `x-dead-letter-exchange` takes it, if
//!   it has one; otherwise the broker drops it, and the runner logs it at `error`).
//!   `Retry` is retried in process, as every idemkit runner does: a failing handler after
//!   the backoff, a store outage after the backoff without counting, a concurrent duplicate
//!   as soon as the owner's key is free (pushed by the store). A handler that panics is a
//!   failing handler.
//! - **The broker's delivery count is left alone.** Nothing is requeued to be retried, so
//!   retries never use up a quorum queue's `x-delivery-limit`; a message goes back to its
//!   queue only when the runner shuts down mid-retry (`basic.nack` with requeue), when a
//!   dead letter could not be published (after a second's pause), or when its channel is
//!   gone (the broker requeues it). Set `x-delivery-limit` above one only as the last resort
//!   against a message that crashes its worker every time.
//! - **Concurrency and prefetch.** Up to [`concurrency`](RabbitRunner::concurrency)
//!   handlers run at once (16 by default), and the runner holds at most twice as many
//!   deliveries; the channel's prefetch ([`prefetch`](RabbitRunner::prefetch), by default
//!   twice the concurrency) bounds how many unacknowledged messages the broker hands it. A
//!   handler that returned a value gives its place to the next message while its result is
//!   stored and its message acked.
//! - **Batch claims, ahead of the handlers.** The deliveries the channel holds at once, as
//!   far as the runner may hold more, are claimed together: their keys reserved in one
//!   store round trip (`Store::begin_many`), as the Kafka runner claims a partition's
//!   batch; then each runs in a task of its own as soon as a handler is free, in order.
//!   The claim's round trip overlaps the running handlers instead of delaying the next
//!   one; a claim that waited longer than a renewal interval is confirmed before its handler
//!   runs (the same lease rules as a single call). A delivery that comes alone while a
//!   handler is free is handled as before (its call reserves its key). At shutdown,
//!   deliveries still waiting for a handler are not started: nacked back to the queue.
//! - **A redelivery of a message that is still running** (another worker's, whose channel
//!   the broker closed) finds the key reserved and waits for the owner's result, woken by
//!   the store's push, then acks with the replayed receipt; the owner's own ack fails, which
//!   the runner logs. The lease is renewed while the owner runs, however long.
//! - **A lost connection, a closed channel, a cancelled consumer**: the runner connects
//!   again (backing off from 100 ms to 5 s) and consumes again; the handlers running on
//!   the old connection finish and store their results, and their messages, which the
//!   broker requeued when the connection went, replay. Nothing is acknowledged that was not
//!   settled: an acknowledgement is sent only with a final settlement, on the channel the
//!   message came on.
//! - **Publish once, key by the id** (issue 52). An action that publishes for the next
//!   service uses [`publish_once`] with its effect's downstream key as the `message_id`
//!   (mandatory, confirmed). RabbitMQ keeps a republish's copy too; the next consumer, keyed
//!   on the `message_id` by default (a processor built without `.key(...)`:
//!   `idemkit_runner::DedupeId`; [`message_id_key`] is the same as a function), runs its
//!   effect once and replays to the copy.
//! - **Shutdown.** [`RabbitRunner::run`] stops consuming when its `shutdown` future
//!   completes (the consumer is cancelled), lets the running handlers finish and settle,
//!   then closes its channel and connection: messages received but not started go back to
//!   the queue.
//!
//! [`Message::delivered`] is what the `on_settled` hook shows as the delivery: a quorum
//! queue's `x-delivery-count` + 1, or on a classic queue 1 for a first delivery and 2 for
//! any redelivery.
//!
//! Tested with RabbitMQ 3.10 (classic and quorum queues). lapin, the AMQP client, is
//! re-exported ([`lapin`]); this crate builds it without TLS: for `amqps://`, enable
//! lapin's `rustls` or `native-tls` feature in your own manifest.
//!
//! # Example
//!
//! ```no_run
//! use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
//! use idemkit_rabbitmq::{Message, RabbitRunner};
//! use idemkit_runner::Processor;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! // A RedisStore or PgStore in production: the key must outlive the worker.
//! let processor = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("mail.invoice")?)
//!     // The effect: this order's invoice, not the delivery.
//!     .key(|m: &Message| Key::compose([m.text().unwrap_or(""), "invoice"]))
//!     .handler(|m: Message, _attempt| async move { Ok::<_, std::io::Error>(format!("em_{}", m.data.len())) });
//! RabbitRunner::new("amqp://guest:guest@127.0.0.1:5672/%2f", "orders.paid", processor)
//!     .dead_letter_exchange("orders.dead", None)
//!     .run(async { let _ = tokio::signal::ctrl_c().await; })
//!     .await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod claim;
mod dead_letter;
mod message;
mod publish;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use idemkit_core::Store;
use idemkit_runner::{HandlerSlots, Settler, Transport};
/// The AMQP client this crate is built on, so an application declares its queues with the
/// same version as the runner without naming it in its manifest.
pub use lapin;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Acker, Channel, Connection, ConnectionProperties};
use tokio::task::JoinSet;

use crate::dead_letter::{DeadLetter, Publisher};
pub use crate::message::Message;
pub use crate::publish::{PublishError, message_id_key, publish_once};
pub use idemkit_runner::{Handle, Processed, Processor, RetryPolicy, Settlement};

/// Why a runner could not start: the first connection, its channel, its prefetch or its
/// consumer was refused (a wrong URI or credentials, a missing queue). Once it consumes, a
/// lost connection is not an error: the runner connects again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerError {
    /// The broker, or the way to it, refused.
    #[error("rabbitmq: {0}")]
    Connect(#[from] lapin::Error),
}

/// What the [`on_settled`](RabbitRunner::on_settled) hook is shown: one settled message,
/// before its ack (`delivered`: [`Message::delivered`]; retries in process do not change
/// it).
pub type Settled<'a, T> = idemkit_runner::Settled<'a, Message, T>;

/// The RabbitMQ runner. See the [crate docs](crate).
pub struct RabbitRunner<S, K, H: Handle<Message>> {
    uri: String,
    properties: ConnectionProperties,
    tls: Option<Arc<Tls>>,
    declare: Option<(QueueDeclareOptions, FieldTable)>,
    queue: String,
    settler: Settler<S, K, H, Message>,
    concurrency: u16,
    prefetch: Option<u16>,
    dead_letter: Option<DeadLetter>,
}

impl<S: fmt::Debug, K, H: Handle<Message>> fmt::Debug for RabbitRunner<S, K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitRunner")
            .field("queue", &self.queue)
            .field("settler", &self.settler)
            .field("concurrency", &self.concurrency)
            .field("prefetch", &self.prefetch)
            .field("dead_letter", &self.dead_letter)
            .finish_non_exhaustive()
    }
}

/// What every delivery's task shares.
struct Shared<S, K, H: Handle<Message>> {
    settler: Settler<S, K, H, Message>,
    queue: String,
    dead_letter: Option<DeadLetter>,
    /// Set when the runner shuts down: retries in process stop.
    stopping: AtomicBool,
    /// The handlers, and the deliveries held for them.
    slots: HandlerSlots,
}

/// One connection and the channel a consumer runs on. Every delivery's task holds it, so
/// the channel stays open until the last message received on it is settled (dropping the
/// last handle closes the channel and the connection: what is unacknowledged goes back to
/// the queue).
struct Session {
    connection: Connection,
    /// Held so that the channel lives as long as its deliveries' tasks.
    _channel: Channel,
    publisher: Publisher,
}

impl<S, K, H> RabbitRunner<S, K, H>
where
    S: Store + Send + Sync + 'static,
    K: idemkit_runner::KeyOf<Message> + Send + Sync + 'static,
    H: Handle<Message> + 'static,
{
    /// A runner that consumes `queue` (which must exist) on the broker at `uri`
    /// (`amqp://user:password@host:port/vhost`, the vhost URL-encoded: `%2f` for `/`).
    pub fn new(
        uri: impl Into<String>,
        queue: impl Into<String>,
        processor: Processor<S, K, H>,
    ) -> Self {
        RabbitRunner {
            uri: uri.into(),
            properties: ConnectionProperties::default(),
            tls: None,
            declare: None,
            queue: queue.into(),
            settler: Settler::new(processor),
            concurrency: 16,
            prefetch: None,
            dead_letter: None,
        }
    }

    /// Trust only this certificate authority (a PEM file) for an `amqps://` broker's
    /// certificate, instead of the system's roots, and present a client certificate if
    /// `client` names one (its certificate and its PKCS#8 private key, PEM files), for a
    /// broker with `ssl_options.fail_if_no_peer_cert`. The files are read when the runner
    /// connects; one that cannot be read fails [`run`](Self::run) with the first
    /// connection. An `amqps://` URI without this checks the broker against the system's
    /// roots.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// use idemkit_rabbitmq::{Message, RabbitRunner};
    /// use idemkit_runner::Processor;
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let processor = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("mail.invoice")?)
    ///     .key(|m: &Message| Key::compose([m.text().unwrap_or(""), "invoice"]))
    ///     .handler(|m: Message, _attempt| async move { Ok::<_, std::io::Error>(format!("em_{}", m.data.len())) });
    /// RabbitRunner::new("amqps://app:secret@rabbit.internal:5671/%2f", "orders.paid", processor)
    ///     .tls_ca_file("/etc/idemkit/rabbit-ca.pem", None)
    ///     .run(async { let _ = tokio::signal::ctrl_c().await; })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls_ca_file(
        mut self,
        ca: impl Into<std::path::PathBuf>,
        client: Option<(std::path::PathBuf, std::path::PathBuf)>,
    ) -> Self {
        self.tls = Some(Arc::new(Tls {
            ca: ca.into(),
            client,
        }));
        self
    }

    /// The connection's properties (a connection name, an auth provider), instead of
    /// lapin's defaults. Leave lapin's auto-recovery off (`enable_auto_recover`): the runner
    /// connects again itself after a lost connection, and lapin's recovery beside it would
    /// recover channels whose unacknowledged deliveries the broker has already requeued.
    pub fn connection_properties(mut self, properties: ConnectionProperties) -> Self {
        self.properties = properties;
        self
    }

    /// How many handlers run at once (16 by default, at least 1); the runner holds at most
    /// twice as many deliveries, those beyond the running handlers claimed and waiting.
    pub fn concurrency(mut self, n: u16) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Declares the queue on every (re)connect, before consuming it, with `options` and
    /// `arguments` (RabbitMQ's `x-queue-type`, `x-delivery-limit`, `x-dead-letter-exchange`
    /// ...), instead of requiring it to exist. Opt-in: a queue's type and arguments are an
    /// operator's decision, and a declaration that differs from the existing queue's is
    /// refused by the broker (`PRECONDITION_FAILED`), which fails [`run`](Self::run) on the
    /// first connection rather than consume a queue other than the one described.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// use idemkit_rabbitmq::lapin::options::QueueDeclareOptions;
    /// use idemkit_rabbitmq::lapin::types::{AMQPValue, FieldTable};
    /// use idemkit_rabbitmq::{Message, RabbitRunner};
    /// use idemkit_runner::Processor;
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let processor = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("mail.invoice")?)
    ///     .key(|m: &Message| Key::compose([m.text().unwrap_or(""), "invoice"]))
    ///     .handler(|m: Message, _attempt| async move { Ok::<_, std::io::Error>(format!("em_{}", m.data.len())) });
    /// let mut quorum = FieldTable::default();
    /// quorum.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    /// RabbitRunner::new("amqp://guest:guest@127.0.0.1:5672/%2f", "orders.paid", processor)
    ///     .declare_queue(QueueDeclareOptions { durable: true, ..Default::default() }, quorum)
    ///     .run(async { let _ = tokio::signal::ctrl_c().await; })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn declare_queue(mut self, options: QueueDeclareOptions, arguments: FieldTable) -> Self {
        self.declare = Some((options, arguments));
        self
    }

    /// The channel's prefetch: how many unacknowledged messages the broker hands this
    /// runner at once (by default twice the concurrency; at least the concurrency). Beyond
    /// the running handlers, the next messages have their keys claimed while they wait for
    /// a handler, and earlier ones have their results stored and are acked; each waits with
    /// the broker's `consumer_timeout` running.
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// Publishes every dead-lettered message to `exchange` (with `routing_key`, or the
    /// message's own if `None`), mandatory and on a channel in confirm mode, and acks the
    /// original only once the broker confirmed the copy and routed it to a queue. The copy
    /// keeps the original properties and headers, beside `idemkit-error` (why),
    /// `idemkit-queue`, `idemkit-exchange` and `idemkit-routing-key` (where from). A copy
    /// that cannot be stored (no such exchange, no queue bound) is logged and the original
    /// goes back to the queue after a second: it is never lost (at least once, possibly twice:
    /// a confirmed copy whose original's ack then fails, its channel closed, is parked again
    /// when the original is redelivered). Without one, a dead letter
    /// is rejected without requeue (see the [crate docs](crate)).
    pub fn dead_letter_exchange(
        mut self,
        exchange: impl Into<String>,
        routing_key: Option<String>,
    ) -> Self {
        self.dead_letter = Some(DeadLetter {
            exchange: exchange.into(),
            routing_key,
        });
        self
    }

    /// Called with every settled message, before its ack: for logging, metrics and
    /// tests. A hook that panics makes it a failure of the message, as in every runner
    /// ([`Settler::on_settled`](idemkit_runner::Settler::on_settled)): processed again (a
    /// replay) until the retry budget is spent, then dead-lettered.
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
    /// [`RunnerError`] if the first connection or its consumer is refused. Later losses
    /// are logged at `warn` and the runner connects again.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), RunnerError> {
        let prefetch = self
            .prefetch
            .unwrap_or(self.concurrency.saturating_mul(2))
            .max(self.concurrency);
        let shared = Arc::new(Shared {
            settler: self.settler,
            queue: self.queue,
            dead_letter: self.dead_letter,
            stopping: AtomicBool::new(false),
            slots: HandlerSlots::new(usize::from(self.concurrency)),
        });
        // A message's ticket: taken before it is received, given back with its handler
        // slot once the handler returned a value (its result then goes to the store and the
        // message is acked while the next handler runs), or when it is settled otherwise;
        // twice as many tickets as handlers, so the keys of the next deliveries are claimed
        // while the handlers run (the prefetch is at least as large by default).
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        let mut first = true;
        let mut backoff = RECONNECT_FIRST;
        // The last session opened, closed with a handshake at shutdown (below).
        let mut last: Option<Arc<Session>> = None;
        'connect: loop {
            let opened = tokio::select! {
                biased;
                () = &mut shutdown => break 'connect,
                opened = open(&self.uri, &self.properties, self.tls.as_deref(), self.declare.as_ref(), &shared.queue, prefetch) => opened,
            };
            let (session, mut consumer) = match opened {
                Ok(opened) => opened,
                Err(e) if first => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(error = %e, queue = shared.queue, ?backoff,
                        "rabbitmq runner: cannot consume; trying again");
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break 'connect,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                    continue;
                }
            };
            first = false;
            backoff = RECONNECT_FIRST;
            let session = Arc::new(session);
            last = Some(session.clone());
            loop {
                let ticket = tokio::select! {
                    biased;
                    () = &mut shutdown => break 'connect,
                    ticket = shared.slots.enter() => ticket.expect("closed only below"),
                };
                let delivery = tokio::select! {
                    biased;
                    () = &mut shutdown => break 'connect,
                    d = consumer.next() => d,
                };
                let delivery = match delivery {
                    Some(Ok(delivery)) => delivery,
                    end => {
                        consumer_ended(&shared.queue, end);
                        break;
                    }
                };
                // What else the channel has already delivered, as far as tickets are left
                // (the prefetch window): claimed with it in one `begin_many`.
                let mut batch = vec![(delivery, ticket)];
                let mut end = None;
                while let Some(ticket) = shared.slots.try_enter() {
                    match consumer.next().now_or_never() {
                        Some(Some(Ok(delivery))) => batch.push((delivery, ticket)),
                        Some(other) => {
                            end = Some(other);
                            break;
                        }
                        None => break,
                    }
                }
                claim::dispatch(&mut tasks, &shared, &session, batch);
                if let Some(end) = end {
                    consumer_ended(&shared.queue, end);
                    break;
                }
                while tasks.try_join_next().is_some() {}
            }
            // The session stays open while its deliveries' tasks hold it.
            drop((consumer, session));
            tokio::select! {
                biased;
                () = &mut shutdown => break 'connect,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RECONNECT_MAX);
        }
        // The consumer was dropped with the loop's state (cancelled: no more deliveries);
        // retries in process stop (their messages go back to the queue); running handlers
        // finish, settle and ack on their own channel, which then closes.
        shared.stopping.store(true, Ordering::SeqCst);
        // Deliveries waiting for a handler are not started: unacked, they go back to the
        // queue when the channel closes.
        shared.slots.close();
        while tasks.join_next().await.is_some() {}
        // Closed with the protocol's handshake before `run` returns: the broker has then
        // processed every ack sent before the close. Dropped instead, a process that exits
        // right after `run` could lose acks still in the client's buffers, and their
        // messages would be delivered again.
        if let Some(session) = last {
            let _ = session
                .connection
                .close(200, "idemkit runner shut down".to_string().into())
                .await;
        }
        Ok(())
    }
}

/// What an `amqps://` connection trusts and presents (see [`RabbitRunner::tls_ca_file`]).
#[derive(Debug)]
struct Tls {
    ca: std::path::PathBuf,
    client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Tls {
    fn config(&self) -> lapin::Result<lapin::tcp::OwnedTLSConfig> {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| {
                lapin::Error::from(lapin::ErrorKind::IOError(std::sync::Arc::new(
                    std::io::Error::new(e.kind(), format!("{}: {e}", path.display())),
                )))
            })
        };
        let cert_chain = String::from_utf8_lossy(&read(&self.ca)?).into_owned();
        let identity = match &self.client {
            Some((cert, key)) => Some(lapin::tcp::OwnedIdentity::PKCS8 {
                pem: read(cert)?,
                key: read(key)?,
            }),
            None => None,
        };
        Ok(lapin::tcp::OwnedTLSConfig {
            identity,
            cert_chain: Some(cert_chain),
        })
    }
}

/// The first pause before connecting again, doubled up to [`RECONNECT_MAX`].
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// A connection, a channel with the prefetch, and a consumer with manual acks on `queue`.
async fn open(
    uri: &str,
    properties: &ConnectionProperties,
    tls: Option<&Tls>,
    declare: Option<&(QueueDeclareOptions, FieldTable)>,
    queue: &str,
    prefetch: u16,
) -> lapin::Result<(Session, lapin::Consumer)> {
    let connection = match tls {
        None => Connection::connect(uri, properties.clone()).await?,
        Some(tls) => {
            Connection::connect_with_config(
                uri,
                properties.clone(),
                tls.config()?,
                lapin::runtime::default_runtime()?,
            )
            .await?
        }
    };
    let channel = connection.create_channel().await?;
    if let Some((options, arguments)) = declare {
        channel
            .queue_declare(queue.into(), *options, arguments.clone())
            .await?;
    }
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok((
        Session {
            connection,
            _channel: channel,
            publisher: Publisher::new(),
        },
        consumer,
    ))
}

/// The consumer's stream failed or ended: the channel or connection is gone, or the broker
/// cancelled the consumer. Either way the runner consumes again.
fn consumer_ended(queue: &str, end: Option<Result<lapin::message::Delivery, lapin::Error>>) {
    match end {
        Some(Err(e)) => tracing::warn!(error = %e, queue,
            "rabbitmq runner: the consumer failed; connecting again"),
        _ => tracing::warn!(
            queue,
            "rabbitmq runner: the broker cancelled the consumer; consuming again"
        ),
    }
}

/// Handles one delivery: its call (with its key claimed already when it came in a batch),
/// its settlement, its ack.
pub(crate) async fn handle<S, K, H>(
    shared: &Shared<S, K, H>,
    session: &Session,
    message: Message,
    acker: Acker,
    claim: Option<idemkit_core::Prepared<S>>,
    handled: impl FnOnce() + Send,
) where
    S: Store + Send + Sync + 'static,
    K: idemkit_runner::KeyOf<Message> + Send + Sync + 'static,
    H: Handle<Message> + 'static,
{
    // A retry in place stops when the runner shuts down, and when the message's channel is
    // gone: the broker has requeued it, and its redelivery is processed afresh.
    let go_on = || !shared.stopping.load(Ordering::SeqCst) && !acker.poisoned();
    let transport = Parking {
        shared,
        session,
        acker: &acker,
    };
    let first = shared
        .settler
        .processor()
        .process_signalled(&message, claim, 1, handled)
        .await;
    let settled = shared
        .settler
        .settle(&transport, &message, message.delivered(), first, go_on)
        .await;
    let (what, sent) = match settled {
        // Shutting down mid-retry, or the channel is gone: back to the queue.
        None => ("nack", acker.nack(requeue()).await),
        Some(settled) => match &settled.processed.settlement {
            Settlement::Ack => ("ack", acker.ack(BasicAckOptions::default()).await),
            // The dead letter could not be stored: deliver again rather than lose it, after
            // a pause so that a broker that refuses it is not asked in a tight loop.
            Settlement::DeadLetter { .. } if !settled.parked => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                ("nack", acker.nack(requeue()).await)
            }
            // Published to the dead-letter exchange and confirmed: done with.
            Settlement::DeadLetter { .. } if shared.dead_letter.is_some() => {
                ("ack", acker.ack(BasicAckOptions::default()).await)
            }
            // No exchange of ours: the queue's own dead-lettering, if it has any.
            Settlement::DeadLetter { .. } => (
                "reject",
                acker.reject(BasicRejectOptions { requeue: false }).await,
            ),
            // Not reached (retries are in process; Settlement is non-exhaustive).
            _ => ("nack", acker.nack(requeue()).await),
        },
    };
    match sent {
        Ok(true) => {}
        // Its channel closed (the consumer timeout, a lost connection): the broker requeued
        // the message, and its redelivery replays the stored result.
        Ok(false) => tracing::warn!(
            queue = shared.queue,
            delivery_tag = message.delivery_tag,
            what,
            "rabbitmq runner: not sent, the channel is gone; the redelivery replays"
        ),
        Err(e) => tracing::warn!(
            queue = shared.queue,
            delivery_tag = message.delivery_tag,
            what,
            error = %e,
            "rabbitmq runner: not sent; the redelivery replays"
        ),
    }
}

pub(crate) fn requeue() -> BasicNackOptions {
    BasicNackOptions {
        requeue: true,
        ..BasicNackOptions::default()
    }
}

/// RabbitMQ's part of the settle loop: the dead-letter exchange.
struct Parking<'a, S, K, H: Handle<Message>> {
    shared: &'a Shared<S, K, H>,
    session: &'a Session,
    acker: &'a Acker,
}

impl<S, K, H> Transport<Message> for Parking<'_, S, K, H>
where
    S: Store + Send + Sync + 'static,
    K: idemkit_runner::KeyOf<Message> + Send + Sync + 'static,
    H: Handle<Message> + 'static,
{
    async fn dead_letter(&self, message: &Message, reason: &str) -> bool {
        let queue = &self.shared.queue;
        let Some(to) = &self.shared.dead_letter else {
            tracing::error!(
                queue,
                delivery_tag = message.delivery_tag,
                reason,
                "rabbitmq runner: dead-lettered (rejected without requeue)"
            );
            return true;
        };
        self.session
            .publisher
            .publish(
                &self.session.connection,
                to,
                queue,
                message,
                reason,
                self.acker,
            )
            .await
    }

    fn describe(&self, message: &Message) -> String {
        format!("{}#{}", self.shared.queue, message.delivery_tag)
    }
}
