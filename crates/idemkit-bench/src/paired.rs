//! Ratios decided pair by pair. This VM's speed moves by a third within minutes
//! (`docs/benchmarks.md`), so a ratio of two medians taken from different rounds can say
//! "met" or "not met" by which round was slow. So a target's figure is the median of
//! ratios each taken between measurements made side by side: within a round for the
//! consumer runners (round `i` of idemkit and of idempotency off, in an order that turns
//! from round to round: [`rotated`]), within a slice of a fraction of a second for the
//! Redis peers (`duel`). It is printed with the middle half of those ratios; and where
//! that middle half lies on both sides of a target ([`Paired::straddles`]), the benchmark
//! runs more rounds, up to `--max-rounds` ([`more_rounds`]).

/// One ratio measured pair by pair: idemkit's figure of round (or slice) `i` over its
/// yardstick's of the same round.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Paired {
    /// The ratios, in the order measured.
    pub(crate) ratios: Vec<f64>,
    /// What a pair is, for the reader: `round` (the default) or `slice`.
    pub(crate) unit: &'static str,
}

impl Paired {
    /// The ratios of `num[i] / den[i]` over the rounds both have (a round that lacks either
    /// figure is left out).
    pub(crate) fn of(num: &[Option<f64>], den: &[Option<f64>]) -> Self {
        let ratios = num
            .iter()
            .zip(den)
            .filter_map(|(n, d)| Some((*n)? / (*d)?))
            .filter(|r| r.is_finite())
            .collect();
        Paired {
            ratios,
            unit: "round",
        }
    }

    /// These ratios, as measured in slices.
    pub(crate) fn slices(ratios: Vec<f64>) -> Self {
        Paired {
            ratios,
            unit: "slice",
        }
    }

    /// The median ratio (the mean of the middle two for an even count); `None` without
    /// rounds.
    pub(crate) fn median(&self) -> Option<f64> {
        let mut r = self.ratios.clone();
        r.sort_by(f64::total_cmp);
        let n = r.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(r[n / 2]),
            _ => Some((r[n / 2 - 1] + r[n / 2]) / 2.0),
        }
    }

    /// The middle half of the ratios: the lower and the upper quartile (nearest rank; with
    /// three pairs or fewer, the lowest and the highest).
    pub(crate) fn spread(&self) -> Option<(f64, f64)> {
        let mut r = self.ratios.clone();
        r.sort_by(f64::total_cmp);
        let n = r.len();
        (n > 0).then(|| (r[n / 4], r[(3 * n / 4).min(n - 1)]))
    }

    /// Whether the pairs disagree on the target `threshold` (the middle half has ratios
    /// below it and at or above it): more rounds are needed to decide.
    pub(crate) fn straddles(&self, threshold: f64) -> bool {
        self.spread()
            .is_some_and(|(lo, hi)| lo < threshold && hi >= threshold)
    }

    /// `1.12× (0.98–1.25×, 5 rounds)`: the median, the middle half, the pairs; or `-`
    /// without pairs.
    pub(crate) fn show(&self) -> String {
        self.show_with("")
    }

    /// As [`Paired::show`], with `detail` inside the parentheses after the rounds:
    /// `1.12× (0.98–1.25×, 5 rounds; detail)`.
    pub(crate) fn show_with(&self, detail: &str) -> String {
        match (self.median(), self.spread()) {
            (Some(m), Some((lo, hi))) => format!(
                "{m:.2}× ({lo:.2}–{hi:.2}×, {} {}{}{}{detail})",
                self.ratios.len(),
                if self.unit.is_empty() {
                    "round"
                } else {
                    self.unit
                },
                if self.ratios.len() == 1 { "" } else { "s" },
                if detail.is_empty() { "" } else { "; " },
            ),
            _ => "-".into(),
        }
    }
}

/// `items` in the order round `round` runs them: turned by one place a round, so that no
/// case always runs first (after a flush, on a cold cache) or last.
pub(crate) fn rotated<T: Clone>(items: &[T], round: usize) -> Vec<T> {
    let mut v = items.to_vec();
    if !v.is_empty() {
        let by = round % v.len();
        v.rotate_left(by);
    }
    v
}

/// Whether another round should run after `done` rounds: always below `min`, never at
/// `max`, and between them while some target is still `undecided`.
pub(crate) fn more_rounds(done: usize, min: usize, max: usize, undecided: bool) -> bool {
    let min = min.max(1);
    done < min || (done < max.max(min) && undecided)
}

/// Runs `one(round, mode)` for every mode in each round (the modes' order turned each
/// round: [`rotated`]), `min` rounds and then more while `undecided` (given every mode's
/// figures so far, in round order) says the rounds disagree, up to `max`. Every mode's
/// figures, in round order, so that round `i` of two modes pair.
///
/// # Errors
///
/// The first case that fails.
pub(crate) async fn interleaved<M, T, F, Fut>(
    modes: &[M],
    min: usize,
    max: usize,
    mut one: F,
    undecided: impl Fn(&[Vec<T>]) -> bool,
) -> Result<Vec<Vec<T>>, String>
where
    M: Copy,
    F: FnMut(usize, M) -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let mut results: Vec<Vec<T>> = modes.iter().map(|_| Vec::new()).collect();
    let order: Vec<usize> = (0..modes.len()).collect();
    let mut round = 0;
    while more_rounds(round, min, max, round > 0 && undecided(&results)) {
        if round >= min.max(1) {
            eprintln!("the rounds disagree on a target: round {}", round + 1);
        }
        for i in rotated(&order, round) {
            results[i].push(one(round, modes[i]).await?);
        }
        round += 1;
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_is_decided_on_the_rounds_own_pairs() {
        // Round 2 was slow for both: the medians of each side would pair round 1's idemkit
        // with round 3's peer; the pairs do not.
        let p = Paired::of(
            &[Some(110.0), Some(60.0), Some(100.0)],
            &[Some(100.0), Some(50.0), Some(95.0)],
        );
        assert_eq!(p.ratios.len(), 3);
        let m = p.median().unwrap();
        assert!((m - 1.1).abs() < 1e-9, "{m}");
        let (lo, hi) = p.spread().unwrap();
        assert!((lo - 100.0 / 95.0).abs() < 1e-9 && (hi - 1.2).abs() < 1e-9);
        assert_eq!(p.show(), "1.10× (1.05–1.20×, 3 rounds)");
        assert_eq!(p.show_with("a / b"), "1.10× (1.05–1.20×, 3 rounds; a / b)");
        assert!(p.straddles(1.1) && !p.straddles(1.0) && !p.straddles(1.3));
    }

    #[test]
    fn a_round_without_either_figure_is_left_out() {
        let p = Paired::of(&[Some(2.0), None, Some(3.0)], &[Some(1.0), Some(1.0), None]);
        assert_eq!(p.ratios, vec![2.0]);
        assert_eq!(Paired::default().median(), None);
        assert_eq!(Paired::default().show(), "-");
        assert!(!Paired::default().straddles(1.0));
        let even = Paired {
            ratios: vec![1.0, 4.0, 2.0, 3.0],
            ..Paired::default()
        };
        assert_eq!(even.median(), Some(2.5));
    }

    #[test]
    fn the_order_turns_each_round_and_more_rounds_run_only_while_undecided() {
        assert_eq!(rotated(&[1, 2, 3], 0), vec![1, 2, 3]);
        assert_eq!(rotated(&[1, 2, 3], 1), vec![2, 3, 1]);
        assert_eq!(rotated(&[1, 2, 3], 4), vec![2, 3, 1]);
        assert!(rotated::<u8>(&[], 3).is_empty());
        assert!(more_rounds(2, 3, 6, false));
        assert!(!more_rounds(3, 3, 6, false));
        assert!(more_rounds(3, 3, 6, true));
        assert!(!more_rounds(6, 3, 6, true));
        // A maximum below the minimum is the minimum.
        assert!(!more_rounds(3, 3, 1, true));
        assert!(more_rounds(0, 0, 0, false));
    }
}
