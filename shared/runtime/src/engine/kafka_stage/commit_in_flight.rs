//! The commit in flight: a commit is sealed (its records sent) while
//! processing goes on, and finished once they are acknowledged: offsets and
//! transaction committed and state applied, or everything since the last
//! good commit rolled back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::{send, GroupConsumer, KafkaStage};
use crate::delivery::{CommitError, Generation};
use crate::metrics::Phase;
use crate::processor::Processor;

/// A commit sealed and sent, to finish once its records are acknowledged.
pub(crate) struct SealedCommit {
    generation: Generation,
    offsets: TopicPartitionList,
    sealed_at: Instant,
}

impl<P: Processor> KafkaStage<P> {
    /// Commits everything processed so far and waits for the outcome.
    pub(super) fn commit(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        self.finish_commit(consumer)?;
        self.seal_commit(consumer)?;
        self.finish_commit(consumer)
    }

    /// Seals the work done so far and sends it: its changelog records and
    /// announcements go out; the commit finishes later.
    pub(super) fn seal_commit(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let sealed_at = Instant::now();
        self.commit_once_handled = None;
        let positions = self.engine.prepare_commit()?;
        // Everything collected belongs to this commit: no other is in flight.
        let delivery = &mut self.delivery;
        self.engine
            .send_output(&mut |collector| send(collector, delivery, false));
        let generation = self.delivery.seal();
        let mut offsets = TopicPartitionList::new();
        for (subscription, partition, next) in positions {
            offsets.add_partition_offset(
                &self.engine.subscriptions()[subscription].topic,
                partition,
                Offset::Offset(next),
            )?;
        }
        self.in_flight = Some(SealedCommit {
            generation,
            offsets,
            sealed_at,
        });
        self.phases.lap(Phase::CommitPrepare, sealed_at);
        // Nothing to wait for: finish at once (an idle stage, say).
        self.try_finish_commit(consumer)
    }

    /// Finishes the commit in flight if its records are all acknowledged,
    /// or if held outputs have grown past their bound (waiting then).
    pub(super) fn try_finish_commit(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let Some(sealed) = &self.in_flight else {
            return Ok(());
        };
        let started = Instant::now();
        let ready = self.delivery.is_acknowledged(sealed.generation) || self.holds_too_much();
        self.phases.lap(Phase::CommitFlush, started);
        if ready {
            self.finish_commit(consumer)?;
        }
        Ok(())
    }

    /// Finishes the commit in flight, if any, waiting for its records:
    /// offsets and transaction committed, state applied, held outputs sent
    /// (in the next transaction); or, if it fails, everything since the last
    /// good commit rolled back.
    pub(super) fn finish_commit(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        let Some(mut sealed) = self.in_flight.take() else {
            return Ok(());
        };
        let mut delivered = None;
        let result = self
            .delivery
            .commit(
                sealed.generation,
                &sealed.offsets,
                consumer.group_metadata(),
                &mut self.phases,
            )
            .and_then(|()| {
                if self.delivery.is_transactional() || sealed.offsets.count() == 0 {
                    return Ok(());
                }
                // At-least-once: the changelog records are in; the offsets
                // say how far into the changelogs this commit reaches.
                let reach = delivered.insert(self.delivery.take_offsets());
                self.note_changelog_reach(&mut sealed.offsets, reach)
                    .map_err(|e| CommitError::Fatal(format!("{e:#}")))?;
                let started = Instant::now();
                let committed = consumer
                    .commit(&sealed.offsets, CommitMode::Sync)
                    .map_err(|e| CommitError::Aborted(format!("committing offsets: {e}")));
                self.phases.lap(Phase::CommitOffsets, started);
                committed
            });
        match result {
            Ok(()) => {
                let delivered = delivered.unwrap_or_else(|| self.delivery.take_offsets());
                let applying = Instant::now();
                self.engine.commit_succeeded(|changelog| {
                    delivered.get(&changelog.delivery_tag()).copied()
                })?;
                self.phases.lap(Phase::CommitApply, applying);
                self.send_collected();
            }
            Err(CommitError::Aborted(reason)) => {
                tracing::warn!(%reason, "commit aborted; rolling back to the last commit");
                self.engine.counters.commits_aborted += 1;
                self.roll_back(consumer)?;
            }
            Err(fatal @ CommitError::Fatal(_)) => return Err(fatal.into()),
        }
        self.engine.commit_finished(sealed.sealed_at);
        self.publish_metrics();
        Ok(())
    }

    /// Adds to each task input's offset in `offsets` the changelog offsets
    /// its task's stores reach with this commit (see
    /// [`crate::restore::ChangelogReach`]), `delivered` being this commit's
    /// changelog records.
    pub(super) fn note_changelog_reach(
        &self,
        offsets: &mut TopicPartitionList,
        delivered: &HashMap<usize, i64>,
    ) -> anyhow::Result<()> {
        let reach = self.engine.changelog_reach(delivered)?;
        for mut element in offsets.elements() {
            let feeds_task = self
                .engine
                .subscription_index(element.topic())
                .is_some_and(|index| self.engine.subscriptions()[index].route.feeds_task());
            if let Some(reach) = reach.get(&element.partition()).filter(|_| feeds_task) {
                element.set_metadata(reach.to_metadata());
            }
        }
        Ok(())
    }

    /// Returns every task to its last committed state and rewinds the
    /// consumer to the committed offsets.
    pub(super) fn roll_back(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        self.engine.roll_back()?;
        self.release_backpressure(consumer)?;
        let committed = self.committed_offsets(consumer)?;
        for element in committed.elements() {
            let offset = match element.offset() {
                Offset::Offset(offset) => Offset::Offset(offset),
                _ => Offset::Beginning,
            };
            consumer.seek(
                element.topic(),
                element.partition(),
                offset,
                Duration::from_secs(10),
            )?;
        }
        Ok(())
    }

    /// The group's committed offsets, waiting while the broker is unreachable.
    ///
    /// After a broker restart the group's offsets were seen held back for
    /// minutes (an OffsetFetch that requires stable offsets, with a
    /// transaction the broker had not resolved). What the tasks' committed
    /// state says is the same answer when no rebalance came between: each
    /// task's progress store records, with every commit, the input offsets
    /// committed with it. So once the broker has not answered, those are
    /// used, if every assigned partition's task has them; a task given
    /// back by a later rebalance is checked against the group's offsets
    /// anyway (`resume_task`'s caller).
    pub(super) fn committed_offsets(
        &mut self,
        consumer: &GroupConsumer<P>,
    ) -> anyhow::Result<TopicPartitionList> {
        loop {
            match consumer.committed(Duration::from_secs(10)) {
                Ok(offsets) => return Ok(offsets),
                Err(error) if !self.engine.shutdown_requested() => {
                    if let Some(local) = self.positions_of_last_commit(consumer)? {
                        tracing::warn!(
                            %error,
                            "cannot read committed offsets; using those the tasks' state committed"
                        );
                        return Ok(local);
                    }
                    tracing::warn!(%error, "cannot read committed offsets yet; retrying");
                    // The run loop, which checks otherwise, waits for this.
                    self.brokers.check(consumer.client());
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(error) => anyhow::bail!("reading committed offsets: {error}"),
            }
        }
    }

    /// The offsets each assigned partition's task committed with its state,
    /// or none if some partition has no open task or no such record.
    fn positions_of_last_commit(
        &mut self,
        consumer: &GroupConsumer<P>,
    ) -> anyhow::Result<Option<TopicPartitionList>> {
        let mut positions = TopicPartitionList::new();
        for element in consumer.assignment()?.elements() {
            let position =
                (self.engine).committed_position(element.partition(), element.topic())?;
            let Some(offset) = position else {
                return Ok(None);
            };
            positions.add_partition_offset(
                element.topic(),
                element.partition(),
                Offset::Offset(offset),
            )?;
        }
        Ok(Some(positions))
    }

    /// Final commit and flush on shutdown.
    pub(super) fn close(&mut self, consumer: &GroupConsumer<P>) -> anyhow::Result<()> {
        self.closed = true;
        // Restores in progress stop, keeping what they wrote.
        self.updater.stop();
        self.commit(consumer)?;
        self.delivery.close();
        Ok(())
    }
}
