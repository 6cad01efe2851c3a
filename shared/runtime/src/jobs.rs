//! Work a processor hands off the processing thread — a call to an external
//! service, a model inference — and the completions that bring its result
//! back.
//!
//! A processor [submits](crate::Context::submit) a job: a closure that runs
//! on one of the stage's job workers and returns a [`Completion`], which in
//! turn runs on the processing thread with the processor and a context, like
//! `process` or `on_timer`. Meanwhile the task goes on with other records.
//! Completions of one task run in the order their jobs were submitted, so a
//! processor that emits in a job's completion keeps its output order. Every
//! job of a task completes before the task commits: a commit never includes
//! state that expects a result without the result (exactly-once), and after
//! a crash uncommitted jobs are simply done again. How the engine keeps
//! that wait bounded and out of any transaction is `JobGate`'s business
//! (`engine/mod.rs`).
//!
//! Jobs run on a [`WorkerPool`](crate::pool::WorkerPool). With no workers
//! configured, a job runs at once on the processing thread (the test driver
//! always does this, so tests are deterministic).

use std::sync::mpsc::Receiver;

use crate::processor::Context;

/// What a job gives back: the code that applies its result on the
/// processing thread.
pub type Completion<P> =
    Box<dyn for<'c> FnOnce(&mut P, &mut Context<'c, P>) -> anyhow::Result<()> + Send>;

/// A job: runs off the processing thread, returns its completion.
pub type Job<P> = Box<dyn FnOnce() -> anyhow::Result<Completion<P>> + Send>;

/// Where the result of a job in flight arrives.
pub(crate) type JobResult<P> = Receiver<anyhow::Result<Completion<P>>>;
