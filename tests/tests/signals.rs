//! SIGTERM and SIGINT at every point of a service's life that is not its
//! processing loop: while it waits for a broker that does not answer or
//! for its input topics, before its stage runs, while a task restores its
//! changelog, and while start-up is stuck in one request. Each stop is
//! prompt and exits cleanly (0), or with 143 when start-up did not notice
//! within its grace, and
//! loses or doubles nothing: a later run gives the exact output. And
//! kill -9 during a restore, which keeps what the restore wrote.
//! Sessionizer on the real stack.

use std::net::{TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use e2e_tests::sessions::{event, generate, session};
use e2e_tests::*;
use serde_json::Value;

const BASE: i64 = 1_783_345_153_000;
/// The sessionizer's default inactivity timeout.
const SESSION_TIMEOUT: i64 = 30_000;
/// Changelog records a restore writes per batch, with its checkpoint
/// (`restore.rs`).
const RESTORE_BATCH: u64 = 50_000;
/// How long a stop may take, at most, in these tests.
const PROMPT: Duration = Duration::from_secs(10);

/// How a service ended after a signal.
struct Stopped {
    /// From the signal to the exit.
    took: Duration,
    status: ExitStatus,
    log: String,
}

impl Stopped {
    /// Asserts that the service exited on its own, with `code`, within
    /// [`PROMPT`] of the signal.
    fn assert_prompt_exit(&self, code: i32, what: &str) {
        assert!(
            self.took < PROMPT,
            "{what}: exited {:?} after the signal; log:\n{}",
            self.took,
            self.log
        );
        assert_eq!(
            self.status.code(),
            Some(code),
            "{what}: exit status {:?} (signal {:?}); log:\n{}",
            self.status,
            self.status.signal(),
            self.log
        );
    }
}

/// Sends `signal` to `service` and waits for it to exit (for up to twice
/// [`PROMPT`], so that a slow exit is measured rather than cut short).
fn signal_and_wait(service: Service, signal: &str) -> Stopped {
    let sent = Instant::now();
    service.signal(signal);
    let log_path = service.log_path();
    let (status, log) = service.wait_exit(2 * PROMPT).unwrap_or_else(|| {
        panic!(
            "no exit {:?} after SIG{signal}; log:\n{}",
            2 * PROMPT,
            std::fs::read_to_string(log_path).unwrap_or_default()
        )
    });
    Stopped {
        took: sent.elapsed(),
        status,
        log,
    }
}

/// The sessionizer's arguments for `input`, `output` and `application_id`,
/// then `extra`.
fn sessionizer_args(
    input: &str,
    output: &str,
    application_id: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut arguments = args(&[
        "--input-topic",
        input,
        "--output-topic",
        output,
        "--application-id",
        application_id,
    ]);
    arguments.extend(args(extra));
    arguments
}

/// The number after `name=` on a log line.
fn field(line: &str, name: &str) -> Option<u64> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    let digits: String = line[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The sum of `name=` over the log lines that contain `message`.
fn logged_sum(log: &str, message: &str, name: &str) -> u64 {
    log.lines()
        .filter(|line| line.contains(message))
        .filter_map(|line| field(line, name))
        .sum()
}

#[test]
fn a_signal_while_waiting_for_the_input_topic_stops_at_once() {
    // SIGTERM and SIGINT, each on its own instance, side by side.
    let waiting: Vec<(&str, String, String, Service)> = ["TERM", "INT"]
        .into_iter()
        .map(|signal| {
            let output = unique("user-sessions");
            let application_id = unique("sessionizer-sig");
            let arguments = sessionizer_args(
                &unique("user-events-never-created"),
                &output,
                &application_id,
                &["--topic-wait", "5m"],
            );
            let service = Service::start("sessionizer", &arguments);
            (signal, output, application_id, service)
        })
        .collect();
    for (signal, output, application_id, service) in waiting {
        // The stage's state directory is made right before the topic wait
        // (whose first look finds no topic); a second later the service is
        // sleeping in that wait for sure.
        let stage_dir = service.state_dir.join(&application_id);
        assert!(
            eventually(Duration::from_secs(60), || stage_dir.exists()),
            "no stage state directory; log:\n{}",
            service.log()
        );
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            !service.log().contains("started"),
            "the input topic does not exist: the stage must not start; log:\n{}",
            service.log()
        );
        let stopped = signal_and_wait(service, signal);
        println!(
            "SIG{signal} while waiting for the input topic: exited in {:?}",
            stopped.took
        );
        stopped.assert_prompt_exit(0, &format!("SIG{signal} in the topic wait"));
        assert!(
            stopped.log.contains("stopped during start-up"),
            "{}",
            stopped.log
        );
        assert!(
            !streamctl_ok(&["topics", "list"])
                .lines()
                .any(|topic| topic == output),
            "a start-up stopped in its topic wait creates nothing"
        );
    }
}

#[test]
fn a_signal_or_a_kill_during_a_restore_keeps_what_it_wrote_and_the_next_start_goes_on() {
    // One task holding many open sessions (one LOGIN each, no output yet):
    // ~1.8 changelog records per user, restored in ~4 s by a debug build.
    const USERS: usize = 100_000;
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 1);
    let (input, output) = (&run.input, &run.output);
    let user = |u: usize| format!("user-{u}");
    let logins: Vec<Value> = (0..USERS)
        .map(|u| event(&user(u), "LOGIN", BASE + u as i64))
        .collect();
    let started = Instant::now();
    produce(input, "user-events", &logins);
    let arguments = run.args(&[]);
    let first = Service::start("sessionizer", &arguments);
    first.wait_consumed(input, USERS, Duration::from_secs(180));
    println!("{USERS} users in state after {:?}", started.elapsed());
    let stopped = signal_and_wait(first, "TERM");
    stopped.assert_prompt_exit(0, "the first run's stop");

    // What a whole restore reads, and how long it takes.
    let whole = Service::start("sessionizer", &arguments);
    whole.wait_for_log("task ready", Duration::from_secs(120));
    let log = whole.log();
    let changelog = logged_sum(&log, "restored changelog", "records");
    let restore_ms = log
        .lines()
        .filter(|line| line.contains("restored changelog"))
        .filter_map(|line| field(line, "elapsed_ms"))
        .max()
        .unwrap_or(0);
    println!("a whole restore: {changelog} records in {restore_ms} ms");
    assert!(changelog as usize >= USERS, "{log}");
    let stopped = signal_and_wait(whole, "TERM");
    stopped.assert_prompt_exit(0, "the whole restore's stop");

    // No local state: the task restores the whole changelog, from right
    // after its store is opened. The signal comes early in the restore, as
    // restores run at different speeds on a busy machine.
    let second = Service::start("sessionizer", &arguments);
    let task = second.state_dir.join(&run.application_id).join("task-0");
    assert!(
        eventually_every(Duration::from_millis(5), Duration::from_secs(60), || {
            task.exists()
        }),
        "the task never opened; log:\n{}",
        second.log()
    );
    // Meanwhile the restore's progress shows, and the instance is not ready.
    let mut remaining = 0.0;
    assert!(
        eventually_every(Duration::from_millis(5), Duration::from_secs(30), || {
            let text = second.metrics();
            remaining = metric_value(
                &text,
                "streams_restore_remaining_records{store=\"sessions\",task=\"0\"}",
            );
            remaining > 0.0 && metric_value(&text, "streams_ready") == 0.0
        }),
        "no restore progress in /metrics:\n{}",
        second.metrics()
    );
    assert!(
        remaining <= changelog as f64,
        "{remaining} of {changelog} left"
    );
    std::thread::sleep(Duration::from_millis((restore_ms / 6).max(200)));
    assert!(
        !second.log().contains("task ready"),
        "the restore ended before the signal; make the state larger. Log:\n{}",
        second.log()
    );
    let interrupted_state = second.state_dir.clone();
    let stopped = signal_and_wait(second, "TERM");
    println!("SIGTERM during the restore: exited in {:?}", stopped.took);
    stopped.assert_prompt_exit(0, "SIGTERM during the restore");
    assert!(
        stopped.log.contains("restore stopped")
            && !stopped.log.contains("task ready")
            && stopped.log.lines().any(|line| line.ends_with(": stopped")),
        "{}",
        stopped.log
    );
    let restored_before = logged_sum(&stopped.log, "restore stopped", "restored");

    // On the interrupted state, the restore goes on from its checkpoint.
    let third = Service::start_with_state("sessionizer", &arguments, interrupted_state);
    third.wait_for_log("task ready", Duration::from_secs(120));
    let restored_after = logged_sum(&third.log(), "restored changelog", "records");
    println!(
        "restored {restored_before} records before the signal and {restored_after} after the \
         restart, of {changelog}"
    );
    assert!(restored_before > 0 && restored_after > 0);
    assert_eq!(
        restored_before + restored_after,
        changelog,
        "the restart restores what the interrupted restore had not; log:\n{}",
        third.log()
    );

    let stopped = signal_and_wait(third, "TERM");
    stopped.assert_prompt_exit(0, "the resumed restore's stop");

    // kill -9 in the middle of a whole restore, once it has handed two
    // batches to its writer (so the first is written): the batches written
    // before the kill stay, with their checkpoint, and the restart restores
    // only the rest (what the last progress report left, and at most the
    // batch that was being written at the kill).
    let killed = Service::start_with_state("sessionizer", &arguments, fresh_state_dir());
    let mut remaining_at_kill = 0.0;
    assert!(
        eventually_every(Duration::from_millis(5), Duration::from_secs(60), || {
            remaining_at_kill =
                metric_sum(&killed.metrics(), "streams_restore_remaining_records").unwrap_or(0.0);
            remaining_at_kill > 0.0
                && remaining_at_kill <= changelog.saturating_sub(2 * RESTORE_BATCH) as f64
        }),
        "no restore progress to kill in; log:\n{}",
        killed.log()
    );
    let killed_state = killed.state_dir.clone();
    let killed_log = killed.log_path();
    killed.kill();
    let killed_log = std::fs::read_to_string(killed_log).unwrap_or_default();
    assert!(
        !killed_log.contains("task ready"),
        "the restore ended before the kill; make the state larger. Log:\n{killed_log}"
    );
    let restarted = Service::start_with_state("sessionizer", &arguments, killed_state);
    restarted.wait_for_log("task ready", Duration::from_secs(120));
    let restored_after_kill = logged_sum(&restarted.log(), "restored changelog", "records");
    println!(
        "kill -9 with {remaining_at_kill} of {changelog} records left to restore; the restart \
         restored {restored_after_kill}"
    );
    assert!(
        restored_after_kill > 0
            && restored_after_kill <= changelog - RESTORE_BATCH
            && restored_after_kill as f64 <= remaining_at_kill + RESTORE_BATCH as f64,
        "the restart restores what the killed restore had not written, no more; log:\n{}",
        restarted.log()
    );

    // Every session is there, once: a far later event times them all out.
    produce(
        input,
        "user-events",
        &[event("closer", "LOGIN", BASE + 10_000_000)],
    );
    restarted.wait_consumed(input, 1, Duration::from_secs(120));
    let expected: Vec<Value> = (0..USERS)
        .map(|u| {
            let at = BASE + u as i64;
            session(&user(u), "TIMEOUT", &["LOGIN"], at, at + SESSION_TIMEOUT)
        })
        .collect();
    assert_same_records(&consume_all(output), &expected, &restarted.log());
    restarted.assert_no_aborted_commit();
    println!("done after {:?}", started.elapsed());
}

#[test]
fn a_signal_right_after_start_stops_it_and_commits_nothing_half_done() {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 2);
    let (lines, expected) = generate(300, 6, BASE);
    produce(&run.input, "user-events", &lines);
    let arguments = run.args(&[]);
    let state = fresh_state_dir();
    for delay in [0, 25, 50, 100, 150, 200, 300, 700] {
        let service = Service::start_with_state("sessionizer", &arguments, state.clone());
        let handler = service.wait_for_signal_handler(Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(delay));
        let stopped = signal_and_wait(service, "TERM");
        let phase = if stopped.log.contains("stopped during start-up") {
            "start-up"
        } else if stopped.log.contains("started") {
            "the stage"
        } else {
            "?"
        };
        println!(
            "SIGTERM {delay} ms after the handler (installed {handler:?} after the spawn), \
             stopped in {phase}: exit {:?} after {:?}",
            stopped.status, stopped.took
        );
        // 143 only from the backstop, when one blocking call outlasted it.
        let code = if stopped.log.contains("start-up did not stop within") {
            143
        } else {
            0
        };
        stopped.assert_prompt_exit(code, &format!("SIGTERM {delay} ms after start"));
    }
    // What the stopped runs left is whole: one more run completes the
    // output exactly.
    let last = Service::start_with_state("sessionizer", &arguments, state);
    let output = wait_for_records(&run.output, expected.len(), Duration::from_secs(120));
    assert_same_records(&output, &expected, &last.log());
    last.assert_no_aborted_commit();
}

#[test]
fn a_signal_while_waiting_for_the_broker_stops_at_once() {
    let mut arguments = sessionizer_args(
        &unique("user-events"),
        &unique("user-sessions"),
        &unique("sessionizer-sig"),
        &[],
    );
    let nowhere = format!("127.0.0.1:{}", free_port());
    arguments.extend(args(&["--bootstrap-servers", &nowhere]));
    let service = Service::start("sessionizer", &arguments);
    service.wait_for_log("Kafka does not answer", Duration::from_secs(30));
    let stopped = signal_and_wait(service, "TERM");
    println!(
        "SIGTERM while waiting for the broker: exited in {:?}",
        stopped.took
    );
    stopped.assert_prompt_exit(0, "SIGTERM in the broker wait");
    assert!(
        stopped.log.contains("stopped during start-up"),
        "{}",
        stopped.log
    );
}

/// A sessionizer whose start-up is stuck in one request, which does not
/// look at the shutdown flag: its schema registry accepts connections and
/// never answers, so the output schema's registration waits out the
/// request's timeout (10 s). Returns once that request is under way, with
/// the registry's listener and the stuck connection, which must outlive
/// the test.
fn stuck_in_a_request() -> (Service, TcpListener, TcpStream) {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let input = unique("user-events");
    create_topic(&input, 1);
    let registry = format!("http://{}", silent.local_addr().unwrap());
    let arguments = sessionizer_args(
        &input,
        &unique("user-sessions"),
        &unique("sessionizer-sig"),
        &["--schema-registry-url", &registry],
    );
    let service = Service::start("sessionizer", &arguments);
    service.wait_for_signal_handler(Duration::from_secs(30));
    silent.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let request = loop {
        match silent.accept() {
            Ok((request, _)) => break request,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(
                    Instant::now() < deadline,
                    "no request to the registry; log:\n{}",
                    service.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    };
    (service, silent, request)
}

#[test]
fn a_start_up_stuck_in_a_request_exits_when_its_grace_runs_out() {
    let (service, _registry, _request) = stuck_in_a_request();
    let stopped = signal_and_wait(service, "TERM");
    println!("SIGTERM in a stuck start-up: exited in {:?}", stopped.took);
    stopped.assert_prompt_exit(143, "SIGTERM in a stuck start-up");
    assert!(
        stopped.took >= Duration::from_millis(4_500),
        "the start-up grace is 5 s; exited after {:?}:\n{}",
        stopped.took,
        stopped.log
    );
    assert!(
        stopped.log.contains("start-up did not stop within"),
        "{}",
        stopped.log
    );
}

#[test]
fn a_second_signal_exits_at_once() {
    let (service, _registry, _request) = stuck_in_a_request();
    service.signal("TERM");
    service.wait_for_log("shutdown requested", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(500));
    let stopped = signal_and_wait(service, "INT");
    println!(
        "a second signal in a slow stop: exited in {:?}",
        stopped.took
    );
    assert!(
        stopped.took < Duration::from_secs(1),
        "a second signal exits at once; exited after {:?}:\n{}",
        stopped.took,
        stopped.log
    );
    assert_eq!(stopped.status.code(), Some(143), "{}", stopped.log);
    assert!(stopped.log.contains("second signal"), "{}", stopped.log);
}
