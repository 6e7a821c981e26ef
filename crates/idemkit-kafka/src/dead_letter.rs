//! The dead-letter topic: a record that keeps the original key and payload, produced and
//! acknowledged before the original's offset is stored.

use super::*;

pub(crate) struct DeadLetter {
    pub(crate) producer: FutureProducer,
    pub(crate) topic: String,
}

/// Kafka's part of the settle loop: the dead-letter topic, for as long as the partition is
/// this member's.
pub(crate) struct Parking<'a, C> {
    pub(crate) dead_letter: Option<&'a DeadLetter>,
    pub(crate) current: &'a C,
}

impl<C: Fn() -> bool + Sync> Transport<OwnedMessage> for Parking<'_, C> {
    async fn dead_letter(&self, message: &OwnedMessage, reason: &str) -> bool {
        dead_letter(self.dead_letter, message, reason, self.current).await
    }

    fn describe(&self, message: &OwnedMessage) -> String {
        format!(
            "{}/{}@{}",
            message.topic(),
            message.partition(),
            message.offset()
        )
    }
}

/// Produces the dead-letter record, retrying until the broker takes it (a dead letter that
/// was not written must not be acknowledged). False if the partition was revoked meanwhile.
pub(crate) async fn dead_letter(
    dead_letter: Option<&DeadLetter>,
    message: &OwnedMessage,
    reason: &str,
    current: &impl Fn() -> bool,
) -> bool {
    let Some(dl) = dead_letter else {
        tracing::error!(
            topic = message.topic(),
            partition = message.partition(),
            offset = message.offset(),
            reason,
            "kafka runner: dead-lettered (no dead-letter topic: dropped)"
        );
        return true;
    };
    let partition = message.partition().to_string();
    let offset = message.offset().to_string();
    let mut headers = OwnedHeaders::new()
        .insert(Header {
            key: "idemkit-error",
            value: Some(reason),
        })
        .insert(Header {
            key: "idemkit-topic",
            value: Some(message.topic()),
        })
        .insert(Header {
            key: "idemkit-partition",
            value: Some(&partition),
        })
        .insert(Header {
            key: "idemkit-offset",
            value: Some(&offset),
        });
    if let Some(original) = message.headers() {
        for h in original.iter() {
            headers = headers.insert(Header {
                key: h.key,
                value: h.value,
            });
        }
    }
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut record = FutureRecord::to(&dl.topic).headers(headers.clone());
        if let Some(k) = message.key() {
            record = record.key(k);
        }
        if let Some(p) = message.payload() {
            record = record.payload(p);
        }
        match dl.producer.send(record, Duration::from_secs(5)).await {
            Ok(_) => return true,
            Err((e, _)) => {
                tracing::warn!(error = %e, topic = dl.topic, "kafka runner: dead-letter produce failed; retrying");
                if !current() {
                    return false;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
