//! Publish once (issue 52): a message an action publishes for the next service carries its
//! effect's dedupe id as `Nats-Msg-Id`, so the republish after a crash (the worker published,
//! then died before its result was stored, and the redelivery ran the action again) is
//! dropped by the stream within its duplicate window; and the next consumer keys its own
//! effect on that id ([`msg_id_key`]), so a chain of idemkit consumers needs no glue.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, Message};
use async_nats::subject::ToSubject;
use idemkit_core::{Key, KeyError};

/// The header JetStream deduplicates publishes on.
///
/// ```
/// let id: &str = async_nats::header::NATS_MESSAGE_ID.as_ref();
/// assert_eq!(idemkit_nats::MSG_ID, id);
/// ```
pub const MSG_ID: &str = "Nats-Msg-Id";

/// What the stream answered a [`publish_once`]; storable as an action's result (serde).
///
/// ```
/// let p: idemkit_nats::Published =
///     serde_json::from_str(r#"{"stream":"ORDERS","sequence":7,"duplicate":true}"#).unwrap();
/// assert!(p.duplicate && p.sequence == 7);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Published {
    /// The stream that stored the message.
    pub stream: String,
    /// Its sequence in the stream: the first publish's, for a duplicate.
    pub sequence: u64,
    /// The stream had a message with this id within its duplicate window and dropped this
    /// one: an earlier attempt of the effect published it already.
    pub duplicate: bool,
}

/// Why a [`publish_once`] is not known to be stored.
///
/// ```no_run
/// # async fn f(js: async_nats::jetstream::Context) {
/// // No stream takes the subject: the acknowledgement never comes.
/// match idemkit_nats::publish_once(&js, "nowhere", "idk1_x", "x".into(), None).await {
///     Err(idemkit_nats::PublishError::Publish(e)) => eprintln!("not stored: {e}"),
///     _ => {}
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The publish was not sent, or the stream's acknowledgement did not come: the action
    /// fails (its key released), and its retry publishes again under the same id, which the
    /// stream drops if the first did arrive.
    #[error("jetstream publish: {0}")]
    Publish(#[from] async_nats::jetstream::context::PublishError),
}

/// Publishes `payload` to `subject` under the dedupe id `id` (`Nats-Msg-Id`, with `headers`
/// beside it), and waits for the stream's acknowledgement: `Ok` means the stream has the
/// message, either from this call or from an earlier attempt ([`Published::duplicate`]).
///
/// `id` names the message, not the delivery: an action passes its effect's downstream key
/// (`attempt.downstream_key()`), or a child of it per message
/// ([`DownstreamKey::child`](idemkit_core::DownstreamKey::child)), the same on every attempt.
/// The stream drops a second publish with the id only within its **duplicate window**
/// (`duplicate_window`, 2 minutes by default): make it outlive the time between a publish and
/// its republish (the upstream lease plus its redelivery delay), see
/// [`duplicate_window_covers`]. Past it a republish is stored again, and the next consumer's
/// key ([`msg_id_key`]) still makes its effect happen once, while its record lives.
///
/// # Errors
///
/// [`PublishError`] when the stream's acknowledgement did not come (no stream for the
/// subject, the server gone, a timeout): the action should fail, so its retry publishes
/// again.
///
/// # Example
///
/// ```no_run
/// use async_nats::jetstream;
/// use idemkit_core::{Coordinator, Key, MemoryStore, Operation};
/// use idemkit_nats::publish_once;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let js = jetstream::new(async_nats::connect("127.0.0.1:4222").await?);
/// let c = Coordinator::new(MemoryStore::new());
/// c.call(&Operation::new("orders.ship")?, &Key::new("order-9")?)
///     .run(|attempt| {
///         let js = js.clone();
///         async move {
///             let id = attempt.downstream_key().expect("a protected run");
///             publish_once(&js, "orders.shipped", id.child("shipped").as_str(), "order-9".into(), None).await
///         }
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub async fn publish_once<S: ToSubject>(
    js: &jetstream::Context,
    subject: S,
    id: &str,
    payload: bytes::Bytes,
    headers: Option<HeaderMap>,
) -> Result<Published, PublishError> {
    let mut headers = headers.unwrap_or_default();
    headers.insert(MSG_ID, id);
    let ack = js
        .publish_with_headers(subject, headers, payload)
        .await?
        .await?;
    Ok(Published {
        stream: ack.stream,
        sequence: ack.sequence,
        duplicate: ack.duplicate,
    })
}

/// The effect's key from a JetStream message's dedupe id (its `Nats-Msg-Id`, as
/// [`publish_once`] sets it): the key function of a consumer whose producer is an idemkit
/// action, or any producer that sets the header. A message without the header has no key:
/// the runner dead-letters it (`KeyError::Empty`) rather than run it unprotected; key such
/// messages on their content instead.
///
/// # Example
///
/// ```
/// use idemkit_core::{Coordinator, MemoryStore, Operation};
/// use idemkit_nats::msg_id_key;
/// use idemkit_runner::Processor;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let processor = Processor::builder(Coordinator::new(MemoryStore::new()), Operation::new("mail.shipped")?)
///     .key(msg_id_key)
///     .handler(|m: async_nats::jetstream::Message, _attempt: idemkit_core::Attempt| async move {
///         Ok::<_, std::io::Error>(m.payload.len())
///     });
/// # let _ = processor;
/// # Ok(()) }
/// ```
pub fn msg_id_key(message: &Message) -> Result<Key, KeyError> {
    let id = message
        .headers
        .as_ref()
        .and_then(|h| h.get(MSG_ID))
        .map_or("", |v| v.as_str());
    Key::new(id)
}

/// Whether a stream's duplicate window outlives `horizon`, the longest time between a
/// publish and its republish by a retry: the upstream reservation's lease plus the time its
/// redelivery takes (a queue's visibility timeout, a consumer's `ack_wait`). A stream whose
/// window is shorter can store a republish twice; the next consumer's key still makes its
/// effect happen once while its record lives (its TTL).
///
/// ```
/// use std::time::Duration;
/// use idemkit_nats::duplicate_window_covers;
/// let config = async_nats::jetstream::stream::Config {
///     duplicate_window: Duration::from_secs(120),
///     ..Default::default()
/// };
/// assert!(duplicate_window_covers(&config, Duration::from_secs(45)));
/// assert!(!duplicate_window_covers(&config, Duration::from_secs(600)));
/// ```
pub fn duplicate_window_covers(config: &jetstream::stream::Config, horizon: Duration) -> bool {
    // JetStream's default (an unset window) is two minutes.
    let window = if config.duplicate_window.is_zero() {
        Duration::from_secs(120)
    } else {
        config.duplicate_window
    };
    window >= horizon
}
