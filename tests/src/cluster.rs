//! The secured three-broker cluster of `deploy/local/cluster.sh` (SASL_SSL,
//! ACLs, a TLS registry with basic auth), for the tests in
//! `tests/tests/cluster_*.rs`.
//!
//! [`use_cluster`] starts it (once per test binary; a no-op when it runs
//! already) and points the harness at it: from then on `streamctl` runs as
//! the cluster's admin user and [`crate::Service::start`] runs each service
//! binary as its own user, with the flags `make cluster-up` wrote.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::workspace;

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
    let path = home().join(format!("{user}.flags"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run make cluster-up", path.display()));
    text.split_whitespace().map(str::to_string).collect()
}

/// The properties file of `user` (credentials and TLS settings).
pub fn properties(user: &str) -> PathBuf {
    home().join("secrets").join(format!("{user}.properties"))
}

/// The Kafka password of `user`, to check that it shows nowhere.
pub fn password(user: &str) -> String {
    let path = home().join("secrets").join(format!("{user}.password"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// Every password of the cluster: the users' and the registry's.
pub fn passwords() -> Vec<String> {
    [
        "admin",
        "registry",
        "sensor-fusion",
        "order-shipment-joiner",
        "sessionizer",
        "window-aggregator",
        "embed-batcher",
    ]
    .iter()
    .map(|user| password(user))
    .collect()
}

/// Panics if `text` (a log, an HTTP answer) contains any of the cluster's
/// passwords.
pub fn assert_no_password(text: &str, what: &str) {
    for secret in passwords() {
        assert!(!text.contains(&secret), "a password shows in {what}");
    }
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
