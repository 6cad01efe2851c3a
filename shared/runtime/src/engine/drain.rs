//! Running the tasks' buffered work: drains, ticks and the completions of
//! jobs, flushing the collected records during a long drain and stopping
//! for a commit that is due.

use std::time::{Duration, Instant};

use super::Engine;
use crate::collector::{Collector, Headers};
use crate::processor::Processor;
use crate::task::{Outcome, Pending, Task, TaskEnv};

/// The [`TaskEnv`] of an engine at `now`: a macro, so that it borrows the
/// engine's collector, output and jobs alone, beside its tasks.
macro_rules! task_env {
    ($engine:ident, $now:expr) => {
        TaskEnv {
            collector: &mut $engine.collector,
            output: &$engine.output,
            feeds_stage: $engine.settings.link_partitions.is_some(),
            time: $engine.settings.event_time,
            now: $now,
            shutdown: &$engine.shutdown,
            jobs: &$engine.jobs,
        }
    };
}

/// Takes the records collected so far (to the producer).
pub(crate) type Flush<'a> = &'a mut dyn FnMut(&mut Collector);

/// Entries a drain handles between two flushes of the collected records.
/// A merge that waited for an input releases everything buffered behind it
/// at once (the joiner: a whole second of shipments, ~9 000, when the first
/// order of the next second arrives); without flushes their results would
/// all reach the producer only at the end, the first ones ~0.2 s late.
pub(super) const FLUSH_EVERY: usize = 256;

/// Whether `interval` has passed between `since` and `now`.
fn interval_passed(now: Instant, since: Instant, interval: Duration) -> bool {
    now.saturating_duration_since(since) >= interval
}

impl<P: Processor> Engine<P> {
    /// Makes every drain stop, leaving the rest buffered, once the commit
    /// interval has passed: the caller's loop then commits on time however
    /// much a merge releases at once, and a commit in flight is finished
    /// instead of waiting behind the drain. (The test driver, whose clock
    /// does not move inside a drain, drains to the end.)
    pub fn yield_to_commits(&mut self) {
        self.yields_to_commits = true;
    }

    /// Whether the last drains stopped for a commit with entries still ready:
    /// the caller should not wait for new records before draining again.
    pub fn has_backlog(&self) -> bool {
        self.backlog
    }

    /// Handles every buffered entry of task `partition` that may go now,
    /// handing the collected records to `flush` every [`FLUSH_EVERY`] entries.
    pub(super) fn drain(&mut self, partition: i32, flush: Flush<'_>) -> anyhow::Result<()> {
        let jobs_elsewhere =
            self.jobs_in_flight() - self.tasks.get(&partition).map_or(0, Task::jobs_in_flight);
        // One clock reading serves the drain: this runs once per record.
        let now = self.clock.now();
        let commit_due = self.yields_to_commits
            && interval_passed(now.instant, self.last_commit, self.settings.commit_interval);
        let Some(task) = self.tasks.get_mut(&partition) else {
            return Ok(());
        };
        let mut env = task_env!(self, now);
        let mut handled = 0usize;
        while !self
            .job_gate
            .holds(jobs_elsewhere + task.jobs_in_flight(), commit_due)
        {
            let Some((slot, entry)) = task.next_ready(self.settings.max_task_idle, now.instant)
            else {
                break;
            };
            handled += 1;
            let last_before_commit = handled.is_multiple_of(FLUSH_EVERY) && {
                flush(env.collector);
                self.yields_to_commits
                    && interval_passed(
                        self.clock.now().instant,
                        self.last_commit,
                        self.settings.commit_interval,
                    )
            };
            let origin = entry.origin();
            match entry {
                Pending::Record {
                    key,
                    value,
                    event_time,
                    raw,
                    stamp,
                    ..
                } => {
                    let outcome = task.handle_record(
                        &mut env,
                        slot,
                        key.as_deref(),
                        value,
                        event_time,
                        stamp,
                    )?;
                    if outcome == Outcome::Late {
                        self.counters.topics[origin.topic_index].late += 1;
                        if let Some(late_topic) = self.side.late {
                            env.collector.push(
                                late_topic,
                                None,
                                key.as_deref().map(str::as_bytes),
                                raw.as_deref(),
                                Headers::None,
                            );
                        }
                    }
                }
                Pending::Announcement { announcement, .. } => {
                    task.handle_announcement(&mut env, slot, announcement)?;
                }
                Pending::Skipped { .. } => {}
            }
            self.intake.consumed_through(origin, partition);
            if last_before_commit {
                self.backlog = true;
                break;
            }
        }
        task.complete_jobs(&mut env, false)
    }

    /// Lets waiting inputs go, idle partitions move watermarks and wall-clock
    /// timers fire; `flush` as in [`Engine::handle`].
    pub fn tick(&mut self, flush: Flush<'_>) -> anyhow::Result<()> {
        self.tick_tasks(&mut *flush)?;
        self.send_output(flush);
        Ok(())
    }

    fn tick_tasks(&mut self, flush: Flush<'_>) -> anyhow::Result<()> {
        self.backlog = false;
        self.complete_jobs(false)?;
        let partitions: Vec<i32> = self.tasks.keys().copied().collect();
        for partition in partitions {
            self.drain(partition, flush)?;
        }
        let commit_due = self.yields_to_commits && self.commit_due();
        let mut jobs_in_flight = self.jobs_in_flight();
        let mut env = task_env!(self, self.clock.now());
        for task in self.tasks.values_mut() {
            if self.job_gate.holds(jobs_in_flight, commit_due) {
                break;
            }
            let before = task.jobs_in_flight();
            task.tick(&mut env)?;
            task.complete_jobs(&mut env, false)?;
            jobs_in_flight = jobs_in_flight + task.jobs_in_flight() - before;
        }
        Ok(())
    }

    /// Whether a task has started jobs that have not completed.
    pub fn has_jobs(&self) -> bool {
        self.tasks.values().any(Task::has_jobs)
    }

    /// Jobs started by the tasks and not yet completed.
    pub fn jobs_in_flight(&self) -> usize {
        self.tasks.values().map(Task::jobs_in_flight).sum()
    }

    /// Whether processors' jobs run on worker threads, so that a commit may
    /// have to wait for them (see [`JobGate`](super::job_gate::JobGate)).
    pub fn runs_jobs_off_thread(&self) -> bool {
        self.settings.job_workers > 0
    }

    /// Waits for every started job and runs its completion (before a commit).
    pub fn finish_jobs(&mut self) -> anyhow::Result<()> {
        self.complete_jobs(true)
    }

    /// Runs the completions of finished jobs, in each task's submission
    /// order; with `wait`, of every job started.
    fn complete_jobs(&mut self, wait: bool) -> anyhow::Result<()> {
        if !self.has_jobs() {
            return Ok(());
        }
        let mut env = task_env!(self, self.clock.now());
        for task in self.tasks.values_mut() {
            task.complete_jobs(&mut env, wait)?;
        }
        Ok(())
    }

    /// Whether the commit interval has passed since the last commit ended.
    pub fn commit_due(&self) -> bool {
        interval_passed(
            self.clock.now().instant,
            self.last_commit,
            self.settings.commit_interval,
        )
    }
}
