//! What a `begin` reply stands for: the claim of `begin.lua`'s answer (or of one item of
//! `begin_many.lua`'s, or of a replay read's completed record).

use std::time::Duration;

use idemkit_core::{
    BeginRequest, Claim, FencingToken, Ownership, Record, RecordState, Replay, StoreError,
};
use redis::Value;

use crate::errors::{int, unexpected};
use crate::scripts::clear_watched;

/// The claim a `begin.lua` reply (or one item of `begin_many.lua`'s) stands for.
pub(crate) fn claim_of(req: &BeginRequest<'_>, reply: Value) -> Result<Claim, StoreError> {
    match reply {
        Value::Int(0) => Ok(Claim::Mismatch),
        Value::Int(fencing) => {
            let lease = Ownership::new(req.owner, FencingToken::new(fencing as u64));
            Ok(Claim::Reserved {
                ownership: lease,
                // Redis cannot tell an expired reservation from an absent key: PX
                // removed it. Takeovers are not reported (see DESIGN.md).
                took_over: false,
            })
        }
        // A completed record to replay (its result shares the reply's buffer) if it was
        // made for the same fingerprint, or foreign bytes (decoding reports them).
        Value::BulkString(bytes) => {
            // The claim never uses the holder: not built (`decode_without_holder`).
            let record =
                Record::decode_without_holder(bytes.into()).map_err(StoreError::corrupt)?;
            match record.state {
                RecordState::Completed(_) if record.fingerprint != req.fingerprint => {
                    Ok(Claim::Mismatch)
                }
                RecordState::Completed(outcome) => {
                    Ok(Claim::Replay(Replay::new(record.fencing, outcome)))
                }
                _ => Err(StoreError::corrupt("a reservation returned as a result")),
            }
        }
        // A live reservation of another owner, its remaining lease and Redis' clock: in
        // flight if made for the same fingerprint.
        Value::Array(mut items) => {
            let pttl = int(items.get(1))?;
            let now_us = int(items.get(2))?;
            // Decoded with its holder: a rejected duplicate is told who runs the original.
            let record = match items.first_mut() {
                Some(Value::BulkString(b)) => {
                    clear_watched(b);
                    Record::decode_shared(std::mem::take(b).into()).map_err(StoreError::corrupt)?
                }
                other => return Err(unexpected(other.as_deref())),
            };
            if record.fingerprint != req.fingerprint {
                return Ok(Claim::Mismatch);
            }
            if pttl < 0 {
                // We always write reservations with an expiry: one without (PERSIST, a
                // hand-made SET) would block the key for ever and make waiters spin.
                return Err(StoreError::corrupt("a reservation without an expiry"));
            }
            // The fencing token is Redis' clock in µs when the reservation was made.
            let held_us = (now_us as u64).saturating_sub(record.fencing.get());
            Ok(Claim::InFlight {
                retry_after: Duration::from_millis(pttl as u64),
                fencing: record.fencing,
                held_for: Some(Duration::from_micros(held_us)),
                holder: record.holder,
            })
        }
        other => Err(unexpected(Some(&other))),
    }
}
