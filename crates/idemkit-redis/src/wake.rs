//! Push wake-ups: local waiters per channel, one subscription per channel while it has
//! waiters, and a registration guard so that a cancelled waiter leaves nothing behind.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use std::time::Duration;

// std's mutex and tokio's `Notify`, or loom's under `--cfg idemkit_loom` (model.rs).
use idemkit_core::__sync::{Mutex, Notify};
use idemkit_core::{FencingToken, StorageKey, StoreError};
use redis::RedisError;
use tokio::sync::OnceCell;

use crate::conn::Conn;
use crate::keys::{self, channel};
use crate::{RedisStore, scripts};

/// A channel's wake-up, its local waiters, and its subscription (made once, by whichever
/// waiter gets there first; the others wait for it before they check the record, so a
/// publication after their check cannot be missed).
struct Channel {
    notify: Arc<Notify>,
    waiters: usize,
    subscribed: Arc<OnceCell<()>>,
}

#[derive(Default)]
pub(crate) struct Waiters {
    channels: Mutex<HashMap<Vec<u8>, Channel>>,
}

impl Waiters {
    /// Wakes the waiters of a channel (called by the connection's push handler).
    pub(crate) fn notify(&self, channel: &[u8]) {
        let map = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = map.get(channel) {
            c.notify.notify_waiters();
        }
    }

    /// Whether a channel has local waiters.
    pub(crate) fn has(&self, channel: &str) -> bool {
        self.channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(channel.as_bytes())
    }

    /// The channels that have local waiters (to subscribe again on a new master).
    pub(crate) fn channels(&self) -> Vec<String> {
        self.channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect()
    }

    /// Channels with local waiters.
    pub(crate) fn len(&self) -> usize {
        self.channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Registers a waiter. Dropping the registration unregisters it, however the wait ends
    /// (returned, failed, or its future dropped by a timeout or `select!`); `unsubscribe` is
    /// spawned when the last local waiter of a subscribed channel leaves.
    pub(crate) fn join<U>(self: &Arc<Self>, channel: String, unsubscribe: U) -> Registration<U>
    where
        U: FnOnce(String) + Send + 'static,
    {
        let mut map = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = map
            .entry(channel.clone().into_bytes())
            .or_insert_with(|| Channel {
                notify: Arc::default(),
                waiters: 0,
                subscribed: Arc::default(),
            });
        entry.waiters += 1;
        Registration {
            waiters: self.clone(),
            notify: entry.notify.clone(),
            subscribed: entry.subscribed.clone(),
            channel: Some(channel),
            unsubscribe: Some(unsubscribe),
        }
    }
}

/// One waiter's registration on a channel; see [`Waiters::join`].
pub(crate) struct Registration<U: FnOnce(String)> {
    waiters: Arc<Waiters>,
    pub(crate) notify: Arc<Notify>,
    pub(crate) subscribed: Arc<OnceCell<()>>,
    channel: Option<String>,
    unsubscribe: Option<U>,
}

impl<U: FnOnce(String)> Drop for Registration<U> {
    fn drop(&mut self) {
        let Some(channel) = self.channel.take() else {
            return;
        };
        let last = {
            let mut map = self
                .waiters
                .channels
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match map.get_mut(channel.as_bytes()) {
                Some(c) if c.waiters > 1 => {
                    c.waiters -= 1;
                    false
                }
                Some(_) => {
                    map.remove(channel.as_bytes());
                    true
                }
                None => false,
            }
        };
        // Even if the subscription never confirmed (its waiter was cancelled mid-way, the
        // command may still have reached Redis): unsubscribing an unknown channel is
        // harmless, a leaked subscription is not (reconnects replay it).
        if let (true, Some(unsubscribe)) = (last, self.unsubscribe.take()) {
            unsubscribe(channel);
        }
    }
}

impl RedisStore {
    /// The subscribe lock of a channel's stripe (see `Shared::pubsub`).
    fn pubsub_lock(&self, channel: &str) -> &tokio::sync::Mutex<()> {
        let stripes = &self.shared.pubsub;
        &stripes[(keys::fnv1a(channel.as_bytes()) % stripes.len() as u64) as usize]
    }

    async fn subscribe(&self, channel: &str) -> Result<(), RedisError> {
        match self.conn.clone() {
            Conn::Cluster(mut c) => c.ssubscribe(channel).await,
            Conn::Single(mut c) => c.subscribe(channel).await,
            // Never the store's subscription connection (see `wire`).
            Conn::Own(_) => Err(RedisError::from((
                redis::ErrorKind::Client,
                "no subscriptions on the store's own connections",
            ))),
            Conn::Dedicated(mut c) => c.subscribe(channel).await,
            Conn::Sentinel(f) => f.current().1.subscribe(channel).await,
            Conn::Pinned(mut p) => p.conn.subscribe(channel).await,
        }
    }

    async fn unsubscribe(&self, channel: &str) -> Result<(), RedisError> {
        match self.conn.clone() {
            Conn::Cluster(mut c) => c.sunsubscribe(channel).await,
            Conn::Single(mut c) => c.unsubscribe(channel).await,
            // Never the store's subscription connection (see `wire`).
            Conn::Own(_) => Err(RedisError::from((
                redis::ErrorKind::Client,
                "no subscriptions on the store's own connections",
            ))),
            Conn::Dedicated(mut c) => c.unsubscribe(channel).await,
            Conn::Sentinel(f) => f.current().1.unsubscribe(channel).await,
            Conn::Pinned(mut p) => p.conn.unsubscribe(channel).await,
        }
    }

    /// `Store::wait`: subscribe to the key's channel (once per channel and process), check
    /// that the reservation is still the live state and ask for a wake-up (`watch.lua`),
    /// then sleep until the push, the lease's end or `timeout`.
    pub(crate) async fn wait_pushed(
        &self,
        key: &StorageKey,
        seen: FencingToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let rkey = self.redis_key(key);
        let store = self.clone();
        // Dropped however this wait ends, a cancellation included: the last local waiter of
        // the channel unsubscribes (in the background, off the waiter's path).
        let registration = self.shared.waiters.join(channel(&rkey), move |channel| {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _wire = store.pubsub_lock(&channel).lock().await;
                    if store.shared.waiters.has(&channel) {
                        return; // a new waiter came: it subscribed (or will), keep it
                    }
                    if let Err(e) = store.unsubscribe(&channel).await {
                        tracing::debug!(error = %e, "unsubscribe failed");
                    }
                });
            }
        });
        // Created before subscribing: a message from then on is not lost.
        let notify = registration.notify.clone();
        let notified = notify.notified();
        // Every waiter waits for the channel's subscription before it checks the record, so
        // a completion after its check is published to a subscribed connection.
        // Bounded: the coordinator trusts `call_timeout` for the whole wait, and a lock held
        // by a slow subscribe of another waiter (a reconnecting connection) must not hold
        // this one past it.
        let subscribed = tokio::time::timeout(
            self.shared.response_timeout,
            registration.subscribed.get_or_try_init(|| async {
                let channel = channel(&rkey);
                let _wire = self.pubsub_lock(&channel).lock().await;
                self.subscribe(&channel).await
            }),
        )
        .await;
        match subscribed {
            Ok(Ok(_)) => {}
            // No push: fall back to the lease's end, the bound every wait has anyway.
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "subscribe failed; waiting for the lease's end");
            }
            Err(_) => tracing::debug!("subscribe timed out; waiting for the lease's end"),
        }
        // Now check the reservation is still the live state and ask for a wake-up (the
        // owner may have finished between the caller's `begin` and here).
        let pttl: i64 = self
            .eval(&scripts::WATCH, &rkey, |cmd| {
                cmd.arg(&seen.get().to_be_bytes()[..]);
            })
            .await?;
        if pttl == -1 {
            return Err(StoreError::corrupt("a reservation without an expiry"));
        }
        if pttl > 0 {
            // Never past the lease: an owner that died publishes nothing. Nor before it: the
            // server expires a key only once its clock is *past* the deadline, and `PTTL`
            // is whole milliseconds rounded down, so a wait of exactly `pttl` can end on
            // the deadline's millisecond with the key still live, and the caller's next
            // `begin` would find it in flight. One millisecond more is past it.
            let until = timeout.min(Duration::from_millis(pttl as u64 + 1));
            let _ = tokio::time::timeout(until, notified).await;
        }
        drop(registration);
        Ok(())
    }
}

/// Called by the connection for every push message: wakes the waiters of its channel.
pub(crate) fn push_handler(
    waiters: Arc<Waiters>,
) -> impl Fn(redis::PushInfo) -> Result<(), ()> + Send + Sync {
    use redis::{PushKind, Value};
    move |push: redis::PushInfo| {
        if let (PushKind::Message | PushKind::SMessage, Some(Value::BulkString(channel))) =
            (&push.kind, push.data.first())
        {
            waiters.notify(channel);
        }
        Ok(())
    }
}
