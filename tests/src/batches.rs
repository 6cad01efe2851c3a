//! embed-batcher test data: article edits, expected output rows, and a model
//! of the batching rules of docs/services/embed-batcher.md (and of the order
//! of work of docs/services/README.md) that computes the expected output of
//! generated input.
//!
//! The model replays each input partition in produce order, as the service's
//! task does: lateness against the watermark before the record (`<=`), then
//! the watermark advance and every due timer in time order, then the record.
//! Embedding values are not modelled: rows are compared without them (see
//! [`without_embedding`]).

use std::collections::{BTreeMap, HashMap};

use rand::Rng;
use serde_json::{json, Value};

use crate::{assert_same_records, murmur2_partition};

/// The service settings the model follows.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    pub batch_size: usize,
    pub max_wait: i64,
    pub max_out_of_orderness: i64,
}

/// One article edit.
#[derive(Debug, Clone)]
pub struct Edit {
    pub tenant: String,
    pub doc: String,
    pub title: String,
    pub body: String,
    pub updated_at: i64,
}

impl Edit {
    /// An edit with a title and body derived from its doc and time.
    pub fn new(tenant: &str, doc: &str, updated_at: i64) -> Edit {
        Edit {
            tenant: tenant.to_string(),
            doc: doc.to_string(),
            title: format!("{doc} title"),
            body: format!("{doc} as of {updated_at}"),
            updated_at,
        }
    }

    /// The edit of an `articles` line (the demo data's, say).
    pub fn from_line(line: &Value) -> Edit {
        let value = &line["value"];
        let text = |field: &str| {
            value[field]
                .as_str()
                .unwrap_or_else(|| panic!("{field} of {line}"))
                .to_string()
        };
        Edit {
            tenant: text("tenant_id"),
            doc: text("doc_id"),
            title: text("title"),
            body: text("body"),
            updated_at: value["updated_at"].as_i64().expect("updated_at"),
        }
    }

    /// The `articles` line, keyed by tenant.
    pub fn line(&self) -> Value {
        json!({"key": self.tenant, "value": {"tenant_id": self.tenant, "doc_id": self.doc,
            "title": self.title, "body": self.body, "updated_at": self.updated_at}})
    }
}

/// An `article-embeddings` line without its embedding.
pub fn row(edit: &Edit, batch_time: i64) -> Value {
    json!({"key": edit.tenant, "value": {"tenant_id": edit.tenant, "doc_id": edit.doc,
        "updated_at": edit.updated_at, "title": edit.title, "batch_time": batch_time}})
}

/// `line` without `value.embedding`, after checking that it is a vector of
/// `dimensions` numbers.
pub fn without_embedding(line: &Value, dimensions: usize) -> Value {
    let mut line = line.clone();
    let embedding = line["value"]
        .as_object_mut()
        .and_then(|value| value.remove("embedding"))
        .unwrap_or_else(|| panic!("no embedding in {line}"));
    let numbers = embedding.as_array().map_or(0, |items| {
        items.iter().filter(|item| item.is_number()).count()
    });
    assert_eq!(numbers, dimensions, "embedding of {line}: {embedding}");
    line
}

/// The rows of each tenant, in output order.
pub fn per_tenant(lines: &[Value]) -> BTreeMap<String, Vec<Value>> {
    let mut tenants: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for line in lines {
        let tenant = line["key"].as_str().unwrap_or_default().to_string();
        tenants.entry(tenant).or_default().push(line.clone());
    }
    tenants
}

/// Same rows, and each tenant's rows in the same order.
pub fn assert_same_rows_per_tenant(actual: &[Value], expected: &[Value], log: &str) {
    assert_same_records(actual, expected, log);
    let (actual, expected) = (per_tenant(actual), per_tenant(expected));
    for (tenant, rows) in &expected {
        assert_eq!(
            actual.get(tenant),
            Some(rows),
            "rows of {tenant} in another order"
        );
    }
}

/// What the model expects of some input.
#[derive(Debug, Default)]
pub struct Expected {
    /// Output rows (without embeddings), each tenant's in output order.
    pub rows: Vec<Value>,
    /// Late edits.
    pub late: usize,
    /// Embedding requests (batches).
    pub batches: usize,
}

/// One tenant's state in the model.
#[derive(Debug, Default)]
struct Tenant {
    pending: HashMap<String, Edit>,
    timer: Option<i64>,
}

impl Tenant {
    /// A newer edit replaces the pending one, an older or equal one is
    /// ignored; the timer only moves earlier, to the edit's time when the
    /// pending count reaches batch-size, else to its deadline.
    fn process(&mut self, edit: &Edit, rules: &Rules) {
        if let Some(waiting) = self.pending.get(&edit.doc) {
            if waiting.updated_at >= edit.updated_at {
                return;
            }
        }
        self.pending.insert(edit.doc.clone(), edit.clone());
        let wake_up = if self.pending.len() >= rules.batch_size {
            edit.updated_at
        } else {
            edit.updated_at + rules.max_wait
        };
        if self.timer.is_none_or(|timer| wake_up < timer) {
            self.timer = Some(wake_up);
        }
    }

    /// The timer at `time` fires at `watermark`.
    fn fire(&mut self, time: i64, watermark: i64, rules: &Rules, out: &mut Expected) {
        let mut waiting: Vec<Edit> = self.pending.values().cloned().collect();
        waiting.sort_by(|a, b| (a.updated_at, &a.doc).cmp(&(b.updated_at, &b.doc)));
        let safe: Vec<Edit> = waiting
            .iter()
            .filter(|e| e.updated_at <= watermark)
            .cloned()
            .collect();
        let mut batches: Vec<&[Edit]> = safe.chunks_exact(rules.batch_size).collect();
        let rest = safe.chunks_exact(rules.batch_size).remainder();
        if rest
            .first()
            .is_some_and(|oldest| oldest.updated_at + rules.max_wait <= watermark)
        {
            batches.push(rest);
        }
        for batch in batches {
            out.batches += 1;
            for edit in batch {
                out.rows.push(row(edit, time));
                self.pending.remove(&edit.doc);
            }
        }
        let mut left: Vec<&Edit> = self.pending.values().collect();
        left.sort_by(|a, b| (a.updated_at, &a.doc).cmp(&(b.updated_at, &b.doc)));
        let completes_batch = left.get(rules.batch_size - 1).map(|e| e.updated_at);
        let deadline = left.first().map(|e| e.updated_at + rules.max_wait);
        self.timer = match (completes_batch, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// The expected output of `edits`, produced in this order to a topic of
/// `partitions` partitions (keyed by tenant).
pub fn model(edits: &[Edit], partitions: usize, rules: &Rules) -> Expected {
    let mut out = Expected::default();
    for partition in 0..partitions {
        let mut tenants: BTreeMap<String, Tenant> = BTreeMap::new();
        let mut max_time: Option<i64> = None;
        let mut watermark: Option<i64> = None;
        for edit in edits
            .iter()
            .filter(|e| murmur2_partition(e.tenant.as_bytes(), partitions) == partition)
        {
            if watermark.is_some_and(|wm| edit.updated_at <= wm) {
                out.late += 1;
                continue;
            }
            max_time = Some(max_time.map_or(edit.updated_at, |m| m.max(edit.updated_at)));
            let candidate = max_time.unwrap() - rules.max_out_of_orderness;
            if watermark.is_none_or(|wm| candidate > wm) {
                watermark = Some(candidate);
                let mut due: Vec<(i64, String)> = tenants
                    .iter()
                    .filter_map(|(name, t)| t.timer.map(|time| (time, name.clone())))
                    .filter(|(time, _)| *time <= candidate)
                    .collect();
                due.sort();
                for (time, name) in due {
                    tenants
                        .get_mut(&name)
                        .unwrap()
                        .fire(time, candidate, rules, &mut out);
                }
            }
            tenants
                .entry(edit.tenant.clone())
                .or_default()
                .process(edit, rules);
        }
    }
    out
}

/// Random edits of `tenants` tenants from `base`: busy and quiet tenants,
/// re-edited docs (older and equal times too), shared timestamps, produced
/// with disorder of up to `max_disorder` ms (beyond the watermark bound, some
/// edits are late). Ends with a far-future edit in every partition so that
/// everything else becomes due.
pub fn generate(tenants: usize, partitions: usize, base: i64, max_disorder: i64) -> Vec<Edit> {
    let mut rng = rand::rng();
    let mut timed: Vec<(i64, Edit)> = Vec::new();
    for t in 0..tenants {
        let tenant = format!("tenant-{t}");
        let busy = t % 3 != 0;
        let docs = if busy { 25 } else { 4 };
        let count = if busy {
            rng.random_range(40..120)
        } else {
            rng.random_range(1..8)
        };
        let mut time = base + rng.random_range(0..20_000);
        for _ in 0..count {
            let doc = format!("doc-{}", rng.random_range(0..docs));
            let updated_at = if rng.random_bool(0.1) {
                time - rng.random_range(0..3_000) // an older edit, maybe of a pending doc
            } else {
                time
            };
            let order = updated_at + rng.random_range(0..max_disorder);
            timed.push((order, Edit::new(&tenant, &doc, updated_at)));
            time += if busy {
                rng.random_range(0..10) * 100
            } else {
                rng.random_range(5_000..60_000)
            };
        }
    }
    timed.sort_by_key(|(order, _)| *order);
    let mut edits: Vec<Edit> = timed.into_iter().map(|(_, edit)| edit).collect();
    for partition in 0..partitions {
        let flusher = (0..)
            .map(|i| format!("flush-{i}"))
            .find(|name| murmur2_partition(name.as_bytes(), partitions) == partition)
            .unwrap();
        edits.push(Edit::new(&flusher, "end", base + 100_000_000));
    }
    edits
}
