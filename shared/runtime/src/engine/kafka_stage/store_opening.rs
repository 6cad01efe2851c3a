//! How a task's store is brought up to date when the task opens: the
//! decision is pure ([`opening_with_reach`], [`opening_without_reach`]); the
//! reads and the restore around it are the stage's.

use std::path::Path;
use std::time::Duration;

use super::rebalance::{committed_for, committed_list};
use super::{GroupConsumer, KafkaStage};
use crate::config::ProcessingGuarantee;
use crate::processor::Processor;
use crate::restore::{ChangelogReach, StaleLocalState};
use crate::state::store::TaskStore;
use crate::task::stored_positions;
use rdkafka::Offset;

/// How long a task waits for its store while another thread of the process
/// still holds it: longer than a thread's commit and close take.
const STATE_LOCK_PATIENCE: Duration = Duration::from_secs(60);

impl<P: Processor> KafkaStage<P> {
    /// Opens task `partition`'s store and brings it up to date.
    ///
    /// Local state is committed state, with the changelog offset each store
    /// reaches: replay each changelog past its checkpoint. Under
    /// exactly-once, to its end (read_committed). Under at-least-once, only
    /// as far as the last offset commit reaches (see [`ChangelogReach`]);
    /// local state that reaches further (offsets reset or expired) is
    /// dropped and rebuilt. Records below the input positions kept in state
    /// are then skipped instead of applied twice. Local state past the end
    /// of a changelog (deleted and recreated by a reset) is wiped and
    /// restored, with a warning ([`StaleLocalState`]).
    pub(super) fn open_store(
        &mut self,
        consumer: &GroupConsumer<P>,
        partition: i32,
    ) -> anyhow::Result<TaskStore> {
        let path = self.state_dir.join(format!("task-{partition}"));
        let mut store = self.open_task_store(&path)?;
        let task_topics = self.engine.task_topics();
        let names: Vec<&str> = task_topics.iter().map(|(_, name)| name.as_str()).collect();
        let at_least_once = self.guarantee == ProcessingGuarantee::AtLeastOnce;
        let opening = if at_least_once {
            let stores = self.engine.store_names().len();
            match committed_reach(consumer, &names, partition, stores)? {
                Some(committed) => {
                    let local = (0..stores)
                        .map(|index| store.checkpoint(index))
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    opening_with_reach(committed, &local)
                }
                None => {
                    let local = stored_positions(&mut store, &names)?;
                    let committed = if local.iter().any(Option::is_some) {
                        committed_for(consumer, &names, partition)?
                    } else {
                        Vec::new()
                    };
                    opening_without_reach(&local, &committed)
                }
            }
        } else {
            Opening::Replay { reach: None }
        };
        let reach = match opening {
            Opening::Trust => None,
            Opening::Replay { reach } => Some(reach),
            Opening::Rebuild { why, reach } => {
                tracing::info!(partition, "{why}; rebuilding it");
                store = self.wipe_store(store, &path)?;
                Some(reach)
            }
        };
        if let Some(reach) = reach {
            let changelogs = self.engine.changelog_topics();
            let shutdown = self.engine.shutdown_flag();
            let restored = match self.restorer.restore(
                &mut store,
                &changelogs,
                partition,
                reach.as_ref(),
                shutdown,
            ) {
                Err(error) if error.is::<StaleLocalState>() => {
                    tracing::warn!(partition, "{error}; wiping it and restoring the task");
                    store = self.wipe_store(store, &path)?;
                    self.restorer.restore(
                        &mut store,
                        &changelogs,
                        partition,
                        reach.as_ref(),
                        shutdown,
                    )?
                }
                restored => restored?,
            };
            self.engine.count_restored(restored);
        }
        if at_least_once {
            for ((index, _), position) in task_topics
                .iter()
                .zip(stored_positions(&mut store, &names)?)
            {
                if let Some(position) = position {
                    self.engine.skip_below(*index, partition, position);
                }
            }
        }
        Ok(store)
    }

    /// Deletes the store at `path` and opens it empty.
    pub(super) fn wipe_store(&self, store: TaskStore, path: &Path) -> anyhow::Result<TaskStore> {
        drop(store);
        std::fs::remove_dir_all(path)?;
        self.open_task_store(path)
    }

    /// Opens the task store at `path`, waiting while the processing thread
    /// that had the task before still holds it (see
    /// [`TaskStore::open_when_unlocked`]).
    pub(super) fn open_task_store(&self, path: &Path) -> anyhow::Result<TaskStore> {
        TaskStore::open_when_unlocked(
            path,
            self.engine.store_names(),
            &self.resources,
            STATE_LOCK_PATIENCE,
            &|| self.engine.shutdown_requested(),
        )
    }
}

/// The changelog reach of the group's last commit of task `partition`'s
/// input offsets (`topics`), at-least-once: nothing when no offset was ever
/// committed, `None` when the offsets carry no reach (an earlier version
/// committed them).
fn committed_reach<P: Processor>(
    consumer: &GroupConsumer<P>,
    topics: &[&str],
    partition: i32,
    stores: usize,
) -> anyhow::Result<Option<ChangelogReach>> {
    let committed = committed_list(consumer, topics, partition)?;
    let mut any_offset = false;
    let mut reach: Option<ChangelogReach> = None;
    for element in committed.elements() {
        if !matches!(element.offset(), Offset::Offset(_)) {
            continue;
        }
        any_offset = true;
        if let Some(found) = ChangelogReach::from_metadata(element.metadata(), stores) {
            reach = Some(match reach {
                Some(reach) => reach.furthest(found),
                None => found,
            });
        }
    }
    Ok(if any_offset {
        reach
    } else {
        Some(ChangelogReach::nothing(stores))
    })
}

/// How a task's store is brought up to date when the task opens.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Opening {
    /// Replay each changelog past the store's checkpoint: to its end
    /// (`None`), or only as far as the last offset commit reaches.
    Replay { reach: Option<ChangelogReach> },
    /// Drop the local store first (`why` says why), then replay.
    Rebuild {
        why: &'static str,
        reach: Option<ChangelogReach>,
    },
    /// The local store is the committed state as it is: replay nothing.
    Trust,
}

/// At-least-once, the last offset commit carrying the changelog offsets
/// its stores reached (`committed`): replay to there. Local state whose
/// checkpoints (`local`) reach further (offsets reset or expired) holds
/// work that will be processed again, and is rebuilt.
pub(super) fn opening_with_reach(committed: ChangelogReach, local: &[Option<i64>]) -> Opening {
    let ahead = local
        .iter()
        .zip(&committed.0)
        .any(|(local, committed)| local > committed);
    if ahead {
        Opening::Rebuild {
            why: "local state reaches past the last commit",
            reach: Some(committed),
        }
    } else {
        Opening::Replay {
            reach: Some(committed),
        }
    }
}

/// At-least-once, offsets committed without a changelog reach (an earlier
/// version committed them): a local store is written in one batch with the
/// input positions it reflects (`local`), so it is trusted unless the group
/// has committed past them (`committed`), and then rebuilt from the whole
/// changelogs. With no positions stored, the changelogs are replayed.
pub(super) fn opening_without_reach(local: &[Option<i64>], committed: &[Option<i64>]) -> Opening {
    if local.iter().all(Option::is_none) {
        return Opening::Replay { reach: None };
    }
    let behind = local
        .iter()
        .zip(committed)
        .any(|(local, committed)| committed.is_some_and(|c| local.is_none_or(|l| c > l)));
    if behind {
        Opening::Rebuild {
            why: "local state is behind the committed offsets",
            reach: None,
        }
    } else {
        Opening::Trust
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(offsets: &[Option<i64>]) -> ChangelogReach {
        ChangelogReach(offsets.to_vec())
    }

    #[test]
    fn local_state_within_the_committed_reach_replays_to_it() {
        let committed = reach(&[Some(10), None]);
        assert_eq!(
            opening_with_reach(committed.clone(), &[Some(7), None]),
            Opening::Replay {
                reach: Some(committed.clone())
            }
        );
        assert_eq!(
            opening_with_reach(committed.clone(), &[Some(10), None]),
            Opening::Replay {
                reach: Some(committed)
            },
            "exactly at the reach"
        );
    }

    #[test]
    fn local_state_past_the_committed_reach_is_rebuilt() {
        let committed = reach(&[Some(10), None]);
        assert!(matches!(
            opening_with_reach(committed.clone(), &[Some(11), None]),
            Opening::Rebuild { reach: Some(r), .. } if r == committed
        ));
        assert!(
            matches!(
                opening_with_reach(committed, &[Some(3), Some(0)]),
                Opening::Rebuild { .. }
            ),
            "a store the last commit never wrote to, written locally"
        );
    }

    #[test]
    fn nothing_committed_replays_every_changelog_from_the_local_checkpoint() {
        let nothing = ChangelogReach::nothing(2);
        assert_eq!(
            opening_with_reach(nothing.clone(), &[None, None]),
            Opening::Replay {
                reach: Some(nothing)
            }
        );
    }

    #[test]
    fn without_a_reach_a_store_not_behind_the_committed_offsets_is_trusted() {
        assert_eq!(
            opening_without_reach(&[Some(100), Some(50)], &[Some(100), Some(40)]),
            Opening::Trust
        );
        assert_eq!(
            opening_without_reach(&[Some(100)], &[None]),
            Opening::Trust,
            "nothing committed yet"
        );
    }

    #[test]
    fn without_a_reach_a_store_behind_the_committed_offsets_is_rebuilt() {
        assert_eq!(
            opening_without_reach(&[Some(100), Some(50)], &[Some(101), Some(50)]),
            Opening::Rebuild {
                why: "local state is behind the committed offsets",
                reach: None
            }
        );
        assert!(matches!(
            opening_without_reach(&[Some(100), None], &[Some(100), Some(1)]),
            Opening::Rebuild { .. }
        ));
    }

    #[test]
    fn without_a_reach_or_stored_positions_the_changelogs_are_replayed() {
        assert_eq!(
            opening_without_reach(&[None, None], &[]),
            Opening::Replay { reach: None }
        );
    }
}
