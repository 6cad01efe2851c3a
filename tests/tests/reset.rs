//! `<service> reset` on the real stack: it refuses while the application
//! runs, a dry run changes nothing, and after a reset the application
//! processes its input again from where the reset put it, giving exactly
//! the output those records give; local state left behind by a reset is
//! found stale and rebuilt.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::driver::{driver, lines, pipe_all, settings, settle};
use e2e_tests::fixture_runs::{self, tool_json, Recording};
use e2e_tests::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;

/// `service reset <options> <arguments> --state-dir <state_dir>`.
fn reset(service: &str, options: &[&str], arguments: &[String], state_dir: &Path) -> Output {
    Command::new(bin(service))
        .arg("reset")
        .args(options)
        .args(arguments)
        .arg("--state-dir")
        .arg(state_dir)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .env("SCHEMA_REGISTRY_URL", registry())
        .output()
        .expect("run the service binary")
}

/// [`reset`], which must succeed; its output.
fn reset_ok(service: &str, options: &[&str], arguments: &[String], state_dir: &Path) -> String {
    let output = reset(service, options, arguments, state_dir);
    assert!(
        output.status.success(),
        "{service} reset {options:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// A consumer that reads `group`'s offsets without joining it.
fn outside(group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .create()
        .expect("consumer")
}

fn partitions(consumer: &BaseConsumer, topic: &str) -> Vec<i32> {
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    metadata.topics()[0]
        .partitions()
        .iter()
        .map(|partition| partition.id())
        .collect()
}

fn offsets(list: &TopicPartitionList) -> Vec<Option<i64>> {
    list.elements()
        .iter()
        .map(|element| match element.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        })
        .collect()
}

/// `group`'s committed offset of each partition of `topic`.
fn committed(group: &str, topic: &str) -> Vec<Option<i64>> {
    let consumer = outside(group);
    let mut request = TopicPartitionList::new();
    for partition in partitions(&consumer, topic) {
        request.add_partition(topic, partition);
    }
    offsets(
        &consumer
            .committed_offsets(request, Duration::from_secs(10))
            .unwrap(),
    )
}

/// The committed offsets of every group of the application `description`
/// describes, on every topic its stages read.
fn committed_offsets(description: &Value) -> BTreeMap<(String, String), Vec<Option<i64>>> {
    let mut all = BTreeMap::new();
    for stage in description["stages"].as_array().unwrap() {
        let group = stage["group_id"].as_str().unwrap();
        for source in stage["sources"].as_array().unwrap() {
            for topic in [&source["topic"], &source["repartition_topic"]] {
                if let Some(topic) = topic.as_str() {
                    all.insert(
                        (group.to_string(), topic.to_string()),
                        committed(group, topic),
                    );
                }
            }
        }
    }
    all
}

/// The internal topics of `description` that exist now.
fn existing_internal_topics(description: &Value) -> Vec<String> {
    let application_id = description["application_id"].as_str().unwrap();
    streamctl_ok(&["topics", "list"])
        .lines()
        .filter(|topic| topic.starts_with(&format!("{application_id}-")))
        .map(str::to_string)
        .collect()
}

/// The entries of a stage's state directory.
fn state_entries(dir: &Path) -> Vec<String> {
    let mut entries: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    entries
}

/// Runs `fixture`, then, while its service runs, a reset that must be
/// refused; once it is stopped a dry run that changes nothing, then a
/// reset with `--wipe-local-state`; the service started again writes its
/// output a second time, the same (in the same order when `ordered`).
fn a_reset_replays_the_fixture(fixture: fn(&Recording) -> Service, ordered: bool) {
    let recording = Recording::default();
    let service = fixture(&recording);
    let (binary, arguments) = recording.last();
    let description = tool_json(binary, "describe", &arguments);
    let application_id = description["application_id"].as_str().unwrap();
    let output_topic = flag(&arguments, "--output-topic");
    let first = consume_all(output_topic);
    let state_dir = service.state_dir.clone();

    let refused = reset(binary, &[], &arguments, &state_dir);
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{error}");
    assert!(
        error.starts_with("error: consumer group(s) of the application have live members: ")
            && error.contains(&format!("{application_id} (")),
        "{error}"
    );
    assert_eq!(error.lines().count(), 1, "{error}");

    assert!(service.stop().success());
    let offsets_before = committed_offsets(&description);
    let topics_before = existing_internal_topics(&description);
    let stage_dirs: Vec<_> = description["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|stage| state_dir.join(stage["group_id"].as_str().unwrap()))
        .collect();
    let state_before: Vec<_> = stage_dirs.iter().map(|dir| state_entries(dir)).collect();
    assert!(
        state_before.iter().all(|entries| entries.len() > 1),
        "{state_before:?}"
    );

    let plan = reset_ok(
        binary,
        &["--dry-run", "--wipe-local-state"],
        &arguments,
        &state_dir,
    );
    let input = description["stages"][0]["sources"][0]["topic"]
        .as_str()
        .unwrap();
    let input_records = consume_all(input).len();
    assert!(
        plan.contains(&format!(
            "Consumer group {application_id}: offsets to commit"
        )) && plan.contains(&format!("  {input} partition 0: {input_records} -> 0\n")),
        "{plan}"
    );
    let dead_letters = format!("{application_id}-dlq");
    for topic in &topics_before {
        let listed = plan.contains(&format!("\n  {topic}\n"));
        assert_eq!(listed, *topic != dead_letters, "{topic} in\n{plan}");
    }
    assert!(
        plan.contains(&format!(
            "Kept: dead-letter topic {dead_letters}, output topic {output_topic}\n"
        )),
        "{plan}"
    );
    let wiped = format!(
        "To wipe: local state (instance.id kept):\n  {}\n",
        stage_dirs[0].display()
    );
    assert!(plan.contains(&wiped), "{plan}");
    assert_eq!(committed_offsets(&description), offsets_before);
    assert_eq!(existing_internal_topics(&description), topics_before);
    let state_after: Vec<_> = stage_dirs.iter().map(|dir| state_entries(dir)).collect();
    assert_eq!(state_after, state_before, "a dry run wipes nothing");

    let done = reset_ok(binary, &["--wipe-local-state"], &arguments, &state_dir);
    assert!(done.contains("Deleted: internal topics"), "{done}");
    assert_eq!(committed(application_id, input), [Some(0)], "{done}");
    assert_eq!(existing_internal_topics(&description), [dead_letters]);
    for dir in &stage_dirs {
        assert_eq!(state_entries(dir), ["instance.id"], "{done}");
    }

    let again = Service::start_with_state(binary, &arguments, state_dir);
    let records = wait_for_records(output_topic, 2 * first.len(), Duration::from_secs(90));
    let (before, after) = records.split_at(first.len());
    assert_eq!(before, first);
    if ordered {
        assert_eq!(after, first, "log:\n{}", again.log());
    } else {
        assert_eq!(
            sorted(after.to_vec()),
            sorted(first.clone()),
            "log:\n{}",
            again.log()
        );
    }
}

/// Two stages, a consumer group each, and a stage-link topic between them.
#[test]
fn window_aggregator_processes_its_input_again_after_a_reset() {
    a_reset_replays_the_fixture(fixture_runs::window_aggregator_on, true);
}

/// A join with a repartition topic.
#[test]
fn order_shipment_joiner_processes_its_input_again_after_a_reset() {
    a_reset_replays_the_fixture(fixture_runs::order_shipment_joiner_on, false);
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `YYYY-MM-DDTHH:MM:SS.fffZ` of milliseconds since the epoch, as
/// `date -u` writes it.
fn iso(millis: i64) -> String {
    let output = Command::new("date")
        .args(["-u", "-d", &format!("@{}", millis / 1_000)])
        .arg("+%Y-%m-%dT%H:%M:%S")
        .output()
        .unwrap();
    let seconds = String::from_utf8(output.stdout).unwrap();
    format!("{}.{:03}Z", seconds.trim(), millis % 1_000)
}

/// The sessionizer's events written in two parts, a moment apart; a reset
/// to a time between them, leaving the local state in place (without the
/// record of the changelogs' topic ids, with `forget_changelog_ids`: as
/// written before there was one). The service started again on it finds
/// its state stale, rebuilds it, and gives exactly the sessions the second part gives on
/// its own (an uninterrupted run of the pipeline on the test driver): had
/// it kept its state, its stored watermark would make every replayed event
/// late, and had the reset gone to the start, bob's session would hold all
/// three of his events again. `rebuilt` is what the log says then.
fn a_reset_to_a_time_replays_from_there(
    guarantee: &str,
    forget_changelog_ids: bool,
    rebuilt: &str,
) {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 1);
    let events = fixture("sessionizer/user-events.jsonl");
    produce(&run.input, "user-events", &events[..2]);
    std::thread::sleep(Duration::from_millis(50));
    let middle = now_millis();
    std::thread::sleep(Duration::from_millis(50));
    produce(&run.input, "user-events", &events[2..]);

    let arguments = run.args(&["--processing-guarantee", guarantee]);
    let service = Service::start(run.binary, &arguments);
    let expected = fixture("sessionizer/user-sessions.expected.jsonl");
    let first = wait_for_records(&run.output, expected.len(), Duration::from_secs(60));
    assert_eq!(first, expected, "log:\n{}", service.log());
    let state_dir = service.state_dir.clone();
    assert!(service.stop().success());
    // Each part was written in a transaction, its commit marker after it.
    let [Some(end)] = committed(&run.application_id, &run.input)[..] else {
        panic!("nothing committed");
    };
    let consumer = outside(&run.application_id);
    let mut at_middle = TopicPartitionList::new();
    at_middle
        .add_partition_offset(&run.input, 0, Offset::Offset(middle))
        .unwrap();
    let by_time = consumer
        .offsets_for_times(at_middle, Duration::from_secs(10))
        .unwrap();
    let [Some(second_part)] = offsets(&by_time)[..] else {
        panic!("no record after the middle");
    };
    assert!(0 < second_part && second_part < end);

    let shifted = reset_ok(
        "sessionizer",
        &["--shift-by", "-3", "--dry-run"],
        &arguments,
        &state_dir,
    );
    let shift = format!("  {} partition 0: {end} -> {}\n", run.input, end - 3);
    assert!(shifted.contains(&shift), "{shifted}");
    let done = reset_ok(
        "sessionizer",
        &["--to-datetime", &iso(middle)],
        &arguments,
        &state_dir,
    );
    let moved = format!("  {} partition 0: {end} -> {second_part}\n", run.input);
    assert!(
        done.contains(&moved) && done.contains("Not wiped: local state;"),
        "{done}"
    );
    assert_eq!(
        committed(&run.application_id, &run.input),
        [Some(second_part)]
    );

    let mut uninterrupted = driver(sessionizer::pipeline(settings("sessionizer", &[])), 1);
    pipe_all(&mut uninterrupted, "user-events", &events[2..]);
    settle(&mut uninterrupted);
    let from_the_middle = lines(&uninterrupted, "user-sessions");
    assert_eq!(from_the_middle.len(), 1, "bob's session of one event");

    let task_dir = state_dir.join(&run.application_id).join("task-0");
    if forget_changelog_ids {
        std::fs::remove_file(task_dir.join("CHANGELOG_IDS")).unwrap();
    }
    let again = Service::start_with_state(run.binary, &arguments, state_dir);
    let records = wait_for_records(
        &run.output,
        first.len() + from_the_middle.len(),
        Duration::from_secs(60),
    );
    assert_eq!(
        records[first.len()..],
        from_the_middle,
        "log:\n{}",
        again.log()
    );
    assert!(again.log().contains(rebuilt), "log:\n{}", again.log());
}

/// A task whose local state came from a changelog since deleted, as its
/// directory's record of topic ids says, is wiped, with a warning, and
/// restored from the changelogs.
#[test]
fn exactly_once_replays_from_a_time_and_wipes_stale_local_state() {
    a_reset_to_a_time_replays_from_there(
        "exactly_once_v2",
        false,
        "as it was before it was deleted and created again (by an application reset?); \
         wiping it and restoring the task",
    );
}

/// Without that record, local state whose checkpoints lie past the end of
/// the recreated changelogs is told by them.
#[test]
fn state_past_the_end_of_a_recreated_changelog_is_wiped() {
    a_reset_to_a_time_replays_from_there(
        "exactly_once_v2",
        true,
        "which ends at 0 (deleted and created again, by an application reset?); \
         wiping it and restoring the task",
    );
}

/// The reset commits the offsets with no changelog reach (the changelogs
/// are gone): local state that reaches further is rebuilt.
#[test]
fn at_least_once_replays_from_a_time_and_rebuilds_stale_local_state() {
    a_reset_to_a_time_replays_from_there(
        "at_least_once",
        false,
        "local state reaches past the last commit; rebuilding it",
    );
}

/// With `--standby-replicas 1` an instance also keeps a copy of the other
/// instance's task: a reset to the latest offsets (nothing to replay, the
/// state wiped all the same: it belongs to the deleted changelogs) leaves
/// both copies stale. Started again, one instance first (it opens, and
/// wipes, both tasks), then the other: that one's standby copy of the task
/// it does not run is found stale and wiped too. New events then give
/// exactly their own sessions: had old state survived, the sessions still
/// open in it would end too.
#[test]
fn stale_standby_copies_are_wiped_too() {
    const BASE: i64 = 1_783_345_153_000;
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 2);
    let arguments = run.args(&["--standby-replicas", "1"]);
    let (events, expected) = e2e_tests::sessions::generate(20, 5, BASE);
    produce(&run.input, "user-events", &events);
    let started: Vec<Service> = (0..2)
        .map(|_| Service::start(run.binary, &arguments))
        .collect();
    let first = wait_for_records(&run.output, expected.len(), Duration::from_secs(90));
    assert_same_records(&first, &expected, "first run");
    for instance in &started {
        let warm = eventually(Duration::from_secs(60), || {
            instance.metric("streams_standby_tasks") == 1.0
                && instance.metric("streams_standby_lag_records") == 0.0
        });
        assert!(warm, "{}", instance.metrics());
    }
    let state_dirs: Vec<_> = started
        .into_iter()
        .map(|instance| {
            let dir = instance.state_dir.clone();
            assert!(instance.stop().success());
            dir
        })
        .collect();
    let done = reset_ok(run.binary, &["--to-latest"], &arguments, &state_dirs[0]);
    assert!(done.contains("inputs to the latest"), "{done}");

    let alone = Service::start_with_state(run.binary, &arguments, state_dirs[0].clone());
    alone.wait_ready(Duration::from_secs(60));
    let joining = Service::start_with_state(run.binary, &arguments, state_dirs[1].clone());
    joining.wait_for_log("standby started", Duration::from_secs(60));
    let standby_wiped = joining.log().lines().any(|line| {
        line.contains("streams_runtime::standby") && line.contains("; wiping it task=")
    });
    assert!(standby_wiped, "log:\n{}", joining.log());

    let (later, expected_later) = e2e_tests::sessions::generate(20, 5, BASE + 200_000_000);
    produce(&run.input, "user-events", &later);
    let all = [expected, expected_later].concat();
    let records = wait_for_records(&run.output, all.len(), Duration::from_secs(90));
    assert_same_records(&records, &all, &joining.log());
}

/// The sessions an uninterrupted run of the sessionizer's pipeline (the
/// test driver, one partition) gives for `events`.
fn sessions_of(events: &[Value]) -> Vec<Value> {
    let mut uninterrupted = driver(sessionizer::pipeline(settings("sessionizer", &[])), 1);
    pipe_all(&mut uninterrupted, "user-events", events);
    settle(&mut uninterrupted);
    lines(&uninterrupted, "user-sessions")
}

/// State left behind by a reset whose checkpoints lie within the
/// recreated changelog (another instance ran the task meanwhile, on fresh
/// state, and its changelog grew past them) is told by the changelog's
/// topic id, which the task directory records: wiped, and restored from
/// the changelog. The sessions come out as from an uninterrupted run.
#[test]
fn state_left_behind_is_told_by_the_changelogs_topic_id() {
    const BASE: i64 = 1_783_345_153_000;
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 1);
    let arguments = run.args(&[]);
    let batches: Vec<Vec<Value>> = (0..3)
        .map(|batch| e2e_tests::sessions::generate(20, 5, BASE + batch * 200_000_000).0)
        .collect();
    produce(&run.input, "user-events", &batches[0]);
    let first_run = Service::start(run.binary, &arguments);
    let first = sessions_of(&batches[0]);
    let records = wait_for_records(&run.output, first.len(), Duration::from_secs(60));
    assert_same_records(&records, &first, &first_run.log());
    let left_behind = first_run.state_dir.clone();
    assert!(first_run.stop().success());
    reset_ok(run.binary, &[], &arguments, &left_behind);

    let other = Service::start(run.binary, &arguments);
    produce(&run.input, "user-events", &batches[1]);
    let replayed = [first.clone(), sessions_of(&batches[..2].concat())].concat();
    let records = wait_for_records(&run.output, replayed.len(), Duration::from_secs(60));
    assert_same_records(&records, &replayed, &other.log());
    assert!(other.stop().success());

    let again = Service::start_with_state(run.binary, &arguments, left_behind);
    again.wait_for_log(
        "as it was before it was deleted and created again",
        Duration::from_secs(60),
    );
    produce(&run.input, "user-events", &batches[2]);
    let all = [first, sessions_of(&batches.concat())].concat();
    let records = wait_for_records(&run.output, all.len(), Duration::from_secs(60));
    assert_same_records(&records, &all, &again.log());
}

/// Flags are checked before anything is read: two positions, or a time
/// that is not one, end with one error line.
#[test]
fn reset_flags_are_checked_first() {
    let state_dir = fresh_state_dir();
    for (options, message) in [
        (
            &["--to-latest", "--shift-by", "2"][..],
            "cannot be used with",
        ),
        (
            &["--to-datetime", "yesterday"][..],
            "invalid date and time 'yesterday'",
        ),
        (
            &["--by-duration", "an hour"][..],
            "invalid duration 'an hour'",
        ),
    ] {
        let output = reset("sessionizer", options, &[], &state_dir);
        let error = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && error.contains(message),
            "{error}"
        );
    }
}

/// The end offset of each partition of `topic`, by partition.
fn ends(topic: &str) -> Vec<i64> {
    let consumer = outside(&unique("ends"));
    partitions(&consumer, topic)
        .into_iter()
        .map(|partition| {
            consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect()
}

/// The sessionizer run over the fixture's events and stopped: its
/// arguments, state directory, and the offset its group committed on the
/// input (its end).
fn a_stopped_sessionizer(run: &SingleInputRun) -> (Vec<String>, std::path::PathBuf, i64) {
    let events = fixture("sessionizer/user-events.jsonl");
    produce(&run.input, "user-events", &events);
    let arguments = run.args(&[]);
    let service = Service::start(run.binary, &arguments);
    let expected = fixture("sessionizer/user-sessions.expected.jsonl");
    let first = wait_for_records(&run.output, expected.len(), Duration::from_secs(60));
    assert_eq!(first, expected, "log:\n{}", service.log());
    let state_dir = service.state_dir.clone();
    assert!(service.stop().success());
    let [Some(end)] = committed(&run.application_id, &run.input)[..] else {
        panic!("nothing committed");
    };
    (arguments, state_dir, end)
}

/// The group committed offsets on the sessionizer's input; a reset given
/// another topic as the input (which exists, and has records) is refused,
/// dry run or not, and changes nothing: no offset on either topic, no
/// internal topic, no local state. `--ignore-committed-topic` lets it go
/// ahead, keeping the offsets on the topic it names; the flags the
/// application runs with need no such thing.
#[test]
fn a_reset_naming_other_inputs_than_the_group_committed_is_refused() {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 1);
    let (arguments, state_dir, end) = a_stopped_sessionizer(&run);
    let description = tool_json(run.binary, "describe", &arguments);
    let offsets_before = committed_offsets(&description);
    let topics_before = existing_internal_topics(&description);
    assert!(topics_before.len() > 1, "{topics_before:?}");
    let stage_dir = state_dir.join(&run.application_id);
    let state_before = state_entries(&stage_dir);
    assert!(state_before.len() > 1, "{state_before:?}");

    let other = unique("other-events");
    create_topic(&other, 1);
    produce(
        &other,
        "user-events",
        &fixture("sessionizer/user-events.jsonl"),
    );
    let wrong = args(&[
        "--input-topic",
        &other,
        "--output-topic",
        &run.output,
        "--application-id",
        &run.application_id,
    ]);
    for options in [
        &[][..],
        &["--dry-run"],
        &["--to-latest", "--wipe-local-state"],
    ] {
        let refused = reset(run.binary, options, &wrong, &state_dir);
        let error = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{options:?}: {error}");
        assert!(
            error.starts_with(&format!(
                "error: consumer group {} has committed offsets on {}, which the flags \
                 given do not name as an input",
                run.application_id, run.input
            )) && error.contains("--ignore-committed-topic")
                && error.trim_end().ends_with("nothing was changed"),
            "{error}"
        );
        assert_eq!(error.lines().count(), 1, "{error}");
        assert!(refused.stdout.is_empty(), "{options:?}");
        assert_eq!(committed_offsets(&description), offsets_before);
        assert_eq!(committed(&run.application_id, &other), [None]);
        assert_eq!(existing_internal_topics(&description), topics_before);
        assert_eq!(state_entries(&stage_dir), state_before);
    }

    // A misspelt input, which does not exist, is told the same way.
    let typo = format!("{}-typo", run.input);
    let misspelt = args(&[
        "--input-topic",
        &typo,
        "--output-topic",
        &run.output,
        "--application-id",
        &run.application_id,
    ]);
    let refused = reset(run.binary, &[], &misspelt, &state_dir);
    let error = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{error}");
    assert!(
        error.starts_with(&format!(
            "error: consumer group {} has committed offsets on {}, which the flags given do \
             not name as an input (they name {typo})",
            run.application_id, run.input
        )),
        "{error}"
    );
    assert_eq!(committed_offsets(&description), offsets_before);
    assert_eq!(existing_internal_topics(&description), topics_before);

    let ignoring = reset_ok(
        run.binary,
        &["--dry-run", "--ignore-committed-topic", &run.input],
        &wrong,
        &state_dir,
    );
    assert!(
        ignoring.contains(&format!("  {other} partition 0: none -> 0\n"))
            && ignoring.contains(&format!(
                "Kept: offsets of consumer group {} on {} (--ignore-committed-topic)\n",
                run.application_id, run.input
            )),
        "{ignoring}"
    );
    assert_eq!(committed_offsets(&description), offsets_before);

    let done = reset_ok(run.binary, &[], &arguments, &state_dir);
    assert!(
        done.contains(&format!("  {} partition 0: {end} -> 0\n", run.input)),
        "{done}"
    );
    assert_eq!(committed(&run.application_id, &run.input), [Some(0)]);
    assert_eq!(committed(&run.application_id, &other), [None]);
}

/// `--to-offset` puts every input partition at that offset, within the
/// partition's records (as Kafka's tool does); `--from-file` puts each at
/// the offset its line gives, within them too, and refuses, changing
/// nothing, a file that leaves out an input partition or names a topic
/// that is not an input.
#[test]
fn to_offset_and_from_file_commit_the_offsets_asked() {
    const BASE: i64 = 1_783_345_153_000;
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 2);
    let (events, _) = e2e_tests::sessions::generate(40, 5, BASE);
    produce(&run.input, "user-events", &events);
    let arguments = run.args(&[]);
    let state_dir = fresh_state_dir();
    let ends = ends(&run.input);
    assert!(ends.iter().all(|end| *end > 3), "{ends:?}");
    let group = &run.application_id;

    let planned = reset_ok(
        run.binary,
        &["--to-offset", "3", "--dry-run"],
        &arguments,
        &state_dir,
    );
    assert!(
        planned.contains("inputs to offset 3\n")
            && planned.contains(&format!("  {} partition 1: none -> 3\n", run.input)),
        "{planned}"
    );
    assert_eq!(committed(group, &run.input), [None, None]);
    reset_ok(run.binary, &["--to-offset", "3"], &arguments, &state_dir);
    assert_eq!(committed(group, &run.input), [Some(3), Some(3)]);
    reset_ok(
        run.binary,
        &["--to-offset", "1000000"],
        &arguments,
        &state_dir,
    );
    assert_eq!(
        committed(group, &run.input),
        [Some(ends[0]), Some(ends[1])],
        "clamped to each partition's end"
    );

    let file = scratch_dir().join(format!("{}.csv", unique("offsets")));
    std::fs::write(&file, format!("{0},0,1\n{0},1,99999999\n", run.input)).unwrap();
    let from_file = reset_ok(
        run.binary,
        &["--from-file", file.to_str().unwrap()],
        &arguments,
        &state_dir,
    );
    assert!(
        from_file.contains(&format!("  {} partition 0: {} -> 1\n", run.input, ends[0])),
        "{from_file}"
    );
    assert_eq!(committed(group, &run.input), [Some(1), Some(ends[1])]);

    for (lines, message) in [
        (
            format!("{},0,2\n", run.input),
            format!("gives no offset for {} partition 1", run.input),
        ),
        (
            format!("{0},0,2\n{0},1,2\nnot-an-input,0,2\n", run.input),
            "names not-an-input, which is not an input".to_string(),
        ),
    ] {
        std::fs::write(&file, lines).unwrap();
        let refused = reset(
            run.binary,
            &["--from-file", file.to_str().unwrap()],
            &arguments,
            &state_dir,
        );
        let error = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success()
                && error.contains(&message)
                && error.trim_end().ends_with("nothing was changed"),
            "{error}"
        );
        assert_eq!(committed(group, &run.input), [Some(1), Some(ends[1])]);
    }
    let _ = std::fs::remove_file(file);
}

/// A SIGINT while the reset waits for a broker that does not answer stops
/// it at once: exit code 130 (128 + SIGINT), one line saying that nothing
/// was changed.
#[test]
fn a_signal_before_any_change_stops_the_reset_with_nothing_changed() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = silent.local_addr().unwrap().to_string();
    let child = Command::new(bin("sessionizer"))
        .arg("reset")
        .args(args(&[
            "--input-topic",
            "user-events",
            "--output-topic",
            "user-sessions",
        ]))
        .arg("--state-dir")
        .arg(fresh_state_dir())
        .env("KAFKA_BOOTSTRAP_SERVERS", &address)
        .env("SCHEMA_REGISTRY_URL", registry())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_handler(child.id(), libc::SIGINT);
    let started = std::time::Instant::now();
    send(child.id(), "INT");
    let output = wait_with_timeout(child, Duration::from_secs(15));
    let error = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        error.trim_end(),
        "error: reset stopped by SIGINT; nothing was changed",
        "{error}"
    );
    drop(silent);
}

/// Waits until process `pid` handles `signal` itself (its handler shows
/// in `SigCgt` of `/proc/<pid>/status`).
fn wait_for_handler(pid: u32, signal: libc::c_int) {
    let bit = 1u64 << (signal - 1);
    let status = format!("/proc/{pid}/status");
    let caught = eventually(Duration::from_secs(10), || {
        std::fs::read_to_string(&status)
            .ok()
            .and_then(|text| {
                let mask = text.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
                u64::from_str_radix(mask.trim(), 16).ok()
            })
            .is_some_and(|mask| mask & bit != 0)
    });
    assert!(caught, "no handler of signal {signal} in process {pid}");
}

fn send(pid: u32, signal: &str) {
    let sent = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(sent.success());
}

/// The child's output once it exits, which it must within `timeout`.
fn wait_with_timeout(mut child: std::process::Child, timeout: Duration) -> Output {
    let deadline = std::time::Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A reset stopped by SIGTERM part-way (sent as soon as it starts to
/// change things) exits with 143 and one line saying what it did and
/// what not; the input offsets, which it moves last, are not moved yet.
/// The same reset run again completes it: `--shift-by` moves the offsets
/// once, not twice.
#[test]
fn a_reset_stopped_by_a_signal_is_completed_by_running_it_again() {
    use std::io::{BufRead, BufReader, Read};

    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 1);
    let (arguments, state_dir, end) = a_stopped_sessionizer(&run);
    let description = tool_json(run.binary, "describe", &arguments);
    let stage_dir = state_dir.join(&run.application_id);
    let topics_before = existing_internal_topics(&description);
    assert!(topics_before.len() > 1, "{topics_before:?}");
    let options = ["--shift-by", "-2", "--wipe-local-state"];

    let mut child = Command::new(bin(run.binary))
        .arg("reset")
        .args(options)
        .args(&arguments)
        .arg("--state-dir")
        .arg(&state_dir)
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .env("SCHEMA_REGISTRY_URL", registry())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut header = String::new();
    stdout.read_line(&mut header).unwrap();
    assert_eq!(
        header,
        format!("Reset of application {}:\n", run.application_id)
    );
    send(child.id(), "TERM");
    let mut printed = String::new();
    stdout.read_to_string(&mut printed).unwrap();
    let output = wait_with_timeout(child, Duration::from_secs(60));
    let error = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(143), "{error}\n{printed}");
    assert_eq!(error.lines().count(), 1, "{error}");
    assert!(
        error.starts_with("error: reset stopped by SIGTERM; ")
            && error.contains("commit the input offsets")
            && (error.trim_end().ends_with("nothing was changed")
                || error.trim_end().ends_with(
                    "do not start the application: run the same reset again to complete it"
                )),
        "{error}"
    );
    assert_eq!(
        error.contains("deleted the internal topics"),
        printed.contains("Deleted: internal topics"),
        "{error}\n{printed}"
    );
    assert!(!printed.contains("offsets committed"), "{printed}");
    assert_eq!(committed(&run.application_id, &run.input), [Some(end)]);

    let done = reset_ok(run.binary, &options, &arguments, &state_dir);
    assert!(
        done.contains(&format!(
            "  {} partition 0: {end} -> {}\n",
            run.input,
            end - 2
        )),
        "{done}"
    );
    assert_eq!(committed(&run.application_id, &run.input), [Some(end - 2)]);
    assert_eq!(
        existing_internal_topics(&description),
        [format!("{}-dlq", run.application_id)]
    );
    assert_eq!(state_entries(&stage_dir), ["instance.id"]);
}
