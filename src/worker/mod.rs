//! The worker task: reads mini-batches, pulls parameters, computes gradients,
//! pushes them. Worker 0 is the chief: it initializes or restores the
//! variables, writes checkpoints, and declares the run complete.
//!
//! [`run`] is the entry point; [`client`] talks to the ps tasks.

pub mod client;

use crate::auth::Credentials;
use crate::checkpoint::{self, Checkpoint, Saver};
use crate::config::{Config, Mode};
use crate::data::{Batches, Dataset, Split};
use crate::model::{self, Mlp};
use client::{Cluster, Progress, PsCallError};
use ndarray::{Array2, ArrayD};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Back-off between retries of an unreachable or uninitialized ps: starts
/// short so recovery is quick, capped so no worker sleeps long.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How often a non-chief worker asks whether the model is initialized
/// (TensorFlow waits 30 s between checks).
const INIT_POLL: Duration = Duration::from_millis(200);
/// A wait that makes no progress for this long is logged (again).
const WAIT_LOG_EVERY: Duration = Duration::from_secs(10);
/// A sync worker that sees no new step for this long gives up with an error
/// (systemd restarts it), rather than waiting forever on a dead peer.
const SYNC_STALL_LIMIT: Duration = Duration::from_secs(600);
/// Attempts at the final checkpoint before the chief gives up with an error
/// (a full disk may be freed meanwhile; systemd restarts the chief, which
/// tries again, as the ps tasks still hold the variables).
const FINAL_SAVE_ATTEMPTS: u32 = 3;

/// Errors that stop a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error("{0}")]
    Setup(String),
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
}

/// Something the daemon layer shows to systemd (`READY=1`, `STATUS=`).
pub trait Reporter: Send + Sync {
    /// The worker is connected and training.
    fn ready(&self);
    /// A one-line human status.
    fn status(&self, line: &str);
}

/// Retries with capped exponential back-off, logging a reason now and then.
struct Backoff {
    delay: Duration,
    since: Instant,
    logged: Option<Instant>,
    /// A reason since the last log that says what to fix (a TLS mismatch
    /// shows as one of several errors, depending on timing): logged in
    /// preference to a bare one.
    explained: Option<String>,
}

impl Backoff {
    fn new() -> Self {
        Self {
            delay: BACKOFF_MIN,
            since: Instant::now(),
            logged: None,
            explained: None,
        }
    }

    /// True when the reason is due to be logged (again).
    fn should_log(&mut self) -> bool {
        let due = self.logged.is_none_or(|t| t.elapsed() >= WAIT_LOG_EVERY);
        if due {
            self.logged = Some(Instant::now());
        }
        due
    }

    /// Sleeps the next back-off delay. Errors: [`WorkerError::Interrupted`]
    /// as soon as `shutdown` is cancelled, so a stop never waits on a dead ps.
    async fn wait(&mut self, why: &str, shutdown: &CancellationToken) -> Result<(), WorkerError> {
        if why.contains(crate::auth::TLS_ADVICE) {
            self.explained = Some(why.to_owned());
        }
        if self.should_log() {
            let explained = self.explained.take();
            warn!(
                waited_secs = self.since.elapsed().as_secs(),
                reason = explained.as_deref().unwrap_or(why),
                "Waiting for the ps tasks."
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(self.delay) => {}
            _ = shutdown.cancelled() => return Err(WorkerError::Interrupted),
        }
        self.delay = (self.delay * 2).min(BACKOFF_MAX);
        Ok(())
    }
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
    /// `train_examples / batch_size`.
    decay_steps: f64,
    shutdown: CancellationToken,
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
    let mlp = Mlp::new(&cfg.model.layers)?;
    let specs = mlp.variables();
    let cluster = Cluster::new(&cfg, specs.clone(), credentials).map_err(WorkerError::Setup)?;
    for (ps, idx) in (0..cluster.num_ps()).map(|p| (p, cluster.shard(p))) {
        for &i in idx {
            info!(variable = %specs[i].name, shape = ?specs[i].shape, device = %format!("/job:ps/task:{ps}"), "Placement.");
        }
    }
    let train = Dataset::load(&cfg.data.dir, Split::Train)?;
    if train.features() != cfg.model.layers[0] {
        return Err(WorkerError::Setup(format!(
            "data.dir {}: images have {} pixels but model.layers[0] is {}",
            cfg.data.dir.display(),
            train.features(),
            cfg.model.layers[0]
        )));
    }
    train.check_labels(mlp.classes())?;
    if cfg.train.batch_size > train.len() {
        return Err(WorkerError::Setup(format!(
            "train.batch_size = {} but {} holds only {} training examples",
            cfg.train.batch_size,
            cfg.data.dir.display(),
            train.len()
        )));
    }
    let decay_steps = (train.len() as f64 / cfg.train.batch_size as f64).max(1.0);
    let mut w = Worker {
        task,
        config,
        mlp,
        cluster,
        train,
        decay_steps,
        shutdown,
    };
    match w.train(reporter).await {
        Err(WorkerError::Interrupted) => {
            info!(worker = task, "Stopped while waiting for the ps tasks.");
            Ok(Outcome::Stopped { global_step: 0 })
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

impl Worker {
    fn cfg(&self) -> Arc<Config> {
        self.config.borrow().clone()
    }

    fn is_chief(&self) -> bool {
        self.task == 0
    }

    /// Waits until every shard is initialized (the chief initializes or
    /// restores those that are not). Returns true if the run is complete.
    async fn ensure_initialized(&mut self) -> Result<bool, WorkerError> {
        let mut backoff = Backoff::new();
        loop {
            if self.shutdown.is_cancelled() {
                return Err(WorkerError::Interrupted);
            }
            let states = match self.cluster.states().await {
                Ok(s) => s,
                Err(e) if e.is_unavailable() => {
                    backoff.wait(&e.to_string(), &self.shutdown).await?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
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
            if !self.is_chief() {
                if backoff.should_log() {
                    info!(uninitialized_ps = ?missing, "Waiting for the chief to initialize the model.");
                }
                tokio::select! {
                    _ = tokio::time::sleep(INIT_POLL) => {}
                    _ = self.shutdown.cancelled() => return Err(WorkerError::Interrupted),
                }
                continue;
            }
            if self.cfg().train.mode == Mode::Sync {
                // Sync shards count steps in lockstep: a shard restored to an
                // older step alone would never agree with the others again, so
                // the whole model goes back to the checkpoint (as TensorFlow's
                // session recovery does).
                let all: Vec<usize> = (0..states.len()).collect();
                self.seed(&all, true, true).await?;
            } else {
                self.seed(&missing, missing.len() == states.len(), false)
                    .await?;
            }
        }
    }

    /// The chief fills the shards of `missing` ps tasks from the newest valid
    /// checkpoint, or with fresh values when there is none.
    /// With `force`, shards that are still live are overwritten too.
    async fn seed(&mut self, missing: &[usize], all: bool, force: bool) -> Result<(), WorkerError> {
        let cfg = self.cfg();
        let specs = self.mlp.variables();
        let dir = cfg.checkpoint.dir.clone();
        let found = tokio::task::spawn_blocking(move || checkpoint::restore_latest(&dir, &specs))
            .await
            .map_err(|e| WorkerError::Setup(format!("checkpoint restore task: {e}")))??;
        let (values, shadows, step, from) = match found {
            Some((path, c)) => {
                let values: Vec<ArrayD<f32>> = c.variables.into_iter().map(|(_, a)| a).collect();
                let shadows: Vec<ArrayD<f32>> = c.shadows.into_iter().map(|(_, a)| a).collect();
                (values, Some(shadows), c.global_step, Some(path))
            }
            None => (self.mlp.init(cfg.train.seed), None, 0, None),
        };
        let took = self
            .cluster
            .initialize(missing, &values, shadows.as_deref(), step, force)
            .await?;
        match &from {
            Some(path) => {
                info!(ps = ?took, step, checkpoint = %path.display(), "Restored the model from the newest valid checkpoint.")
            }
            None => {
                info!(ps = ?took, seed = cfg.train.seed, "Initialized the model with fresh values.")
            }
        }
        // A fresh start or a whole-cluster restore is saved at once, as TensorFlow does.
        // A failure is logged and counted; the periodic and final saves try again.
        if all && !took.is_empty() {
            let shadows = shadows.unwrap_or_else(|| values.clone());
            let _ = save_checkpoint(&cfg, &self.mlp, step, values, shadows).await;
        }
        Ok(())
    }

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
        let batch = cfg.train.batch_size;
        let sync = cfg.train.mode == Mode::Sync;
        let mut batches = Batches::new(
            self.train.len(),
            batch,
            cfg.train.seed.wrapping_add(1 + self.task as u64),
        );
        let mut x = Array2::<f32>::zeros((batch, self.train.features()));
        let mut y = Vec::with_capacity(batch);
        let mut params: Vec<ArrayD<f32>> = self
            .mlp
            .variables()
            .iter()
            .map(|s| ArrayD::zeros(s.shape.as_slice()))
            .collect();
        // Reused every step: the hot path allocates no activations or gradients.
        let (mut ws, mut grads) = (model::Workspace::default(), params.clone());
        let saver = if self.is_chief() {
            Some(CheckpointTimer::start(
                self.config.clone(),
                self.cluster.clone(),
                self.mlp.clone(),
            ))
        } else {
            None
        };
        let mut summaries = self
            .is_chief()
            .then(|| crate::summary::Summaries::open(&cfg.checkpoint.dir));

        let mut progress = self.pull(&mut params, None).await?;
        reporter.ready();
        info!(worker = self.task, chief = self.is_chief(), global_step = progress.global_step(), mode = ?cfg.train.mode, "Training.");
        let mut local_steps = 0u64;
        let mut window = (Instant::now(), progress.global_step(), 0u64);
        let mut last_progress = Instant::now();
        let mut loss = f32::NAN;
        let outcome = loop {
            let cfg = self.cfg();
            let step = progress.global_step();
            if progress.complete || step >= cfg.train.last_step {
                break Outcome::Finished {
                    global_step: step,
                    local_steps,
                };
            }
            if self.shutdown.is_cancelled() {
                break Outcome::Stopped { global_step: step };
            }
            batches_fill(&self.train, &mut batches, &mut x, &mut y);
            let lr = model::learning_rate(
                cfg.train.learning_rate,
                cfg.train.learning_rate_decay,
                step,
                self.decay_steps,
            );
            let l = tokio::task::block_in_place(|| {
                self.mlp.loss_and_grads_into(
                    &params,
                    x.view(),
                    &y,
                    cfg.train.regularization_rate,
                    &mut ws,
                    &mut grads,
                )
            });
            loss = l;
            let tags = progress.steps.clone();
            let pushed_at = Instant::now();
            let pushed = self
                .cluster
                .push_pull(&grads, &mut params, lr, &tags, self.task as u32, loss)
                .await;
            crate::metrics::global().pushed(pushed_at.elapsed(), &grads, &params, pushed.is_ok());
            progress = match pushed {
                Ok(p) => p,
                Err(e) if e.is_unavailable() || e.needs_pull() => {
                    debug!(error = %e, "Push failed; pulling again.");
                    self.pull(&mut params, None).await?
                }
                // Sync: this worker's gradient for the step is already in (it
                // pushed before a restart); wait for the step like any other.
                Err(e) if sync && e.status.code() == tonic::Code::AlreadyExists => Progress {
                    steps: tags.clone(),
                    complete: false,
                },
                Err(e) => return Err(e.into()),
            };
            local_steps += 1;
            crate::metrics::global().step(progress.global_step(), batch, loss, lr);
            if let Some(s) = &mut summaries {
                s.on_step(step, cfg.train.save_summaries_steps, loss, lr);
            }
            if sync {
                // Wait until every shard has moved past the step we pushed for.
                // A shard still at the tagged step has our gradient pending; one
                // behind it was restored from a checkpoint: compute afresh.
                let mut waiting = Backoff::new();
                while !progress.complete
                    && progress
                        .steps
                        .iter()
                        .zip(&tags)
                        .any(|(now, tag)| now == tag)
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
                    let want: Vec<u64> = tags.iter().map(|t| t + 1).collect();
                    if last_progress.elapsed() >= WAIT_LOG_EVERY && waiting.should_log() {
                        info!(
                            step = tags[0],
                            waited_secs = last_progress.elapsed().as_secs(),
                            replicas_to_aggregate = cfg.replicas_to_aggregate(),
                            "Waiting for the other replicas' gradients."
                        );
                    }
                    progress = self.pull(&mut params, Some(&want)).await?;
                }
            }
            if progress.global_step() > step {
                last_progress = Instant::now();
            }
            window.2 += 1;
            if local_steps.is_multiple_of(cfg.train.log_step_count_steps) {
                let secs = window.0.elapsed().as_secs_f64().max(1e-9);
                let gsps =
                    (progress.global_step() - window.1.min(progress.global_step())) as f64 / secs;
                let eps = window.2 as f64 * batch as f64 / secs;
                info!(
                    global_step = progress.global_step(),
                    loss,
                    global_steps_per_sec = gsps,
                    examples_per_sec = eps,
                    "Progress."
                );
                reporter.status(&format!(
                    "step {} loss {:.4} {:.0} examples/s",
                    progress.global_step(),
                    loss,
                    eps
                ));
                window = (Instant::now(), progress.global_step(), 0);
            }
        };
        if let Some(saver) = saver {
            saver.stop().await;
        }
        if self.is_chief() {
            self.finish(&outcome, loss, summaries.as_mut()).await?;
        }
        info!(worker = self.task, ?outcome, "Worker done.");
        Ok(outcome)
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
                    return Ok(p);
                }
                Err(e) if e.is_unavailable() => {
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

    /// The chief's end of the run: final checkpoint, evaluation, and (at
    /// `last_step`) telling the ps tasks the run is complete.
    async fn finish(
        &mut self,
        outcome: &Outcome,
        loss: f32,
        summaries: Option<&mut crate::summary::Summaries>,
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg();
        // At the end of a run keep trying until a stop signal: the ps tasks
        // must hear of it. On a stop, one attempt is all it gets.
        let stopping = matches!(outcome, Outcome::Stopped { .. });
        let mut backoff = Backoff::new();
        let (step, values, shadows) = loop {
            match self.cluster.snapshot().await {
                Ok(s) => break s,
                Err(e) if !stopping && (e.is_unavailable() || e.needs_pull()) => {
                    backoff.wait(&e.to_string(), &self.shutdown).await?
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.save_final(step, &values, &shadows).await?;
        if let Outcome::Finished { .. } = outcome {
            let test = Dataset::load(&cfg.data.dir, Split::Test)?;
            test.check_labels(self.mlp.classes())?;
            let (x, y) = test.all();
            let acc = self.mlp.accuracy(&values, x.view(), &y);
            let ema = self.mlp.accuracy(&shadows, x.view(), &y);
            info!(
                global_step = step,
                loss,
                test_accuracy = acc,
                ema_test_accuracy = ema,
                "Final evaluation."
            );
            if let Some(s) = summaries {
                s.on_eval(step, acc, ema);
            }
            self.cluster.complete(step).await?;
        }
        Ok(())
    }
}

impl Worker {
    /// The final checkpoint, retried a few times: a run is complete only once
    /// it is durable, so a failure here is the chief's error, never a skip.
    async fn save_final(
        &self,
        step: u64,
        values: &[ArrayD<f32>],
        shadows: &[ArrayD<f32>],
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg();
        let mut backoff = Backoff::new();
        let mut attempt = 1;
        loop {
            match save_checkpoint(&cfg, &self.mlp, step, values.to_vec(), shadows.to_vec()).await {
                Ok(_) => return Ok(()),
                Err(source) if attempt >= FINAL_SAVE_ATTEMPTS || self.shutdown.is_cancelled() => {
                    return Err(WorkerError::FinalCheckpoint {
                        step,
                        attempts: attempt,
                        source,
                    });
                }
                Err(e) => {
                    attempt += 1;
                    // The error is already logged by save_checkpoint.
                    let _ = backoff.wait(&e.to_string(), &self.shutdown).await;
                }
            }
        }
    }
}

fn batches_fill(data: &Dataset, batches: &mut Batches, x: &mut Array2<f32>, y: &mut Vec<u8>) {
    let idx = batches.next_indices();
    data.batch(idx, x, y);
}

/// Writes a checkpoint off the hot path. A failure is logged at ERROR and
/// counted (`dtf_checkpoint_failures_total`), and returned: the periodic
/// saves go on training, the final one fails the run.
async fn save_checkpoint(
    cfg: &Config,
    mlp: &Mlp,
    step: u64,
    values: Vec<ArrayD<f32>>,
    shadows: Vec<ArrayD<f32>>,
) -> Result<std::path::PathBuf, checkpoint::CheckpointError> {
    let specs = mlp.variables();
    let ckpt = Checkpoint {
        global_step: step,
        variables: specs.iter().map(|s| s.name.clone()).zip(values).collect(),
        shadows: specs.iter().map(|s| s.name.clone()).zip(shadows).collect(),
    };
    let (dir, keep) = (cfg.checkpoint.dir.clone(), cfg.checkpoint.max_to_keep);
    let started = Instant::now();
    let at = dir.clone();
    let result = tokio::task::spawn_blocking(move || Saver::new(&dir, keep)?.save(&ckpt))
        .await
        .unwrap_or_else(|e| {
            let e = std::io::Error::other(format!("the saving task failed: {e}"));
            Err(checkpoint::CheckpointError::io(&at, "save", e))
        });
    match &result {
        Ok(path) => {
            crate::metrics::global().checkpoint_written(started.elapsed());
            info!(step, path = %path.display(), millis = started.elapsed().as_millis() as u64, "Checkpoint written.");
        }
        Err(e) => {
            crate::metrics::global().checkpoint_failed();
            tracing::error!(step, error = %e, "Checkpoint not written; the previous checkpoint stays.")
        }
    }
    result
}

/// The chief's periodic saver: a task of its own, so saving never stalls steps.
struct CheckpointTimer {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl CheckpointTimer {
    fn start(config: watch::Receiver<Arc<Config>>, cluster: Cluster, mlp: Mlp) -> Self {
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let mut last = Instant::now();
            loop {
                let cfg = config.borrow().clone();
                let due = last + Duration::from_secs(cfg.checkpoint.save_secs);
                tokio::select! {
                    _ = token.cancelled() => return,
                    // Re-read the interval at least every second: a reload may shorten it.
                    _ = tokio::time::sleep_until(due.min(Instant::now() + Duration::from_secs(1)).into()) => {}
                }
                if Instant::now() < due {
                    continue;
                }
                last = Instant::now();
                match cluster.snapshot().await {
                    Ok((step, values, shadows)) => {
                        // Logged and counted there; training goes on.
                        let _ = save_checkpoint(&cfg, &mlp, step, values, shadows).await;
                    }
                    Err(e) => {
                        warn!(error = %e, "Checkpoint skipped: could not read the variables.")
                    }
                }
            }
        });
        Self { stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}
