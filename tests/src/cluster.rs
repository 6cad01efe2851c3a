//! The secured three-broker cluster of `deploy/local/cluster.sh` (SASL_SSL,
//! ACLs, a TLS registry with basic auth), for the tests in
//! `tests/tests/cluster_*.rs`.
//!
//! [`use_cluster`] starts it (once per test binary; a no-op when it runs
//! already) and points the harness at it: from then on `streamctl` runs as
//! the cluster's admin user and [`crate::Service::start`] runs each service
//! binary as its own user, with the flags `make cluster-up` wrote (SCRAM).
//! [`flags_for`] gives a user's flags for another [`Login`], and [`AsUser`]
//! runs a fixture (`crate::fixture_runs`) with one, inputs and output
//! compressed with a chosen codec.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::fixture_runs::Launcher;
use crate::{workspace, Service};

/// The cluster's Kafka users: the admin and one per service.
pub const USERS: [&str; 6] = [
    "admin",
    "sensor-fusion",
    "order-shipment-joiner",
    "sessionizer",
    "window-aggregator",
    "embed-batcher",
];

/// How a client logs in. Each maps to the same principal, `User:<user>`,
/// so the same ACLs apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Login {
    /// SASL_SSL with SCRAM-SHA-512: `<user>.flags`.
    Scram,
    /// SASL_SSL with PLAIN and the user's own PLAIN password: `<user>-plain.flags`.
    Plain,
    /// SASL_SSL with OAUTHBEARER, a token from the cluster's OIDC issuer
    /// (client id `<user>`, its own client secret): `<user>-oidc.flags`.
    Oidc,
    /// The SSL listener with a client certificate, CN=`<user>`, no SASL:
    /// `<user>-mtls.flags`.
    Mtls,
}

impl Login {
    /// What the cluster's file names carry after the user's name.
    fn suffix(self) -> &'static str {
        match self {
            Login::Scram => "",
            Login::Plain => "-plain",
            Login::Oidc => "-oidc",
            Login::Mtls => "-mtls",
        }
    }
}

static STARTED: OnceLock<()> = OnceLock::new();

/// Where `cluster.sh` keeps the cluster (`$STACK_HOME/cluster`).
pub fn home() -> PathBuf {
    let stack = std::env::var_os("STACK_HOME").unwrap_or_else(|| "/var/tmp/streams-stack".into());
    PathBuf::from(stack).join("cluster")
}

/// Starts the cluster if needed and makes the harness use it.
pub fn use_cluster() {
    STARTED.get_or_init(|| script(&["up"]));
}

/// Whether [`use_cluster`] was called in this process.
pub(crate) fn active() -> bool {
    STARTED.get().is_some()
}

/// The client flags of `user` (`admin` or a service), as `make cluster-up`
/// wrote them.
pub fn flags(user: &str) -> Vec<String> {
    flags_for(user, Login::Scram)
}

/// The client flags of `user` logging in with `login`: the bootstrap
/// servers of its listener, the registry, and its properties file.
pub fn flags_for(user: &str, login: Login) -> Vec<String> {
    let path = home().join(format!("{user}{}.flags", login.suffix()));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run make cluster-up", path.display()));
    text.split_whitespace().map(str::to_string).collect()
}

/// The properties file of `user` (credentials and TLS settings).
pub fn properties(user: &str) -> PathBuf {
    properties_for(user, Login::Scram)
}

/// The properties file of `user` logging in with `login`.
pub fn properties_for(user: &str, login: Login) -> PathBuf {
    home()
        .join("secrets")
        .join(format!("{user}{}.properties", login.suffix()))
}

/// The Kafka password of `user`, to check that it shows nowhere.
pub fn password(user: &str) -> String {
    let path = home().join("secrets").join(format!("{user}.password"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// Every secret of the cluster, from the files of `cluster/secrets/`: the
/// users' SCRAM passwords and the registry's (`<user>.password`), each
/// user's PLAIN password (`.plain-password`) and OIDC client secret
/// (`.oidc-secret`), the registry's bearer token (`.token`), and a line of
/// each private key (`.key`: the users' TLS client keys, the issuer's
/// signing key, ...), which any copy of the key shows.
pub fn passwords() -> Vec<String> {
    let dir = home().join("secrets");
    let mut secrets = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let text =
            || std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if [".password", ".plain-password", ".oidc-secret", ".token"]
            .iter()
            .any(|kind| name.ends_with(kind))
        {
            secrets.push(text().trim().to_string());
        } else if name.ends_with(".key") {
            let line = text().lines().nth(1).unwrap_or_default().to_string();
            assert!(line.len() >= 40, "{name}: not a PEM key");
            secrets.push(line);
        }
    }
    for user in USERS.iter().chain(&["registry"]) {
        assert!(secrets.contains(&password(user)), "no password of {user}");
    }
    secrets
}

/// Panics if `text` (a log, an HTTP answer) contains any of the cluster's
/// secrets ([`passwords`]) or an RS256 JWT, such as an OIDC access token.
pub fn assert_no_password(text: &str, what: &str) {
    for secret in passwords() {
        assert!(!text.contains(&secret), "a password shows in {what}");
    }
    // Base64url of `{"alg":"RS256"`, how every token of the issuer starts.
    assert!(
        !text.contains("eyJhbGciOiJSUzI1NiI"),
        "a JWT shows in {what}"
    );
}

/// kill -9 broker `n` (1-3).
pub fn kill(n: usize) {
    script(&["kill", &n.to_string()]);
}

/// Starts broker `n` again.
pub fn start(n: usize) {
    script(&["start", &n.to_string()]);
}

/// Restarts the brokers one at a time, each time waiting until every
/// partition is in sync again.
pub fn roll() {
    script(&["roll"]);
}

fn script(args: &[&str]) {
    let status = Command::new("bash")
        .arg(workspace().join("deploy/local/cluster.sh"))
        .args(args)
        .status()
        .expect("run cluster.sh");
    assert!(status.success(), "cluster.sh {args:?} failed");
}

/// The broker that leads `partition` of `topic` now.
pub fn leader(topic: &str, partition: i32) -> i32 {
    let description = crate::streamctl_ok(&["topics", "describe", topic]);
    description
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "partition" && words.next()?.parse::<i32>().ok()? == partition)
                .then(|| words.nth(1)?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no leader of {topic}-{partition} in:\n{description}"))
}

/// A [`Launcher`] for the fixture runs that starts each service as its own
/// user with `login`, writing its output compressed with `codec`
/// (`--compression-type`), and produces the inputs (as the admin, over
/// SCRAM) compressed with `codec` too. It keeps the topic names, for
/// [`AsUser::assert_compressed`].
pub struct AsUser {
    pub login: Login,
    /// librdkafka's `compression.type`: gzip, snappy, lz4, zstd.
    pub codec: &'static str,
    topics: RefCell<Vec<String>>,
}

impl AsUser {
    pub fn new(login: Login, codec: &'static str) -> Self {
        AsUser {
            login,
            codec,
            topics: RefCell::new(Vec::new()),
        }
    }

    /// Every batch of the run's inputs and output, on every broker, is
    /// compressed with the run's codec.
    pub fn assert_compressed(&self) {
        let topics = self.topics.borrow();
        assert!(topics.len() >= 2, "no inputs or no output seen: {topics:?}");
        for topic in topics.iter() {
            let codecs = batch_codecs(topic);
            assert_eq!(
                codecs,
                BTreeSet::from([self.codec.to_string()]),
                "the codecs of {topic}'s record batches"
            );
        }
    }
}

impl Launcher for AsUser {
    type Running = Service;

    fn start(&self, service: &'static str, arguments: &[String]) -> Service {
        if let Some(at) = arguments.iter().position(|a| a == "--output-topic") {
            self.topics.borrow_mut().push(arguments[at + 1].clone());
        }
        let mut arguments = arguments.to_vec();
        // Given here, these win over the user's SCRAM flags Service::start adds.
        arguments.extend(flags_for(service, self.login));
        arguments.extend(["--compression-type".to_string(), self.codec.to_string()]);
        Service::start(service, &arguments)
    }

    fn produce(&self, topic: &str, schema_topic: &str, lines: &[Value]) {
        self.topics.borrow_mut().push(topic.to_string());
        let codec = format!("compression.type={}", self.codec);
        crate::produce_with(topic, schema_topic, lines, &["--kafka", &codec]);
    }
}

/// The codecs of `topic`'s record batches (transaction markers left out),
/// as the brokers store them: Kafka's DumpLogSegments over every copy of
/// every partition in the nodes' log directories.
pub fn batch_codecs(topic: &str) -> BTreeSet<String> {
    let mut segments = Vec::new();
    for node in 1..=3 {
        let data = home().join(format!("node-{node}/data"));
        for entry in std::fs::read_dir(&data).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let is_partition = name
                .strip_prefix(topic)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|p| p.parse::<u32>().is_ok());
            if !is_partition {
                continue;
            }
            for file in std::fs::read_dir(entry.path()).unwrap().flatten() {
                if file.path().extension().is_some_and(|e| e == "log") {
                    segments.push(file.path().to_string_lossy().to_string());
                }
            }
        }
    }
    assert!(!segments.is_empty(), "no log segment of {topic}");
    let libs = home().parent().unwrap().join("kafka-libs/*");
    let output = Command::new("java")
        .args([
            "-Xmx256m",
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            "-cp",
        ])
        .arg(libs)
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            home().join("kafka/tools-log4j2.properties").display()
        ))
        .args(["org.apache.kafka.tools.DumpLogSegments", "--files"])
        .arg(segments.join(","))
        .output()
        .expect("run DumpLogSegments");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "DumpLogSegments: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let codecs: BTreeSet<String> = text
        .lines()
        .filter(|line| line.starts_with("baseOffset:") && line.contains("isControl: false"))
        .filter_map(|line| {
            let (_, rest) = line.split_once("compresscodec: ")?;
            Some(rest.split_whitespace().next()?.to_ascii_lowercase())
        })
        .collect();
    assert!(!codecs.is_empty(), "no record batch of {topic} in:\n{text}");
    codecs
}

/// Runs Kafka's AclCommand as the admin user once per line of `file`
/// (each line the arguments of one call), all at once.
pub fn acl_file(file: &std::path::Path) {
    script(&["acl", "--file", file.to_str().unwrap()]);
}

/// Waits for `service`, started at `started` with settings that cannot
/// work, to give up: within a minute, with a non-zero exit and no secret
/// in its log, which is returned.
pub fn expect_failure(service: crate::Service, started: std::time::Instant) -> String {
    let (status, log) = service
        .wait_exit(std::time::Duration::from_secs(60))
        .expect("the service must give up within a minute, not retry forever");
    assert!(!status.success(), "{log}");
    assert_no_password(&log, "the log");
    eprintln!("failed after {:?}", started.elapsed());
    log
}
