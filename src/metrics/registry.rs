//! What each role's `/metrics` exposes: one [`Registry`] per process,
//! built from [`Metrics`]'s handles by role (a ps has no push latency, a
//! worker no stale gradients, only the chief checkpoints).

use super::Metrics;
use crate::config::Role;
use prometheus_client::registry::Registry;

impl Metrics {
    /// The registry a `role` process exposes (`chief`: worker 0, which also checkpoints).
    pub(super) fn registry(&self, role: Role, task: usize) -> Registry {
        let mut r = Registry::default();
        let role_name = match role {
            Role::Ps => "ps",
            Role::Worker => "worker",
            Role::Evaluator => "evaluator",
        };
        self.up
            .get_or_create(&vec![
                ("role".into(), role_name.into()),
                ("task".into(), task.to_string()),
            ])
            .set(1);
        r.register("dtf_up", "1 while the task's process runs", self.up.clone());
        r.register(
            "dtf_global_step",
            "The global step (on a ps: its shard's step; on the evaluator: the newest checkpoint scored)",
            self.global_step.clone(),
        );
        if role != Role::Evaluator {
            r.register(
                "dtf_loss",
                "Training loss of the latest batch",
                self.loss.clone(),
            );
        }
        r.register(
            "dtf_reloads",
            "Configuration reloads, applied or rejected",
            self.reloads.clone(),
        );
        r.register(
            "dtf_denormals_flushed",
            "1 when the thread of the latest step (worker), update (ps) or evaluation (evaluator) flushed denormals to zero (train.flush_denormals), 0 when not, -1 before the first",
            self.denormals_flushed.clone(),
        );
        match role {
            Role::Ps => self.register_ps(&mut r),
            Role::Worker => self.register_worker(&mut r, task == 0),
            Role::Evaluator => self.register_evaluator(&mut r),
        }
        r
    }

    /// The evaluator's scores of the newest checkpoint, and its counts.
    fn register_evaluator(&self, r: &mut Registry) {
        r.register(
            "dtf_eval_accuracy",
            "Test accuracy of the newest checkpoint scored",
            self.eval_accuracy.clone(),
        );
        r.register(
            "dtf_eval_ema_accuracy",
            "Test accuracy of the EMA shadows of the newest checkpoint scored",
            self.eval_ema_accuracy.clone(),
        );
        r.register(
            "dtf_eval_loss",
            "Test loss of the newest checkpoint scored",
            self.eval_loss.clone(),
        );
        r.register(
            "dtf_eval_auc",
            "Test AUC of the newest checkpoint scored (wide & deep; NaN for the MLP)",
            self.eval_auc.clone(),
        );
        r.register(
            "dtf_eval_ema_auc",
            "Test AUC of the EMA shadows of the newest checkpoint scored (wide & deep; NaN for the MLP)",
            self.eval_ema_auc.clone(),
        );
        r.register(
            "dtf_eval_best_score",
            "The best checkpoint's score by [eval] metric",
            self.eval_best.clone(),
        );
        r.register(
            "dtf_eval_checkpoints",
            "Checkpoints this evaluator scored",
            self.eval_checkpoints.clone(),
        );
        r.register(
            "dtf_eval_skipped",
            "Checkpoints that did not verify (half-written or damaged), skipped",
            self.eval_skipped.clone(),
        );
    }

    /// The ps's own metrics (read from its `State` at scrape time).
    fn register_ps(&self, r: &mut Registry) {
        r.register(
            "dtf_initialized",
            "1 once this ps's shard holds values",
            self.initialized.clone(),
        );
        r.register(
            "dtf_steps",
            "Updates this ps applied (async: pushes; sync: aggregated steps)",
            self.steps.clone(),
        );
        r.register(
            "dtf_stale_gradients",
            "Sync: gradients dropped because they were computed on an old step",
            self.stale_gradients.clone(),
        );
        r.register(
            "dtf_membership_epoch",
            "Changes of cluster.worker this ps applied, from 1 at its start",
            self.membership_epoch.clone(),
        );
        r.register(
            "dtf_members",
            "Workers in this ps's cluster.worker",
            self.members.clone(),
        );
        r.register(
            "dtf_membership_refusals",
            "Pushes refused: from a worker not in cluster.worker, or from a process another one took the worker's index from",
            self.membership_refusals.clone(),
        );
        r.register(
            "dtf_shm_connections",
            "Open shared-memory connections (tasks on this host); the others use TCP",
            self.shm_connections.clone(),
        );
        r.register(
            "dtf_ps_compression",
            "1 for this ps's cluster.compression (its TCP links)",
            self.compression.clone(),
        );
        r.register(
            "dtf_snapshot_age_seconds",
            "Seconds since the state in this ps's newest snapshot was copied (-1: none yet)",
            self.snapshot_age.clone(),
        );
        r.register(
            "dtf_snapshot_step",
            "The step of this ps's newest snapshot",
            self.snapshot_step.clone(),
        );
        r.register(
            "dtf_snapshot_duration_seconds",
            "How long the latest snapshot took to encode and write (off the shard lock)",
            self.snapshot_duration.clone(),
        );
        r.register(
            "dtf_snapshot_copy_seconds",
            "How long the latest snapshot held the shard lock (pushes waited this long)",
            self.snapshot_copy.clone(),
        );
        r.register(
            "dtf_snapshot_bytes",
            "Size of the latest snapshot file",
            self.snapshot_bytes.clone(),
        );
        r.register(
            "dtf_snapshot_delta",
            "Which delta after a whole snapshot the latest one is (0: whole; ps.snapshot_full_every)",
            self.snapshot_delta.clone(),
        );
        r.register(
            "dtf_snapshot_failures",
            "Snapshots this ps could not write (full or read-only disk, ...)",
            self.snapshot_failures.clone(),
        );
        r.register(
            "dtf_snapshot_replica_step",
            "The step of the newest snapshot of this shard its ring neighbour (ps task+1 mod n) keeps (0: none)",
            self.replica_step.clone(),
        );
        r.register(
            "dtf_snapshot_replica_failures",
            "Snapshots of this shard its ring neighbour did not take (down, disk full, ...)",
            self.replica_failures.clone(),
        );
        r.register(
            "dtf_ps_memory_full",
            "1 while this ps's tables create no rows: its working set passed 90 % of its cgroup's memory limit (back under 85 %)",
            self.memory_full.clone(),
        );
        r.register(
            "dtf_table_rows",
            "Rows of each embedding table this ps holds",
            self.table_rows.clone(),
        );
        r.register(
            "dtf_table_rows_evicted",
            "Embedding rows this ps evicted (model.tables steps_to_live, max_rows)",
            self.table_evicted.clone(),
        );
        r.register(
            "dtf_table_ids_refused",
            "Embedding gradient rows this ps dropped: the id not yet admitted (model.tables.min_count) or no room under max_rows",
            self.table_refused.clone(),
        );
    }

    /// A worker's metrics; the chief's checkpoints too.
    fn register_worker(&self, r: &mut Registry, chief: bool) {
        r.register(
            "dtf_kernel",
            "1 for the training step's precision policy and the kernel tier its GEMMs run on",
            self.kernel.clone(),
        );
        r.register(
            "dtf_steps",
            "Training steps this worker computed",
            self.steps.clone(),
        );
        r.register(
            "dtf_examples",
            "Training examples this worker processed",
            self.examples.clone(),
        );
        r.register(
            "dtf_learning_rate",
            "Learning rate of the latest step",
            self.learning_rate.clone(),
        );
        r.register(
            "dtf_ps_link_sent_bytes",
            "gRPC message bytes sent to each ps over TCP (compressed as on the wire)",
            self.link_sent.clone(),
        );
        r.register(
            "dtf_ps_link_received_bytes",
            "gRPC message bytes received from each ps over TCP (compressed as on the wire)",
            self.link_received.clone(),
        );
        r.register(
            "dtf_ps_compression",
            "1 for the cluster.compression of each ps link (worker; none over shared memory) or of this ps",
            self.compression.clone(),
        );
        r.register(
            "dtf_ps_transport",
            "1 for the transport this worker's latest call to each ps took (shm: shared memory; tcp)",
            self.ps_transport.clone(),
        );
        r.register(
            "dtf_membership_epoch",
            "The membership epoch ps 0 last answered with",
            self.membership_epoch.clone(),
        );
        r.register(
            "dtf_push_seconds",
            "Round trip of a push (with the fused pull) to every ps",
            self.push_seconds.clone(),
        );
        r.register(
            "dtf_pull_seconds",
            "Round trip of a pull from every ps (sync: includes waiting for the step)",
            self.pull_seconds.clone(),
        );
        r.register(
            "dtf_sent_bytes",
            "Tensor bytes sent to the ps tasks",
            self.sent_bytes.clone(),
        );
        r.register(
            "dtf_received_bytes",
            "Tensor bytes received from the ps tasks",
            self.received_bytes.clone(),
        );
        if chief {
            r.register(
                "dtf_checkpoint_age_seconds",
                "Seconds since the chief last wrote a checkpoint",
                self.checkpoint_age.clone(),
            );
            r.register(
                "dtf_checkpoint_duration_seconds",
                "How long the latest checkpoint took to write",
                self.checkpoint_duration.clone(),
            );
            r.register(
                "dtf_checkpoint_failures",
                "Checkpoints the chief could not write (full or read-only disk, ...)",
                self.checkpoint_failures.clone(),
            );
        }
    }
}
