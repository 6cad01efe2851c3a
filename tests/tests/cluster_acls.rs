//! The ACLs a service lists (`<service> acls`) are enough, and each is
//! needed: on the secured cluster, the user `acl-probe` (which holds no ACL
//! of its own) is granted exactly what the service lists for the run's
//! topics and application id, and the service runs with exact output;
//! granted all but one, it stops within a minute, naming what it lacks.

use std::time::{Duration, Instant};

use e2e_tests::cluster;
use e2e_tests::fixture_runs::{self, Host, Launcher};
use e2e_tests::*;
use serde_json::Value;

const PROBE: &str = "acl-probe";

/// One grant: a resource and one operation on it, as `kafka-acls` arguments.
#[derive(Debug, Clone, PartialEq)]
struct Grant {
    resource: String,
    name: String,
    pattern: String,
    operation: String,
}

impl Grant {
    fn kafka_acls_args(&self) -> String {
        format!(
            "--add --allow-principal 'User:{PROBE}' {} '{}' --resource-pattern-type {} --operation {}",
            self.resource, self.name, self.pattern, self.operation
        )
    }
}

/// What `service acls` lists for `arguments`, one grant per operation.
fn listed_grants(service: &str, arguments: &[String]) -> Vec<Grant> {
    let output = std::process::Command::new(bin(service))
        .arg("acls")
        .args(arguments)
        .args(["--principal", &format!("User:{PROBE}"), "--format", "json"])
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

/// Grants `grants` to the probe user, all at once.
fn grant(grants: &[Grant]) {
    let file = scratch_dir().join(format!("{}.acls", unique("grants")));
    let lines: Vec<String> = grants.iter().map(Grant::kafka_acls_args).collect();
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
    cluster::use_cluster();
    let service = fixture_runs::order_shipment_joiner_on(&ExactlyListed);
    cluster::assert_no_password(&service.log(), "the log");
}

#[test]
fn the_listed_acls_run_both_stages_of_the_window_aggregator() {
    cluster::use_cluster();
    fixture_runs::window_aggregator_on(&ExactlyListed);
}

#[test]
fn the_listed_acls_run_sensor_fusion() {
    cluster::use_cluster();
    fixture_runs::sensor_fusion_on(&ExactlyListed);
}

/// The joiner (two inputs, a repartition topic, changelogs, transactions)
/// granted all it lists but one, for each one: it stops, naming the
/// resource.
#[test]
fn the_joiner_without_any_one_listed_acl_stops_naming_it() {
    cluster::use_cluster();
    let listed = listed_grants("order-shipment-joiner", &joiner_arguments("aclprobe")).len();
    for omitted in 0..listed {
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
        grant(&grants);
        let started = Instant::now();
        let service = Host.start("order-shipment-joiner", &as_probe(&arguments));
        let (status, log) = service
            .wait_exit(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("without {missing:?} the joiner must stop"));
        eprintln!("without {missing:?}: stopped after {:?}", started.elapsed());
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
