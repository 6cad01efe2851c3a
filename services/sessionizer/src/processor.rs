//! The session processor: one open session and one inactivity timer per user.

use serde::{Deserialize, Serialize};
use streams_runtime::prelude::*;

use crate::model::{UserEvent, UserSession};
use crate::settings::Settings;

/// A user's open session.
#[derive(Debug, Serialize, Deserialize)]
struct Session {
    /// Smallest event time among the session's events.
    start: i64,
    /// Largest event time among the session's events.
    latest: i64,
    /// Event types in arrival order.
    events: Vec<String>,
}

/// What a session's timer follows from (see `derive_timers`): a
/// [`Session`] read without its events.
#[derive(Deserialize)]
struct SessionLatest {
    latest: i64,
}

streams_runtime::stores! {
    /// The open session of each user.
    SESSIONS: ValueState<Session> = "sessions";
}

streams_runtime::timer_names! {
    /// A user's inactivity timeout.
    pub enum SessionTimer {
        Inactivity = "inactivity",
    }
}

streams_runtime::counter_names! {
    /// How sessions end.
    pub enum SessionCounter {
        Completed = "sessions_completed",
        TimedOut = "sessions_timed_out",
    }
}

const COMPLETED: &str = "COMPLETED";
const TIMEOUT: &str = "TIMEOUT";

/// The service: user events in, sessions out.
pub fn pipeline(settings: Settings) -> anyhow::Result<Pipeline> {
    let processor = Sessionizer::new(&settings);
    let topology = Topology::new(
        "sessionizer",
        &settings.output_topic,
        topic_schemas::USER_SESSIONS,
    )
    .input(InputStream::new(
        &settings.input_topic,
        topic_schemas::USER_EVENTS,
        |e: &UserEvent| e.event_time,
        |e| e,
    )?)
    .max_out_of_orderness(settings.max_out_of_orderness);
    Ok(Pipeline::new(settings.runtime, topology, processor))
}

#[derive(Debug, Clone)]
pub struct Sessionizer {
    timeout: i64,
}

impl Sessionizer {
    pub fn new(settings: &Settings) -> Self {
        Sessionizer {
            timeout: settings.session_timeout.as_millis_i64(),
        }
    }

    /// When `session` times out unless another event comes.
    fn inactivity_deadline(&self, latest: i64) -> i64 {
        latest.saturating_add(self.timeout)
    }

    /// Emits `user`'s ended `session`, which the caller has taken out of
    /// state, and clears its timer.
    fn end(
        ctx: &mut Context<'_, Self>,
        user: &str,
        session: Session,
        status: &'static str,
        end: i64,
    ) -> anyhow::Result<()> {
        ctx.clear_timer(user, SessionTimer::Inactivity);
        let summary = UserSession {
            user_id: user.to_string(),
            status,
            duration_millis: end - session.start,
            event_count: session.events.len() as i32,
            event_sequence: session.events.join(" > "),
            session_start: session.start,
            session_end: end,
        };
        ctx.emit(Some(user), &summary)
    }
}

impl Processor for Sessionizer {
    type Input = UserEvent;
    type Output = UserSession;
    type Timers = SessionTimer;
    const STORES: &'static [StoreSpec] = STORES;

    fn process(
        &mut self,
        ctx: &mut Context<'_, Self>,
        record: Record<'_, UserEvent>,
    ) -> anyhow::Result<()> {
        let UserEvent {
            user_id,
            event_type,
            ..
        } = record.value;
        let time = record.event_time;
        // The session is changed in place; a logout takes it out.
        let add_event = |slot: &mut Option<Session>| {
            let session = slot.get_or_insert_with(|| Session {
                start: time,
                latest: time,
                events: Vec::new(),
            });
            session.start = session.start.min(time);
            session.latest = session.latest.max(time);
            let is_logout = event_type == "LOGOUT";
            session.events.push(event_type);
            let deadline = self.inactivity_deadline(session.latest);
            (if is_logout { slot.take() } else { None }, deadline)
        };
        // A user has an open session exactly while its inactivity timer is
        // set (`end` clears it; see `derive_timers`): without one there is
        // nothing to read, and a user's first event costs no state lookup
        // (which would miss the read cache and go to RocksDB).
        let (completed, deadline) = if ctx.may_have_timer(&user_id, SessionTimer::Inactivity) {
            ctx.update(&SESSIONS, &user_id, add_event)?
        } else {
            ctx.update_new(&SESSIONS, &user_id, add_event)?
        };
        if let Some(session) = completed {
            ctx.increment(SessionCounter::Completed);
            return Self::end(ctx, &user_id, session, COMPLETED, time);
        }
        ctx.set_timer(&user_id, SessionTimer::Inactivity, deadline);
        Ok(())
    }

    fn on_timer(
        &mut self,
        ctx: &mut Context<'_, Self>,
        timer: Timer<'_, SessionTimer>,
    ) -> anyhow::Result<()> {
        if let Some(session) = ctx.update(&SESSIONS, timer.key, Option::take)? {
            ctx.increment(SessionCounter::TimedOut);
            Self::end(ctx, timer.key, session, TIMEOUT, timer.time)?;
        }
        Ok(())
    }

    const DERIVE_TIMERS: Option<DeriveTimers<Self>> = Some(Self::derive_timers);
}

impl Sessionizer {
    /// Every open session has its inactivity timer at its latest event plus
    /// the timeout, and a session ends (and is deleted) when it fires: the
    /// timers are a function of the sessions, so none is written to a
    /// changelog.
    fn derive_timers(
        &self,
        state: &StateView<'_>,
        timers: &mut DerivedTimers<'_, Self>,
    ) -> anyhow::Result<()> {
        state.for_each_as(&SESSIONS, |user, session: SessionLatest| {
            timers.set_timer(
                user,
                SessionTimer::Inactivity,
                self.inactivity_deadline(session.latest),
            );
            Ok(())
        })
    }
}
