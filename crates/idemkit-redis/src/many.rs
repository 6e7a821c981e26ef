//! `begin_many` on Redis: a batch's keys grouped by slot (a single server has one group), one
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
        // One script call per slot (a single server has one group); the groups run
        // concurrently on a Cluster.
        let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
        for (i, k) in rkeys.iter().enumerate() {
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
        let mut claims: Vec<Option<Result<Claim, StoreError>>> =
            (0..reqs.len()).map(|_| None).collect();
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
}
