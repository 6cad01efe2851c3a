//! `<service> describe` and `<service> acls` tell the truth: each service,
//! run over its example data, creates exactly the internal topics its
//! description lists, and its ACL listing names them.

use std::collections::BTreeSet;
use std::process::Command;

use e2e_tests::fixture_runs::{self, tool_json, Recording};
use e2e_tests::*;
use serde_json::Value;

fn strings(value: &Value) -> BTreeSet<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item.as_str().unwrap().to_string())
        .collect()
}

/// Runs `fixture` and checks the topics its service created against its
/// description and ACL listing.
fn described_topics_are_created(fixture: fn(&Recording) -> Service) {
    let recording = Recording::default();
    let service = fixture(&recording);
    let (binary, arguments) = recording.last();
    let description = tool_json(binary, "describe", &arguments);
    let application_id = description["application_id"].as_str().unwrap().to_string();

    // The internal topics: every changelog, repartition and link topic, and
    // the dead letters, named from the stages.
    let mut described = BTreeSet::new();
    described.insert(
        description["dead_letter_topic"]
            .as_str()
            .unwrap()
            .to_string(),
    );
    for stage in description["stages"].as_array().unwrap() {
        for store in stage["stores"].as_array().unwrap() {
            described.insert(store["changelog"].as_str().unwrap().to_string());
        }
        for source in stage["sources"].as_array().unwrap() {
            if let Some(topic) = source["repartition_topic"].as_str() {
                described.insert(topic.to_string());
            }
        }
        if stage["sink"]["internal"].as_bool().unwrap() {
            described.insert(stage["sink"]["topic"].as_str().unwrap().to_string());
        }
    }
    let created: BTreeSet<String> = streamctl_ok(&["topics", "list"])
        .lines()
        .filter(|topic| topic.starts_with(&format!("{application_id}-")))
        .map(str::to_string)
        .collect();
    assert_eq!(created, described, "log:\n{}", service.log());

    // The ACLs cover the inputs and outputs by name and the internal
    // topics, groups and transactional ids by the application id.
    let acls = tool_json(binary, "acls", &arguments);
    let grants = acls["acls"].as_array().unwrap();
    let named = |kind: &str, name: &str| {
        grants
            .iter()
            .find(|grant| grant["resource_type"] == kind && grant["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} grant on {name} in {acls:#}"))
    };
    for input in description["stages"][0]["sources"].as_array().unwrap() {
        let grant = named("Topic", input["topic"].as_str().unwrap());
        assert_eq!(
            strings(&grant["operations"]),
            BTreeSet::from(["Read".into()])
        );
    }
    let internal = named("Topic", &format!("{application_id}-"));
    assert_eq!(internal["pattern_type"], "prefixed");
    assert_eq!(named("Group", &application_id)["operations"][0], "Read");
    assert_eq!(
        named("TransactionalId", &format!("{application_id}-"))["operations"][0],
        "Write"
    );
    let outputs = grants
        .iter()
        .filter(|grant| {
            strings(&grant["operations"]).contains("Write") && grant["pattern_type"] == "literal"
        })
        .count();
    assert_eq!(outputs, 1, "one output topic: {acls:#}");
}

#[test]
fn sensor_fusion_creates_what_it_describes() {
    described_topics_are_created(fixture_runs::sensor_fusion_on);
}

#[test]
fn order_shipment_joiner_creates_what_it_describes() {
    described_topics_are_created(fixture_runs::order_shipment_joiner_on);
}

#[test]
fn window_aggregator_creates_what_it_describes() {
    described_topics_are_created(fixture_runs::window_aggregator_on);
}

#[test]
fn deduplicator_creates_what_it_describes() {
    described_topics_are_created(fixture_runs::deduplicator_on);
}

/// The configs `streamctl topics describe` shows set on `topic`.
fn topic_configs(topic: &str) -> BTreeSet<String> {
    streamctl_ok(&["topics", "describe", topic])
        .lines()
        .filter_map(|line| line.trim().strip_prefix("config "))
        .map(str::to_string)
        .collect()
}

#[test]
fn internal_topics_are_made_as_the_flags_say() {
    let recording = Recording::with(args(&[
        "--internal-topic-replication-factor",
        "1",
        "--internal-topic-config",
        "max.message.bytes=2000000",
        "--changelog-topic-config",
        "segment.bytes=20000000",
        "--repartition-topic-config",
        "retention.ms=86400000",
    ]));
    fixture_runs::order_shipment_joiner_on(&recording);
    let (binary, arguments) = recording.last();
    let description = tool_json(binary, "describe", &arguments);
    let stage = &description["stages"][0];
    let set =
        |items: &[&str]| -> BTreeSet<String> { items.iter().map(|s| s.to_string()).collect() };
    for store in stage["stores"].as_array().unwrap() {
        assert_eq!(
            topic_configs(store["changelog"].as_str().unwrap()),
            set(&[
                "cleanup.policy=compact",
                "max.message.bytes=2000000",
                "segment.bytes=20000000"
            ])
        );
    }
    let repartition = stage["sources"][1]["repartition_topic"].as_str().unwrap();
    assert_eq!(
        topic_configs(repartition),
        set(&["max.message.bytes=2000000", "retention.ms=86400000"])
    );
    assert_eq!(
        topic_configs(description["dead_letter_topic"].as_str().unwrap()),
        set(&["max.message.bytes=2000000"])
    );
}

#[test]
fn the_text_description_names_stages_stores_and_timers() {
    let output = Command::new(bin("window-aggregator"))
        .args(["describe", "--application-id", "shop"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.starts_with("Service window-aggregator (application id shop, exactly_once_v2)"),
        "{text}"
    );
    assert!(
        text.contains("Stage 1: final (consumer group shop-final)"),
        "{text}"
    );
    assert!(text.contains("changelog shop-final-"), "{text}");
    assert!(text.contains("Dead letters: shop-dlq"), "{text}");

    let bad = Command::new(bin("sessionizer"))
        .args(["acls", "--format", "yaml"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid value 'yaml'"));
}

/// embed-batcher loads its model only when it runs: with no model files at
/// all, `describe` and `acls` still answer, while running it says what is
/// missing.
#[test]
fn embed_batcher_describes_itself_without_its_model() {
    let missing = scratch_dir().join(unique("no-model"));
    let missing = missing.to_str().unwrap();
    let embed_batcher = |args: &[&str]| {
        Command::new(bin("embed-batcher"))
            .args(args)
            .args(["--model-dir", missing])
            .output()
            .unwrap()
    };
    for tool in ["describe", "acls"] {
        let printed = embed_batcher(&[tool, "--format", "json"]);
        let stderr = String::from_utf8_lossy(&printed.stderr);
        assert!(printed.status.success(), "{tool}: {stderr}");
        let listing: Value = serde_json::from_slice(&printed.stdout).unwrap();
        assert_eq!(
            listing["application_id"], "embed-batcher",
            "{tool}: {listing}"
        );
    }

    let run = embed_batcher(&[]);
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains(missing), "{stderr}");
}
