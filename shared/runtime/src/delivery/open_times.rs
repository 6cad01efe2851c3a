//! How long transactions stayed open, for the transaction metrics.

use std::time::Duration;

/// Transactions remembered for the open-time percentile.
const OPEN_TIMES_KEPT: usize = 1024;

/// How long transactions stayed open: the longest since start, and the
/// last [`OPEN_TIMES_KEPT`] for a percentile.
#[derive(Debug, Default)]
pub(super) struct OpenTimes {
    pub(super) max: Duration,
    recent: std::collections::VecDeque<Duration>,
}

impl OpenTimes {
    pub(super) fn record(&mut self, open: Duration) {
        self.max = self.max.max(open);
        if self.recent.len() == OPEN_TIMES_KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(open);
    }

    /// The 99th percentile of the recent open times (nearest rank).
    pub(super) fn p99(&self) -> Duration {
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        let rank = (sorted.len() * 99).div_ceil(100);
        rank.checked_sub(1)
            .and_then(|index| sorted.get(index).copied())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn open_times_keep_the_longest_and_a_recent_percentile() {
        let mut times = OpenTimes::default();
        assert_eq!(times.p99(), Duration::ZERO);
        times.record(millis(9_000));
        for ms in 1..=100 {
            times.record(millis(ms));
        }
        assert_eq!(times.max, millis(9_000));
        // 101 values: the 100th smallest is the 99th percentile.
        assert_eq!(times.p99(), millis(100));
        for _ in 0..OPEN_TIMES_KEPT {
            times.record(millis(5));
        }
        assert_eq!(times.p99(), millis(5), "old transactions age out");
        assert_eq!(times.max, millis(9_000), "the maximum is since start");
    }
}
