//! The dead letter: published to an exchange on a channel in confirm mode, and only counted
//! as parked once the broker confirmed it (and routed it somewhere).

use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Acker, BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::Mutex;

use crate::message::Message;

/// Where dead letters go: an exchange, and the routing key (the original one if `None`).
#[derive(Debug, Clone)]
pub(crate) struct DeadLetter {
    pub(crate) exchange: String,
    pub(crate) routing_key: Option<String>,
}

/// One connection's publisher of dead letters: its own channel, in confirm mode, opened on
/// first use and again after the broker closed it (a missing exchange closes a channel, and
/// must not close the one the consumer is on).
pub(crate) struct Publisher {
    channel: Mutex<Option<Channel>>,
}

impl Publisher {
    pub(crate) fn new() -> Self {
        Publisher {
            channel: Mutex::new(None),
        }
    }

    /// Publishes `message` to `to`, retrying a few times; true once the broker confirmed
    /// it and routed it to a queue. Gives up early when `acker`'s channel is gone: the
    /// broker has put the message back in its queue already, so nothing is lost.
    pub(crate) async fn publish(
        &self,
        connection: &Connection,
        to: &DeadLetter,
        queue: &str,
        message: &Message,
        reason: &str,
        acker: &Acker,
    ) -> bool {
        let properties = headers(message, queue, reason);
        let routing_key = to.routing_key.as_deref().unwrap_or(&message.routing_key);
        let mut backoff = Duration::from_millis(100);
        for _ in 0..5 {
            if acker.poisoned() {
                return false;
            }
            match self
                .try_publish(connection, to, routing_key, message, properties.clone())
                .await
            {
                Ok(Confirmation::Ack(None)) => return true,
                Ok(Confirmation::Ack(Some(returned))) => {
                    // Mandatory and unroutable: confirmed, but in no queue, so it would be
                    // lost. The message stays unacknowledged instead.
                    tracing::error!(exchange = to.exchange, routing_key, reply = %returned.reply_text,
                        "rabbitmq runner: the dead letter was routed to no queue");
                }
                Ok(other) => tracing::warn!(exchange = to.exchange, confirmation = ?other,
                    "rabbitmq runner: the dead letter was not confirmed"),
                Err(e) => {
                    tracing::warn!(exchange = to.exchange, error = %e,
                        "rabbitmq runner: the dead letter was not published");
                    *self.channel.lock().await = None;
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        false
    }

    async fn try_publish(
        &self,
        connection: &Connection,
        to: &DeadLetter,
        routing_key: &str,
        message: &Message,
        properties: BasicProperties,
    ) -> lapin::Result<Confirmation> {
        let channel = {
            let mut slot = self.channel.lock().await;
            match slot.as_ref() {
                Some(c) if c.status().connected() => c.clone(),
                _ => {
                    let c = connection.create_channel().await?;
                    c.confirm_select(ConfirmSelectOptions::default()).await?;
                    *slot = Some(c.clone());
                    c
                }
            }
        };
        let confirm = channel
            .basic_publish(
                to.exchange.as_str().into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.data,
                properties,
            )
            .await?;
        confirm.await
    }
}

/// The original properties, with the headers that say why and from where:
/// `idemkit-error`, `idemkit-queue`, `idemkit-exchange`, `idemkit-routing-key`.
fn headers(message: &Message, queue: &str, reason: &str) -> BasicProperties {
    let mut headers: FieldTable = message.properties.headers().clone().unwrap_or_default();
    let text = |s: &str| AMQPValue::LongString(LongString::from(s.replace(['\r', '\n'], " ")));
    headers.insert("idemkit-error".into(), text(reason));
    headers.insert("idemkit-queue".into(), text(queue));
    headers.insert("idemkit-exchange".into(), text(&message.exchange));
    headers.insert("idemkit-routing-key".into(), text(&message.routing_key));
    message.properties.clone().with_headers(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_keeps_the_original_headers_and_says_why_on_one_line() {
        let mut original = FieldTable::default();
        original.insert("order".into(), AMQPValue::LongString("order-9".into()));
        let mut m = Message::new("order-9");
        m.properties = BasicProperties::default()
            .with_headers(original)
            .with_message_id("m-1".into());
        m.routing_key = "orders.paid".into();
        let p = headers(&m, "billing", "the handler failed\non delivery 3");
        let h = p.headers().as_ref().unwrap().inner();
        let s = |k: &str| match h.get(k) {
            Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(s("order"), "order-9");
        assert_eq!(s("idemkit-error"), "the handler failed on delivery 3");
        assert_eq!(s("idemkit-queue"), "billing");
        assert_eq!(s("idemkit-routing-key"), "orders.paid");
        assert_eq!(s("idemkit-exchange"), "");
        assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some("m-1"));
    }
}
