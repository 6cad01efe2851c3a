//! window-aggregator end to end: the fixture, generated data against a model
//! of docs/services/window-aggregator.md (global and grouped), the final
//! stage waiting for the slowest partition, a crash between stages, and flag
//! checks.

use std::time::Duration;

use e2e_tests::windows::{generate, model, Order, WindowRules};
use e2e_tests::*;
use serde_json::Value;

fn topics(partitions: usize) -> SingleInputRun {
    SingleInputRun::new(
        "window-aggregator",
        "orders-marketplace",
        "order-window-counts",
        partitions,
    )
}

fn lines(orders: &[Order]) -> Vec<Value> {
    orders.iter().map(Order::line).collect()
}

const T: i64 = 1_783_345_153_000;

/// A run on generated orders: its topics, the orders, the rows a model of
/// the service's rules expects, and the service arguments that match `rules`.
struct ModelRun {
    topics: SingleInputRun,
    orders: Vec<Order>,
    expected: Vec<Value>,
    arguments: Vec<String>,
}

/// `count` orders over `customers`, disordered within the rules' bound.
fn model_run(rules: WindowRules, count: usize, customers: usize) -> ModelRun {
    let orders = generate(count, customers, T, rules.max_out_of_orderness);
    let expected = model(&orders, rules);
    let topics = topics(rules.partitions);
    let (size, advance, bound) = (
        format!("{}ms", rules.size),
        format!("{}ms", rules.advance),
        format!("{}ms", rules.max_out_of_orderness),
    );
    let mut flags = vec![
        "--window-size",
        &size,
        "--window-advance",
        &advance,
        "--max-out-of-orderness",
        &bound,
    ];
    if rules.by_customer {
        flags.extend(["--group-by", "customer_id"]);
    }
    let arguments = topics.args(&flags);
    ModelRun {
        topics,
        orders,
        expected,
        arguments,
    }
}

impl ModelRun {
    fn produce(&self) {
        produce(
            &self.topics.input,
            "orders-marketplace",
            &lines(&self.orders),
        );
    }

    fn start(&self) -> Service {
        Service::start("window-aggregator", &self.arguments)
    }

    /// Waits (up to `timeout`) for as many rows as the model expects, checks
    /// they are the model's rows in any order (showing `log()` if not), and
    /// returns them in output order.
    fn assert_model_rows(&self, timeout: Duration, log: impl FnOnce() -> String) -> Vec<Value> {
        let output = wait_for_records(&self.topics.output, self.expected.len(), timeout);
        assert_same_records(&output, &self.expected, &log());
        output
    }
}

/// The `field` (`window_start` or `window_end`) of every row, in output order.
fn window_times(output: &[Value], field: &str) -> Vec<i64> {
    output
        .iter()
        .map(|row| row["value"][field].as_i64().unwrap())
        .collect()
}

#[test]
fn fixture_gives_the_expected_windows_in_order() {
    let topics = topics(1);
    let service = topics.start(&[]);
    produce(
        &topics.input,
        "orders-marketplace",
        &fixture("window-aggregator/orders-marketplace.jsonl"),
    );
    let expected = fixture("window-aggregator/order-window-counts.expected.jsonl");
    let output = wait_for_records(&topics.output, expected.len(), Duration::from_secs(60));
    assert_eq!(output, expected, "log:\n{}", service.log());
}

#[test]
fn global_windows_over_four_partitions_match_a_model_of_the_rules() {
    let rules = WindowRules {
        size: 2_000,
        advance: 500,
        max_out_of_orderness: 300,
        partitions: 4,
        by_customer: false,
    };
    let run = model_run(rules, 5_000, 50);
    // An output topic of several partitions: keyless rows all go to partition
    // 0, so they stay in window order.
    create_topic(&run.topics.output, 3);
    let service = run.start();
    run.produce();
    let output = run.assert_model_rows(Duration::from_secs(120), || service.log());
    let starts = window_times(&output, "window_start");
    assert!(
        starts.windows(2).all(|pair| pair[0] < pair[1]),
        "one final task emits windows in time order"
    );
    let late_series = format!(
        "streams_records_late_total{{topic=\"{}\"}}",
        run.topics.input
    );
    assert!(
        eventually(Duration::from_secs(20), || service.metric(&late_series)
            > 0.0),
        "stragglers are counted as late:\n{}\n{}",
        service.metrics(),
        service.log()
    );
}

#[test]
fn grouped_by_customer_over_three_partitions_match_a_model_of_the_rules() {
    let rules = WindowRules {
        size: 2_000,
        advance: 1_000,
        max_out_of_orderness: 200,
        partitions: 3,
        by_customer: true,
    };
    let run = model_run(rules, 4_000, 20);
    assert!(
        run.expected.iter().any(|row| row["key"].is_null()),
        "the null customer is a group of its own"
    );
    let service = run.start();
    run.produce();
    run.assert_model_rows(Duration::from_secs(120), || service.log());
}

#[test]
fn grouped_windows_come_out_in_end_order_across_groups() {
    // Windows three advances long: a group that falls behind another has
    // several windows ending by the time the other's first one ends.
    let rules = WindowRules {
        size: 3_000,
        advance: 1_000,
        max_out_of_orderness: 0,
        partitions: 1,
        by_customer: true,
    };
    let run = model_run(rules, 3_000, 20);
    // All orders are there before the service starts, so the final stage
    // sees the watermark jump over many windows of every group at once.
    run.produce();
    let service = run.start();
    let output = run.assert_model_rows(Duration::from_secs(120), || service.log());
    let ends = window_times(&output, "window_end");
    let disorder = ends.windows(2).position(|pair| pair[0] > pair[1]);
    assert_eq!(
        disorder, None,
        "one task's timers fire in time order, whatever the group"
    );
}

/// An order whose key lands in `partition` of `partitions`.
fn order_in_partition(partition: usize, partitions: usize, time: i64, index: &mut usize) -> Order {
    loop {
        *index += 1;
        let id = format!("order-{index}");
        if murmur2_partition(id.as_bytes(), partitions) == partition {
            return Order {
                order_id: id,
                customer_id: Some("c".into()),
                product_id: "p".into(),
                price: 1.0,
                order_time: time,
            };
        }
    }
}

#[test]
fn the_final_stage_waits_for_the_slowest_partition() {
    let topics = topics(2);
    let service = topics.start(&[]);
    let mut index = 0;
    // Partition 0 runs far ahead; partition 1 stays inside the first windows.
    let ahead = order_in_partition(0, 2, T + 60_000, &mut index);
    let behind = order_in_partition(1, 2, T + 500, &mut index);
    produce(
        &topics.input,
        "orders-marketplace",
        &lines(&[behind, ahead]),
    );
    service.wait_ready(Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        consume_all(&topics.output).is_empty(),
        "partition 1's watermark holds every window open"
    );
    let caught_up = order_in_partition(1, 2, T + 2_000, &mut index);
    produce(&topics.input, "orders-marketplace", &lines(&[caught_up]));
    // Partition 1's watermark is now T+2000: the windows ending by then close.
    let output = wait_for_records(&topics.output, 2, Duration::from_secs(30));
    let ends = window_times(&output, "window_end");
    assert_eq!(ends, [T + 1_000, T + 2_000], "log:\n{}", service.log());
}

#[test]
fn with_an_idle_timeout_a_partition_without_data_stops_holding_windows_open() {
    let rules = WindowRules {
        size: 2_000,
        advance: 1_000,
        max_out_of_orderness: 0,
        partitions: 1,
        by_customer: false,
    };
    // Only orders of partition 0 of 2: partition 1 never receives anything.
    let orders: Vec<Order> = generate(2_000, 20, T, 0)
        .into_iter()
        .filter(|order| murmur2_partition(order.order_id.as_bytes(), 2) == 0)
        .collect();
    // What the rules expect of partition 0 alone once it is idle too: its
    // watermark moves on with wall-clock time and closes every window, as
    // an order far ahead would.
    let mut closing = orders.clone();
    closing.push(Order {
        order_time: T + 3_600_000,
        ..orders[0].clone()
    });
    let expected = model(&closing, rules);
    assert!(!expected.is_empty());
    let topics = topics(2);
    let service = topics.start(&["--idle-timeout", "2s"]);
    produce(&topics.input, "orders-marketplace", &lines(&orders));
    let output = wait_for_records(&topics.output, expected.len(), Duration::from_secs(60));
    assert_same_records(&output, &expected, &service.log());
}

#[test]
fn a_crash_between_the_stages_loses_and_duplicates_nothing() {
    let rules = WindowRules {
        size: 2_000,
        advance: 1_000,
        max_out_of_orderness: 100,
        partitions: 2,
        by_customer: false,
    };
    let run = model_run(rules, 20_000, 50);
    let state = fresh_state_dir();
    let first = Service::start_with_state("window-aggregator", &run.arguments, state.clone());
    run.produce();
    assert!(
        eventually(Duration::from_secs(60), || consume_all(&run.topics.output)
            .len()
            > 20),
        "some windows come out before the crash:\n{}",
        first.log()
    );
    first.kill();
    let second = Service::start_with_state("window-aggregator", &run.arguments, state);
    run.assert_model_rows(Duration::from_secs(180), || second.log());
}

#[test]
fn an_advance_longer_than_the_window_is_refused_at_startup() {
    let topics = topics(1);
    let service = topics.start(&["--window-size", "1s", "--window-advance", "2s"]);
    let (status, log) = service
        .wait_exit(Duration::from_secs(30))
        .expect("the service exits");
    assert!(!status.success());
    assert!(
        log.contains("--window-advance (2000ms) must not exceed --window-size (1000ms)"),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn two_instances_share_the_partial_stage_and_one_runs_the_final_task() {
    let rules = WindowRules {
        size: 2_000,
        advance: 1_000,
        max_out_of_orderness: 100,
        partitions: 4,
        by_customer: false,
    };
    let run = model_run(rules, 5_000, 50);
    let first = run.start();
    let second = run.start();
    first.wait_ready(Duration::from_secs(60));
    second.wait_ready(Duration::from_secs(60));
    run.produce();
    run.assert_model_rows(Duration::from_secs(120), || {
        format!("{}\n---\n{}", first.log(), second.log())
    });
    // Partial tasks: four in all, on both instances; the final task: one.
    let count = |service: &Service, final_stage: bool| {
        service
            .metrics()
            .lines()
            .filter(|line| line.starts_with("streams_timers_pending{task="))
            .filter(|line| line.contains("stage=\"final\"") == final_stage)
            .count()
    };
    assert!(
        eventually(Duration::from_secs(10), || {
            let partial = (count(&first, false), count(&second, false));
            let last = count(&first, true) + count(&second, true);
            partial.0 >= 1 && partial.1 >= 1 && partial.0 + partial.1 == 4 && last == 1
        }),
        "tasks spread over both instances:\n{}\n{}",
        first.metrics(),
        second.metrics()
    );
}
