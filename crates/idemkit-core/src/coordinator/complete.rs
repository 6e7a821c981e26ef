//! Completion elsewhere: a call whose result is stored by a [`Completer`] (inside the caller's
//! own database transaction) instead of by [`Store::complete`]. ARCHITECTURE.md row 30.

use std::future::Future;
use std::sync::Arc;

use super::attempt::Attempt;
use super::call::Call;
use super::lease::{Held, LeaseState, Pending, bounded};
use super::options::{Completer, OnActionError};
use super::outcome::{AfterAction, Effective};
use super::receipt::Receipt;
use crate::codec::Codec;
use crate::error::Error;
use crate::ident::{Operation, StorageKey};
use crate::phase::Phase;
use crate::store::{Ownership, Store};
use crate::unwind;

impl<S: Store, C, P, K: Completer, B> Call<'_, S, C, P, K, B> {
    /// Runs the action as the key's owner with the lease renewed, then completes through
    /// `completer` once, after the renewals stopped.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_owned_completing<T, E, F, Fut>(
        &self,
        key: &StorageKey,
        lease: Ownership,
        (reserved_at, held): (tokio::time::Instant, Held),
        effective: &Effective,
        action: F,
        mut completer: K,
    ) -> Result<Receipt<T>, Error<E>>
    where
        C: Codec<T>,
        P: OnActionError<C, E>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let op: &Operation = &self.operation;
        let policy = &effective.policy;
        let state = Arc::new(LeaseState::reserved(reserved_at, held));
        let keeper = self.keeper(key, lease, reserved_at, policy, &state);
        let mut guard = self.guard(key, lease);
        let attempt = Attempt {
            fencing: Some(lease.fencing),
            lease: Some(state.clone()),
            downstream: Some(self.downstream(key)),
        };
        let started = op.metrics().start();
        let result = match keeper
            .keep_while(std::pin::pin!(unwind::catch(action(attempt))))
            .await
        {
            Ok(result) => result,
            Err(panic) => {
                // As in `run_owned`: a panic is a failed action, its key released.
                guard.pending = Pending::Done;
                self.release(key, &lease, policy).await;
                std::panic::resume_unwind(panic);
            }
        };
        op.metrics().timing(Phase::Action, started);
        let (completion, answer) = match self.after_action(result, &lease, effective) {
            AfterAction::Store(completion, answer) => (completion, answer),
            AfterAction::Release(e) => {
                guard.pending = Pending::Done;
                self.release(key, &lease, policy).await;
                return Err(Error::Action(e));
            }
        };
        // A test's crash point: the effect happened, nothing is stored yet.
        crate::fault::hit(crate::fault::FaultPoint::AfterAction);
        // From here the completion belongs to the completer's transaction: a dropped call
        // must neither release nor complete from outside it.
        guard.pending = Pending::Done;
        let started = op.metrics().start();
        let stored = bounded(
            policy.store_timeout,
            None,
            completer.complete(key, &lease, &completion),
        )
        .await;
        op.metrics().timing(Phase::Complete, started);
        match (stored, answer) {
            (Ok(()), Ok(receipt)) => Ok(receipt),
            (Ok(()), Err(e)) => Err(Error::ActionStored(e)),
            (Err(source), _) => {
                op.metrics().store_error(Phase::Complete);
                if source.is_lease_lost() {
                    op.metrics().lease_lost.increment(1);
                    state.lose();
                }
                tracing::warn!(operation = %op, key = %self.key, error = %source,
                    "completion in the caller's transaction failed; the transaction must roll back");
                Err(Error::Store {
                    phase: Phase::Complete,
                    source,
                })
            }
        }
    }
}
