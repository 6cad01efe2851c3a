//! The ACLs a service lists (`<service> acls`) are enough, and each is
//! needed: on the secured cluster, the user `acl-probe` (which holds no ACL
//! of its own) is granted exactly what the service lists for the run's
//! topics and application id, and the service runs with exact output;
//! granted all but one, it stops within a minute, naming what it lacks.
//! What a reset lists (`<service> acls --for reset`) is enough to reset it.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use e2e_tests::cluster;
use e2e_tests::fixture_runs::{self, Host, Launcher};
use e2e_tests::*;
use serde_json::Value;

const PROBE: &str = "acl-probe";

/// One test at a time: each grants ACLs with a handful of JVMs (Kafka's
/// AclCommand), which side by side starve the brokers on two cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serialized() -> MutexGuard<'static, ()> {
    cluster::use_cluster();
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// One grant: a resource and one operation on it.
#[derive(Debug, Clone, PartialEq)]
struct Grant {
    resource: String,
    name: String,
    pattern: String,
    operation: String,
}

/// What `service acls` lists for `arguments`, one grant per operation.
fn listed_grants(service: &str, arguments: &[String]) -> Vec<Grant> {
    listed_grants_for(service, arguments, "run")
}

/// [`listed_grants`] for `purpose` (`acls --for`).
fn listed_grants_for(service: &str, arguments: &[String], purpose: &str) -> Vec<Grant> {
    let output = std::process::Command::new(bin(service))
        .arg("acls")
        .args(arguments)
        .args(["--principal", &format!("User:{PROBE}"), "--format", "json"])
        .args(["--for", purpose])
        .output()
        .expect("run the service binary");
    assert!(output.status.success(), "{output:?}");
    let listing: Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut grants = Vec::new();
    for acl in listing["acls"].as_array().unwrap() {
        let resource = match acl["resource_type"].as_str().unwrap() {
            "Topic" => "--topic",
            "Group" => "--group",
            "TransactionalId" => "--transactional-id",
            other => panic!("resource type {other}"),
        };
        for operation in acl["operations"].as_array().unwrap() {
            grants.push(Grant {
                resource: resource.to_string(),
                name: acl["name"].as_str().unwrap().to_string(),
                pattern: acl["pattern_type"].as_str().unwrap().to_string(),
                operation: operation.as_str().unwrap().to_string(),
            });
        }
    }
    grants
}

/// Grants `grants` to the probe user: one AclCommand (a JVM) per resource
/// type, pattern and operation, naming every resource of that kind at once.
fn grant(grants: &[Grant]) {
    // (resource flag, pattern type, operation) and the names it covers.
    type Call<'a> = ((&'a str, &'a str, &'a str), Vec<&'a str>);
    let mut calls: Vec<Call<'_>> = Vec::new();
    for grant in grants {
        let kind = (
            grant.resource.as_str(),
            grant.pattern.as_str(),
            grant.operation.as_str(),
        );
        match calls.iter_mut().find(|(call, _)| *call == kind) {
            Some((_, names)) => names.push(&grant.name),
            None => calls.push((kind, vec![&grant.name])),
        }
    }
    let lines: Vec<String> = calls
        .iter()
        .map(|((resource, pattern, operation), names)| {
            let resources: String = names
                .iter()
                .map(|name| format!(" {resource} '{name}'"))
                .collect();
            format!(
                "--add --allow-principal 'User:{PROBE}'{resources} \
                 --resource-pattern-type {pattern} --operation {operation}"
            )
        })
        .collect();
    let file = scratch_dir().join(format!("{}.acls", unique("grants")));
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    cluster::acl_file(&file);
}

/// The probe user's arguments: its own credentials win over the service's.
fn as_probe(arguments: &[String]) -> Vec<String> {
    let mut arguments = arguments.to_vec();
    arguments.extend(args(&[
        "--kafka-config-file",
        cluster::properties(PROBE).to_str().unwrap(),
    ]));
    arguments
}

/// Starts each service as the probe user, granted what it lists for the
/// run, and nothing else.
struct ExactlyListed;

impl Launcher for ExactlyListed {
    type Running = Service;

    fn start(&self, service: &'static str, arguments: &[String]) -> Service {
        grant(&listed_grants(service, arguments));
        Host.start(service, &as_probe(arguments))
    }
}

#[test]
fn the_listed_acls_run_the_joiner() {
    let _one = serialized();
    let service = fixture_runs::order_shipment_joiner_on(&ExactlyListed);
    cluster::assert_no_password(&service.log(), "the log");
}

/// The joiner runs on the example data as its own user; then the probe
/// user, granted exactly what `acls --for reset` lists, resets it: the
/// internal topics deleted and the offsets of the input and the
/// repartition topic committed anew.
#[test]
fn the_listed_reset_acls_reset_the_joiner() {
    let _one = serialized();
    let recording = fixture_runs::Recording::default();
    let service = fixture_runs::order_shipment_joiner_on(&recording);
    let (binary, arguments) = recording.last();
    let application_id = flag(&arguments, "--application-id").to_string();
    assert!(service.stop().success());
    grant(&listed_grants_for(binary, &arguments, "reset"));
    let state_dir = scratch_dir().join(unique("reset-state"));
    let output = std::process::Command::new(bin(binary))
        .arg("reset")
        .args(&arguments)
        .args(cluster::flags(PROBE))
        .args(["--to-earliest", "--state-dir", state_dir.to_str().unwrap()])
        .output()
        .expect("run the service binary");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stderr}\n{stdout}");
    assert!(
        stdout.contains(&format!(
            "Consumer group {application_id}: offsets committed"
        )),
        "{stdout}"
    );
    let repartition = format!("{application_id}-shipments-by-order-repartition");
    assert!(
        stdout.contains(&format!("  {repartition} partition 0: ")),
        "the repartition topic's offsets:\n{stdout}"
    );
    assert!(
        stdout.contains("Deleted: internal topics")
            && stdout.contains(&format!("\n  {repartition}\n")),
        "{stdout}"
    );
    cluster::assert_no_password(&format!("{stdout}{stderr}"), "the reset's output");
}

#[test]
fn the_listed_acls_run_both_stages_of_the_window_aggregator() {
    let _one = serialized();
    fixture_runs::window_aggregator_on(&ExactlyListed);
}

#[test]
fn the_listed_acls_run_sensor_fusion() {
    let _one = serialized();
    fixture_runs::sensor_fusion_on(&ExactlyListed);
}

/// The joiner (two inputs, a repartition topic, changelogs, transactions)
/// granted all it lists but one, for each one: it stops, naming the
/// resource. The runs go side by side, each on its own topics and
/// application id. All but the groups `<app-id>-` (prefixed): with one
/// stage they are only those of the consumers that read changelogs by
/// assignment and commit nothing, which go on when denied (librdkafka
/// reports it once); a later stage's group is among them, and the
/// window-aggregator's run above needs it.
#[test]
fn the_joiner_without_any_one_listed_acl_stops_naming_it() {
    let _one = serialized();
    let readers_groups = |grant: &Grant| {
        grant.resource == "--group" && grant.pattern.eq_ignore_ascii_case("prefixed")
    };
    let listed = listed_grants("order-shipment-joiner", &joiner_arguments("aclprobe"));
    let omissions: Vec<usize> = (0..listed.len())
        .filter(|&index| !readers_groups(&listed[index]))
        .collect();
    assert_eq!(omissions.len() + 1, listed.len(), "{listed:?}");
    let mut runs = Vec::new();
    let mut granted = Vec::new();
    for omitted in omissions {
        let arguments = joiner_arguments(&format!("aclprobe{omitted}"));
        let [_, orders, _, shipments, ..] = &arguments[..] else {
            unreachable!()
        };
        create_topic(orders, 1);
        create_topic(shipments, 1);
        produce(
            orders,
            "orders",
            &fixture("order-shipment-joiner/orders.jsonl")[..1],
        );
        produce(
            shipments,
            "shipments",
            &fixture("order-shipment-joiner/shipments.jsonl")[..1],
        );
        let mut grants = listed_grants("order-shipment-joiner", &arguments);
        let missing = grants.remove(omitted);
        granted.extend(grants);
        runs.push((arguments, missing));
    }
    grant(&granted);
    let started = Instant::now();
    let services: Vec<Service> = runs
        .iter()
        .map(|(arguments, _)| Host.start("order-shipment-joiner", &as_probe(arguments)))
        .collect();
    for (service, (_, missing)) in services.into_iter().zip(runs) {
        let (status, log) = service
            .wait_exit(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("without {missing:?} the joiner must stop"));
        eprintln!(
            "without {missing:?}: stopped within {:?}",
            started.elapsed()
        );
        assert!(!status.success(), "{log}");
        assert!(
            log.contains("not authorized"),
            "without {missing:?}:\n{log}"
        );
        let named = missing.name.trim_end_matches('-');
        assert!(
            log.contains(named),
            "without {missing:?}, {named} is named:\n{log}"
        );
        cluster::assert_no_password(&log, "the log");
    }
}

/// The joiner's arguments for a run named `run`: its topics and
/// application id, unique, starting with `run`.
fn joiner_arguments(run: &str) -> Vec<String> {
    args(&[
        "--orders-topic",
        &unique(&format!("{run}-orders")),
        "--shipments-topic",
        &unique(&format!("{run}-shipments")),
        "--output-topic",
        &unique(&format!("{run}-shipped")),
        "--application-id",
        &unique(run),
    ])
}
