//! When jobs in flight hold a stage's tasks back (see [`JobGate`]).

/// Jobs in flight per job worker past which tasks take no more records or
/// wall-clock timers: enough to keep every worker busy between two
/// completions, few enough that a commit, which waits for every job in
/// flight, waits for about two jobs per worker on a steady backlog (one
/// record that fires many timers still sets off all their jobs; see
/// [`JobGate`]).
const JOBS_PER_WORKER: usize = 2;

/// When jobs in flight stop tasks from taking records and timers.
///
/// A commit waits for every job its tasks have started, so that what a
/// job's submission changed in state and what its completion emits commit
/// together. Two rules bound that wait whatever the backlog:
///
/// * at most a fixed number of jobs are in flight: a backlog is taken in
///   as fast as jobs complete, not submitted whole into one commit (after a
///   restore, embed-batcher's timers once submitted every pending batch of a
///   backlog at once, and the commit waited for all of them);
/// * once a commit is due, nothing new is taken until the jobs in flight
///   are done, so the commit comes (a steady stream would otherwise keep
///   jobs in flight forever) and, sealed then, waits for none.
///
/// With no job workers, jobs run inline and nothing is ever held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct JobGate {
    limit: Option<usize>,
}

impl JobGate {
    pub(super) fn for_workers(workers: usize) -> Self {
        JobGate {
            limit: (workers > 0).then(|| workers * JOBS_PER_WORKER),
        }
    }

    /// Whether tasks must wait, with `in_flight` jobs running and a commit
    /// due or not.
    pub(super) fn holds(self, in_flight: usize, commit_due: bool) -> bool {
        self.limit
            .is_some_and(|limit| in_flight >= limit || (in_flight > 0 && commit_due))
    }
}

#[cfg(test)]
mod tests {
    use super::JobGate;

    #[test]
    fn without_workers_jobs_never_hold_the_tasks() {
        let gate = JobGate::for_workers(0);
        assert!(!gate.holds(0, true));
        assert!(!gate.holds(1_000, true));
    }

    #[test]
    fn tasks_wait_once_every_worker_has_two_jobs() {
        let gate = JobGate::for_workers(2);
        assert!(!gate.holds(3, false));
        assert!(gate.holds(4, false));
        assert!(gate.holds(5, false));
    }

    #[test]
    fn a_due_commit_holds_the_tasks_until_its_jobs_are_done() {
        let gate = JobGate::for_workers(2);
        assert!(gate.holds(1, true));
        assert!(
            !gate.holds(0, true),
            "with no job in flight the commit goes"
        );
    }
}
