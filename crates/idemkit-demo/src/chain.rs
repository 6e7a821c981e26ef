//! Experiment 5 (issue 52): one key, three hops. An order's payment reaches consumer A,
//! which publishes "invoice requested" to a stream; consumer B takes it, sends the invoice
//! email and charges the card at a payment provider; the provider keeps its own idempotency
//! key (as Stripe does, or a service behind idemkit's HTTP layer). Each consumer dies once in
//! the window no reservation closes: A after its publish, before its result is stored; B after
//! its email and its charge, before its result is stored. Both are delivered again.
//!
//! What the rows change is only which ids travel: a publish that names the delivery (as most
//! publishers do) or A's effect (its downstream key, as `publish_once` sends it), and a
//! charge under a fresh key per attempt or under B's downstream key. The stream drops a
//! publish whose id it has seen (JetStream's duplicate window; in process here, so the
//! experiment runs on any store); B keys its email on the message's id (`msg_id_key`).
//! `crates/idemkit-rabbitmq/tests/chain.rs` runs the same chain on the real brokers.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, PoisonError};

use idemkit_core::{Attempt, Coordinator, Key, Operation, Store};

use crate::demo::Mailer;

/// Which ids travel between the hops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ids {
    /// A publishes under the delivery's id; B charges under a fresh key per attempt.
    PerDelivery,
    /// A publishes under its effect's downstream key; B still charges under a fresh key.
    PublishOnly,
    /// The effect's key end to end: A's publish and B's charge both carry their effect's
    /// downstream key.
    EndToEnd,
}

impl Ids {
    const ALL: [Ids; 3] = [Ids::PerDelivery, Ids::PublishOnly, Ids::EndToEnd];

    fn label(self) -> &'static str {
        match self {
            Ids::PerDelivery => "ids name the delivery",
            Ids::PublishOnly => "dedupe id on the publish only",
            Ids::EndToEnd => "one effect key, every hop",
        }
    }

    fn note(self) -> &'static str {
        match self {
            Ids::PerDelivery => "every retry is a new message and a new charge",
            Ids::PublishOnly => "the stream drops the republish; the charge repeats",
            Ids::EndToEnd => "each hop's effect once",
        }
    }
}

/// One row of experiment 5.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRow {
    /// The ids the hops carry.
    pub ids: Ids,
    /// Messages A's publishes left on the stream.
    pub messages: usize,
    /// Emails B sent.
    pub mails: usize,
    /// Charges the provider made.
    pub charges: usize,
}

/// Experiment 5's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainTable {
    /// One row per choice of ids.
    pub rows: Vec<ChainRow>,
}

/// A stream that drops a publish whose id it holds (JetStream's duplicate window, here as
/// long as the experiment).
#[derive(Debug, Default)]
struct Stream {
    messages: Mutex<Held>,
}

/// What a [`Stream`] holds: the ids seen, and the messages kept, `(id, body)`.
#[derive(Debug, Default)]
struct Held {
    ids: HashSet<String>,
    kept: Vec<(String, String)>,
}

impl Stream {
    fn publish(&self, id: &str, body: &str) {
        let mut m = self.messages.lock().unwrap_or_else(PoisonError::into_inner);
        if m.ids.insert(id.to_owned()) {
            m.kept.push((id.to_owned(), body.to_owned()));
        }
    }

    fn messages(&self) -> Vec<(String, String)> {
        let m = self.messages.lock().unwrap_or_else(PoisonError::into_inner);
        m.kept.clone()
    }
}

/// Runs experiment 5: each row on fresh key stores (`store()`: A's, B's and the provider's).
///
/// # Example
///
/// ```
/// use idemkit_demo::chain;
/// use idemkit_core::MemoryStore;
///
/// # tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap().block_on(async {
/// let table = chain::run(MemoryStore::new).await;
/// let last = table.rows.last().unwrap();
/// assert_eq!((last.messages, last.mails, last.charges), (1, 1, 1));
/// # });
/// ```
pub async fn run<S, F>(store: F) -> ChainTable
where
    S: Store,
    F: Fn() -> S,
{
    let mut rows = Vec::new();
    for ids in Ids::ALL {
        let (a, b, provider) = (
            Coordinator::new(store()),
            Coordinator::new(store()),
            Coordinator::new(store()),
        );
        let stream = Stream::default();
        let (mailer, charges) = (Mailer::default(), Mailer::default());
        // Hop 1: A, keyed by the payment's own id, delivered twice (it dies once).
        for delivery in 1..=2u32 {
            let _ = a
                .call(&op("invoice.request"), &key("order-9.paid"))
                .run(|attempt: Attempt| {
                    let id = match ids {
                        Ids::PerDelivery => format!("delivery-{delivery}"),
                        _ => downstream(&attempt),
                    };
                    stream.publish(&id, "order-9");
                    async move {
                        if delivery == 1 {
                            // Died after its publish, before its result was stored.
                            return Err("died");
                        }
                        Ok("requested".to_string())
                    }
                })
                .await;
        }
        // Hop 2: B, each message delivered twice: delivery 1 dies after its email and its
        // charge, before its ack; delivery 2 does the same work and acks.
        for (id, body) in stream.messages() {
            for delivery in 1..=2u32 {
                // The email, keyed on the message's id (the next consumer's `msg_id_key`).
                let _ = b
                    .call(&op("mail.invoice"), &key(&id))
                    .run(|_| mailer.send_invoice(9))
                    .await;
                // The charge at the provider: hop 3, under the key B sends.
                let charge_key = match ids {
                    Ids::EndToEnd => b
                        .downstream_key(&op("card.charge"), None, &key(&id))
                        .into_string(),
                    _ => format!("{body}-attempt-{delivery}-{id}"),
                };
                let _ = provider
                    .call(&op("provider.charge"), &key(&charge_key))
                    .run(|_| charges.send_invoice(9))
                    .await;
            }
        }
        rows.push(ChainRow {
            ids,
            messages: stream.messages().len(),
            mails: mailer.sent(),
            charges: charges.sent(),
        });
    }
    ChainTable { rows }
}

fn op(name: &str) -> Operation {
    Operation::new(name).expect("a valid operation")
}

fn key(text: &str) -> Key {
    Key::new(text).expect("a valid key")
}

/// The attempt's downstream key: the id of the effect, the same on every attempt.
fn downstream(attempt: &Attempt) -> String {
    attempt
        .downstream_key()
        .expect("a protected run has a downstream key")
        .into_string()
}

impl fmt::Display for ChainTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Experiment 5: one key, three hops (payment -> A publishes -> B emails and charges -> provider)"
        )?;
        writeln!(
            f,
            "  A dies after its publish, B after its email and its charge; each is delivered again"
        )?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<34}messages={}  mails sent={}  charges={}   ({})",
                r.ids.label(),
                r.messages,
                r.mails,
                r.charges,
                r.ids.note()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemkit_core::MemoryStore;

    #[tokio::test]
    async fn only_the_key_end_to_end_makes_every_hop_happen_once() {
        let table = run(MemoryStore::new).await;
        let got: Vec<_> = table
            .rows
            .iter()
            .map(|r| (r.ids, r.messages, r.mails, r.charges))
            .collect();
        assert_eq!(
            got,
            [
                (Ids::PerDelivery, 2, 2, 4),
                (Ids::PublishOnly, 1, 1, 2),
                (Ids::EndToEnd, 1, 1, 1),
            ]
        );
    }
}
