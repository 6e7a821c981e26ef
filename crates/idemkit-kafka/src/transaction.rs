//! Transactional output (consume-transform-produce): each partition's outputs and its input
//! offsets committed in one Kafka transaction (ARCHITECTURE, "One effect key across hops").
//!
//! Why the outputs are made from the settled result and not inside the action: a transaction
//! that aborts (the worker died before its commit, a rebalance fenced it) takes its outputs
//! with it, while the idemkit record of the action stays completed. Produced inside the
//! action, the redelivery would replay the record and never produce them again: lost. Made
//! from the receipt (fresh or replayed) on every delivery, the redelivery produces them again
//! in the next transaction, with the offsets: one copy committed.

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::producer::Producer as _;

use super::*;

/// One record a message's result produces, in its partition's transaction (see
/// [`KafkaRunner::transactional_output`]).
///
/// ```
/// use idemkit_kafka::{Output, dedupe_headers};
/// let out = Output::new("invoices.requested", b"order-9".to_vec())
///     .key(b"order-9".to_vec())
///     .headers(dedupe_headers(None, "idk1_abc"));
/// assert_eq!(out.topic, "invoices.requested");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Output {
    /// The topic it goes to.
    pub topic: String,
    /// Its key (which picks its partition), if any.
    pub key: Option<Vec<u8>>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its headers, if any ([`dedupe_headers`] names it for the next consumer).
    pub headers: Option<OwnedHeaders>,
}

impl Output {
    /// A record for `topic` with `payload`, no key and no headers.
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Output {
            topic: topic.into(),
            key: None,
            payload: payload.into(),
            headers: None,
        }
    }

    /// With this key.
    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// With these headers.
    pub fn headers(mut self, headers: OwnedHeaders) -> Self {
        self.headers = Some(headers);
        self
    }
}

/// The outputs of a settled message from its result.
pub(crate) type Outputs<T> =
    Arc<dyn Fn(&OwnedMessage, &idemkit_core::Receipt<T>) -> Vec<Output> + Send + Sync>;

/// The runner's transactional output: the base of its transactional ids and the outputs.
pub(crate) struct Transactional<T> {
    pub(crate) id: String,
    pub(crate) outputs: Outputs<T>,
}

impl<T> Clone for Transactional<T> {
    fn clone(&self) -> Self {
        Transactional {
            id: self.id.clone(),
            outputs: self.outputs.clone(),
        }
    }
}

/// How long a blocking transaction call may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A partition task's transactional producer. Its id is the runner's base id, the topic and
/// the partition: the partition's next owner (after a rebalance or a crash) opens a
/// producer with the same id, which fences this one and aborts its open transaction.
pub(crate) struct PartitionTxn {
    tp: (String, i32),
    producer: FutureProducer,
    /// A transaction is open, and the last offset it covers.
    open: Mutex<Option<i64>>,
}

impl PartitionTxn {
    /// Creates the producer and initialises its transactions (a broker round trip, off the
    /// async threads).
    pub(crate) async fn start(
        cluster: ClientConfig,
        base: &str,
        tp: &(String, i32),
    ) -> Result<Self, KafkaError> {
        let mut config = cluster;
        config
            .set("transactional.id", format!("{base}.{}.{}", tp.0, tp.1))
            .set("linger.ms", "0");
        let producer: FutureProducer = config.create()?;
        let init = producer.clone();
        blocking(move || init.init_transactions(TIMEOUT)).await?;
        Ok(PartitionTxn {
            tp: tp.clone(),
            producer,
            open: Mutex::new(None),
        })
    }

    /// Produces a settled message's outputs in the open transaction (opening one if none is)
    /// and counts its offset in it; each record's delivery awaited.
    pub(crate) async fn add(&self, offset: i64, outputs: Vec<Output>) -> Result<(), KafkaError> {
        {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            if open.is_none() {
                self.producer.begin_transaction()?;
            }
            *open = Some(offset);
        }
        for out in &outputs {
            let mut record = FutureRecord::to(&out.topic).payload(&out.payload[..]);
            if let Some(key) = &out.key {
                record = record.key(&key[..]);
            }
            if let Some(headers) = &out.headers {
                record = record.headers(headers.clone());
            }
            self.producer
                .send(record, rdkafka::util::Timeout::After(TIMEOUT))
                .await
                .map_err(|(e, _)| e)?;
        }
        Ok(())
    }

    /// Commits the open transaction with the offset after its last message (nothing if none
    /// is open).
    pub(crate) async fn commit(
        &self,
        group: Option<ConsumerGroupMetadata>,
    ) -> Result<(), KafkaError> {
        let tp = &self.tp;
        let Some(last) = *self.open.lock().unwrap_or_else(PoisonError::into_inner) else {
            return Ok(());
        };
        // Only a consumer without a `group.id` has none, and the runner refuses those.
        let group = group.ok_or(KafkaError::Global(
            rdkafka::types::RDKafkaErrorCode::InvalidGroupId,
        ))?;
        let mut offsets = TopicPartitionList::new();
        offsets.add_partition_offset(&tp.0, tp.1, rdkafka::Offset::Offset(last + 1))?;
        let producer = self.producer.clone();
        let committed = blocking(move || {
            producer.send_offsets_to_transaction(&offsets, &group, TIMEOUT)?;
            producer.commit_transaction(TIMEOUT)
        })
        .await;
        if committed.is_ok() {
            // Still open otherwise: aborted next.
            *self.open.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
        committed
    }

    /// Ends the open transaction, if any: committed while the partition is still this
    /// member's (`assigned`: a shutdown), aborted if it was revoked or the commit failed.
    pub(crate) async fn close(&self, assigned: bool, group: Option<ConsumerGroupMetadata>) {
        if assigned && let Err(e) = self.commit(group).await {
            tracing::warn!(error = %e, topic = self.tp.0, partition = self.tp.1, "kafka runner: the last transaction did not commit");
        }
        self.abort().await;
    }

    /// Aborts the open transaction, if any: its outputs are discarded and its offsets left
    /// uncommitted, so its messages are delivered again (their results replayed).
    pub(crate) async fn abort(&self) {
        let was_open = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .is_some();
        if was_open {
            let producer = self.producer.clone();
            if let Err(e) = blocking(move || producer.abort_transaction(TIMEOUT)).await {
                tracing::debug!(error = %e, "kafka runner: abort of an open transaction");
            }
        }
    }
}

/// Runs a blocking librdkafka call on the blocking pool.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, KafkaError> {
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}
