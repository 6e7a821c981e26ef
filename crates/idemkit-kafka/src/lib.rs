//! A Kafka consumer runner for idemkit: hand it a [`Processor`] (the effect's key from the
//! message, your handler as the action) and it consumes, at least once, with the effect once.
//!
//! What the runner does, so that no user writes it again:
//!
//! - **Order and concurrency.** One task per assigned partition: messages of one partition
//!   are handled one after another, in offset order; partitions run concurrently.
//! - **Commit after the effect.** An offset is stored only after its message was settled
//!   (acknowledged or dead-lettered), and committed from the stored offsets
//!   (`enable.auto.offset.store=false`, librdkafka's auto-commit of stored offsets; the runner
//!   sets both). A crash between the effect and the commit redelivers the message; the
//!   idemkit key replays the stored result instead of repeating the effect.
//! - **Settlement from one table** ([`idemkit_core::consume`]): a failing handler is retried
//!   in place, with the [`RetryPolicy`](idemkit_core::consume::RetryPolicy)'s backoff, up to its
//!   `max_deliveries`; then the message goes to the dead-letter topic, and the partition moves
//!   on. A message whose key function fails goes there at once. A concurrent duplicate in
//!   reject mode, and a store outage under fail-closed, are retried after the hint or the
//!   backoff without using up the budget.
//! - **Dead-letter records** keep the original key and payload, with the headers
//!   `idemkit-error` (the reason), `idemkit-topic`, `idemkit-partition` and `idemkit-offset`.
//!   The offset is stored only once the dead-letter record is acknowledged by the broker:
//!   a poison message is parked, never lost.
//! - **Revocation.** When partitions are revoked (a rebalance), their tasks take no new
//!   work: queued messages of those partitions are dropped (the next owner receives them from
//!   the last committed offset). A handler already running is **finished**, not cancelled
//!   (cancelling an effect half-way is worse than finishing it), and its result is stored
//!   under its key; its offset is not stored if the partition is gone. The new owner gets
//!   the message again and its call waits for, then replays, that result: one effect.
//!   The offsets stored so far are committed (synchronously) before the revocation
//!   completes.
//! - **Shutdown.** [`KafkaRunner::run`] stops polling when its `shutdown` future completes,
//!   lets every running handler finish, and closes the consumer, which commits the stored
//!   offsets.
//!
//! The classic consumer-group protocol (eager rebalancing) is what this is tested with.
//!
//! # Example
//!
//! ```no_run
//! use idemkit_core::consume::Processor;
//! use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
//! use idemkit_kafka::KafkaRunner;
//! use rdkafka::ClientConfig;
//! use rdkafka::Message as _;
//! use rdkafka::message::OwnedMessage;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let processor = Processor::new(
//!     Coordinator::new(MemoryStore::new()), // a RedisStore or PgStore in production
//!     Operation::new("mail.invoice")?,
//!     // The effect: the invoice of the order the message names, not the offset.
//!     |m: &OwnedMessage| {
//!         let order = String::from_utf8_lossy(m.key().unwrap_or_default());
//!         Key::compose([order.as_ref(), "invoice"])
//!     },
//!     |m: OwnedMessage, _attempt| async move {
//!         // send the invoice mail; its id is stored and replayed to every redelivery
//!         Ok::<_, std::io::Error>(format!("em_{}", m.offset()))
//!     },
//! );
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

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idemkit_core::consume::{Handle, Processed, Processor, Settlement};
use idemkit_core::{Key, KeyError, Store};
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
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
}

/// What the [`on_settled`](KafkaRunner::on_settled) hook is shown: one settled message.
#[derive(Debug)]
#[non_exhaustive]
pub struct Settled<'a, T> {
    /// The message.
    pub message: &'a OwnedMessage,
    /// Its settlement and the call's receipt.
    pub processed: &'a Processed<T>,
}

type Hook<T> = Arc<dyn Fn(&Settled<'_, T>) + Send + Sync>;

/// The consumer runner. See the [crate docs](crate).
pub struct KafkaRunner<S, K, H: Handle<OwnedMessage>> {
    config: ClientConfig,
    topics: Vec<String>,
    processor: Arc<Processor<S, K, H>>,
    dead_letter: Option<String>,
    on_settled: Option<Hook<H::Output>>,
    queue_depth: usize,
    batch: usize,
}

impl<S: fmt::Debug, K, H: Handle<OwnedMessage>> fmt::Debug for KafkaRunner<S, K, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaRunner")
            .field("topics", &self.topics)
            .field("processor", &self.processor)
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
            processor: Arc::new(processor),
            dead_letter: None,
            on_settled: None,
            queue_depth: 256,
            batch: 64,
        }
    }

    /// Dead-letters to `topic` (produced with the consumer's `bootstrap.servers`). Without
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
        self.on_settled = Some(Arc::new(hook));
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

    /// How many received messages of one partition may wait for its task (256 by default).
    /// When a partition's queue is full, polling waits: a slow partition slows the others.
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
        config
            .set("enable.auto.offset.store", "false")
            .set("enable.auto.commit", "true");
        let revoked = Generations::default();
        let consumer: Arc<StreamConsumer<RunnerContext>> =
            Arc::new(config.create_with_context(RunnerContext {
                generations: revoked.clone(),
            })?);
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        let dead_letter = match &self.dead_letter {
            Some(topic) => {
                let bootstrap = config
                    .get("bootstrap.servers")
                    .ok_or(RunnerError::Config("bootstrap.servers"))?;
                let producer: FutureProducer = ClientConfig::new()
                    .set("bootstrap.servers", bootstrap)
                    .set("linger.ms", "0")
                    .create()?;
                Some(Arc::new(DeadLetter {
                    producer,
                    topic: topic.clone(),
                }))
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            consumer: consumer.clone(),
            processor: self.processor.clone(),
            dead_letter,
            on_settled: self.on_settled.clone(),
            generations: revoked.clone(),
            batch: self.batch,
        });

        let mut partitions: HashMap<(String, i32), (u64, mpsc::Sender<OwnedMessage>)> =
            HashMap::new();
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let message = tokio::select! {
                biased;
                () = &mut shutdown => break,
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
            let sender = match partitions.get(&tp) {
                Some((g, tx)) if *g == generation && !tx.is_closed() => tx.clone(),
                _ => {
                    let (tx, rx) = mpsc::channel(self.queue_depth);
                    tasks.spawn(partition_task(shared.clone(), tp.clone(), generation, rx));
                    partitions.insert(tp, (generation, tx.clone()));
                    tx
                }
            };
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = sender.send(message) => {}
            }
            // Reap finished tasks as we go, so a long run does not keep them.
            while tasks.try_join_next().is_some() {}
        }
        // No new work: close every queue; running handlers finish, queued messages are
        // dropped (they were not stored, so they are delivered again after a restart).
        shared.generations.revoke_all();
        drop(partitions);
        while tasks.join_next().await.is_some() {}
        drop(shared);
        // Dropping the last consumer closes it: the stored offsets are committed.
        if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
            tracing::debug!(error = %e, "kafka runner: final commit");
        }
        Ok(())
    }
}

struct DeadLetter {
    producer: FutureProducer,
    topic: String,
}

struct Shared<S, K, H: Handle<OwnedMessage>> {
    consumer: Arc<StreamConsumer<RunnerContext>>,
    processor: Arc<Processor<S, K, H>>,
    dead_letter: Option<Arc<DeadLetter>>,
    on_settled: Option<Hook<H::Output>>,
    generations: Generations,
    batch: usize,
}

/// Per-partition revocation counters: a partition task works only while its partition's
/// generation is the one it was started with.
#[derive(Clone, Default)]
struct Generations {
    inner: Arc<Mutex<GenerationsInner>>,
}

#[derive(Default)]
struct GenerationsInner {
    by_partition: HashMap<(String, i32), u64>,
    /// Bumped by shutdown: every partition's generation is stale.
    epoch: u64,
}

impl Generations {
    fn get(&self, tp: &(String, i32)) -> u64 {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.epoch + inner.by_partition.get(tp).copied().unwrap_or(0)
    }

    fn revoke(&self, tp: (String, i32)) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        *inner.by_partition.entry(tp).or_insert(0) += 1;
    }

    fn revoke_all(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.epoch += 1 << 32;
    }
}

struct RunnerContext {
    generations: Generations,
}

impl ClientContext for RunnerContext {}

impl ConsumerContext for RunnerContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(list) = rebalance {
            for e in list.elements() {
                tracing::debug!(
                    topic = e.topic(),
                    partition = e.partition(),
                    "kafka runner: revoked"
                );
                self.generations
                    .revoke((e.topic().to_owned(), e.partition()));
            }
            // Commit what is done before the partitions go: the next owner starts after the
            // last settled message, not after the last auto-commit.
            if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync) {
                tracing::debug!(error = %e, "kafka runner: commit on revocation");
            }
        }
    }
}

async fn partition_task<S, K, H>(
    shared: Arc<Shared<S, K, H>>,
    tp: (String, i32),
    generation: u64,
    mut queue: mpsc::Receiver<OwnedMessage>,
) where
    S: Store + Send + Sync + 'static,
    K: Fn(&OwnedMessage) -> Result<Key, KeyError> + Send + Sync + 'static,
    H: Handle<OwnedMessage> + 'static,
{
    let current = || shared.generations.get(&tp) == generation;
    let batch = shared.batch;
    let mut pending: std::collections::VecDeque<OwnedMessage> = std::collections::VecDeque::new();
    loop {
        if pending.is_empty() {
            match queue.recv().await {
                Some(m) => pending.push_back(m),
                None => break,
            }
        }
        // What has arrived for this partition meanwhile joins the batch (never waits for
        // more: no latency is added when messages come one at a time).
        while pending.len() < batch {
            match queue.try_recv() {
                Ok(m) => pending.push_back(m),
                Err(_) => break,
            }
        }
        if !current() {
            break;
        }
        let results = if pending.len() > 1 {
            let messages: Vec<OwnedMessage> = pending.iter().cloned().collect();
            shared
                .processor
                .process_batch_while(&messages, &current)
                .await
        } else {
            vec![shared.processor.process(&pending[0], 1).await]
        };
        if results.is_empty() {
            break; // revoked before the batch started
        }
        for processed in results {
            let message = pending
                .pop_front()
                .expect("one result per message, in order");
            let Some(processed) = retry_in_place(&shared, &message, processed, &current).await
            else {
                return; // revoked while retrying: the next owner has it
            };
            if let Settlement::DeadLetter { reason } = &processed.settlement
                && !dead_letter(&shared, &message, reason, &current).await
            {
                return;
            }
            if let Some(hook) = &shared.on_settled {
                hook(&Settled {
                    message: &message,
                    processed: &processed,
                });
            }
            if current()
                && let Err(e) = shared.consumer.store_offset(&tp.0, tp.1, message.offset())
            {
                tracing::debug!(error = %e, topic = tp.0, partition = tp.1, "kafka runner: offset not stored");
            }
        }
    }
}

/// Retries a message whose first delivery asked for it, in place (the partition waits: its
/// order is kept), until it settles for good. `None` if the partition was revoked meanwhile.
async fn retry_in_place<S, K, H>(
    shared: &Shared<S, K, H>,
    message: &OwnedMessage,
    mut processed: Processed<H::Output>,
    current: &impl Fn() -> bool,
) -> Option<Processed<H::Output>>
where
    S: Store + Send + Sync + 'static,
    K: Fn(&OwnedMessage) -> Result<Key, KeyError> + Send + Sync + 'static,
    H: Handle<OwnedMessage> + 'static,
{
    let mut failures = 0u32;
    loop {
        let Settlement::Retry { after } = processed.settlement else {
            return Some(processed);
        };
        if processed.error == Some(idemkit_core::ErrorKind::Action) {
            failures += 1;
        }
        if !current() {
            return None;
        }
        tokio::time::sleep(after).await;
        if !current() {
            return None;
        }
        processed = shared.processor.process(message, failures + 1).await;
    }
}

/// Produces the dead-letter record, retrying until the broker takes it (a dead letter that
/// was not written must not be acknowledged). False if the partition was revoked meanwhile.
async fn dead_letter<S, K, H: Handle<OwnedMessage>>(
    shared: &Shared<S, K, H>,
    message: &OwnedMessage,
    reason: &str,
    current: &impl Fn() -> bool,
) -> bool {
    let Some(dl) = &shared.dead_letter else {
        tracing::error!(
            topic = message.topic(),
            partition = message.partition(),
            offset = message.offset(),
            reason,
            "kafka runner: dead-lettered (no dead-letter topic: dropped)"
        );
        return true;
    };
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    let mut headers = OwnedHeaders::new()
        .insert(Header {
            key: "idemkit-error",
            value: Some(reason),
        })
        .insert(Header {
            key: "idemkit-topic",
            value: Some(message.topic()),
        })
        .insert(Header {
            key: "idemkit-partition",
            value: Some(&partition),
        })
        .insert(Header {
            key: "idemkit-offset",
            value: Some(&offset),
        });
    if let Some(original) = message.headers() {
        for h in original.iter() {
            headers = headers.insert(Header {
                key: h.key,
                value: h.value,
            });
        }
    }
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut record = FutureRecord::to(&dl.topic).headers(headers.clone());
        if let Some(k) = message.key() {
            record = record.key(k);
        }
        if let Some(p) = message.payload() {
            record = record.payload(p);
        }
        match dl.producer.send(record, Duration::from_secs(5)).await {
            Ok(_) => return true,
            Err((e, _)) => {
                tracing::warn!(error = %e, topic = dl.topic, "kafka runner: dead-letter produce failed; retrying");
                if !current() {
                    return false;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
