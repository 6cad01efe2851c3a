//! The services run from the container image (deploy/docker/Dockerfile) on
//! the local stack, as a user runs them: `podman run --network host`, locked
//! down as the Kubernetes manifests run them (numeric non-root user,
//! read-only root filesystem with no tmpfs, every capability dropped, no new
//! privileges), the state directory a named volume and the only writable
//! path. Every service runs its fixture and is checked as the fixture tests
//! check it; SIGTERM must commit and exit 0 within the manifests' grace
//! period; a kill -9 and a new container on the same volume stay exact; and
//! embed-batcher embeds with the model inside the image.
//!
//! `make test` builds the image first (`make image-test`: the debug
//! binaries it has just built, deploy/image/build.sh); `STREAMS_IMAGE`
//! names another one.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use e2e_tests::batches::{model, per_tenant, without_embedding, Edit, Rules};
use e2e_tests::sessions::generate;
use e2e_tests::*;
use serde_json::Value;

fn image() -> String {
    std::env::var("STREAMS_IMAGE").unwrap_or_else(|_| "localhost/streams-services:test".into())
}

/// podman with the project's containers.conf (runc, cgroupfs, ulimits the
/// sandbox allows; deploy/image/containers.conf).
fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .env(
            "CONTAINERS_CONF",
            workspace().join("deploy/image/containers.conf"),
        )
        .output()
        .expect("run podman (make image-test installs it)")
}

fn podman_ok(args: &[&str]) -> String {
    let output = podman(args);
    assert!(
        output.status.success(),
        "podman {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// The grace period the StatefulSet of `service` gives a stopping pod.
fn grace_period(service: &str) -> Duration {
    let path = workspace().join(format!("deploy/k8s/base/{service}/statefulset.yaml"));
    let text = std::fs::read_to_string(&path).unwrap();
    let seconds = text
        .lines()
        .find_map(|line| line.trim().strip_prefix("terminationGracePeriodSeconds:"))
        .unwrap_or_else(|| panic!("{}: no terminationGracePeriodSeconds", path.display()))
        .trim()
        .parse()
        .unwrap();
    Duration::from_secs(seconds)
}

/// A named volume for a state directory, removed when dropped (after the
/// containers that use it: declare it first).
struct Volume(String);

impl Volume {
    fn new() -> Volume {
        Volume(podman_ok(&["volume", "create", &unique("state")]))
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = podman(&["volume", "rm", "--force", &self.0]);
    }
}

/// A service running in a container of the image, removed when dropped.
struct Container {
    name: String,
    service: &'static str,
    http_port: u16,
}

impl Container {
    fn start(service: &'static str, arguments: &[String], volume: &Volume) -> Container {
        Self::start_with(service, arguments, volume, &[])
    }

    /// Starts `service` with `arguments` and extra `podman run` options.
    fn start_with(
        service: &'static str,
        arguments: &[String],
        volume: &Volume,
        options: &[&str],
    ) -> Container {
        let name = unique(service);
        let http_port = free_port();
        let state = format!("{}:/var/lib/streams/state", volume.0);
        let http_addr = format!("HTTP_ADDR=127.0.0.1:{http_port}");
        let kafka = format!("KAFKA_BOOTSTRAP_SERVERS={}", bootstrap());
        let registry = format!("SCHEMA_REGISTRY_URL={}", registry());
        let image = image();
        let mut run: Vec<&str> = vec![
            "run",
            "--detach",
            "--name",
            &name,
            "--network",
            "host",
            "--user",
            "10001:10001",
            "--read-only",
            "--read-only-tmpfs=false",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--volume",
            &state,
            "--env",
            &http_addr,
            "--env",
            &kafka,
            "--env",
            &registry,
        ];
        run.extend_from_slice(options);
        run.push(&image);
        run.push(service);
        run.extend(arguments.iter().map(String::as_str));
        if !arguments.iter().any(|arg| arg == "--commit-interval") {
            run.extend(["--commit-interval", "100ms"]);
        }
        let output = podman(&run);
        assert!(
            output.status.success(),
            "podman run {service} failed (is {image} built? `make image-test`): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Container {
            name,
            service,
            http_port,
        }
    }

    fn log(&self) -> String {
        let output = podman(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    }

    fn metric(&self, series: &str) -> f64 {
        metric_value(
            &http_get(self.http_port, "/metrics").unwrap_or_default(),
            series,
        )
    }

    fn consumed(&self, topic: &str) -> f64 {
        self.metric(&format!(
            "streams_records_consumed_total{{topic=\"{topic}\"}}"
        ))
    }

    /// `/healthz` and `/readyz` answer 200 from the container.
    fn wait_healthy_and_ready(&self) {
        let answered = eventually(Duration::from_secs(90), || {
            http_get(self.http_port, "/healthz").is_some()
                && http_get(self.http_port, "/readyz").is_some_and(|body| body.starts_with("ready"))
        });
        assert!(answered, "/healthz, /readyz: no 200; log:\n{}", self.log());
    }

    /// SIGTERM, as `podman stop` (and the kubelet) sends it, with SIGKILL
    /// after the manifests' grace period: asserts exit code 0 within it.
    fn stop_within_grace_period(&self) {
        let grace = grace_period(self.service);
        let started = Instant::now();
        podman_ok(&["stop", "--time", &grace.as_secs().to_string(), &self.name]);
        let took = started.elapsed();
        let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &self.name]);
        assert_eq!(
            code,
            "0",
            "{} exited with {code} after SIGTERM ({took:?}); log:\n{}",
            self.service,
            self.log()
        );
        assert!(took < grace, "{} took {took:?} to stop", self.service);
        println!("{}: SIGTERM to exit 0 in {took:?}", self.service);
    }

    /// SIGKILL, as a crash (or an OOM kill) would.
    fn kill_9(&self) {
        podman_ok(&["kill", "--signal", "KILL", &self.name]);
        podman_ok(&["wait", &self.name]);
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "0", &self.name]);
    }
}

fn created(name: &str, partitions: usize) -> String {
    let topic = unique(name);
    create_topic(&topic, partitions);
    topic
}

/// Waits for `expected.len()` records on `output`, then stops the service
/// (SIGTERM) and returns the records.
fn finish(container: &Container, output: &str, expected: &[Value]) -> Vec<Value> {
    let records = wait_for_records(output, expected.len(), Duration::from_secs(90));
    container.stop_within_grace_period();
    records
}

/// Fixture runs from the image, each container on a fresh volume.
struct FromImage(Volume);

impl FromImage {
    fn new() -> FromImage {
        FromImage(Volume::new())
    }
}

impl fixture_runs::Launcher for FromImage {
    type Running = Container;

    fn start(&self, service: &'static str, arguments: &[String]) -> Container {
        let container = Container::start(service, arguments, &self.0);
        container.wait_healthy_and_ready();
        container
    }
}

impl fixture_runs::Running for Container {
    fn log(&self) -> String {
        Container::log(self)
    }
}

#[test]
fn sensor_fusion_runs_its_fixture_from_the_image() {
    let image = FromImage::new();
    fixture_runs::sensor_fusion_on(&image).stop_within_grace_period();
}

#[test]
fn order_shipment_joiner_runs_its_fixture_from_the_image() {
    let image = FromImage::new();
    fixture_runs::order_shipment_joiner_on(&image).stop_within_grace_period();
}

#[test]
fn window_aggregator_runs_its_fixture_from_the_image() {
    let image = FromImage::new();
    fixture_runs::window_aggregator_on(&image).stop_within_grace_period();
}

/// The sessionizer's fixture; after the SIGTERM stop, a new container on the
/// same volume and application id has nothing to replay: every record the
/// first one consumed was committed, and no session is written twice.
#[test]
fn sessionizer_runs_its_fixture_from_the_image_and_a_sigterm_stop_leaves_nothing_to_replay() {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", 1);
    let volume = Volume::new();
    let container = Container::start(run.binary, &run.args(&[]), &volume);
    container.wait_healthy_and_ready();
    let input = fixture("sessionizer/user-events.jsonl");
    produce(&run.input, "user-events", &input);
    let expected = fixture("sessionizer/user-sessions.expected.jsonl");
    let records = wait_for_records(&run.output, expected.len(), Duration::from_secs(90));
    assert_eq!(records, expected, "log:\n{}", container.log());
    assert!(
        eventually(Duration::from_secs(30), || container.consumed(&run.input)
            == input.len() as f64),
        "input not all consumed"
    );
    container.stop_within_grace_period();

    let again = Container::start(run.binary, &run.args(&[]), &volume);
    again.wait_healthy_and_ready();
    // Ten commits (one per interval, idle or not) for a replay to show.
    let commits = again.metric("streams_commits_total");
    assert!(
        eventually(Duration::from_secs(30), || again
            .metric("streams_commits_total")
            >= commits + 10.0),
        "no ten commits; log:\n{}",
        again.log()
    );
    assert_eq!(
        again.consumed(&run.input),
        0.0,
        "records consumed again after a graceful stop; log:\n{}",
        again.log()
    );
    again.stop_within_grace_period();
    assert_eq!(
        consume_all(&run.output),
        expected,
        "a session written twice"
    );
}

/// kill -9 in the middle of a run, then a new container on the same state
/// volume: exactly-once output, nothing lost, nothing doubled.
#[test]
fn a_container_killed_with_kill_9_and_restarted_on_its_volume_stays_exact() {
    let input = created("user-events", 2);
    let output = unique("user-sessions");
    let (lines, expected) = generate(12_000, 9, 1_783_345_153_000);
    produce(&input, "user-events", &lines);
    let arguments = args(&[
        "--input-topic",
        &input,
        "--output-topic",
        &output,
        "--application-id",
        &unique("sessionizer-container"),
        // A killed member is noticed after 6 s instead of librdkafka's 45 s.
        "--kafka",
        "session.timeout.ms=6000",
        "--kafka",
        "heartbeat.interval.ms=1000",
    ]);
    let volume = Volume::new();
    let first = Container::start("sessionizer", &arguments, &volume);
    assert!(
        eventually(Duration::from_secs(120), || first.consumed(&input)
            >= 30_000.0),
        "no progress; log:\n{}",
        first.log()
    );
    first.kill_9();
    let exit = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &first.name]);
    assert_eq!(exit, "137", "not killed by SIGKILL");
    let second = Container::start("sessionizer", &arguments, &volume);
    let records = wait_for_records(&output, expected.len(), Duration::from_secs(240));
    assert_same_records(
        &records,
        &expected,
        &format!("first:\n{}\nsecond:\n{}", first.log(), second.log()),
    );
    second.stop_within_grace_period();
}

/// Reference texts with the vectors sentence-transformers computes for them
/// (services/embed-batcher/tests/data/reference_vectors.json).
fn reference_texts() -> Vec<(String, Vec<f32>)> {
    let path = workspace().join("services/embed-batcher/tests/data/reference_vectors.json");
    let references: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    references["texts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["name"].as_str().unwrap().starts_with("reset_password"))
        .chain(
            references["texts"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["name"].as_str().unwrap().starts_with("export_invoices")),
        )
        .map(|r| {
            let vector = r["vector"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            (r["text"].as_str().unwrap().to_string(), vector)
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

/// embed-batcher with its default embedder, the model in the image
/// (`MODEL_DIR` of the Dockerfile, nothing mounted), and the model hub's
/// host names resolving to nowhere: the demo articles give the documented
/// batches, and texts with reference vectors get sentence-transformers'
/// vectors.
#[test]
fn embed_batcher_embeds_with_the_model_inside_the_image() {
    let run = SingleInputRun::new("embed-batcher", "articles", "article-embeddings", 1);
    let demo = std::fs::read_to_string(workspace().join("deploy/local/demo-data/articles.jsonl"))
        .expect("demo data");
    let mut edits: Vec<Edit> = parse_jsonl(&demo).iter().map(Edit::from_line).collect();
    // Embedded as "title\n\nbody", which tokenizes as "title body": each
    // reference text is split at its first space. Ten minutes after the demo.
    let references = reference_texts();
    let t = edits.iter().map(|e| e.updated_at).max().unwrap() + 600_000;
    for (i, (text, _)) in references.iter().enumerate() {
        let (title, body) = text.split_once(' ').unwrap();
        edits.push(Edit {
            tenant: "reference".into(),
            doc: format!("ref-{i}"),
            title: title.into(),
            body: body.into(),
            updated_at: t + i as i64,
        });
    }
    // Moves the watermark past every batch's time.
    edits.push(Edit::new("tick", "tick", t + 3_600_000));
    let rules = Rules {
        batch_size: 3,
        max_wait: 30_000,
        max_out_of_orderness: 5_000,
    };
    let expected = model(&edits, 1, &rules);

    let volume = Volume::new();
    let container = Container::start_with(
        run.binary,
        &args(&[
            "--input-topic",
            &run.input,
            "--output-topic",
            &run.output,
            "--application-id",
            &run.application_id,
            "--batch-size",
            "3",
        ]),
        &volume,
        &[
            "--add-host",
            "huggingface.co:0.0.0.0",
            "--add-host",
            "cdn-lfs.huggingface.co:0.0.0.0",
        ],
    );
    container.wait_healthy_and_ready();
    let lines: Vec<Value> = edits.iter().map(Edit::line).collect();
    produce(&run.input, "articles", &lines);
    let records = finish(&container, &run.output, &expected.rows);
    let rows: Vec<Value> = records
        .iter()
        .map(|line| without_embedding(line, 384))
        .collect();
    assert_same_records(&rows, &expected.rows, &container.log());
    assert_eq!(
        per_tenant(&rows),
        per_tenant(&expected.rows),
        "a tenant's rows in another order"
    );
    for (i, (text, reference)) in references.iter().enumerate() {
        let doc = format!("ref-{i}");
        let line = records
            .iter()
            .find(|l| l["value"]["doc_id"] == doc.as_str())
            .unwrap_or_else(|| panic!("no row for {doc}"));
        let vector: Vec<f32> = line["value"]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let similarity = cosine(&vector, reference);
        assert!(
            similarity >= 0.9999,
            "{text:?}: cosine {similarity} to sentence-transformers' vector"
        );
    }
}
