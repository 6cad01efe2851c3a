//! The deduplicating processor: per click id, the event time of the click
//! that went through, forgotten by an event-time timer `--ttl` later.

use streams_runtime::prelude::*;

use crate::model::Click;
use crate::settings::Settings;

streams_runtime::stores! {
    /// The event time of each remembered click id's first click.
    SEEN: ValueState<i64> = "seen";
}

streams_runtime::timer_names! {
    /// When a click id is forgotten.
    pub enum DedupTimer {
        Expiry = "expiry",
    }
}

streams_runtime::counter_names! {
    /// What became of the clicks that were not forwarded, and of the ids.
    pub enum DedupCounter {
        DuplicatesDropped = "duplicates_dropped",
        IdsExpired = "ids_expired",
    }
}

/// The service: clicks in, each click id's first click out.
pub fn pipeline(settings: Settings) -> anyhow::Result<Pipeline> {
    let processor = Deduplicator::new(&settings)?;
    let topology = Topology::new(
        "deduplicator",
        &settings.output_topic,
        topic_schemas::UNIQUE_CLICKS,
    )
    .input(InputStream::new(
        &settings.input_topic,
        topic_schemas::CLICKS,
        |click: &Click| click.clicked_at,
        |click| click,
    )?)
    .max_out_of_orderness(settings.max_out_of_orderness);
    Ok(Pipeline::new(settings.runtime, topology, processor))
}

#[derive(Debug, Clone)]
pub struct Deduplicator {
    ttl: i64,
}

impl Deduplicator {
    pub fn new(settings: &Settings) -> anyhow::Result<Self> {
        let ttl = settings.ttl.as_millis_i64();
        anyhow::ensure!(ttl > 0, "--ttl must be at least 1ms");
        Ok(Deduplicator { ttl })
    }

    /// When the id of a click first seen at `first` is forgotten.
    fn expiry(&self, first: i64) -> i64 {
        first.saturating_add(self.ttl)
    }
}

impl Processor for Deduplicator {
    type Input = Click;
    type Output = Click;
    type Timers = DedupTimer;
    const STORES: &'static [StoreSpec] = STORES;

    fn process(
        &mut self,
        ctx: &mut Context<'_, Self>,
        record: Record<'_, Click>,
    ) -> anyhow::Result<()> {
        let click = record.value;
        let first_time = ctx.update(&SEEN, &click.click_id, |seen| {
            let first_time = seen.is_none();
            seen.get_or_insert(record.event_time);
            first_time
        })?;
        if !first_time {
            ctx.increment(DedupCounter::DuplicatesDropped);
            return Ok(());
        }
        ctx.set_timer(
            &click.click_id,
            DedupTimer::Expiry,
            self.expiry(record.event_time),
        );
        ctx.emit(Some(&click.click_id), &click)
    }

    fn on_timer(
        &mut self,
        ctx: &mut Context<'_, Self>,
        timer: Timer<'_, DedupTimer>,
    ) -> anyhow::Result<()> {
        ctx.delete(&SEEN, timer.key);
        ctx.increment(DedupCounter::IdsExpired);
        Ok(())
    }

    const DERIVE_TIMERS: Option<DeriveTimers<Self>> = Some(Self::derive_timers);
}

impl Deduplicator {
    /// Every remembered id is forgotten `--ttl` after its first click, and
    /// deleted when that timer fires: the timers follow from `seen`, so none
    /// is written to a changelog.
    fn derive_timers(
        &self,
        state: &StateView<'_>,
        timers: &mut DerivedTimers<'_, Self>,
    ) -> anyhow::Result<()> {
        state.for_each(&SEEN, |click_id, first: i64| {
            timers.set_timer(click_id, DedupTimer::Expiry, self.expiry(first));
            Ok(())
        })
    }
}
