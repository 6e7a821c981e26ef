//! Rounds of the Redis cases: how many run (`--rounds`, then more while a target is
//! undecided, up to `--max-rounds`) and how they fold into one report.

use std::time::Duration;

use crate::measure::{BenchArgs, Report, Row};

impl BenchArgs {
    /// The most rounds a comparison may run (see `max_rounds`).
    pub(crate) fn max_rounds(&self) -> usize {
        self.max_rounds.unwrap_or(2 * self.rounds).max(self.rounds)
    }
}

/// Runs `round(i)` for rounds `i = 0, 1, …`, one after another: `min` rounds (at least
/// one), then more while `undecided` says the rounds so far disagree on a target, up to
/// `max`; folds the reports with [`Report::median_of`].
///
/// # Errors
///
/// The first round that fails.
///
/// # Example
///
/// ```no_run
/// # async fn run() -> Result<(), String> {
/// use idemkit_bench;
/// let report = bench::rounds(3, 6, |i| bench::run("redis://127.0.0.1:6379", 10_000, 1, i), |_| false).await?;
/// println!("{report}");
/// # Ok(()) }
/// ```
pub(crate) async fn rounds<F, Fut>(
    min: usize,
    max: usize,
    mut round: F,
    undecided: impl Fn(&Report) -> bool,
) -> Result<Report, String>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<Report, String>>,
{
    let mut reports = Vec::with_capacity(max.max(min).max(1));
    loop {
        let folded = Report::median_of(reports.clone());
        let undecided = folded.as_ref().is_some_and(&undecided);
        if !crate::paired::more_rounds(reports.len(), min, max, undecided) {
            return Ok(folded.expect("at least one round"));
        }
        if reports.len() >= min.max(1) {
            eprintln!(
                "the rounds disagree on a target: round {}",
                reports.len() + 1
            );
        }
        reports.push(round(reports.len()).await?);
    }
}

impl Report {
    /// Folds rounds of the same cases into one report: for each row (a case at a
    /// concurrency, in the first round's order), the round with the median throughput (its
    /// latencies and counts with it), every round's rows as they were, and all wake-up
    /// trials. `None` without rounds.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use idemkit_bench::{Report, Row};
    ///
    /// let round = |ops_per_sec| Report {
    ///     workers: 1,
    ///     rounds: 1,
    ///     rows: vec![Row {
    ///         case: "hit", concurrency: 64, ops_per_sec,
    ///         p50: Duration::ZERO, p99: Duration::ZERO, commands_per_call: 1.0,
    ///         redis_usec_per_call: 0.0, redis_cpu_usec_per_call: 0.0, redis_busy: 0.0,
    ///     }],
    ///     wakeups: vec![Duration::from_micros(ops_per_sec as u64)],
    ///     second: Vec::new(),
    ///     per_round: Vec::new(),
    ///     duels: Vec::new(),
    ///     second_duels: Vec::new(),
    /// };
    /// let report = Report::median_of(vec![round(3.0), round(1.0), round(2.0)]).unwrap();
    /// assert_eq!((report.rounds, report.rows[0].ops_per_sec), (3, 2.0));
    /// assert_eq!(report.wakeups.len(), 3);
    /// assert_eq!(report.per_round.len(), 3);
    /// ```
    pub(crate) fn median_of(rounds: Vec<Report>) -> Option<Report> {
        let first = rounds.first()?;
        let (workers, n) = (first.workers, rounds.len());
        // A round may run its cases in another order (`paired::rotated`): rows are matched
        // by case and concurrency, not by place.
        let median = |rows_of: &dyn Fn(&Report) -> &[Row]| -> Vec<Row> {
            rows_of(first)
                .iter()
                .map(|row| {
                    let mut of_case: Vec<&Row> = rounds
                        .iter()
                        .filter_map(|r| {
                            rows_of(r)
                                .iter()
                                .find(|o| o.case == row.case && o.concurrency == row.concurrency)
                        })
                        .collect();
                    of_case.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
                    of_case[of_case.len() / 2].clone()
                })
                .collect()
        };
        let rows = median(&|r| &r.rows);
        let second = median(&|r| &r.second);
        let per_round = rounds.iter().map(|r| r.rows.clone()).collect();
        // Each kind's slices of every round, as one duel.
        let joined = |duels_of: &dyn Fn(&Report) -> &[crate::duel::Duel]| {
            duels_of(first)
                .iter()
                .map(|d| {
                    let same: Vec<_> = rounds
                        .iter()
                        .flat_map(|r| duels_of(r).iter().filter(|o| o.kind == d.kind))
                        .collect();
                    crate::duel::Duel::join(&same)
                })
                .collect::<Vec<_>>()
        };
        let duels = joined(&|r| &r.duels);
        let second_duels = joined(&|r| &r.second_duels);
        let mut wakeups: Vec<Duration> = rounds.into_iter().flat_map(|r| r.wakeups).collect();
        wakeups.sort();
        Some(Report {
            workers,
            rounds: n,
            rows,
            wakeups,
            second,
            per_round,
            duels,
            second_duels,
        })
    }
}
