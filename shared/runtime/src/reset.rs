//! `<service> reset [options] <service flags>`: makes an application
//! process its input again, like Kafka Streams'
//! `kafka-streams-application-reset` (plus the local state that tool leaves
//! to `KafkaStreams#cleanUp()`). With every instance stopped, it
//!
//! 1. refuses, changing nothing, while a consumer group of the application
//!    has members;
//! 2. commits new offsets for every group on the input topics it reads
//!    (`--to-earliest`, the default, `--to-latest`, `--to-datetime`,
//!    `--by-duration`, `--shift-by`), and offset 0 on the internal topics
//!    it reads, which are deleted next;
//! 3. deletes the internal topics: changelogs, repartition and stage-link
//!    topics (the service creates them again, empty, at start-up);
//! 4. with `--wipe-local-state`, deletes the application's local state
//!    under `--state-dir` on this host.
//!
//! The dead-letter topic and the output topics are kept: they are what the
//! application has told others, and a reset does not take that back.
//! `--dry-run` prints what a reset would do and changes nothing.

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::config::RuntimeArgs;
use crate::describe::{ServiceDescription, StageDescription};
use crate::duration::HumanDuration;
use crate::restore::ChangelogReach;
use crate::topics::Admin;

/// How long a group request (describe, committed offsets, offsets for a
/// time, commit) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What an instance keeps in its state directory besides task state: its
/// instance id, the stable part of its transactional id. A wipe keeps it,
/// so that the restarted instance still fences its predecessor.
const KEPT_STATE_FILE: &str = "instance.id";

/// The options of `reset`, before the service's flags.
#[derive(Debug, Clone, Args)]
pub struct ResetArgs {
    #[command(flatten)]
    pub position: PositionArgs,

    /// Also delete this host's local state of the application: the stages'
    /// directories under `--state-dir` (their `instance.id` is kept). Run
    /// on the host (or volume) of every instance.
    #[arg(long)]
    pub wipe_local_state: bool,

    /// Print what the reset would do, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Where the input offsets go; one at most (default `--to-earliest`).
#[derive(Debug, Clone, Args)]
#[group(multiple = false)]
pub struct PositionArgs {
    /// To the first record of each input partition (the default).
    #[arg(long)]
    pub to_earliest: bool,

    /// To the end of each input partition: skip everything written so far.
    #[arg(long)]
    pub to_latest: bool,

    /// To the first record written at or after this time (by record
    /// timestamp), e.g. `2026-12-01T00:00:00Z`; UTC unless an offset such as
    /// `+01:00` is given. Partitions with no such record go to their end.
    #[arg(long, value_name = "DATETIME", value_parser = parse_datetime)]
    pub to_datetime: Option<i64>,

    /// To the first record written at most this long ago: `PT1H`, `P1DT12H`
    /// (ISO 8601) or `1h`, `90m`, `7d`.
    #[arg(long, value_name = "DURATION", value_parser = parse_lookback)]
    pub by_duration: Option<HumanDuration>,

    /// From each committed offset (or the partition's start, where none is
    /// committed) by this many records, forward or (negative) back,
    /// within the partition's records.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub shift_by: Option<i64>,
}

/// Where a group's offsets on an input topic go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTo {
    Earliest,
    Latest,
    /// The first record with a timestamp at or after this (ms since the epoch).
    Time(i64),
    /// The committed offset moved by this many records.
    Shift(i64),
}

impl PositionArgs {
    /// The target, with `--by-duration` taken back from `now` (ms since the epoch).
    pub fn target(&self, now: i64) -> ResetTo {
        if self.to_latest {
            ResetTo::Latest
        } else if let Some(time) = self.to_datetime {
            ResetTo::Time(time)
        } else if let Some(lookback) = self.by_duration {
            ResetTo::Time(now.saturating_sub(lookback.as_millis_i64()))
        } else if let Some(records) = self.shift_by {
            ResetTo::Shift(records)
        } else {
            ResetTo::Earliest
        }
    }
}

impl std::fmt::Display for ResetTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResetTo::Earliest => write!(f, "to the earliest"),
            ResetTo::Latest => write!(f, "to the latest"),
            ResetTo::Time(time) => write!(f, "to the first record at or after {}", iso_utc(*time)),
            ResetTo::Shift(records) => write!(f, "shifted by {records:+}"),
        }
    }
}

/// What is known of one partition of a topic a group reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    /// The partition's first offset and its end.
    pub low: i64,
    pub high: i64,
    pub committed: Option<i64>,
    /// For [`ResetTo::Time`]: the first offset at or after the time, if any.
    pub at_time: Option<i64>,
}

/// The offset `to` gives a partition: always within its records, from its
/// first offset to its end.
pub fn new_offset(to: ResetTo, offsets: PartitionOffsets) -> i64 {
    let PartitionOffsets {
        low,
        high,
        committed,
        at_time,
    } = offsets;
    let target = match to {
        ResetTo::Earliest => low,
        ResetTo::Latest => high,
        ResetTo::Time(_) => at_time.unwrap_or(high),
        // Where the application would start without a committed offset
        // (auto.offset.reset is earliest).
        ResetTo::Shift(records) => committed.unwrap_or(low).saturating_add(records),
    };
    target.min(high).max(low)
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
    /// The stages' state directories on this host.
    pub state_dirs: Vec<PathBuf>,
    pub wipe_local_state: bool,
}

/// One part of a [`ResetPlan`], printed before (`--dry-run`) or once done.
enum Step<'a> {
    Group(&'a GroupReset),
    DeleteTopics,
    Kept,
    LocalState,
}

impl ResetPlan {
    /// The text of `step`: what will be done, or with `done` what was.
    fn render(&self, step: &Step<'_>, done: bool) -> String {
        let mut out = String::new();
        match step {
            Step::Group(group) => {
                let verb = if done { "committed" } else { "to commit" };
                let _ = write!(out, "Consumer group {}: offsets {verb}", group.group);
                if group.reads_inputs {
                    let _ = write!(out, ", inputs {}", self.to);
                }
                out.push('\n');
                for offset in &group.moves {
                    let current = offset
                        .current
                        .map_or("none".to_string(), |current| current.to_string());
                    let _ = write!(
                        out,
                        "  {} partition {}: {current} -> {}",
                        offset.topic, offset.partition, offset.new
                    );
                    if offset.internal {
                        out.push_str(" (internal topic, recreated empty)");
                    }
                    out.push('\n');
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
            Step::Kept => {
                let _ = write!(out, "Kept: dead-letter topic {}", self.dead_letter_topic);
                for topic in &self.output_topics {
                    let _ = write!(out, ", output topic {topic}");
                }
                out.push('\n');
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

    fn steps(&self) -> impl Iterator<Item = Step<'_>> {
        self.groups.iter().map(Step::Group).chain([
            Step::DeleteTopics,
            Step::Kept,
            Step::LocalState,
        ])
    }

    /// The whole plan as `--dry-run` prints it.
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

/// Runs `reset` for the service `description` describes, writing what it
/// does (or with `--dry-run` would do) to `out`.
pub fn reset(
    description: &ServiceDescription,
    args: &RuntimeArgs,
    options: &ResetArgs,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // librdkafka logs errors only: what matters comes back as one.
    let client = args.client.settings(&[("log_level", "3")])?;
    let admin = Admin::connect(
        &client.kafka,
        runtime.handle().clone(),
        Duration::from_secs(10),
    )?;
    let groups: Vec<GroupClient> = description
        .stages
        .iter()
        .map(|stage| GroupClient::new(&client.kafka, stage))
        .collect::<anyhow::Result<_>>()?;
    refuse_live_groups(&admin, &groups)?;

    let to = options.position.target(now_millis());
    let group_resets = groups
        .iter()
        .map(|group| group.plan(&admin, to))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut delete_topics = Vec::new();
    for topic in deletable_topics(description) {
        if admin.partition_count(&topic)?.is_some() {
            delete_topics.push(topic);
        }
    }
    let plan = ResetPlan {
        application_id: description.application_id.clone(),
        to,
        groups: group_resets,
        delete_topics,
        dead_letter_topic: description.dead_letter_topic.clone(),
        output_topics: description.output_topics(),
        state_dirs: description
            .stages
            .iter()
            .map(|stage| args.state_dir.join(&stage.group_id))
            .collect(),
        wipe_local_state: options.wipe_local_state,
    };
    if options.dry_run {
        out.write_all(plan.to_text().as_bytes())?;
        return Ok(());
    }

    writeln!(out, "Reset of application {}:", plan.application_id)?;
    for (group, reset) in groups.iter().zip(&plan.groups) {
        group.commit(reset)?;
        out.write_all(plan.render(&Step::Group(reset), true).as_bytes())?;
    }
    let names: Vec<&str> = plan.delete_topics.iter().map(String::as_str).collect();
    admin.delete_topics(&names)?;
    out.write_all(plan.render(&Step::DeleteTopics, true).as_bytes())?;
    out.write_all(plan.render(&Step::Kept, true).as_bytes())?;
    if plan.wipe_local_state {
        for dir in &plan.state_dirs {
            wipe_state_dir(dir)?;
        }
    }
    out.write_all(plan.render(&Step::LocalState, true).as_bytes())?;
    Ok(())
}

/// The internal topics a reset deletes: all but the dead letters.
fn deletable_topics(description: &ServiceDescription) -> Vec<String> {
    description
        .internal_topics()
        .into_iter()
        .filter(|topic| *topic != description.dead_letter_topic)
        .collect()
}

/// Fails, naming each group with members and the members, if any group of
/// the application has members: the instances must be stopped first.
fn refuse_live_groups(admin: &Admin, groups: &[GroupClient]) -> anyhow::Result<()> {
    let names: Vec<&str> = groups.iter().map(|group| group.group.as_str()).collect();
    let members = admin.group_members(&names)?;
    let live: Vec<String> = names
        .iter()
        .filter_map(|group| {
            let members = members.get(*group).filter(|members| !members.is_empty())?;
            let members: Vec<String> = members
                .iter()
                .map(|member| {
                    let host = member.host.trim_start_matches('/');
                    format!("{} on {host}", member.client_id)
                })
                .collect();
            Some(format!("{group} ({})", members.join(", ")))
        })
        .collect();
    anyhow::ensure!(
        live.is_empty(),
        "consumer group(s) of the application have live members: {}; stop every instance \
         of the application first (an instance stopped with --instance-id stays a member until \
         its session times out); nothing was changed",
        live.join("; ")
    );
    Ok(())
}

/// A stage's consumer group, seen from outside: a consumer with its group
/// id that never joins it, which reads and commits the group's offsets
/// (the broker accepts such a commit only while the group has no members).
struct GroupClient {
    group: String,
    consumer: BaseConsumer,
    /// The input topics the stage reads, and the internal ones.
    inputs: Vec<String>,
    internal: Vec<String>,
    stores: usize,
}

impl GroupClient {
    fn new(base: &ClientConfig, stage: &StageDescription) -> anyhow::Result<Self> {
        let mut config = base.clone();
        config
            .set("group.id", &stage.group_id)
            .set("enable.auto.commit", "false");
        let consumer = config
            .create()
            .map_err(|e| anyhow::anyhow!("cannot create a consumer for the group: {e}"))?;
        let mut inputs = Vec::new();
        let mut internal = Vec::new();
        for source in &stage.sources {
            if source.internal {
                internal.push(source.topic.clone());
            } else {
                inputs.push(source.topic.clone());
            }
            internal.extend(source.repartition_topic.clone());
        }
        Ok(GroupClient {
            group: stage.group_id.clone(),
            consumer,
            inputs,
            internal,
            stores: stage.stores.len(),
        })
    }

    /// The group's offsets as `to` moves them: every partition of its input
    /// topics, and its committed offsets on internal topics that exist.
    fn plan(&self, admin: &Admin, to: ResetTo) -> anyhow::Result<GroupReset> {
        let mut moves = Vec::new();
        for topic in &self.inputs {
            let partitions = admin.describe(topic)?;
            let ids: Vec<i32> = partitions.iter().map(|partition| partition.id).collect();
            let committed = self.committed(topic, &ids)?;
            let at_time = match to {
                ResetTo::Time(time) => self.offsets_for_time(topic, &ids, time)?,
                _ => vec![None; ids.len()],
            };
            for ((partition, committed), at_time) in partitions.iter().zip(committed).zip(at_time) {
                let offsets = PartitionOffsets {
                    low: partition.low,
                    high: partition.high,
                    committed,
                    at_time,
                };
                moves.push(OffsetMove {
                    topic: topic.clone(),
                    partition: partition.id,
                    current: committed,
                    new: new_offset(to, offsets),
                    internal: false,
                });
            }
        }
        for topic in &self.internal {
            let Some(count) = admin.partition_count(topic)? else {
                continue;
            };
            let ids: Vec<i32> = (0..count as i32).collect();
            for (partition, committed) in ids.iter().zip(self.committed(topic, &ids)?) {
                if committed.is_some() {
                    moves.push(OffsetMove {
                        topic: topic.clone(),
                        partition: *partition,
                        current: committed,
                        new: 0,
                        internal: true,
                    });
                }
            }
        }
        Ok(GroupReset {
            group: self.group.clone(),
            reads_inputs: !self.inputs.is_empty(),
            moves,
            metadata: ChangelogReach::nothing(self.stores).to_metadata(),
        })
    }

    /// The group's committed offset of each of `partitions` of `topic`.
    fn committed(&self, topic: &str, partitions: &[i32]) -> anyhow::Result<Vec<Option<i64>>> {
        let request = partition_list(topic, partitions, Offset::Invalid)?;
        let committed = self
            .consumer
            .committed_offsets(request, REQUEST_TIMEOUT)
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot read the committed offsets of group {} on {topic}: {e}",
                    self.group
                )
            })?;
        Ok(offsets_of(&committed, topic, partitions))
    }

    /// The first offset at or after `time` of each of `partitions` of
    /// `topic`; `None` where no record is that late.
    fn offsets_for_time(
        &self,
        topic: &str,
        partitions: &[i32],
        time: i64,
    ) -> anyhow::Result<Vec<Option<i64>>> {
        let request = partition_list(topic, partitions, Offset::Offset(time))?;
        let found = self
            .consumer
            .offsets_for_times(request, REQUEST_TIMEOUT)
            .map_err(|e| anyhow::anyhow!("cannot look up offsets by time on {topic}: {e}"))?;
        Ok(offsets_of(&found, topic, partitions))
    }

    /// Commits `reset`'s offsets, without joining the group.
    fn commit(&self, reset: &GroupReset) -> anyhow::Result<()> {
        if reset.moves.is_empty() {
            return Ok(());
        }
        let mut offsets = TopicPartitionList::new();
        for offset in &reset.moves {
            let mut element = offsets.add_partition(&offset.topic, offset.partition);
            element.set_offset(Offset::Offset(offset.new))?;
            element.set_metadata(reset.metadata.clone());
        }
        self.consumer
            .commit(&offsets, CommitMode::Sync)
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot commit the offsets of consumer group {}: {e} (has an instance \
                     started meanwhile?)",
                    self.group
                )
            })
    }
}

/// `partitions` of `topic`, each at `offset`.
fn partition_list(
    topic: &str,
    partitions: &[i32],
    offset: Offset,
) -> anyhow::Result<TopicPartitionList> {
    let mut list = TopicPartitionList::new();
    for partition in partitions {
        list.add_partition_offset(topic, *partition, offset)?;
    }
    Ok(list)
}

/// The offset `list` holds for each of `partitions` of `topic`, if any.
fn offsets_of(list: &TopicPartitionList, topic: &str, partitions: &[i32]) -> Vec<Option<i64>> {
    partitions
        .iter()
        .map(
            |partition| match list.find_partition(topic, *partition)?.offset() {
                Offset::Offset(offset) => Some(offset),
                _ => None,
            },
        )
        .collect()
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

/// Milliseconds since the epoch from `YYYY-MM-DDTHH:MM:SS[.fff]` with an
/// optional `Z` or `±HH:MM` (UTC without one).
fn parse_datetime(text: &str) -> Result<i64, String> {
    let invalid = || {
        format!(
            "invalid date and time '{text}': expected YYYY-MM-DDTHH:MM:SS, optionally with \
             .fff and Z or an offset such as +01:00 (UTC without one)"
        )
    };
    let (date, rest) = text.split_once(['T', ' ']).ok_or_else(invalid)?;
    let (time, zone_offset_minutes) = match rest.find(['Z', 'z', '+', '-']) {
        None => (rest, 0),
        Some(at) => (&rest[..at], parse_zone(&rest[at..]).ok_or_else(invalid)?),
    };
    let numbers = |part: &str, separator: char| -> Option<Vec<i64>> {
        part.split(separator).map(|n| n.parse().ok()).collect()
    };
    let [year, month, day] = numbers(date, '-').ok_or_else(invalid)?[..] else {
        return Err(invalid());
    };
    let (time, fraction) = time.split_once('.').unwrap_or((time, ""));
    let [hour, minute, second] = numbers(time, ':').ok_or_else(invalid)?[..] else {
        return Err(invalid());
    };
    let in_range = (1..=12).contains(&month)
        && (1..=days_in_month(year, month)).contains(&day)
        && (0..24).contains(&hour)
        && (0..60).contains(&minute)
        && (0..60).contains(&second)
        && fraction.chars().all(|c| c.is_ascii_digit());
    if !in_range {
        return Err(invalid());
    }
    let millis: i64 = format!("{fraction:0<3}")[..3].parse().unwrap_or(0);
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second
        - zone_offset_minutes * 60;
    Ok(seconds * 1_000 + millis)
}

/// `Z`, or `±HH:MM` / `±HHMM` / `±HH`, in minutes east of UTC.
fn parse_zone(zone: &str) -> Option<i64> {
    if zone.eq_ignore_ascii_case("z") {
        return Some(0);
    }
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    let digits: String = zone[1..].chars().filter(|c| *c != ':').collect();
    if digits.len() != 2 && digits.len() != 4 || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let hours: i64 = digits[..2].parse().ok()?;
    let minutes: i64 = digits
        .get(2..)
        .filter(|m| !m.is_empty())
        .map_or(Some(0), |m| m.parse().ok())?;
    (hours < 24 && minutes < 60).then_some(sign * (hours * 60 + minutes))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// `YYYY-MM-DDTHH:MM:SS.fffZ` of milliseconds since the epoch (Howard
/// Hinnant's `civil_from_days`).
fn iso_utc(millis: i64) -> String {
    let days = millis.div_euclid(86_400_000);
    let in_day = millis.rem_euclid(86_400_000);
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000
    )
}

/// A duration back from now: ISO 8601 (`PT1H`, `P2DT3H4M5.5S`, as
/// Kafka's reset tool takes) or the runtime's own (`1h`, `90m`).
fn parse_lookback(text: &str) -> Result<HumanDuration, String> {
    match text.strip_prefix(['P', 'p']) {
        Some(iso) => parse_iso_duration(iso).ok_or_else(|| {
            format!(
                "invalid duration '{text}': expected ISO 8601 PnDTnHnMn.nS (e.g. PT1H) or a \
                 whole number followed by ms, s, m, h or d (e.g. 1h)"
            )
        }),
        None => text.parse(),
    }
}

/// The part of an ISO 8601 duration after `P`: `nD`, then `T` with `nH`,
/// `nM`, `n.nS`, each at most once and in that order.
fn parse_iso_duration(text: &str) -> Option<HumanDuration> {
    let (days, time) = match text.split_once(['T', 't']) {
        Some((days, time)) if !time.is_empty() => (days, Some(time)),
        Some(_) => return None,
        None => (text, None),
    };
    let mut millis: u64 = 0;
    let mut add = |part: &str, units: &[(char, u64)]| -> Option<()> {
        let mut rest = part;
        let mut allowed = units;
        while !rest.is_empty() {
            let end = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
            let (number, tail) = rest.split_at(end);
            let unit = tail.chars().next()?.to_ascii_uppercase();
            let position = allowed.iter().position(|(name, _)| *name == unit)?;
            let size = allowed[position].1;
            allowed = &allowed[position + 1..];
            let amount = match number.split_once('.') {
                Some((whole, fraction)) if unit == 'S' && !fraction.is_empty() => {
                    let fraction = format!("{fraction:0<3}");
                    whole.parse::<u64>().ok()?.checked_mul(1_000)?
                        + fraction.get(..3)?.parse::<u64>().ok()?
                }
                Some(_) => return None,
                None => number.parse::<u64>().ok()?.checked_mul(size)?,
            };
            millis = millis.checked_add(amount)?;
            rest = &tail[1..];
        }
        Some(())
    };
    if days.is_empty() && time.is_none() {
        return None;
    }
    add(days, &[('D', 86_400_000)])?;
    if let Some(time) = time {
        add(time, &[('H', 3_600_000), ('M', 60_000), ('S', 1_000)])?;
    }
    Some(HumanDuration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        reset: ResetArgs,
    }

    fn parse(flags: &[&str]) -> Result<ResetArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("reset").chain(flags.iter().copied()))
            .map(|cli| cli.reset)
    }

    const NOW: i64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

    #[test]
    fn one_position_at_most_and_the_earliest_by_default() {
        let target = |flags: &[&str]| parse(flags).unwrap().position.target(NOW);
        assert_eq!(target(&[]), ResetTo::Earliest);
        assert_eq!(target(&["--to-earliest"]), ResetTo::Earliest);
        assert_eq!(target(&["--to-latest"]), ResetTo::Latest);
        assert_eq!(
            target(&["--to-datetime", "2026-12-01T00:00:00Z"]),
            ResetTo::Time(NOW)
        );
        assert_eq!(
            target(&["--by-duration", "PT1H"]),
            ResetTo::Time(NOW - 3_600_000)
        );
        assert_eq!(
            target(&["--by-duration", "90m"]),
            ResetTo::Time(NOW - 5_400_000)
        );
        assert_eq!(target(&["--shift-by", "-2"]), ResetTo::Shift(-2));
        assert_eq!(target(&["--shift-by", "5"]), ResetTo::Shift(5));
        let both = parse(&["--to-latest", "--shift-by", "1"]).unwrap_err();
        assert!(both.to_string().contains("cannot be used with"), "{both}");
        let options = parse(&["--dry-run", "--wipe-local-state"]).unwrap();
        assert!(options.dry_run && options.wipe_local_state);
    }

    #[test]
    fn date_times_are_utc_unless_they_carry_an_offset() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_datetime("2026-12-01T00:00:00"), Ok(NOW));
        assert_eq!(parse_datetime("2026-12-01T00:00:00.5Z"), Ok(NOW + 500));
        assert_eq!(parse_datetime("2026-12-01T00:00:00.123456Z"), Ok(NOW + 123));
        assert_eq!(
            parse_datetime("2026-12-01T01:30:00+01:30"),
            Ok(NOW),
            "an hour and a half east of UTC"
        );
        assert_eq!(parse_datetime("2026-11-30T19:00:00-0500"), Ok(NOW));
        assert_eq!(
            parse_datetime("2024-02-29T12:00:00Z"),
            Ok(1_709_208_000_000)
        );
        for bad in [
            "2026-12-01",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T00:00Z",
            "2026-12-01T00:00:00+25:00",
            "yesterday",
        ] {
            assert!(parse_datetime(bad).is_err(), "{bad} is refused");
        }
        assert_eq!(iso_utc(NOW + 1_234), "2026-12-01T00:00:01.234Z");
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn durations_are_iso_8601_or_the_runtimes_own() {
        let millis = |text: &str| parse_lookback(text).map(|d| d.as_millis_i64());
        assert_eq!(millis("PT1H"), Ok(3_600_000));
        assert_eq!(millis("P1D"), Ok(86_400_000));
        assert_eq!(millis("P1DT2H3M4.5S"), Ok(93_784_500));
        assert_eq!(millis("pt30m"), Ok(1_800_000));
        assert_eq!(millis("1h"), Ok(3_600_000));
        assert_eq!(millis("7d"), Ok(604_800_000));
        for bad in [
            "P", "PT", "PT1M1H", "P1H", "PT1.5M", "PT-1H", "P1W", "1 hour",
        ] {
            assert!(parse_lookback(bad).is_err(), "{bad} is refused");
        }
    }

    fn offsets(
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
        }
    }

    #[test]
    fn new_offsets_stay_within_the_partitions_records() {
        let partition = offsets(10, 100, Some(50), Some(70));
        assert_eq!(new_offset(ResetTo::Earliest, partition), 10);
        assert_eq!(new_offset(ResetTo::Latest, partition), 100);
        assert_eq!(new_offset(ResetTo::Time(0), partition), 70);
        assert_eq!(
            new_offset(ResetTo::Time(0), offsets(10, 100, Some(50), None)),
            100,
            "no record that late: the end"
        );
        assert_eq!(new_offset(ResetTo::Shift(-20), partition), 30);
        assert_eq!(new_offset(ResetTo::Shift(20), partition), 70);
        assert_eq!(new_offset(ResetTo::Shift(-100), partition), 10, "clamped");
        assert_eq!(new_offset(ResetTo::Shift(100), partition), 100, "clamped");
        assert_eq!(
            new_offset(ResetTo::Shift(5), offsets(10, 100, None, None)),
            15,
            "nothing committed: from the start"
        );
        assert_eq!(
            new_offset(ResetTo::Shift(-5), offsets(10, 100, Some(3), None)),
            10,
            "a committed offset below the start (retention)"
        );
        assert_eq!(new_offset(ResetTo::Shift(i64::MAX), partition), 100);
        assert_eq!(new_offset(ResetTo::Earliest, offsets(0, 0, None, None)), 0);
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
            state_dirs: vec!["/state/shop".into(), "/state/shop-final".into()],
            wipe_local_state,
        }
    }

    #[test]
    fn a_dry_run_lists_every_offset_topic_and_directory() {
        let text = plan(true).to_text();
        assert_eq!(
            text,
            "Dry run: reset of application shop; nothing is changed.\n\
             Consumer group shop: offsets to commit, inputs shifted by -2\n\
             \x20 orders partition 0: 10 -> 8\n\
             Consumer group shop-final: offsets to commit\n\
             \x20 shop-partials-repartition partition 0: none -> 0 (internal topic, recreated empty)\n\
             To delete: internal topics (the service creates them again at start-up):\n\
             \x20 shop-partials-repartition\n\
             Kept: dead-letter topic shop-dlq, output topic counts\n\
             To wipe: local state (instance.id kept):\n\
             \x20 /state/shop\n\
             \x20 /state/shop-final\n"
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
