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
//! With no workers configured, a job runs at once on the processing thread
//! (the test driver always does this, so tests are deterministic).

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::processor::Context;

/// What a job gives back: the code that applies its result on the
/// processing thread.
pub type Completion<P> =
    Box<dyn for<'c> FnOnce(&mut P, &mut Context<'c, P>) -> anyhow::Result<()> + Send>;

/// A job: runs off the processing thread, returns its completion.
pub type Job<P> = Box<dyn FnOnce() -> anyhow::Result<Completion<P>> + Send>;

/// Where the result of a job in flight arrives.
pub(crate) type JobResult<P> = Receiver<anyhow::Result<Completion<P>>>;

type Work = Box<dyn FnOnce() + Send>;

/// A fixed pool of job workers shared by a stage's tasks.
pub(crate) struct JobPool {
    sender: Option<Sender<Work>>,
    workers: Vec<JoinHandle<()>>,
}

impl JobPool {
    /// A pool of `workers` threads called `<name>-<index>`; with 0, jobs
    /// run inline.
    pub fn new(name: &str, workers: usize) -> Self {
        if workers == 0 {
            return JobPool {
                sender: None,
                workers: Vec::new(),
            };
        }
        let (sender, receiver) = mpsc::channel::<Work>();
        let receiver = Arc::new(Mutex::new(receiver));
        let workers = (0..workers)
            .map(|index| {
                let receiver = receiver.clone();
                std::thread::Builder::new()
                    .name(format!("{name}-{index}"))
                    .spawn(move || loop {
                        let work = receiver.lock().unwrap().recv();
                        match work {
                            Ok(work) => work(),
                            Err(_) => return,
                        }
                    })
                    .expect("spawn a job worker")
            })
            .collect();
        JobPool {
            sender: Some(sender),
            workers,
        }
    }

    /// Runs `work` (a processor's [`Job`], a state write) on a worker, or at
    /// once here without workers, and returns where its result will arrive.
    pub fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> Receiver<T> {
        let (done, result) = mpsc::channel();
        let work = move || {
            let _ = done.send(work());
        };
        match &self.sender {
            Some(sender) => {
                if let Err(returned) = sender.send(Box::new(work)) {
                    (returned.0)();
                }
            }
            None => work(),
        }
        result
    }
}

impl Drop for JobPool {
    fn drop(&mut self) {
        self.sender.take();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::Processor;

    #[derive(Clone)]
    struct Noop;

    impl Processor for Noop {
        type Input = ();
        type Output = ();
        type Timers = crate::NoTimers;
        const STORES: &'static [&'static str] = &[];
        fn process(
            &mut self,
            _: &mut Context<'_, Self>,
            _: crate::Record<'_, ()>,
        ) -> anyhow::Result<()> {
            Ok(())
        }
        fn on_timer(
            &mut self,
            _: &mut Context<'_, Self>,
            _: crate::Timer<'_, crate::NoTimers>,
        ) -> anyhow::Result<()> {
            Ok(())
        }
    }

    fn job(value: u64, out: Arc<Mutex<Vec<u64>>>) -> Job<Noop> {
        Box::new(move || {
            out.lock().unwrap().push(value);
            Ok(Box::new(|_: &mut Noop, _: &mut Context<'_, Noop>| Ok(())) as Completion<Noop>)
        })
    }

    /// A job that waits (up to a generous deadline) until `started` counts
    /// `all` jobs, and says whether it saw them: only jobs running at the
    /// same time can all see each other.
    fn meeting(started: Arc<Mutex<usize>>, all: usize) -> impl FnOnce() -> bool + Send {
        move || {
            *started.lock().unwrap() += 1;
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while *started.lock().unwrap() < all {
                if std::time::Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            true
        }
    }

    #[test]
    fn jobs_run_concurrently_and_results_arrive_per_job() {
        let pool = JobPool::new("job-worker", 3);
        let started = Arc::new(Mutex::new(0));
        let pending: Vec<_> = (0..3)
            .map(|_| pool.run(meeting(started.clone(), 3)))
            .collect();
        for result in pending {
            assert!(result.recv().unwrap(), "every job saw the others running");
        }
    }

    #[test]
    fn without_workers_a_job_runs_inline() {
        let pool = JobPool::new("job-worker", 0);
        let finished = Arc::new(Mutex::new(Vec::new()));
        let result = pool.run(job(1, finished.clone()));
        assert_eq!(*finished.lock().unwrap(), vec![1]);
        assert!(result.try_recv().unwrap().is_ok());
    }
}
