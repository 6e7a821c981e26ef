//! The faults a scenario puts on its workers and its store, and when each lasted.

use std::sync::PoisonError;

use sqlx::{Connection, PgConnection};

use super::{Running, Servers, wait_for_sync};
use crate::check::{Fault, FaultKind};
use crate::events::now_ms;
use crate::servers::{redis_cli, signal};

impl Running<'_> {
    fn record(&self, kind: FaultKind, pid: Option<u32>, start: u64) {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Fault {
                kind,
                pid,
                start,
                end: now_ms(),
            });
    }

    /// Puts one fault, chosen by the seed among those of the scenario.
    pub(super) async fn fault(&mut self) {
        let mut kinds = vec![FaultKind::Kill, FaultKind::Stop, FaultKind::QueueCut];
        match (&self.servers, self.sc.failover) {
            (Servers::Redis { .. }, None) => {
                kinds.extend([
                    FaultKind::StoreRestart,
                    FaultKind::StoreCrash,
                    FaultKind::StoreCut,
                ]);
            }
            (Servers::Redis { .. }, Some(guard)) => {
                kinds.extend([FaultKind::StoreCut, FaultKind::Failover { guard }]);
            }
            (Servers::Postgres { .. }, _) => {
                kinds.extend([
                    FaultKind::StoreRestart,
                    FaultKind::StoreCrash,
                    FaultKind::StoreCut,
                ]);
            }
        }
        let mut kind = kinds[self.rng.usize(..kinds.len())];
        // A failover scenario fails over first, and again every fifth fault: a short run
        // must not end before its one fault of interest.
        if let Some(guard) = self.sc.failover
            && self.put.is_multiple_of(5)
        {
            kind = FaultKind::Failover { guard };
        }
        self.put += 1;
        let start = now_ms();
        match kind {
            FaultKind::Kill => {
                let i = self.rng.usize(..self.workers.len());
                let mut w = self.workers.swap_remove(i);
                signal(w.pid, "KILL");
                let _ = w.child.wait().await;
                self.record(kind, Some(w.pid), start);
                self.stopped
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .retain(|p| *p != w.pid);
                self.spawn();
            }
            FaultKind::Stop => {
                let stopped = self
                    .stopped
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                let free: Vec<u32> = self
                    .workers
                    .iter()
                    .map(|w| w.pid)
                    .filter(|p| !stopped.contains(p))
                    .collect();
                if free.len() < 2 {
                    return; // keep one worker running
                }
                let pid = free[self.rng.usize(..free.len())];
                // Past the lease: the key is taken over while this owner sleeps.
                let pause = self.s.lease.mul_f64(2.0 + self.rng.f64());
                signal(pid, "STOP");
                self.stopped
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(pid);
                let (faults, stopped) = (self.faults.clone(), self.stopped.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    signal(pid, "CONT");
                    stopped
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .retain(|p| *p != pid);
                    faults
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Fault {
                            kind,
                            pid: Some(pid),
                            start,
                            end: now_ms(),
                        });
                });
            }
            FaultKind::QueueCut => {
                terminate(&self.s.db_url, "application_name = 'idemkit-chaos'").await;
                self.record(kind, None, start);
            }
            FaultKind::StoreRestart => {
                match &mut self.servers {
                    Servers::Redis { primary, .. } => primary.restart_clean(None),
                    Servers::Postgres { server, .. } => {
                        server.restart();
                    }
                }
                self.record(kind, None, start);
            }
            FaultKind::StoreCrash => {
                // Down for a while, as a crashed server is before it is back.
                match &mut self.servers {
                    Servers::Redis { primary, .. } => primary.crash(),
                    Servers::Postgres { server, .. } => {
                        server.crash();
                    }
                }
                tokio::time::sleep(self.s.lease / 2).await;
                match &mut self.servers {
                    Servers::Redis { primary, .. } => primary.start_again(None),
                    Servers::Postgres { server, .. } => {
                        server.start_again();
                    }
                }
                self.record(kind, None, start);
            }
            FaultKind::StoreCut => {
                match &self.servers {
                    Servers::Redis { proxy, .. } => proxy.cut(),
                    Servers::Postgres { server, .. } => {
                        terminate(&server.url(), "backend_type = 'client backend'").await;
                    }
                }
                self.record(kind, None, start);
            }
            FaultKind::Failover { .. } => {
                self.failover().await;
                self.record(kind, None, start);
            }
        }
    }

    /// The replica falls behind (its link down for a lease), the primary dies, and the replica
    /// is promoted with whatever it has: without the guard it lacks the writes of its
    /// pause; with it, those writes were refused. The old primary comes back as the new
    /// primary's replica (a full resync).
    async fn failover(&mut self) {
        let Servers::Redis {
            primary,
            replica,
            proxy,
        } = &mut self.servers
        else {
            return;
        };
        let Some((r, link)) = replica.as_mut() else {
            return;
        };
        // The replication link goes down: writes from now on reach the primary only
        // (SIGSTOP on the replica would not do: the kernel keeps receiving for it).
        link.block();
        tokio::time::sleep(self.s.lease).await;
        primary.crash();
        redis_cli(r.port, &["replicaof", "no", "one"]);
        proxy.switch(r.port);
        // The old primary's data is stale: it restarts empty and resyncs from the new one.
        primary.wipe();
        link.switch(r.port);
        primary.start_again(Some(link.port));
        std::mem::swap(primary, r);
        wait_for_sync(primary.port);
    }
}

/// Cuts connections on a PostgreSQL server (`pg_terminate_backend`).
async fn terminate(url: &str, filter: &str) {
    if let Ok(mut c) = PgConnection::connect(url).await {
        let _ = sqlx::query(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND {filter}"
        ))
        .execute(&mut c)
        .await;
        let _ = c.close().await;
    }
}
