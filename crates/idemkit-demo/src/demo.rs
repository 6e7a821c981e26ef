//! The seed's three experiments, on an in-process at-least-once [`Queue`] and any store.
//!
//! 1. Crash before the ack: the effect runs, the worker dies before acking, the queue
//!    redelivers after the visibility timeout.
//! 2. Two workers, one job: a slow worker's visibility timeout expires, a second worker runs
//!    the same job at the same time; once with `in_flight = wait`, once with `reject`.
//! 3. What the key is made of: two jobs carry the same effect (the invoice of order 9).
//!
//! Every figure in the [`Report`] is counted from what happened (queue deliveries, mails the
//! mailer really sent, dead letters); nothing is written in by hand.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Error, InFlight, Key, Operation, Policy, Store};

use crate::queue::{Delivery, Queue};

/// How long a received job stays invisible before the queue delivers it again.
const VISIBILITY: Duration = Duration::from_millis(50);
/// How long sending a mail takes in experiment 2: longer than the visibility timeout, which
/// is what lets the second worker receive the job while the first still runs.
const SLOW_MAIL: Duration = Duration::from_millis(300);
/// The key's retention in the demo, as in the seed: an hour.
const TTL: Duration = Duration::from_secs(3600);

/// A job as the producer enqueues it.
#[derive(Debug, Clone)]
pub struct Job {
    /// The delivery's identity: unique per enqueued job.
    pub job_id: String,
    /// The order the invoice is for.
    pub order_id: u32,
}

/// A mailer that counts what it really sends; receipts are `em_1`, `em_2`...
#[derive(Debug, Clone, Default)]
pub(crate) struct Mailer {
    sent: Arc<AtomicUsize>,
    delay: Duration,
}

impl Mailer {
    fn slow(delay: Duration) -> Self {
        Mailer {
            sent: Arc::default(),
            delay,
        }
    }

    pub(crate) async fn send_invoice(&self, _order_id: u32) -> Result<String, Infallible> {
        let n = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        Ok(format!("em_{n}"))
    }

    pub(crate) fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }
}

/// Experiment 1's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashRow {
    /// Which handler.
    pub handler: &'static str,
    /// Deliveries the queue made.
    pub deliveries: usize,
    /// Mails sent.
    pub mails: usize,
}

/// Experiment 2's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkersRow {
    /// `wait` or `reject`.
    pub mode: &'static str,
    /// What each worker's handler returned.
    pub results: BTreeMap<&'static str, String>,
    /// Mails sent.
    pub mails: usize,
    /// What the delivery after a requeue got, if there was one.
    pub redelivery: Option<String>,
}

/// Experiment 3's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    /// How the key was built.
    pub label: &'static str,
    /// The key of the first job, as built.
    pub key: String,
    /// Mails sent for the two jobs.
    pub mails: usize,
    /// Jobs dead-lettered.
    pub dead_lettered: usize,
    /// The first handler error, if any.
    pub error: Option<String>,
}

/// The demo's three tables; `Display` prints them in the seed's format.
///
/// # Example
///
/// See [`run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Experiment 1.
    pub crash: Vec<CrashRow>,
    /// Experiment 2.
    pub workers: Vec<WorkersRow>,
    /// Experiment 3.
    pub keys: Vec<KeyRow>,
}

/// Runs the three experiments. `store` is called once per experiment row for a store with
/// no records from earlier rows.
///
/// # Example
///
/// ```
/// use idemkit_core::MemoryStore;
///
/// # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
/// let report = idemkit_demo::demo::run(MemoryStore::new).await;
/// assert_eq!(report.crash[1].mails, 1); // keyed by job id: one mail despite the crash
/// println!("{report}");
/// # });
/// ```
pub async fn run<S, F>(store: F) -> Report
where
    S: Store,
    F: Fn() -> S,
{
    Report {
        crash: vec![
            crash_before_ack(None::<&Coordinator<S>>).await,
            crash_before_ack(Some(&Coordinator::new(store()))).await,
        ],
        workers: vec![
            two_workers(store(), InFlight::Wait).await,
            two_workers(store(), InFlight::Reject).await,
        ],
        keys: vec![
            two_jobs_one_order(store(), "key = job id: two jobs for order-9", |j| {
                j.job_id.clone()
            })
            .await,
            two_jobs_one_order(store(), "key = 'order-9:invoice': the same two jobs", |j| {
                format!("order-{}:invoice", j.order_id)
            })
            .await,
            two_jobs_one_order(store(), "key = 'order-9.invoice': the same two jobs", |j| {
                format!("order-{}.invoice", j.order_id)
            })
            .await,
            two_jobs_one_order(store(), "key = '' (order id field missing)", |_| {
                String::new()
            })
            .await,
        ],
    }
}

fn invoice() -> Operation {
    Operation::new("mail.invoice").expect("a valid operation name")
}

/// The keyed handler: `coordinate("mail.invoice", key, 3600, ...)` in the seed's words. A key
/// that fails validation is an error here, before the mailer is reachable.
async fn keyed<S: Store>(
    c: &Coordinator<S>,
    key: String,
    job: &Job,
    mailer: &Mailer,
) -> Result<String, Error<Infallible>> {
    let key = Key::new(key)?;
    let out = c
        .call(&invoice(), &key)
        .ttl(TTL)
        .run(|_| mailer.send_invoice(job.order_id))
        .await?;
    Ok(out.value)
}

fn order_9(job_id: &str) -> Job {
    Job {
        job_id: job_id.to_string(),
        order_id: 9,
    }
}

async fn crash_before_ack<S: Store>(coordinator: Option<&Coordinator<S>>) -> CrashRow {
    let queue = Queue::new(VISIBILITY);
    let mailer = Mailer::default();
    queue.push(order_9("job-1"));
    let mut crashed = false;
    while let Some(d) = queue.receive().await {
        let result = match coordinator {
            None => mailer
                .send_invoice(d.job.order_id)
                .await
                .map_err(Error::Action),
            Some(c) => keyed(c, d.job.job_id.clone(), &d.job, &mailer).await,
        };
        assert!(result.is_ok(), "the handler failed: {result:?}");
        if !crashed {
            // The process dies between the effect and the ack: no ack is sent, and the
            // message comes back after its visibility timeout.
            crashed = true;
            continue;
        }
        queue.ack(&d);
    }
    CrashRow {
        handler: if coordinator.is_some() {
            "handler under an idempotency key = job id"
        } else {
            "plain handler"
        },
        deliveries: queue.deliveries(),
        mails: mailer.sent(),
    }
}

async fn two_workers<S: Store>(store: S, mode: InFlight) -> WorkersRow {
    let c = Coordinator::builder(store)
        .policy(Policy::default().in_flight(mode))
        .build();
    let queue = Queue::new(VISIBILITY);
    let mailer = Mailer::slow(SLOW_MAIL);
    queue.push(order_9("job-1"));

    let describe = |r: Result<String, Error<Infallible>>| match r {
        Ok(receipt) => receipt,
        Err(Error::InFlight { .. }) => "in progress, requeue".to_string(),
        Err(e) => format!("error: {e}"),
    };
    let handle = |name: &'static str, d: Delivery<Job>| {
        let (c, queue, mailer) = (c.clone(), queue.clone(), mailer.clone());
        async move {
            let r = keyed(&c, d.job.job_id.clone(), &d.job, &mailer).await;
            if matches!(r, Err(Error::InFlight { .. })) {
                queue.nack(&d);
            } else {
                queue.ack(&d); // A's ack is stale once B holds the job; the queue ignores it
            }
            (name, describe(r))
        }
    };
    // A receives first and starts sending; B receives the same job when A's visibility
    // timeout runs out, while A is still sending.
    let a = tokio::spawn(handle("A", queue.receive().await.expect("a job")));
    let b = tokio::spawn(handle("B", queue.receive().await.expect("the job, again")));
    let mut results = BTreeMap::new();
    for t in [a, b] {
        let (name, r) = t.await.expect("worker");
        results.insert(name, r);
    }
    // A requeued job is delivered again: that delivery finds the stored receipt.
    let mut redelivery = None;
    while let Some(d) = queue.try_receive() {
        let r = keyed(&c, d.job.job_id.clone(), &d.job, &mailer).await;
        queue.ack(&d);
        redelivery = Some(describe(r));
    }
    WorkersRow {
        mode: if mode == InFlight::Wait {
            "wait"
        } else {
            "reject"
        },
        results,
        mails: mailer.sent(),
        redelivery,
    }
}

async fn two_jobs_one_order<S: Store>(
    store: S,
    label: &'static str,
    key_of: impl Fn(&Job) -> String,
) -> KeyRow {
    let c = Coordinator::new(store);
    let queue = Queue::new(VISIBILITY);
    let mailer = Mailer::default();
    // The producer retried, or two code paths both decided to invoice order 9.
    queue.push(order_9("job-1"));
    queue.push(order_9("job-2"));
    let mut error = None;
    let key = key_of(&order_9("job-1"));
    while let Some(d) = queue.try_receive() {
        match keyed(&c, key_of(&d.job), &d.job, &mailer).await {
            Ok(_) => {
                queue.ack(&d);
            }
            Err(e) => {
                // An invalid key can never succeed: dead-letter, do not retry.
                error.get_or_insert(e.to_string());
                queue.dead_letter(&d);
            }
        }
    }
    KeyRow {
        label,
        key,
        mails: mailer.sent(),
        dead_lettered: queue.dead_letters(),
        error,
    }
}

// ===== rendering =====

fn py_dict(m: &BTreeMap<&'static str, String>) -> String {
    let items: Vec<String> = m.iter().map(|(k, v)| format!("'{k}': '{v}'")).collect();
    format!("{{{}}}", items.join(", "))
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Experiment 1: crash before the ack")?;
        for r in &self.crash {
            writeln!(
                f,
                "{:<45}deliveries={}  mails sent={}",
                r.handler, r.deliveries, r.mails
            )?;
        }
        writeln!(f)?;
        writeln!(f, "Experiment 2: two workers, one job")?;
        for r in &self.workers {
            let mode = format!("in_flight='{}'", r.mode);
            write!(
                f,
                "{mode:<21}{:<44}mails sent={}",
                py_dict(&r.results),
                r.mails
            )?;
            if let Some(next) = &r.redelivery {
                write!(f, "   (next delivery: '{next}')")?;
            }
            writeln!(f)?;
        }
        writeln!(f)?;
        writeln!(f, "Experiment 3: what the key is made of")?;
        for r in &self.keys {
            write!(f, "{:<45}-> mails sent={}", r.label, r.mails)?;
            if r.dead_lettered > 0 {
                write!(f, "  dead-lettered={}", r.dead_lettered)?;
            }
            let note = match (&r.error, r.mails) {
                (Some(e), _) => format!("typed error before the action: {e}"),
                (None, 2) => "the key must name the effect, not the delivery".to_string(),
                (None, _) if r.key.contains(':') => {
                    "':' is an ordinary key character: protected".to_string()
                }
                (None, _) => String::new(),
            };
            if !note.is_empty() {
                write!(f, "   ({note})")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemkit_core::MemoryStore;

    #[tokio::test(start_paused = true)]
    async fn the_demo_reproduces_the_seed_with_one_mail_for_the_colon_key() {
        let report = run(MemoryStore::new).await;
        let crash: Vec<_> = report
            .crash
            .iter()
            .map(|r| (r.deliveries, r.mails))
            .collect();
        assert_eq!(crash, [(2, 2), (2, 1)]);

        let wait = &report.workers[0];
        assert_eq!(py_dict(&wait.results), "{'A': 'em_1', 'B': 'em_1'}");
        assert_eq!((wait.mails, &wait.redelivery), (1, &None));
        let reject = &report.workers[1];
        assert_eq!(
            py_dict(&reject.results),
            "{'A': 'em_1', 'B': 'in progress, requeue'}"
        );
        assert_eq!(
            (reject.mails, reject.redelivery.as_deref()),
            (1, Some("em_1"))
        );

        let keys: Vec<_> = report
            .keys
            .iter()
            .map(|r| (r.mails, r.dead_lettered))
            .collect();
        assert_eq!(keys, [(2, 0), (1, 0), (1, 0), (0, 2)]);
        assert!(
            report.keys[3]
                .error
                .as_deref()
                .unwrap()
                .contains("key is empty")
        );

        let text = report.to_string();
        assert!(
            text.contains(
                "plain handler                                deliveries=2  mails sent=2"
            )
        );
        assert!(text.contains("in_flight='wait'     {'A': 'em_1', 'B': 'em_1'}"));
    }
}
