//! Head to head: idemkit against the two Rust peers at concurrency 64, in slices of about
//! `--slice-ms` (200 ms) each.
//!
//! The rows of a round measure each case for a second or so, a case after another, so
//! idemkit's misses and a peer's run up to half a minute apart; on this VM, whose speed
//! moves by a third within minutes, the ratio of two such rows moved from 0.6× to 1.7×
//! between rounds (`docs/benchmarks.md`). Here each contender's calls are cut into slices
//! of a fraction of a second, and one slice of each runs after another (in an order that
//! turns every slice), so a slice's three measurements meet the same stretch of the
//! machine: the target's ratio is taken within each slice (`paired`), for misses (fresh
//! keys) and hits (one completed key). The server's CPU over idemkit's miss slices is
//! read too (`INFO cpu`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idemkit_core::{Coordinator, Key, Operation};
use idemkit_redis::RedisStore;

use crate::measure::{Bench, timed};

/// Slices per contender and kind in a round.
pub(crate) const SLICES: usize = 10;

/// The concurrency of the targets.
const CONCURRENCY: usize = 64;

/// One kind of call (`miss` or `hit`) head to head: each contender's calls per second in
/// every slice, slice by slice.
#[derive(Debug, Clone, Default)]
pub(crate) struct Duel {
    pub(crate) kind: &'static str,
    pub(crate) idemkit: Vec<f64>,
    /// idempotency-kit's and idempotent's.
    pub(crate) peers: [Vec<f64>; 2],
    /// The server's CPU per idemkit call in each slice, µs.
    pub(crate) idemkit_cpu_us: Vec<f64>,
}

impl Duel {
    /// idemkit over the faster peer of the same slice, slice by slice.
    pub(crate) fn ratios(&self) -> Vec<f64> {
        self.idemkit
            .iter()
            .zip(self.peers[0].iter().zip(&self.peers[1]))
            .map(|(i, (a, b))| i / a.max(*b))
            .filter(|r| r.is_finite())
            .collect()
    }

    /// The slices of several rounds, as one.
    pub(crate) fn join(duels: &[&Duel]) -> Duel {
        let mut out = Duel {
            kind: duels.first().map_or("", |d| d.kind),
            ..Duel::default()
        };
        for d in duels {
            out.idemkit.extend(&d.idemkit);
            out.peers[0].extend(&d.peers[0]);
            out.peers[1].extend(&d.peers[1]);
            out.idemkit_cpu_us.extend(&d.idemkit_cpu_us);
        }
        out
    }
}

type Call = Arc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

fn call<F, Fut>(f: F) -> Call
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |i| Box::pin(f(i)))
}

/// Runs the duels on the server at `url`: [`SLICES`] slices per contender and kind, each
/// about `slice_len` long and at least `ops / SLICES` calls; `round` turns the order.
///
/// # Errors
///
/// A connection or a call failed.
pub(crate) async fn run(
    url: &str,
    ops: usize,
    slice_len: Duration,
    round: usize,
) -> Result<Vec<Duel>, String> {
    let bench = Bench::connect(url).await?;
    let run = format!("{:x}", fastrand::u64(..));
    let coordinator = Coordinator::new(
        RedisStore::builder()
            .prefix(format!("idemkit-bench-duel:{run}"))
            .connect(url)
            .await
            .map_err(|e| e.to_string())?,
    );
    let op = Operation::new("bench").expect("valid");
    let kit = Arc::new(idempotency_kit::RedisStore::new(
        redis027::Client::open(url)
            .map_err(|e| e.to_string())?
            .get_connection_manager()
            .await
            .map_err(|e| e.to_string())?,
    ));
    let idem = Arc::new(
        idempotent::store::valkey::ValkeyStore::with_prefix(
            redis::Client::open(url).map_err(|e| e.to_string())?,
            Some(&format!("idempotent-duel-{run}")),
        )
        .await
        .map_err(|e| e.to_string())?,
    );
    let next = Arc::new(AtomicU64::new(0));
    let fresh = move || next.fetch_add(1, Ordering::Relaxed);
    let (idemkit_hit, kit_hit, idem_hit) = (
        Key::new("duel-hit").expect("valid"),
        idempotency_kit::IdempotencyKey::derive("bench", format!("{run}-duel-hit").as_bytes())
            .map_err(|e| e.to_string())?,
        idempotent::IdempotencyKey::new("duel-hit").map_err(|e| e.to_string())?,
    );
    let idemkit_call = |c: Coordinator<RedisStore>, o: Operation, k: Key| async move {
        c.call(&o, &k)
            .ttl(Duration::from_secs(60))
            .run(|_| async { Ok::<_, std::convert::Infallible>(1u32) })
            .await
            .expect("idemkit call");
    };
    // The hits' keys completed first (the miss path's scripts loaded with them).
    idemkit_call(coordinator.clone(), op.clone(), idemkit_hit.clone()).await;
    crate::kit_call(&kit, &kit_hit).await;
    crate::idem_call(&idem, &idem_hit).await;

    let mut duels = Vec::new();
    for kind in ["miss", "hit"] {
        let miss = kind == "miss";
        let contenders: [Call; 3] = [
            {
                let (c, o, hit, fresh) = (
                    coordinator.clone(),
                    op.clone(),
                    idemkit_hit.clone(),
                    fresh.clone(),
                );
                call(move |_| {
                    let k = if miss {
                        Key::new(format!("duel-{}", fresh())).expect("valid")
                    } else {
                        hit.clone()
                    };
                    idemkit_call(c.clone(), o.clone(), k)
                })
            },
            {
                let (s, hit, fresh, run) =
                    (kit.clone(), kit_hit.clone(), fresh.clone(), run.clone());
                call(move |_| {
                    let k = if miss {
                        idempotency_kit::IdempotencyKey::derive(
                            "bench",
                            format!("{run}-duel-{}", fresh()).as_bytes(),
                        )
                        .expect("key")
                    } else {
                        hit.clone()
                    };
                    let s = s.clone();
                    async move { crate::kit_call(&s, &k).await }
                })
            },
            {
                let (s, hit, fresh) = (idem.clone(), idem_hit.clone(), fresh.clone());
                call(move |_| {
                    let k = if miss {
                        idempotent::IdempotencyKey::new(format!("duel-{}", fresh())).expect("key")
                    } else {
                        hit.clone()
                    };
                    let s = s.clone();
                    async move { crate::idem_call(&s, &k).await }
                })
            },
        ];
        eprintln!(
            "  head to head, {kind}es, c={CONCURRENCY}: {SLICES} slices of about {} ms each",
            slice_len.as_millis()
        );
        let mut duel = Duel {
            kind,
            ..Duel::default()
        };
        // Each contender's slice lasts about `slice_len` whatever its speed: a slice of a fixed
        // count was shortest for the fastest, where starting 64 tasks and waiting for the
        // last of them weigh most, and pulled every ratio towards 1 (docs/benchmarks.md). A
        // first slice, not counted, gives each one's rate.
        let mut per_slice = [(ops / SLICES).max(CONCURRENCY); 3];
        for (who, n) in per_slice.iter_mut().enumerate() {
            let c = contenders[who].clone();
            let (lat, elapsed) = timed(CONCURRENCY, *n, move |i| c(i)).await?;
            let rate = lat.len() as f64 / elapsed.as_secs_f64().max(1e-6);
            *n = (*n).max((rate * slice_len.as_secs_f64()) as usize);
        }
        for slice in 0..SLICES {
            for who in crate::paired::rotated(&[0, 1, 2], round * SLICES + slice) {
                let c = contenders[who].clone();
                let per_slice = per_slice[who];
                let cpu_before = bench.redis_cpu().await?;
                let (lat, elapsed) = timed(CONCURRENCY, per_slice, move |i| c(i)).await?;
                let cpu = bench.redis_cpu().await? - cpu_before;
                let per_sec = lat.len() as f64 / elapsed.as_secs_f64();
                match who {
                    0 => {
                        duel.idemkit.push(per_sec);
                        duel.idemkit_cpu_us.push(cpu * 1e6 / lat.len() as f64);
                    }
                    peer => duel.peers[peer - 1].push(per_sec),
                }
            }
        }
        duels.push(duel);
    }
    Ok(duels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_pairs_idemkit_with_its_faster_peer() {
        let d = Duel {
            kind: "miss",
            idemkit: vec![120.0, 60.0],
            peers: [vec![100.0, 30.0], vec![80.0, 50.0]],
            idemkit_cpu_us: vec![5.0, 6.0],
        };
        assert_eq!(d.ratios(), vec![1.2, 1.2]);
        let joined = Duel::join(&[&d, &d]);
        assert_eq!((joined.kind, joined.ratios().len()), ("miss", 4));
        assert_eq!(joined.idemkit_cpu_us, vec![5.0, 6.0, 5.0, 6.0]);
    }
}
