//! A Kafka consumer runner for idemkit: hand it a [`Processor`] (the effect's key from the
//! message, your handler as the action) and it consumes, at least once, with the effect once.
//!
//! What the runner does, so that no user writes it again:
//!
//! - **Order and concurrency.** One task per assigned partition: messages of one partition
//!   are handled one after another, in offset order (a message's handler starts once the
//!   one before it has returned a value, or has been settled); partitions run
//!   concurrently. Storing a result is not handling: the next message's handler runs while
//!   the previous result is on its way to the store (up to 64 on the way per partition),
//!   and offsets are still stored in order, each once its message is settled.
//! - **Commit after the effect.** An offset is stored only after its message was settled
//!   (acknowledged or dead-lettered), and committed from the stored offsets
//!   (`enable.auto.offset.store=false`, librdkafka's auto-commit of stored offsets; the runner
//!   sets both). A crash between the effect and the commit redelivers the message; the
//!   idemkit key replays the stored result instead of repeating the effect.
//! - **Settlement from one table** ([`idemkit_runner`]): a failing handler is retried
//!   in place, with the [`RetryPolicy`]'s backoff, up to its
//!   `max_deliveries`; then the message goes to the dead-letter topic, and the partition moves
//!   on. A message whose key function fails goes there at once. A concurrent duplicate in
//!   reject mode, and a store outage under fail-closed, are retried after the hint or the
//!   backoff without using up the budget.
//! - **Dead-letter records** keep the original key and payload, with the headers
//!   `idemkit-error` (the reason), `idemkit-topic`, `idemkit-partition` and `idemkit-offset`.
//!   The offset is stored only once the dead-letter record is acknowledged by the broker:
//!   a poison message is parked, never lost.
//! - **Offsets as messages settle.** Each message's offset is stored the moment it is
//!   settled, in offset order (a batch's first messages do not wait for its last), so a
//!   crash or a rebalance sends the next owner only what was not finished.
//! - **Panics.** A handler that panics is a failing handler: retried in place, then
//!   dead-lettered, like one that returned an error (its key is released). A panic in the
//!   [`on_settled`](KafkaRunner::on_settled) hook counts as a failure of that message too.
//!   A partition task that dies anyway stops the runner with
//!   [`RunnerError::PartitionFailed`]: a later offset of that partition is never stored
//!   past a message that was not settled.
//! - **Backpressure.** When a partition's queue is full (a slow handler, a store outage
//!   retried in place), that partition is paused (`Consumer::pause`) and resumed once its
//!   task has drained what was received: the runner keeps polling, so other partitions go
//!   on, revocations are seen, and the member is never evicted for not polling.
//! - **Revocation.** When partitions are revoked (a rebalance), their tasks take no new
//!   work: queued messages of those partitions are dropped (the next owner receives them from
//!   the last committed offset). A handler already running is **finished**, not cancelled
//!   (cancelling an effect half-way is worse than finishing it), and its result is stored
//!   under its key; its offset is not stored if the partition is gone. The new owner gets
//!   the message again and its call waits for, then replays, that result: one effect.
//!   The offsets stored so far are committed before the revocation completes (an
//!   asynchronous commit, so no runtime thread blocks on the broker).
//!   [`on_rebalance`](KafkaRunner::on_rebalance) is told of every assignment and
//!   revocation.
//! - **Shutdown.** [`KafkaRunner::run`] stops polling when its `shutdown` future completes,
//!   lets every running handler finish, and closes the consumer, which commits the stored
//!   offsets.
//! - **Consume-transform-produce.** With
//!   [`transactional_output`](KafkaRunner::transactional_output), each settled message's
//!   result makes records for other topics, committed with the input offsets in the
//!   partition's Kafka transaction instead of the offsets' auto-commit.
//!
//! The classic consumer-group protocol (eager rebalancing) is what this is tested with.
//!
//! # Example
//!
//! ```no_run
//! use idemkit_runner::Processor;
//! use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
//! use idemkit_kafka::KafkaRunner;
//! use rdkafka::ClientConfig;
//! use rdkafka::Message as _;
//! use rdkafka::message::OwnedMessage;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! // A RedisStore or PgStore in production.
//! let processor = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("mail.invoice")?)
//!     // The effect: the invoice of the order the message names, not the offset.
//!     .key(|m: &OwnedMessage| {
//!         let order = String::from_utf8_lossy(m.key().unwrap_or_default());
//!         Key::compose([order.as_ref(), "invoice"])
//!     })
//!     .handler(|m: OwnedMessage, _attempt| async move {
//!         // send the invoice mail; its id is stored and replayed to every redelivery
//!         Ok::<_, std::io::Error>(format!("em_{}", m.offset()))
//!     });
//! let mut config = ClientConfig::new();
//! config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "invoices");
//! KafkaRunner::new(config, ["orders.paid"], processor)
//!     .dead_letter_topic("orders.paid.dead")
//!     .run(async { let _ = tokio::signal::ctrl_c().await; })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Messages reach the handler as [`OwnedMessage`]s (detached: the handler may keep them).
//!
//! # TLS and SASL
//!
//! The `ClientConfig` is librdkafka's, passed through as it is: `security.protocol`
//! (`SSL`, `SASL_SSL`, `SASL_PLAINTEXT`), `ssl.ca.location`, `ssl.certificate.location`,
//! `ssl.key.location`, `sasl.mechanisms`, `sasl.username`, `sasl.password`. The dead-letter
//! producer takes the same `security.protocol`, `ssl.*` and `sasl.*` settings. This crate
//! builds librdkafka without OpenSSL (nothing to install for a plain-text cluster); for
//! `SSL`, `SASL_SSL` or SCRAM, enable rdkafka's `ssl-vendored` feature (OpenSSL built from
//! source) in the application's own manifest, which Cargo unifies with this crate's:
//!
//! ```toml
//! rdkafka = { version = "0.39", features = ["tokio", "ssl-vendored"] }
//! ```
//!
//! ```no_run
//! # fn f() {
//! let mut config = rdkafka::ClientConfig::new();
//! config
//!     .set("bootstrap.servers", "kafka.internal:9093")
//!     .set("group.id", "invoices")
//!     .set("security.protocol", "SASL_SSL")
//!     .set("ssl.ca.location", "/etc/idemkit/kafka-ca.pem")
//!     .set("sasl.mechanisms", "SCRAM-SHA-512")
//!     .set("sasl.username", "invoices")
//!     .set("sasl.password", "secret");
//! # drop(config); }
//! ```

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The Kafka client this crate is built on (its `ClientConfig`, `Message`, ...), so an
/// application uses the same version as the runner without naming it in its manifest.
pub use dedupe::{DEDUPE_HEADER, dedupe_headers, dedupe_key};
use idemkit_core::{Key, KeyError, Store};
pub use idemkit_runner::{Handle, Processed, Processor, RetryPolicy, Settlement};
use idemkit_runner::{Settler, Transport};
pub use rdkafka;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::TopicPartitionList;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Why a runner stopped, or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerError {
    /// The consumer or the dead-letter producer could not be created or subscribed (a bad
    /// configuration, an unknown topic pattern).
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The configuration lacks something the runner needs.
    #[error("the runner's configuration lacks {0}")]
    Config(&'static str),
    /// A partition's task died (a panic outside the handler and the hook): the runner
    /// stops rather than store offsets past messages that were never settled. Restarted,
    /// it resumes from the last stored offset.
    #[error("the task of partition {partition} of {topic} died")]
    PartitionFailed {
        /// The partition's topic.
        topic: String,
        /// The partition.
        partition: i32,
    },
}

/// What [`on_rebalance`](KafkaRunner::on_rebalance) is told: partitions assigned to this
/// member, or revoked from it (before the revocation completes).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RebalanceEvent {
    /// These `(topic, partition)`s are now this member's.
    Assigned(Vec<(String, i32)>),
    /// These are taken away: their tasks start nothing new.
    Revoked(Vec<(String, i32)>),
}

type RebalanceHook = Arc<dyn Fn(&RebalanceEvent) + Send + Sync>;

type UnsettledHook<T> = Arc<dyn Fn(&OwnedMessage, &Processed<T>) + Send + Sync>;

/// What the [`on_settled`](KafkaRunner::on_settled) hook is shown: one settled message
/// (`delivered` is always 1: Kafka keeps no delivery count).
pub type Settled<'a, T> = idemkit_runner::Settled<'a, OwnedMessage, T>;

/// The consumer runner. See the [crate docs](crate).
pub struct KafkaRunner<S, K, H: Handle<OwnedMessage>> {
    config: ClientConfig,
    topics: Vec<String>,
    settler: Settler<S, K, H, OwnedMessage>,
    dead_letter: Option<String>,
    on_rebalance: Option<RebalanceHook>,
    on_unsettled: Option<UnsettledHook<H::Output>>,
    queue_depth: usize,
    batch: usize,
    transactional: Option<Transactional<H::Output>>,
}

impl<S: fmt::Debug, K, H: Handle<OwnedMessage>> fmt::Debug for KafkaRunner<S, K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaRunner")
            .field("topics", &self.topics)
            .field("settler", &self.settler)
            .field("dead_letter", &self.dead_letter)
            .field("queue_depth", &self.queue_depth)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl<S, K, H> KafkaRunner<S, K, H>
where
    S: Store + Send + Sync + 'static,
    K: Fn(&OwnedMessage) -> Result<Key, KeyError> + Send + Sync + 'static,
    H: Handle<OwnedMessage> + 'static,
{
    /// A runner consuming `topics` with `config` (at least `bootstrap.servers` and
    /// `group.id`). The runner sets `enable.auto.offset.store=false` and
    /// `enable.auto.commit=true`: offsets are committed only once stored, and stored only
    /// after their message was settled.
    pub fn new<I, T>(config: ClientConfig, topics: I, processor: Processor<S, K, H>) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        KafkaRunner {
            config,
            topics: topics.into_iter().map(Into::into).collect(),
            settler: Settler::new(processor),
            dead_letter: None,
            on_rebalance: None,
            on_unsettled: None,
            queue_depth: 256,
            batch: 64,
            transactional: None,
        }
    }

    /// Dead-letters to `topic` (produced with the consumer's `bootstrap.servers` and its
    /// `security.protocol`, `ssl.*` and `sasl.*` settings). Without
    /// one, a dead-lettered message is logged at `error` and its offset stored: the
    /// partition moves on.
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter = Some(topic.into());
        self
    }

    /// Called with every settled message, after its dead-letter record (if any) was
    /// produced and before its offset is stored: for logging, metrics and tests.
    pub fn on_settled(
        mut self,
        hook: impl Fn(&Settled<'_, H::Output>) + Send + Sync + 'static,
    ) -> Self {
        self.settler = self.settler.on_settled(hook);
        self
    }

    /// Called on every assignment and revocation of partitions to this member (from the
    /// consumer's rebalance callback: keep it short).
    pub fn on_rebalance(mut self, hook: impl Fn(&RebalanceEvent) + Send + Sync + 'static) -> Self {
        self.on_rebalance = Some(Arc::new(hook));
        self
    }

    /// Called with each message whose call was started and ended after its partition was
    /// revoked (or the runner shut down): the call ran to its end, and its result is stored
    /// under its key for the partition's next owner to replay, but the message is not settled
    /// here (no offset stored, no dead letter, no [`on_settled`](Self::on_settled)). For
    /// logging and tests: with it, a call's end is seen, settled or not, except that of a
    /// message revoked while the runner retried it in place (its last retry's end).
    ///
    /// ```no_run
    /// # fn runner(r: idemkit_kafka::KafkaRunner<idemkit_core::MemoryStore,
    /// #     fn(&rdkafka::message::OwnedMessage) -> Result<idemkit_core::Key, idemkit_core::KeyError>,
    /// #     fn(rdkafka::message::OwnedMessage, idemkit_core::Attempt)
    /// #         -> std::future::Ready<Result<(), std::io::Error>>>) {
    /// use rdkafka::Message as _;
    ///
    /// let r = r.on_unsettled(|message, processed| {
    ///     let stored = processed.receipt.as_ref().is_some_and(|r| r.stored);
    ///     eprintln!("offset {} ended unsettled (result stored: {stored})", message.offset());
    /// });
    /// # }
    /// ```
    pub fn on_unsettled(
        mut self,
        hook: impl Fn(&OwnedMessage, &Processed<H::Output>) + Send + Sync + 'static,
    ) -> Self {
        self.on_unsettled = Some(Arc::new(hook));
        self
    }

    /// Batch reservation: up to `n` messages of one partition that have arrived while its
    /// previous ones were handled are reserved together, in one store round trip
    /// ([`Processor::process_batch`]), then handled one by one in offset order. 64 by
    /// default; 1 turns it off (one `begin` per message). A batch never waits for messages
    /// to arrive, so it adds no latency.
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = n.max(1);
        self
    }

    /// Consume-transform-produce: each settled message's result (fresh or replayed) makes
    /// `outputs`, produced in its partition's Kafka transaction, which commits them with the
    /// partition's input offsets, a batch (at most [`batch`](Self::batch) messages) at a
    /// time. A consumer reading the outputs with `isolation.level=read_committed`
    /// (librdkafka's default) sees each committed once. The runner turns `enable.auto.commit`
    /// off: offsets are committed by the transactions only.
    ///
    /// Each partition has a producer whose `transactional.id` is `{transactional_id}.{topic}.{partition}`
    /// (the cluster settings taken from the consumer's, as for the dead-letter producer): the
    /// partition's next owner, after a rebalance or a crash, opens the same id, which fences
    /// the previous owner and aborts its open transaction. Give each application (consumer
    /// group) its own `transactional_id`.
    ///
    /// The outputs are made from the result, after the call, and not inside the action: an
    /// aborted transaction takes its outputs away while the key's record stays completed,
    /// so an output produced by the action would never be produced again (its redelivery
    /// replays). The action keeps the external effects (an email, a charge) under the key.
    /// A dead-lettered message has no outputs; its dead letter is produced outside the
    /// transaction and acknowledged before the transaction commits its offset.
    ///
    /// A transaction that fails to commit while the runner runs stops it with
    /// [`RunnerError::PartitionFailed`]; restarted, it consumes from the last committed
    /// transaction (the results replay, the outputs are produced again). A revocation aborts
    /// the open transaction (its messages go to the partition's next owner, which replays
    /// them); a shutdown lets the running handlers finish and commits what was settled (a
    /// commit that fails then is logged, and those messages come again after a restart).
    /// Keep `transaction.timeout.ms` (the broker's) above a batch's handling time.
    /// `outputs` runs in the partition's task: one that panics stops the runner
    /// ([`RunnerError::PartitionFailed`]), its transaction uncommitted.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
    /// use idemkit_kafka::{KafkaRunner, Output, Processor, dedupe_headers, dedupe_key};
    /// use rdkafka::ClientConfig;
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let processor = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("invoice.issue")?)
    ///     .key(dedupe_key)
    ///     // The external effect, once under the key: the invoice number it got.
    ///     .handler(|_m, _attempt| async move { Ok::<_, std::io::Error>("inv-1001".to_string()) });
    /// let mut config = ClientConfig::new();
    /// config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "invoicing");
    /// KafkaRunner::new(config, ["orders.paid"], processor)
    ///     .transactional_output("invoicing", |m, receipt| {
    ///         let id = dedupe_key(m).map(|k| k.as_str().to_string()).unwrap_or_default();
    ///         vec![Output::new("invoices.issued", receipt.value.clone())
    ///             .headers(dedupe_headers(None, &format!("{id}.issued")))]
    ///     })
    ///     .run(async { let _ = tokio::signal::ctrl_c().await; })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn transactional_output(
        mut self,
        transactional_id: impl Into<String>,
        outputs: impl Fn(&OwnedMessage, &idemkit_core::Receipt<H::Output>) -> Vec<Output>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.transactional = Some(Transactional {
            id: transactional_id.into(),
            outputs: Arc::new(outputs),
        });
        self
    }

    /// How many received messages of one partition may wait for its task (256 by default).
    /// When a partition's queue is full, that partition is paused until its task catches
    /// up; polling goes on for the others.
    pub fn queue_depth(mut self, depth: usize) -> Self {
        self.queue_depth = depth.max(1);
        self
    }

    /// Consumes until `shutdown` completes; then lets the running handlers finish and closes
    /// the consumer (committing what was stored).
    ///
    /// # Errors
    ///
    /// [`RunnerError`] if the consumer or producer cannot be created or subscribed. Errors
    /// while consuming (a broker going away) are logged and retried by librdkafka.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), RunnerError> {
        let mut config = self.config.clone();
        if config.get("group.id").is_none() {
            return Err(RunnerError::Config("group.id"));
        }
        let commits_by_transactions = self.transactional.is_some();
        config
            .set("enable.auto.offset.store", "false")
            // With transactional output, the transactions commit the offsets.
            .set(
                "enable.auto.commit",
                if commits_by_transactions {
                    "false"
                } else {
                    "true"
                },
            );
        let revoked = Generations::default();
        let consumer: Arc<StreamConsumer<RunnerContext>> =
            Arc::new(config.create_with_context(RunnerContext {
                generations: revoked.clone(),
                on_rebalance: self.on_rebalance.clone(),
            })?);
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        let dead_letter = match &self.dead_letter {
            Some(topic) => {
                let producer: FutureProducer = cluster(&config)?.set("linger.ms", "0").create()?;
                Some(DeadLetter {
                    producer,
                    topic: topic.clone(),
                })
            }
            None => None,
        };
        let transactional = match self.transactional {
            Some(t) => Some((t, cluster(&config)?)),
            None => None,
        };
        let drained = Arc::new(tokio::sync::Notify::new());
        let shared = Arc::new(Shared {
            consumer: consumer.clone(),
            settler: self.settler,
            dead_letter,
            generations: revoked.clone(),
            batch: self.batch,
            drained: drained.clone(),
            on_unsettled: self.on_unsettled,
            transactional,
        });

        let mut partitions: HashMap<(String, i32), Partition> = HashMap::new();
        let mut tasks = JoinSet::new();
        let mut failed = None;
        tokio::pin!(shutdown);
        loop {
            // A partition task took messages off a full queue: move what waits into it.
            let room = drained.notified();
            let overflowing = partitions.values().any(|p| !p.overflow.is_empty());
            let message = tokio::select! {
                biased;
                () = &mut shutdown => break,
                Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                    if let Some(tp) = died(done, &partitions, &revoked) {
                        failed = Some(tp);
                        break;
                    }
                    continue;
                }
                () = room, if overflowing => {
                    refill(&consumer, &mut partitions, &revoked);
                    continue;
                }
                m = consumer.recv() => m,
            };
            let message = match message {
                Ok(m) => m.detach(),
                Err(e) => {
                    tracing::warn!(error = %e, "kafka runner: receive failed");
                    continue;
                }
            };
            let tp = (message.topic().to_owned(), message.partition());
            // Read after recv: a revocation is handled inside recv, so a message received
            // after it is tagged with the new generation.
            let generation = revoked.get(&tp);
            let current = partitions
                .get(&tp)
                .is_some_and(|p| p.generation == generation);
            if !current {
                let (tx, rx) = mpsc::channel(self.queue_depth);
                let handle =
                    tasks.spawn(partition_task(shared.clone(), tp.clone(), generation, rx));
                let stale = partitions.insert(
                    tp.clone(),
                    Partition {
                        generation,
                        tx,
                        overflow: VecDeque::new(),
                        paused: false,
                        task: handle.id(),
                    },
                );
                if stale.is_some_and(|p| p.paused) {
                    resume(&consumer, &tp);
                }
            }
            let partition = partitions.get_mut(&tp).expect("inserted above");
            if !partition.overflow.is_empty() {
                // Paused, and this one was fetched before the pause took effect: behind the
                // others, in order.
                partition.overflow.push_back(message);
                continue;
            }
            match partition.tx.try_send(message) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(message)) => {
                    partition.overflow.push_back(message);
                    if !partition.paused {
                        partition.paused = true;
                        pause(&consumer, &tp);
                    }
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    // The task ended while its partition is ours: it died (a revoked
                    // task is replaced above, as its generation changed).
                    failed = Some(tp);
                    break;
                }
            }
        }
        // No new work: close every queue; running handlers finish, queued messages are
        // dropped (they were not stored, so they are delivered again after a restart).
        shared.generations.revoke_all();
        drop(partitions);
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done
                && e.is_panic()
            {
                tracing::error!(error = %e, "kafka runner: a partition task panicked");
            }
        }
        drop(shared);
        // Commit what was stored, off the async threads (a broker round trip); with
        // transactional output nothing is stored, the transactions committed it.
        if !commits_by_transactions {
            let closing = consumer.clone();
            let committed = tokio::task::spawn_blocking(move || {
                closing.commit_consumer_state(rdkafka::consumer::CommitMode::Sync)
            })
            .await;
            if let Ok(Err(e)) = committed {
                tracing::debug!(error = %e, "kafka runner: final commit");
            }
        }
        match failed {
            Some((topic, partition)) => Err(RunnerError::PartitionFailed { topic, partition }),
            None => Ok(()),
        }
    }
}

mod context;
mod dead_letter;
mod dedupe;
mod partition;
mod transaction;

use context::*;
use dead_letter::*;
use partition::*;
pub use transaction::Output;
use transaction::{PartitionTxn, Transactional};

/// A producer's settings for the consumer's cluster: its `bootstrap.servers` and its way in,
/// so a TLS or SASL cluster takes the dead letters and the outputs too (a producer without
/// them would talk plain text and fail).
fn cluster(config: &ClientConfig) -> Result<ClientConfig, RunnerError> {
    let bootstrap = config
        .get("bootstrap.servers")
        .ok_or(RunnerError::Config("bootstrap.servers"))?;
    let mut producer = ClientConfig::new();
    producer.set("bootstrap.servers", bootstrap);
    for (key, value) in config.config_map() {
        if key == "security.protocol"
            || key.starts_with("ssl.")
            || key.starts_with("ssl_")
            || key.starts_with("sasl.")
            || key == "client.dns.lookup"
        {
            producer.set(key, value);
        }
    }
    Ok(producer)
}

struct Shared<S, K, H: Handle<OwnedMessage>> {
    consumer: Arc<StreamConsumer<RunnerContext>>,
    settler: Settler<S, K, H, OwnedMessage>,
    dead_letter: Option<DeadLetter>,
    generations: Generations,
    batch: usize,
    /// Notified whenever a partition task takes messages off its queue: room for what waits
    /// in the receive loop's overflow.
    drained: Arc<tokio::sync::Notify>,
    on_unsettled: Option<UnsettledHook<H::Output>>,
    /// Transactional output, with the producers' cluster settings.
    transactional: Option<(Transactional<H::Output>, ClientConfig)>,
}
