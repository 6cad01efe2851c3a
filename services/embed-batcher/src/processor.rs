//! The batching processor: per tenant, pending edits by doc_id, one batch
//! timer (event time) and one expiry timer (wall clock). The rules are in
//! docs/services/embed-batcher.md.
//!
//! State, keyed by the value's `tenant_id` (the record key is not trusted to
//! equal it):
//!
//! * `pending` (map, by doc_id): the newest edit of each waiting article,
//!   with the wall-clock time it was written. A newer edit replaces it; an
//!   older or equal one is ignored.
//! * `progress` (value): how many edits are pending, so that `process` can
//!   tell a batch is full without reading the map, and a wall-clock time
//!   before which no pending entry can have expired.
//!
//! The watermark and the timers are the runtime's, stored with the task's
//! state, so a restart resumes them. Lateness: an edit at or before the task
//! watermark is late (`<=`).
//!
//! `process` only moves the timer earlier ([`wake_up_after_edit`]); the timer
//! sends what the watermark allows and re-arms itself ([`plan_batches`]).
//! A batch's rows carry the timer's time as `batch_time`.
//!
//! **State TTL** (processing time, [`Context::now`]): an entry not written
//! for `state-ttl` is dropped and counted (`pending_edits_expired`). A
//! tenant with pending edits has a wall-clock timer at the earliest time one
//! of them can expire, which drops what has expired and re-arms itself; an
//! edit or a batch timer that finds expired entries first drops them too, so
//! an expired edit is never sent.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use streams_runtime::prelude::*;

use crate::batching::{plan_batches, wake_up_after_edit};
use crate::embedder::{Embedder, Retrying};
use crate::model::{Article, ArticleEmbedding};
use crate::settings::Settings;

/// One pending edit of an article (its doc_id is the map key).
#[derive(Debug, Serialize, Deserialize)]
struct PendingEdit {
    updated_at: i64,
    title: String,
    body: String,
    /// Wall-clock milliseconds when this entry was last written (for the TTL).
    written_at: i64,
}

/// A tenant's bookkeeping; absent when nothing is pending.
#[derive(Debug, Serialize, Deserialize)]
struct Progress {
    /// Number of entries in the tenant's `pending` map.
    pending: u64,
    /// No entry expires before this wall-clock time (a lower bound, made
    /// exact whenever the map is scanned).
    expiry_check: i64,
}

streams_runtime::stores! {
    /// Pending edits per tenant, by doc_id. Store names are permanent.
    PENDING: MapState<String, PendingEdit> = "pending";
    /// Per-tenant bookkeeping.
    PROGRESS: ValueState<Progress> = "progress";
}

streams_runtime::counter_names! {
    /// What embed-batcher counts.
    pub enum BatcherCounter {
        BatchesSent = "batches_sent",
        EditsSuperseded = "edits_superseded",
        EditsReplaced = "edits_replaced",
        PendingEditsExpired = "pending_edits_expired",
    }
}

streams_runtime::timer_names! {
    /// A tenant's timers.
    pub enum TenantTimer {
        /// Event time: send what the watermark allows.
        Batch = "batch",
        /// Wall clock: drop pending edits older than the TTL.
        Expiry = "expiry",
    }
}

/// The service: articles in, embeddings out.
pub fn pipeline(settings: Settings) -> anyhow::Result<Pipeline> {
    let topology = Topology::new(
        "embed-batcher",
        &settings.output_topic,
        topic_schemas::ARTICLE_EMBEDDINGS,
    )
    .input(InputStream::new(
        &settings.input_topic,
        topic_schemas::ARTICLES,
        |a: &Article| a.updated_at,
        |a| a,
    )?)
    .max_out_of_orderness(settings.max_out_of_orderness)
    .job_workers(settings.embed_workers as usize);
    // The embedder (the local model, loaded from disk) is made only when
    // the service runs, not for `describe`, `acls` or `reset`.
    let runtime = settings.runtime.clone();
    Ok(Pipeline::with_deferred_processor(
        runtime,
        topology,
        move || {
            let embedder = crate::embedder::from_settings(&settings)?;
            Ok(EmbedBatcher::new(&settings, embedder))
        },
    ))
}

/// The processor; cloned per task, sharing one embedder.
#[derive(Clone)]
pub struct EmbedBatcher {
    batch_size: usize,
    max_wait: i64,
    state_ttl: i64,
    embedder: Arc<Retrying<Box<dyn Embedder>>>,
}

impl EmbedBatcher {
    /// A processor with the settings' batching rules and TTL.
    pub fn new(settings: &Settings, embedder: Arc<Retrying<Box<dyn Embedder>>>) -> Self {
        EmbedBatcher {
            batch_size: settings.batch_size as usize,
            max_wait: settings.max_wait.as_millis_i64(),
            state_ttl: settings.state_ttl.as_millis_i64(),
            embedder,
        }
    }

    /// When an entry written at `written_at` expires.
    fn expiry(&self, written_at: i64) -> i64 {
        written_at.saturating_add(self.state_ttl)
    }

    /// The tenant's bookkeeping for exactly the entries `left`.
    fn progress_of(&self, left: &[(String, PendingEdit)]) -> Progress {
        Progress {
            pending: left.len() as u64,
            expiry_check: left
                .iter()
                .map(|(_, edit)| self.expiry(edit.written_at))
                .min()
                .unwrap_or(i64::MAX),
        }
    }

    /// The tenant's pending entries, after dropping (and counting) those
    /// not written for the TTL.
    fn live_entries(
        &self,
        ctx: &mut Context<'_, EmbedBatcher>,
        tenant: &str,
        now: i64,
    ) -> anyhow::Result<Vec<(String, PendingEdit)>> {
        let mut live = ctx.map_entries(&PENDING, tenant)?;
        live.retain(|(doc_id, edit)| {
            let expired = self.expiry(edit.written_at) <= now;
            if expired {
                ctx.map_remove(&PENDING, tenant, doc_id);
                ctx.increment(BatcherCounter::PendingEditsExpired);
            }
            !expired
        });
        Ok(live)
    }

    /// Sends `batch` to the embedder off the processing thread, in one
    /// request, and removes its edits from the pending state now (a newer
    /// edit of the same article that arrives meanwhile waits for a later
    /// batch). The rows are emitted when the vectors are back, in batch
    /// order; completions of one task run in submission order, so a
    /// tenant's batches come out in order. The commit waits for the batch:
    /// the removed edits and their rows commit together.
    fn send(
        &self,
        ctx: &mut Context<'_, EmbedBatcher>,
        tenant: &str,
        batch: &[(String, PendingEdit)],
        batch_time: i64,
    ) -> anyhow::Result<()> {
        let texts: Vec<String> = batch
            .iter()
            .map(|(_, edit)| format!("{}\n\n{}", edit.title, edit.body))
            .collect();
        let rows: Vec<ArticleEmbedding> = batch
            .iter()
            .map(|(doc_id, edit)| ArticleEmbedding {
                tenant_id: tenant.to_string(),
                doc_id: doc_id.clone(),
                updated_at: edit.updated_at,
                title: edit.title.clone(),
                embedding: Vec::new(),
                batch_time,
            })
            .collect();
        for (doc_id, _) in batch {
            ctx.map_remove(&PENDING, tenant, doc_id);
        }
        let embedder = self.embedder.clone();
        let shutdown = ctx.shutdown_flag();
        let tenant = tenant.to_string();
        ctx.submit(move || {
            let vectors = embedder.embed(&texts, || shutdown.load(Ordering::Relaxed))?;
            Ok(Box::new(
                move |_: &mut EmbedBatcher, ctx: &mut Context<'_, EmbedBatcher>| {
                    for (mut row, embedding) in rows.into_iter().zip(vectors) {
                        row.embedding = embedding;
                        ctx.emit(Some(&tenant), &row)?;
                    }
                    ctx.increment(BatcherCounter::BatchesSent);
                    Ok(())
                },
            ) as Completion<EmbedBatcher>)
        });
        Ok(())
    }
}

/// Stores `progress` and sets the expiry timer by it; when nothing is
/// pending, removes both. The batch timer is left alone: only `process`
/// (earlier) and the batch timer itself (re-set, or cleared when it finds
/// nothing pending) move it, so expiry does not change when batches go.
fn save_progress(
    ctx: &mut Context<'_, EmbedBatcher>,
    tenant: &str,
    progress: &Progress,
) -> anyhow::Result<()> {
    if progress.pending == 0 {
        ctx.clear_wall_clock_timer(tenant, TenantTimer::Expiry);
        ctx.delete(&PROGRESS, tenant);
        return Ok(());
    }
    if ctx.wall_clock_timer(tenant, TenantTimer::Expiry) != Some(progress.expiry_check) {
        ctx.set_wall_clock_timer(tenant, TenantTimer::Expiry, progress.expiry_check);
    }
    ctx.put(&PROGRESS, tenant, progress)
}

impl Processor for EmbedBatcher {
    type Input = Article;
    type Output = ArticleEmbedding;
    type Timers = TenantTimer;
    const STORES: &'static [StoreSpec] = STORES;

    fn process(
        &mut self,
        ctx: &mut Context<'_, EmbedBatcher>,
        record: Record<'_, Article>,
    ) -> anyhow::Result<()> {
        let edit = record.value;
        let tenant = edit.tenant_id.as_str();
        let now = ctx.now();
        let mut progress = match ctx.get(&PROGRESS, tenant)? {
            Some(progress) if progress.expiry_check <= now => {
                let live = self.live_entries(ctx, tenant, now)?;
                self.progress_of(&live)
            }
            Some(progress) => progress,
            None => self.progress_of(&[]),
        };
        let waiting = ctx.map_get(&PENDING, tenant, &edit.doc_id)?;
        match waiting {
            Some(waiting) if edit.updated_at <= waiting.updated_at => {
                // A newer (or the same) edit of this article is already waiting.
                ctx.increment(BatcherCounter::EditsSuperseded);
                return save_progress(ctx, tenant, &progress);
            }
            Some(_) => ctx.increment(BatcherCounter::EditsReplaced),
            None => progress.pending += 1,
        }
        let entry = PendingEdit {
            updated_at: edit.updated_at,
            title: edit.title,
            body: edit.body,
            written_at: now,
        };
        ctx.map_put(&PENDING, tenant, &edit.doc_id, &entry)?;
        progress.expiry_check = progress.expiry_check.min(self.expiry(now));
        let pending = usize::try_from(progress.pending).unwrap_or(usize::MAX);
        let wake_up = wake_up_after_edit(edit.updated_at, pending, self.batch_size, self.max_wait);
        if ctx
            .timer(tenant, TenantTimer::Batch)
            .is_none_or(|current| wake_up < current)
        {
            ctx.set_timer(tenant, TenantTimer::Batch, wake_up);
        }
        save_progress(ctx, tenant, &progress)
    }

    fn on_timer(
        &mut self,
        ctx: &mut Context<'_, EmbedBatcher>,
        timer: Timer<'_, TenantTimer>,
    ) -> anyhow::Result<()> {
        let tenant = timer.key;
        let mut waiting = self.live_entries(ctx, tenant, ctx.now())?;
        if timer.name == TenantTimer::Expiry {
            return save_progress(ctx, tenant, &self.progress_of(&waiting));
        }
        waiting.sort_by(|(doc_a, a), (doc_b, b)| (a.updated_at, doc_a).cmp(&(b.updated_at, doc_b)));
        let times: Vec<i64> = waiting.iter().map(|(_, edit)| edit.updated_at).collect();
        let plan = plan_batches(&times, ctx.watermark(), self.batch_size, self.max_wait);
        for batch in &plan.batches {
            self.send(ctx, tenant, &waiting[batch.clone()], timer.time)?;
        }
        match plan.next_timer {
            Some(time) => ctx.set_timer(tenant, TenantTimer::Batch, time),
            None => ctx.clear_timer(tenant, TenantTimer::Batch),
        }
        let progress = self.progress_of(&waiting[plan.sent()..]);
        save_progress(ctx, tenant, &progress)
    }

    /// An edit at or before the watermark is late.
    fn is_late(&self, event_time: i64, watermark: i64) -> bool {
        watermark != NO_WATERMARK && event_time <= watermark
    }
}
