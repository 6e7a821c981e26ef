//! Push wake-ups: local waiters per channel, one subscription per channel while it has
//! waiters, and a registration guard so that a cancelled waiter leaves nothing behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Notify, OnceCell};

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
