//! What a reload changes on a running ps: `cluster.worker` (the
//! membership, and with it the sync target) and `cluster.ps` (a re-shard:
//! pushes refused until the chief's checkpoint, then a new start).

use super::{PsService, workers};
use crate::config::{Config, Mode};
use crate::transport;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{info, warn};

/// Who may push, as the live `cluster.worker` says.
pub(super) struct Members {
    /// The membership: who may push, which process holds each index, the
    /// epoch; and every worker's latest push, for `State` (`dtf status`).
    pub(super) workers: Mutex<workers::Membership>,
    /// Sync with `train.replicas_to_aggregate` unset: a step aggregates the
    /// current members ([`workers::Membership::sync_target`]).
    pub(super) follows: bool,
}

impl Members {
    /// The membership of ps task `task` as `config` lists the workers.
    pub(super) fn new(config: &Config, task: usize) -> Self {
        Self {
            workers: Mutex::new(workers::Membership::new(task, config.cluster.worker.len())),
            follows: config.train.mode == Mode::Sync
                && config.train.replicas_to_aggregate.is_none(),
        }
    }
}

/// `cluster.ps` as this process started with it, and the re-shard a
/// change of it starts.
pub(super) struct Reshard {
    /// `cluster.ps` as this process started with it: its placement.
    pub(super) ps: Vec<String>,
    /// A reload changed `cluster.ps`: the cluster re-shards, and pushes
    /// are refused until the chief's re-shard checkpoint.
    pub(super) on: AtomicBool,
    /// Cancelled once the chief has written that checkpoint: `serve`
    /// returns [`super::Ended::Reshard`].
    pub(super) done: CancellationToken,
    /// The chief said so (not an orphan's timeout) and wrote the checkpoint
    /// after it read this shard (`CompleteRequest.checkpointed`): the
    /// checkpoint holds this shard's state, so a last snapshot is of no use.
    pub(super) checkpointed: AtomicBool,
    /// Table pushes past the re-shard check and not yet applied
    /// ([`Reshard::pushing`]).
    pushes: AtomicUsize,
}

/// A table push in flight, counted until dropped.
pub(super) struct Pushing<'a>(&'a AtomicUsize);

impl Drop for Pushing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Reshard {
    /// No re-shard: `config.cluster.ps` is the placement.
    pub(super) fn new(config: &Config) -> Self {
        Self {
            ps: config.cluster.ps.clone(),
            on: AtomicBool::new(false),
            done: CancellationToken::new(),
            checkpointed: AtomicBool::new(false),
            pushes: AtomicUsize::new(0),
        }
    }

    /// The cluster re-shards now.
    pub(super) fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    /// A table push begins: counted before it checks [`Reshard::is_on`]
    /// and until it has applied its rows, each table under its own lock
    /// (not the shard's, which the dense pushes' check is made under).
    pub(super) fn pushing(&self) -> Pushing<'_> {
        self.pushes.fetch_add(1, Ordering::SeqCst);
        Pushing(&self.pushes)
    }

    /// Re-sharding with no table push in flight: what `State.resharding`
    /// says, and what the chief waits for before it reads the shard — a
    /// push that passed the check just before the flag turned could
    /// otherwise update a table after the chief read it (lost, the worker
    /// told it was applied).
    pub(super) fn stopped(&self) -> bool {
        self.is_on() && self.pushes.load(Ordering::SeqCst) == 0
    }
}

impl PsService {
    /// `cluster.worker` has `members` entries now (a reload): the
    /// membership follows, with a new epoch, and a sync run without
    /// `train.replicas_to_aggregate` aggregates over the new members from
    /// this step on (completing the step now when its gradients are in).
    pub fn apply_members(&self, members: usize) {
        let change = self.membership().set_members(members);
        let Some(change) = change else {
            return;
        };
        info!(
            ps = self.inner.task,
            epoch = change.epoch,
            members,
            added = ?change.added,
            removed = ?change.removed,
            "Membership changed."
        );
        if self.inner.members.follows {
            self.set_sync_target();
        }
    }

    /// Sync: a step aggregates the membership's target from now on, from
    /// workers `0..members`; a step this completes is announced to waiters.
    /// Both are read under the shard's lock, so a reload and a joiner's
    /// first push racing each other leave the newest target in place.
    pub(super) fn set_sync_target(&self) {
        let mut s = self.lock();
        let (replicas, total) = {
            let m = self.membership();
            (m.sync_target(), m.members())
        };
        s.set_last_step(self.inner.config.borrow().train.last_step);
        self.set_tables_sync(replicas, total);
        match s.set_sync(replicas, total) {
            Ok(true) => {
                info!(
                    ps = self.inner.task,
                    step = s.step(),
                    replicas,
                    "Step completed with the members left."
                );
                self.inner.step_tx.send_replace(s.step());
            }
            Ok(false) => {}
            Err(e) => {
                warn!(ps = self.inner.task, error = %e, "The step's update failed; its replicas push anew.");
            }
        }
    }

    /// The answer to a push, and to a pull that waits for a step, while
    /// the cluster re-shards ([`transport::RESHARDING`]).
    pub(super) fn resharding_status(&self) -> Status {
        Status::unavailable(format!(
            "ps:{} {}: no steps until the chief's checkpoint; then every task starts again \
             under the new placement",
            self.inner.task,
            transport::RESHARDING
        ))
    }

    /// Follows a reload's `cluster.ps`: changed from the one this process
    /// started with, the cluster re-shards (pushes refused from now on);
    /// back as it was before the chief's checkpoint, nothing happens.
    pub(super) fn follow_ps(&self, ps: &[String]) {
        let changed = ps != self.inner.reshard.ps.as_slice();
        if !changed && self.inner.reshard.done.is_cancelled() {
            // Told already: the pushes it would take now would be lost.
            return;
        }
        if self.inner.reshard.on.swap(changed, Ordering::SeqCst) != changed {
            // Wakes the calls waiting for a step (`wait_for_step`).
            self.inner.step_tx.send_modify(|_| ());
            match changed {
                true => {
                    info!(ps = self.inner.task, old = ?self.inner.reshard.ps, new = ?ps, "cluster.ps changed: the cluster re-shards. Pushes wait for the chief's checkpoint; then this task starts again under the new placement.")
                }
                false => info!(
                    ps = self.inner.task,
                    "cluster.ps is back as this task started with it: no re-shard; taking pushes again."
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_push_in_flight_holds_the_re_shard_back_until_it_is_applied() {
        let r = Reshard::new(&Config::default());
        let pushing = r.pushing();
        r.on.store(true, Ordering::SeqCst);
        assert!(r.is_on(), "later pushes are refused");
        assert!(!r.stopped(), "one in flight: the chief must not read yet");
        drop(pushing);
        assert!(r.stopped());
        // A push refused by the flag is counted only while it lives.
        drop(r.pushing());
        assert!(r.stopped());
    }
}
