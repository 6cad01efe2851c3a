//! Event time: watermarks per input partition and per task (the timers they
//! fire are in [`crate::timers`]).
//!
//! The rules (docs/services/README.md, "common rules"): a partition's watermark is its
//! largest event time minus the allowed out-of-orderness; a task's watermark is
//! the minimum over its partitions (a partition that has delivered nothing holds
//! it at minus infinity) and never goes backwards. A repartitioned input's
//! watermark is the minimum of what every upstream task has announced.

use std::time::{Duration, Instant};

use crate::watermark::partition_watermark;

/// The watermark before anything has been seen: minus infinity.
pub const NO_WATERMARK: i64 = i64::MIN;

/// Where one input partition's event time comes from.
#[derive(Debug, Clone)]
pub enum PartitionClock {
    /// A source topic partition: the largest event time seen so far.
    Direct { max_event_time: Option<i64> },
    /// A repartition topic partition: the watermark each upstream task
    /// announced, by upstream partition.
    Shuffled { upstream: Vec<Option<i64>> },
}

/// Event-time progress of one input partition of a task.
#[derive(Debug, Clone)]
pub struct InputClock {
    pub clock: PartitionClock,
    /// Wall-clock time of the last record, for idle detection.
    last_activity: Instant,
    /// Repartitioned inputs: when each upstream partition was last heard
    /// from (created, or announced), for idle detection per upstream.
    heard_from: Vec<Instant>,
}

impl InputClock {
    /// A direct input partition that has seen nothing yet.
    pub fn direct(now: Instant) -> Self {
        InputClock {
            clock: PartitionClock::Direct {
                max_event_time: None,
            },
            last_activity: now,
            heard_from: Vec::new(),
        }
    }

    /// A shuffled input (repartition topic or stage link) written by
    /// `upstream_partitions` upstream tasks.
    pub fn shuffled(upstream_partitions: usize, now: Instant) -> Self {
        InputClock {
            clock: PartitionClock::Shuffled {
                upstream: vec![None; upstream_partitions],
            },
            last_activity: now,
            heard_from: vec![now; upstream_partitions],
        }
    }

    /// Notes a record with `event_time` (direct inputs only track it).
    pub fn observe(&mut self, event_time: i64, now: Instant) {
        self.last_activity = now;
        if let PartitionClock::Direct { max_event_time } = &mut self.clock {
            *max_event_time = Some(max_event_time.map_or(event_time, |m| m.max(event_time)));
        }
    }

    /// Notes a watermark announced by upstream task `source`.
    pub fn announce(&mut self, source: usize, watermark: i64, now: Instant) {
        self.last_activity = now;
        if let Some(heard) = self.heard_from.get_mut(source) {
            *heard = now;
        }
        if let PartitionClock::Shuffled { upstream } = &mut self.clock {
            if let Some(slot) = upstream.get_mut(source) {
                *slot = Some(slot.map_or(watermark, |w| w.max(watermark)));
            }
        }
    }

    /// This partition's watermark when upstream partitions not heard from
    /// for `idle_timeout` stop holding it back — unless none has been heard
    /// from, when the whole input is idle and this is its plain watermark.
    fn watermark_without_idle_upstreams(
        &self,
        max_out_of_orderness: i64,
        idle_timeout: Duration,
        now: Instant,
    ) -> i64 {
        let PartitionClock::Shuffled { upstream } = &self.clock else {
            return self.watermark(max_out_of_orderness);
        };
        upstream
            .iter()
            .zip(&self.heard_from)
            .filter(|(_, heard)| now.saturating_duration_since(**heard) < idle_timeout)
            .map(|(w, _)| w.unwrap_or(NO_WATERMARK))
            .min()
            .unwrap_or_else(|| self.watermark(max_out_of_orderness))
    }

    /// This partition's watermark, ignoring idleness.
    pub fn watermark(&self, max_out_of_orderness: i64) -> i64 {
        match &self.clock {
            PartitionClock::Direct { max_event_time } => max_event_time.map_or(NO_WATERMARK, |m| {
                partition_watermark(m, max_out_of_orderness)
            }),
            PartitionClock::Shuffled { upstream } => upstream
                .iter()
                .map(|w| w.unwrap_or(NO_WATERMARK))
                .min()
                .unwrap_or(NO_WATERMARK),
        }
    }

    /// How long this partition has delivered nothing.
    pub fn quiet_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.last_activity)
    }
}

/// How a task treats inputs that have delivered nothing for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idleness {
    /// Quiet inputs hold the watermark back: results are deterministic.
    Off,
    /// The idle timeout (`--idle-timeout`), for tasks reading the service's input topics: a
    /// partition quiet for this long stops holding the watermark back, and a
    /// task's only input moves on with the wall-clock time since its last
    /// record.
    Inputs(Duration),
    /// For a later stage: only upstream tasks of a link not heard from for
    /// this long (one whose input never received anything, say) stop holding
    /// the watermark back. The stage never moves on by wall clock: its
    /// upstream tasks already do when idle, and a stalled earlier stage must
    /// not have its windows closed before its results arrive.
    Upstreams(Duration),
}

impl Idleness {
    /// Whether quiet inputs or upstreams can stop holding a watermark back.
    pub fn is_on(self) -> bool {
        self != Idleness::Off
    }
}

/// Computes a task's watermark from its input partitions (see [`Idleness`]).
pub fn task_watermark(
    inputs: &[InputClock],
    max_out_of_orderness: i64,
    idleness: Idleness,
    now: Instant,
) -> Option<i64> {
    let idle_timeout = match idleness {
        Idleness::Off => {
            return inputs
                .iter()
                .map(|i| i.watermark(max_out_of_orderness))
                .min()
        }
        Idleness::Upstreams(idle_timeout) => {
            return inputs
                .iter()
                .map(|i| {
                    i.watermark_without_idle_upstreams(max_out_of_orderness, idle_timeout, now)
                })
                .min()
        }
        Idleness::Inputs(idle_timeout) => idle_timeout,
    };
    if let [only] = inputs {
        let base = only.watermark_without_idle_upstreams(max_out_of_orderness, idle_timeout, now);
        let quiet = only.quiet_for(now);
        if base != NO_WATERMARK && quiet >= idle_timeout {
            let elapsed = i64::try_from(quiet.as_millis()).unwrap_or(i64::MAX);
            return Some(base.saturating_add(elapsed));
        }
        return Some(base);
    }
    inputs
        .iter()
        .filter(|i| i.quiet_for(now) < idle_timeout)
        .map(|i| i.watermark_without_idle_upstreams(max_out_of_orderness, idle_timeout, now))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_watermark_is_the_minimum_and_waits_for_every_input() {
        let now = Instant::now();
        let mut a = InputClock::direct(Instant::now());
        let b = InputClock::direct(Instant::now());
        a.observe(10_000, now);
        assert_eq!(
            task_watermark(&[a.clone(), b.clone()], 0, Idleness::Off, now),
            Some(NO_WATERMARK)
        );
        let mut b = b;
        b.observe(4_000, now);
        assert_eq!(
            task_watermark(&[a.clone(), b.clone()], 1_000, Idleness::Off, now),
            Some(3_000)
        );
    }

    #[test]
    fn repartitioned_inputs_wait_for_every_upstream_task() {
        let now = Instant::now();
        let mut input = InputClock::shuffled(2, Instant::now());
        input.announce(0, 500, now);
        assert_eq!(input.watermark(0), NO_WATERMARK);
        input.announce(1, 300, now);
        assert_eq!(input.watermark(0), 300);
        input.announce(1, 100, now);
        assert_eq!(input.watermark(0), 300, "announcements never move back");
    }

    #[test]
    fn an_upstream_partition_never_heard_from_stops_holding_back_after_the_idle_timeout() {
        let start = Instant::now();
        let mut input = InputClock::shuffled(2, Instant::now());
        let idle = Idleness::Inputs(Duration::from_secs(2));
        input.announce(0, 700, start + Duration::from_secs(1));
        let waiting = task_watermark(&[input.clone()], 0, idle, start + Duration::from_secs(1));
        assert_eq!(waiting, Some(NO_WATERMARK), "upstream 1 may still come");
        input.announce(0, 900, start + Duration::from_secs(4));
        let mut other = InputClock::direct(Instant::now());
        other.observe(5_000, start + Duration::from_secs(4));
        let later = start + Duration::from_secs(5);
        assert_eq!(
            task_watermark(&[input.clone(), other], 0, idle, later),
            Some(900),
            "upstream 1, silent since the start, no longer counts"
        );
        assert_eq!(
            task_watermark(&[input], 0, Idleness::Off, later),
            Some(NO_WATERMARK)
        );
    }

    #[test]
    fn a_later_stage_drops_silent_upstreams_but_never_follows_wall_clock() {
        let start = Instant::now();
        let mut link = InputClock::shuffled(2, Instant::now());
        let idle = Idleness::Upstreams(Duration::from_secs(2));
        link.announce(0, 700, start);
        assert_eq!(
            task_watermark(&[link.clone()], 0, idle, start + Duration::from_secs(1)),
            Some(NO_WATERMARK),
            "upstream 1 may still come"
        );
        let later = start + Duration::from_secs(60);
        link.announce(0, 900, later);
        assert_eq!(
            task_watermark(&[link.clone()], 0, idle, later),
            Some(900),
            "upstream 1, silent since the start, no longer counts"
        );
        let quiet = task_watermark(&[link], 0, idle, later + Duration::from_secs(60));
        assert!(
            quiet.is_some_and(|w| w <= 900),
            "a quiet link does not move on by itself: {quiet:?}"
        );
    }

    #[test]
    fn an_idle_single_input_follows_wall_clock() {
        let start = Instant::now();
        let mut input = InputClock::direct(Instant::now());
        input.observe(1_000, start);
        let later = start + Duration::from_secs(5);
        let wm = task_watermark(
            &[input.clone()],
            0,
            Idleness::Inputs(Duration::from_secs(2)),
            later,
        )
        .unwrap();
        assert_eq!(wm, 6_000);
        let soon = start + Duration::from_secs(1);
        assert_eq!(
            task_watermark(&[input], 0, Idleness::Inputs(Duration::from_secs(2)), soon),
            Some(1_000)
        );
    }

    #[test]
    fn an_idle_input_stops_holding_back_the_others() {
        let start = Instant::now();
        let mut quiet = InputClock::direct(Instant::now());
        quiet.observe(1_000, start);
        let mut busy = InputClock::direct(Instant::now());
        let later = start + Duration::from_secs(5);
        busy.observe(9_000, later);
        let wm = task_watermark(
            &[quiet, busy],
            0,
            Idleness::Inputs(Duration::from_secs(2)),
            later,
        );
        assert_eq!(wm, Some(9_000));
    }
}
