//! What every transactional inbox shares (the PostgreSQL and the MySQL one): what a claim
//! found ([`Seen`]), its errors ([`InboxError`]), and what a delivery in the seed's order did
//! ([`Delivered`], [`DeliverError`]); and [`TxFuture`], the future of an action given a
//! transaction's connection.
//!
//! A delivery in the seed's order: in one transaction, claim the effect in the inbox and run
//! the database effect if it is new; commit; then run the external effect under its own key
//! on **every** delivery, duplicates included; acknowledge only then.

use std::future::Future;
use std::pin::Pin;

use idemkit_core::store::StoreError;
use idemkit_core::{Disposition, Error, KeyError, Receipt};

/// The future an action of a transactional call (or a database effect of an inbox's
/// `deliver`) returns: boxed, because it borrows the connection it is given
/// (`Box::pin(async move { ... })`).
pub type TxFuture<'t, T> = Pin<Box<dyn Future<Output = T> + Send + 't>>;

/// What an inbox's `claim` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Seen {
    /// The first delivery of this message to this consumer (or the first since its row
    /// expired): run the database effect.
    New,
    /// A committed transaction already recorded it: its database effect is committed too.
    Duplicate,
}

/// An inbox call that failed before or instead of its statement.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The consumer name or message id is empty, too long or has a control character
    /// (checked before anything is sent).
    #[error("invalid inbox id: {0}")]
    InvalidId(#[from] KeyError),
    /// The database failed or refused (a missing table names the inbox's `migrate`).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an inbox's `deliver` did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Delivered<T> {
    /// Whether this delivery ran the database effect ([`Seen::New`]) or found it committed.
    pub seen: Seen,
    /// The external effect's receipt: sent now (`Fresh`) or replayed.
    pub external: Receipt<T>,
}

impl<T> Delivered<T> {
    /// What a delivery did: `seen` by the inbox, `external` from the external effect's call.
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_sql::{Delivered, Seen};
    /// use idemkit_core::{Receipt, Source};
    ///
    /// let d = Delivered::new(Seen::New, Receipt::new("em_1", Source::Fresh, None));
    /// assert_eq!(d.external.value, "em_1");
    /// ```
    pub fn new(seen: Seen, external: Receipt<T>) -> Self {
        Delivered { seen, external }
    }
}

/// Why an inbox's `deliver` did not finish. Nothing half-done is left behind: a database
/// effect either committed with its inbox row or not at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeliverError<E> {
    /// The inbox failed (invalid ids, the database down): nothing ran.
    #[error(transparent)]
    Inbox(#[from] InboxError),
    /// The database effect failed; its transaction (and the inbox row) rolled back.
    #[error("the database effect failed")]
    Database(E),
    /// The database effect is committed (now or by an earlier delivery); the external
    /// effect's call failed. Redeliver: the inbox will say duplicate, and the key decides.
    #[error("the external effect failed: {0}")]
    External(Error<E>),
}

impl<E> DeliverError<E> {
    /// What the consumer should do with the message: retry (redeliver) or dead-letter.
    /// Invalid ids and refusals (a missing table) dead-letter; an unreachable database, a
    /// failed database effect and a retryable external failure retry; the external call's
    /// own errors follow [`Error::disposition`].
    ///
    /// # Example
    ///
    /// ```
    /// use idemkit_core::{Disposition, Key};
    /// use idemkit_sql::{DeliverError, InboxError};
    ///
    /// let invalid = DeliverError::<()>::Inbox(InboxError::InvalidId(Key::new("").unwrap_err()));
    /// assert_eq!(invalid.disposition(), Disposition::DeadLetter);
    /// ```
    pub fn disposition(&self) -> Disposition {
        match self {
            DeliverError::Inbox(InboxError::InvalidId(_)) => Disposition::DeadLetter,
            DeliverError::Inbox(InboxError::Store(e)) if e.is_unavailable() => {
                Disposition::Retry { after: None }
            }
            DeliverError::Inbox(_) => Disposition::DeadLetter,
            DeliverError::Database(_) => Disposition::Retry { after: None },
            DeliverError::External(e) => e.disposition(),
        }
    }
}
