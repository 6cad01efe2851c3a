//! window-aggregator's rules (docs/services/window-aggregator.md) on the
//! broker-free test driver: both stages, the stage link, several input
//! partitions, crashes and a manual wall clock, with exact outputs.
//!
//! The final stage learns the partial tasks' watermarks from the stamps on
//! their partials and from announcements at commit, so a test settles
//! (advances the clock and commits) before it reads final rows.

mod common;

use std::time::Duration;

use common::driver::{driver, lines, pipe_all, settings, settle};
use e2e_tests::windows::{expect, generate, model, Order, WindowRules};
use e2e_tests::{assert_same_records, fixture, murmur2_partition};
use serde_json::{json, Value};
use streams_runtime::avro::{leak_schema, split_wire_format};
use streams_runtime::metrics;
use streams_runtime::testing::TestDriver;
use window_aggregator::Settings;

const INPUT: &str = "orders-marketplace";
const OUTPUT: &str = "order-window-counts";
const LATE: &str = "late-orders";
/// A whole second, so that windows of 1 s advance start at `T + k × 1000`.
const T: i64 = 1_783_345_153_000;

/// window-aggregator with `flags`, over an input of `partitions` partitions.
fn start(flags: &[&str], partitions: usize) -> TestDriver {
    let settings: Settings = settings("window-aggregator", flags);
    driver(window_aggregator::pipeline(settings), partitions)
}

/// Pipes `order` (keyed by its id) to `partition` of the input.
fn pipe_to(driver: &mut TestDriver, partition: i32, order: &Order) {
    let line = order.line();
    driver
        .pipe_to(
            INPUT,
            partition,
            line["key"].as_str(),
            line["value"].clone(),
        )
        .expect("pipe");
}

/// Pipes each order to the partition its id hashes to.
fn pipe_orders(driver: &mut TestDriver, orders: &[Order]) {
    let lines: Vec<Value> = orders.iter().map(Order::line).collect();
    pipe_all(driver, INPUT, &lines);
}

/// An output row: `group` is the key and the `group` field.
#[allow(clippy::too_many_arguments)]
fn row(
    start: i64,
    end: i64,
    group: Option<&str>,
    count: i64,
    sum: f64,
    min: f64,
    max: f64,
    mean: f64,
) -> Value {
    json!({"key": group, "value": {"window_start": start, "window_end": end, "group": group,
        "count": count, "price_sum": sum, "price_min": min, "price_max": max,
        "price_mean": mean}})
}

/// A row of a window holding one order of `price`.
fn single(start: i64, end: i64, group: Option<&str>, count: i64, price: f64) -> Value {
    row(start, end, group, count, price, price, price, price)
}

fn late_count(driver: &TestDriver) -> u64 {
    driver.counter(metrics::RECORDS_LATE, &[("topic", INPUT)])
}

/// The `field` (`window_start` or `window_end`) of every row.
fn window_times(rows: &[Value], field: &str) -> Vec<i64> {
    rows.iter()
        .map(|row| row["value"][field].as_i64().unwrap())
        .collect()
}

/// `--window-size`, `--window-advance`, `--max-out-of-orderness` and
/// `--group-by` as `rules` say.
fn rule_flags(rules: WindowRules) -> Vec<String> {
    let mut flags = vec![
        "--window-size".to_string(),
        format!("{}ms", rules.size),
        "--window-advance".to_string(),
        format!("{}ms", rules.advance),
        "--max-out-of-orderness".to_string(),
        format!("{}ms", rules.max_out_of_orderness),
    ];
    if rules.by_customer {
        flags.extend(["--group-by".to_string(), "customer_id".to_string()]);
    }
    flags
}

fn start_with_rules(rules: WindowRules, extra: &[&str]) -> TestDriver {
    let flags = rule_flags(rules);
    let mut all: Vec<&str> = flags.iter().map(String::as_str).collect();
    all.extend(extra);
    start(&all, rules.partitions)
}

/// Pipes `orders`, advancing the clock by a commit interval (so
/// committing) every `commit_every` orders, then settles.
fn run_orders(driver: &mut TestDriver, orders: &[Order], commit_every: usize) {
    for chunk in orders.chunks(commit_every) {
        pipe_orders(driver, chunk);
        driver
            .advance_time(Duration::from_millis(100))
            .expect("advance time");
    }
    settle(driver);
}

#[test]
fn fixture_gives_the_expected_windows() {
    let mut driver = start(&[], 1);
    pipe_all(
        &mut driver,
        INPUT,
        &fixture("window-aggregator/orders-marketplace.jsonl"),
    );
    settle(&mut driver);
    assert_eq!(
        lines(&driver, OUTPUT),
        fixture("window-aggregator/order-window-counts.expected.jsonl")
    );
}

/// The worked example's grouped table: the first window gives the null
/// group, c1 and c2, in that order; the whole output is the model's.
#[test]
fn fixture_grouped_by_customer_gives_one_row_per_group_null_group_first() {
    let input = fixture("window-aggregator/orders-marketplace.jsonl");
    let mut driver = start(&["--group-by", "customer_id"], 1);
    pipe_all(&mut driver, INPUT, &input);
    settle(&mut driver);
    let output = lines(&driver, OUTPUT);
    let first = 1_742_290_977_000;
    let end = first + 2_000;
    assert_eq!(
        output[..3],
        [
            single(first, end, None, 0, 5.0),
            single(first, end, Some("c1"), 1, 10.0),
            single(first, end, Some("c2"), 1, 20.0),
        ]
    );
    let orders: Vec<Order> = input.iter().map(Order::from_line).collect();
    let rules = WindowRules {
        size: 2_000,
        advance: 1_000,
        max_out_of_orderness: 0,
        partitions: 1,
        by_customer: true,
    };
    assert_eq!(output, model(&orders, rules));
    assert_eq!(output.len(), 16);
}

/// Windows `[k × advance, k × advance + size)`: an order belongs to every
/// one containing it, also when the advance does not divide the size, and
/// not to the one ending at its time.
#[test]
fn an_order_belongs_to_every_window_containing_it_and_the_end_is_excluded() {
    // 3 s windows every 1 s: an order at T + 2000 is in the windows starting
    // at T, T + 1000 and T + 2000, not in [T - 1000, T + 2000).
    let mut driver = start(&["--window-size", "3s"], 1);
    pipe_to(&mut driver, 0, &Order::new("a", Some("c"), 1.0, T + 1_999));
    pipe_to(&mut driver, 0, &Order::new("b", Some("c"), 2.0, T + 2_000));
    pipe_to(&mut driver, 0, &Order::new("z", Some("c"), 0.5, T + 10_000));
    settle(&mut driver);
    let windows = |start: i64| (start, start + 3_000);
    let both = |start| {
        let (start, end) = windows(start);
        row(start, end, None, 2, 3.0, 1.0, 2.0, 1.5)
    };
    let only = |start, price| {
        let (start, end) = windows(start);
        single(start, end, None, 1, price)
    };
    assert_eq!(
        lines(&driver, OUTPUT),
        [
            only(T - 1_000, 1.0),
            both(T),
            both(T + 1_000),
            only(T + 2_000, 2.0),
        ]
    );

    // 2.5 s windows every 1 s: T + 200 is in three windows, T + 600 in two.
    let mut driver = start(&["--window-size", "2500ms"], 1);
    pipe_to(&mut driver, 0, &Order::new("a", Some("c"), 1.0, T + 200));
    pipe_to(&mut driver, 0, &Order::new("b", Some("c"), 2.0, T + 600));
    pipe_to(&mut driver, 0, &Order::new("z", Some("c"), 0.5, T + 10_000));
    settle(&mut driver);
    assert_eq!(
        lines(&driver, OUTPUT),
        [
            single(T - 2_000, T + 500, None, 1, 1.0),
            row(T - 1_000, T + 1_500, None, 2, 3.0, 1.0, 2.0, 1.5),
            row(T, T + 2_500, None, 2, 3.0, 1.0, 2.0, 1.5),
        ]
    );
}

/// `count` leaves out orders without a customer, the price statistics
/// include them, and a window of only such orders comes out with count 0.
#[test]
fn count_leaves_out_null_customers_and_prices_include_them() {
    let mut driver = start(&["--window-size", "1s"], 1);
    pipe_to(&mut driver, 0, &Order::new("a", Some("c1"), 4.0, T + 100));
    pipe_to(&mut driver, 0, &Order::new("b", None, 1.0, T + 200));
    pipe_to(&mut driver, 0, &Order::new("c", Some(""), 7.0, T + 300));
    pipe_to(&mut driver, 0, &Order::new("d", None, 3.0, T + 1_100));
    pipe_to(&mut driver, 0, &Order::new("e", None, 2.0, T + 1_900));
    pipe_to(&mut driver, 0, &Order::new("z", Some("c"), 9.0, T + 5_000));
    settle(&mut driver);
    assert_eq!(
        lines(&driver, OUTPUT),
        [
            // An empty customer id is not null: it counts.
            row(T, T + 1_000, None, 2, 12.0, 1.0, 7.0, 4.0),
            row(T + 1_000, T + 2_000, None, 0, 5.0, 2.0, 3.0, 2.5),
        ]
    );
}

/// `price_sum` is the exactly rounded sum, whatever the partitioning and the
/// order in which partials meet: 0.1 + 0.2 + 0.3 is 0.6 (a left-to-right sum
/// gives 0.6000000000000001), and 1e16 + 1 - 1e16 is 1 (not 0).
#[test]
fn sums_are_exactly_rounded_whatever_the_partitioning() {
    let sums = |partitions: usize, order: &[usize]| {
        let mut driver = start(&["--window-size", "1s"], partitions);
        let orders = [
            Order::new("a", Some("c"), 0.1, T + 100),
            Order::new("b", Some("c"), 0.2, T + 200),
            Order::new("c", Some("c"), 0.3, T + 300),
            Order::new("d", Some("c"), 1e16, T + 1_100),
            Order::new("e", Some("c"), 1.0, T + 1_200),
            Order::new("f", Some("c"), -1e16, T + 1_300),
        ];
        for (index, &i) in order.iter().enumerate() {
            pipe_to(&mut driver, (index % partitions) as i32, &orders[i]);
        }
        for partition in 0..partitions {
            let closing = Order::new(&format!("z{partition}"), None, 1.0, T + 9_000);
            pipe_to(&mut driver, partition as i32, &closing);
        }
        settle(&mut driver);
        lines(&driver, OUTPUT)
    };
    let expected = [
        row(T, T + 1_000, None, 3, 0.6, 0.1, 0.3, 0.19999999999999998),
        row(T + 1_000, T + 2_000, None, 3, 1.0, -1e16, 1e16, 1.0 / 3.0),
    ];
    assert_eq!(0.1 + 0.2 + 0.3, 0.6000000000000001, "the naive sum differs");
    assert_eq!(sums(1, &[0, 1, 2, 3, 4, 5]), expected);
    assert_eq!(sums(3, &[2, 0, 1, 5, 3, 4]), expected);
    assert_eq!(sums(4, &[1, 2, 0, 4, 5, 3]), expected);
}

/// With `--group-by customer_id`: one row per group and window; the null
/// group (null key, count 0) and the empty-string group are distinct; rows
/// with the same end come out null group first, then by the group's bytes.
#[test]
fn groups_of_one_end_come_out_null_first_then_in_byte_order() {
    let mut driver = start(&["--group-by", "customer_id"], 1);
    let customers = [Some("b"), Some("é"), None, Some("a"), Some(""), Some("B")];
    for (i, customer) in customers.iter().enumerate() {
        let order = Order::new(&format!("o{i}"), *customer, i as f64 + 1.0, T + 100);
        pipe_to(&mut driver, 0, &order);
    }
    pipe_to(&mut driver, 0, &Order::new("z", Some("z"), 1.0, T + 5_000));
    settle(&mut driver);
    let mut expected = Vec::new();
    for start in [T - 1_000, T] {
        let end = start + 2_000;
        expected.extend([
            single(start, end, None, 0, 3.0),
            single(start, end, Some(""), 1, 5.0),
            single(start, end, Some("B"), 1, 6.0),
            single(start, end, Some("a"), 1, 4.0),
            single(start, end, Some("b"), 1, 1.0),
            single(start, end, Some("é"), 1, 2.0),
        ]);
    }
    assert_eq!(lines(&driver, OUTPUT), expected);
}

/// `--group-by product_id` and `order_id` group by those fields; `count`
/// still counts orders with a customer.
#[test]
fn groups_by_product_and_by_order() {
    let orders = [
        Order {
            product_id: "p1".into(),
            ..Order::new("o1", Some("c1"), 2.0, T + 100)
        },
        Order {
            product_id: "p2".into(),
            ..Order::new("o2", None, 4.0, T + 200)
        },
        Order {
            product_id: "p1".into(),
            ..Order::new("o3", None, 6.0, T + 300)
        },
    ];
    let closing = Order {
        product_id: "p9".into(),
        ..Order::new("o9", Some("c9"), 1.0, T + 5_000)
    };
    let run = |field: &str| {
        let mut driver = start(&["--group-by", field, "--window-size", "1s"], 1);
        for order in orders.iter().chain([&closing]) {
            pipe_to(&mut driver, 0, order);
        }
        settle(&mut driver);
        lines(&driver, OUTPUT)
    };
    let (start, end) = (T, T + 1_000);
    assert_eq!(
        run("product_id"),
        [
            row(start, end, Some("p1"), 1, 8.0, 2.0, 6.0, 4.0),
            single(start, end, Some("p2"), 0, 4.0),
        ]
    );
    assert_eq!(
        run("order_id"),
        [
            single(start, end, Some("o1"), 1, 2.0),
            single(start, end, Some("o2"), 0, 4.0),
            single(start, end, Some("o3"), 0, 6.0),
        ]
    );
}

/// The worked example's lateness: after o9 (watermark …982100) an order at
/// …981500 still goes into [981000, 983000) but not into the closed
/// [980000, 982000); one at …978500 is late (counted, copied to the late
/// topic), as is one at …980999, whose windows end at …981000 and …982000.
/// With or without `--group-by`.
#[test]
fn late_orders_go_only_into_windows_that_have_not_ended() {
    let base = 1_742_290_000_000;
    let fixture_lines = fixture("window-aggregator/orders-marketplace.jsonl");
    let in_time = Order::new("x1", Some("c7"), 100.0, base + 981_500);
    let late = Order::new("x2", Some("c7"), 200.0, base + 978_500);
    let also_late = Order::new("x3", Some("c7"), 300.0, base + 980_999);
    let closing = Order::new("x9", Some("c7"), 1.0, base + 990_000);
    let extra = [in_time, late.clone(), also_late.clone(), closing];
    let mut orders: Vec<Order> = fixture_lines.iter().map(Order::from_line).collect();
    orders.extend(extra.iter().cloned());
    for group_by in [false, true] {
        let mut flags = vec!["--late-topic", LATE];
        if group_by {
            flags.extend(["--group-by", "customer_id"]);
        }
        let mut driver = start(&flags, 1);
        pipe_all(&mut driver, INPUT, &fixture_lines);
        for order in &extra {
            pipe_to(&mut driver, 0, order);
        }
        settle(&mut driver);
        assert_eq!(late_count(&driver), 2, "group by: {group_by}");
        assert_eq!(lines(&driver, LATE), [late.line(), also_late.line()]);
        let rules = WindowRules {
            size: 2_000,
            advance: 1_000,
            max_out_of_orderness: 0,
            partitions: 1,
            by_customer: group_by,
        };
        let expected = expect(&orders, rules);
        assert_eq!(expected.late, 2);
        assert_eq!(
            lines(&driver, OUTPUT),
            expected.rows,
            "group by: {group_by}"
        );
        if !group_by {
            let mut rows = fixture("window-aggregator/order-window-counts.expected.jsonl");
            rows.extend([
                // o8 (4.0), o9 (2.0) and x1 (100.0).
                row(
                    base + 981_000,
                    base + 983_000,
                    None,
                    3,
                    106.0,
                    2.0,
                    100.0,
                    106.0 / 3.0,
                ),
                single(base + 982_000, base + 984_000, None, 1, 2.0),
            ]);
            assert_eq!(expected.rows, rows);
        }
    }
}

/// An order at the watermark is on time in its windows that end after it;
/// an order whose last window ends exactly at the watermark is late.
#[test]
fn an_order_whose_last_window_ends_at_the_watermark_is_late() {
    let mut driver = start(&[], 1);
    pipe_to(&mut driver, 0, &Order::new("a", Some("c"), 1.0, T + 2_000));
    // Windows [T - 1000, T + 1000) and [T, T + 2000): both ended.
    pipe_to(&mut driver, 0, &Order::new("b", Some("c"), 2.0, T + 999));
    assert_eq!(late_count(&driver), 1);
    // Windows [T, T + 2000), ended, and [T + 1000, T + 3000), open.
    pipe_to(&mut driver, 0, &Order::new("c", Some("c"), 4.0, T + 1_000));
    assert_eq!(late_count(&driver), 1);
    pipe_to(&mut driver, 0, &Order::new("z", Some("c"), 8.0, T + 9_000));
    settle(&mut driver);
    assert_eq!(
        lines(&driver, OUTPUT),
        [
            row(T + 1_000, T + 3_000, None, 2, 5.0, 1.0, 4.0, 2.5),
            single(T + 2_000, T + 4_000, None, 1, 1.0),
        ]
    );
}

/// Lateness is judged on the order's own input partition's watermark: an
/// order far behind another partition's watermark is on time in its own, and
/// counts once the slowest partition closes its window.
#[test]
fn lateness_is_judged_per_input_partition() {
    let mut driver = start(&["--late-topic", LATE], 2);
    pipe_to(&mut driver, 0, &Order::new("a", Some("c"), 1.0, T + 10_000));
    pipe_to(&mut driver, 1, &Order::new("b", Some("c"), 2.0, T + 500));
    // Behind partition 0's watermark (T + 10 s), ahead of partition 1's.
    pipe_to(&mut driver, 1, &Order::new("c", Some("c"), 4.0, T + 700));
    // Behind partition 0's watermark: late there.
    pipe_to(&mut driver, 0, &Order::new("d", Some("c"), 8.0, T + 700));
    pipe_to(&mut driver, 1, &Order::new("e", Some("c"), 16.0, T + 2_000));
    settle(&mut driver);
    assert_eq!(late_count(&driver), 1);
    assert_eq!(
        lines(&driver, LATE),
        [Order::new("d", Some("c"), 8.0, T + 700).line()]
    );
    assert_eq!(
        lines(&driver, OUTPUT),
        [
            row(T - 1_000, T + 1_000, None, 2, 6.0, 2.0, 4.0, 3.0),
            row(T, T + 2_000, None, 2, 6.0, 2.0, 4.0, 3.0),
        ]
    );
}

/// Partition 0 runs far ahead; partition 1's watermark holds every window
/// open until it catches up, then exactly the windows ending by it close.
#[test]
fn the_final_stage_waits_for_the_slowest_partition() {
    for group_by in [false, true] {
        let flags: &[&str] = if group_by {
            &["--group-by", "customer_id"]
        } else {
            &[]
        };
        let mut driver = start(flags, 2);
        pipe_to(
            &mut driver,
            1,
            &Order::new("behind", Some("c"), 1.0, T + 500),
        );
        pipe_to(
            &mut driver,
            0,
            &Order::new("ahead", Some("c"), 2.0, T + 60_000),
        );
        settle(&mut driver);
        driver.advance_time(Duration::from_secs(600)).unwrap();
        settle(&mut driver);
        assert_eq!(lines(&driver, OUTPUT), Vec::<Value>::new());

        pipe_to(
            &mut driver,
            1,
            &Order::new("caught-up", Some("c"), 4.0, T + 2_000),
        );
        settle(&mut driver);
        let c = group_by.then_some("c");
        assert_eq!(
            lines(&driver, OUTPUT),
            [
                single(T - 1_000, T + 1_000, c, 1, 1.0),
                single(T, T + 2_000, c, 1, 1.0),
            ],
            "group by: {group_by}"
        );
    }
}

/// Only orders of partition 0 of 2. Without an idle timeout partition 1,
/// which never receives anything, holds every window open however long the
/// clock runs. With `--idle-timeout 2s` it stops holding the final stage
/// back after 2 s, and partition 0, quiet too, moves its watermark on with
/// the wall clock (3 s after its last order: 3 s past its largest time).
#[test]
fn with_an_idle_timeout_a_partition_without_data_stops_holding_windows_open() {
    let rules = WindowRules {
        size: 2_000,
        advance: 1_000,
        max_out_of_orderness: 0,
        partitions: 1,
        by_customer: false,
    };
    let orders: Vec<Order> = generate(2_000, 20, T, 0)
        .into_iter()
        .filter(|order| murmur2_partition(order.order_id.as_bytes(), 2) == 0)
        .collect();
    let largest = orders.iter().map(|o| o.order_time).max().unwrap();
    // What partition 0 alone gives once its watermark is at `until`.
    let until = |watermark: i64| {
        let mut closing = orders.clone();
        closing.push(Order {
            order_time: watermark,
            ..orders[0].clone()
        });
        model(&closing, rules)
    };

    let mut held = start(&[], 2);
    pipe_orders(&mut held, &orders);
    settle(&mut held);
    held.advance_time(Duration::from_secs(3_600)).unwrap();
    settle(&mut held);
    assert_eq!(lines(&held, OUTPUT), Vec::<Value>::new());

    let mut driver = start(&["--idle-timeout", "2s"], 2);
    pipe_orders(&mut driver, &orders);
    driver.advance_time(Duration::from_millis(1_900)).unwrap();
    driver.commit().unwrap();
    assert_eq!(
        lines(&driver, OUTPUT),
        Vec::<Value>::new(),
        "partition 1 may still come"
    );
    driver.advance_time(Duration::from_millis(1_100)).unwrap();
    driver.commit().unwrap();
    let expected = until(largest + 3_000);
    assert!(expected.len() > 30, "{}", expected.len());
    assert_eq!(lines(&driver, OUTPUT), expected);
    driver.advance_time(Duration::from_secs(3_600)).unwrap();
    driver.commit().unwrap();
    assert_eq!(lines(&driver, OUTPUT), until(largest + 3_603_000));
}

/// Windows three advances long and a watermark held back by 30 s of allowed
/// disorder: when an order far ahead moves it, it jumps over many windows of
/// every group at once, and the rows still come out in end order across
/// groups (then null group first and group bytes) — the model's order.
#[test]
fn grouped_windows_come_out_in_end_order_across_groups_when_the_watermark_jumps() {
    let rules = WindowRules {
        size: 3_000,
        advance: 1_000,
        max_out_of_orderness: 30_000,
        partitions: 1,
        by_customer: true,
    };
    let mut orders = generate(3_000, 20, T, 0);
    let largest = orders.iter().map(|o| o.order_time).max().unwrap();
    orders.push(Order::new("far-ahead", Some("x"), 1.0, largest + 600_000));
    let expected = model(&orders, rules);
    let mut driver = start_with_rules(rules, &[]);
    run_orders(&mut driver, &orders, 500);
    let output = lines(&driver, OUTPUT);
    assert_eq!(output, expected);
    let ends = window_times(&output, "window_end");
    assert!(ends.windows(2).all(|pair| pair[0] <= pair[1]));
    let groups: std::collections::BTreeSet<String> =
        output.iter().map(|row| row["key"].to_string()).collect();
    assert!(groups.len() > 15 && groups.contains("null"), "{groups:?}");
}

/// Random orders over four partitions, ten times the end-to-end test's:
/// exactly the model's rows, in window order (one final task), and its late
/// count.
#[test]
fn global_windows_over_four_partitions_match_a_model_of_the_rules() {
    let rules = WindowRules {
        size: 2_000,
        advance: 500,
        max_out_of_orderness: 300,
        partitions: 4,
        by_customer: false,
    };
    let orders = generate(50_000, 50, T, rules.max_out_of_orderness);
    let expected = expect(&orders, rules);
    assert!(expected.late > 100, "stragglers: {}", expected.late);
    let mut driver = start_with_rules(rules, &[]);
    run_orders(&mut driver, &orders, 1_000);
    let output = lines(&driver, OUTPUT);
    assert!(output.len() > 1_500);
    assert_eq!(output, expected.rows);
    assert_eq!(late_count(&driver), expected.late as u64);
}

/// Random orders grouped by customer over four partitions (groups spread over
/// four final tasks), ten times the end-to-end test's: the model's rows, each
/// group's in window order, and its late count.
#[test]
fn grouped_by_customer_over_four_partitions_match_a_model_of_the_rules() {
    grouped_by_customer_over_four_partitions(&[]);
}

/// The same with `--pre-aggregate`: the partial tasks sum their orders per
/// window and group in state before the shuffle, with the same rows.
#[test]
fn grouped_and_pre_aggregated_over_four_partitions_match_a_model_of_the_rules() {
    grouped_by_customer_over_four_partitions(&["--pre-aggregate"]);
}

fn grouped_by_customer_over_four_partitions(extra: &[&str]) {
    let rules = WindowRules {
        size: 2_000,
        advance: 1_000,
        max_out_of_orderness: 200,
        partitions: 4,
        by_customer: true,
    };
    let orders = generate(40_000, 20, T, rules.max_out_of_orderness);
    let expected = expect(&orders, rules);
    assert!(
        expected.rows.iter().any(|row| row["key"].is_null()),
        "the null customer is a group of its own"
    );
    let mut driver = start_with_rules(rules, extra);
    run_orders(&mut driver, &orders, 1_000);
    let output = lines(&driver, OUTPUT);
    assert_same_records(&output, &expected.rows, "grouped rows");
    for group in ["customer-0", "customer-7"] {
        let of = |rows: &[Value]| -> Vec<Value> {
            rows.iter()
                .filter(|row| row["key"] == group)
                .cloned()
                .collect()
        };
        assert_eq!(of(&output), of(&expected.rows), "rows of {group} in order");
    }
    assert_eq!(late_count(&driver), expected.late as u64);
}

/// Crashes while partials and final rows written since the last commit are
/// in flight (one also losing the local state): the uncommitted rows are
/// dropped, the input is read again from the committed offsets, and the
/// output is exactly the model's, nothing lost or repeated. No timer is
/// ever written to a changelog: each reopen derives them from the windows.
#[test]
fn a_crash_between_the_stages_loses_and_duplicates_nothing() {
    let rules = WindowRules {
        size: 2_000,
        advance: 1_000,
        max_out_of_orderness: 100,
        partitions: 2,
        by_customer: false,
    };
    let orders = generate(20_000, 50, T, rules.max_out_of_orderness);
    let expected = expect(&orders, rules);
    let mut driver = start_with_rules(rules, &[]);
    let mut crashes = 0;
    for (chunk_index, chunk) in orders.chunks(700).enumerate() {
        pipe_orders(&mut driver, chunk);
        if chunk_index % 4 == 3 {
            let before = lines(&driver, OUTPUT).len();
            if crashes % 2 == 0 {
                driver.crash().unwrap();
            } else {
                driver.crash_losing_state().unwrap();
            }
            crashes += 1;
            // The replay re-emits what the crash dropped.
            assert_eq!(lines(&driver, OUTPUT).len(), before);
        } else {
            driver.commit().unwrap();
        }
    }
    settle(&mut driver);
    let records = driver.read(OUTPUT).unwrap();
    let aborted = records.last().unwrap().offset as usize + 1 - records.len();
    assert!(aborted > 20, "the crashes dropped emitted rows: {aborted}");
    assert!(driver.counter(metrics::RESTORED_RECORDS, &[]) > 0);
    assert_eq!(lines(&driver, OUTPUT), expected.rows);
    // The flush timers were derived from the open windows at every reopen.
    for stage in ["window-aggregator", "window-aggregator-final"] {
        let changelog = |store: &str| driver.read(&format!("{stage}-{store}-changelog")).unwrap();
        assert!(!changelog("open-windows").is_empty(), "{stage}");
        assert!(changelog("timers").is_empty(), "{stage}");
    }
}

#[test]
fn an_advance_longer_than_the_window_or_an_empty_window_is_refused() {
    let refused = |flags: &[&str]| {
        let settings: Settings = settings("window-aggregator", flags);
        match window_aggregator::pipeline(settings) {
            Ok(_) => panic!("{flags:?} accepted"),
            Err(error) => error.to_string(),
        }
    };
    assert!(refused(&["--window-size", "1s", "--window-advance", "2s"])
        .contains("--window-advance (2000ms) must not exceed --window-size (1000ms)"));
    assert!(refused(&["--window-size", "0s"]).contains("--window-size must be at least 1ms"));
    assert!(refused(&["--window-advance", "0s"]).contains("--window-advance must be at least 1ms"));
}

/// `TestDriver::pipe` registers the input topic's schema and builds its
/// encoder at the first record only: however many records follow, the
/// registry is asked nothing more and parses (and keeps) no more schemas,
/// and every record is written with the first one's schema id.
#[test]
fn piping_json_registers_the_input_schema_once() {
    let orders = generate(3_000, 50, T, 0);
    let mut driver = start(&[], 1);
    pipe_orders(&mut driver, &orders[..1]);
    let registry = driver.registry().clone();
    let (requests, parsed) = (registry.requests(), registry.schemas_parsed());
    pipe_orders(&mut driver, &orders[1..]);
    assert_eq!(registry.requests(), requests);
    assert_eq!(registry.schemas_parsed(), parsed);
    let ids: Vec<u32> = driver
        .read(INPUT)
        .unwrap()
        .iter()
        .map(|record| split_wire_format(record.raw.as_ref().unwrap()).unwrap().0)
        .collect();
    assert_eq!(ids.len(), orders.len());
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    // The topic's schema as written, so that the stage reads with its reader
    // schema directly rather than resolving the writer's into it.
    let input_schema = std::fs::read_to_string(e2e_tests::schema(INPUT)).unwrap();
    assert_eq!(
        registry.schema_by_id(ids[0]).unwrap().canonical_form(),
        leak_schema(&input_schema).unwrap().canonical_form()
    );
}

/// The driver's metrics are the endpoint's: the final stage's series carry
/// `stage="final"`. A counter sums every series that has the labels asked
/// for: one topic's, one stage's, or everything.
#[test]
fn a_counter_sums_the_series_of_every_stage_and_topic_with_the_labels_asked_for() {
    let orders = generate(500, 10, T, 0);
    let mut driver = start(&[], 2);
    pipe_orders(&mut driver, &orders);
    settle(&mut driver);
    let consumed =
        |labels: &[(&'static str, &str)]| driver.counter(metrics::RECORDS_CONSUMED, labels);
    let by_final_stage = consumed(&[("stage", "final")]);
    assert_eq!(consumed(&[("topic", INPUT)]), orders.len() as u64);
    assert_eq!(consumed(&[("topic", INPUT), ("stage", "final")]), 0);
    assert!(by_final_stage > 0);
    assert_eq!(consumed(&[]), orders.len() as u64 + by_final_stage);
    let rows = lines(&driver, OUTPUT).len() as u64;
    assert!(rows > 0);
    assert_eq!(
        driver.counter(metrics::RECORDS_PRODUCED, &[("topic", OUTPUT)]),
        rows
    );
    // Per-task gauges of the two stages no longer overwrite each other.
    let timer_gauges: Vec<_> = driver
        .metrics()
        .gauges
        .into_keys()
        .filter(|(name, _)| *name == metrics::TIMERS_PENDING)
        .collect();
    let task = |partition: &str| ("task", partition.to_string());
    let final_stage = ("stage", "final".to_string());
    assert_eq!(
        timer_gauges,
        [
            (metrics::TIMERS_PENDING, vec![task("0")]),
            (metrics::TIMERS_PENDING, vec![task("0"), final_stage]),
            (metrics::TIMERS_PENDING, vec![task("1")]),
        ]
    );
}
