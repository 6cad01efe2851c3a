//! Stopping on SIGTERM or SIGINT at any point of a service's life.
//!
//! The handlers are installed before anything else, so that a signal
//! during start-up (waiting for input topics, creating topics, registering
//! schemas, initialising transactions) or during a task's restore is not
//! lost: the binary runs as PID 1 in the image, where the kernel ignores a
//! signal that has no handler.
//!
//! Every wait of start-up and restore checks the shutdown flag and gives up
//! with [`Interrupted`]; nothing is committed by then, so stopping there
//! loses nothing. A single request to the broker or the registry is not
//! interruptible: should start-up still be running [`STARTUP_GRACE`] after
//! the signal, the process exits anyway. A second signal always exits at
//! once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};

/// How long start-up may take to notice a shutdown request before the
/// process exits without it.
pub(crate) const STARTUP_GRACE: Duration = Duration::from_secs(5);

/// Exit code of a process stopped by a signal it could not act on in time
/// (128 + SIGTERM, as a shell reports it).
const SIGNALLED_EXIT_CODE: i32 = 143;

/// Start-up or a restore stopped because shutdown was requested: not a
/// failure.
#[derive(Debug, thiserror::Error)]
#[error("stopped: shutdown requested")]
pub(crate) struct Interrupted;

/// Whether `error` is (or was caused by) an [`Interrupted`] wait.
pub(crate) fn is_interrupted(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.is::<Interrupted>())
}

/// `Err(Interrupted)` once `flag` is set.
pub(crate) fn check(flag: &AtomicBool) -> Result<(), Interrupted> {
    if flag.load(Ordering::Relaxed) {
        Err(Interrupted)
    } else {
        Ok(())
    }
}

/// The process's signal handlers, installed.
pub(crate) struct Signals {
    terminate: Signal,
    interrupt: Signal,
}

impl Signals {
    /// Installs handlers for SIGTERM and SIGINT; signals from now on are
    /// kept until [`Signals::watch`] looks. Needs a tokio runtime.
    pub(crate) fn install(runtime: &tokio::runtime::Runtime) -> anyhow::Result<Self> {
        let _entered = runtime.enter();
        Ok(Signals {
            terminate: signal(SignalKind::terminate())
                .map_err(|e| anyhow::anyhow!("cannot install the SIGTERM handler: {e}"))?,
            interrupt: signal(SignalKind::interrupt())
                .map_err(|e| anyhow::anyhow!("cannot install the SIGINT handler: {e}"))?,
        })
    }

    /// Sets `shutdown` at the first signal; exits the process if start-up
    /// (`starting`) is still under way [`STARTUP_GRACE`] later, and at a
    /// second signal.
    pub(crate) async fn watch(mut self, shutdown: Arc<AtomicBool>, starting: Arc<AtomicBool>) {
        let name = self.next().await;
        tracing::info!(signal = name, "shutdown requested");
        shutdown.store(true, Ordering::Relaxed);
        let grace = async {
            tokio::time::sleep(STARTUP_GRACE).await;
            if starting.load(Ordering::Relaxed) {
                tracing::warn!(
                    "start-up did not stop within {}s of the signal; exiting without it \
                     (nothing was committed yet)",
                    STARTUP_GRACE.as_secs()
                );
                exit_now();
            }
            std::future::pending::<()>().await
        };
        tokio::select! {
            () = grace => {}
            name = self.next() => {
                tracing::warn!(signal = name, "second signal: exiting at once");
                exit_now();
            }
        }
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }
}

/// Ends the process at once, as a signal's default action would: no exit
/// handlers (RocksDB's static destructors) run under threads still at work.
fn exit_now() -> ! {
    // SAFETY: _exit only ends the process.
    unsafe { libc::_exit(SIGNALLED_EXIT_CODE) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupted_wait_is_recognised_through_context() {
        let flag = AtomicBool::new(false);
        assert!(check(&flag).is_ok());
        flag.store(true, Ordering::Relaxed);
        let error = anyhow::Error::from(check(&flag).unwrap_err()).context("restoring task 3");
        assert!(is_interrupted(&error));
        assert!(!is_interrupted(&anyhow::anyhow!("broker unreachable")));
    }
}
