//! Wall-clock time, as the engine sees it.
//!
//! Everything that depends on processing time — idle inputs, the merge wait
//! of `--max-task-idle`, the commit interval, [`Context::now`] and wall-clock
//! timers — reads this clock, never the system directly, so that the test
//! driver can move time by hand and a test of a timeout needs no sleep.
//!
//! [`Context::now`]: crate::Context::now

#[cfg(feature = "test-utils")]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "test-utils")]
use std::sync::Arc;
#[cfg(feature = "test-utils")]
use std::time::Duration;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time: the system's, or one moved by hand.
#[derive(Debug, Clone)]
pub(crate) enum Clock {
    /// The monotonic clock, with epoch milliseconds counted from one reading
    /// of the system time at start: one clock read per [`Clock::now`] (it is
    /// read for every record), and processing time that a step of the
    /// system clock (a manual setting) does not move back or forth.
    System { start: Instant, start_epoch_ms: i64 },
    /// The test driver's.
    #[cfg(feature = "test-utils")]
    Manual(Arc<ManualTime>),
}

/// A hand-moved clock: a fixed start plus what has been added to it.
#[cfg(feature = "test-utils")]
#[derive(Debug)]
pub(crate) struct ManualTime {
    start: Instant,
    start_epoch_ms: i64,
    elapsed_ms: AtomicU64,
}

/// One reading of the clock, in both forms the engine needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    /// Monotonic, for durations.
    pub instant: Instant,
    /// Epoch milliseconds, for [`Context::now`](crate::Context::now) and wall-clock timers.
    pub epoch_ms: i64,
}

impl Clock {
    /// A manual clock that reads `start_epoch_ms` until advanced.
    #[cfg(feature = "test-utils")]
    pub fn manual(start_epoch_ms: i64) -> (Clock, Arc<ManualTime>) {
        let time = Arc::new(ManualTime {
            start: Instant::now(),
            start_epoch_ms,
            elapsed_ms: AtomicU64::new(0),
        });
        (Clock::Manual(time.clone()), time)
    }

    /// The system's clock, from now on.
    pub fn system() -> Clock {
        Clock::System {
            start: Instant::now(),
            start_epoch_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
        }
    }

    /// The time now.
    pub fn now(&self) -> Now {
        match self {
            Clock::System {
                start,
                start_epoch_ms,
            } => {
                let instant = Instant::now();
                let elapsed = instant.saturating_duration_since(*start).as_millis() as i64;
                Now {
                    instant,
                    epoch_ms: start_epoch_ms + elapsed,
                }
            }
            #[cfg(feature = "test-utils")]
            Clock::Manual(time) => {
                let elapsed = time.elapsed_ms.load(Ordering::Relaxed);
                Now {
                    instant: time.start + Duration::from_millis(elapsed),
                    epoch_ms: time.start_epoch_ms + elapsed as i64,
                }
            }
        }
    }
}

#[cfg(feature = "test-utils")]
impl ManualTime {
    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.elapsed_ms
            .fetch_add(by.as_millis() as u64, Ordering::Relaxed);
    }
}
