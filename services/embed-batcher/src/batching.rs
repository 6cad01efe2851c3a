//! The batching rules of docs/services/embed-batcher.md, as pure functions
//! of event times, so that they are unit-tested apart from state and Kafka.
//!
//! * [`wake_up_after_edit`]: where `process` wants the tenant's timer after
//!   buffering an edit (the caller only ever moves the timer earlier).
//! * [`plan_batches`]: what a firing timer sends, and when it fires next.
//!
//! "The edit that would complete the next full batch" is read as the original
//! Flink function computes it: the `batch-size`-th edit still pending after
//! sending, in (updated_at, doc_id) order, safe or not. Its `updated_at` is
//! the earliest watermark at which a full batch of safe edits can exist.

use std::ops::Range;

/// The timer time `process` asks for after buffering an edit at `updated_at`
/// that leaves `pending` edits waiting: the edit's own time once a batch can
/// be full (`pending >= batch_size`, as the original tests it, so a replacing
/// edit of an already full tenant counts too), otherwise its deadline.
pub fn wake_up_after_edit(
    updated_at: i64,
    pending: usize,
    batch_size: usize,
    max_wait: i64,
) -> i64 {
    if pending >= batch_size {
        updated_at
    } else {
        updated_at.saturating_add(max_wait)
    }
}

/// What one firing of a tenant's batch timer does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The batches to send, in order, as ranges of the sorted pending edits;
    /// they are contiguous and start at 0.
    pub batches: Vec<Range<usize>>,
    /// When the timer fires next; `None` (clear it) when nothing stays pending.
    pub next_timer: Option<i64>,
}

impl Plan {
    /// How many of the sorted pending edits the batches send.
    pub fn sent(&self) -> usize {
        self.batches.last().map_or(0, |batch| batch.end)
    }
}

/// Plans a timer firing at `watermark` over a tenant's pending edits, given
/// by their `updated_at` sorted as (updated_at, doc_id).
///
/// Safe edits (`updated_at <= watermark`) go in full batches of `batch_size`;
/// the safe rest goes as one smaller batch when its oldest edit has waited
/// `max_wait` (`updated_at + max_wait <= watermark`). The next timer is the
/// earlier of the `batch_size`-th remaining edit's time and the oldest
/// remaining edit's deadline. Both are after `watermark` (a full safe batch
/// or an overdue safe rest would have been sent), so the timer never fires
/// again at once.
pub fn plan_batches(updated_at: &[i64], watermark: i64, batch_size: usize, max_wait: i64) -> Plan {
    debug_assert!(batch_size > 0, "batch size is at least 1");
    debug_assert!(updated_at.is_sorted(), "pending edits are sorted");
    let safe = updated_at.partition_point(|&time| time <= watermark);
    let mut batches: Vec<Range<usize>> = (0..safe / batch_size)
        .map(|i| i * batch_size..(i + 1) * batch_size)
        .collect();
    let full = batches.len() * batch_size;
    if full < safe && updated_at[full].saturating_add(max_wait) <= watermark {
        batches.push(full..safe);
    }
    let sent = batches.last().map_or(0, |batch| batch.end);
    let left = &updated_at[sent..];
    let full_batch = left.get(batch_size - 1).copied();
    let deadline = left.first().map(|&oldest| oldest.saturating_add(max_wait));
    let next_timer = match (full_batch, deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Plan {
        batches,
        next_timer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: i64 = 30;

    #[test]
    fn the_edit_that_fills_a_batch_wakes_the_tenant_at_its_own_time() {
        assert_eq!(wake_up_after_edit(100, 2, 3, WAIT), 130);
        assert_eq!(wake_up_after_edit(100, 3, 3, WAIT), 100);
        // Beyond a full batch (the watermark has not caught up yet): still its time.
        assert_eq!(wake_up_after_edit(100, 7, 3, WAIT), 100);
        assert_eq!(wake_up_after_edit(i64::MAX - 1, 1, 3, WAIT), i64::MAX);
    }

    #[test]
    fn nothing_pending_clears_the_timer() {
        let plan = plan_batches(&[], 1_000, 3, WAIT);
        assert_eq!(
            plan,
            Plan {
                batches: vec![],
                next_timer: None
            }
        );
        assert_eq!(plan.sent(), 0);
    }

    #[test]
    fn a_full_batch_goes_once_its_last_edit_is_safe() {
        // Three edits, batch size 3: the watermark at the third sends them.
        let plan = plan_batches(&[10, 11, 12], 12, 3, WAIT);
        assert_eq!(plan.batches, vec![0..3]);
        assert_eq!(plan.next_timer, None);
        // One millisecond earlier the third is not safe: nothing goes, and the
        // timer waits for it (before the first edit's deadline).
        let plan = plan_batches(&[10, 11, 12], 11, 3, WAIT);
        assert_eq!(plan.batches, Vec::<Range<usize>>::new());
        assert_eq!(plan.next_timer, Some(12));
    }

    #[test]
    fn every_full_batch_goes_when_the_watermark_jumps() {
        let times = [1, 2, 3, 4, 5, 6, 7, 100];
        let plan = plan_batches(&times, 50, 3, WAIT);
        // 7 safe edits: two full batches; the seventh (time 7) has waited
        // 43 >= 30, so it goes alone too.
        assert_eq!(plan.batches, vec![0..3, 3..6, 6..7]);
        assert_eq!(plan.sent(), 7);
        assert_eq!(plan.next_timer, Some(130));
    }

    #[test]
    fn the_safe_rest_waits_until_its_oldest_edit_has_waited_max_wait() {
        let plan = plan_batches(&[10, 20, 45], 39, 3, WAIT);
        assert_eq!(plan.batches, Vec::<Range<usize>>::new());
        assert_eq!(plan.next_timer, Some(40));
        // At the deadline (inclusive) the safe rest goes, the unsafe edit stays.
        let plan = plan_batches(&[10, 20, 45], 40, 3, WAIT);
        assert_eq!(plan.batches, vec![0..2]);
        assert_eq!(plan.next_timer, Some(75));
    }

    #[test]
    fn the_next_timer_is_the_earlier_of_full_batch_and_deadline() {
        // After one full batch, four remain: the third of them completes the
        // next batch at 14, before the oldest one's deadline at 42.
        let plan = plan_batches(&[1, 2, 3, 12, 13, 14, 15], 12, 3, WAIT);
        assert_eq!(plan.batches, vec![0..3]);
        assert_eq!(plan.next_timer, Some(14));
        // Remaining edits far apart: the deadline of the oldest comes first.
        let plan = plan_batches(&[5, 200, 300], 6, 3, WAIT);
        assert_eq!(plan.batches, Vec::<Range<usize>>::new());
        assert_eq!(plan.next_timer, Some(35));
    }

    #[test]
    fn the_next_timer_is_always_after_the_watermark() {
        for watermark in 0..60 {
            for batch_size in 1..5 {
                let times = [3, 3, 9, 17, 17, 25, 40, 41, 55];
                let plan = plan_batches(&times, watermark, batch_size, 10);
                if let Some(next) = plan.next_timer {
                    assert!(next > watermark, "{watermark} {batch_size} {plan:?}");
                }
                assert!(plan.batches.iter().all(|b| b.len() <= batch_size));
            }
        }
    }

    #[test]
    fn a_zero_max_wait_sends_every_safe_edit_at_once() {
        let plan = plan_batches(&[1, 2, 9], 5, 50, 0);
        assert_eq!(plan.batches, vec![0..2]);
        assert_eq!(plan.next_timer, Some(9));
    }
}
