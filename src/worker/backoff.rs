//! Waiting on the ps tasks: capped exponential back-off, with the reason
//! logged on a schedule so no wait is silent.

use super::WorkerError;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Back-off between retries of an unreachable or uninitialized ps: starts
/// short so recovery is quick, capped so no worker sleeps long.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A wait shorter than this is logged at INFO: the ps tasks may be starting.
const QUIET_WAIT: Duration = Duration::from_secs(2);
/// A wait that makes no progress for this long is logged (again).
pub(super) const WAIT_LOG_EVERY: Duration = Duration::from_secs(10);

/// Retries with capped exponential back-off, logging a reason now and then.
pub(super) struct Backoff {
    delay: Duration,
    since: Instant,
    logged: Option<Instant>,
    /// A reason since the last log that says what to fix (a TLS mismatch
    /// shows as one of several errors, depending on timing): logged in
    /// preference to a bare one.
    explained: Option<String>,
    /// The explained reason logged last: a new one is logged at once, not
    /// at the next turn of the schedule (an expired certificate once
    /// reached the log only 10 s after the first failed handshake).
    told: Option<String>,
}

impl Backoff {
    pub(super) fn new() -> Self {
        Self {
            delay: BACKOFF_MIN,
            since: Instant::now(),
            logged: None,
            explained: None,
            told: None,
        }
    }

    /// True when the reason is due to be logged (again).
    pub(super) fn should_log(&mut self) -> bool {
        let due = self.logged.is_none_or(|t| t.elapsed() >= WAIT_LOG_EVERY);
        if due {
            self.logged = Some(Instant::now());
        }
        due
    }

    /// Sleeps the next back-off delay. Errors: [`WorkerError::Interrupted`]
    /// as soon as `shutdown` is cancelled, so a stop never waits on a dead ps.
    pub(super) async fn wait(
        &mut self,
        why: &str,
        shutdown: &CancellationToken,
    ) -> Result<(), WorkerError> {
        let explains = why.contains(crate::auth::TLS_ADVICE) || why.contains("certificate");
        if explains {
            self.explained = Some(why.to_owned());
        }
        let news = explains && self.told.as_deref() != Some(why);
        if news {
            self.logged = None;
        }
        if self.should_log() {
            let explained = self.explained.take();
            if explained.is_some() {
                self.told.clone_from(&explained);
            }
            let (waited, reason) = (self.since.elapsed(), explained.as_deref().unwrap_or(why));
            let message = "Waiting for the ps tasks (if the run is already complete they have exited, and this worker can be stopped).";
            // A worker started a moment before its ps (dtf local, a host's boot) says so,
            // but warns only of a wait that lasts or of a reason that says what to fix.
            if explained.is_some() || waited >= QUIET_WAIT {
                warn!(waited_secs = waited.as_secs(), reason, "{message}");
            } else {
                info!(waited_secs = waited.as_secs(), reason, "{message}");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(self.delay) => {}
            _ = shutdown.cancelled() => return Err(WorkerError::Interrupted),
        }
        self.delay = (self.delay * 2).min(BACKOFF_MAX);
        Ok(())
    }
}
