//! Standby replicas (`--standby-replicas`): each instance keeps warm copies
//! of other instances' tasks by tailing their changelogs, so that when an
//! instance dies its tasks move to the instances that kept them warm and
//! restore only the changelog tail. Sessionizer on the real stack, six input
//! partitions, three instances.

use std::collections::{BTreeSet, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e_tests::sessions::generate;
use e2e_tests::*;
use serde_json::Value;
use streams_runtime::state::format::STATE_FORMAT;

const BASE: i64 = 1_783_345_153_000;
const PARTITIONS: usize = 6;
const INSTANCES: usize = 3;

/// The task (input partition) of a user's events and sessions.
fn task_of(user: &str) -> usize {
    murmur2_partition(user.as_bytes(), PARTITIONS)
}

fn user_of(record: &Value) -> &str {
    record["key"].as_str().expect("string keys")
}

/// Starts `count` sessionizers with `arguments`, each on its own state.
fn start_instances(arguments: &[String], count: usize) -> Vec<Service> {
    (0..count)
        .map(|_| {
            let instance = Service::start_with_state("sessionizer", arguments, fresh_state_dir());
            instance.wait_listening(Duration::from_secs(60));
            instance
        })
        .collect()
}

/// Every instance's log, each under its file's name.
fn logs(instances: &[Service]) -> String {
    instances
        .iter()
        .map(|s| format!("--- {}:\n{}", s.log_path().display(), s.log()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The log lines of `log` that report a changelog restore.
fn restores(log: &str) -> String {
    log.lines()
        .filter(|line| line.contains("restored changelog"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Records in the changelogs of `application_id` on `partitions` (end
/// offsets, transaction markers included): what a full restore of those
/// tasks would read.
fn changelog_records(application_id: &str, partitions: &BTreeSet<usize>) -> u64 {
    let prefix = format!("{application_id}-");
    let mut total = 0;
    for topic in streamctl_ok(&["topics", "list"]).lines() {
        if !(topic.starts_with(&prefix) && topic.ends_with("-changelog")) {
            continue;
        }
        // "  partition   2  leader   1  replicas [1]  offsets 0..1234"
        for line in streamctl_ok(&["topics", "describe", topic]).lines() {
            let mut words = line.split_whitespace();
            if words.next() != Some("partition") {
                continue;
            }
            let partition: Option<usize> = words.next().and_then(|p| p.parse().ok());
            let high: Option<u64> = line
                .rsplit_once("..")
                .and_then(|(_, high)| high.trim().parse().ok());
            if let (Some(partition), Some(high)) = (partition, high) {
                if partitions.contains(&partition) {
                    total += high;
                }
            }
        }
    }
    total
}

/// `streamctl consume` following a topic from its beginning (read_committed),
/// noting when each record arrives: times events to a tenth of a second,
/// where reading the whole topic again each time would take seconds.
struct Follower {
    child: Child,
    records: Arc<Mutex<Vec<(Instant, Value)>>>,
}

impl Follower {
    fn start(topic: &str) -> Follower {
        let mut child = Command::new(bin("streamctl"))
            .args(["consume", "--topic", topic, "--from-beginning"])
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
            .env("SCHEMA_REGISTRY_URL", registry())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run streamctl consume");
        let stdout = child.stdout.take().unwrap();
        let records = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&records);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(record) = serde_json::from_str(&line) {
                    sink.lock().unwrap().push((Instant::now(), record));
                }
            }
        });
        Follower { child, records }
    }

    /// When the `n`-th record (from 1) that `filter` accepts arrived, if it has.
    fn arrival(&self, n: usize, filter: impl Fn(&Value) -> bool) -> Option<Instant> {
        self.records
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, record)| filter(record))
            .nth(n.checked_sub(1)?)
            .map(|(at, _)| *at)
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_killed_instance_s_tasks_move_to_their_standbys_and_restore_only_the_tail() {
    let input = unique("user-events");
    let output = unique("user-sessions");
    let application_id = unique("sessionizer-standby");
    create_topic(&input, PARTITIONS);
    // 15k users: about 2 500 open sessions (and timers) per task once the
    // first part is in, each user's session rewritten by each of its events.
    let (lines, expected) = generate(15_000, 9, BASE);
    let (first, rest) = lines.split_at(lines.len() * 3 / 5);
    let arguments = args(&[
        "--input-topic",
        &input,
        "--output-topic",
        &output,
        "--application-id",
        &application_id,
        "--standby-replicas",
        "1",
        // A killed member is noticed after 6 s instead of librdkafka's 45 s.
        "--kafka",
        "session.timeout.ms=6000",
        "--kafka",
        "heartbeat.interval.ms=1000",
    ]);
    let mut instances = start_instances(&arguments, INSTANCES);
    for instance in &instances {
        instance.wait_ready(Duration::from_secs(60));
    }

    // The range assignor gives each instance two consecutive tasks. The
    // input comes once they hold them: produced before, the first instance
    // could process it all alone and hand state over through restores.
    let mut owned: Vec<BTreeSet<usize>> = Vec::new();
    let balanced = eventually(Duration::from_secs(60), || {
        owned = instances.iter().map(Service::open_tasks).collect();
        let union: BTreeSet<usize> = owned.iter().flatten().copied().collect();
        owned
            .iter()
            .all(|tasks| tasks.len() == PARTITIONS / INSTANCES)
            && union.len() == PARTITIONS
    });
    assert!(
        balanced,
        "tasks not balanced: {owned:?}\n{}",
        logs(&instances)
    );
    produce(&input, "user-events", first);

    // Every instance consumes its tasks' part of the input and commits.
    let mut lines_per_task = [0usize; PARTITIONS];
    let mut users_per_task: Vec<HashSet<&str>> = vec![HashSet::new(); PARTITIONS];
    for line in first {
        let user = user_of(line);
        lines_per_task[task_of(user)] += 1;
        users_per_task[task_of(user)].insert(user);
    }
    for (instance, tasks) in instances.iter().zip(&owned) {
        let count = tasks.iter().map(|&task| lines_per_task[task]).sum();
        instance.wait_consumed(&input, count, Duration::from_secs(120));
    }

    // Every instance keeps a standby, and the standbys have caught up: each
    // task's changelog holds at least one record per user of the task, and
    // each task has one standby.
    let users_in_state: usize = users_per_task.iter().map(HashSet::len).sum();
    let standbys_ready = |instance: &Service| {
        let metrics = instance.metrics();
        metric_sum(&metrics, "streams_standby_tasks").is_some_and(|n| n >= 1.0)
            && metric_sum(&metrics, "streams_standby_lag_records") == Some(0.0)
    };
    let standby_records = |instance: &Service| {
        metric_sum(&instance.metrics(), "streams_standby_records_total").unwrap_or(0.0)
    };
    let caught_up = eventually(Duration::from_secs(60), || {
        instances.iter().all(standbys_ready)
            && instances.iter().map(standby_records).sum::<f64>() >= users_in_state as f64
    });
    assert!(
        caught_up,
        "standbys not caught up ({users_in_state} users in state):\n{}\n{}",
        instances
            .iter()
            .map(|s| s.metrics())
            .collect::<Vec<_>>()
            .join("\n---\n"),
        logs(&instances)
    );

    // Kill the instance in the middle of the range order (tasks 2 and 3):
    // the survivors then keep their own tasks and take only the killed
    // one's, each from its standby. (Killing the first or the last would
    // also move a survivor's task to the other survivor.)
    let killed = owned
        .iter()
        .position(|tasks| tasks.contains(&(PARTITIONS / 2)))
        .unwrap();
    let moved = owned[killed].clone();
    assert_eq!(
        moved,
        BTreeSet::from([PARTITIONS / 2 - 1, PARTITIONS / 2]),
        "the range assignor's split: {owned:?}"
    );
    let moved_users: usize = moved.iter().map(|&task| users_per_task[task].len()).sum();
    let moved_changelog = changelog_records(&application_id, &moved);
    let of_moved = |row: &Value| moved.contains(&task_of(user_of(row)));
    let moved_rows_before = consume_all(&output)
        .iter()
        .filter(|row| of_moved(row))
        .count();
    let follower = Follower::start(&output);
    assert!(
        eventually(Duration::from_secs(60), || moved_rows_before == 0
            || follower.arrival(moved_rows_before, of_moved).is_some()),
        "streamctl consume did not catch up with {output}"
    );
    let victim = instances.remove(killed);
    let victim_metrics = victim.metrics();
    let victim_log = victim.log_path();
    let restored_before: Vec<f64> = instances
        .iter()
        .map(|s| s.metric("streams_restored_records_total"))
        .collect();
    let standby_before: Vec<f64> = instances.iter().map(standby_records).collect();

    victim.kill();
    let killed_at = Instant::now();
    produce(&input, "user-events", rest);

    // Failover: the survivors ready with every task, and the first session
    // row of a moved task after the kill (none can come before: the moved
    // tasks' partitions have no consumer until the group notices the kill).
    let mut all_tasks_ready = None;
    let mut first_moved_row = None;
    while killed_at.elapsed() < Duration::from_secs(90) && first_moved_row.is_none() {
        if all_tasks_ready.is_none() {
            let open: BTreeSet<usize> = instances.iter().flat_map(Service::open_tasks).collect();
            let ready = instances.iter().all(|s| {
                http_get(s.http_port, "/readyz").is_some_and(|body| body.starts_with("ready"))
            });
            if open.len() == PARTITIONS && ready {
                all_tasks_ready = Some(killed_at.elapsed());
            }
        }
        first_moved_row = follower.arrival(moved_rows_before + 1, of_moved);
        std::thread::sleep(Duration::from_millis(100));
    }
    let failover = first_moved_row
        .map(|at| at.duration_since(killed_at))
        .unwrap_or_else(|| {
            panic!(
                "the moved tasks {moved:?} produced nothing within 90 s of the kill\n{}",
                logs(&instances)
            )
        });
    drop(follower);

    let rows = wait_for_records(&output, expected.len(), Duration::from_secs(120));
    assert_same_records(
        &rows,
        &expected,
        &format!(
            "{}\n--- killed instance: {}",
            logs(&instances),
            victim_log.display()
        ),
    );

    // The moved tasks came back from the standbys: the survivors replayed
    // only the changelog tail past the standbys' checkpoints (nothing was
    // written to it after the standbys had caught up), while a full restore
    // would have replayed at least one record per user of those tasks.
    let restored: Vec<f64> = instances
        .iter()
        .zip(&restored_before)
        .map(|(s, before)| s.metric("streams_restored_records_total") - before)
        .collect();
    let restored_total: f64 = restored.iter().sum();
    println!(
        "standby failover: tasks {moved:?} moved ({moved_users} users, {moved_changelog} changelog \
         offsets); after the kill -9 (session timeout 6 s): survivors ready with every task \
         {}, first row of a moved task {:.2} s; survivors restored {restored:?} records \
         (standby records before the kill {standby_before:?})",
        all_tasks_ready.map_or("not seen before it".to_string(), |at| format!(
            "{:.2} s",
            at.as_secs_f64()
        )),
        failover.as_secs_f64()
    );
    assert!(
        moved_changelog >= moved_users as u64,
        "the moved tasks' changelogs hold at least one record per user: \
         {moved_changelog} < {moved_users}"
    );
    assert!(
        restored_total * 10.0 < moved_users as f64,
        "the survivors restored {restored:?} records for tasks {moved:?}: more than a tail \
         (a full restore replays at least {moved_users} records, {moved_changelog} offsets)\n\
         restores after the kill:\n{}\nmetrics of the killed instance before the kill:\n\
         {victim_metrics}\nsurvivors' metrics:\n{}",
        instances
            .iter()
            .map(|s| restores(&s.log()))
            .collect::<Vec<_>>()
            .join("\n---\n"),
        instances
            .iter()
            .map(|s| s.metrics())
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
}

/// The startup errors of `--standby-replicas` with settings it cannot work
/// with: standbys need exactly-once (under at-least-once a changelog can run
/// ahead of the committed offsets) and the classic group protocol (the
/// placement reads the group's assignments and simulates its range
/// assignor).
#[test]
fn standby_replicas_without_exactly_once_or_with_the_consumer_protocol_are_refused() {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 1);
    for extra in [
        ["--processing-guarantee", "at_least_once"],
        ["--group-protocol", "consumer"],
    ] {
        let mut arguments = run.args(&["--standby-replicas", "1"]);
        arguments.extend(args(&extra));
        let service = Service::start("sessionizer", &arguments);
        let (status, log) = service
            .wait_exit(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{extra:?}: the service should refuse to start"));
        assert!(!status.success(), "{extra:?}: log: {log}");
        assert!(
            log.to_lowercase().contains("standby"),
            "{extra:?}: the error should name the standby setting; log: {log}"
        );
        assert!(!log.contains("panicked"), "{extra:?}: log: {log}");
    }
}

/// A rolling upgrade to a newer state format with standbys on: once an
/// upgraded instance writes a changelog record of a format this build
/// cannot read, the instance that keeps the task's standby stops that
/// standby, with a warning, and goes on processing its own tasks; nothing
/// else stops, and the output stays exact.
#[test]
fn a_changelog_record_of_a_newer_format_stops_only_that_standby() {
    const TASKS: usize = 2;
    let input = unique("user-events");
    let output = unique("user-sessions");
    let application_id = unique("sessionizer-standby-format");
    create_topic(&input, TASKS);
    let (lines, expected) = generate(2_000, 9, BASE);
    let (first, rest) = lines.split_at(lines.len() / 2);
    let arguments = args(&[
        "--input-topic",
        &input,
        "--output-topic",
        &output,
        "--application-id",
        &application_id,
        "--standby-replicas",
        "1",
    ]);
    let mut instances = start_instances(&arguments, TASKS);
    let placed = eventually(Duration::from_secs(90), || {
        instances.iter().all(|instance| {
            instance.open_tasks::<usize>().len() == 1
                && instance.metric("streams_standby_tasks") == 1.0
        })
    });
    assert!(
        placed,
        "each instance owns one task and keeps the other's standby:\n{}",
        logs(&instances)
    );
    produce(&input, "user-events", first);

    let task = *instances[0].open_tasks::<i32>().first().unwrap();
    let changelog = format!("{application_id}-sessions-changelog");
    append_with_format(&changelog, task, STATE_FORMAT + 1);
    let keeper = &instances[1];
    keeper.wait_for_log("standby stopped", Duration::from_secs(60));
    assert!(
        eventually(Duration::from_secs(30), || keeper
            .metric("streams_standby_tasks")
            == 0.0),
        "the standby is gone:\n{}",
        keeper.metrics()
    );

    produce(&input, "user-events", rest);
    let records = wait_for_records(&output, expected.len(), Duration::from_secs(120));
    assert_same_records(&records, &expected, &logs(&instances));
    for instance in &mut instances {
        assert!(!instance.has_exited(), "{}", instance.log());
        instance.assert_no_aborted_commit();
    }
}
