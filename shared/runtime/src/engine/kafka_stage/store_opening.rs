//! How a task's store is brought up to date when the task opens: the
//! decision is pure ([`opening_with_reach`], [`opening_without_reach`]); the
//! reads and the restore around it are the [`StoreOpener`]'s, which the
//! state updater thread owns.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::ProcessingGuarantee;
use crate::restore::{ChangelogReach, Restorer, StaleLocalState};
use crate::state::store::{StateResources, TaskStore};
use crate::task::stored_positions;

/// The group's last commit of a task's input offsets, read on the
/// processing thread (which owns the group consumer) and handed to the
/// [`StoreOpener`] with the task. Read only at-least-once.
#[derive(Debug, Clone)]
pub(super) struct CommittedInput {
    /// The committed offset of each task topic, in task-topic order.
    offsets: Vec<Option<i64>>,
    /// The changelog reach the commit carries: nothing when no offset was
    /// ever committed, `None` when the offsets carry no reach (an earlier
    /// version committed them).
    reach: Option<ChangelogReach>,
}

impl CommittedInput {
    /// Reads the group's committed offsets of `topics` at `partition`, with
    /// the reach of a task of `stores` stores.
    pub(super) fn read<C: ConsumerContext>(
        consumer: &BaseConsumer<C>,
        topics: &[&str],
        partition: i32,
        stores: usize,
    ) -> anyhow::Result<Self> {
        let committed = committed_list(consumer, topics, partition)?;
        let offsets = offsets_in(&committed, topics, partition);
        let mut reach: Option<ChangelogReach> = None;
        for element in committed.elements() {
            if !matches!(element.offset(), Offset::Offset(_)) {
                continue;
            }
            if let Some(found) = ChangelogReach::from_metadata(element.metadata(), stores) {
                reach = Some(match reach {
                    Some(reach) => reach.furthest(found),
                    None => found,
                });
            }
        }
        let reach = if offsets.iter().any(Option::is_some) {
            reach
        } else {
            Some(ChangelogReach::nothing(stores))
        };
        Ok(CommittedInput { offsets, reach })
    }
}

/// A task's store, brought up to date: what the processing thread needs
/// to run the task over it.
pub(super) struct OpenedStore {
    pub store: TaskStore,
    /// Changelog records replayed into it.
    pub restored: u64,
    /// At-least-once, the next input offset of each task topic (by task
    /// topic index) recorded with the state: records below it are in the
    /// state already.
    pub positions: Vec<Option<i64>>,
}

/// Opens task stores and brings them up to date; owned by the state
/// updater thread, so that a restore never holds up processing.
pub(super) struct StoreOpener {
    pub state_dir: PathBuf,
    pub resources: StateResources,
    pub restorer: Restorer,
    pub guarantee: ProcessingGuarantee,
    /// The store names, by store index.
    pub store_names: Vec<String>,
    /// The changelog topic of each store, by store index.
    pub changelogs: Vec<String>,
    /// The task topics' names, in task-topic order.
    pub task_topics: Vec<String>,
}

impl StoreOpener {
    /// Task `partition`'s store, opened, or `None` while another thread or
    /// process holds it (see [`TaskStore::try_open`]).
    pub fn try_open_store(&self, partition: i32) -> anyhow::Result<Option<TaskStore>> {
        TaskStore::try_open(
            &self.task_dir(partition),
            &self.store_names,
            &self.resources,
        )
    }

    /// Where task `partition`'s store lives.
    pub fn task_dir(&self, partition: i32) -> PathBuf {
        self.state_dir.join(format!("task-{partition}"))
    }

    /// Brings task `partition`'s `store`, just opened, up to date.
    ///
    /// Local state is committed state, with the changelog offset each store
    /// reaches: replay each changelog past its checkpoint. Under
    /// exactly-once, to its end (read_committed). Under at-least-once, only
    /// as far as the last offset commit (`committed`) reaches (see
    /// [`ChangelogReach`]); local state that reaches further (offsets reset
    /// or expired) is dropped and rebuilt. Records below the input positions
    /// kept in state are then skipped instead of applied twice. Local state
    /// past the end of a changelog (deleted and recreated by a reset) is
    /// wiped and restored, with a warning ([`StaleLocalState`]).
    ///
    /// Once `cancel` is set (the task was revoked, or the service stops),
    /// the restore stops with `Interrupted`; what was restored so far
    /// stays, with its checkpoint.
    pub fn bring_up_to_date(
        &self,
        partition: i32,
        mut store: TaskStore,
        committed: Option<&CommittedInput>,
        cancel: &AtomicBool,
    ) -> anyhow::Result<OpenedStore> {
        let path = self.task_dir(partition);
        let names: Vec<&str> = self.task_topics.iter().map(String::as_str).collect();
        let opening = match committed {
            Some(committed) => match &committed.reach {
                Some(reach) => {
                    let local = (0..self.store_names.len())
                        .map(|index| store.checkpoint(index))
                        .collect::<anyhow::Result<Vec<_>>>()?;
                    opening_with_reach(reach.clone(), &local)
                }
                None => {
                    let local = stored_positions(&mut store, &names)?;
                    opening_without_reach(&local, &committed.offsets)
                }
            },
            None => Opening::Replay { reach: None },
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
        let mut restored = 0;
        if let Some(reach) = reach {
            restored = match self.restorer.restore(
                &mut store,
                &self.changelogs,
                partition,
                reach.as_ref(),
                cancel,
            ) {
                Err(error) if error.is::<StaleLocalState>() => {
                    tracing::warn!(partition, "{error}; wiping it and restoring the task");
                    store = self.wipe_store(store, &path)?;
                    self.restorer.restore(
                        &mut store,
                        &self.changelogs,
                        partition,
                        reach.as_ref(),
                        cancel,
                    )?
                }
                restored => restored?,
            };
        }
        let positions = if self.guarantee == ProcessingGuarantee::AtLeastOnce {
            stored_positions(&mut store, &names)?
        } else {
            Vec::new()
        };
        Ok(OpenedStore {
            store,
            restored,
            positions,
        })
    }

    /// Deletes the store at `path` and opens it empty.
    fn wipe_store(&self, store: TaskStore, path: &Path) -> anyhow::Result<TaskStore> {
        drop(store);
        std::fs::remove_dir_all(path)?;
        TaskStore::try_open(path, &self.store_names, &self.resources)?
            .ok_or_else(|| anyhow::anyhow!("{} was locked again once wiped", path.display()))
    }
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

/// The offset of each of `topics` at `partition` in `committed`, by topic;
/// `None` where nothing is committed.
pub(super) fn offsets_in(
    committed: &TopicPartitionList,
    topics: &[&str],
    partition: i32,
) -> Vec<Option<i64>> {
    topics
        .iter()
        .map(|topic| {
            match committed
                .find_partition(topic, partition)
                .map(|e| e.offset())
            {
                Some(Offset::Offset(offset)) => Some(offset),
                _ => None,
            }
        })
        .collect()
}

/// The group's committed offsets (with their metadata) of `topics` at
/// `partition`.
pub(super) fn committed_list<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topics: &[&str],
    partition: i32,
) -> anyhow::Result<TopicPartitionList> {
    let mut request = TopicPartitionList::new();
    for topic in topics {
        request.add_partition(topic, partition);
    }
    Ok(consumer.committed_offsets(request, Duration::from_secs(30))?)
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
