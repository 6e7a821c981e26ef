//! An in-process at-least-once queue with visibility timeouts, for the demo.
//!
//! A received message stays invisible for the visibility timeout; if it is not acked by then
//! it becomes visible again and is delivered anew, exactly as SQS or a Redis-list queue with
//! a processing list would do. Acks and nacks name a delivery: only the latest delivery of a
//! message can ack it (an ack from a worker whose visibility timeout expired is stale and
//! ignored, like an expired receipt handle).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep_until};

/// One delivery of a message.
#[derive(Debug, Clone)]
pub struct Delivery<J> {
    /// The message.
    pub job: J,
    message: u64,
    delivery: u64,
}

#[derive(Debug)]
struct Message<J> {
    job: J,
    latest_delivery: u64,
    /// When an in-flight delivery's visibility ends; `None` while ready.
    invisible_until: Option<Instant>,
}

#[derive(Debug)]
struct State<J> {
    messages: BTreeMap<u64, Message<J>>,
    ready: VecDeque<u64>,
    next_id: u64,
    deliveries: usize,
    dead_letters: Vec<J>,
}

/// The queue. Cloning shares it.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use idemkit_demo::queue::Queue;
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let queue = Queue::new(Duration::from_millis(10));
/// queue.push("job-1");
/// let first = queue.receive().await.unwrap();
/// // No ack: after the visibility timeout the same job is delivered again.
/// let again = queue.receive().await.unwrap();
/// assert_eq!((first.job, again.job), ("job-1", "job-1"));
/// assert!(!queue.ack(&first)); // a stale delivery cannot ack
/// assert!(queue.ack(&again));
/// assert_eq!(queue.deliveries(), 2);
/// # });
/// ```
#[derive(Debug)]
pub struct Queue<J> {
    state: Arc<Mutex<State<J>>>,
    pushed: Arc<Notify>,
    visibility: Duration,
}

impl<J> Clone for Queue<J> {
    fn clone(&self) -> Self {
        Queue {
            state: self.state.clone(),
            pushed: self.pushed.clone(),
            visibility: self.visibility,
        }
    }
}

impl<J: Clone> Queue<J> {
    /// An empty queue whose deliveries stay invisible for `visibility`.
    pub fn new(visibility: Duration) -> Self {
        Queue {
            state: Arc::new(Mutex::new(State {
                messages: BTreeMap::new(),
                ready: VecDeque::new(),
                next_id: 1,
                deliveries: 0,
                dead_letters: Vec::new(),
            })),
            pushed: Arc::new(Notify::new()),
            visibility,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<J>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enqueues a job.
    pub fn push(&self, job: J) {
        let mut s = self.lock();
        let id = s.next_id;
        s.next_id += 1;
        s.messages.insert(
            id,
            Message {
                job,
                latest_delivery: 0,
                invisible_until: None,
            },
        );
        s.ready.push_back(id);
        drop(s);
        self.pushed.notify_waiters();
    }

    /// The next delivery if one is visible now.
    pub fn try_receive(&self) -> Option<Delivery<J>> {
        self.receive_at(Instant::now()).ok()
    }

    /// Delivers the next visible message, waiting for one (a push or a visibility timeout);
    /// `None` when the queue holds no messages at all.
    pub async fn receive(&self) -> Option<Delivery<J>> {
        loop {
            let pushed = self.pushed.notified();
            match self.receive_at(Instant::now()) {
                Ok(d) => return Some(d),
                Err(None) => return None,
                Err(Some(next_visible)) => {
                    tokio::select! {
                        () = sleep_until(next_visible) => {}
                        () = pushed => {}
                    }
                }
            }
        }
    }

    /// `Err(None)`: empty; `Err(Some(t))`: nothing visible before `t`.
    fn receive_at(&self, now: Instant) -> Result<Delivery<J>, Option<Instant>> {
        let mut s = self.lock();
        // Expired visibility timeouts make messages visible again, in id order.
        let expired: Vec<u64> = s
            .messages
            .iter()
            .filter(|(_, m)| m.invisible_until.is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(m) = s.messages.get_mut(&id) {
                m.invisible_until = None;
            }
            s.ready.push_back(id);
        }
        while let Some(id) = s.ready.pop_front() {
            s.deliveries += 1;
            let delivery = s.deliveries as u64;
            let until = now + self.visibility;
            let Some(m) = s.messages.get_mut(&id) else {
                continue;
            };
            m.latest_delivery = delivery;
            m.invisible_until = Some(until);
            return Ok(Delivery {
                job: m.job.clone(),
                message: id,
                delivery,
            });
        }
        Err(s.messages.values().filter_map(|m| m.invisible_until).min())
    }

    fn latest<'s>(s: &'s mut State<J>, d: &Delivery<J>) -> Option<&'s mut Message<J>> {
        s.messages
            .get_mut(&d.message)
            .filter(|m| m.latest_delivery == d.delivery)
    }

    /// Acks a delivery: the message is done. Returns false for a stale delivery.
    pub fn ack(&self, d: &Delivery<J>) -> bool {
        let mut s = self.lock();
        if Self::latest(&mut s, d).is_none() {
            return false;
        }
        s.messages.remove(&d.message);
        s.ready.retain(|id| *id != d.message);
        true
    }

    /// Returns a delivery to the queue at once (a requeue).
    pub fn nack(&self, d: &Delivery<J>) -> bool {
        let mut s = self.lock();
        let Some(m) = Self::latest(&mut s, d) else {
            return false;
        };
        if m.invisible_until.take().is_some() {
            s.ready.push_back(d.message);
        }
        drop(s);
        self.pushed.notify_waiters();
        true
    }

    /// Moves a delivery's message to the dead-letter list.
    pub fn dead_letter(&self, d: &Delivery<J>) -> bool {
        let mut s = self.lock();
        let Some(m) = s.messages.remove(&d.message) else {
            return false;
        };
        s.ready.retain(|id| *id != d.message);
        s.dead_letters.push(m.job);
        true
    }

    /// Deliveries made so far (first deliveries and redeliveries).
    pub fn deliveries(&self) -> usize {
        self.lock().deliveries
    }

    /// Dead-lettered jobs so far.
    pub fn dead_letters(&self) -> usize {
        self.lock().dead_letters.len()
    }

    /// Messages not yet acked or dead-lettered.
    pub fn len(&self) -> usize {
        self.lock().messages.len()
    }

    /// Whether every message was acked or dead-lettered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_unacked_delivery_comes_again_after_the_visibility_timeout() {
        let q = Queue::new(Duration::from_secs(1));
        q.push("job");
        let first = q.receive().await.unwrap();
        assert!(q.try_receive().is_none(), "visible while in flight");
        let second = q.receive().await.unwrap(); // waits out the visibility timeout
        assert_eq!(q.deliveries(), 2);
        assert!(!q.ack(&first), "a stale delivery acked the message");
        assert!(q.ack(&second));
        assert!(q.is_empty());
        assert!(q.receive().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn nack_requeues_and_dead_letter_removes() {
        let q = Queue::new(Duration::from_secs(60));
        q.push(1);
        q.push(2);
        let a = q.receive().await.unwrap();
        assert!(q.nack(&a));
        let b = q.receive().await.unwrap();
        assert_eq!(b.job, 2);
        assert!(q.dead_letter(&b));
        let a2 = q.receive().await.unwrap();
        assert_eq!(a2.job, 1);
        assert!(q.ack(&a2));
        assert_eq!((q.dead_letters(), q.len(), q.deliveries()), (1, 0, 3));
    }
}
