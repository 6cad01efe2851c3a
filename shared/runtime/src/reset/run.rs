//! Carrying out a [`ResetPlan`], step by step, through [`Effects`]: the
//! broker and this host's disk in a real reset, a model of them in the
//! tests. Between steps a signal stops it; a failed step stops it too;
//! either way it says what was done and what was not.

use std::io::Write;
use std::path::Path;

use super::plan::{OffsetMove, ResetPlan, Step};

/// What a reset changes, one request at a time.
pub trait Effects {
    /// Commits `moves` as `group`'s offsets, with `metadata`, without
    /// joining the group (refused by the broker if it has members).
    fn commit(&mut self, group: &str, moves: &[&OffsetMove], metadata: &str) -> anyhow::Result<()>;
    /// Fails if a group of the application has members (an instance
    /// started since the reset looked).
    fn refuse_live_groups(&mut self) -> anyhow::Result<()>;
    /// Deletes `topics` (those already gone are fine) and waits until they
    /// are gone.
    fn delete_topics(&mut self, topics: &[String]) -> anyhow::Result<()>;
    /// Deletes a stage's local state but its instance id (a directory that
    /// does not exist is fine).
    fn wipe(&mut self, dir: &Path) -> anyhow::Result<()>;
}

/// A reset stopped by a signal between two steps: not a failure of the
/// reset, which running it again completes. The process exits with
/// 128 + the signal's number, as a shell reports a process the signal
/// ended.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Stopped {
    pub signal: i32,
    message: String,
}

impl Stopped {
    /// Stopped by `signal` once the steps named `done` were done, before
    /// those named `to_do`.
    pub fn new(signal: i32, done: &[String], to_do: &[String]) -> Self {
        let name = signal_name(signal);
        let message = if done.is_empty() {
            format!("reset stopped by {name}; nothing was changed")
        } else {
            format!(
                "reset stopped by {name}; done: {}; not done yet: {}; do not start the \
                 application: run the same reset again to complete it",
                done.join(", "),
                to_do.join(", ")
            )
        };
        Stopped { signal, message }
    }

    /// The exit code: 130 after SIGINT, 143 after SIGTERM.
    pub fn exit_code(&self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(1)
    }
}

/// `SIGINT`, `SIGTERM`, or the number of another signal.
pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".to_string(),
        libc::SIGTERM => "SIGTERM".to_string(),
        other => format!("signal {other}"),
    }
}

/// Carries out `plan`'s steps in order through `effects`, writing each to
/// `out` once done. Before each step that changes anything it asks
/// `stop` whether a signal came (the signal's number), and if so stops
/// with [`Stopped`]. A step that fails stops the reset with its error,
/// saying what was done and what was not.
pub fn run_plan(
    plan: &ResetPlan,
    effects: &mut dyn Effects,
    stop: &dyn Fn() -> Option<i32>,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    writeln!(out, "Reset of application {}:", plan.application_id)?;
    let steps = plan.steps();
    let mut done: Vec<String> = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        if plan.changes(step) {
            let to_do = || -> Vec<String> {
                (steps[index..].iter())
                    .filter(|step| plan.changes(step))
                    .map(|step| plan.step_name(step, false))
                    .collect()
            };
            if let Some(signal) = stop() {
                return Err(Stopped::new(signal, &done, &to_do()).into());
            }
            if let Err(error) = execute(plan, step, effects) {
                let done = if done.is_empty() {
                    "nothing before this step".to_string()
                } else {
                    done.join(", ")
                };
                anyhow::bail!(
                    "{error:#}; the reset is not complete (done: {done}; not done: {}): do not \
                     start the application; once that is fixed, run the same reset again to \
                     complete it",
                    to_do().join(", ")
                );
            }
            done.push(plan.step_name(step, true));
        }
        out.write_all(plan.render(step, true).as_bytes())?;
    }
    Ok(())
}

/// Carries out one step.
fn execute(plan: &ResetPlan, step: &Step<'_>, effects: &mut dyn Effects) -> anyhow::Result<()> {
    match step {
        Step::InternalOffsets(group) => {
            let moves: Vec<&OffsetMove> = group.moves(true).collect();
            effects.commit(&group.group, &moves, &group.metadata)
        }
        Step::DeleteTopics => {
            // Deleting under a running instance would lose its state; a
            // commit, refused by the broker while the group has members,
            // guards the other steps.
            effects.refuse_live_groups()?;
            effects.delete_topics(&plan.delete_topics)
        }
        // All groups at once, not stopped between two: the only step a
        // second run would not repeat the same (--shift-by moves from the
        // committed offsets).
        Step::InputOffsets => {
            let mut committed: Vec<&str> = Vec::new();
            for group in &plan.groups {
                let moves: Vec<&OffsetMove> = group.moves(false).collect();
                if moves.is_empty() {
                    continue;
                }
                match effects.commit(&group.group, &moves, &group.metadata) {
                    Ok(()) => committed.push(&group.group),
                    Err(error) if committed.is_empty() => return Err(error),
                    Err(error) => anyhow::bail!(
                        "{error:#} (the input offsets of consumer group(s) {} were committed: \
                         under --shift-by, running the same reset again moves those again)",
                        committed.join(", ")
                    ),
                }
            }
            Ok(())
        }
        Step::Kept => Ok(()),
        Step::LocalState => {
            for dir in &plan.state_dirs {
                effects.wipe(dir)?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::PathBuf;

    use super::*;
    use crate::reset::plan::{
        build_plan, Application, GroupState, InputTopic, InternalTopic, PartitionOffsets,
    };
    use crate::reset::position::{OffsetsFile, ResetTo};

    /// A stage of the model application: its group, inputs and internal
    /// topics it reads.
    struct Stage {
        group: &'static str,
        inputs: &'static [&'static str],
        internal: &'static [&'static str],
    }

    /// Two stages as window-aggregator has them: the first reads the input
    /// and a repartition topic, the second the stage link.
    const STAGES: [Stage; 2] = [
        Stage {
            group: "shop",
            inputs: &["orders"],
            internal: &["shop-by-store-repartition"],
        },
        Stage {
            group: "shop-final",
            inputs: &[],
            internal: &["shop-partials"],
        },
    ];
    const INTERNAL: [&str; 4] = [
        "shop-by-store-repartition",
        "shop-partials",
        "shop-counts-changelog",
        "shop-final-counts-changelog",
    ];

    /// A model of the broker and this host's disk, as far as a reset
    /// changes them. A deleted topic takes its groups' committed offsets
    /// with it, as Kafka's group coordinator drops them.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct World {
        /// Each topic's partitions: (first offset, end).
        topics: BTreeMap<String, Vec<(i64, i64)>>,
        /// (group, topic, partition) -> committed offset.
        committed: BTreeMap<(String, String, i32), i64>,
        /// State directories with more than their instance id.
        state: BTreeSet<PathBuf>,
        /// The effect (counted from 1) that fails, once.
        fail_at: Option<usize>,
        effects: usize,
    }

    impl World {
        /// The application after a run: inputs read to their end, the
        /// internal topics read part-way, local state on disk.
        fn after_a_run() -> Self {
            let mut world = World {
                topics: BTreeMap::new(),
                committed: BTreeMap::new(),
                state: BTreeSet::new(),
                fail_at: None,
                effects: 0,
            };
            world.topics.insert("orders".into(), vec![(2, 40), (0, 35)]);
            for topic in INTERNAL {
                world.topics.insert(topic.into(), vec![(0, 20)]);
            }
            for (partition, end) in [(0, 40), (1, 35)] {
                world
                    .committed
                    .insert(("shop".into(), "orders".into(), partition), end);
            }
            for (group, topic) in [
                ("shop", "shop-by-store-repartition"),
                ("shop-final", "shop-partials"),
            ] {
                world.committed.insert((group.into(), topic.into(), 0), 15);
            }
            world.state = state_dirs().into_iter().collect();
            world
        }

        fn effect(&mut self) -> anyhow::Result<()> {
            self.effects += 1;
            if self.fail_at == Some(self.effects) {
                self.fail_at = None;
                anyhow::bail!("broker error at effect {}", self.effects);
            }
            Ok(())
        }

        /// What a reset reads of each group.
        fn observe(&self) -> Vec<GroupState> {
            STAGES
                .iter()
                .map(|stage| {
                    let committed = |topic: &str, partition: i32| {
                        let key = (stage.group.to_string(), topic.to_string(), partition);
                        self.committed.get(&key).copied()
                    };
                    GroupState {
                        group: stage.group.into(),
                        stores: 1,
                        inputs: (stage.inputs.iter())
                            .map(|topic| InputTopic {
                                topic: topic.to_string(),
                                partitions: (self.topics[*topic].iter().enumerate())
                                    .map(|(partition, (low, high))| {
                                        let partition = partition as i32;
                                        let offsets = PartitionOffsets {
                                            low: *low,
                                            high: *high,
                                            committed: committed(topic, partition),
                                            ..PartitionOffsets::default()
                                        };
                                        (partition, offsets)
                                    })
                                    .collect(),
                            })
                            .collect(),
                        internal: (stage.internal.iter())
                            .map(|topic| InternalTopic {
                                topic: topic.to_string(),
                                committed: self.topics.get(*topic).map(|partitions| {
                                    (0..partitions.len() as i32)
                                        .map(|p| (p, committed(topic, p)))
                                        .collect()
                                }),
                            })
                            .collect(),
                        committed_topics: (self.committed.keys())
                            .filter(|(group, _, _)| group == stage.group)
                            .map(|(_, topic, _)| topic.clone())
                            .collect(),
                    }
                })
                .collect()
        }

        /// The plan of a reset to `to` with `--wipe-local-state`, as the
        /// reset works it out from what it reads.
        fn plan(&self, to: &ResetTo) -> ResetPlan {
            let application = Application {
                application_id: "shop".into(),
                dead_letter_topic: "shop-dlq".into(),
                output_topics: vec!["counts".into()],
                state_dirs: state_dirs(),
            };
            let existing = (INTERNAL.iter())
                .filter(|topic| self.topics.contains_key(**topic))
                .map(|topic| topic.to_string())
                .collect();
            build_plan(&application, to, &self.observe(), existing, &[], true).unwrap()
        }
    }

    fn state_dirs() -> Vec<PathBuf> {
        vec!["/state/shop".into(), "/state/shop-final".into()]
    }

    impl Effects for World {
        fn commit(
            &mut self,
            group: &str,
            moves: &[&OffsetMove],
            _metadata: &str,
        ) -> anyhow::Result<()> {
            self.effect()?;
            for offset in moves {
                let key = (group.to_string(), offset.topic.clone(), offset.partition);
                self.committed.insert(key, offset.new);
            }
            Ok(())
        }

        fn refuse_live_groups(&mut self) -> anyhow::Result<()> {
            Ok(())
        }

        fn delete_topics(&mut self, topics: &[String]) -> anyhow::Result<()> {
            // One topic at a time: a failure may leave some deleted.
            for topic in topics {
                self.effect()?;
                self.topics.remove(topic);
                self.committed
                    .retain(|(_, committed, _), _| committed != topic);
            }
            Ok(())
        }

        fn wipe(&mut self, dir: &Path) -> anyhow::Result<()> {
            self.effect()?;
            self.state.remove(dir);
            Ok(())
        }
    }

    /// Runs the reset the world's state gives to `to`, stopped by SIGTERM
    /// before its step number `stop_before` (counting those that change
    /// anything, from 1).
    fn run(world: &mut World, to: &ResetTo, stop_before: Option<usize>) -> anyhow::Result<String> {
        let plan = world.plan(to);
        let asked = Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            (Some(asked.get()) == stop_before).then_some(libc::SIGTERM)
        };
        let mut out = Vec::new();
        run_plan(&plan, world, &stop, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    fn targets() -> Vec<ResetTo> {
        let file = OffsetsFile {
            path: "offsets.csv".into(),
            offsets: BTreeMap::from([(("orders".into(), 0), 7), (("orders".into(), 1), 99)]),
        };
        vec![
            ResetTo::Earliest,
            ResetTo::Latest,
            ResetTo::Shift(-3),
            ResetTo::Offset(3),
            ResetTo::File(file),
        ]
    }

    /// Wherever a signal stops a reset, the same reset run again completes
    /// it: the world ends as after an uninterrupted reset. --shift-by too,
    /// whose second run must not shift again: the input offsets are the
    /// last thing on the broker a reset changes.
    #[test]
    fn a_reset_stopped_between_any_two_steps_is_completed_by_running_it_again() {
        for to in targets() {
            let mut uninterrupted = World::after_a_run();
            run(&mut uninterrupted, &to, None).unwrap();
            let shifted = uninterrupted.committed[&("shop".into(), "orders".into(), 0)];
            if to == ResetTo::Shift(-3) {
                assert_eq!(shifted, 37);
            }
            assert_eq!(uninterrupted.state, BTreeSet::new());
            assert_eq!(
                uninterrupted.topics.keys().collect::<Vec<_>>(),
                ["orders"],
                "{to}"
            );
            let steps = {
                let plan = World::after_a_run().plan(&to);
                let steps = plan.steps();
                steps.iter().filter(|step| plan.changes(step)).count()
            };
            assert_eq!(
                steps, 5,
                "two groups' internal offsets, delete, wipe, inputs"
            );
            for stop_before in 1..=steps {
                let mut world = World::after_a_run();
                let stopped = run(&mut world, &to, Some(stop_before)).unwrap_err();
                let stopped = stopped
                    .downcast::<Stopped>()
                    .expect("stopped by the signal");
                assert_eq!(stopped.exit_code(), 143);
                if stop_before == 1 {
                    assert_eq!(
                        stopped.to_string(),
                        "reset stopped by SIGTERM; nothing was changed"
                    );
                    assert_eq!(world, World::after_a_run());
                } else {
                    assert!(
                        stopped.to_string().ends_with(
                            "do not start the application: run the same reset again to \
                             complete it"
                        ),
                        "{stopped}"
                    );
                }
                run(&mut world, &to, None).unwrap();
                world.effects = uninterrupted.effects;
                assert_eq!(
                    world, uninterrupted,
                    "{to}, stopped before step {stop_before}"
                );
            }
        }
    }

    /// The same of a reset that stops at a broker error, wherever it comes
    /// (deleting the internal topics may stop half-way).
    #[test]
    fn a_reset_failed_at_any_request_is_completed_by_running_it_again() {
        for to in targets() {
            let mut uninterrupted = World::after_a_run();
            run(&mut uninterrupted, &to, None).unwrap();
            let effects = uninterrupted.effects;
            assert_eq!(effects, 2 + 4 + 2 + 1);
            for fail_at in 1..=effects {
                let mut world = World::after_a_run();
                world.fail_at = Some(fail_at);
                let error = run(&mut world, &to, None).unwrap_err().to_string();
                assert!(
                    error.starts_with(&format!(
                        "broker error at effect {fail_at}; the reset is not complete (done: "
                    )) && error.ends_with("run the same reset again to complete it"),
                    "{error}"
                );
                run(&mut world, &to, None).unwrap();
                world.effects = uninterrupted.effects;
                assert_eq!(world, uninterrupted, "{to}, failed at effect {fail_at}");
            }
        }
    }

    #[test]
    fn a_stopped_reset_says_what_was_done_and_what_was_not() {
        let mut world = World::after_a_run();
        let stopped = run(&mut world, &ResetTo::Earliest, Some(4)).unwrap_err();
        assert_eq!(
            stopped.to_string(),
            "reset stopped by SIGTERM; done: committed consumer group shop's offsets on \
             internal topics, committed consumer group shop-final's offsets on internal \
             topics, deleted the internal topics; not done yet: wipe the local state, commit \
             the input offsets; do not start the application: run the same reset again to \
             complete it"
        );
        let mut world = World::after_a_run();
        world.fail_at = Some(4);
        let failed = run(&mut world, &ResetTo::Earliest, None).unwrap_err();
        assert_eq!(
            failed.to_string(),
            "broker error at effect 4; the reset is not complete (done: committed consumer \
             group shop's offsets on internal topics, committed consumer group shop-final's \
             offsets on internal topics; not done: delete the internal topics, wipe the local \
             state, commit the input offsets): do not start the application; once that \
             is fixed, run the same reset again to complete it"
        );
        let mut interrupted = World::after_a_run();
        let stopped = run(&mut interrupted, &ResetTo::Earliest, Some(1)).unwrap_err();
        let stopped = stopped.downcast::<Stopped>().unwrap();
        assert_eq!(stopped.signal, libc::SIGTERM);
        let sigint = Stopped::new(libc::SIGINT, &[], &[]);
        assert_eq!(
            (sigint.exit_code(), sigint.to_string().as_str()),
            (130, "reset stopped by SIGINT; nothing was changed")
        );
    }

    /// What a completed reset prints: each step as done, in order.
    #[test]
    fn a_reset_prints_each_step_once_done() {
        let mut world = World::after_a_run();
        let printed = run(&mut world, &ResetTo::Offset(3), None).unwrap();
        assert_eq!(
            printed,
            "Reset of application shop:\n\
             Consumer group shop: offsets committed on internal topics (deleted next, recreated empty)\n\
             \x20 shop-by-store-repartition partition 0: 15 -> 0\n\
             Consumer group shop-final: offsets committed on internal topics (deleted next, recreated empty)\n\
             \x20 shop-partials partition 0: 15 -> 0\n\
             Deleted: internal topics (the service creates them again at start-up):\n\
             \x20 shop-by-store-repartition\n\
             \x20 shop-partials\n\
             \x20 shop-counts-changelog\n\
             \x20 shop-final-counts-changelog\n\
             Kept: dead-letter topic shop-dlq, output topic counts\n\
             Wiped: local state (instance.id kept):\n\
             \x20 /state/shop\n\
             \x20 /state/shop-final\n\
             Consumer group shop: offsets committed, inputs to offset 3\n\
             \x20 orders partition 0: 40 -> 3\n\
             \x20 orders partition 1: 35 -> 3\n"
        );
    }
}
