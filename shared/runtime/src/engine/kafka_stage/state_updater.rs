//! The state updater: a thread beside each processing thread that opens its
//! tasks, so that restoring a task's store from its changelogs and loading
//! its timers never stop the tasks already running (Kafka Streams' state
//! updater thread, KIP-869).
//!
//! The processing thread asks for a task when the group assigns it all its
//! partitions, and keeps those partitions paused; it goes on processing its
//! other tasks and polling the group meanwhile. The updater opens the tasks
//! one after another, in the order asked (a task whose store another
//! thread or process still holds waits while the next ones open), and hands
//! each back ready to run; the processing thread installs it and resumes
//! its partitions. A task
//! revoked while it opens is cancelled: its restore stops at the next batch,
//! keeping what it wrote with its checkpoint, and the next owner (or this
//! instance, when the task comes back) goes on from there.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::store_opening::{CommittedInput, StoreOpener};
use crate::engine::lifecycle::TaskOpener;
use crate::processor::Processor;
use crate::shutdown::Interrupted;
use crate::state::store::TaskStore;
use crate::task::Task;

/// A task to open.
struct Request<P: Processor> {
    partition: i32,
    /// Tells this request from an earlier one of the same task.
    id: u64,
    committed: Option<CommittedInput>,
    cancel: Arc<AtomicBool>,
    opener: TaskOpener<P>,
    /// The processing thread's span, so that the opening logs as its thread.
    span: tracing::Span,
}

/// A task opened, ready to run.
pub(super) struct OpenedTask<P: Processor> {
    pub task: Task<P>,
    /// Changelog records replayed into its store.
    pub restored: u64,
    /// At-least-once, the next input offset of each task topic (by task
    /// topic index) recorded with the state.
    pub positions: Vec<Option<i64>>,
    /// How long the task took to open, its wait in the queue included.
    pub elapsed: Duration,
}

/// What became of a request.
struct Outcome<P: Processor> {
    partition: i32,
    id: u64,
    result: anyhow::Result<OpenedTask<P>>,
}

/// The processing thread's handle on its state updater thread.
pub(super) struct StateUpdater<P: Processor> {
    requests: Option<Sender<Request<P>>>,
    outcomes: Receiver<Outcome<P>>,
    /// The tasks being opened: the id of the request that counts, and the
    /// flag that cancels it.
    opening: BTreeMap<i32, (u64, Arc<AtomicBool>)>,
    next_id: u64,
    thread: Option<JoinHandle<()>>,
}

impl<P: Processor> StateUpdater<P> {
    /// Starts the updater thread, which opens stores with `opener`.
    pub fn start(opener: StoreOpener) -> anyhow::Result<Self> {
        let (requests, to_open) = mpsc::channel::<Request<P>>();
        let (outcomes_tx, outcomes) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("state-updater".to_string())
            .spawn(move || run(&opener, &to_open, &outcomes_tx))
            .map_err(|e| anyhow::anyhow!("cannot start the state updater thread: {e}"))?;
        Ok(StateUpdater {
            requests: Some(requests),
            outcomes,
            opening: BTreeMap::new(),
            next_id: 0,
            thread: Some(thread),
        })
    }

    /// Asks for task `partition` to be opened; `committed` is the group's
    /// last commit of its inputs (at-least-once only).
    pub fn request(
        &mut self,
        partition: i32,
        committed: Option<CommittedInput>,
        opener: TaskOpener<P>,
    ) {
        self.cancel(partition);
        self.next_id += 1;
        let cancel = Arc::new(AtomicBool::new(false));
        self.opening
            .insert(partition, (self.next_id, cancel.clone()));
        let request = Request {
            partition,
            id: self.next_id,
            committed,
            cancel,
            opener,
            span: tracing::Span::current(),
        };
        if let Some(requests) = &self.requests {
            // The thread ends only when this handle is dropped.
            let _ = requests.send(request);
        }
    }

    /// Cancels the opening of task `partition`, if it is being opened.
    pub fn cancel(&mut self, partition: i32) {
        if let Some((_, cancel)) = self.opening.remove(&partition) {
            cancel.store(true, Ordering::Relaxed);
        }
    }

    /// Whether task `partition` is being opened.
    pub fn is_opening(&self, partition: i32) -> bool {
        self.opening.contains_key(&partition)
    }

    /// The tasks being opened.
    pub fn opening(&self) -> impl Iterator<Item = i32> + '_ {
        self.opening.keys().copied()
    }

    /// Whether no task is being opened.
    pub fn is_idle(&self) -> bool {
        self.opening.is_empty()
    }

    /// The tasks opened since the last call, without waiting. A task
    /// cancelled meanwhile is dropped (its store closes); a failure to open
    /// a task that is still wanted is returned as the error.
    pub fn take_opened(&mut self) -> anyhow::Result<Vec<OpenedTask<P>>> {
        let mut opened = Vec::new();
        while let Ok(outcome) = self.outcomes.try_recv() {
            let wanted = self
                .opening
                .get(&outcome.partition)
                .is_some_and(|(id, _)| *id == outcome.id);
            if !wanted {
                continue;
            }
            self.opening.remove(&outcome.partition);
            match outcome.result {
                Ok(task) => opened.push(task),
                // Errors name the task's store or changelog already.
                Err(error) => return Err(error),
            }
        }
        Ok(opened)
    }

    /// Cancels every opening and waits for the thread to end.
    pub fn stop(&mut self) {
        for (_, cancel) in std::mem::take(&mut self.opening).into_values() {
            cancel.store(true, Ordering::Relaxed);
        }
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<P: Processor> Drop for StateUpdater<P> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long a task waits for its store while another thread or process
/// still holds it: longer than a thread's commit and close take.
const STATE_LOCK_PATIENCE: Duration = Duration::from_secs(60);

/// How often the stores of tasks that wait for them are tried again.
const LOCK_RETRY: Duration = Duration::from_millis(50);

/// A request whose store is not free yet.
struct Queued<P: Processor> {
    request: Request<P>,
    since: Instant,
    warned: bool,
}

/// The updater thread: opens the requested tasks one at a time, in the
/// order asked, skipping those whose store another thread or process still
/// holds (tried again every [`LOCK_RETRY`]), until the processing thread
/// lets go of its handle.
fn run<P: Processor>(
    opener: &StoreOpener,
    to_open: &Receiver<Request<P>>,
    outcomes: &Sender<Outcome<P>>,
) {
    let mut queue: VecDeque<Queued<P>> = VecDeque::new();
    loop {
        if queue.is_empty() {
            let Ok(request) = to_open.recv() else {
                return;
            };
            queue.push_back(Queued::new(request));
        }
        queue.extend(to_open.try_iter().map(Queued::new));
        // A cancelled request is forgotten: the processing thread has.
        queue.retain(|queued| !queued.request.cancel.load(Ordering::Relaxed));
        let Some((index, store)) = first_free_store(opener, &mut queue) else {
            if !queue.is_empty() {
                std::thread::sleep(LOCK_RETRY);
            }
            continue;
        };
        let Queued { request, since, .. } = queue.remove(index).expect("a queued request");
        let result = {
            let _span = request.span.enter();
            store.and_then(|store| open(opener, &request, store))
        };
        let outcome = Outcome {
            partition: request.partition,
            id: request.id,
            result: result.map(|mut opened| {
                opened.elapsed = since.elapsed();
                opened
            }),
        };
        if outcomes.send(outcome).is_err() {
            return;
        }
    }
}

impl<P: Processor> Queued<P> {
    fn new(request: Request<P>) -> Self {
        Queued {
            request,
            since: Instant::now(),
            warned: false,
        }
    }
}

/// The first queued request whose store could be opened (or failed to
/// open, or waited past [`STATE_LOCK_PATIENCE`]), with its store.
fn first_free_store<P: Processor>(
    opener: &StoreOpener,
    queue: &mut VecDeque<Queued<P>>,
) -> Option<(usize, anyhow::Result<TaskStore>)> {
    for (index, queued) in queue.iter_mut().enumerate() {
        let partition = queued.request.partition;
        match opener.try_open_store(partition) {
            Ok(Some(store)) => return Some((index, Ok(store))),
            Err(error) => return Some((index, Err(error))),
            Ok(None) if queued.since.elapsed() >= STATE_LOCK_PATIENCE => {
                let error = anyhow::anyhow!(
                    "state store {} is still locked after {} s: another thread or process \
                     holds it",
                    opener.task_dir(partition).display(),
                    STATE_LOCK_PATIENCE.as_secs()
                );
                return Some((index, Err(error)));
            }
            Ok(None) => {
                if !std::mem::replace(&mut queued.warned, true) {
                    let _span = queued.request.span.enter();
                    tracing::info!(
                        partition,
                        path = %opener.task_dir(partition).display(),
                        "state store locked by its previous owner; waiting (the other tasks open meanwhile)"
                    );
                }
            }
        }
    }
    None
}

/// Opens `request`'s task over its `store`: brought up to date, then its
/// timers and clocks loaded. A cancelled request stops with `Interrupted`.
fn open<P: Processor>(
    opener: &StoreOpener,
    request: &Request<P>,
    store: TaskStore,
) -> anyhow::Result<OpenedTask<P>> {
    let opened = opener.bring_up_to_date(
        request.partition,
        store,
        request.committed.as_ref(),
        &request.cancel,
    )?;
    // Loading timers from a large state is the longest part after a
    // restore: not worth it for a task already revoked.
    if request.cancel.load(Ordering::Relaxed) {
        return Err(Interrupted.into());
    }
    let task = request.opener.open(request.partition, opened.store)?;
    Ok(OpenedTask {
        task,
        restored: opened.restored,
        positions: opened.positions,
        elapsed: Duration::ZERO,
    })
}
