//! Lanes: the connections of a single-server store, which one a command takes
//! (ARCHITECTURE row 35), and what a `begin` or a `complete` does on its lane: the replay
//! read after a run of replays, the entry into the lane's coalescer, the plain completion
//! (`SET … IFEQ`), and the script, under the durability guard when there is one.

use std::sync::atomic::Ordering;

use idemkit_core::{
    BeginRequest, Claim, CompleteRequest, FencingToken, Ownership, StorageKey, Store, StoreError,
};
use redis::{Cmd, Value};

use crate::claim::claim_of;
use crate::coalesce::{self, BeginJob, CompleteJob, OnLane};
use crate::conn::Conn;
use crate::errors::{int, map_err, owner_checked};
use crate::keys::{self, ms};
use crate::resp::Arg;
use crate::scripts::{self, Done, Head, Mine, Parts, Rest, eval_on};
use crate::{RedisStore, durable, plain, replays, stamp};
use idemkit_coalesce::Entry;

/// One connection of a single-server store with its two queues. Every command about a key
/// goes through the key's lane (chosen by its hash tag), so a key's commands reach Redis in
/// the order they were sent, as on one connection; different lanes let Redis run one
/// connection's commands while the client reads another's replies (ARCHITECTURE row 35).
pub(crate) struct Lane {
    pub(crate) conn: Conn,
    pub(crate) begins: idemkit_coalesce::Lane<BeginJob>,
    pub(crate) completes: idemkit_coalesce::Lane<CompleteJob>,
}

impl Lane {
    pub(crate) fn new(conn: Conn) -> Self {
        Lane {
            conn,
            begins: idemkit_coalesce::Lane::new(coalesce::LIMITS),
            completes: idemkit_coalesce::Lane::new(coalesce::LIMITS),
        }
    }
}

impl RedisStore {
    /// The connection of a Redis key's lane.
    pub(crate) fn lane_conn(&self, rkey: &str) -> Conn {
        self.shared.lanes[self.lane(rkey)].conn.clone()
    }

    /// The lane of a Redis key of this store (see `Shared::lanes`).
    pub(crate) fn lane(&self, rkey: &str) -> usize {
        keys::lane(self.shared.prefix.len(), rkey, self.shared.lanes.len())
    }

    /// The lane of a `begin`: the lanes in turn, whatever the key. A begin is its caller's
    /// first command on the key and is never on the wire beside another of that caller's
    /// commands, so no order is at stake; taking turns spreads a hot key's replays too.
    pub(crate) fn begin_lane(&self) -> usize {
        let lanes = self.shared.lanes.len();
        if lanes == 1 {
            return 0;
        }
        self.shared.next_begin.fetch_add(1, Ordering::Relaxed) % lanes
    }
}

impl RedisStore {
    /// `EVALSHA` of `lua` on `rkey` with `args` on the key's lane: one round trip.
    pub(crate) async fn eval<T: redis::FromRedisValue>(
        &self,
        lua: &scripts::Lua,
        rkey: &str,
        args: impl FnOnce(&mut Cmd),
    ) -> Result<T, StoreError> {
        eval_on(&mut self.lane_conn(rkey), lua, rkey, args).await
    }

    /// `Store::begin` on one lane.
    pub(crate) async fn begin_on(
        &self,
        lane: usize,
        req: &BeginRequest<'_>,
    ) -> Result<Claim, StoreError> {
        let mut rkey = self.redis_key(req.key);
        // Not with the durability guard: a replay waits for the replicas (see below), and a
        // `GET` writes nothing a `WAIT` could count.
        if self.shared.durable.is_none() && self.shared.replays.likely() {
            // After a run of replays: a `GET` first, answered only by a completed record.
            let mut conn = self.shared.lanes[lane].conn.clone();
            let get = [Arg::Bytes(b"GET"), Arg::from(&rkey[..])];
            let read = crate::resp::query(&mut conn, &[&get])
                .await
                .map_err(map_err)?;
            match read {
                Value::BulkString(bytes) if replays::completed(&bytes) => {
                    return claim_of(req, Value::BulkString(bytes));
                }
                _ => {}
            }
        }
        let fingerprint = req.fingerprint.map(|f| f.to_bytes());
        let _lead = if self.shared.coalesce {
            let to = OnLane {
                shared: self.shared.clone(),
                at: lane,
            };
            let entry = idemkit_coalesce::queue(&to, |reply| BeginJob {
                // Queued, this call needs the key no more: moved, not copied.
                rkey: std::mem::take(&mut rkey),
                owner: req.owner.as_u128(),
                fingerprint,
                lease_ms: ms(req.lease),
                holder: req.holder.cloned(),
                reply,
            });
            match entry {
                Entry::Alone(lead) => Some(lead),
                Entry::Queued(answer) => {
                    return claim_of(req, idemkit_coalesce::answer(answer).await?);
                }
            }
        } else {
            None
        };
        let parts = Parts {
            owner: req.owner.as_u128(),
            fingerprint: fingerprint.as_ref(),
            holder: req.holder.map(|h| (&**h, ms(req.lease))),
        };
        // Without coalescing, a plain begin first where the store has an estimate of the
        // server's clock (see `stamp`); the script when that answers nothing. With it, a
        // call that goes alone found its lane idle: the server has time to spare, and the
        // script costs the client less (a pipeline's replies against one reply, measured
        // in docs/benchmarks.md); batches, which form under load, go plain.
        let mut stale = None;
        // Without coalescing, a lone `begin` on an idle connection of the store's own client
        // is the script as well (one reply to read against the pipeline's three); plain
        // when other requests are on the wire, where the server's time is what counts.
        let alone = matches!(&self.shared.lanes[lane].conn, Conn::Own(w) if w.idle());
        if !self.shared.coalesce && !alone {
            let plain = stamp::begin(
                &self.shared.clock,
                &mut self.shared.lanes[lane].conn.clone(),
                std::iter::once((&rkey[..], parts, ms(req.lease))),
            )
            .await?;
            match plain.and_then(|mut found| found.pop()) {
                Some(stamp::Found::Answer(reply)) => return claim_of(req, reply),
                Some(stamp::Found::Script { stale: s }) => stale = s,
                None => {}
            }
        }
        let (reply, acked) = if self.shared.durable.is_none() {
            // A first delivery's script: its arguments written where they are sent.
            let stale = stale.map(u64::to_be_bytes);
            let mut args = [
                Arg::Head(&parts),
                Arg::Int(ms(req.lease)),
                Arg::Rest(&parts),
                Arg::Bytes(&[]),
            ];
            let n = match &stale {
                Some(stale) => {
                    args[3] = Arg::Bytes(stale);
                    4
                }
                None => 3,
            };
            let mut conn = self.shared.lanes[lane].conn.clone();
            let reply = scripts::eval_args(&mut conn, &scripts::BEGIN, &rkey, &args[..n]).await?;
            (reply, Ok(()))
        } else {
            self.eval_guarded(
                lane,
                &scripts::BEGIN_GUARDED,
                &rkey,
                |cmd| {
                    cmd.arg(Head(&parts)).arg(ms(req.lease)).arg(Rest(&parts));
                    if let Some(stale) = stale {
                        cmd.arg(&stale.to_be_bytes()[..]);
                    }
                },
                // A reservation, or a completed record (whose expiry the guarded script
                // wrote again): replicas must have it.
                |reply| matches!(reply, Value::Int(1..) | Value::BulkString(_)),
            )
            .await?
        };
        if let Value::Int(token @ 1..) = reply {
            // A reservation's token is the server's clock when it was made (or, for a key
            // that was already the caller's, earlier): what the stamps are estimated from.
            self.shared.clock.learn(token as u64);
        }
        // A replay the replicas did not acknowledge: its value, called unconfirmed.
        let unconfirmed = matches!(reply, Value::BulkString(_)) && acked.is_err();
        if let (Value::Int(fencing @ 1..), Err(e)) = (&reply, acked) {
            // Not durable: give the key back, so that nobody waits for a reservation whose
            // caller is told nothing ran (best effort: if this fails too, the lease expires).
            let lease = Ownership::new(req.owner, FencingToken::new(*fencing as u64));
            if let Err(release) = self.release(req.key, &lease).await {
                tracing::warn!(key = %req.key, error = %release,
                    "releasing an unacknowledged reservation failed; it expires with its lease");
            }
            return Err(e);
        }
        match claim_of(req, reply)? {
            Claim::Replay(replay) if unconfirmed => Ok(Claim::Replay(replay.with_confirmed(false))),
            claim => Ok(claim),
        }
    }

    /// A script that writes, then the durability guard's `WAIT` if `needs_wait` says the
    /// reply wrote something, both on one connection of their own (see `durable`). Without
    /// the guard, the script alone on `lane`'s connection.
    pub(crate) async fn eval_guarded(
        &self,
        lane: usize,
        lua: &scripts::Lua,
        rkey: &str,
        args: impl FnOnce(&mut Cmd),
        needs_wait: impl FnOnce(&Value) -> bool,
    ) -> Result<(Value, Result<(), StoreError>), StoreError> {
        match &self.shared.durable {
            None => {
                let mut conn = self.shared.lanes[lane].conn.clone();
                Ok((eval_on(&mut conn, lua, rkey, args).await?, Ok(())))
            }
            // Boxed: the guarded path (a connection to open, a `WAIT`) would otherwise make
            // every call's future larger, and futures are moved on every call.
            Some(durable) => Box::pin(durable::eval(durable, lua, rkey, args, needs_wait)).await,
        }
    }

    /// `Store::complete` on the key's lane.
    pub(crate) async fn complete_on(
        &self,
        key: &StorageKey,
        lease: &Ownership,
        completion: &CompleteRequest,
    ) -> Result<(), StoreError> {
        let mut rkey = self.redis_key(key);
        let lane = self.lane(&rkey);
        let reserved = completion.reservation.as_ref();
        let _lead = if self.shared.coalesce {
            let to = OnLane {
                shared: self.shared.clone(),
                at: lane,
            };
            let entry = idemkit_coalesce::queue(&to, |reply| CompleteJob {
                rkey: std::mem::take(&mut rkey),
                owner: lease.owner.as_u128(),
                fencing: lease.fencing.get(),
                ttl_ms: ms(completion.ttl),
                kind: completion.kind,
                bytes: completion.bytes.clone(),
                fingerprint: reserved.and_then(|r| r.fingerprint).map(|f| f.to_bytes()),
                holder: reserved.and_then(|r| Some((r.holder.clone()?, ms(r.lease)))),
                known: reserved.is_some() && self.shared.durable.is_none(),
                reply,
            });
            match entry {
                Entry::Alone(lead) => Some(lead),
                Entry::Queued(answer) => {
                    let reply = idemkit_coalesce::answer(answer).await?;
                    return owner_checked(int(Some(&reply))?);
                }
            }
        } else {
            None
        };
        if let (Some(r), None) = (reserved, &self.shared.durable) {
            // The reservation known byte for byte: one plain `SET … IFEQ` where the server
            // has it; the script only if that wrote nothing (see `plain`).
            let mut conn = self.shared.lanes[lane].conn.clone();
            if self
                .shared
                .caps
                .ifeq(&mut conn, &self.shared.prefix)
                .await?
            {
                let fingerprint = r.fingerprint.map(|f| f.to_bytes());
                let parts = Parts {
                    owner: lease.owner.as_u128(),
                    fingerprint: fingerprint.as_ref(),
                    holder: r.holder.as_ref().map(|h| (&**h, ms(r.lease))),
                };
                let done = plain::Completion {
                    fencing: lease.fencing.get(),
                    kind: completion.kind,
                    bytes: &completion.bytes,
                    ttl_ms: ms(completion.ttl),
                };
                if plain::complete(&self.shared.caps, &mut conn, &rkey, &parts, &done).await? {
                    return Ok(());
                }
            }
        }
        if self.shared.durable.is_none() {
            let fingerprint = reserved.and_then(|r| r.fingerprint).map(|f| f.to_bytes());
            let parts = Parts {
                owner: lease.owner.as_u128(),
                fingerprint: fingerprint.as_ref(),
                holder: reserved.and_then(|r| Some((&**r.holder.as_ref()?, ms(r.lease)))),
            };
            let fencing = lease.fencing.get();
            let args = [
                Arg::Int(ms(completion.ttl)),
                Arg::Mine(&parts, fencing),
                Arg::Done(&parts, fencing, completion.kind, &completion.bytes),
            ];
            let mut conn = self.shared.lanes[lane].conn.clone();
            let reply = scripts::eval_args(&mut conn, self.complete_script(), &rkey, &args).await?;
            return owner_checked(int(Some(&reply))?);
        }
        let (reply, acked) = self
            .eval_guarded(
                lane,
                self.complete_script(),
                &rkey,
                |cmd| {
                    let fingerprint = reserved.and_then(|r| r.fingerprint).map(|f| f.to_bytes());
                    let parts = Parts {
                        owner: lease.owner.as_u128(),
                        fingerprint: fingerprint.as_ref(),
                        holder: reserved.and_then(|r| Some((&**r.holder.as_ref()?, ms(r.lease)))),
                    };
                    cmd.arg(ms(completion.ttl))
                        .arg(Mine(&parts, lease.fencing.get()))
                        .arg(Done {
                            parts: &parts,
                            fencing: lease.fencing.get(),
                            kind: completion.kind,
                            bytes: &completion.bytes,
                        });
                },
                |reply| matches!(reply, Value::Int(1)),
            )
            .await?;
        owner_checked(int(Some(&reply))?)?;
        acked
    }
}
