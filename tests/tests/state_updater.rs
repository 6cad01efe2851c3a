//! The state updater: tasks open off the processing thread, so a task that
//! cannot open yet (its store still held by its previous owner, or a long
//! restore) does not hold up the tasks that can. Sessionizer on the real
//! stack, two input partitions, one instance.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use e2e_tests::sessions::{event, session};
use e2e_tests::*;
use serde_json::Value;

const PARTITIONS: usize = 2;
const T: i64 = 1_783_345_153_000;

/// A POSIX record lock on a file, the kind RocksDB takes on a store's
/// `LOCK` file: while it is held, the store cannot be opened, as when the
/// task's previous owner has not closed it yet. Released when dropped
/// (closing the file releases the lock).
struct StoreLock {
    _file: File,
}

impl StoreLock {
    fn hold(path: &Path) -> Self {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap();
        // SAFETY: a zeroed `flock` is a valid value; fcntl only reads it.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = libc::F_WRLCK as _;
        lock.l_whence = libc::SEEK_SET as _;
        // SAFETY: the descriptor is open for the call's duration.
        let locked = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
        assert_eq!(locked, 0, "locking {}", path.display());
        StoreLock { _file: file }
    }
}

/// `count` users whose events go to task `task`.
fn users_of_task(task: usize, count: usize) -> Vec<String> {
    (0..)
        .map(|n| format!("user-{n}"))
        .filter(|user| murmur2_partition(user.as_bytes(), PARTITIONS) == task)
        .take(count)
        .collect()
}

/// A LOGIN of each user, then a LOGOUT of each a second later, in event
/// time order (one completed session each).
fn events(users: &[String]) -> Vec<Value> {
    let logins = users
        .iter()
        .enumerate()
        .map(|(n, user)| event(user, "LOGIN", T + n as i64));
    let logouts = users
        .iter()
        .enumerate()
        .map(|(n, user)| event(user, "LOGOUT", T + n as i64 + 1_000));
    logins.chain(logouts).collect()
}

fn sessions(users: &[String]) -> Vec<Value> {
    users
        .iter()
        .enumerate()
        .map(|(n, user)| {
            let start = T + n as i64;
            session(
                user,
                "COMPLETED",
                &["LOGIN", "LOGOUT"],
                start,
                start + 1_000,
            )
        })
        .collect()
}

fn users_in(records: &[Value]) -> BTreeSet<String> {
    records
        .iter()
        .map(|record| record["key"].as_str().expect("string keys").to_string())
        .collect()
}

#[test]
fn a_task_that_cannot_open_yet_does_not_hold_up_the_others() {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", PARTITIONS);
    let (waiting, running) = (users_of_task(0, 20), users_of_task(1, 20));
    let state_dir = fresh_state_dir();
    let lock = StoreLock::hold(
        &state_dir
            .join(&run.application_id)
            .join("task-0")
            .join("LOCK"),
    );
    produce(&run.input, "user-events", &events(&waiting));
    produce(&run.input, "user-events", &events(&running));
    let service = Service::start_with_state("sessionizer", &run.args(&[]), state_dir);

    // Task 1 processes all its input while task 0 waits for its store.
    let output = wait_for_records(&run.output, running.len(), Duration::from_secs(60));
    assert_same_records(&output, &sessions(&running), "task 1's sessions");
    let task_ready =
        |task: usize| service.metric(&format!("streams_task_ready{{task=\"{task}\"}}"));
    let metrics = service.metrics();
    assert_eq!(task_ready(0), 0.0, "task 0 is still opening:\n{metrics}");
    assert_eq!(task_ready(1), 1.0, "{metrics}");
    assert_eq!(
        metric_value(&metrics, "streams_thread_state{state=\"restoring\"}"),
        1.0,
        "{metrics}"
    );
    assert_eq!(metric_value(&metrics, "streams_ready"), 0.0, "{metrics}");
    assert_eq!(
        http_answer(service.http_port, "/readyz").map(|(status, _)| status),
        Some(503),
        "not ready while a task opens"
    );
    assert!(
        service
            .log()
            .contains("state store locked by its previous owner"),
        "{}",
        service.log()
    );

    // Once its store is free, task 0 opens and catches up: every session
    // exactly once.
    drop(lock);
    service.wait_ready(Duration::from_secs(60));
    let everyone: Vec<String> = waiting.iter().chain(&running).cloned().collect();
    let output = wait_for_records(&run.output, everyone.len(), Duration::from_secs(60));
    let mut expected = sessions(&running);
    expected.extend(sessions(&waiting));
    assert_same_records(&output, &expected, "every session once");
    assert_eq!(users_in(&output), everyone.iter().cloned().collect());
    assert!(
        eventually(Duration::from_secs(10), || {
            task_ready(0) == 1.0 && service.metric("streams_thread_state{state=\"running\"}") == 1.0
        }),
        "{}",
        service.metrics()
    );
    service.assert_no_aborted_commit();
}
