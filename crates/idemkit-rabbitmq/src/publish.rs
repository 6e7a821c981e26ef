//! Publish once (issue 52): a message an action publishes for the next service carries its
//! effect's dedupe id as the AMQP `message_id`, confirmed by the broker before the action
//! returns; the next consumer keys its effect on that id ([`message_id_key`]). RabbitMQ
//! itself keeps both copies of a republish (it has no duplicate window): the next idemkit
//! consumer is where the second copy becomes a replay.

use lapin::options::BasicPublishOptions;
use lapin::{BasicProperties, Channel, Confirmation};

use idemkit_core::{Key, KeyError};

use crate::Message;

/// Why a [`publish_once`] is not known to be in a queue.
///
/// ```
/// use idemkit_rabbitmq::PublishError;
/// let e = PublishError::Unroutable("NO_ROUTE".into());
/// assert_eq!(e.to_string(), "rabbitmq publish: routed to no queue (NO_ROUTE)");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The publish failed, or its confirmation did not come (the channel closed).
    #[error("rabbitmq publish: {0}")]
    Publish(#[from] lapin::Error),
    /// The broker refused it (`basic.nack`).
    #[error("rabbitmq publish: the broker refused the message (nack)")]
    Nacked,
    /// The broker confirmed it but routed it to no queue (mandatory and returned): published
    /// to nobody.
    #[error("rabbitmq publish: routed to no queue ({0})")]
    Unroutable(String),
    /// The channel is not in confirm mode, so nothing could say the message arrived.
    #[error("rabbitmq publish: the channel is not in confirm mode (confirm_select first)")]
    NoConfirms,
}

/// Publishes `body` to `exchange` with `routing_key`, its `message_id` set to `id` (over
/// whatever `properties` say), mandatory, and waits for the broker's confirmation: `Ok`
/// means a queue has it. `channel` must be in confirm mode (`confirm_select`).
///
/// `id` names the message, not the delivery: an action passes its effect's downstream key
/// (`attempt.downstream_key()`), or a child of it per message
/// ([`DownstreamKey::child`](idemkit_core::DownstreamKey::child)), the same on every attempt.
/// A worker that dies after this and before its own result is stored publishes again on its
/// retry, with the same id; RabbitMQ stores both copies, and the next consumer, keyed by
/// [`message_id_key`], runs its effect once and replays it to the second.
///
/// # Errors
///
/// [`PublishError`] when the message is not known to be in a queue: the action should fail,
/// so its retry publishes again.
///
/// # Example
///
/// ```no_run
/// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
/// use idemkit_rabbitmq::lapin::{BasicProperties, Connection, ConnectionProperties};
/// use idemkit_rabbitmq::publish_once;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let connection = Connection::connect("amqp://guest:guest@127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
/// let channel = connection.create_channel().await?;
/// channel.confirm_select(Default::default()).await?;
/// let c = Coordinator::new(MemoryStore::new());
/// c.call(&Operation::new("orders.ship")?, &Key::new("order-9")?)
///     .run(|attempt| {
///         let channel = channel.clone();
///         async move {
///             let id = attempt.downstream_key().expect("a protected run");
///             publish_once(&channel, "", "orders.shipped", id.as_str(), b"order-9", BasicProperties::default()).await
///         }
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub async fn publish_once(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    id: &str,
    body: &[u8],
    properties: BasicProperties,
) -> Result<(), PublishError> {
    let confirm = channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body,
            properties.with_message_id(id.into()),
        )
        .await?;
    match confirm.await? {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => {
            Err(PublishError::Unroutable(returned.reply_text.to_string()))
        }
        Confirmation::Nack(_) => Err(PublishError::Nacked),
        Confirmation::NotRequested => Err(PublishError::NoConfirms),
    }
}

impl Message {
    /// Its AMQP `message_id`, if it has one: the dedupe id a [`publish_once`] sets.
    ///
    /// ```
    /// use idemkit_rabbitmq::Message;
    /// use idemkit_rabbitmq::lapin::BasicProperties;
    /// let mut m = Message::new("order-9");
    /// assert_eq!(m.message_id(), None);
    /// m.properties = BasicProperties::default().with_message_id("idk1_abc".into());
    /// assert_eq!(m.message_id(), Some("idk1_abc"));
    /// ```
    pub fn message_id(&self) -> Option<&str> {
        self.properties.message_id().as_ref().map(|s| s.as_str())
    }
}

/// A RabbitMQ message's dedupe id is its `message_id`: a processor built without a key
/// function keys on it ([`message_id_key`] is the same as a function).
impl idemkit_runner::DedupeId for Message {
    fn dedupe_id(&self) -> Option<&str> {
        self.message_id()
    }
}

/// The effect's key from a message's dedupe id (its `message_id`, as [`publish_once`] sets
/// it): the key function of a consumer whose producer is an idemkit action, or any producer
/// that sets the property. A message without one has no key: the runner dead-letters it
/// (`KeyError::Empty`) rather than run it unprotected; key such messages on their content.
///
/// # Example
///
/// ```
/// use idemkit_core::{Coordinator, MemoryStore, Operation};
/// use idemkit_rabbitmq::{Message, message_id_key};
/// use idemkit_rabbitmq::lapin::BasicProperties;
/// use idemkit_runner::Processor;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut m = Message::new("order-9");
/// m.properties = BasicProperties::default().with_message_id("idk1_abc".into());
/// assert_eq!(message_id_key(&m)?.as_str(), "idk1_abc");
/// assert!(message_id_key(&Message::new("order-9")).is_err());
/// let processor = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("mail.shipped")?)
///     .key(message_id_key)
///     .handler(|m: Message, _attempt: idemkit_core::Attempt| async move { Ok::<_, std::io::Error>(m.data.len()) });
/// # let _ = processor;
/// # Ok(()) }
/// ```
pub fn message_id_key(message: &Message) -> Result<Key, KeyError> {
    Key::new(message.message_id().unwrap_or(""))
}
