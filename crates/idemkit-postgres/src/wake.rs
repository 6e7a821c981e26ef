//! Push wake-ups: one `LISTEN` connection per store, shared by all its waiters.
//!
//! A waiter registers its key here *before* it flags the row in the database, so a
//! notification sent the moment after (at the owner's commit) finds it. The listening task
//! hands each notification (its payload is the key) to that key's waiters. When the
//! connection drops, notifications may have been lost: every waiter is woken (a spurious
//! wake is allowed; the coordinator asks `begin` again), and the listener reconnects and
//! listens again on its next receive.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{Notify, OnceCell, oneshot};

/// The waiters of one store, by key.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    by_key: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Waiters {
    /// Registers interest in `key` until the returned guard drops.
    pub(crate) fn register(self: &Arc<Self>, key: &str) -> Registration {
        let notify = self.lock().entry(key.to_owned()).or_default().clone();
        Registration {
            waiters: self.clone(),
            key: key.to_owned(),
            notify: Some(notify),
        }
    }

    fn wake(&self, key: &str) {
        if let Some(n) = self.lock().get(key) {
            n.notify_waiters();
        }
    }

    fn wake_all(&self) {
        for n in self.lock().values() {
            n.notify_waiters();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.by_key.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// One waiter's interest in a key; dropping it (a finished or cancelled wait) removes the
/// key's entry once no other waiter of the key holds it.
pub(crate) struct Registration {
    waiters: Arc<Waiters>,
    key: String,
    /// `Some` until dropped (taken under the map's lock, see `drop`).
    notify: Option<Arc<Notify>>,
}

impl Registration {
    /// The key's `Notify`, shared by its waiters.
    pub(crate) fn notify(&self) -> &Notify {
        self.notify.as_deref().expect("set until dropped")
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.waiters.lock();
        // Our reference goes under the lock, so two waiters of a key leaving at once cannot
        // both see the other's reference and leave the entry behind.
        drop(self.notify.take());
        if map
            .get(&self.key)
            .is_some_and(|n| Arc::strong_count(n) == 1)
        {
            map.remove(&self.key);
        }
    }
}

/// The listening task of one store: started by the first wait, stopped when the store's
/// last handle drops.
#[derive(Debug, Default)]
pub(crate) struct Listener {
    started: OnceCell<oneshot::Sender<()>>,
}

impl Listener {
    /// Makes sure the store listens on `channel`; returns once the `LISTEN` has been
    /// acknowledged (the first time), so a notification sent after this returns is
    /// delivered while that connection holds. When it drops, notifications sent until the
    /// listener has reconnected and listens again (on its next receive) are lost: the
    /// listening task then wakes every waiter, each of which asks `begin` again, and the
    /// waiters' own re-check covers the time the connection stays down.
    pub(crate) async fn ensure(
        &self,
        pool: &PgPool,
        channel: &str,
        waiters: &Arc<Waiters>,
    ) -> Result<(), sqlx::Error> {
        self.started
            .get_or_try_init(|| async {
                let mut listener = PgListener::connect_with(pool).await?;
                listener.listen(channel).await?;
                let (stop, stopped) = oneshot::channel();
                tokio::spawn(listen(listener, waiters.clone(), stopped));
                Ok::<_, sqlx::Error>(stop)
            })
            .await
            .map(|_| ())
    }
}

async fn listen(mut listener: PgListener, waiters: Arc<Waiters>, mut stop: oneshot::Receiver<()>) {
    loop {
        tokio::select! {
            _ = &mut stop => return,
            received = listener.try_recv() => match received {
                Ok(Some(n)) => waiters.wake(n.payload()),
                // The connection dropped (and was re-established, listening again):
                // anything sent meanwhile is lost.
                Ok(None) => waiters.wake_all(),
                Err(e) => {
                    tracing::warn!(error = %e, "idemkit-postgres: the LISTEN connection failed; waiters fall back to their re-check until it is back");
                    waiters.wake_all();
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waiters of one key that come and go from many threads leave no entry behind. (The
    /// interleaving `drop` guards against, two waiters leaving together, is too narrow to
    /// hit reliably here; the test checks that the entry goes once the last waiter leaves.)
    #[test]
    fn registrations_leaving_together_leave_nothing() {
        let waiters = Arc::new(Waiters::default());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let waiters = waiters.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let r = waiters.register("k");
                        std::hint::black_box(r.notify());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(waiters.len(), 0);
    }
}
