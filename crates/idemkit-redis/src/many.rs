//! `begin_many` on Redis: on one server, the batch's plain begins first (one pipeline, see
//! `stamp`); the keys left grouped by slot (a single server has one group), one
//! `begin_many.lua` call per group, the groups concurrent on a Cluster; each key answered as
//! `begin` would answer it.

use idemkit_core::{BeginRequest, Claim, StoreError};
use redis::{Cmd, Value};

use crate::RedisStore;
use crate::claim::claim_of;
use crate::conn::Conn;
use crate::errors::unexpected;
use crate::keys::{self, ms};
use crate::scripts::{self, Parts, query_loading};

impl RedisStore {
    /// The claims of `reqs` (two keys or more, no durability guard), in their order.
    pub(crate) async fn begin_grouped(
        &self,
        reqs: &[BeginRequest<'_>],
    ) -> Vec<Result<Claim, StoreError>> {
        let rkeys: Vec<String> = reqs.iter().map(|r| self.redis_key(r.key)).collect();
        let mut claims: Vec<Option<Result<Claim, StoreError>>> =
            (0..reqs.len()).map(|_| None).collect();
        // On one server, plain begins first (see `stamp`): one pipeline for the batch;
        // what it does not answer goes to the scripts below.
        let left = self.begin_plain(reqs, &rkeys, &mut claims).await;
        // One script call per slot (a single server has one group); the groups run
        // concurrently on a Cluster.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, k) in rkeys.iter().enumerate().filter(|(i, _)| left[*i]) {
            let slot = match self.conn {
                Conn::Cluster(_) => keys::slot(k),
                _ => 0,
            };
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, members)) => members.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        let calls = groups.iter().map(|(_, members)| {
            let (rkeys, mut conn) = (&rkeys, self.conn.clone());
            async move {
                let lease = reqs[members[0]].lease;
                let mut cmd = Cmd::new();
                cmd.arg("EVALSHA")
                    .arg(scripts::BEGIN_MANY.script.get_hash())
                    .arg(members.len());
                for &i in members {
                    cmd.arg(&rkeys[i]);
                }
                let fingerprints: Vec<_> = members
                    .iter()
                    .map(|&i| reqs[i].fingerprint.map(|f| f.to_bytes()))
                    .collect();
                let parts: Vec<Parts<'_>> = members
                    .iter()
                    .zip(&fingerprints)
                    .map(|(&i, f)| Parts {
                        owner: reqs[i].owner.as_u128(),
                        fingerprint: f.as_ref(),
                        holder: reqs[i].holder.map(|h| (&**h, ms(lease))),
                    })
                    .collect();
                scripts::begin_many_args(&mut cmd, ms(lease), &parts);
                query_loading(&mut conn, &cmd, &scripts::BEGIN_MANY).await
            }
        });
        let replies = futures_util::future::join_all(calls).await;
        for ((_, members), reply) in groups.iter().zip(replies) {
            match reply {
                Ok(Value::Array(items)) if items.len() == members.len() => {
                    for (&i, item) in members.iter().zip(items) {
                        claims[i] = Some(claim_of(&reqs[i], item));
                    }
                }
                Ok(other) => {
                    for &i in members {
                        claims[i] = Some(Err(unexpected(Some(&other))));
                    }
                }
                Err(e) => {
                    // One error for the group: each key gets one of its kind, with its text.
                    let (kind, text) = (e.kind(), e.to_string());
                    for &i in members {
                        claims[i] = Some(Err(StoreError::new(kind, text.clone())));
                    }
                }
            }
        }
        claims
            .into_iter()
            .map(|c| c.unwrap_or_else(|| Err(StoreError::corrupt("no reply for a key"))))
            .collect()
    }

    /// The plain begins of a batch (one pipeline, see `stamp`), their claims written into
    /// `claims`; stale stamps taken again by `begin.lua`, one call each. Which keys are left
    /// for the scripts (every one when plain begins do not apply).
    async fn begin_plain(
        &self,
        reqs: &[BeginRequest<'_>],
        rkeys: &[String],
        claims: &mut [Option<Result<Claim, StoreError>>],
    ) -> Vec<bool> {
        let fingerprints: Vec<_> = reqs
            .iter()
            .map(|r| r.fingerprint.map(|f| f.to_bytes()))
            .collect();
        let parts = |i: usize| Parts {
            owner: reqs[i].owner.as_u128(),
            fingerprint: fingerprints[i].as_ref(),
            holder: reqs[i].holder.map(|h| (&**h, ms(reqs[i].lease))),
        };
        let found = crate::stamp::begin(
            &self.shared.clock,
            &mut self.conn.clone(),
            (0..reqs.len()).map(|i| (&rkeys[i][..], parts(i), ms(reqs[i].lease))),
        )
        .await;
        let found = match found {
            Ok(Some(found)) => found,
            Ok(None) => return vec![true; reqs.len()],
            Err(e) => {
                let (kind, text) = (e.kind(), e.to_string());
                for claim in claims.iter_mut() {
                    *claim = Some(Err(StoreError::new(kind, text.clone())));
                }
                return vec![false; reqs.len()];
            }
        };
        let mut left = vec![false; reqs.len()];
        let mut stale = Vec::new();
        for (i, found) in found.into_iter().enumerate() {
            match found {
                crate::stamp::Found::Answer(reply) => claims[i] = Some(claim_of(&reqs[i], reply)),
                crate::stamp::Found::Script { stale: None } => left[i] = true,
                crate::stamp::Found::Script { stale: Some(token) } => stale.push((i, token)),
            }
        }
        // In one script call, before the scripts of the keys left (a duplicate of a
        // restamped key then reads the token its owner is given).
        if let Some(&(_, token)) = stale.first() {
            let restamped = crate::stamp::restamp(
                &mut self.conn.clone(),
                token,
                stale
                    .iter()
                    .map(|&(i, _)| (&rkeys[i][..], reqs[i].owner.as_u128())),
            )
            .await;
            match restamped {
                Ok(tokens) => {
                    for (&(i, _), token) in stale.iter().zip(tokens) {
                        match token {
                            Some(t) => claims[i] = Some(claim_of(&reqs[i], Value::Int(t as i64))),
                            None => left[i] = true,
                        }
                    }
                }
                Err(e) => {
                    let (kind, text) = (e.kind(), e.to_string());
                    for &(i, _) in &stale {
                        claims[i] = Some(Err(StoreError::new(kind, text.clone())));
                    }
                }
            }
        }
        left
    }
}
