//! The worker task: reads mini-batches, pulls parameters, computes gradients,
//! pushes them. Worker 0 is the chief: it initializes or restores the
//! variables, writes checkpoints, and declares the run complete.
//!
//! [`run`] is the entry point; [`client`] talks to the ps tasks.

mod backoff;
mod chief;
/// The ps client moved to [`crate::transport`]; this path is kept while branches written against it merge.
#[doc(hidden)]
pub use crate::transport as client;

use crate::auth::Credentials;
use crate::checkpoint;
use crate::config::{Config, Mode};
use crate::data::{self, Batches, Dataset, Preprocessing, Split};
use crate::model::{self, Mlp};
use crate::ps::workers::Refused;
use crate::transport::{Cluster, Progress, PsCallError, PsState, WorkerContact};
use backoff::{Backoff, WAIT_LOG_EVERY};
use chief::Chief;
use ndarray::{Array2, ArrayD};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How often a non-chief worker asks whether the model is initialized
/// (TensorFlow waits 30 s between checks).
const INIT_POLL: Duration = Duration::from_millis(200);
/// A sync worker that sees no new step for this long gives up with an error
/// (systemd restarts it), rather than waiting forever on a dead peer.
const SYNC_STALL_LIMIT: Duration = Duration::from_secs(600);
/// How long a worker that a ps says is not in its `cluster.worker` keeps
/// trying while its own file lists it: the ps may not have reloaded an
/// edit that added this worker yet (each task's watcher settles for
/// 200 ms; a SIGHUP may come later). Past it the worker exits 78.
const MEMBERSHIP_GRACE: Duration = Duration::from_secs(5);
/// Between two tries within [`MEMBERSHIP_GRACE`].
const MEMBERSHIP_RETRY: Duration = Duration::from_millis(250);

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
    /// `cluster.ps` changed while waiting for the ps tasks: [`run`] ends
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

/// Something the daemon layer shows to systemd (`READY=1`, `STATUS=`).
pub trait Reporter: Send + Sync {
    /// The worker is connected and training.
    fn ready(&self);
    /// A one-line human status.
    fn status(&self, line: &str);
}

/// Everything a worker needs across steps.
struct Worker {
    /// This worker's task index.
    task: usize,
    /// The live configuration (reloads replace it).
    config: watch::Receiver<Arc<Config>>,
    mlp: Mlp,
    cluster: Cluster,
    /// Training data.
    train: Dataset,
    /// How the training data's rows become inputs; every checkpoint records it.
    preprocessing: Preprocessing,
    /// `train_examples / batch_size`.
    decay_steps: f64,
    /// Each shard's step as this worker last saw it: what a ps that
    /// restarts had reached, at least (the chief logs the steps lost).
    seen: Vec<u64>,
    /// The chief's run id, once known ([`crate::checkpoint::Checkpoint::run`]).
    run: Option<u64>,
    shutdown: CancellationToken,
    /// Since when a ps has said this worker is not in its `cluster.worker`
    /// while this worker's file lists it ([`MEMBERSHIP_GRACE`]).
    refused_since: Option<Instant>,
    /// `cluster.ps` as this process started with it: the placement its
    /// [`Cluster`] follows. A reload that changes it re-shards.
    ps: Vec<String>,
}

/// Runs worker `task` until `last_step`, a complete run, or `shutdown`.
///
/// Errors: [`WorkerError`] for unreadable data, an invalid model, a ps that
/// rejects a request, a checkpoint that cannot be read, or a stalled sync run.
pub async fn run(
    config: watch::Receiver<Arc<Config>>,
    task: usize,
    credentials: &Credentials,
    shutdown: CancellationToken,
    reporter: &dyn Reporter,
) -> Result<Outcome, WorkerError> {
    let cfg = config.borrow().clone();
    let mlp = Mlp::new(&cfg.model.layers)?.with_precision(cfg.train.precision);
    let kernel = match cfg.train.precision {
        crate::kernel::Precision::Float32 => crate::kernel::Tier::F32,
        crate::kernel::Precision::MixedBfloat16 => crate::kernel::tier(),
    };
    info!(
        precision = cfg.train.precision.name(),
        kernel = kernel.name(),
        "Precision policy."
    );
    crate::metrics::global().kernel(cfg.train.precision, kernel);
    let specs = mlp.variables();
    let mut cluster = Cluster::new(&cfg, specs.clone(), credentials)?;
    // The step reads and writes a shared-memory shard in its region.
    cluster.values_in_place();
    for (ps, idx) in (0..cluster.num_ps()).map(|p| (p, cluster.shard(p))) {
        for &i in idx {
            info!(variable = %specs[i].name, shape = ?specs[i].shape, device = %format!("/job:ps/task:{ps}"), "Placement.");
        }
    }
    let mut train = data::load(&cfg.data, Split::Train)?;
    if train.features() != cfg.model.layers[0] {
        return Err(WorkerError::DataWidth {
            dir: train.path().to_path_buf(),
            pixels: train.features(),
            inputs: cfg.model.layers[0],
        });
    }
    train.check_labels(mlp.classes())?;
    if cfg.train.batch_size > train.len() {
        return Err(WorkerError::BatchTooLarge {
            batch: cfg.train.batch_size,
            dir: train.path().to_path_buf(),
            examples: train.len(),
        });
    }
    // Every worker fits the same preprocessing to the same training split,
    // so all of them (and the chief's checkpoints) agree on it.
    let preprocessing = train.fitted_preprocessing(cfg.data.standardize);
    train.set_preprocessing(preprocessing.clone())?;
    let decay_steps = (train.len() as f64 / cfg.train.batch_size as f64).max(1.0);
    let mut w = Worker {
        task,
        config,
        mlp,
        cluster,
        train,
        preprocessing,
        decay_steps,
        seen: Vec::new(),
        run: None,
        shutdown,
        refused_since: None,
        ps: cfg.cluster.ps.clone(),
    };
    match w.train(reporter).await {
        Err(WorkerError::Interrupted) => {
            info!(worker = task, "Stopped while waiting for the ps tasks.");
            Ok(Outcome::Stopped { global_step: 0 })
        }
        Err(WorkerError::Reshard) => {
            // Caught waiting on a ps (one down, say): the chief checkpoints
            // what it can read (bounded), and the old ps tasks hear that
            // they can go.
            if w.is_chief() {
                w.reshard(0).await?;
            }
            let outcome = Outcome::Reshard { global_step: 0 };
            info!(worker = task, outcome = %outcome, "Worker done.");
            Ok(outcome)
        }
        other => other,
    }
}

/// The newest valid checkpoint's step when it is at or past `last_step`: the
/// run is over, and a task started again on it has nothing to do.
pub fn completed_run(cfg: &Config) -> Option<u64> {
    let mlp = Mlp::new(&cfg.model.layers).ok()?;
    match checkpoint::restore_latest(&cfg.checkpoint.dir, &mlp.variables()) {
        Ok(Some((_, c))) if c.global_step >= cfg.train.last_step => Some(c.global_step),
        _ => None,
    }
}

/// How long a chief that starts on a complete run tries to tell the ps tasks.
const COMPLETE_NOTICE: Duration = Duration::from_secs(5);

/// The chief started on a complete run (its final checkpoint present): tells
/// the ps tasks, in case its predecessor died between that checkpoint and
/// its `Complete` (they would otherwise serve on for ever). Best effort and
/// bounded: ps tasks that have exited already are the usual case.
pub async fn tell_complete(cfg: &Config, credentials: &Credentials, step: u64) {
    let Ok(mlp) = Mlp::new(&cfg.model.layers) else {
        return;
    };
    let Ok(cluster) = Cluster::with_timeout(cfg, mlp.variables(), credentials, COMPLETE_NOTICE)
    else {
        return;
    };
    match tokio::time::timeout(COMPLETE_NOTICE, cluster.complete(step)).await {
        Ok(Ok(())) => info!(global_step = step, "Told the ps tasks the run is complete."),
        Ok(Err(e)) => {
            debug!(error = %e, "The ps tasks were not told the run is complete (exited already?).")
        }
        Err(_) => debug!("The ps tasks did not answer the notice that the run is complete."),
    }
}

impl Worker {
    fn cfg(&self) -> Arc<Config> {
        self.config.borrow().clone()
    }

    fn is_chief(&self) -> bool {
        self.task == 0
    }

    /// Whether this worker is in `cluster.worker` as the live configuration
    /// has it (a reload may have removed it).
    fn is_member(&self) -> bool {
        self.task < self.config.borrow().cluster.worker.len()
    }

    /// Whether a reload changed `cluster.ps`: the cluster re-shards.
    fn resharding(&self) -> bool {
        self.config.borrow().cluster.ps != self.ps
    }

    /// The ps tasks whose shard is not the one this worker's placement
    /// gives them, or that are re-sharding: a re-shard is under way (or
    /// the hosts' files disagree on `cluster.ps`), and they are not to be
    /// trained against or seeded.
    fn placed_otherwise(&self, states: &[PsState]) -> Vec<usize> {
        let specs = self.cluster.specs();
        states
            .iter()
            .enumerate()
            .filter(|&(ps, s)| {
                s.resharding
                    || !s.variables.iter().map(String::as_str).eq(self
                        .cluster
                        .shard(ps)
                        .iter()
                        .map(|&i| specs[i].name.as_str()))
            })
            .map(|(ps, _)| ps)
            .collect()
    }

    /// Sleeps [`INIT_POLL`] between looks at the shards.
    ///
    /// Errors: [`WorkerError::Interrupted`] at once when the task is stopped.
    async fn init_poll(&self) -> Result<(), WorkerError> {
        tokio::select! {
            _ = tokio::time::sleep(INIT_POLL) => Ok(()),
            _ = self.shutdown.cancelled() => Err(WorkerError::Interrupted),
        }
    }

    /// Waits until every shard is initialized (the chief initializes or
    /// restores those that are not). Returns true if the run is complete.
    async fn ensure_initialized(&mut self) -> Result<bool, WorkerError> {
        let mut backoff = Backoff::new();
        // Its own log schedule: "waiting for the chief" is news as soon as
        // the ps answers, even just after a "waiting for the ps" line.
        let mut chief_wait = Backoff::new();
        let mut placed_wait = Backoff::new();
        let mut fetch_wait = Backoff::new();
        loop {
            if self.shutdown.is_cancelled() {
                return Err(WorkerError::Interrupted);
            }
            if self.resharding() {
                return Err(WorkerError::Reshard);
            }
            let states = match self.cluster.states().await {
                Ok(s) => s,
                Err(e) if e.is_unavailable() => {
                    backoff.wait(&e.to_string(), &self.shutdown).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let otherwise = self.placed_otherwise(&states);
            if !otherwise.is_empty() {
                // A ps of another list still stopped for a re-shard whose
                // word it missed (its reload came after the chief's): the
                // chief, started again under the new list, tells it again.
                // Not one of this chief's own list: that state is this
                // chief's to checkpoint, once its own file changes.
                let ours = crate::transport::cluster_id(&self.ps);
                let stopped: Vec<usize> = otherwise
                    .iter()
                    .copied()
                    .filter(|&ps| states[ps].resharding && states[ps].cluster != ours)
                    .collect();
                if self.is_chief() && !stopped.is_empty() {
                    self.tell_reshard(0, &stopped).await;
                }
                if placed_wait.should_log() {
                    warn!(ps = ?otherwise, cluster_ps = ?self.ps, "Waiting for ps tasks that hold another placement: a re-shard is under way, or their cluster.ps differs from this task's.");
                }
                self.init_poll().await?;
                continue;
            }
            if states.iter().any(|s| s.complete) {
                return Ok(true);
            }
            let missing: Vec<usize> = states
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.initialized)
                .map(|(i, _)| i)
                .collect();
            if missing.is_empty() {
                return Ok(false);
            }
            // A ps started on an empty disk fetches its shard's copy from
            // its ring neighbour: not to be seeded meanwhile.
            let fetching: Vec<usize> = missing
                .iter()
                .copied()
                .filter(|&ps| states[ps].fetching)
                .collect();
            if !fetching.is_empty() {
                if fetch_wait.should_log() {
                    info!(ps = ?fetching, "Waiting for ps tasks that fetch their shard's copy from their ring neighbour (they started with no snapshot of their own).");
                }
                self.init_poll().await?;
                continue;
            }
            if !self.is_chief() {
                if chief_wait.should_log() {
                    info!(uninitialized_ps = ?missing, "Waiting for the chief to initialize the model.");
                }
                self.init_poll().await?;
                continue;
            }
            self.fill(&states, &missing).await?;
        }
    }

    /// The step loop, the same for every worker: compute → push → (sync)
    /// wait. The chief's duties run beside it through [`Chief`].
    async fn train(&mut self, reporter: &dyn Reporter) -> Result<Outcome, WorkerError> {
        if self.ensure_initialized().await? {
            let step = self
                .cluster
                .states()
                .await
                .map(|s| s[0].global_step)
                .unwrap_or(0);
            info!(
                global_step = step,
                "The run is already complete; nothing to do."
            );
            return Ok(Outcome::AlreadyComplete { global_step: step });
        }
        let cfg = self.cfg();
        let sync = cfg.train.mode == Mode::Sync;
        let mut buf = StepBuffers::new(self, &cfg);
        let mut chief = self.is_chief().then(|| Chief::start(self));

        let mut progress = self.pull(&mut buf.params, None).await?;
        let via = self.cluster.transports();
        for (ps, (link, addr)) in self.cluster.links().iter().zip(&cfg.cluster.ps).enumerate() {
            info!(worker = self.task, ps, address = %addr, transport = %link.via, compression = %link.compression, "Connected to ps.");
        }
        crate::metrics::global().transports(&via);
        {
            let cluster = self.cluster.clone();
            crate::metrics::observe_links(move || cluster.links());
        }
        reporter.ready();
        info!(
            worker = self.task,
            chief = self.is_chief(),
            global_step = progress.global_step(),
            mode = if sync { "sync" } else { "async" },
            "Training."
        );
        let mut rate = Rate::new(progress.global_step());
        let mut last_progress = Instant::now();
        let mut loss = f32::NAN;
        let outcome = loop {
            let cfg = self.cfg();
            let step = progress.global_step();
            if progress.complete || progress.reached(sync) >= cfg.train.last_step {
                break Outcome::Finished {
                    global_step: step,
                    local_steps: rate.local_steps,
                };
            }
            if self.shutdown.is_cancelled() {
                break Outcome::Stopped { global_step: step };
            }
            if !self.is_member() {
                // The step before this one is done (pushed, and in sync
                // aggregated or given up on); none is started.
                break Outcome::Left {
                    global_step: step,
                    local_steps: rate.local_steps,
                };
            }
            if self.resharding() {
                // The chief's `finish` writes the re-shard checkpoint.
                break Outcome::Reshard { global_step: step };
            }
            let lr = model::learning_rate(
                cfg.train.learning_rate,
                cfg.train.learning_rate_decay,
                step,
                self.decay_steps,
            );
            let tags = progress.steps.clone();
            // The shards' processes the parameters were read from.
            let read_from = self.cluster.incarnations().to_vec();
            let Some((l, p)) = self.step(&mut buf, &cfg, lr, &tags, sync).await? else {
                // A shard's values moved (a new shared region, a snapshot):
                // pulled again, nothing computed.
                progress = self.pull(&mut buf.params, None).await?;
                continue;
            };
            (loss, progress) = (l, p);
            if self.cluster.epochs_changed(&mut buf.epochs) {
                info!(worker = self.task, epochs = ?buf.epochs, "Membership changed.");
            }
            crate::metrics::global().membership_epoch(buf.epochs[0]);
            self.seen.clone_from(&progress.steps);
            crate::metrics::global().step(progress.global_step(), cfg.train.batch_size, loss, lr);
            if let Some(c) = &mut chief {
                c.on_step(&cfg, step, loss, lr);
            }
            if sync {
                progress = self
                    .wait_for_step(progress, &tags, &read_from, last_progress, &mut buf.params)
                    .await?;
            }
            if let Some(c) = &chief {
                c.after_step(self, &cfg, step, progress.global_step()).await;
            }
            if progress.global_step() > step {
                last_progress = Instant::now();
            }
            rate.step(&cfg, progress.global_step(), loss, reporter);
        };
        if let Some(c) = chief {
            c.finish(self, &outcome, loss).await?;
        }
        info!(worker = self.task, outcome = %outcome, "Worker done.");
        Ok(outcome)
    }

    /// One step: the next mini-batch's loss and gradients, pushed tagged
    /// with `tags`, and the new parameters back (fused), pulling again when
    /// the push could not be applied. A shard on shared memory is read and
    /// written in its region ([`Cluster::step`]); others use `buf.params`
    /// and `buf.grads`.
    ///
    /// Returns `None` when nothing was computed because a shard's values
    /// are not where the step reads them: the caller pulls.
    async fn step(
        &mut self,
        buf: &mut StepBuffers,
        cfg: &Config,
        lr: f32,
        tags: &[u64],
        sync: bool,
    ) -> Result<Option<(f32, Progress)>, WorkerError> {
        let idx = buf.batches.next_indices();
        self.train.batch(idx, &mut buf.x, &mut buf.y);
        let (mlp, x, y, ws) = (&self.mlp, buf.x.view(), &buf.y, &mut buf.ws);
        let reg = cfg.train.regularization_rate;
        let pushed_at = Instant::now();
        let (loss, pushed) = self
            .cluster
            .step(
                &mut buf.params,
                &mut buf.grads,
                |params, grads| {
                    tokio::task::block_in_place(|| {
                        mlp.loss_and_grads_into(params, x, y, reg, ws, grads)
                    })
                },
                lr,
                tags,
                self.task as u32,
            )
            .await;
        let Some(loss) = loss else {
            return match pushed {
                Err(e) if e.needs_pull() => Ok(None),
                Err(e) => Err(e.into()),
                Ok(_) => Ok(None),
            };
        };
        crate::metrics::global().pushed(
            pushed_at.elapsed(),
            &buf.grads,
            &buf.params,
            pushed.is_ok(),
        );
        if pushed.is_ok() {
            self.refused_since = None;
        }
        let progress = match pushed {
            Ok(p) => p,
            Err(e) if Refused::of(&e.status).is_some() => return self.refused(e).await,
            Err(e) if e.is_resharding() => {
                debug!(error = %e, "Push refused: the cluster re-shards.");
                self.await_reshard().await;
                return Ok(None);
            }
            Err(e) if e.is_unavailable() || e.needs_pull() => {
                debug!(error = %e, "Push failed; pulling again.");
                self.pull(&mut buf.params, None).await?
            }
            // Sync: this worker's gradient for the step is already in (it
            // pushed before a restart); wait for the step like any other.
            Err(e) if sync && e.status.code() == tonic::Code::AlreadyExists => Progress {
                steps: tags.to_vec(),
                complete: false,
            },
            Err(e) => return Err(e.into()),
        };
        Ok(Some((loss, progress)))
    }

    /// A ps refused a push: the cluster re-shards. No more steps — a sync
    /// shard that has not stopped yet would take them, and the checkpoint
    /// would hold them at another step than the rest — until this task's
    /// own reload, or until no ps re-shards any more (the edit undone). A
    /// wait past a few seconds says what is missing.
    async fn await_reshard(&mut self) {
        let since = Instant::now();
        let mut log = Backoff::new();
        while !self.resharding() && !self.shutdown.is_cancelled() {
            if let Ok(states) = self.cluster.states().await
                && states.iter().all(|s| !s.resharding)
            {
                return;
            }
            if since.elapsed() >= Duration::from_secs(2) && log.should_log() {
                warn!(cluster_ps = ?self.ps, "The ps tasks are re-sharding (their cluster.ps changed), but this task's has not: waiting for its reload (edit its dtf.toml too, or send it SIGHUP).");
            }
            // A stop ends the wait (the loop's condition).
            let _ = self.init_poll().await;
        }
    }

    /// A ps refused this worker's push ([`Refused`]): nothing was computed
    /// that counts (`None`: the caller pulls, and leaves if it is no
    /// longer a member).
    ///
    /// Errors: [`WorkerError::Refused`] when another process took this
    /// worker's index over, or when the ps still does not list this
    /// worker [`MEMBERSHIP_GRACE`] after the first refusal while this
    /// worker's own file does.
    async fn refused(&mut self, e: PsCallError) -> Result<Option<(f32, Progress)>, WorkerError> {
        if Refused::of(&e.status) == Some(Refused::Fenced) {
            return Err(WorkerError::Refused(e));
        }
        if !self.is_member() {
            // Removed here too: the loop leaves.
            return Ok(None);
        }
        let since = *self.refused_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= MEMBERSHIP_GRACE {
            return Err(WorkerError::Refused(e));
        }
        if since.elapsed() < MEMBERSHIP_RETRY {
            info!(
                worker = self.task,
                ps = e.ps,
                grace_secs = MEMBERSHIP_GRACE.as_secs(),
                "A ps does not list this worker in cluster.worker yet; retrying while it reloads."
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(MEMBERSHIP_RETRY) => Ok(None),
            _ = self.shutdown.cancelled() => Ok(None),
        }
    }

    /// Sync: waits until every shard has moved past the step we pushed for.
    /// A shard still at the tagged step has our gradient pending; one behind
    /// it was restored from a checkpoint: compute afresh. So does a shard
    /// whose process is not the one the parameters were read from
    /// (`read_from`, incarnations): restored from its snapshot, it may be at
    /// the tagged step without our gradient, which died with its
    /// predecessor.
    async fn wait_for_step(
        &mut self,
        mut progress: Progress,
        tags: &[u64],
        read_from: &[u64],
        last_progress: Instant,
        params: &mut [ArrayD<f32>],
    ) -> Result<Progress, WorkerError> {
        let mut waiting = Backoff::new();
        let want: Vec<u64> = tags.iter().map(|t| t + 1).collect();
        // A worker removed meanwhile stops waiting: its gradient is in, and
        // the ps tasks no longer wait for it. A shard at `last_step` takes
        // no more steps (its answer was `AtLastStep`): nothing to wait for.
        while !progress.complete
            && self.is_member()
            && !self.resharding()
            && self.cluster.incarnations() == read_from
            && progress
                .steps
                .iter()
                .zip(tags)
                .any(|(&now, &tag)| now == tag && now < self.config.borrow().train.last_step)
        {
            if last_progress.elapsed() > SYNC_STALL_LIMIT {
                return Err(WorkerError::Stalled {
                    secs: SYNC_STALL_LIMIT.as_secs(),
                    why: format!(
                        "waiting for step {} to be aggregated (train.replicas_to_aggregate)",
                        tags[0] + 1
                    ),
                });
            }
            if last_progress.elapsed() >= WAIT_LOG_EVERY && waiting.should_log() {
                let missing = match self.cluster.states().await {
                    Ok(states) => missing_workers(
                        &states[0].workers,
                        tags[0],
                        self.cfg().cluster.worker.len(),
                    ),
                    Err(e) => format!("unknown ({e})"),
                };
                info!(
                    step = tags[0],
                    waited_secs = last_progress.elapsed().as_secs(),
                    replicas_to_aggregate = self.cfg().replicas_to_aggregate(),
                    missing = %missing,
                    "Waiting for the other replicas' gradients."
                );
            }
            progress = self.pull(params, Some(&want)).await?;
        }
        Ok(progress)
    }

    /// Pulls every variable, retrying while a ps is down or uninitialized
    /// (the chief re-seeds it).
    async fn pull(
        &mut self,
        params: &mut [ArrayD<f32>],
        min_steps: Option<&[u64]>,
    ) -> Result<Progress, WorkerError> {
        let mut backoff = Backoff::new();
        loop {
            let pulled_at = Instant::now();
            match self.cluster.pull(params, min_steps).await {
                Ok(p) => {
                    crate::metrics::global().pulled(pulled_at.elapsed(), params);
                    self.seen.clone_from(&p.steps);
                    return Ok(p);
                }
                Err(e) if e.is_unavailable() => {
                    if self.resharding() {
                        return Err(WorkerError::Reshard);
                    }
                    backoff.wait(&e.to_string(), &self.shutdown).await?
                }
                Err(e) if e.needs_pull() => {
                    if self.ensure_initialized().await? {
                        let cfg = self.cfg();
                        return Ok(Progress {
                            steps: vec![cfg.train.last_step; self.cluster.num_ps()],
                            complete: true,
                        });
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// What one step reads and writes, allocated once: the hot path allocates
/// no activations or gradients.
struct StepBuffers {
    /// This worker's shuffled order of the training examples.
    batches: Batches,
    /// The mini-batch's inputs.
    x: Array2<f32>,
    /// The mini-batch's labels.
    y: Vec<u8>,
    /// The parameters as last pulled.
    params: Vec<ArrayD<f32>>,
    /// Activations and their gradients.
    ws: model::Workspace,
    /// The gradient pushed to the ps tasks.
    grads: Vec<ArrayD<f32>>,
    /// The membership epoch each ps last answered with.
    epochs: Vec<u64>,
}

impl StepBuffers {
    fn new(w: &Worker, cfg: &Config) -> Self {
        let batch = cfg.train.batch_size;
        let params: Vec<ArrayD<f32>> = w
            .mlp
            .variables()
            .iter()
            .map(|s| ArrayD::zeros(s.shape.as_slice()))
            .collect();
        StepBuffers {
            batches: Batches::new(
                w.train.len(),
                batch,
                cfg.train.seed.wrapping_add(1 + w.task as u64),
            ),
            x: Array2::zeros((batch, w.train.features())),
            y: Vec::with_capacity(batch),
            grads: params.clone(),
            params,
            epochs: vec![0; w.cluster.num_ps()],
            ws: model::Workspace::default(),
        }
    }
}

/// Counts this worker's steps and logs the rates every
/// `train.log_step_count_steps` (TensorFlow's `StepCounterHook`).
struct Rate {
    /// Steps this worker computed.
    local_steps: u64,
    /// When the current window started.
    since: Instant,
    /// The global step when it started.
    global_step: u64,
    /// Steps this worker computed in it.
    steps: u64,
}

impl Rate {
    fn new(global_step: u64) -> Self {
        Rate {
            local_steps: 0,
            since: Instant::now(),
            global_step,
            steps: 0,
        }
    }

    /// One local step done; the cluster is at `global_step`.
    fn step(&mut self, cfg: &Config, global_step: u64, loss: f32, reporter: &dyn Reporter) {
        self.local_steps += 1;
        self.steps += 1;
        if !self
            .local_steps
            .is_multiple_of(cfg.train.log_step_count_steps)
        {
            return;
        }
        let secs = self.since.elapsed().as_secs_f64().max(1e-9);
        let gsps = global_step.saturating_sub(self.global_step) as f64 / secs;
        let eps = self.steps as f64 * cfg.train.batch_size as f64 / secs;
        info!(
            global_step,
            loss = %format!("{loss:.4}"),
            global_steps_per_sec = %format!("{gsps:.1}"),
            examples_per_sec = %format!("{eps:.0}"),
            "Progress."
        );
        reporter.status(&format!(
            "step {global_step} loss {loss:.4} {eps:.0} examples/s"
        ));
        *self = Rate {
            local_steps: self.local_steps,
            ..Rate::new(global_step)
        };
    }
}

/// The workers (of `workers`) with no gradient for `step` at the ps whose
/// worker table is `heard`: `worker:1 (last push for step 40, 14 s ago),
/// worker:2 (never seen)`; `none` when every worker pushed for it (the ps
/// is applying it).
fn missing_workers(heard: &[WorkerContact], step: u64, workers: usize) -> String {
    let missing: Vec<String> = (0..workers)
        .filter_map(|w| {
            let latest = heard.iter().find(|c| c.task as usize == w);
            match latest {
                Some(c) if c.step >= step => None,
                Some(c) => Some(format!(
                    "worker:{w} (last push for step {}, {:.0} s ago)",
                    c.step,
                    c.since.as_secs_f64()
                )),
                None => Some(format!("worker:{w} (never seen)")),
            }
        })
        .collect();
    if missing.is_empty() {
        "none".into()
    } else {
        missing.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_stall_names_the_workers_whose_gradient_is_missing() {
        let contact = |task, step, seconds_ago| WorkerContact {
            task,
            step,
            since: std::time::Duration::from_secs_f64(seconds_ago),
            examples_per_sec: 0.0,
            ..Default::default()
        };
        let heard = [contact(0, 41, 0.1), contact(1, 40, 14.0)];
        assert_eq!(
            missing_workers(&heard, 41, 3),
            "worker:1 (last push for step 40, 14 s ago), worker:2 (never seen)"
        );
        assert_eq!(missing_workers(&heard, 40, 2), "none");
    }
}
