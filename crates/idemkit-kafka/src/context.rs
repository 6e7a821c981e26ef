//! The consumer's context: rebalance callbacks, the per-partition generations that stop
//! a revoked partition's task, and pausing a partition whose queue is full.

use super::*;

pub(crate) fn partition_list(tp: &(String, i32)) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    list.add_partition(&tp.0, tp.1);
    list
}

pub(crate) fn pause(consumer: &StreamConsumer<RunnerContext>, tp: &(String, i32)) {
    tracing::debug!(
        topic = tp.0,
        partition = tp.1,
        "kafka runner: queue full, pausing"
    );
    if let Err(e) = consumer.pause(&partition_list(tp)) {
        tracing::warn!(error = %e, topic = tp.0, partition = tp.1, "kafka runner: pause failed");
    }
}

pub(crate) fn resume(consumer: &StreamConsumer<RunnerContext>, tp: &(String, i32)) {
    if let Err(e) = consumer.resume(&partition_list(tp)) {
        tracing::debug!(error = %e, topic = tp.0, partition = tp.1, "kafka runner: resume failed");
    }
}

/// Per-partition revocation counters: a partition task works only while its partition's
/// generation is the one it was started with.
#[derive(Clone, Default)]
pub(crate) struct Generations {
    pub(crate) inner: Arc<Mutex<GenerationsInner>>,
}

#[derive(Default)]
pub(crate) struct GenerationsInner {
    pub(crate) by_partition: HashMap<(String, i32), u64>,
    /// Bumped by shutdown: every partition's generation is stale.
    pub(crate) epoch: u64,
}

impl Generations {
    pub(crate) fn get(&self, tp: &(String, i32)) -> u64 {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.epoch + inner.by_partition.get(tp).copied().unwrap_or(0)
    }

    pub(crate) fn revoke(&self, tp: (String, i32)) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        *inner.by_partition.entry(tp).or_insert(0) += 1;
    }

    /// Whether `tp` is still assigned to this member as it was at `generation` (its task's):
    /// a shutdown leaves it so until the consumer closes, a revocation does not.
    pub(crate) fn assigned(&self, tp: &(String, i32), generation: u64) -> bool {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.by_partition.get(tp).copied().unwrap_or(0) == generation & u64::from(u32::MAX)
    }

    pub(crate) fn revoke_all(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.epoch += 1 << 32;
    }
}

pub(crate) struct RunnerContext {
    pub(crate) generations: Generations,
    pub(crate) on_rebalance: Option<RebalanceHook>,
}

impl ClientContext for RunnerContext {}

pub(crate) fn partitions_of(list: &TopicPartitionList) -> Vec<(String, i32)> {
    list.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl RunnerContext {
    fn tell(&self, event: &RebalanceEvent) {
        if let Some(hook) = &self.on_rebalance
            && let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| hook(event)))
        {
            tracing::error!(
                panic = idemkit_core::unwind::message(&*panic),
                "kafka runner: the on_rebalance hook panicked"
            );
        }
    }
}

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
            // last settled message, not after the last auto-commit. Asynchronous: this runs
            // inside `recv`, on a runtime thread, which must not block on the broker.
            if let Err(e) = consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Async) {
                tracing::debug!(error = %e, "kafka runner: commit on revocation");
            }
            self.tell(&RebalanceEvent::Revoked(partitions_of(list)));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(list) = rebalance {
            // A partition paused under an earlier assignment (its queue was full when it
            // was revoked) must fetch again now that it is ours.
            if let Err(e) = consumer.resume(list) {
                tracing::debug!(error = %e, "kafka runner: resume on assignment");
            }
            self.tell(&RebalanceEvent::Assigned(partitions_of(list)));
        }
    }
}
