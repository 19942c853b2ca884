//! The worker task: reads mini-batches, pulls parameters, computes gradients,
//! pushes them. Worker 0 is the chief: it initializes or restores the
//! variables, writes checkpoints, and declares the run complete.
//!
//! [`run`] is the entry point; [`crate::transport::Cluster`] talks to the ps
//! tasks. `error.rs`: how a worker stops; `startup.rs`: waiting for the
//! initialized model; `sync.rs`: the waits of a sync step; `rate.rs`: the
//! step's buffers and the throughput shown to systemd; `chief.rs`: worker
//! 0's duties (`Chief`, which owns what they need);
//! `checkpoints.rs`: how and when the chief writes checkpoints.

mod backoff;
mod checkpoints;
mod chief;
mod error;
mod rate;
mod replay;
mod sparse;
mod startup;
mod sync;

pub use error::{Outcome, WorkerError};
use rate::{Rate, StepBuffers};

use crate::auth::Credentials;
use crate::checkpoint;
use crate::config::{Config, Mode};
use crate::data::{self, Batches, Dataset, Split};
use crate::model::{self, Mlp, Model};
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
    model: Model,
    cluster: Cluster,
    /// Training data.
    train: Dataset,
    /// `train_examples / batch_size`.
    epoch_steps: f64,
    /// Each shard's step as this worker last saw it: what a ps that
    /// restarts had reached, at least (the chief logs the steps lost).
    seen: Vec<u64>,
    /// Worker 0's duties ([`Chief`]); `None` on every other worker.
    chief: Option<Chief>,
    shutdown: CancellationToken,
    /// Since when a ps has said this worker is not in its `cluster.worker`
    /// while this worker's file lists it ([`MEMBERSHIP_GRACE`]).
    refused_since: Option<Instant>,
    /// `cluster.ps` as this process started with it: the placement its
    /// [`Cluster`] follows. A reload that changes it re-shards.
    ps: Vec<String>,
    /// The ps load benchmark's compute-free steps ([`replay`]); `None`
    /// when training.
    replay: Option<replay::Replay>,
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
    let mut train = data::load_for(&cfg, Split::Train)?;
    let fields: Vec<String> = train
        .categorical()
        .map(|c| c.fields.clone())
        .unwrap_or_default();
    let model = Model::new(&cfg.model, fields.len(), cfg.train.precision)?;
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
    let specs = model.variables();
    let mut cluster = Cluster::new(&cfg, specs.clone(), credentials)?;
    if let Model::Mlp(_) = model {
        // The step reads and writes a shared-memory shard in its region.
        // Wide & deep computes before its dense push (its rows go first),
        // from the values the last pull copied out.
        cluster.values_in_place();
    }
    for ps in 0..cluster.num_ps() {
        for part in cluster.shard(ps) {
            info!(variable = %part.name, shape = ?part.shape, device = %format!("/job:ps/task:{ps}"), "Placement.");
        }
    }
    if train.features() != model.dense_inputs() {
        return Err(WorkerError::DataWidth {
            dir: train.path().to_path_buf(),
            pixels: train.features(),
            inputs: model.dense_inputs(),
        });
    }
    train.check_labels(model.classes())?;
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
    let epoch_steps = (train.len() as f64 / cfg.train.batch_size as f64).max(1.0);
    let chief = (task == 0).then(|| {
        let (config, cluster) = (config.clone(), cluster.clone());
        Chief::new(
            config,
            cluster,
            model.clone(),
            preprocessing,
            &fields,
            train.class_names().map(<[String]>::to_vec),
            shutdown.clone(),
        )
    });
    let mut w = Worker {
        task,
        config,
        model,
        cluster,
        train,
        epoch_steps,
        seen: Vec::new(),
        chief,
        shutdown,
        refused_since: None,
        ps: cfg.cluster.ps.clone(),
        replay: replay::Replay::from_env(),
    };
    if w.replay.is_some() {
        warn!(
            worker = task,
            "{}=1: this worker pushes its first gradient at every step (the ps load benchmark); it does not train.",
            replay::ENV
        );
    }
    match w.train(reporter).await {
        Err(WorkerError::Interrupted) => {
            info!(worker = task, "Stopped while waiting for the ps tasks.");
            Ok(Outcome::Stopped { global_step: 0 })
        }
        Err(WorkerError::Reshard) => {
            // Caught waiting on a ps (one down, say): the chief checkpoints
            // what it can read (bounded), and the old ps tasks hear that
            // they can go.
            if let Some(chief) = &mut w.chief {
                chief.reshard(0).await?;
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
    // Wide & deep's dense variables are an MLP's, by name and shape.
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
        if let Some(chief) = &mut self.chief {
            chief.start();
        }

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
            let lr = model::learning_rate(&cfg.train, step, self.epoch_steps);
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
            if let Some(c) = &mut self.chief {
                c.on_step(&cfg, step, loss, lr);
            }
            if sync {
                progress = self
                    .wait_for_step(progress, &tags, &read_from, last_progress, &mut buf.params)
                    .await?;
            }
            if let Some(c) = &self.chief {
                c.after_step(&cfg, step, progress.global_step()).await;
            }
            if progress.global_step() > step {
                last_progress = Instant::now();
            }
            rate.step(&cfg, progress.global_step(), loss, reporter);
        };
        if let Some(c) = &mut self.chief {
            c.finish(&outcome, loss).await?;
        }
        // What crossed TCP (gRPC message bytes; shared memory is not
        // counted): the bytes a step costs on a real network.
        let (sent, received) = self
            .cluster
            .links()
            .iter()
            .fold((0, 0), |(s, r), l| (s + l.sent, r + l.received));
        info!(worker = self.task, outcome = %outcome, local_steps = rate.local_steps, tcp_sent_bytes = sent, tcp_received_bytes = received, "Worker done.");
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
        let pushed_at = Instant::now();
        let (loss, pushed) = match &self.model {
            Model::Mlp(mlp) => {
                self.train.batch(idx, &mut buf.x, &mut buf.y);
                let y = self.train.batch_targets(idx, &buf.y, &mut buf.values);
                let (x, ws) = (buf.x.view(), &mut buf.ws);
                let (reg, clip) = (cfg.train.regularization_rate, cfg.train.clip_norm);
                let replay = &mut self.replay;
                self.cluster
                    .step(
                        &mut buf.params,
                        &mut buf.grads,
                        |params, grads| {
                            tokio::task::block_in_place(|| {
                                if let Some(loss) = replay.as_ref().and_then(|r| r.write(grads)) {
                                    return loss;
                                }
                                let loss = mlp.loss_and_grads_into(params, x, y, reg, ws, grads);
                                if clip > 0.0 {
                                    let mut all: Vec<_> =
                                        grads.iter_mut().map(model::values_mut).collect();
                                    model::clip_by_global_norm(&mut all, clip);
                                }
                                crate::metrics::global().computed_here();
                                if let Some(r) = replay {
                                    r.save(grads, loss);
                                }
                                loss
                            })
                        },
                        lr,
                        tags,
                        self.task as u32,
                    )
                    .await
            }
            Model::WideDeep(wd) => {
                self.train.fill_batch(idx, &mut buf.batch);
                match self
                    .sparse_step(wd, buf, lr, cfg.train.clip_norm, tags)
                    .await
                {
                    (Some(loss), Ok(())) => {
                        // The dense part, computed already: its gradients
                        // are in `buf.grads`.
                        self.cluster
                            .step(
                                &mut buf.params,
                                &mut buf.grads,
                                |_, _| loss,
                                lr,
                                tags,
                                self.task as u32,
                            )
                            .await
                    }
                    (None, Ok(())) => return Ok(None),
                    (loss, Err(e)) => (loss, Err(e)),
                }
            }
        };
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

    /// Pulls every variable, retrying while a ps is down or uninitialized
    /// (the chief re-seeds it).
    async fn pull(
        &mut self,
        params: &mut [ArrayD<f32>],
        min_steps: Option<&[u64]>,
    ) -> Result<Progress, WorkerError> {
        let mut backoff = Backoff::new();
        let mut looked: Option<Instant> = None;
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
                    // The ps tasks exit once the run is complete: a worker
                    // that missed the end (cut off when it came) finds the
                    // final checkpoint, where it can see the checkpoint
                    // directory, and ends too. Its file names are looked at
                    // now and then; a file is read only once one is named
                    // at the last step.
                    if looked.is_none_or(|t| t.elapsed() >= WAIT_LOG_EVERY) {
                        looked = Some(Instant::now());
                        let cfg = self.cfg();
                        let named = checkpoint::newest_named_step(&cfg.checkpoint.dir);
                        let done = named
                            .is_some_and(|s| s >= cfg.train.last_step)
                            .then(|| completed_run(&cfg))
                            .flatten();
                        if let Some(step) = done {
                            info!(
                                worker = self.task,
                                global_step = step,
                                "The ps tasks are gone and the final checkpoint is written: the run is complete."
                            );
                            return Ok(Progress {
                                steps: vec![step; self.cluster.num_ps()],
                                complete: true,
                            });
                        }
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
