//! The batching processor: per tenant, pending edits by doc_id and one batch
//! timer, as in the seed's `EMBED_IN_BATCHES` PTF (SPEC "embed-batcher").
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
//! state (the seed's restart bug cannot happen). Lateness: an edit at or
//! before the task watermark is late (`<=`, the seed's rule).
//!
//! `process` only moves the timer earlier ([`wake_up_after_edit`]); the timer
//! sends what the watermark allows and re-arms itself ([`plan_batches`]).
//! A batch's rows carry the timer's time as `batch_time`.
//!
//! **State TTL** (wall clock, like Flink's TTL with cleanup on read): an
//! entry not written for `state-ttl` is dropped and counted
//! (`pending_edits_expired`) the next time its tenant is touched — when a
//! record of the tenant is processed (only if `progress` says an entry may
//! have expired) or when its timer fires. Cleanup is lazy: an expired entry
//! of a tenant that is never touched again stays on disk, but it can never be
//! sent, because a tenant with pending edits always has a timer and the
//! timer drops expired entries before sending.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use streams_runtime::{
    Context, InputStream, MapState, Processor, Record, Timer, Topology, ValueState, NO_WATERMARK,
};

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

/// Pending edits per tenant, by doc_id. Store names are permanent.
const PENDING: MapState<String, PendingEdit> = MapState::new("pending");
/// Per-tenant bookkeeping.
const PROGRESS: ValueState<Progress> = ValueState::new("progress");
/// The tenant's one batch timer.
const BATCH_TIMER: &str = "batch";

/// Builds the topology: articles in, embeddings out.
pub fn topology(settings: &Settings) -> anyhow::Result<Topology<Article>> {
    Ok(Topology::new(
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
    .store(PENDING.name())
    .store(PROGRESS.name())
    .max_out_of_orderness(settings.max_out_of_orderness))
}

/// The processor; cloned per task, sharing one embedder.
#[derive(Clone)]
pub struct EmbedBatcher {
    batch_size: usize,
    max_wait: i64,
    state_ttl: i64,
    embedder: Arc<Retrying<Box<dyn Embedder>>>,
}

/// Wall-clock milliseconds since the epoch.
fn wall_clock() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
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
        ctx: &mut Context<'_, ArticleEmbedding>,
        tenant: &str,
        now: i64,
    ) -> anyhow::Result<Vec<(String, PendingEdit)>> {
        let mut live = ctx.map_entries(&PENDING, tenant)?;
        live.retain(|(doc_id, edit)| {
            let expired = self.expiry(edit.written_at) <= now;
            if expired {
                ctx.map_remove(&PENDING, tenant, doc_id);
                ctx.increment("pending_edits_expired");
            }
            !expired
        });
        Ok(live)
    }

    /// Embeds `batch` in one request and emits its rows in batch order,
    /// removing the sent edits from state.
    fn send(
        &self,
        ctx: &mut Context<'_, ArticleEmbedding>,
        tenant: &str,
        batch: &[(String, PendingEdit)],
        batch_time: i64,
    ) -> anyhow::Result<()> {
        let texts: Vec<String> = batch
            .iter()
            .map(|(_, edit)| format!("{}\n\n{}", edit.title, edit.body))
            .collect();
        let vectors = self.embedder.embed(&texts, || ctx.shutdown_requested())?;
        for ((doc_id, edit), embedding) in batch.iter().zip(vectors) {
            let row = ArticleEmbedding {
                tenant_id: tenant.to_string(),
                doc_id: doc_id.clone(),
                updated_at: edit.updated_at,
                title: edit.title.clone(),
                embedding,
                batch_time,
            };
            ctx.emit(Some(tenant), &row)?;
            ctx.map_remove(&PENDING, tenant, doc_id);
        }
        ctx.increment("batches_sent");
        Ok(())
    }
}

/// Stores `progress`, or removes it when nothing is pending.
fn save_progress(
    ctx: &mut Context<'_, ArticleEmbedding>,
    tenant: &str,
    progress: &Progress,
) -> anyhow::Result<()> {
    ctx.put_or_delete(&PROGRESS, tenant, Some(progress).filter(|p| p.pending > 0))
}

impl Processor for EmbedBatcher {
    type Input = Article;
    type Output = ArticleEmbedding;

    fn process(
        &mut self,
        ctx: &mut Context<'_, ArticleEmbedding>,
        record: Record<'_, Article>,
    ) -> anyhow::Result<()> {
        let edit = record.value;
        let tenant = edit.tenant_id.as_str();
        let now = wall_clock();
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
                ctx.increment("edits_superseded");
                return save_progress(ctx, tenant, &progress);
            }
            Some(_) => ctx.increment("edits_replaced"),
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
            .timer(tenant, BATCH_TIMER)
            .is_none_or(|current| wake_up < current)
        {
            ctx.set_timer(tenant, BATCH_TIMER, wake_up);
        }
        save_progress(ctx, tenant, &progress)
    }

    fn on_timer(
        &mut self,
        ctx: &mut Context<'_, ArticleEmbedding>,
        timer: Timer<'_>,
    ) -> anyhow::Result<()> {
        let tenant = timer.key;
        let mut waiting = self.live_entries(ctx, tenant, wall_clock())?;
        waiting.sort_by(|(doc_a, a), (doc_b, b)| (a.updated_at, doc_a).cmp(&(b.updated_at, doc_b)));
        let times: Vec<i64> = waiting.iter().map(|(_, edit)| edit.updated_at).collect();
        let plan = plan_batches(&times, ctx.watermark(), self.batch_size, self.max_wait);
        for batch in &plan.batches {
            self.send(ctx, tenant, &waiting[batch.clone()], timer.time)?;
        }
        match plan.next_timer {
            Some(time) => ctx.set_timer(tenant, BATCH_TIMER, time),
            None => ctx.clear_timer(tenant, BATCH_TIMER),
        }
        let progress = self.progress_of(&waiting[plan.sent()..]);
        save_progress(ctx, tenant, &progress)
    }

    /// The seed's rule: an edit at or before the watermark is late.
    fn is_late(&self, event_time: i64, watermark: i64) -> bool {
        watermark != NO_WATERMARK && event_time <= watermark
    }
}
