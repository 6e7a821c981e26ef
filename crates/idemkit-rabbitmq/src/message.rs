//! The message a handler and a key function see: a delivery without its acker.

use bytes::Bytes;
use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::types::AMQPValue;

/// One message as the runner hands it to the key function, the handler and the
/// `on_settled` hook: what the broker delivered, without the means to acknowledge it (the
/// runner acknowledges, after the result is stored). Cheap to clone: the body is shared.
///
/// # Example
///
/// ```
/// use idemkit_rabbitmq::Message;
///
/// // What a key function is given: the order id is the body.
/// let m = Message::new("order-9");
/// assert_eq!(m.text(), Some("order-9"));
/// assert_eq!(m.delivered(), 1);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Message {
    /// The body.
    pub data: Bytes,
    /// The properties, headers included.
    pub properties: BasicProperties,
    /// The exchange it was published to (empty for the default exchange).
    pub exchange: String,
    /// The routing key it was published with.
    pub routing_key: String,
    /// Whether the broker delivered it before (to this or another consumer) and it was not
    /// acknowledged then.
    pub redelivered: bool,
    /// The broker's tag of this delivery on its channel (for the logs).
    pub delivery_tag: u64,
}

impl Message {
    /// A message with this body, as on a first delivery: for a key function's unit tests.
    pub fn new(data: impl Into<Bytes>) -> Self {
        Message {
            data: data.into(),
            properties: BasicProperties::default(),
            exchange: String::new(),
            routing_key: String::new(),
            redelivered: false,
            delivery_tag: 0,
        }
    }

    /// The body as UTF-8, if it is.
    pub fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.data).ok()
    }

    /// A header's value as a string, if it is one (a long or short string).
    pub fn header_str(&self, name: &str) -> Option<&str> {
        let headers = self.properties.headers().as_ref()?;
        match headers.inner().get(name)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    /// How many times a quorum queue delivered it before: its `x-delivery-count` header
    /// (quorum queues keep one, and dead-letter a message past their `x-delivery-limit`).
    /// `None` on a classic queue, which keeps no count.
    pub fn delivery_count(&self) -> Option<u32> {
        let headers = self.properties.headers().as_ref()?;
        let count = match headers.inner().get("x-delivery-count")? {
            AMQPValue::ShortShortInt(n) => i64::from(*n),
            AMQPValue::ShortShortUInt(n) => i64::from(*n),
            AMQPValue::ShortInt(n) => i64::from(*n),
            AMQPValue::ShortUInt(n) => i64::from(*n),
            AMQPValue::LongInt(n) => i64::from(*n),
            AMQPValue::LongUInt(n) => i64::from(*n),
            AMQPValue::LongLongInt(n) => *n,
            _ => return None,
        };
        u32::try_from(count.max(0)).ok()
    }

    /// Which delivery of the message this is, 1-based, as the `on_settled` hook shows it:
    /// `x-delivery-count` + 1 on a quorum queue; on a classic queue, which keeps no count, 1
    /// for a first delivery and 2 for any redelivery (at least the second).
    pub fn delivered(&self) -> u32 {
        match self.delivery_count() {
            Some(n) => n.saturating_add(1),
            None if self.redelivered => 2,
            None => 1,
        }
    }

    /// Splits a delivery into the message and its acker.
    pub(crate) fn split(delivery: Delivery) -> (Message, lapin::Acker) {
        let Delivery {
            delivery_tag,
            exchange,
            routing_key,
            redelivered,
            properties,
            data,
            acker,
        } = delivery;
        let message = Message {
            data: Bytes::from(data),
            properties,
            exchange: exchange.as_str().to_owned(),
            routing_key: routing_key.as_str().to_owned(),
            redelivered,
            delivery_tag,
        };
        (message, acker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{FieldTable, LongString};

    fn with_headers(pairs: &[(&str, AMQPValue)]) -> Message {
        let mut headers = FieldTable::default();
        for (k, v) in pairs {
            headers.insert((*k).into(), v.clone());
        }
        let mut m = Message::new("x");
        m.properties = BasicProperties::default().with_headers(headers);
        m
    }

    #[test]
    fn a_quorum_queues_count_is_read_whatever_integer_it_comes_as() {
        for v in [
            AMQPValue::LongLongInt(3),
            AMQPValue::LongInt(3),
            AMQPValue::LongUInt(3),
            AMQPValue::ShortInt(3),
        ] {
            let m = with_headers(&[("x-delivery-count", v)]);
            assert_eq!(m.delivery_count(), Some(3));
            assert_eq!(m.delivered(), 4);
        }
        let negative = with_headers(&[("x-delivery-count", AMQPValue::LongLongInt(-1))]);
        assert_eq!(negative.delivery_count(), Some(0));
        let text = with_headers(&[("x-delivery-count", AMQPValue::LongString("3".into()))]);
        assert_eq!(text.delivery_count(), None);
    }

    #[test]
    fn a_classic_queues_redelivery_is_at_least_the_second() {
        let mut m = Message::new("x");
        assert_eq!(m.delivered(), 1);
        m.redelivered = true;
        assert_eq!(m.delivered(), 2);
    }

    #[test]
    fn string_headers_are_read_and_others_are_not() {
        let m = with_headers(&[
            ("order", AMQPValue::LongString(LongString::from("order-9"))),
            ("n", AMQPValue::LongInt(9)),
        ]);
        assert_eq!(m.header_str("order"), Some("order-9"));
        assert_eq!(m.header_str("n"), None);
        assert_eq!(m.header_str("missing"), None);
        assert_eq!(Message::new(vec![0xff]).text(), None);
    }
}
