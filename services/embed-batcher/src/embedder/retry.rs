//! Retrying a failing embedder: no edit may be dropped because of it.
//!
//! A failed request (network error, HTTP error status, malformed answer) is
//! retried after an exponentially growing pause, capped, for as long as it
//! takes — or until the service is asked to stop, which ends the wait with
//! an error. The batch's edits stay in state meanwhile and nothing of the
//! batch is emitted, so neither a crash nor a stop during the wait loses
//! anything: the stopped instance does not commit, and the batch is sent
//! after the restart.

use std::time::Duration;

use super::Embedder;

/// Pause after the first failure.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// Longest pause between attempts.
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Retries `inner` until it succeeds.
#[derive(Debug)]
pub struct Retrying<E> {
    inner: E,
    first_pause: Duration,
    max_pause: Duration,
}

impl<E: Embedder> Retrying<E> {
    /// Retries `inner` with pauses from 100 ms doubling up to 30 s.
    pub fn new(inner: E) -> Self {
        Self::with_pauses(inner, FIRST_PAUSE, MAX_PAUSE)
    }

    /// Retries `inner` with pauses from `first_pause` doubling up to `max_pause`.
    pub fn with_pauses(inner: E, first_pause: Duration, max_pause: Duration) -> Self {
        Retrying {
            inner,
            first_pause,
            max_pause,
        }
    }
}

/// The pause after `pause`: twice as long, at most `max`.
fn next_pause(pause: Duration, max: Duration) -> Duration {
    pause.saturating_mul(2).min(max)
}

/// How often a pause checks whether the service is stopping.
const STOP_CHECK: Duration = Duration::from_millis(100);

impl<E: Embedder> Retrying<E> {
    /// Embeds `texts`, retrying failures until an answer fits or `stopping`
    /// says the service is stopping.
    pub fn embed(
        &self,
        texts: &[String],
        stopping: impl Fn() -> bool,
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        let mut pause = self.first_pause;
        let mut attempt = 1u64;
        loop {
            match self.inner.embed(texts) {
                Ok(vectors) if vectors.len() == texts.len() => return Ok(vectors),
                Ok(vectors) => tracing::warn!(
                    attempt,
                    expected = texts.len(),
                    got = vectors.len(),
                    "embedder returned the wrong number of vectors; retrying in {pause:?}"
                ),
                Err(error) => tracing::warn!(
                    attempt,
                    "embedding request failed: {error:#}; retrying in {pause:?}"
                ),
            }
            let resume = std::time::Instant::now() + pause;
            while let Some(left) = resume.checked_duration_since(std::time::Instant::now()) {
                anyhow::ensure!(
                    !stopping(),
                    "stopping while the embedder fails; the batch stays pending"
                );
                std::thread::sleep(left.min(STOP_CHECK));
            }
            pause = next_pause(pause, self.max_pause);
            attempt += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Fails its first `failures` calls, then answers one `[i]` per text.
    struct Flaky {
        failures: usize,
        calls: AtomicUsize,
    }

    impl Embedder for Flaky {
        fn embed(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            anyhow::ensure!(call >= self.failures, "down");
            if call == self.failures {
                return Ok(Vec::new()); // a malformed answer is a failure too
            }
            Ok((0..texts.len()).map(|i| vec![i as f32]).collect())
        }
    }

    #[test]
    fn failures_are_retried_until_an_answer_fits() {
        let flaky = Flaky {
            failures: 3,
            calls: AtomicUsize::new(0),
        };
        let retrying =
            Retrying::with_pauses(flaky, Duration::from_millis(1), Duration::from_millis(2));
        let texts = vec!["a".to_string(), "b".to_string()];
        assert_eq!(
            retrying.embed(&texts, || false).unwrap(),
            vec![vec![0.0], vec![1.0]]
        );
        assert_eq!(retrying.inner.calls.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn a_stop_ends_the_retries_with_an_error() {
        let down = Flaky {
            failures: usize::MAX,
            calls: AtomicUsize::new(0),
        };
        let retrying =
            Retrying::with_pauses(down, Duration::from_secs(30), Duration::from_secs(30));
        let texts = vec!["a".to_string()];
        let error = retrying.embed(&texts, || true).unwrap_err();
        assert!(error.to_string().contains("stopping"), "{error}");
        assert_eq!(retrying.inner.calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut pause = FIRST_PAUSE;
        let mut pauses = Vec::new();
        for _ in 0..11 {
            pauses.push(pause.as_millis());
            pause = next_pause(pause, MAX_PAUSE);
        }
        assert_eq!(
            pauses,
            [100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
        );
    }
}
