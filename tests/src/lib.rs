//! Test harness for end-to-end tests against the real local stack.
//!
//! The tests drive the project's binaries as a user would: `streamctl` to
//! create topics, produce and consume, and the service binaries as child
//! processes. Every test uses its own topics, application id, state directory
//! and HTTP port, so tests run in parallel against one broker.
//!
//! The stack is found through `KAFKA_BOOTSTRAP_SERVERS` and
//! `SCHEMA_REGISTRY_URL` (default: the local stack of `make up`), or is the
//! secured cluster once a test calls [`cluster::use_cluster`].

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use serde_json::json;

pub mod batches;
pub mod cluster;
pub mod embedder;
pub mod fixture_runs;
pub mod releases;
pub mod sessions;
pub mod windows;

/// Kafka bootstrap servers of the stack under test.
pub fn bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// Schema registry URL of the stack under test.
pub fn registry() -> String {
    std::env::var("SCHEMA_REGISTRY_URL").unwrap_or_else(|_| "http://127.0.0.1:8081".into())
}

/// The workspace root. `CARGO_MANIFEST_DIR` as cargo (or run-tests.py)
/// gives it to the running test first: a build cache shared by clones at
/// other paths may hold a test binary compiled in another clone.
pub fn workspace() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir.parent().unwrap().to_path_buf()
}

/// `tests/fixtures` of the workspace: one directory per service with example
/// inputs and the output they give, as JSON lines (see docs/services/README.md).
pub fn fixtures_dir() -> PathBuf {
    workspace().join("tests/fixtures")
}

/// The `.avsc` file of a project topic.
pub fn schema(topic: &str) -> PathBuf {
    workspace()
        .join("shared/schemas/avro")
        .join(format!("{topic}.avsc"))
}

/// A built binary of the workspace (`cargo build --bins` puts them beside the
/// test executables' `deps/` directory).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --bins` first (make test does)",
        path.display()
    );
    path
}

/// The value of flag `name` in a service's `arguments`, which must hold it.
pub fn flag<'a>(arguments: &'a [String], name: &str) -> &'a str {
    let at = arguments.iter().position(|argument| argument == name);
    &arguments[at.expect("the flag is given") + 1]
}

/// A name no other test (or run) uses.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}-{:04x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        rand::random::<u16>()
    )
}

/// A TCP port free right now.
pub fn free_port() -> u16 {
    // The port is free now, not reserved: a second call before the first
    // service has bound its port may get the same one back. Never hand out
    // a port twice in one test process.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// On the secured cluster, the client flags of `user` (a service binary
/// runs as the user of its name) that `given` does not set itself; none on
/// the local stack.
fn stack_flags(user: &str, given: &[&str]) -> Vec<String> {
    if !cluster::active() {
        return Vec::new();
    }
    let flags = cluster::flags(user);
    flags
        .chunks(2)
        .filter(|pair| !given.contains(&pair[0].as_str()))
        .flatten()
        .cloned()
        .collect()
}

/// Runs `streamctl` with the stack's addresses.
pub fn streamctl(args: &[&str]) -> Output {
    Command::new(bin("streamctl"))
        .args(args)
        .args(stack_flags("admin", args))
        .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
        .env("SCHEMA_REGISTRY_URL", registry())
        .output()
        .expect("run streamctl")
}

/// Runs `streamctl` and fails the test with its stderr if it fails.
pub fn streamctl_ok(args: &[&str]) -> String {
    let output = streamctl(args);
    assert!(
        output.status.success(),
        "streamctl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Creates a topic.
pub fn create_topic(topic: &str, partitions: usize) {
    streamctl_ok(&[
        "topics",
        "create",
        topic,
        "--partitions",
        &partitions.to_string(),
    ]);
}

/// Writes JSON lines to a temporary file.
pub fn write_jsonl(lines: &[Value]) -> PathBuf {
    let path = scratch_dir().join(format!("{}.jsonl", unique("lines")));
    let mut file = std::fs::File::create(&path).unwrap();
    for line in lines {
        writeln!(file, "{line}").unwrap();
    }
    path
}

/// Produces `lines` (`{"key", "value"}`) to `topic` with the schema of `schema_topic`.
pub fn produce(topic: &str, schema_topic: &str, lines: &[Value]) {
    produce_with(topic, schema_topic, lines, &[]);
}

/// [`produce`] with more `streamctl` flags, e.g. `["--kafka",
/// "compression.type=gzip"]`.
pub fn produce_with(topic: &str, schema_topic: &str, lines: &[Value], flags: &[&str]) {
    let file = write_jsonl(lines);
    produce_file_with(topic, schema_topic, &file, flags);
    let _ = std::fs::remove_file(file);
}

/// Produces a JSON lines file to `topic` with the schema of `schema_topic`.
///
/// `streamctl produce` writes the file in one transaction; one that was
/// rolled back (a partition leader lost mid-write, in the cluster tests)
/// wrote nothing, and neither did one that could not reach the cluster or
/// read the topic's metadata at its start (every broker it knows
/// restarting or refusing, or a metadata request sent to the broker just
/// killed, in the cluster tests), so the whole file is produced again, as
/// a user would.
pub fn produce_file(topic: &str, schema_topic: &str, file: &Path) {
    produce_file_with(topic, schema_topic, file, &[]);
}

/// [`produce_file`] with more `streamctl` flags.
pub fn produce_file_with(topic: &str, schema_topic: &str, file: &Path, flags: &[&str]) {
    produce_file_as(topic, &schema(schema_topic), file, flags);
}

/// [`produce_file_with`] with the `.avsc` file at `schema`.
pub fn produce_file_as(topic: &str, schema: &Path, file: &Path, flags: &[&str]) {
    let mut args = vec![
        "produce",
        "--topic",
        topic,
        "--schema",
        schema.to_str().unwrap(),
        "--file",
        file.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    for _ in 1..5 {
        let output = streamctl(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() {
            return;
        }
        let wrote_nothing = [
            "nothing was committed",
            "cannot reach Kafka",
            "cannot describe topic",
        ]
        .iter()
        .any(|transient| stderr.contains(transient));
        if !wrote_nothing {
            panic!("streamctl {args:?} failed: {stderr}");
        }
        eprintln!("streamctl produce wrote nothing, producing again: {stderr}");
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    streamctl_ok(&args);
}

/// Parses JSON lines.
pub fn parse_jsonl(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l}: {e}")))
        .collect()
}

/// Reads a fixture file.
pub fn fixture(relative: &str) -> Vec<Value> {
    let path = fixtures_dir().join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    parse_jsonl(&text)
}

/// Everything committed on `topic` so far (nothing if it does not exist
/// yet): reads each partition up to its end offset as it is now, and stops
/// there, without waiting for silence.
pub fn consume_all(topic: &str) -> Vec<Value> {
    consume_all_with(topic, &[])
}

/// [`consume_all`] with more `streamctl consume` flags, e.g. `["--headers"]`.
pub fn consume_all_with(topic: &str, flags: &[&str]) -> Vec<Value> {
    let mut args = vec![
        "consume",
        "--topic",
        topic,
        "--from-beginning",
        "--until-end",
        "--idle-exit",
        "30s",
    ];
    args.extend_from_slice(flags);
    let output = streamctl(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() && stderr.contains("does not exist") {
        return Vec::new();
    }
    assert!(
        output.status.success(),
        "streamctl consume {topic} failed: {stderr}"
    );
    parse_jsonl(&String::from_utf8_lossy(&output.stdout))
}

/// Asserts that two record lists hold the same records, in any order; on
/// failure, shows a few of the missing and unexpected ones, not everything.
/// Each record is serialised once, so that lists of tens of thousands of
/// records compare fast.
pub fn assert_same_records(actual: &[Value], expected: &[Value], context: &str) {
    let actual = by_text(actual);
    let expected = by_text(expected);
    let same = actual.len() == expected.len()
        && actual.iter().zip(&expected).all(|((_, a), (_, e))| a == e);
    if same {
        return;
    }
    let missing = first_absent(&expected, &actual);
    let unexpected = first_absent(&actual, &expected);
    panic!(
        "{} records, {} expected\nmissing (first 3): {missing:#?}\nunexpected (first 3): {unexpected:#?}\n{context}",
        actual.len(),
        expected.len()
    );
}

/// The first three records of `keyed` whose text is not in `others` (both
/// sorted by text).
fn first_absent<'a>(keyed: &[(String, &'a Value)], others: &[(String, &Value)]) -> Vec<&'a Value> {
    keyed
        .iter()
        .filter(|(text, _)| {
            others
                .binary_search_by(|(other, _)| other.cmp(text))
                .is_err()
        })
        .map(|(_, record)| *record)
        .take(3)
        .collect()
}

/// Each record with its JSON text, sorted by the text (stable, as [`sorted`]).
fn by_text(records: &[Value]) -> Vec<(String, &Value)> {
    let mut keyed: Vec<(String, &Value)> = records
        .iter()
        .map(|record| (record.to_string(), record))
        .collect();
    keyed.sort_by(|(a, _), (b, _)| a.cmp(b));
    keyed
}

/// Waits until `topic` holds at least `count` records (or `timeout` passes),
/// then, to catch extra rows, reads again until a read finds nothing new;
/// returns all of them. Each read waits for the transactions open at its
/// start to end, so the output a service had begun to write is in, and the
/// last read shows that nothing more was committed while it ran. A test that
/// must prove that nothing *more* comes at all waits on the service's
/// consumed-records metric instead ([`Service::wait_consumed`]).
pub fn wait_for_records(topic: &str, count: usize, timeout: Duration) -> Vec<Value> {
    let deadline = Instant::now() + timeout;
    let mut records = consume_all(topic);
    while records.len() < count && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        records = consume_all(topic);
    }
    loop {
        let again = consume_all(topic);
        if again.len() == records.len() || Instant::now() >= deadline {
            return again;
        }
        records = again;
    }
}

/// Sorts records by their JSON text, for order-insensitive comparison
/// (each record serialised once).
pub fn sorted(mut records: Vec<Value>) -> Vec<Value> {
    records.sort_by_cached_key(Value::to_string);
    records
}

/// A running service binary, killed when dropped.
pub struct Service {
    child: Child,
    pub http_port: u16,
    pub state_dir: PathBuf,
    pub log: PathBuf,
}

impl Service {
    /// Starts `binary` with `args`, a fresh state directory and HTTP port.
    pub fn start(binary: &str, args: &[String]) -> Service {
        Self::start_with_state(binary, args, fresh_state_dir())
    }

    /// Starts `binary` with `args` on an existing state directory.
    pub fn start_with_state(binary: &str, args: &[String], state_dir: PathBuf) -> Service {
        Self::start_program(&bin(binary), binary, args, state_dir)
    }

    /// Starts `program`, a build of service `binary` (another release's,
    /// say), with `args` on an existing state directory.
    pub fn start_program(
        program: &Path,
        binary: &str,
        args: &[String],
        state_dir: PathBuf,
    ) -> Service {
        let http_port = free_port();
        let log = scratch_dir().join(format!("{}.log", unique(binary)));
        let log_file = std::fs::File::create(&log).unwrap();
        let mut command = Command::new(program);
        command.args(args);
        if !args.iter().any(|arg| arg == "--commit-interval") {
            command.args(["--commit-interval", "100ms"]);
        }
        let child = command
            .args(stack_flags(
                binary,
                &args.iter().map(String::as_str).collect::<Vec<_>>(),
            ))
            .arg("--state-dir")
            .arg(&state_dir)
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{http_port}"))
            .env("KAFKA_BOOTSTRAP_SERVERS", bootstrap())
            .env("SCHEMA_REGISTRY_URL", registry())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("start service");
        Service {
            child,
            http_port,
            state_dir,
            log,
        }
    }

    /// The service's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where the log is written (it stays after the service is gone).
    pub fn log_path(&self) -> PathBuf {
        self.log.clone()
    }

    /// Fetches `/metrics`.
    pub fn metrics(&self) -> String {
        http_get(self.http_port, "/metrics").unwrap_or_default()
    }

    /// The tasks the service has open, from its per-task gauges
    /// (`streams_timers_pending{task="2"}`).
    pub fn open_tasks<T: std::str::FromStr + Ord>(&self) -> std::collections::BTreeSet<T> {
        self.metrics()
            .lines()
            .filter_map(|line| line.strip_prefix("streams_timers_pending{task=\""))
            .filter_map(|rest| rest.split('"').next()?.parse().ok())
            .collect()
    }

    /// The value of one metric series (`name{labels}` exactly as rendered), or 0.
    pub fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics(), series)
    }

    /// Waits until the service has consumed at least `count` records of
    /// `topic` and committed since: a barrier before asserting that nothing
    /// (more) was emitted. Panics with the log after `timeout`.
    pub fn wait_consumed(&self, topic: &str, count: usize, timeout: Duration) {
        let consumed = format!("streams_records_consumed_total{{topic=\"{topic}\"}}");
        let deadline = Instant::now() + timeout;
        while self.metric(&consumed) < count as f64 {
            assert!(
                Instant::now() < deadline,
                "{topic}: {} of {count} records consumed after {timeout:?}; log:\n{}",
                self.metric(&consumed),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let commits = self.metric("streams_commits_total");
        while self.metric("streams_commits_total") < commits + 1.0 {
            assert!(Instant::now() < deadline, "no commit after {timeout:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asserts that no commit of this instance was aborted (rolled back).
    pub fn assert_no_aborted_commit(&self) {
        let log = self.log();
        assert!(
            !log.contains("commit aborted"),
            "a commit was aborted:\n{log}"
        );
        assert_eq!(self.metric("streams_commits_aborted_total"), 0.0, "{log}");
    }

    /// Waits until the service answers `/metrics`: its HTTP port is taken.
    /// `free_port` only knows a port is free when it picks it, so a test
    /// that starts several instances starts the next once this one listens
    /// (else two can get the same port).
    pub fn wait_listening(&self, timeout: Duration) {
        assert!(
            eventually(timeout, || http_get(self.http_port, "/metrics").is_some()),
            "no /metrics after {timeout:?}:\n{}",
            self.log()
        );
    }

    /// Waits until `/readyz` answers 200.
    pub fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if http_get(self.http_port, "/readyz").is_some_and(|body| body.starts_with("ready")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("service not ready after {timeout:?}; log:\n{}", self.log());
    }

    /// Stops gracefully (SIGTERM) and asserts that it exited with success;
    /// `what` names the service in the failure, which shows its log.
    pub fn stop_cleanly(self, what: &str) {
        let log = self.log_path();
        let status = self.stop();
        assert!(
            status.success(),
            "{what} did not stop cleanly: {status}\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }

    /// Stops gracefully (SIGTERM) and returns the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                return self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends `signal` (`"TERM"`, `"INT"`, ...) and returns at once, without
    /// waiting for the process to act on it (see [`Service::wait_exit`]).
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} {} failed", self.child.id());
    }

    /// Waits until the process handles SIGTERM itself (its handler shows
    /// in `SigCgt` of `/proc/<pid>/status`): before that, a SIGTERM kills it
    /// (or, as PID 1 in a container, is ignored). Returns how long that
    /// took from now; panics with the log after `timeout`.
    pub fn wait_for_signal_handler(&self, timeout: Duration) -> Duration {
        const SIGTERM_BIT: u64 = 1 << (15 - 1);
        let status = format!("/proc/{}/status", self.child.id());
        let started = Instant::now();
        loop {
            let caught = std::fs::read_to_string(&status)
                .ok()
                .and_then(|text| {
                    let mask = text.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
                    u64::from_str_radix(mask.trim(), 16).ok()
                })
                .unwrap_or(0);
            if caught & SIGTERM_BIT != 0 {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < timeout,
                "no SIGTERM handler after {timeout:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until the log holds `text`; panics with the log after `timeout`.
    pub fn wait_for_log(&self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(text) {
            assert!(
                Instant::now() < deadline,
                "no {text:?} in the log after {timeout:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process has ended.
    pub fn has_exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit on its own, up to `timeout`.
    pub fn wait_exit(mut self, timeout: Duration) -> Option<(std::process::ExitStatus, String)> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some((status, self.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A crash under a backlog: starts `binary` with `arguments` on a fresh
/// state directory, kills it (kill -9) once it has consumed `progress`
/// records of `topic` and committed, and starts it again on the same state,
/// which it returns. The input should be produced beforehand, so that the
/// restarted instance restores its tasks and then faces the rest at once.
pub fn restart_after_kill_9_under_backlog(
    binary: &str,
    arguments: &[String],
    topic: &str,
    progress: usize,
) -> Service {
    let state = fresh_state_dir();
    let first = Service::start_with_state(binary, arguments, state.clone());
    first.wait_consumed(topic, progress, Duration::from_secs(120));
    first.kill();
    Service::start_with_state(binary, arguments, state)
}

/// Forwards every connection to `127.0.0.1:port` to `target` from now on,
/// for as long as the test process runs: a broker address that starts
/// answering when the test says so.
pub fn forward_port(port: u16, target: &str) {
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let target = target.to_string();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&target) else {
                continue;
            };
            let pipe = |mut from: TcpStream, mut to: TcpStream| {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            };
            pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
            pipe(server, client);
        }
    });
}

/// Appends to `topic`-`partition` a record whose format header says
/// `format`, outside any transaction; returns its offset.
pub fn append_with_format(topic: &str, partition: i32, format: u8) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", bootstrap());
    let producer: ThreadedProducer<DefaultProducerContext> = config.create().unwrap();
    let headers = OwnedHeaders::new().insert(Header {
        key: streams_runtime::state::format::HEADER,
        value: Some(&[format][..]),
    });
    producer
        .send(
            BaseRecord::to(topic)
                .partition(partition)
                .key("user-0")
                .payload(&b"written by a newer release"[..])
                .headers(headers),
        )
        .map_err(|(error, _)| error)
        .unwrap();
    producer.flush(Duration::from_secs(30)).unwrap();
    let consumer: BaseConsumer = config.create().unwrap();
    let (_, end) = consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .unwrap();
    end - 1
}

/// A minimal HTTP GET; `None` when nothing answers or the status is not 200.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let (status, body) = http_answer(port, path)?;
    (status == 200).then_some(body)
}

/// A minimal HTTP GET: the status code and the body, `None` when nothing answers.
pub fn http_answer(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// The value of `series` in a Prometheus text exposition, or 0.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(name, _)| *name == series)
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of every series of the metric `name` (whatever its labels), or
/// `None` when the service reports no series of it.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut sum = None;
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let labels = series.strip_prefix(name);
        if labels.is_some_and(|rest| rest.is_empty() || rest.starts_with('{')) {
            if let Ok(value) = value.parse::<f64>() {
                *sum.get_or_insert(0.0) += value;
            }
        }
    }
    sum
}

/// Polls `condition` until it holds or `timeout` passes.
pub fn eventually(timeout: Duration, condition: impl FnMut() -> bool) -> bool {
    eventually_every(Duration::from_millis(250), timeout, condition)
}

/// [`eventually`], looking every `poll`.
pub fn eventually_every(
    poll: Duration,
    timeout: Duration,
    mut condition: impl FnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(poll);
    }
    condition()
}

/// The partition Kafka's producers pick for `key` (the runtime's murmur2),
/// as an index.
pub fn murmur2_partition(key: &[u8], partitions: usize) -> usize {
    streams_runtime::murmur2_partition(key, partitions) as usize
}

/// Where end-to-end tests keep their files — state directories, service
/// logs, input files — so that one `rm -rf` removes them: `make test` empties
/// it before a run and `.ci/run` after. `$TMPDIR/streams-e2e` by default.
pub fn scratch_dir() -> PathBuf {
    let dir = std::env::var_os("E2E_SCRATCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("streams-e2e"));
    std::fs::create_dir_all(&dir).expect("create the e2e scratch directory");
    dir
}

/// A path for a new state directory, in the scratch directory.
pub fn fresh_state_dir() -> PathBuf {
    scratch_dir().join(unique("state"))
}

/// Arguments as owned strings, for [`Service::start`].
pub fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// One run of a single-input service: its input and output topics and its
/// application id, all unique to the run.
pub struct SingleInputRun {
    pub binary: &'static str,
    pub input: String,
    pub output: String,
    pub application_id: String,
}

impl SingleInputRun {
    /// A run of `binary` over a new input topic named after `input_topic`
    /// (created with `partitions`), writing a new one named after `output_topic`.
    pub fn new(
        binary: &'static str,
        input_topic: &str,
        output_topic: &str,
        partitions: usize,
    ) -> Self {
        let run = SingleInputRun {
            binary,
            input: unique(input_topic),
            output: unique(output_topic),
            application_id: unique(binary),
        };
        create_topic(&run.input, partitions);
        run
    }

    /// The service's arguments for this run, then `extra`.
    pub fn args(&self, extra: &[&str]) -> Vec<String> {
        let mut arguments = args(&[
            "--input-topic",
            &self.input,
            "--output-topic",
            &self.output,
            "--application-id",
            &self.application_id,
        ]);
        // embed-batcher's default embedder is the MiniLM model; tests of the
        // batching rules use the hashing embedder unless they pick one.
        if self.binary == "embed-batcher" && !extra.contains(&"--embedder") {
            arguments.extend(args(&["--embedder", "hashing"]));
        }
        arguments.extend(args(extra));
        arguments
    }

    /// Starts the service with this run's arguments and `extra`.
    pub fn start(&self, extra: &[&str]) -> Service {
        Service::start(self.binary, &self.args(extra))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn same_records_in_any_order_pass_and_differences_are_shown() {
        let records: Vec<Value> = (0..1_000)
            .map(|n| json!({"n": n, "even": n % 2 == 0}))
            .collect();
        let mut shuffled = records.clone();
        shuffled.reverse();
        shuffled.swap(3, 700);
        assert_same_records(&shuffled, &records, "reordered");

        let mut changed = shuffled.clone();
        changed[10] = json!({"n": -1, "even": false});
        let failure = std::panic::catch_unwind(|| assert_same_records(&changed, &records, "ctx"))
            .expect_err("a changed record is a difference");
        let message = failure.downcast_ref::<String>().unwrap();
        assert!(
            message.starts_with("1000 records, 1000 expected"),
            "{message}"
        );
        let missing =
            &message[message.find("missing").unwrap()..message.find("unexpected").unwrap()];
        assert!(missing.contains("\"n\": Number(989)"), "{message}");
        let unexpected = &message[message.find("unexpected").unwrap()..];
        assert!(unexpected.contains("Number(-1)"), "{message}");
        assert!(message.ends_with("ctx"), "{message}");

        let mut doubled = records.clone();
        doubled.push(records[0].clone());
        let failure = std::panic::catch_unwind(|| assert_same_records(&doubled, &records, ""));
        assert!(failure.is_err(), "a duplicate is a difference");
    }
}
