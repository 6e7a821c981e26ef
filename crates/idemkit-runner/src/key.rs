//! How a processor gets a message's effect key: a key function, or by default the message's
//! dedupe id (issue 52), so a chain of idemkit consumers needs no glue.

use idemkit_core::{Key, KeyError};

/// What names the effect a message asks for: a key function `Fn(&M) -> Result<Key,
/// KeyError>` ([`ProcessorBuilder::key`](crate::ProcessorBuilder::key)), or, when none is
/// given (`()`), the message's dedupe id ([`DedupeId`]).
///
/// ```
/// use idemkit_core::{Key, KeyError};
/// use idemkit_runner::KeyOf;
/// let invoice = |order: &String| -> Result<Key, KeyError> { Key::compose([order.as_str(), "invoice"]) };
/// assert_eq!(invoice.key_of(&"order-9".to_string())?.as_str(), "order-9.invoice");
/// # Ok::<(), KeyError>(())
/// ```
pub trait KeyOf<M> {
    /// The effect key `message` names, or why it names none (the runner dead-letters it).
    fn key_of(&self, message: &M) -> Result<Key, KeyError>;
}

impl<M, F> KeyOf<M> for F
where
    F: Fn(&M) -> Result<Key, KeyError>,
{
    fn key_of(&self, message: &M) -> Result<Key, KeyError> {
        self(message)
    }
}

/// A message's dedupe id: what its producer named it by, the same on every republish (a
/// [`publish_once`] sets it to the producing effect's downstream key). Per broker:
///
/// | broker | the dedupe id |
/// |---|---|
/// | NATS JetStream (`idemkit-nats`) | the `Nats-Msg-Id` header |
/// | RabbitMQ (`idemkit-rabbitmq`) | the `message_id` property |
/// | Kafka (`idemkit-kafka`) | no broker id: an idemkit producer sets an `idemkit-dedupe-id` header (`idemkit_kafka::dedupe_headers`), and the consumer's key function is `.key(idemkit_kafka::dedupe_key)` (not the default: the Kafka runner's messages are rdkafka's) |
///
/// A processor built without a key function keys each message on its dedupe id; a message
/// without one has no key (`KeyError::Empty`) and is dead-lettered, never run unprotected.
///
/// [`publish_once`]: https://docs.rs/idemkit-nats/latest/idemkit_nats/fn.publish_once.html
///
/// # Example
///
/// ```
/// use idemkit_core::{Coordinator, MemoryStore, Operation};
/// use idemkit_runner::{DedupeId, KeyOf, Processor, Settlement};
///
/// #[derive(Clone)]
/// struct Event { id: Option<String>, body: String }
/// impl DedupeId for Event {
///     fn dedupe_id(&self) -> Option<&str> { self.id.as_deref() }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// // No `.key(...)`: the dedupe id is the key.
/// let p = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("mail.shipped")?)
///     .handler(|e: Event, _attempt| async move { Ok::<_, std::io::Error>(e.body.len()) });
/// let e = Event { id: Some("idk1_abc".into()), body: "order-9".into() };
/// assert_eq!(p.key_of(&e)?.as_str(), "idk1_abc");
/// assert_eq!(p.process(&e, 1).await.settlement, Settlement::Ack);
/// assert!(p.process(&e, 1).await.receipt.unwrap().is_replay());
/// let anonymous = Event { id: None, body: "order-9".into() };
/// assert!(matches!(p.process(&anonymous, 1).await.settlement, Settlement::DeadLetter { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait DedupeId {
    /// The id, if the message has one.
    fn dedupe_id(&self) -> Option<&str>;
}

/// No key function: the message's dedupe id.
impl<M: DedupeId> KeyOf<M> for () {
    fn key_of(&self, message: &M) -> Result<Key, KeyError> {
        Key::new(message.dedupe_id().unwrap_or(""))
    }
}

/// JetStream's dedupe id: the `Nats-Msg-Id` header (here, not in `idemkit-nats`, because
/// both the trait and the message type are foreign there).
#[cfg(feature = "nats")]
impl DedupeId for async_nats::jetstream::Message {
    fn dedupe_id(&self) -> Option<&str> {
        self.headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.as_str())
    }
}
