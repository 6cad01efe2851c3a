//! `<service> reset [options] <service flags>`: makes an application
//! process its input again, like Kafka Streams'
//! `kafka-streams-application-reset` (plus the local state that tool leaves
//! to `KafkaStreams#cleanUp()`). With every instance stopped, it first
//! reads, changing nothing:
//!
//! - it refuses while a consumer group of the application has members;
//! - it refuses when a group has committed offsets on a topic that the
//!   flags given name neither as an input nor as an internal topic the
//!   stage reads (the flags are not the ones the application ran with:
//!   `--input-topic other` where the group read `orders`, or a join's
//!   second input left out or misspelt), unless `--ignore-committed-topic`
//!   names it, whose offsets are then kept as they are. An input the group
//!   never committed on is fine: it starts from the position asked for;
//! - with `--from-file`, it refuses a file that does not give exactly the
//!   input partitions.
//!
//! Then it changes, in this order:
//!
//! 1. commits offset 0 for every group on the internal topics it reads
//!    (stage links, repartition topics) that exist, which are deleted
//!    next (the broker drops the offsets of a deleted topic too; these
//!    commits make sure, and the broker refuses them while the group has
//!    members);
//! 2. deletes the internal topics: changelogs, repartition and stage-link
//!    topics (the service creates them again, empty, at start-up), after
//!    checking again that no group has members;
//! 3. with `--wipe-local-state`, deletes the application's local state
//!    under `--state-dir` on this host;
//! 4. commits new offsets for every group on the input topics it reads
//!    (`--to-earliest`, the default, `--to-latest`, `--to-datetime`,
//!    `--by-duration`, `--shift-by`, `--to-offset`, `--from-file`).
//!
//! The order makes a reset stopped anywhere (a crash, a signal, a broker
//! error) one that the same reset run again completes. A second run works
//! its plan out again from what it finds, and steps 1 to 3 can be
//! repeated: offsets already committed, topics already gone and state
//! already wiped make them change nothing more. Step 4 is the one a second
//! run would not repeat the same, under `--shift-by`, which moves from the
//! committed offsets: so it comes last, all groups in one step that a
//! signal does not split (each group's offsets in one commit). A reset
//! stopped before it has not moved the input offsets, and one that got
//! past it has nothing left to do. Only a broker error between two
//! groups' commits could leave the input offsets of some groups moved and
//! not those of others, in an application with more than one stage
//! reading inputs (none of the services here); the error names what was
//! done. `--to-latest` and `--by-duration` are taken anew by the second
//! run: the inputs' ends then, the duration back from then.
//!
//! A SIGINT or SIGTERM stops the reset before its next step: it says what
//! was done and what was not, and exits with 130 (SIGINT) or 143
//! (SIGTERM). A second signal ends it at once, mid-step. A failed step
//! ends it with one error line that says the same, exit code 1. Either
//! way, the application must not be started before the same reset has
//! been run again to its end.
//!
//! The dead-letter topic and the output topics are kept: they are what the
//! application has told others, and a reset does not take that back.
//! `--dry-run` prints what a reset would do and changes nothing.

mod broker;
mod datetime;
mod plan;
mod position;
mod run;

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::config::RuntimeArgs;
use crate::describe::ServiceDescription;
use crate::shutdown::is_interrupted;
use crate::topics::Admin;
use broker::{refuse_live_groups, GroupClient};
use plan::{build_plan, Application};
pub use plan::{new_offset, GroupReset, OffsetMove, PartitionOffsets, ResetPlan};
pub use position::{OffsetsFile, PositionArgs, ResetTo};
pub use run::Stopped;
use run::{run_plan, Effects};

/// What an instance keeps in its state directory besides task state: its
/// instance id, the stable part of its transactional id. A wipe keeps it,
/// so that the restarted instance still fences its predecessor.
const KEPT_STATE_FILE: &str = "instance.id";

/// How long the reset waits for a broker to answer at first.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The options of `reset`, before the service's flags.
#[derive(Debug, Clone, Args)]
pub struct ResetArgs {
    #[command(flatten)]
    pub position: PositionArgs,

    /// A topic a consumer group of the application has committed offsets
    /// on that the flags do not name as an input (one it no longer reads):
    /// reset anyway, keeping those offsets as they are. Without it such a
    /// topic refuses the reset. Repeatable.
    #[arg(long, value_name = "TOPIC")]
    pub ignore_committed_topic: Vec<String>,

    /// Also delete this host's local state of the application: the stages'
    /// directories under `--state-dir` (their `instance.id` is kept). Run
    /// on the host (or volume) of every instance.
    #[arg(long)]
    pub wipe_local_state: bool,

    /// Print what the reset would do, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `reset` for the service `description` describes, writing what it
/// does (or with `--dry-run` would do) to `out`. Stopped by a signal, it
/// fails with [`Stopped`].
pub fn reset(
    description: &ServiceDescription,
    args: &RuntimeArgs,
    options: &ResetArgs,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    // A worker thread of its own, so that signals are heard while the
    // reset waits for the broker.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let signals = StopSignals::listen(&runtime)?;
    let stop = || signals.heard();
    let (groups, admin, plan) = match prepare(description, args, options, &runtime, &signals) {
        Ok(prepared) => prepared,
        Err(error) if error.is::<Stopped>() => return Err(error),
        Err(error) => return Err(anyhow::anyhow!("{error:#}; nothing was changed")),
    };
    if options.dry_run {
        out.write_all(plan.to_text().as_bytes())?;
        return Ok(());
    }
    let mut effects = LiveEffects {
        admin: &admin,
        groups: &groups,
    };
    run_plan(&plan, &mut effects, &stop, out)
}

/// Connects, reads the groups and works out the plan, changing nothing;
/// fails with [`Stopped`] once `stop` reports a signal.
fn prepare(
    description: &ServiceDescription,
    args: &RuntimeArgs,
    options: &ResetArgs,
    runtime: &tokio::runtime::Runtime,
    signals: &StopSignals,
) -> anyhow::Result<(Vec<GroupClient>, Admin, ResetPlan)> {
    let stopped = || {
        signals
            .heard()
            .map_or(Ok(()), |signal| Err(Stopped::new(signal, &[], &[])))
    };
    // librdkafka logs errors only: what matters comes back as one.
    let client = args.client.settings(&[("log_level", "3")])?;
    let admin = Admin::wait_for_brokers(
        &client.kafka,
        runtime.handle().clone(),
        Some(CONNECT_TIMEOUT),
        &signals.flag,
    )
    .map_err(|error| match (is_interrupted(&error), signals.heard()) {
        (true, Some(signal)) => Stopped::new(signal, &[], &[]).into(),
        _ => error,
    })?;
    let groups: Vec<GroupClient> = description
        .stages
        .iter()
        .map(|stage| GroupClient::new(&client.kafka, stage))
        .collect::<anyhow::Result<_>>()?;
    stopped()?;
    refuse_live_groups(&admin, &groups)?;

    let to = options.position.target(now_millis());
    let mut states = Vec::new();
    for group in &groups {
        stopped()?;
        states.push(group.observe(&admin, &to)?);
    }
    let mut delete_topics = Vec::new();
    for topic in deletable_topics(description) {
        if admin.partition_count(&topic)?.is_some() {
            delete_topics.push(topic);
        }
    }
    let application = Application {
        application_id: description.application_id.clone(),
        dead_letter_topic: description.dead_letter_topic.clone(),
        output_topics: description.output_topics(),
        state_dirs: description
            .stages
            .iter()
            .map(|stage| args.state_dir.join(&stage.group_id))
            .collect(),
    };
    let plan = build_plan(
        &application,
        &to,
        &states,
        delete_topics,
        &options.ignore_committed_topic,
        options.wipe_local_state,
    )?;
    stopped()?;
    Ok((groups, admin, plan))
}

/// The internal topics a reset deletes: all but the dead letters.
fn deletable_topics(description: &ServiceDescription) -> Vec<String> {
    description
        .internal_topics()
        .into_iter()
        .filter(|topic| *topic != description.dead_letter_topic)
        .collect()
}

/// The broker and this host's disk.
struct LiveEffects<'a> {
    admin: &'a Admin,
    groups: &'a [GroupClient],
}

impl Effects for LiveEffects<'_> {
    fn commit(&mut self, group: &str, moves: &[&OffsetMove], metadata: &str) -> anyhow::Result<()> {
        let client = (self.groups.iter())
            .find(|client| client.group == group)
            .ok_or_else(|| anyhow::anyhow!("no consumer group {group} in the application"))?;
        client.commit(moves, metadata)
    }

    fn refuse_live_groups(&mut self) -> anyhow::Result<()> {
        refuse_live_groups(self.admin, self.groups)
    }

    fn delete_topics(&mut self, topics: &[String]) -> anyhow::Result<()> {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        self.admin.delete_topics(&names)
    }

    fn wipe(&mut self, dir: &Path) -> anyhow::Result<()> {
        wipe_state_dir(dir)
    }
}

/// SIGINT and SIGTERM, heard for the reset: the first is kept for the
/// reset to stop at its next step; a second ends the process at once.
struct StopSignals {
    heard: Arc<AtomicI32>,
    /// Set with `heard`, for the waits that take a flag.
    flag: Arc<AtomicBool>,
}

impl StopSignals {
    /// Installs the handlers; a task of `runtime` listens.
    fn listen(runtime: &tokio::runtime::Runtime) -> anyhow::Result<Self> {
        let _entered = runtime.enter();
        let mut terminate = signal(SignalKind::terminate())
            .map_err(|e| anyhow::anyhow!("cannot install the SIGTERM handler: {e}"))?;
        let mut interrupt = signal(SignalKind::interrupt())
            .map_err(|e| anyhow::anyhow!("cannot install the SIGINT handler: {e}"))?;
        let heard = Arc::new(AtomicI32::new(0));
        let flag = Arc::new(AtomicBool::new(false));
        let (first, first_flag) = (heard.clone(), flag.clone());
        runtime.spawn(async move {
            let signal = next_signal(&mut terminate, &mut interrupt).await;
            first.store(signal, Ordering::SeqCst);
            first_flag.store(true, Ordering::SeqCst);
            let second = next_signal(&mut terminate, &mut interrupt).await;
            eprintln!(
                "error: reset stopped at once by a second {}, possibly in the middle of a \
                 step; do not start the application: run the same reset again to complete it",
                run::signal_name(second)
            );
            // SAFETY: _exit only ends the process, as the signal would have.
            unsafe { libc::_exit(128 + second) }
        });
        Ok(StopSignals { heard, flag })
    }

    /// The first signal heard, if any.
    fn heard(&self) -> Option<i32> {
        match self.heard.load(Ordering::SeqCst) {
            0 => None,
            signal => Some(signal),
        }
    }
}

async fn next_signal(terminate: &mut Signal, interrupt: &mut Signal) -> i32 {
    tokio::select! {
        _ = terminate.recv() => libc::SIGTERM,
        _ = interrupt.recv() => libc::SIGINT,
    }
}

/// Deletes everything in a stage's state directory but its instance id.
fn wipe_state_dir(dir: &Path) -> anyhow::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => anyhow::bail!("cannot read state directory {}: {error}", dir.display()),
    };
    for entry in entries {
        let path = entry?.path();
        if path.file_name() == Some(KEPT_STATE_FILE.as_ref()) {
            continue;
        }
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| anyhow::anyhow!("cannot delete {}: {e}", path.display()))?;
    }
    Ok(())
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        reset: ResetArgs,
    }

    /// The reset options of `reset <flags>`.
    pub(in crate::reset) fn parse(flags: &[&str]) -> Result<ResetArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("reset").chain(flags.iter().copied()))
            .map(|cli| cli.reset)
    }

    #[test]
    fn committed_topics_to_ignore_are_named_one_flag_each() {
        assert_eq!(
            parse(&[]).unwrap().ignore_committed_topic,
            Vec::<String>::new()
        );
        let options = parse(&[
            "--ignore-committed-topic",
            "orders-v1",
            "--to-latest",
            "--ignore-committed-topic",
            "returns",
        ])
        .unwrap();
        assert_eq!(options.ignore_committed_topic, ["orders-v1", "returns"]);
        assert_eq!(options.position.target(0), ResetTo::Latest);
    }

    #[test]
    fn a_wipe_keeps_the_instance_id_only() {
        let dir = std::env::temp_dir().join(format!("reset-wipe-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("task-0/db")).unwrap();
        std::fs::write(dir.join("task-0/db/CURRENT"), "x").unwrap();
        std::fs::write(dir.join(KEPT_STATE_FILE), "pod-0").unwrap();
        std::fs::write(dir.join("other"), "x").unwrap();
        wipe_state_dir(&dir).unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(left, [KEPT_STATE_FILE]);
        std::fs::remove_dir_all(&dir).unwrap();
        wipe_state_dir(&dir).expect("a missing directory is nothing to wipe");
    }
}
