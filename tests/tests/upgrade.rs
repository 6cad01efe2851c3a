//! Upgrades and rollbacks on the real stack: the previous release
//! (tests/upgrade/previous-release, built from the git history by
//! [`Release::binary`]) and this checkout's build take turns on one
//! application, the sessionizer, whose output depends on the open sessions
//! each leaves in state. In either order, whether the second starts on the
//! first's state directory or restores from its changelogs, the output is
//! exactly what the whole input gives. State of a format this build does
//! not know, in a state directory or a changelog record, stops it with one
//! clear error (docs/deploy.md, "Upgrades and rollback").
//!
//! The first test to need the previous release builds it, once per machine
//! and commit (its own crates only: about 10 s); the others wait for it.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use e2e_tests::releases::Release;
use e2e_tests::sessions::generate_with;
use e2e_tests::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::Value;
use streams_runtime::state::format::{HEADER, MARKER, STATE_FORMAT};

const BASE: i64 = 1_783_345_153_000;
const SERVICE: &str = "sessionizer";

/// Which build of the service runs.
#[derive(Debug, Clone, Copy)]
enum Build {
    Previous,
    Current,
}

impl Build {
    fn start(self, arguments: &[String], state_dir: PathBuf) -> Service {
        let program = match self {
            Build::Previous => Release::previous().binary(SERVICE),
            Build::Current => bin(SERVICE),
        };
        Service::start_program(&program, SERVICE, arguments, state_dir)
    }
}

/// One application over generated sessions, its input in two halves.
struct Run {
    input: String,
    output: String,
    application_id: String,
    arguments: Vec<String>,
    first_half: Vec<Value>,
    second_half: Vec<Value>,
    expected: Vec<Value>,
}

impl Run {
    fn new() -> Run {
        let input = unique("user-events");
        let output = unique("user-sessions");
        let application_id = unique("sessionizer-upgrade");
        create_topic(&input, 2);
        // Seeded, so that a failure repeats. Time-ordered: the first half
        // leaves sessions open, the second ends them all.
        let (mut first_half, expected) =
            generate_with(&mut StdRng::seed_from_u64(2026), 1_000, 9, BASE);
        let second_half = first_half.split_off(first_half.len() / 2);
        // The sessions open at the split: what the second build must find
        // in the state the first left.
        let split = second_half[0]["value"]["event_time"].as_i64();
        let open_at_split = expected
            .iter()
            .filter(|s| s["value"]["session_start"].as_i64() < split)
            .filter(|s| s["value"]["session_end"].as_i64() >= split)
            .count();
        assert!(
            open_at_split >= 100,
            "{open_at_split} sessions open at the split"
        );
        let arguments = args(&[
            "--input-topic",
            &input,
            "--output-topic",
            &output,
            "--application-id",
            &application_id,
        ]);
        Run {
            input,
            output,
            application_id,
            arguments,
            first_half,
            second_half,
            expected,
        }
    }

    /// Runs `build` over the first half on `state_dir` and stops it
    /// (SIGTERM: its work committed).
    fn first(&self, build: Build, state_dir: &Path) {
        let service = build.start(&self.arguments, state_dir.to_path_buf());
        produce(&self.input, "user-events", &self.first_half);
        service.wait_consumed(&self.input, self.first_half.len(), Duration::from_secs(120));
        let log = service.log_path();
        let status = service.stop();
        assert!(
            status.success(),
            "{build:?} did not stop cleanly: {status}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }

    /// Runs `build` over the second half on `state_dir` and checks the
    /// whole output; returns the running service.
    fn second(&self, build: Build, state_dir: PathBuf) -> Service {
        let service = build.start(&self.arguments, state_dir);
        produce(&self.input, "user-events", &self.second_half);
        let output = wait_for_records(&self.output, self.expected.len(), Duration::from_secs(120));
        assert_same_records(&output, &self.expected, &service.log());
        service
    }

    /// A task directory of `state_dir`.
    fn task_dir(&self, state_dir: &Path, task: usize) -> PathBuf {
        state_dir
            .join(&self.application_id)
            .join(format!("task-{task}"))
    }

    fn sessions_changelog(&self) -> String {
        format!("{}-sessions-changelog", self.application_id)
    }
}

fn restored(service: &Service) -> f64 {
    service.metric("streams_restored_records_total")
}

#[test]
fn this_build_carries_on_from_the_previous_releases_state_directory() {
    let run = Run::new();
    let state_dir = fresh_state_dir();
    run.first(Build::Previous, &state_dir);
    let marker = run.task_dir(&state_dir, 0).join(MARKER);
    assert!(!marker.exists(), "the previous release writes no marker");
    let service = run.second(Build::Current, state_dir);
    assert_eq!(
        restored(&service),
        0.0,
        "its local state, not the changelog"
    );
    assert_eq!(
        std::fs::read_to_string(marker).ok(),
        Some(format!("{STATE_FORMAT}\n")),
        "marked at its first open"
    );
}

#[test]
fn this_build_restores_the_previous_releases_changelogs() {
    let run = Run::new();
    run.first(Build::Previous, &fresh_state_dir());
    let service = run.second(Build::Current, fresh_state_dir());
    assert!(restored(&service) > 0.0, "{}", service.metrics());
}

/// Rollback with the volumes kept: the previous release ignores the marker.
#[test]
fn the_previous_release_carries_on_from_this_builds_state_directory() {
    let run = Run::new();
    let state_dir = fresh_state_dir();
    run.first(Build::Current, &state_dir);
    assert!(run.task_dir(&state_dir, 0).join(MARKER).exists());
    run.second(Build::Previous, state_dir);
}

/// Rollback onto empty volumes: the previous release ignores the header.
#[test]
fn the_previous_release_restores_this_builds_changelogs() {
    let run = Run::new();
    run.first(Build::Current, &fresh_state_dir());
    let records = changelog_with_headers(&run.sessions_changelog());
    assert!(!records.is_empty());
    let format = String::from_utf8_lossy(&[STATE_FORMAT]).into_owned();
    for record in &records {
        assert_eq!(
            record["headers"][HEADER].as_str(),
            Some(format.as_str()),
            "{record}"
        );
    }
    run.second(Build::Previous, fresh_state_dir());
}

#[test]
fn a_state_directory_of_a_newer_format_stops_this_build_and_is_left_untouched() {
    let run = Run::new();
    let state_dir = fresh_state_dir();
    run.first(Build::Current, &state_dir);
    let task_dir = run.task_dir(&state_dir, 0);
    let future = STATE_FORMAT + 1;
    std::fs::write(task_dir.join(MARKER), format!("{future}\n")).unwrap();
    let before = files(&state_dir);
    let expected = format!(
        "error: state in {} has format {future}, this build reads formats 1..={STATE_FORMAT}: \
         roll back to a release that wrote it, or wipe the directory or use a new application id",
        task_dir.display()
    );
    assert_stops_with(
        Build::Current.start(&run.arguments, state_dir.clone()),
        &expected,
    );
    assert_eq!(files(&state_dir), before, "nothing touched");
}

#[test]
fn a_changelog_record_of_a_newer_format_stops_the_restore() {
    let run = Run::new();
    run.first(Build::Current, &fresh_state_dir());
    let changelog = run.sessions_changelog();
    let future = STATE_FORMAT + 1;
    let offset = append_with_format(&changelog, 0, future);
    let expected = format!(
        "error: state in changelog {changelog} partition 0 (offset {offset}) has format \
         {future}, this build reads formats 1..={STATE_FORMAT}: roll back to a release that \
         wrote it, or use a new application id"
    );
    assert_stops_with(
        Build::Current.start(&run.arguments, fresh_state_dir()),
        &expected,
    );
}

/// Asserts that `service` exits with a failure and `line` in its log.
fn assert_stops_with(service: Service, line: &str) {
    let (status, log) = service
        .wait_exit(Duration::from_secs(120))
        .expect("the service stops");
    assert!(!status.success(), "{status}\n{log}");
    assert!(
        log.lines().any(|logged| logged == line),
        "no line {line:?} in the log:\n{log}"
    );
}

/// Every file under `dir`: path, size and modification time.
fn files(dir: &Path) -> Vec<(PathBuf, u64, SystemTime)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let metadata = entry.metadata().unwrap();
        if metadata.is_dir() {
            found.extend(files(&entry.path()));
        } else {
            found.push((entry.path(), metadata.len(), metadata.modified().unwrap()));
        }
    }
    found.sort();
    found
}

/// The records of a changelog with their headers (values undecodable: not Avro).
fn changelog_with_headers(topic: &str) -> Vec<Value> {
    consume_all_with(topic, &["--headers"])
}
