//! What a call returns: its value and where it came from.

#[cfg(doc)]
use crate::policy::InFlight;
use crate::record::FencingToken;

/// Where a call's value came from.
///
/// # Example
///
/// ```
/// use idemkit_core::Source;
///
/// assert_ne!(Source::Fresh, Source::Replayed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// This call reserved the key and ran the action.
    Fresh,
    /// An earlier call's stored result, replayed; the action did not run.
    Replayed,
    /// The action ran without protection (fail-open on a store outage, or
    /// [`InFlight::Run`]); nothing was stored.
    Unprotected,
}

/// A call's value and where it came from: the receipt of one call.
///
/// # Example
///
/// ```
/// # use idemkit_core::{Coordinator, Key, MemoryStore, Operation, Source};
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// # let c = Coordinator::new(MemoryStore::new());
/// # let (op, key) = (Operation::new("op")?, Key::new("k")?);
/// let out = c.call(&op, &key).run(|_| async { Ok::<_, std::io::Error>(5) }).await?;
/// assert!(!out.is_replay());
/// assert_eq!(out.into_value(), 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Receipt<T> {
    /// The value.
    pub value: T,
    /// Fresh, replayed or unprotected.
    pub source: Source,
    /// The fencing token of the reservation that produced the value (none if unprotected).
    pub fencing: Option<FencingToken>,
    /// Whether the store holds this outcome, so that later calls with the key replay it
    /// instead of running the action: for a replay unless the store could not confirm the
    /// record durable ([`Replay::confirmed`](crate::Replay::confirmed): Redis' durability
    /// guard, replicas that did not acknowledge it in time), never for an unprotected run,
    /// and for a fresh run only if its completion was stored (`false`: the store stayed
    /// unreachable until the lease ended, or the lease was lost; the next delivery after
    /// the lease runs the action again, ARCHITECTURE.md rows 7 and 21).
    pub stored: bool,
}

impl<T> Receipt<T> {
    /// Builds one: for tests of code that consumes outcomes, and for stand-ins of the
    /// coordinator.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{Receipt, Source};
    /// let o = Receipt::new("em_1", Source::Replayed, None);
    /// assert!(o.is_replay());
    /// ```
    pub fn new(value: T, source: Source, fencing: Option<FencingToken>) -> Self {
        Receipt {
            value,
            source,
            fencing,
            stored: source != Source::Unprotected,
        }
    }

    /// Sets [`stored`](Receipt::stored) (by default, true unless unprotected).
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{Receipt, Source};
    /// let o = Receipt::new("em_1", Source::Fresh, None).with_stored(false);
    /// assert!(!o.stored);
    /// ```
    pub fn with_stored(mut self, stored: bool) -> Self {
        self.stored = stored;
        self
    }

    /// Whether the value was replayed from the store.
    ///
    /// # Example
    ///
    /// See [`Receipt`].
    pub fn is_replay(&self) -> bool {
        self.source == Source::Replayed
    }

    /// The value.
    ///
    /// # Example
    ///
    /// See [`Receipt`].
    pub fn into_value(self) -> T {
        self.value
    }
}
