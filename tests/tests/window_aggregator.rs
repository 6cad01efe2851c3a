//! window-aggregator end to end, what needs Kafka: the fixture through the
//! binary, and two instances sharing the partial stage while one runs the
//! final task. The rules of docs/services/window-aggregator.md (windows,
//! groups, lateness, the final stage waiting for the slowest partition, the
//! idle timeout, crashes between the stages, the random models) are tested
//! on the test driver, in driver_window_aggregator.rs.

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

/// A kill -9 under a backlog: the restarted instance restores its windows
/// from the changelogs and takes the rest of the input at once; every
/// window comes out exactly once, and no commit is aborted.
#[test]
fn a_backlog_after_a_kill_9_comes_out_exact() {
    let rules = WindowRules {
        size: 2_000,
        advance: 1_000,
        max_out_of_orderness: 100,
        partitions: 2,
        by_customer: true,
    };
    let run = model_run(rules, 60_000, 500);
    run.produce();
    let second = restart_after_kill_9_under_backlog(
        "window-aggregator",
        &run.arguments,
        &run.topics.input,
        20_000,
    );
    run.assert_model_rows(Duration::from_secs(180), || second.log());
    second.assert_no_aborted_commit();
}
