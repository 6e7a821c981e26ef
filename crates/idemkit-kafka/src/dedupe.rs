//! A Kafka record's dedupe id (issue 52). Kafka keeps no per-message id of its own, so an
//! idemkit producer names its record in a header, `idemkit-dedupe-id` (its effect's
//! downstream key, the same on every republish), and the next consumer keys its effect on it
//! ([`dedupe_key`]). The broker itself does not drop the republish (an idempotent producer
//! only drops a retry of one send); the next consumer's key makes it a replay.

use idemkit_core::{Key, KeyError};
use rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders, OwnedMessage};

/// The header an idemkit producer names its record in.
///
/// ```
/// assert_eq!(idemkit_kafka::DEDUPE_HEADER, "idemkit-dedupe-id");
/// ```
pub const DEDUPE_HEADER: &str = "idemkit-dedupe-id";

/// `headers` (or none) with the dedupe id `id` added: for a `FutureRecord`'s `.headers(...)`
/// in an action that produces for the next service (`id`: `attempt.downstream_key()`, or a
/// child of it per record).
///
/// # Example
///
/// ```
/// use idemkit_kafka::{DEDUPE_HEADER, dedupe_headers};
/// use idemkit_kafka::rdkafka::message::Headers as _;
/// let h = dedupe_headers(None, "idk1_abc");
/// assert_eq!(h.get(0).key, DEDUPE_HEADER);
/// assert_eq!(h.get(0).value, Some(&b"idk1_abc"[..]));
/// ```
pub fn dedupe_headers(headers: Option<OwnedHeaders>, id: &str) -> OwnedHeaders {
    headers.unwrap_or_default().insert(Header {
        key: DEDUPE_HEADER,
        value: Some(id),
    })
}

/// The effect's key from a record's dedupe id (its `idemkit-dedupe-id` header, as
/// [`dedupe_headers`] sets it): the key function of a consumer whose producer is an idemkit
/// action. A record without the header has no key: the runner dead-letters it
/// (`KeyError::Empty`) rather than run it unprotected; key such records on their content.
///
/// # Example
///
/// ```
/// use idemkit_kafka::{dedupe_headers, dedupe_key};
/// use idemkit_kafka::rdkafka::Timestamp;
/// use idemkit_kafka::rdkafka::message::OwnedMessage;
/// let record = |headers| OwnedMessage::new(Some(b"order-9".to_vec()), None, "invoices".into(), Timestamp::NotAvailable, 0, 7, headers);
/// assert_eq!(dedupe_key(&record(Some(dedupe_headers(None, "idk1_abc"))))?.as_str(), "idk1_abc");
/// assert!(dedupe_key(&record(None)).is_err());
/// # Ok::<(), idemkit_core::KeyError>(())
/// ```
pub fn dedupe_key(message: &OwnedMessage) -> Result<Key, KeyError> {
    let id = message
        .headers()
        .and_then(|h| {
            h.iter()
                .find(|h| h.key == DEDUPE_HEADER)
                .and_then(|h| h.value)
        })
        .and_then(|v| std::str::from_utf8(v).ok())
        .unwrap_or("");
    Key::new(id)
}
