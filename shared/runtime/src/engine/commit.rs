//! Commits as the engine sees them: what goes out with a commit (watermark
//! announcements, clocks and input positions staged into state, changelog
//! records), and what follows its outcome (local state applied, or every
//! task rolled back). The transaction itself is the caller's.
//!
//! [`Engine::prepare_commit`] seals the work done so far; processing may go
//! on while the caller commits it, and the outcome is reported with
//! [`Engine::commit_succeeded`] or [`Engine::roll_back`] (which also drops
//! the work done since the seal). One commit is in flight at a time.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::{Engine, Timestamps};
use crate::collector::{ChangelogPartition, Headers};
use crate::processor::Processor;
use crate::restore::ChangelogReach;
use crate::time::NO_WATERMARK;
use crate::watermark::Announcement;

/// An input position to commit: subscription index, partition, next offset.
pub(crate) type Position = (usize, i32, i64);

impl<P: Processor> Engine<P> {
    /// Announces every task watermark that moved to every partition of the
    /// stage link the output writes. The announcement follows the task's
    /// results in each partition, so a reading task never sees a watermark
    /// before the results it covers. With an idle timeout, tasks that have a
    /// watermark re-announce it at every commit, so that the reading stage
    /// can tell them from tasks that never will (whose input received nothing).
    fn announce_task_watermarks(&mut self) {
        let Some(partitions) = self.settings.link_partitions else {
            return;
        };
        let heartbeat = self.settings.event_time.idleness.is_on();
        for task in self.tasks.values_mut() {
            let watermark = task.watermark();
            let moved = task.announced.is_none_or(|announced| announced < watermark);
            if watermark == NO_WATERMARK || !(moved || heartbeat) {
                continue;
            }
            let announcement = Announcement {
                source: task.partition as u32,
                watermark,
            };
            for partition in 0..partitions {
                self.collector.push(
                    self.output.topic,
                    Some(partition as i32),
                    None,
                    None,
                    Headers::Watermark(announcement),
                );
            }
            task.announced = Some(watermark);
        }
    }

    /// Seals the work done so far and collects everything that goes out with
    /// it — the completions of every job still running (waited for),
    /// announcements, and every uncommitted state change as a changelog
    /// record, with the clocks and input positions staged into state first —
    /// and returns the input positions to commit with it.
    pub fn prepare_commit(&mut self) -> anyhow::Result<Vec<Position>> {
        self.last_commit = self.clock.now().instant;
        self.finish_jobs()?;
        let heartbeats = self.settings.event_time.idleness.is_on();
        self.intake
            .announce_source_watermarks(&mut self.collector, heartbeats);
        self.announce_task_watermarks();
        for task in self.tasks.values_mut() {
            task.stage_clocks()?;
            for ((subscription, partition), next) in self.intake.positions() {
                let subscription = &self.intake.subscriptions()[subscription];
                if partition == task.partition && subscription.route.feeds_task() {
                    task.stage_position(&subscription.topic, next);
                }
            }
            task.store.seal()?;
            for (name, count) in std::mem::take(&mut task.counters) {
                *self.sealed_counters.entry(name).or_default() += count;
            }
            for (store, topic) in self.side.changelogs.iter().enumerate() {
                let changelog = ChangelogPartition {
                    store,
                    partition: task.partition,
                };
                let format = task.store.write_format();
                for (key, value) in task.store.sealed(store) {
                    self.collector
                        .push_changelog(*topic, changelog, format, key, value);
                }
            }
        }
        self.sealed_progress = self.progress();
        self.counters.sealed = std::mem::take(&mut self.counters.handled);
        Ok(self
            .intake
            .positions()
            .map(|((subscription, partition), next)| (subscription, partition, next))
            .collect())
    }

    /// Records consumed and produced so far.
    fn progress(&self) -> (u64, u64) {
        let produced = self.collector.produced().map(|(_, count)| count).sum();
        (self.consumed_records(), produced)
    }

    /// Whether a commit now would carry anything: records consumed or
    /// produced since the last one was sealed, or state changed (by a
    /// wall-clock timer, say). With an idle timeout every commit carries
    /// watermark heartbeats, so it always would. An idle stage that commits
    /// nothing sends no empty transactions every interval, which would
    /// load the broker and leave a transaction open at almost any moment
    /// for a crash to interrupt.
    pub fn has_work_to_commit(&self) -> bool {
        self.settings.event_time.idleness.is_on()
            || self.progress() != self.sealed_progress
            || self.tasks.values().any(|task| task.store.has_uncommitted())
    }

    /// Completes a commit that would carry nothing without sending
    /// anything: it counts as a commit (it is one: everything up to here is
    /// committed), and the next is due an interval from now.
    pub fn skip_commit(&mut self) {
        self.last_commit = self.clock.now().instant;
        self.counters.commits += 1;
    }

    /// How far each open task's changelogs reach once the sealed commit is
    /// in: to this commit's records (`delivered`, by delivery tag), or where
    /// the store's earlier commits left them.
    pub fn changelog_reach(
        &self,
        delivered: &HashMap<usize, i64>,
    ) -> anyhow::Result<BTreeMap<i32, ChangelogReach>> {
        let stores = self.settings.store_names.len();
        self.tasks
            .values()
            .map(|task| {
                let reach = (0..stores)
                    .map(|store| {
                        let tag = ChangelogPartition {
                            store,
                            partition: task.partition,
                        }
                        .delivery_tag();
                        match delivered.get(&tag) {
                            Some(offset) => Ok(Some(*offset)),
                            None => task.store.checkpoint(store),
                        }
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                Ok((task.partition, ChangelogReach(reach)))
            })
            .collect()
    }

    /// The sealed commit went through: local state takes its changes, each
    /// store noting the changelog offset it reaches (`checkpoint`).
    pub fn commit_succeeded(
        &mut self,
        checkpoint: impl Fn(ChangelogPartition) -> Option<i64>,
    ) -> anyhow::Result<()> {
        let stores = self.settings.store_names.len();
        for task in self.tasks.values_mut() {
            let checkpoints: Vec<(usize, i64)> = (0..stores)
                .filter_map(|store| {
                    checkpoint(ChangelogPartition {
                        store,
                        partition: task.partition,
                    })
                    .map(|offset| (store, offset))
                })
                .collect();
            task.store.apply_sealed(&checkpoints)?;
        }
        for (name, count) in std::mem::take(&mut self.sealed_counters) {
            *self.counters.processor.entry(name).or_default() += count;
        }
        let committed = std::mem::take(&mut self.counters.sealed);
        let now_ms = self.clock.now().epoch_ms;
        self.counters.latency.observe(committed, now_ms);
        self.counters.commits += 1;
        Ok(())
    }

    /// The commit failed, or the work since it is to be dropped: every task
    /// returns to its last committed state, dropping the sealed work and
    /// what came after it. The caller rewinds the inputs.
    pub fn roll_back(&mut self) -> anyhow::Result<()> {
        let now = self.clock.now();
        for task in self.tasks.values_mut() {
            task.rollback(now)?;
        }
        self.intake.roll_back();
        self.sealed_counters.clear();
        self.counters.handled = Timestamps::default();
        self.counters.sealed = Timestamps::default();
        self.collector.discard();
        Ok(())
    }

    /// Notes the end of a commit that began (was sealed) at `started`.
    pub fn commit_finished(&mut self, started: Instant) {
        self.counters.commit_seconds += started.elapsed().as_secs_f64();
    }
}
