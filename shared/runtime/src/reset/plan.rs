//! What a reset will do, worked out from what it read of the broker
//! before changing anything: the checks that refuse a reset, the new
//! offsets, and the plan's text. Nothing here talks to a broker.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;

use super::position::{OffsetsFile, ResetTo};
use super::KEPT_STATE_FILE;
use crate::restore::ChangelogReach;

/// What is known of one partition of a topic a group reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PartitionOffsets {
    /// The partition's first offset and its end.
    pub low: i64,
    pub high: i64,
    pub committed: Option<i64>,
    /// For [`ResetTo::Time`]: the first offset at or after the time, if any.
    pub at_time: Option<i64>,
    /// For [`ResetTo::File`]: the offset the file gives the partition.
    pub listed: Option<i64>,
}

/// The offset `to` gives a partition: always within its records, from its
/// first offset to its end, as Kafka's `kafka-consumer-groups` keeps an
/// offset asked for (`--to-offset`, `--from-file`) within them.
pub fn new_offset(to: &ResetTo, offsets: PartitionOffsets) -> i64 {
    let PartitionOffsets {
        low,
        high,
        committed,
        at_time,
        listed,
    } = offsets;
    let target = match to {
        ResetTo::Earliest => low,
        ResetTo::Latest => high,
        ResetTo::Time(_) => at_time.unwrap_or(high),
        // Where the application would start without a committed offset
        // (auto.offset.reset is earliest).
        ResetTo::Shift(records) => committed.unwrap_or(low).saturating_add(*records),
        ResetTo::Offset(offset) => *offset,
        // Every input partition has a line ([`check_offsets_file`]).
        ResetTo::File(_) => listed.unwrap_or(low),
    };
    target.min(high).max(low)
}

/// What a reset read of one consumer group (one stage of the
/// application), before changing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupState {
    pub group: String,
    /// The stage's stores, for the changelog reach committed with the offsets.
    pub stores: usize,
    /// The input topics the stage reads, as the flags name them.
    pub inputs: Vec<InputTopic>,
    /// The internal topics it reads: stage links and repartition topics.
    pub internal: Vec<InternalTopic>,
    /// Every topic the group has committed offsets on.
    pub committed_topics: BTreeSet<String>,
}

/// An input topic of a stage, each of its partitions by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputTopic {
    pub topic: String,
    pub partitions: Vec<(i32, PartitionOffsets)>,
}

/// An internal topic a stage reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalTopic {
    pub topic: String,
    /// The group's committed offset of each partition, by id; `None` when
    /// the topic does not exist.
    pub committed: Option<Vec<(i32, Option<i64>)>>,
}

/// What the description and the flags say of the application, besides
/// its groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Application {
    pub application_id: String,
    pub dead_letter_topic: String,
    pub output_topics: Vec<String>,
    /// The stages' state directories on this host.
    pub state_dirs: Vec<PathBuf>,
}

/// A committed offset a reset moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetMove {
    pub topic: String,
    pub partition: i32,
    pub current: Option<i64>,
    pub new: i64,
    /// An internal topic, deleted and recreated empty: it starts at 0.
    pub internal: bool,
}

/// The offsets a reset commits for one consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupReset {
    pub group: String,
    /// Whether the group reads an input topic (and so `to` applies).
    pub reads_inputs: bool,
    pub moves: Vec<OffsetMove>,
    /// The changelog reach committed with the offsets: none, as the
    /// changelogs are deleted (see [`ChangelogReach`]). An at-least-once
    /// instance whose local state survived then rebuilds it.
    pub metadata: String,
}

impl GroupReset {
    /// The moves on internal topics (`true`) or on inputs (`false`).
    pub fn moves(&self, internal: bool) -> impl Iterator<Item = &OffsetMove> {
        self.moves.iter().filter(move |m| m.internal == internal)
    }
}

/// Everything a reset does, worked out before anything changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetPlan {
    pub application_id: String,
    pub to: ResetTo,
    pub groups: Vec<GroupReset>,
    /// The internal topics that exist, to delete.
    pub delete_topics: Vec<String>,
    pub dead_letter_topic: String,
    pub output_topics: Vec<String>,
    /// Committed offsets left as they are by `--ignore-committed-topic`,
    /// as (group, topic).
    pub kept_offsets: Vec<(String, String)>,
    /// The stages' state directories on this host.
    pub state_dirs: Vec<PathBuf>,
    pub wipe_local_state: bool,
}

/// The plan of a reset of `application` to `to`, from what was read of
/// its `groups` and the internal topics that exist (`delete_topics`); or
/// why the reset is refused: a group committed offsets on a topic the
/// flags do not name (unless `ignored`), or `--from-file` does not match
/// the inputs.
pub fn build_plan(
    application: &Application,
    to: &ResetTo,
    groups: &[GroupState],
    delete_topics: Vec<String>,
    ignored: &[String],
    wipe_local_state: bool,
) -> anyhow::Result<ResetPlan> {
    let kept_offsets = check_committed_topics(groups, ignored)?;
    let missing: BTreeSet<&str> = (groups.iter().flat_map(|group| &group.inputs))
        .filter(|input| input.partitions.is_empty())
        .map(|input| input.topic.as_str())
        .collect();
    anyhow::ensure!(
        missing.is_empty(),
        "input topic(s) {} do not exist",
        missing.into_iter().collect::<Vec<_>>().join(", ")
    );
    if let ResetTo::File(file) = to {
        check_offsets_file(file, groups)?;
    }
    Ok(ResetPlan {
        application_id: application.application_id.clone(),
        to: to.clone(),
        groups: groups.iter().map(|group| group_reset(group, to)).collect(),
        delete_topics,
        dead_letter_topic: application.dead_letter_topic.clone(),
        output_topics: application.output_topics.clone(),
        kept_offsets,
        state_dirs: application.state_dirs.clone(),
        wipe_local_state,
    })
}

/// The group's offsets as `to` moves them: every partition of its input
/// topics, and its committed offsets on internal topics that exist.
fn group_reset(state: &GroupState, to: &ResetTo) -> GroupReset {
    let mut moves = Vec::new();
    for input in &state.inputs {
        for (partition, offsets) in &input.partitions {
            let listed = match to {
                ResetTo::File(file) => file.offsets.get(&(input.topic.clone(), *partition)),
                _ => None,
            };
            let offsets = PartitionOffsets {
                listed: listed.copied(),
                ..*offsets
            };
            moves.push(OffsetMove {
                topic: input.topic.clone(),
                partition: *partition,
                current: offsets.committed,
                new: new_offset(to, offsets),
                internal: false,
            });
        }
    }
    for internal in &state.internal {
        for (partition, committed) in internal.committed.iter().flatten() {
            if committed.is_some() {
                moves.push(OffsetMove {
                    topic: internal.topic.clone(),
                    partition: *partition,
                    current: *committed,
                    new: 0,
                    internal: true,
                });
            }
        }
    }
    GroupReset {
        group: state.group.clone(),
        reads_inputs: !state.inputs.is_empty(),
        moves,
        metadata: ChangelogReach::nothing(state.stores).to_metadata(),
    }
}

/// Refuses a reset whose flags do not name every topic the application's
/// groups have committed offsets on: each such topic must be an input the
/// flags name or an internal topic the stage reads, or be named by
/// `--ignore-committed-topic` (`ignored`). A topic the group committed on
/// that the flags leave out is what the application read under other
/// flags: the reset would leave its offsets as they are, and move those
/// of a topic the application never read. Inputs the group never
/// committed on are fine: they start from the position asked for.
///
/// Returns the (group, topic) pairs whose offsets are kept, ignored.
pub fn check_committed_topics(
    groups: &[GroupState],
    ignored: &[String],
) -> anyhow::Result<Vec<(String, String)>> {
    let mut kept = Vec::new();
    let mut refusals = Vec::new();
    let mut unlisted_anywhere = BTreeSet::new();
    for group in groups {
        let known: BTreeSet<&str> = (group.inputs.iter().map(|input| input.topic.as_str()))
            .chain(
                group
                    .internal
                    .iter()
                    .map(|internal| internal.topic.as_str()),
            )
            .collect();
        let mut unlisted = Vec::new();
        for topic in &group.committed_topics {
            if known.contains(topic.as_str()) {
                continue;
            }
            if ignored.contains(topic) {
                kept.push((group.group.clone(), topic.clone()));
            } else {
                unlisted.push(topic.as_str());
                unlisted_anywhere.insert(topic.as_str());
            }
        }
        if unlisted.is_empty() {
            continue;
        }
        let inputs: Vec<&str> = group.inputs.iter().map(|i| i.topic.as_str()).collect();
        refusals.push(format!(
            "consumer group {} has committed offsets on {}, which the flags given do not name \
             as an input (they name {})",
            group.group,
            unlisted.join(", "),
            if inputs.is_empty() {
                "none".to_string()
            } else {
                inputs.join(", ")
            }
        ));
    }
    if !refusals.is_empty() {
        let topics: Vec<&str> = unlisted_anywhere.into_iter().collect();
        let overrides: Vec<String> = topics
            .iter()
            .map(|topic| format!("--ignore-committed-topic {topic}"))
            .collect();
        anyhow::bail!(
            "{}; give reset the flags the application runs with, or, if it no longer reads {}, \
             add {} to keep those offsets as they are",
            refusals.join("; "),
            topics.join(", "),
            overrides.join(" ")
        );
    }
    Ok(kept)
}

/// Refuses an offsets file that does not give exactly the input
/// partitions: a line for a topic that is not an input or a partition
/// it does not have, or none for an input partition. Every input
/// partition needs one, as the reset deletes the state built from all
/// of them.
pub fn check_offsets_file(file: &OffsetsFile, groups: &[GroupState]) -> anyhow::Result<()> {
    let mut inputs: BTreeMap<&str, BTreeSet<i32>> = BTreeMap::new();
    for input in groups.iter().flat_map(|group| &group.inputs) {
        let partitions = inputs.entry(input.topic.as_str()).or_default();
        partitions.extend(input.partitions.iter().map(|(id, _)| *id));
    }
    let path = file.path.display();
    let listed: BTreeSet<(&str, i32)> = file
        .offsets
        .keys()
        .map(|(topic, partition)| (topic.as_str(), *partition))
        .collect();
    let strangers: BTreeSet<&str> = listed
        .iter()
        .map(|(topic, _)| *topic)
        .filter(|topic| !inputs.contains_key(topic))
        .collect();
    if !strangers.is_empty() {
        let names: Vec<&str> = strangers.into_iter().collect();
        let inputs: Vec<&str> = inputs.keys().copied().collect();
        anyhow::bail!(
            "--from-file {path} names {}, which {} of the application (its inputs: {})",
            names.join(", "),
            if names.len() == 1 {
                "is not an input"
            } else {
                "are not inputs"
            },
            inputs.join(", ")
        );
    }
    let absent: Vec<String> = listed
        .iter()
        .filter(|(topic, partition)| !inputs[topic].contains(partition))
        .map(|(topic, partition)| {
            format!(
                "{topic} partition {partition} ({topic} has {} partitions)",
                inputs[topic].len()
            )
        })
        .collect();
    anyhow::ensure!(
        absent.is_empty(),
        "--from-file {path} names {}, which does not exist",
        absent.join(", ")
    );
    let missing: Vec<String> = inputs
        .iter()
        .flat_map(|(topic, partitions)| partitions.iter().map(move |p| (*topic, *p)))
        .filter(|partition| !listed.contains(partition))
        .map(|(topic, partition)| format!("{topic} partition {partition}"))
        .collect();
    anyhow::ensure!(
        missing.is_empty(),
        "--from-file {path} gives no offset for {}: it needs a line for every input partition",
        missing.join(", ")
    );
    Ok(())
}

/// One part of a [`ResetPlan`], in the order a reset carries them out,
/// printed before (`--dry-run`) or once done.
#[derive(Debug, Clone, Copy)]
pub enum Step<'a> {
    /// A group's offsets on the internal topics it reads, to 0.
    InternalOffsets(&'a GroupReset),
    DeleteTopics,
    /// Every group's input offsets.
    InputOffsets,
    Kept,
    LocalState,
}

impl ResetPlan {
    /// The steps in the order a reset carries them out (see the module
    /// documentation for why).
    pub fn steps(&self) -> Vec<Step<'_>> {
        let internal = (self.groups.iter())
            .filter(|group| group.moves(true).next().is_some())
            .map(Step::InternalOffsets);
        internal
            .chain([
                Step::DeleteTopics,
                Step::Kept,
                Step::LocalState,
                Step::InputOffsets,
            ])
            .collect()
    }

    /// Whether `step` changes anything.
    pub fn changes(&self, step: &Step<'_>) -> bool {
        match step {
            Step::InternalOffsets(_) => true,
            Step::DeleteTopics => !self.delete_topics.is_empty(),
            Step::InputOffsets => self.groups.iter().any(|g| g.moves(false).next().is_some()),
            Step::Kept => false,
            Step::LocalState => self.wipe_local_state,
        }
    }

    /// What `step` does, in a few words, as done or still to do.
    pub fn step_name(&self, step: &Step<'_>, done: bool) -> String {
        let (done_text, to_do) = match step {
            Step::InternalOffsets(group) => {
                let what = format!(
                    "consumer group {}'s offsets on internal topics",
                    group.group
                );
                (format!("committed {what}"), format!("commit {what}"))
            }
            Step::DeleteTopics => (
                "deleted the internal topics".to_string(),
                "delete the internal topics".to_string(),
            ),
            Step::InputOffsets => (
                "committed the input offsets".to_string(),
                "commit the input offsets".to_string(),
            ),
            Step::Kept => ("kept the rest".to_string(), "keep the rest".to_string()),
            Step::LocalState => (
                "wiped the local state".to_string(),
                "wipe the local state".to_string(),
            ),
        };
        if done {
            done_text
        } else {
            to_do
        }
    }

    /// The text of `step`: what will be done, or with `done` what was.
    pub fn render(&self, step: &Step<'_>, done: bool) -> String {
        let mut out = String::new();
        let verb = if done { "committed" } else { "to commit" };
        match step {
            Step::InternalOffsets(group) => {
                let _ = writeln!(
                    out,
                    "Consumer group {}: offsets {verb} on internal topics (deleted next, \
                     recreated empty)",
                    group.group
                );
                for offset in group.moves(true) {
                    render_move(&mut out, offset);
                }
            }
            Step::DeleteTopics => {
                let heading = if done { "Deleted" } else { "To delete" };
                let _ = writeln!(
                    out,
                    "{heading}: internal topics (the service creates them again at start-up):"
                );
                if self.delete_topics.is_empty() {
                    let _ = writeln!(out, "  none exist");
                }
                for topic in &self.delete_topics {
                    let _ = writeln!(out, "  {topic}");
                }
            }
            Step::InputOffsets => {
                for group in self.groups.iter().filter(|group| group.reads_inputs) {
                    let _ = writeln!(
                        out,
                        "Consumer group {}: offsets {verb}, inputs {}",
                        group.group, self.to
                    );
                    for offset in group.moves(false) {
                        render_move(&mut out, offset);
                    }
                }
            }
            Step::Kept => {
                let _ = write!(out, "Kept: dead-letter topic {}", self.dead_letter_topic);
                for topic in &self.output_topics {
                    let _ = write!(out, ", output topic {topic}");
                }
                out.push('\n');
                for (group, topic) in &self.kept_offsets {
                    let _ = writeln!(
                        out,
                        "Kept: offsets of consumer group {group} on {topic} \
                         (--ignore-committed-topic)"
                    );
                }
            }
            Step::LocalState => {
                let _ = match (self.wipe_local_state, done) {
                    (true, true) => writeln!(out, "Wiped: local state ({KEPT_STATE_FILE} kept):"),
                    (true, false) => {
                        writeln!(out, "To wipe: local state ({KEPT_STATE_FILE} kept):")
                    }
                    (false, _) => writeln!(
                        out,
                        "Not wiped: local state; delete it on every instance's host before \
                         the instance starts again (or reset there with --wipe-local-state):"
                    ),
                };
                for dir in &self.state_dirs {
                    let _ = writeln!(out, "  {}", dir.display());
                }
            }
        }
        out
    }

    /// The whole plan as `--dry-run` prints it, in the order of the steps.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "Dry run: reset of application {}; nothing is changed.\n",
            self.application_id
        );
        for step in self.steps() {
            out.push_str(&self.render(&step, false));
        }
        out
    }
}

fn render_move(out: &mut String, offset: &OffsetMove) {
    let current = offset
        .current
        .map_or("none".to_string(), |current| current.to_string());
    let _ = writeln!(
        out,
        "  {} partition {}: {current} -> {}",
        offset.topic, offset.partition, offset.new
    );
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn offsets(
        low: i64,
        high: i64,
        committed: Option<i64>,
        at_time: Option<i64>,
    ) -> PartitionOffsets {
        PartitionOffsets {
            low,
            high,
            committed,
            at_time,
            listed: None,
        }
    }

    fn file(lines: &[(&str, i32, i64)]) -> OffsetsFile {
        OffsetsFile {
            path: "plan.csv".into(),
            offsets: lines
                .iter()
                .map(|(topic, partition, offset)| ((topic.to_string(), *partition), *offset))
                .collect(),
        }
    }

    #[test]
    fn new_offsets_stay_within_the_partitions_records() {
        let partition = offsets(10, 100, Some(50), Some(70));
        assert_eq!(new_offset(&ResetTo::Earliest, partition), 10);
        assert_eq!(new_offset(&ResetTo::Latest, partition), 100);
        assert_eq!(new_offset(&ResetTo::Time(0), partition), 70);
        assert_eq!(
            new_offset(&ResetTo::Time(0), offsets(10, 100, Some(50), None)),
            100,
            "no record that late: the end"
        );
        assert_eq!(new_offset(&ResetTo::Shift(-20), partition), 30);
        assert_eq!(new_offset(&ResetTo::Shift(20), partition), 70);
        assert_eq!(new_offset(&ResetTo::Shift(-100), partition), 10, "clamped");
        assert_eq!(new_offset(&ResetTo::Shift(100), partition), 100, "clamped");
        assert_eq!(
            new_offset(&ResetTo::Shift(5), offsets(10, 100, None, None)),
            15,
            "nothing committed: from the start"
        );
        assert_eq!(
            new_offset(&ResetTo::Shift(-5), offsets(10, 100, Some(3), None)),
            10,
            "a committed offset below the start (retention)"
        );
        assert_eq!(new_offset(&ResetTo::Shift(i64::MAX), partition), 100);
        assert_eq!(new_offset(&ResetTo::Earliest, offsets(0, 0, None, None)), 0);
    }

    #[test]
    fn an_offset_asked_for_is_clamped_to_the_partitions_records() {
        let partition = offsets(10, 100, Some(50), None);
        assert_eq!(new_offset(&ResetTo::Offset(42), partition), 42);
        assert_eq!(new_offset(&ResetTo::Offset(10), partition), 10);
        assert_eq!(new_offset(&ResetTo::Offset(100), partition), 100);
        assert_eq!(
            new_offset(&ResetTo::Offset(3), partition),
            10,
            "below the first offset (deleted by retention): the first"
        );
        assert_eq!(
            new_offset(&ResetTo::Offset(1_000), partition),
            100,
            "past the end: the end"
        );
        assert_eq!(
            new_offset(&ResetTo::Offset(5), offsets(0, 0, None, None)),
            0
        );
        let listed = |listed| PartitionOffsets {
            listed: Some(listed),
            ..partition
        };
        let to = ResetTo::File(file(&[]));
        assert_eq!(new_offset(&to, listed(60)), 60);
        assert_eq!(new_offset(&to, listed(0)), 10, "clamped to the first");
        assert_eq!(new_offset(&to, listed(500)), 100, "clamped to the end");
    }

    /// A stage reading `inputs` (topic, partition count) and `internal`
    /// topics, whose group committed on `committed`.
    fn group(
        name: &str,
        inputs: &[(&str, i32)],
        internal: &[&str],
        committed: &[&str],
    ) -> GroupState {
        GroupState {
            group: name.into(),
            stores: 1,
            inputs: inputs
                .iter()
                .map(|(topic, count)| InputTopic {
                    topic: topic.to_string(),
                    partitions: (0..*count)
                        .map(|p| (p, offsets(0, 10 + i64::from(p), Some(5), None)))
                        .collect(),
                })
                .collect(),
            internal: internal
                .iter()
                .map(|topic| InternalTopic {
                    topic: topic.to_string(),
                    committed: Some(vec![(0, Some(4))]),
                })
                .collect(),
            committed_topics: committed.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn committed_topics_the_flags_do_not_name_refuse_the_reset() {
        let ignored =
            |topics: &[&str]| -> Vec<String> { topics.iter().map(|t| t.to_string()).collect() };
        // What the group committed on, all named: inputs and internal topics.
        let right = [
            group("shop", &[("orders", 2)], &[], &["orders"]),
            group("shop-final", &[], &["shop-partials"], &["shop-partials"]),
        ];
        assert_eq!(check_committed_topics(&right, &[]).unwrap(), []);
        // Inputs never committed on are fine: they start where asked.
        let fresh = [group(
            "shop",
            &[("orders", 2), ("returns", 1)],
            &[],
            &["orders"],
        )];
        assert_eq!(check_committed_topics(&fresh, &[]).unwrap(), []);
        let nothing = [group("shop", &[("orders", 2)], &[], &[])];
        assert_eq!(check_committed_topics(&nothing, &[]).unwrap(), []);

        // --input-topic other, where the group committed on orders.
        let other = [group("shop", &[("other", 1)], &[], &["orders"])];
        let error = check_committed_topics(&other, &[]).unwrap_err().to_string();
        assert_eq!(
            error,
            "consumer group shop has committed offsets on orders, which the flags given do \
             not name as an input (they name other); give reset the flags the application \
             runs with, or, if it no longer reads orders, add --ignore-committed-topic orders \
             to keep those offsets as they are"
        );
        // A join given the orders but not its shipments topic.
        let missed = [group(
            "joiner",
            &[("orders", 1), ("shipments-typo", 1)],
            &["joiner-shipments-repartition"],
            &["orders", "shipments", "joiner-shipments-repartition"],
        )];
        let error = check_committed_topics(&missed, &[])
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "consumer group joiner has committed offsets on shipments, which the flags \
                 given do not name as an input (they name orders, shipments-typo);"
            ),
            "{error}"
        );
        // Groups are named each; the override lists every topic.
        let both = [
            group("shop", &[("other", 1)], &[], &["orders", "returns"]),
            group(
                "shop-final",
                &[],
                &["shop-partials"],
                &["shop-partials", "legacy"],
            ),
        ];
        let error = check_committed_topics(&both, &[]).unwrap_err().to_string();
        assert!(
            error.starts_with(
                "consumer group shop has committed offsets on orders, returns, which the \
                 flags given do not name as an input (they name other); consumer group \
                 shop-final has committed offsets on legacy, which the flags given do not \
                 name as an input (they name none);"
            ) && error.ends_with(
                "if it no longer reads legacy, orders, returns, add --ignore-committed-topic \
                 legacy --ignore-committed-topic orders --ignore-committed-topic returns to \
                 keep those offsets as they are"
            ),
            "{error}"
        );
        // Ignored: kept, and said so; only topics the flags leave out.
        assert_eq!(
            check_committed_topics(&other, &ignored(&["orders", "other"])).unwrap(),
            [("shop".to_string(), "orders".to_string())]
        );
        let partly = check_committed_topics(&both, &ignored(&["orders", "returns"]));
        assert!(partly
            .unwrap_err()
            .to_string()
            .starts_with("consumer group shop-final has committed offsets on legacy, which"));
    }

    #[test]
    fn an_offsets_file_gives_every_input_partition_and_nothing_else() {
        let groups = [
            group("shop", &[("orders", 2)], &[], &[]),
            group("shop-final", &[("returns", 1)], &["shop-partials"], &[]),
        ];
        let complete = [("orders", 0, 1), ("orders", 1, 2), ("returns", 0, 3)];
        check_offsets_file(&file(&complete), &groups).expect("every input partition");
        for (lines, error) in [
            (
                &complete[..2],
                "--from-file plan.csv gives no offset for returns partition 0: it needs a line \
                 for every input partition",
            ),
            (
                &[("orders", 1, 2)][..],
                "--from-file plan.csv gives no offset for orders partition 0, returns \
                 partition 0: it needs a line for every input partition",
            ),
            (
                &[complete[0], complete[1], complete[2], ("orders", 2, 0)][..],
                "--from-file plan.csv names orders partition 2 (orders has 2 partitions), \
                 which does not exist",
            ),
            (
                &[
                    complete[0],
                    complete[1],
                    complete[2],
                    ("shop-partials", 0, 0),
                ][..],
                "--from-file plan.csv names shop-partials, which is not an input of the \
                 application (its inputs: orders, returns)",
            ),
            (
                &[("order", 0, 0), ("return", 0, 0)][..],
                "--from-file plan.csv names order, return, which are not inputs of the \
                 application (its inputs: orders, returns)",
            ),
        ] {
            let refused = check_offsets_file(&file(lines), &groups).unwrap_err();
            assert_eq!(refused.to_string(), error);
        }
    }

    #[test]
    fn a_plan_moves_inputs_as_asked_and_internal_topics_to_zero() {
        let application = Application {
            application_id: "shop".into(),
            dead_letter_topic: "shop-dlq".into(),
            output_topics: vec!["counts".into()],
            state_dirs: vec!["/state/shop".into()],
        };
        let mut shop = group("shop", &[("orders", 2)], &["shop-partials"], &["orders"]);
        shop.internal.push(InternalTopic {
            topic: "shop-gone-repartition".into(),
            committed: None,
        });
        let to = ResetTo::File(file(&[("orders", 0, 7), ("orders", 1, 99)]));
        let plan = build_plan(&application, &to, &[shop], vec![], &[], false).unwrap();
        let moves: Vec<_> = plan.groups[0]
            .moves
            .iter()
            .map(|m| (m.topic.as_str(), m.partition, m.current, m.new, m.internal))
            .collect();
        assert_eq!(
            moves,
            [
                ("orders", 0, Some(5), 7, false),
                ("orders", 1, Some(5), 11, false),
                ("shop-partials", 0, Some(4), 0, true),
            ],
            "the file's offsets, clamped to the end (11); a topic gone has no offsets"
        );
        assert_eq!(plan.groups[0].metadata, "streams.changelogs=-");
        let plan_of = |groups: &[GroupState]| {
            build_plan(&application, &ResetTo::Earliest, groups, vec![], &[], false)
        };
        let wrong = group("shop", &[("other", 1)], &[], &["orders"]);
        assert!(plan_of(&[wrong]).is_err());
        // An input that does not exist (no partitions): refused, after the
        // check of the committed topics, which says more of a typo.
        let typo = group("shop", &[("ordrs", 0)], &[], &["orders"]);
        let error = plan_of(&[typo]).unwrap_err().to_string();
        assert!(
            error.starts_with("consumer group shop has committed offsets on orders"),
            "{error}"
        );
        let fresh = group("shop", &[("orders", 1), ("ordrs", 0)], &[], &[]);
        let error = plan_of(&[fresh]).unwrap_err().to_string();
        assert_eq!(error, "input topic(s) ordrs do not exist");
    }

    fn plan(wipe_local_state: bool) -> ResetPlan {
        ResetPlan {
            application_id: "shop".into(),
            to: ResetTo::Shift(-2),
            groups: vec![
                GroupReset {
                    group: "shop".into(),
                    reads_inputs: true,
                    moves: vec![OffsetMove {
                        topic: "orders".into(),
                        partition: 0,
                        current: Some(10),
                        new: 8,
                        internal: false,
                    }],
                    metadata: ChangelogReach::nothing(1).to_metadata(),
                },
                GroupReset {
                    group: "shop-final".into(),
                    reads_inputs: false,
                    moves: vec![OffsetMove {
                        topic: "shop-partials-repartition".into(),
                        partition: 0,
                        current: None,
                        new: 0,
                        internal: true,
                    }],
                    metadata: ChangelogReach::nothing(1).to_metadata(),
                },
            ],
            delete_topics: vec!["shop-partials-repartition".into()],
            dead_letter_topic: "shop-dlq".into(),
            output_topics: vec!["counts".into()],
            kept_offsets: vec![("shop".into(), "orders-v1".into())],
            state_dirs: vec!["/state/shop".into(), "/state/shop-final".into()],
            wipe_local_state,
        }
    }

    #[test]
    fn a_dry_run_lists_every_offset_topic_and_directory_in_the_order_of_the_steps() {
        let text = plan(true).to_text();
        assert_eq!(
            text,
            "Dry run: reset of application shop; nothing is changed.\n\
             Consumer group shop-final: offsets to commit on internal topics (deleted next, recreated empty)\n\
             \x20 shop-partials-repartition partition 0: none -> 0\n\
             To delete: internal topics (the service creates them again at start-up):\n\
             \x20 shop-partials-repartition\n\
             Kept: dead-letter topic shop-dlq, output topic counts\n\
             Kept: offsets of consumer group shop on orders-v1 (--ignore-committed-topic)\n\
             To wipe: local state (instance.id kept):\n\
             \x20 /state/shop\n\
             \x20 /state/shop-final\n\
             Consumer group shop: offsets to commit, inputs shifted by -2\n\
             \x20 orders partition 0: 10 -> 8\n"
        );
        let kept = plan(false).to_text();
        assert!(kept.contains("Not wiped: local state;"), "{kept}");
        let done = plan(true).render(&Step::LocalState, true);
        assert_eq!(
            done,
            "Wiped: local state (instance.id kept):\n  /state/shop\n  /state/shop-final\n"
        );
    }

    #[test]
    fn steps_are_named_as_done_or_to_do() {
        let plan = plan(true);
        let names: Vec<(String, String)> = plan
            .steps()
            .iter()
            .filter(|step| plan.changes(step))
            .map(|step| (plan.step_name(step, true), plan.step_name(step, false)))
            .collect();
        let expected = [
            (
                "committed consumer group shop-final's offsets on internal topics",
                "commit consumer group shop-final's offsets on internal topics",
            ),
            ("deleted the internal topics", "delete the internal topics"),
            ("wiped the local state", "wipe the local state"),
            ("committed the input offsets", "commit the input offsets"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(done, to_do)| (done.to_string(), to_do.to_string()))
            .collect();
        assert_eq!(names, expected);
        assert!(!plan.changes(&Step::Kept));
        assert!(!ResetPlan {
            wipe_local_state: false,
            delete_topics: vec![],
            ..plan.clone()
        }
        .changes(&Step::DeleteTopics));
    }
}
