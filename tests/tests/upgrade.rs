//! Upgrades and rollbacks on the real stack, with earlier releases built
//! from the git history ([`Release::binary`]): the first release (0.1.0,
//! unmarked state of format 1), the previous one (0.2.0, the last release
//! of format 1) and this checkout's build (format 2) run on one
//! application, the sessionizer, whose output depends on the open sessions
//! each leaves in state (and on the watermark, which the format change
//! moved).
//!
//! * Taking turns, in either order, whether the second starts on the
//!   first's state directory or restores from its changelogs, the output is
//!   exactly what the whole input gives; an older release takes over only
//!   from this build's first upgrade step (`--upgrade-from-format 1`).
//! * Side by side with standbys, through both steps of an upgrade from the
//!   previous release and a rollback of the first, no instance stops and
//!   no standby is dropped, and the output is exact.
//! * State of a format a build does not know, in a state directory or a
//!   changelog record, stops it with one clear error (docs/deploy.md,
//!   "Upgrades and rollback").
//!
//! The first test to need a release builds it, once per machine and commit
//! (its own crates only); the others wait for it.

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
#[derive(Debug, Clone, Copy, PartialEq)]
enum Build {
    /// 0.1.0: format 1, no markers, no checks.
    First,
    /// 0.2.0: format 1, checked.
    Previous,
    /// This checkout's build, writing format 1: the first upgrade step.
    CurrentFirstStep,
    /// This checkout's build, writing its own format.
    Current,
}

impl Build {
    fn start(self, arguments: &[String], state_dir: PathBuf) -> Service {
        let program = match self {
            Build::First => Release::first().binary(SERVICE),
            Build::Previous => Release::previous().binary(SERVICE),
            Build::CurrentFirstStep | Build::Current => bin(SERVICE),
        };
        let mut arguments = arguments.to_vec();
        if self == Build::CurrentFirstStep {
            arguments.extend(args(&["--upgrade-from-format", "1"]));
        }
        Service::start_program(&program, SERVICE, &arguments, state_dir)
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
        service.stop_cleanly(&format!("{build:?}"));
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
fn this_build_carries_on_from_the_first_releases_state_directory() {
    let run = Run::new();
    let state_dir = fresh_state_dir();
    run.first(Build::First, &state_dir);
    let marker = run.task_dir(&state_dir, 0).join(MARKER);
    assert!(!marker.exists(), "the first release writes no marker");
    let service = run.second(Build::Current, state_dir);
    assert_eq!(
        restored(&service),
        0.0,
        "its local state, not the changelog"
    );
    assert_eq!(
        std::fs::read_to_string(marker).ok(),
        Some(format!("{STATE_FORMAT}\n")),
        "migrated and marked at its first open"
    );
}

#[test]
fn this_build_restores_the_first_releases_changelogs() {
    let run = Run::new();
    run.first(Build::First, &fresh_state_dir());
    let service = run.second(Build::Current, fresh_state_dir());
    assert!(restored(&service) > 0.0, "{}", service.metrics());
}

/// Rollback with the volumes kept, from the first upgrade step: it left
/// format 1, and the first release ignores the marker.
#[test]
fn the_first_release_carries_on_from_this_builds_first_step_state_directory() {
    let run = Run::new();
    let state_dir = fresh_state_dir();
    run.first(Build::CurrentFirstStep, &state_dir);
    let marker = run.task_dir(&state_dir, 0).join(MARKER);
    assert_eq!(std::fs::read_to_string(marker).ok().as_deref(), Some("1\n"));
    run.second(Build::First, state_dir);
}

/// Rollback onto empty volumes, from the first upgrade step: its changelog
/// records are format 1, and the first release ignores the header.
#[test]
fn the_first_release_restores_this_builds_first_step_changelogs() {
    let run = Run::new();
    run.first(Build::CurrentFirstStep, &fresh_state_dir());
    assert_changelog_formats(&run, &[1]);
    run.second(Build::First, fresh_state_dir());
}

/// Past the first step there is no rollback in place: the previous release
/// refuses this build's state directory and its changelogs, with the line
/// that says why, and touches nothing.
#[test]
fn the_previous_release_refuses_the_state_this_build_writes() {
    let run = Run::new();
    let state_dir = fresh_state_dir();
    run.first(Build::Current, &state_dir);
    assert_changelog_formats(&run, &[STATE_FORMAT]);
    let task_dir = run.task_dir(&state_dir, 0);
    let before = files(&state_dir);
    assert_stops_with(
        Build::Previous.start(&run.arguments, state_dir.clone()),
        &format!(
            "error: state in {} has format {STATE_FORMAT}, this build reads formats 1..=1: \
             roll back to a release that wrote it, or wipe the directory or use a new \
             application id",
            task_dir.display()
        ),
    );
    assert_eq!(files(&state_dir), before, "nothing touched");
    let (status, log) = Build::Previous
        .start(&run.arguments, fresh_state_dir())
        .wait_exit(Duration::from_secs(120))
        .expect("the previous release stops");
    assert!(!status.success(), "{status}\n{log}");
    let refused = format!("has format {STATE_FORMAT}, this build reads formats 1..=1: roll back");
    assert!(
        log.lines()
            .any(|line| line.starts_with("error: state in changelog") && line.contains(&refused)),
        "{log}"
    );
}

/// The state-format headers of the changelog records of `run`'s sessions
/// store, which must all be among `formats`.
fn assert_changelog_formats(run: &Run, formats: &[u8]) {
    let records = changelog_with_headers(&run.sessions_changelog());
    assert!(!records.is_empty());
    let allowed: Vec<String> = formats
        .iter()
        .map(|&format| String::from_utf8_lossy(&[format]).into_owned())
        .collect();
    for record in &records {
        let header = record["headers"][HEADER].as_str().unwrap_or_default();
        assert!(
            allowed.iter().any(|format| format == header),
            "formats {formats:?} only: {record}"
        );
    }
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

/// Two instances of one application, each on its own state directory,
/// standbys on: each owns one of the two tasks and keeps the other's
/// standby.
struct Pair {
    run: Run,
    arguments: Vec<String>,
    state_dirs: [PathBuf; 2],
    instances: [Option<(Build, Service)>; 2],
    /// How much of the input has been produced.
    produced: usize,
}

impl Pair {
    fn start(run: Run, builds: [Build; 2]) -> Pair {
        let mut arguments = run.arguments.clone();
        arguments.extend(args(&["--standby-replicas", "1"]));
        let mut pair = Pair {
            run,
            arguments,
            state_dirs: [fresh_state_dir(), fresh_state_dir()],
            instances: [None, None],
            produced: 0,
        };
        for (slot, build) in builds.into_iter().enumerate() {
            pair.launch(slot, build);
        }
        pair.wait_placed("started");
        pair
    }

    /// Stops instance `slot`, if running (SIGTERM: its work committed), and
    /// starts `build` on its state directory; returns once the two are
    /// placed again.
    fn replace(&mut self, slot: usize, build: Build) {
        if let Some((was, service)) = self.instances[slot].take() {
            service.stop_cleanly(&format!("{was:?}"));
        }
        self.launch(slot, build);
        self.wait_placed(&format!("instance {slot} now {build:?}"));
    }

    /// Starts `build` as instance `slot`, on its state directory.
    fn launch(&mut self, slot: usize, build: Build) {
        let service = build.start(&self.arguments, self.state_dirs[slot].clone());
        service.wait_listening(Duration::from_secs(60));
        self.instances[slot] = Some((build, service));
    }

    fn running(&self) -> impl Iterator<Item = &(Build, Service)> {
        self.instances.iter().flatten()
    }

    fn logs(&self) -> String {
        self.running()
            .map(|(build, service)| format!("--- {build:?}:\n{}", service.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until each instance owns one task and keeps the other's
    /// standby.
    fn wait_placed(&self, step: &str) {
        let placed = eventually(Duration::from_secs(120), || {
            self.running().count() == 2
                && self.running().all(|(_, service)| {
                    service.open_tasks::<usize>().len() == 1
                        && service.metric("streams_standby_tasks") == 1.0
                })
        });
        assert!(placed, "{step}: not placed\n{}", self.logs());
    }

    /// Produces the next `count` input events and waits until the two have
    /// consumed them and committed; then checks that neither dropped a
    /// standby and that both are still placed.
    fn process(&mut self, count: usize, step: &str) {
        let whole: Vec<Value> = self
            .run
            .first_half
            .iter()
            .chain(&self.run.second_half)
            .cloned()
            .collect();
        let part = &whole[self.produced..(self.produced + count).min(whole.len())];
        let consumed = |service: &Service| {
            service.metric(&format!(
                "streams_records_consumed_total{{topic=\"{}\"}}",
                self.run.input
            ))
        };
        let before: f64 = self.running().map(|(_, s)| consumed(s)).sum();
        let commits: Vec<f64> = self
            .running()
            .map(|(_, s)| s.metric("streams_commits_total"))
            .collect();
        produce(&self.run.input, "user-events", part);
        self.produced += part.len();
        let done = eventually(Duration::from_secs(120), || {
            let now: f64 = self.running().map(|(_, s)| consumed(s)).sum();
            now - before >= part.len() as f64
                && self
                    .running()
                    .zip(&commits)
                    .all(|((_, s), before)| s.metric("streams_commits_total") > *before)
        });
        assert!(done, "{step}: the input was not consumed\n{}", self.logs());
        for (build, service) in self.running() {
            assert!(
                !service.log().contains("standby stopped"),
                "{step}: {build:?} dropped a standby\n{}",
                service.log()
            );
        }
        self.wait_placed(step);
    }

    /// The format the marker of each instance's task directories says.
    fn markers(&self) -> Vec<String> {
        let mut markers = Vec::new();
        for dir in &self.state_dirs {
            for task in 0..2 {
                let marker = self.run.task_dir(dir, task).join(MARKER);
                if let Ok(text) = std::fs::read_to_string(marker) {
                    markers.push(text.trim().to_string());
                }
            }
        }
        markers.sort();
        markers.dedup();
        markers
    }
}

/// The two-step upgrade from the previous release, with standbys: old and
/// new instances side by side at every stage, and a rollback of the first
/// step. Throughout, no instance stops, no standby is dropped (each reads
/// what the other writes), and the output is exactly what the whole input
/// gives. (A commit may be aborted where an instance restarts: the other
/// can fence the transactional id its successor already uses, which then
/// rolls back and goes on.)
#[test]
fn a_two_step_upgrade_beside_the_previous_release_with_standbys_keeps_every_standby() {
    use Build::{CurrentFirstStep, Previous};
    let run = Run::new();
    let tenth = (run.first_half.len() + run.second_half.len()) / 10;
    let mut pair = Pair::start(run, [Previous, Previous]);
    pair.process(tenth, "the previous release");

    // The first step on one instance, rolled back, then on both.
    pair.replace(1, CurrentFirstStep);
    pair.process(tenth, "the first step beside the previous release");
    pair.replace(1, Previous);
    pair.process(tenth, "the first step rolled back");
    pair.replace(1, CurrentFirstStep);
    pair.replace(0, CurrentFirstStep);
    pair.process(tenth, "the first step on both");
    assert_changelog_formats(&pair.run, &[1]);
    assert_eq!(pair.markers(), ["1"], "every directory in format 1");

    // The second step, one instance at a time.
    pair.replace(0, Build::Current);
    pair.process(2 * tenth, "the second step beside the first");
    pair.replace(1, Build::Current);
    pair.process(usize::MAX / 2, "the second step on both");
    assert_eq!(
        pair.markers(),
        [STATE_FORMAT.to_string()],
        "every directory in format {STATE_FORMAT}, standbys' too"
    );

    let output = wait_for_records(
        &pair.run.output,
        pair.run.expected.len(),
        Duration::from_secs(120),
    );
    assert_same_records(&output, &pair.run.expected, &pair.logs());
    let logs = pair.logs();
    for (build, service) in pair.instances.iter_mut().flatten() {
        assert!(!service.has_exited(), "{build:?} stopped\n{logs}");
    }
    assert_changelog_formats(&pair.run, &[1, STATE_FORMAT]);
}
