//! The task's conversation with systemd (sd_notify): readiness, status
//! lines, reloading and stopping, and the watchdog's heartbeat.

use crate::worker::Reporter;
use sd_notify::NotifyState;
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::warn;

/// Sends states to systemd; a no-op without `NOTIFY_SOCKET`.
pub fn notify(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        warn!(error = %e, "sd_notify failed.");
    }
}

/// A task's conversation with systemd: remembers whether `READY=1` and
/// `STOPPING=1` were sent, so that a reload before readiness does not claim
/// readiness, `STOPPING=1` goes once, and a stop before readiness knows
/// there is nothing to drain.
#[derive(Debug, Default)]
pub struct Notifier {
    /// `READY=1` was sent: the task is doing its job.
    ready: AtomicBool,
    /// `STOPPING=1` was sent.
    stopping: AtomicBool,
}

impl Notifier {
    /// `READY=1`, with a `STATUS=` line in the same datagram.
    pub fn ready(&self, status: &str) {
        self.ready.store(true, Ordering::SeqCst);
        notify(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// Whether `READY=1` was sent.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// `STOPPING=1`, once.
    pub fn stopping(&self) {
        if !self.stopping.swap(true, Ordering::SeqCst) {
            notify(&[NotifyState::Stopping]);
        }
    }
}

/// Sends `WATCHDOG=1` at half the interval systemd asked for, while the runtime lives.
pub(super) fn start_watchdog() {
    // WATCHDOG_USEC=0 would make a zero-period interval, which panics.
    if let Some(period) = sd_notify::watchdog_enabled().filter(|p| !p.is_zero()) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period / 2);
            loop {
                tick.tick().await;
                notify(&[NotifyState::Watchdog]);
            }
        });
    }
}

/// The evaluator's progress, reported to systemd.
impl crate::evaluator::Reporter for Notifier {
    fn ready(&self, status: &str) {
        Notifier::ready(self, status);
    }
    fn status(&self, status: &str) {
        notify(&[NotifyState::Status(status)]);
    }
}

/// A worker's progress, reported to systemd.
impl Reporter for Notifier {
    fn ready(&self) {
        Notifier::ready(self, "connected; training");
    }
    fn status(&self, line: &str) {
        notify(&[NotifyState::Status(line)]);
    }
}
