//! A fixed pool of worker threads that run closures and hand their results
//! back through a channel: processors' jobs (`jobs`) and state writes
//! (`state::store`) run on such pools. It knows nothing of what it runs.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Work = Box<dyn FnOnce() + Send>;

/// A fixed pool of workers.
pub(crate) struct WorkerPool {
    sender: Option<Sender<Work>>,
    workers: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// A pool of `workers` threads called `<name>-<index>`; with 0, jobs
    /// run inline.
    pub fn new(name: &str, workers: usize) -> Self {
        if workers == 0 {
            return WorkerPool {
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
        WorkerPool {
            sender: Some(sender),
            workers,
        }
    }

    /// Runs `work` (a processor's job, a state write) on a worker, or at
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

impl Drop for WorkerPool {
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
    use std::time::{Duration, Instant};

    /// A closure that waits (up to a generous deadline) until `started`
    /// counts `all`, and says whether it saw them: only closures running at
    /// the same time can all see each other.
    fn meeting(started: Arc<Mutex<usize>>, all: usize) -> impl FnOnce() -> bool + Send {
        move || {
            *started.lock().unwrap() += 1;
            let deadline = Instant::now() + Duration::from_secs(30);
            while *started.lock().unwrap() < all {
                if Instant::now() > deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            true
        }
    }

    #[test]
    fn work_runs_concurrently_and_results_arrive_per_call() {
        let pool = WorkerPool::new("worker", 3);
        let started = Arc::new(Mutex::new(0));
        let results: Vec<_> = (0..3)
            .map(|_| pool.run(meeting(started.clone(), 3)))
            .collect();
        for result in results {
            assert!(result.recv().unwrap(), "every call saw the others running");
        }
    }

    #[test]
    fn without_workers_work_runs_inline() {
        let pool = WorkerPool::new("worker", 0);
        let ran = Arc::new(Mutex::new(false));
        let flag = ran.clone();
        let result = pool.run(move || *flag.lock().unwrap() = true);
        assert!(*ran.lock().unwrap(), "ran before run returned");
        assert!(result.try_recv().is_ok());
    }
}
