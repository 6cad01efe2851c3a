//! The series an operator pages on, read from a running service: consumer
//! lag per input partition while a backlog is worked off, rebalances,
//! readiness, end-to-end latency, build and process information, and
//! RocksDB's memory and disk. (Restore progress is read
//! during a restore in signals.rs; a stalled thread's `/healthz` in
//! embed_batcher.rs.)

use std::time::{Duration, Instant};

use e2e_tests::sessions::generate;
use e2e_tests::*;

const BASE: i64 = 1_783_345_153_000;
const PARTITIONS: usize = 3;

#[test]
fn lag_rises_with_a_backlog_and_falls_to_zero_on_every_input_partition() {
    let run = SingleInputRun::new("sessionizer", "user-events", "user-sessions", PARTITIONS);
    let (lines, expected) = generate(10_000, 20, BASE);
    let produced = Instant::now();
    produce(&run.input, "user-events", &lines);
    let service = Service::start("sessionizer", &run.args(&[]));
    let lag = |text: &str, partition: usize| {
        metric_value(
            text,
            &format!(
                "streams_consumer_lag_records{{topic=\"{}\",partition=\"{partition}\"}}",
                run.input
            ),
        )
    };
    let consumed = format!("streams_records_consumed_total{{topic=\"{}\"}}", run.input);
    let mut most_behind = 0.0_f64;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let text = service.metrics();
        most_behind = most_behind.max((0..PARTITIONS).map(|p| lag(&text, p)).sum());
        if metric_value(&text, &consumed) >= lines.len() as f64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "backlog not consumed:\n{}",
            service.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        most_behind > 0.0,
        "no lag seen while {} records were worked off",
        lines.len()
    );
    assert!(
        eventually(Duration::from_secs(30), || {
            let text = service.metrics();
            (0..PARTITIONS).all(|p| {
                text.contains(&format!(
                    "streams_consumer_lag_records{{topic=\"{}\",partition=\"{p}\"}} 0\n",
                    run.input
                ))
            })
        }),
        "every partition's lag should be reported and reach 0:\n{}",
        service.metrics()
    );
    println!("most behind: {most_behind} records");
    let output = wait_for_records(&run.output, expected.len(), Duration::from_secs(60));
    assert_same_records(&output, &expected, &service.log());

    let text = service.metrics();
    assert!(
        metric_value(&text, "streams_rebalances_total") >= 1.0,
        "{text}"
    );
    assert_eq!(metric_value(&text, "streams_ready"), 1.0, "{text}");
    assert!(
        text.lines()
            .any(|line| line.starts_with("streams_build_info{version=\"0.")
                && line.ends_with(",commit=\"unknown\"} 1")),
        "a development build: {text}"
    );
    assert!(
        metric_value(&text, "process_cpu_seconds_total") > 0.0,
        "{text}"
    );
    assert!(
        metric_value(&text, "process_resident_memory_bytes") > 1e6,
        "{text}"
    );
    let started = metric_value(&text, "process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - 600.0..=now).contains(&started),
        "started at {started}, now {now}"
    );
    assert!(
        metric_value(&text, "streams_stalled_seconds") < 5.0,
        "{text}"
    );

    // End-to-end latency: every input record, from its timestamp (when it
    // was produced, before the service started) to its commit.
    let records = metric_value(&text, "streams_e2e_latency_records_total");
    assert_eq!(records, lines.len() as f64, "{text}");
    let mean = metric_value(&text, "streams_e2e_latency_seconds_total") / records;
    let since_produced = produced.elapsed().as_secs_f64();
    assert!(
        mean > 0.0 && mean < since_produced,
        "mean end-to-end latency {mean} s, {since_produced} s since the input was produced"
    );

    // The clients' round trips to the broker, from librdkafka's statistics
    // (every 15 s): the consumer's and the producer's.
    for client in ["consumer", "producer"] {
        let series = format!("streams_kafka_request_latency_seconds{{client=\"{client}\",broker=");
        assert!(
            eventually(Duration::from_secs(40), || {
                service.metrics().lines().any(|line| {
                    line.starts_with(&series)
                        && line.contains("quantile=\"0.99\"")
                        && line
                            .rsplit_once(' ')
                            .and_then(|(_, value)| value.parse::<f64>().ok())
                            .is_some_and(|seconds| seconds > 0.0 && seconds < 10.0)
                })
            }),
            "no round trip of the {client}:\n{}",
            service.metrics()
        );
    }

    // RocksDB: the block cache is the default budget's twelve sixteenths
    // (256 MiB), memtables charged to it; each task wrote to its memtables.
    let cache = |kind: &str| {
        metric_value(
            &text,
            &format!("streams_rocksdb_block_cache_bytes{{kind=\"{kind}\"}}"),
        )
    };
    assert_eq!(cache("capacity"), (192u64 << 20) as f64, "{text}");
    assert!(cache("usage") > 0.0, "{text}");
    for task in 0..PARTITIONS {
        let series =
            |kind: &str| format!("streams_rocksdb_bytes{{task=\"{task}\",kind=\"{kind}\"}}");
        assert!(metric_value(&text, &series("memtables")) > 0.0, "{text}");
        for kind in ["live_sst_files", "pending_compaction"] {
            assert!(text.contains(&format!("{} ", series(kind))), "{text}");
        }
    }
}
