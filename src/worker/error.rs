//! How a worker's run ends: its errors and its outcomes.

use crate::checkpoint;
use crate::transport::PsCallError;

/// Errors that stop a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// The ps addresses or the token cannot make a client (from `Cluster::new`).
    #[error(transparent)]
    Cluster(#[from] crate::transport::ClusterError),
    /// The data's width is not the model's input width.
    #[error(
        "{dir}: rows have {pixels} features but model.layers[0] is {inputs} \
         (or give only the hidden widths as model.hidden)"
    )]
    DataWidth {
        dir: std::path::PathBuf,
        pixels: usize,
        inputs: usize,
    },
    /// A batch larger than the training split.
    #[error("train.batch_size = {batch} but {dir} holds only {examples} training examples")]
    BatchTooLarge {
        batch: usize,
        dir: std::path::PathBuf,
        examples: usize,
    },
    /// A blocking task (checkpoint restore) panicked or was cancelled.
    #[error("background task: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Ps(#[from] PsCallError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error("no progress for {secs} s: {why}")]
    Stalled { secs: u64, why: String },
    /// The chief could not make its last checkpoint durable: the run is not
    /// complete (the ps tasks keep the variables; a restart tries again).
    #[error(
        "final checkpoint at step {step} not written after {attempts} attempts; the run is not complete and the ps tasks keep the variables: {source}"
    )]
    FinalCheckpoint {
        step: u64,
        attempts: u32,
        #[source]
        source: checkpoint::CheckpointError,
    },
    /// Stopped (SIGTERM) while waiting for the ps tasks.
    #[error("stopped while waiting for the ps tasks")]
    Interrupted,
    /// `cluster.ps` changed while waiting for the ps tasks: [`super::run`] ends
    /// with [`Outcome::Reshard`].
    #[error("cluster.ps changed: the cluster re-shards")]
    Reshard,
    /// A ps refused this worker's pushes: its index is not in the ps's
    /// `cluster.worker`, or another process took the index over. A
    /// configuration error (exit 78, not restarted): restarting cannot help.
    #[error("refused by the cluster's membership: {0}")]
    Refused(#[source] PsCallError),
}

impl WorkerError {
    /// A configuration that cannot work: the daemon exits 78.
    pub fn is_config(&self) -> bool {
        matches!(self, WorkerError::Refused(_))
    }
}

impl WorkerError {
    /// A ps refused this worker's token: the configuration is wrong (a
    /// restart with the same token is refused again), not the run.
    pub fn is_refused_token(&self) -> bool {
        matches!(self, WorkerError::Ps(e) if e.status.code() == tonic::Code::Unauthenticated)
    }
}

/// How a worker's run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Trained until `last_step`.
    Finished {
        /// The global step when this worker stopped.
        global_step: u64,
        /// Steps this worker computed.
        local_steps: u64,
    },
    /// The run was already complete when the worker started.
    AlreadyComplete { global_step: u64 },
    /// Asked to stop (SIGTERM) before the end.
    Stopped { global_step: u64 },
    /// `cluster.ps` changed (a live reload): the cluster re-shards. The
    /// chief has written its checkpoint and told the old ps tasks; the
    /// daemon starts this task again under the new list.
    Reshard {
        /// The global step when this worker stopped (0: while waiting).
        global_step: u64,
    },
    /// Removed from `cluster.worker` (a live reload): left after its step.
    Left {
        /// The global step when this worker left.
        global_step: u64,
        /// Steps this worker computed.
        local_steps: u64,
    },
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Finished {
                global_step,
                local_steps,
            } => write!(
                f,
                "Finished at global step {global_step} ({local_steps} steps computed here)"
            ),
            Outcome::AlreadyComplete { global_step } => {
                write!(
                    f,
                    "the run was already complete at global step {global_step}"
                )
            }
            Outcome::Stopped { global_step } => write!(f, "Stopped at global step {global_step}"),
            Outcome::Reshard { global_step } => write!(
                f,
                "cluster.ps changed at global step {global_step}: starting again under the new \
                 placement"
            ),
            Outcome::Left {
                global_step,
                local_steps,
            } => write!(
                f,
                "Left the cluster (removed from cluster.worker) at global step {global_step} \
                 ({local_steps} steps computed here)"
            ),
        }
    }
}
