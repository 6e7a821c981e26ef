//! The synchronisation that MemoryStore and the Redis waiter registry build on: std's locks
//! and atomics and tokio's `Notify`, or, built with `--cfg idemkit_loom` (`scripts/loom`),
//! loom's, so that the model checker explores every interleaving of their locks and
//! wake-ups. Not an API: hidden, and only these crates use it.

#[cfg(not(idemkit_loom))]
pub use std::sync::atomic::AtomicU64;
#[cfg(not(idemkit_loom))]
pub use std::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(idemkit_loom))]
pub use tokio::sync::Notify;

#[cfg(idemkit_loom)]
pub use self::model::Notify;
#[cfg(idemkit_loom)]
pub use loom::sync::atomic::AtomicU64;
#[cfg(idemkit_loom)]
pub use loom::sync::{Arc, Mutex, MutexGuard};

/// `Notify` with the semantics of tokio's that this code relies on, over loom's mutex:
/// `notify_waiters` wakes every `Notified` created before it, polled yet or not, and none
/// created after it. tokio's own `Notify` is checked by tokio's loom tests; what is checked
/// here is whether our code creates its `Notified` early enough and wakes it at all.
#[cfg(idemkit_loom)]
mod model {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use loom::sync::Mutex;

    #[derive(Debug, Default)]
    pub struct Notify {
        state: Mutex<State>,
    }

    #[derive(Debug, Default)]
    struct State {
        generation: u64,
        wakers: Vec<Waker>,
    }

    impl Notify {
        pub fn new() -> Self {
            Notify::default()
        }

        pub fn notified(&self) -> Notified<'_> {
            let generation = self.state.lock().unwrap().generation;
            Notified {
                notify: self,
                generation,
            }
        }

        pub fn notify_waiters(&self) {
            let wakers = {
                let mut s = self.state.lock().unwrap();
                s.generation += 1;
                std::mem::take(&mut s.wakers)
            };
            for w in wakers {
                w.wake();
            }
        }
    }

    #[derive(Debug)]
    pub struct Notified<'a> {
        notify: &'a Notify,
        generation: u64,
    }

    impl Future for Notified<'_> {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let mut s = self.notify.state.lock().unwrap();
            if s.generation != self.generation {
                return Poll::Ready(());
            }
            s.wakers.push(cx.waker().clone());
            Poll::Pending
        }
    }
}
