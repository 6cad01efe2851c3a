//! embed-batcher's rules (docs/services/embed-batcher.md) on the broker-free
//! test driver, with the feature-hashing embedder: batching, dedupe,
//! lateness, max wait, random tenants against the model of
//! tests/src/batches.rs, crashes, state restored from the changelogs, and the
//! state TTL on a manual wall clock. The driver runs embedding jobs inline,
//! so a batch's rows are there as soon as its timer has fired.

mod common;

use std::time::Duration;

use common::driver::{driver, lines, pipe_all, settings, settle};
use e2e_tests::batches::{generate, model, row, without_embedding, Edit, Rules};
use e2e_tests::{parse_jsonl, workspace};
use embed_batcher::Settings;
use serde_json::Value;
use streams_runtime::metrics;
use streams_runtime::testing::TestDriver;

const INPUT: &str = "articles";
const OUTPUT: &str = "article-embeddings";
const LATE: &str = "late-articles";
const T: i64 = 1_783_345_153_000;

/// embed-batcher with the hashing embedder and `flags`, over an input of
/// `partitions` partitions.
fn start(flags: &[&str], partitions: usize) -> TestDriver {
    // Feature hashing: deterministic, instant, `--embedding-dimensions` long.
    let mut all = vec!["--embedder", "hashing"];
    all.extend(flags);
    let settings: Settings = settings("embed-batcher", &all);
    driver(embed_batcher::pipeline(settings), partitions)
}

fn pipe_edits(driver: &mut TestDriver, edits: &[Edit]) {
    let lines: Vec<Value> = edits.iter().map(Edit::line).collect();
    pipe_all(driver, INPUT, &lines);
}

/// The output rows without their embeddings (each checked to hold
/// `dimensions` numbers), partition by partition in output order.
fn rows(driver: &TestDriver, dimensions: usize) -> Vec<Value> {
    lines(driver, OUTPUT)
        .iter()
        .map(|line| without_embedding(line, dimensions))
        .collect()
}

/// A processor counter (`streams_processor_events_total{name}`) of
/// committed work.
fn events(driver: &TestDriver, name: &str) -> u64 {
    driver.counter(metrics::PROCESSOR_EVENTS, &[("name", name)])
}

fn late_count(driver: &TestDriver) -> u64 {
    driver.counter(metrics::RECORDS_LATE, &[("topic", INPUT)])
}

/// A clock edit: another tenant's, moving the watermark to `at` minus the
/// allowed out-of-orderness.
fn tick(doc: &str, at: i64) -> Edit {
    Edit::new("clock", doc, at)
}

/// The worked example of docs/services/embed-batcher.md (the `make demo`
/// edits, `--batch-size 3`): acme's full batch at T+4s when initech's first
/// edit moves the watermark there; globex's and initech's smaller batches
/// when the watermark jumps to T+60s, in timer order; acme's stale edit is
/// late.
#[test]
fn the_worked_example_gives_the_documented_batches() {
    let text = std::fs::read_to_string(workspace().join("deploy/local/demo-data/articles.jsonl"))
        .expect("demo data");
    let input = parse_jsonl(&text);
    let edits: Vec<Edit> = input.iter().map(Edit::from_line).collect();
    let t = 1_783_332_000_000;
    let mut driver = start(&["--batch-size", "3", "--late-topic", LATE], 1);
    pipe_all(&mut driver, INPUT, &input[..6]);
    assert_eq!(rows(&driver, 384), Vec::<Value>::new());
    pipe_all(&mut driver, INPUT, &input[6..7]);
    // Record 7 lets acme's timer (T+4s) fire: 17, 42 (its newer version), 5.
    let acme = vec![
        row(&edits[1], t + 4_000),
        row(&edits[3], t + 4_000),
        row(&edits[4], t + 4_000),
    ];
    assert_eq!(rows(&driver, 384), acme);
    pipe_all(&mut driver, INPUT, &input[7..]);
    settle(&mut driver);
    let mut expected = acme;
    expected.extend([
        row(&edits[2], t + 31_000),
        row(&edits[5], t + 31_000),
        row(&edits[6], t + 39_000),
        row(&edits[7], t + 39_000),
    ]);
    assert_eq!(rows(&driver, 384), expected);
    assert_eq!(late_count(&driver), 1);
    assert_eq!(lines(&driver, LATE), [input[8].clone()]);
    assert_eq!(events(&driver, "batches_sent"), 3);
    assert_eq!(events(&driver, "edits_replaced"), 1);
    assert_eq!(events(&driver, "edits_superseded"), 0);
    // The (hashing) vectors are L2-normalised, and differ by text.
    let output = lines(&driver, OUTPUT);
    let vector = |line: &Value| -> Vec<f64> {
        let items = line["value"]["embedding"].as_array().unwrap();
        items.iter().map(|x| x.as_f64().unwrap()).collect()
    };
    for line in &output {
        let norm: f64 = vector(line).iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "norm {norm} of {line}");
    }
    assert_ne!(vector(&output[0]), vector(&output[1]));
}

/// The rules on a hand-written scenario (`--batch-size 3`): a newer edit
/// replaces a pending one, an older one is ignored, the third pending edit
/// makes a full batch at its time, which goes exactly when the watermark
/// reaches it; an edit at the watermark is late; a smaller batch goes once
/// its oldest edit has waited 30 s.
#[test]
fn batches_follow_the_documented_rules() {
    let mut driver = start(&["--batch-size", "3", "--late-topic", LATE], 1);
    let acme_d2 = Edit::new("acme", "d2", T + 1_000);
    let acme_d1 = Edit::new("acme", "d1", T + 2_000);
    let acme_d3 = Edit::new("acme", "d3", T + 3_000);
    let globex_g1 = Edit::new("globex", "g1", T + 4_000);
    pipe_edits(
        &mut driver,
        &[
            Edit::new("acme", "d1", T),
            acme_d2.clone(),
            acme_d1.clone(),                   // replaces the pending d1
            Edit::new("acme", "d2", T + 500),  // older than the pending d2: ignored
            Edit::new("acme", "d2", T + 1000), // equal to it: ignored too
            acme_d3.clone(),                   // the third pending edit: full at T + 3 s
            globex_g1.clone(),
            tick("tick", T + 7_999), // watermark T + 2.999 s
        ],
    );
    settle(&mut driver);
    assert_eq!(rows(&driver, 384), Vec::<Value>::new(), "1 ms short");

    let acme_d4_late = Edit::new("acme", "d4", T + 3_000);
    pipe_edits(
        &mut driver,
        &[
            tick("tick", T + 8_000), // watermark T + 3 s: acme's batch goes
            acme_d4_late.clone(),    // at the watermark: late
        ],
    );
    let acme = vec![
        row(&acme_d2, T + 3_000),
        row(&acme_d1, T + 3_000),
        row(&acme_d3, T + 3_000),
    ];
    assert_eq!(rows(&driver, 384), acme);
    // Watermark T + 33.999 s: globex's g1 has waited 1 ms short of 30 s.
    pipe_edits(&mut driver, &[tick("tock", T + 38_999)]);
    assert_eq!(rows(&driver, 384), acme);
    pipe_edits(&mut driver, &[tick("tock", T + 39_000)]);
    settle(&mut driver);
    let mut expected = acme;
    expected.push(row(&globex_g1, T + 34_000));
    assert_eq!(rows(&driver, 384), expected);
    assert_eq!(late_count(&driver), 1);
    assert_eq!(lines(&driver, LATE), [acme_d4_late.line()]);
    assert_eq!(events(&driver, "batches_sent"), 2);
    // acme d1, clock tick, clock tock.
    assert_eq!(events(&driver, "edits_replaced"), 3);
    assert_eq!(events(&driver, "edits_superseded"), 2);
}

/// `--batch-size 2 --max-wait 10s`: a firing sends every full batch of
/// safe edits (all with the timer's time when the watermark jumped past
/// several), then the safe rest only if its oldest edit has waited 10 s;
/// the timer moves to the deadline of the oldest edit left, or earlier to the
/// edit that completes the next batch. (The clock tenant's own rows are left
/// out.)
#[test]
fn full_batches_then_an_overdue_rest_and_the_next_timer() {
    let mut driver = start(&["--batch-size", "2", "--max-wait", "10s"], 1);
    let of = |driver: &TestDriver, tenant: &str| -> Vec<Value> {
        rows(driver, 384)
            .into_iter()
            .filter(|row| row["key"] == tenant)
            .collect()
    };
    let a: Vec<Edit> = (1..=5)
        .map(|k| Edit::new("acme", &format!("a{k}"), T + 1_000 * (k - 1)))
        .collect();
    // a2 fills a batch: the timer moves to T + 1 s and stays there.
    pipe_edits(&mut driver, &a[..4]);
    assert_eq!(of(&driver, "acme"), Vec::<Value>::new());
    // Watermark T + 3 s: a1..a4 are safe, two full batches at T + 1 s.
    pipe_edits(&mut driver, &[tick("t", T + 8_000)]);
    let mut acme: Vec<Value> = a[..4].iter().map(|e| row(e, T + 1_000)).collect();
    assert_eq!(of(&driver, "acme"), acme);
    // a5 alone: its deadline, T + 14 s.
    pipe_edits(&mut driver, &[a[4].clone(), tick("t", T + 18_999)]);
    assert_eq!(of(&driver, "acme"), acme);
    pipe_edits(&mut driver, &[tick("t", T + 19_000)]);
    acme.push(row(&a[4], T + 14_000));
    assert_eq!(of(&driver, "acme"), acme);

    // g2 fills a batch (timer T + 21 s); at watermark T + 21.5 s g1 and g2
    // go, g3 (T + 22 s) is not safe and stays, and the timer moves to its
    // deadline, T + 32 s.
    let g: Vec<Edit> = (1..=3)
        .map(|k| Edit::new("globex", &format!("g{k}"), T + 19_000 + 1_000 * k))
        .collect();
    pipe_edits(&mut driver, &g);
    assert_eq!(of(&driver, "globex"), Vec::<Value>::new());
    pipe_edits(&mut driver, &[tick("t", T + 26_500)]);
    let mut globex = vec![row(&g[0], T + 21_000), row(&g[1], T + 21_000)];
    assert_eq!(of(&driver, "globex"), globex);
    pipe_edits(&mut driver, &[tick("t", T + 36_999)]);
    assert_eq!(of(&driver, "globex"), globex);
    pipe_edits(&mut driver, &[tick("t", T + 37_000)]);
    globex.push(row(&g[2], T + 32_000));
    assert_eq!(of(&driver, "globex"), globex);

    // Initech: i1..i4 pending, the timer at T + 41 s (i2 filled a batch).
    // At watermark T + 41 s, i1 and i2 go; i3 is not safe; the next timer is
    // the time of i4, which completes the next batch (T + 43 s), before i3's
    // deadline.
    let i: Vec<Edit> = (1..=7)
        .map(|k| Edit::new("initech", &format!("i{k}"), T + 39_000 + 1_000 * k))
        .collect();
    pipe_edits(&mut driver, &i[..4]);
    pipe_edits(&mut driver, &[tick("t", T + 46_000)]);
    let mut initech = vec![row(&i[0], T + 41_000), row(&i[1], T + 41_000)];
    assert_eq!(of(&driver, "initech"), initech);
    pipe_edits(&mut driver, &i[4..]);
    pipe_edits(&mut driver, &[tick("t", T + 47_999)]);
    assert_eq!(of(&driver, "initech"), initech);
    // Watermark T + 43 s: i3 and i4 go; the timer moves to i6's time.
    pipe_edits(&mut driver, &[tick("t", T + 48_000)]);
    initech.extend([row(&i[2], T + 43_000), row(&i[3], T + 43_000)]);
    assert_eq!(of(&driver, "initech"), initech);
    // A jump far ahead: the full batch i5, i6 and the overdue rest i7 go
    // at once, with the timer's time.
    pipe_edits(&mut driver, &[tick("t", T + 200_000)]);
    settle(&mut driver);
    initech.extend(i[4..].iter().map(|e| row(e, T + 45_000)));
    assert_eq!(of(&driver, "initech"), initech);
    // acme 3, globex 2, initech 4, and the clock's: one doc, one row each.
    let clock = of(&driver, "clock").len() as u64;
    assert!(clock > 0);
    assert_eq!(events(&driver, "batches_sent"), 9 + clock);
}

/// An ignored edit (older or equal) changes nothing, not even the timer: had
/// it counted, it would have filled a batch.
#[test]
fn an_ignored_edit_does_not_move_the_timer() {
    let mut driver = start(&["--batch-size", "2"], 1);
    let d1 = Edit::new("acme", "d1", T + 1_000);
    pipe_edits(
        &mut driver,
        &[
            d1.clone(),
            Edit::new("acme", "d1", T + 500),
            Edit::new("acme", "d1", T + 1_000),
            tick("t", T + 35_999),
        ],
    );
    assert_eq!(rows(&driver, 384), Vec::<Value>::new());
    pipe_edits(&mut driver, &[tick("t", T + 36_000)]);
    settle(&mut driver);
    assert_eq!(rows(&driver, 384), [row(&d1, T + 31_000)]);
    assert_eq!(events(&driver, "edits_superseded"), 2);
}

/// Timers of several tenants due in one advance fire in time order, then in
/// tenant id byte order; the edit that moves the watermark is buffered after.
#[test]
fn tenants_due_in_one_advance_fire_by_time_then_tenant_bytes() {
    let mut driver = start(&[], 1);
    let edits = [
        Edit::new("b", "d", T),
        Edit::new("é", "d", T),
        Edit::new("a", "d", T),
        Edit::new("B", "d", T),
        Edit::new("z", "d", T - 1_000),
        Edit::new("y", "d", T + 1),
    ];
    pipe_edits(&mut driver, &edits);
    let late = Edit::new("clock", "d", T + 100_000);
    pipe_edits(&mut driver, &[late]);
    settle(&mut driver);
    assert_eq!(
        rows(&driver, 384),
        [
            row(&edits[4], T + 29_000),
            row(&edits[3], T + 30_000),
            row(&edits[2], T + 30_000),
            row(&edits[0], T + 30_000),
            row(&edits[1], T + 30_000),
            row(&edits[5], T + 30_001),
        ]
    );
}

/// Random edits of 120 busy and quiet tenants over four partitions (ten
/// times the end-to-end test's), with re-edits, equal times and late edits:
/// exactly the model's rows, in output order partition by partition, and its
/// late and batch counts.
#[test]
fn random_edits_of_many_tenants_over_four_partitions_match_a_model_of_the_rules() {
    let partitions = 4;
    let rules = Rules {
        batch_size: 5,
        max_wait: 30_000,
        max_out_of_orderness: 5_000,
    };
    let edits = generate(120, partitions, T, 5_500);
    let expected = model(&edits, partitions, &rules);
    assert!(
        expected.batches > 200 && expected.late > 10,
        "batches {}, late {}",
        expected.batches,
        expected.late
    );
    let mut driver = start(&["--batch-size", "5", "--embedding-dimensions", "16"], 4);
    for chunk in edits.chunks(500) {
        pipe_edits(&mut driver, chunk);
        driver.advance_time(Duration::from_millis(100)).unwrap();
    }
    settle(&mut driver);
    assert_eq!(rows(&driver, 16), expected.rows);
    assert_eq!(late_count(&driver), expected.late as u64);
    assert_eq!(events(&driver, "batches_sent"), expected.batches as u64);
}

/// The same with crashes between commits, half of them losing the local
/// state (restored from the changelogs): the rows are still exactly the
/// model's, none lost or repeated, and so are the committed batch counts.
#[test]
fn random_edits_survive_crashes_and_lost_state_exactly() {
    let partitions = 4;
    let rules = Rules {
        batch_size: 4,
        max_wait: 30_000,
        max_out_of_orderness: 5_000,
    };
    let edits = generate(48, partitions, T, 5_500);
    let expected = model(&edits, partitions, &rules);
    let mut driver = start(&["--batch-size", "4", "--embedding-dimensions", "8"], 4);
    let mut crashes = 0;
    for (index, chunk) in edits.chunks(200).enumerate() {
        pipe_edits(&mut driver, chunk);
        if index % 3 == 2 {
            if crashes % 2 == 0 {
                driver.crash().unwrap();
            } else {
                driver.crash_losing_state().unwrap();
            }
            crashes += 1;
        } else {
            driver.commit().unwrap();
        }
    }
    settle(&mut driver);
    assert!(crashes >= 4);
    let records = driver.read(OUTPUT).unwrap();
    let written: usize = (0..partitions as i32)
        .map(|p| {
            records
                .iter()
                .filter(|r| r.partition == p)
                .map(|r| r.offset as usize + 1)
                .max()
                .unwrap_or(0)
        })
        .sum();
    assert!(
        written > records.len(),
        "the crashes dropped uncommitted rows"
    );
    assert!(driver.counter(metrics::RESTORED_RECORDS, &[]) > 0);
    assert_eq!(rows(&driver, 8), expected.rows);
    assert_eq!(events(&driver, "batches_sent"), expected.batches as u64);
}

/// After a crash that loses the local state, the pending edits, the timer
/// and the watermark come back from the changelogs: a stale edit is still
/// late, and the waiting edit still goes when the watermark reaches its
/// timer.
#[test]
fn pending_edits_timers_and_the_watermark_survive_a_crash_losing_state() {
    let mut driver = start(&[], 1);
    let acme_d1 = Edit::new("acme", "d1", T);
    pipe_edits(&mut driver, &[acme_d1.clone(), tick("tick", T + 20_000)]);
    driver.commit().unwrap();
    driver.crash_losing_state().unwrap();
    assert!(driver.counter(metrics::RESTORED_RECORDS, &[]) > 0);
    // At or before the restored watermark (T + 15 s): late, not buffered.
    pipe_edits(&mut driver, &[Edit::new("acme", "d1", T + 10_000)]);
    assert_eq!(late_count(&driver), 1);
    // Watermark T + 29.999 s: acme's timer (T + 30 s) is not due yet.
    pipe_edits(&mut driver, &[tick("tock", T + 34_999)]);
    assert_eq!(rows(&driver, 384), Vec::<Value>::new());
    pipe_edits(&mut driver, &[tick("tock", T + 35_000)]);
    settle(&mut driver);
    assert_eq!(rows(&driver, 384), [row(&acme_d1, T + 30_000)]);
    assert_eq!(events(&driver, "batches_sent"), 1);
}

/// `--state-ttl 2s`: the wall-clock expiry timer drops what has not been
/// written for 2 s (exactly: not at 1.999 s) and counts it; an expired edit
/// is never sent. Expiry never moves the batch timer: acme's and globex's
/// (T + 30 s) stay although nothing is pending; acme's fires, finds nothing
/// and clears itself, globex's sends g2, accepted meanwhile, with its time.
#[test]
fn the_expiry_timer_drops_edits_not_written_for_the_state_ttl() {
    let mut driver = start(&["--state-ttl", "2s"], 1);
    pipe_edits(
        &mut driver,
        &[Edit::new("acme", "d1", T), Edit::new("globex", "g1", T)],
    );
    driver.advance_time(Duration::from_millis(1_999)).unwrap();
    driver.commit().unwrap();
    assert_eq!(events(&driver, "pending_edits_expired"), 0);
    driver.advance_time(Duration::from_millis(1)).unwrap();
    driver.commit().unwrap();
    assert_eq!(events(&driver, "pending_edits_expired"), 2);

    let globex_g2 = Edit::new("globex", "g2", T + 1_000);
    let acme_d2 = Edit::new("acme", "d2", T + 40_000);
    pipe_edits(
        &mut driver,
        &[
            globex_g2.clone(),
            // Watermark T + 35 s: globex's timer (T + 30 s) sends g2; acme's
            // finds nothing pending.
            acme_d2.clone(),
            // Watermark T + 75 s: acme's d2 has waited 30 s; d1 is gone.
            tick("tick", T + 80_000),
        ],
    );
    driver.commit().unwrap();
    assert_eq!(
        rows(&driver, 384),
        [row(&globex_g2, T + 30_000), row(&acme_d2, T + 70_000)]
    );
    assert_eq!(events(&driver, "pending_edits_expired"), 2);
    assert_eq!(events(&driver, "batches_sent"), 2);
}

/// The expiry timer re-arms itself for the entries left: each entry expires
/// 2 s after it was last written. A replacing edit rewrites the entry (and
/// its time); an ignored, older edit does not.
#[test]
fn each_entry_expires_a_state_ttl_after_it_was_last_written() {
    let mut driver = start(&["--state-ttl", "2s"], 1);
    let expired = |driver: &mut TestDriver| {
        driver.commit().unwrap();
        events(driver, "pending_edits_expired")
    };
    // Wall clock 0 s: acme d1, globex g1, initech i1.
    pipe_edits(
        &mut driver,
        &[
            Edit::new("acme", "d1", T),
            Edit::new("globex", "g1", T),
            Edit::new("initech", "i1", T),
        ],
    );
    driver.advance_time(Duration::from_millis(1_000)).unwrap();
    // 1 s: acme d2; globex g1 rewritten (newer); initech i1 ignored (older).
    pipe_edits(
        &mut driver,
        &[
            Edit::new("acme", "d2", T + 100),
            Edit::new("globex", "g1", T + 100),
            Edit::new("initech", "i1", T - 100),
        ],
    );
    driver.advance_time(Duration::from_millis(999)).unwrap();
    assert_eq!(expired(&mut driver), 0);
    // 2 s: acme d1 and initech i1 expire.
    driver.advance_time(Duration::from_millis(1)).unwrap();
    assert_eq!(expired(&mut driver), 2);
    driver.advance_time(Duration::from_millis(999)).unwrap();
    assert_eq!(expired(&mut driver), 2);
    // 3 s: acme d2 and globex g1 expire.
    driver.advance_time(Duration::from_millis(1)).unwrap();
    assert_eq!(expired(&mut driver), 4);
    pipe_edits(&mut driver, &[tick("tick", T + 100_000)]);
    settle(&mut driver);
    assert_eq!(rows(&driver, 384), Vec::<Value>::new());
}

/// A batch timer that finds expired edits drops them before sending:
/// `--idle-timeout 1s` moves the watermark of the quiet partition on with the
/// wall clock, so one 40 s advance fires acme's batch timer (T + 30 s) before
/// its expiry timer. With a TTL of an hour the edit goes.
#[test]
fn a_batch_timer_that_finds_expired_edits_never_sends_them() {
    let d1 = Edit::new("acme", "d1", T);
    for (ttl, rows_out, expired) in [("2s", vec![], 1), ("1h", vec![row(&d1, T + 30_000)], 0)] {
        let mut driver = start(&["--idle-timeout", "1s", "--state-ttl", ttl], 1);
        pipe_edits(&mut driver, std::slice::from_ref(&d1));
        driver.advance_time(Duration::from_secs(40)).unwrap();
        driver.commit().unwrap();
        assert_eq!(rows(&driver, 384), rows_out, "ttl {ttl}");
        assert_eq!(events(&driver, "pending_edits_expired"), expired);
        assert_eq!(events(&driver, "batches_sent"), 1 - expired);
    }
}

/// An edit that finds expired entries drops them first (here: after a crash
/// that undid the expiry timer's work, on a clock already past the TTL), and
/// dropping never moves the batch timer: globex's g2 goes with the timer g1
/// set (T + 30 s), not one of its own (T + 31 s).
#[test]
fn an_edit_that_finds_expired_entries_drops_them_and_keeps_the_batch_timer() {
    let mut driver = start(&["--state-ttl", "2s", "--commit-interval", "1h"], 1);
    pipe_edits(&mut driver, &[Edit::new("globex", "g1", T)]);
    driver.commit().unwrap();
    driver.advance_time(Duration::from_secs(3)).unwrap();
    driver.crash().unwrap();
    let globex_g2 = Edit::new("globex", "g2", T + 1_000);
    pipe_edits(&mut driver, &[globex_g2.clone(), tick("tick", T + 40_000)]);
    driver.commit().unwrap();
    assert_eq!(rows(&driver, 384), [row(&globex_g2, T + 30_000)]);
    assert_eq!(events(&driver, "pending_edits_expired"), 1);
}

/// The expiry timer is state too: after a crash losing the local state it
/// comes back from the changelog and still drops the edit.
#[test]
fn expiry_survives_a_crash_losing_state() {
    let mut driver = start(&["--state-ttl", "2s"], 1);
    pipe_edits(&mut driver, &[Edit::new("acme", "d1", T)]);
    driver.commit().unwrap();
    driver.crash_losing_state().unwrap();
    driver.advance_time(Duration::from_secs(2)).unwrap();
    driver.commit().unwrap();
    assert_eq!(events(&driver, "pending_edits_expired"), 1);
    let globex_g1 = Edit::new("globex", "g1", T + 1_000);
    pipe_edits(&mut driver, &[globex_g1.clone(), tick("tick", T + 100_000)]);
    settle(&mut driver);
    assert_eq!(rows(&driver, 384), [row(&globex_g1, T + 31_000)]);
}
