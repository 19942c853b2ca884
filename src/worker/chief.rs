//! The chief's duties (worker 0, TensorFlow's `is_chief`): initializing or
//! restoring the variables on the ps tasks, the periodic checkpoint, the
//! summaries, and the end of the run (final checkpoint, evaluation,
//! completion). The step loop in [`super`] is the same for every worker and
//! calls in here through [`Chief`], which owns what these duties need.

use super::backoff::Backoff;
use super::checkpoints::{CheckpointTimer, Checkpoints};
use super::{Outcome, WorkerError};
use crate::checkpoint::{self, Checkpoint};
use crate::config::{Config, Mode};
use crate::data::{self, Preprocessing, Split};
use crate::model::Model;
use crate::optimizer::Optimizer;
use crate::summary::Summaries;
use crate::transport::call::Cut;
use crate::transport::{Cluster, PsState, Snapshot};
use ndarray::ArrayD;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Attempts at the final checkpoint before the chief gives up with an error
/// (a full disk may be freed meanwhile; systemd restarts the chief, which
/// tries again, as the ps tasks still hold the variables).
const FINAL_SAVE_ATTEMPTS: u32 = 3;
/// How long the chief waits, at a re-shard, for every ps to reload the new
/// `cluster.ps` (and so stop taking pushes) before it checkpoints anyway.
const RESHARD_FREEZE: Duration = Duration::from_secs(10);
/// How long the chief tries to read the old ps tasks for the re-shard
/// checkpoint before the new placement starts from the newest checkpoint.
const RESHARD_READ: Duration = Duration::from_secs(30);

/// Worker 0's duties beside the step loop, and what they need: its own
/// handle on the cluster, the run id, its checkpoints (one
/// [`crate::checkpoint::Saver`], one [`crate::checkpoint::ModelMeta`]) and, while training, the checkpoint timer and the
/// summaries. The worker holds it and calls in; it never calls back.
pub(super) struct Chief {
    /// The live configuration (reloads replace it).
    config: watch::Receiver<Arc<Config>>,
    cluster: Cluster,
    model: Model,
    /// How the data's rows become inputs (the final evaluation's test split).
    preprocessing: Preprocessing,
    checkpoints: Arc<Checkpoints>,
    /// The run this chief trains, once known ([`Checkpoint::run`]).
    run: Option<u64>,
    /// `cluster.ps` as this process started with it (the old list at a
    /// re-shard).
    ps: Vec<String>,
    shutdown: CancellationToken,
    /// From [`Chief::start`] to [`Chief::finish`].
    beside: Option<Beside>,
}

/// What runs beside the step loop.
struct Beside {
    /// Saves every `checkpoint.save_secs` (and the step loop's snapshots
    /// every `checkpoint.save_steps`), off the step loop.
    timer: CheckpointTimer,
    /// The TensorBoard events file (off after a write error).
    summaries: Summaries,
}

impl Chief {
    /// The chief of a worker whose `cluster` is placed for `model`'s variables
    /// and whose data is read through `preprocessing`; `class_names`: the
    /// training labels' names, for the checkpoints' metadata.
    pub(super) fn new(
        config: watch::Receiver<Arc<Config>>,
        cluster: Cluster,
        model: Model,
        preprocessing: Preprocessing,
        fields: &[String],
        class_names: Option<Vec<String>>,
        shutdown: CancellationToken,
    ) -> Self {
        let cfg = config.borrow().clone();
        Chief {
            checkpoints: Arc::new(Checkpoints::new(
                &cfg,
                &model,
                &preprocessing,
                fields,
                class_names,
            )),
            config,
            cluster,
            model,
            preprocessing,
            run: None,
            ps: cfg.cluster.ps.clone(),
            shutdown,
            beside: None,
        }
    }

    fn cfg(&self) -> Arc<Config> {
        self.config.borrow().clone()
    }

    /// Training starts: the checkpoint timer, and the events file opened.
    pub(super) fn start(&mut self) {
        self.beside = Some(Beside {
            timer: CheckpointTimer::start(
                self.config.clone(),
                self.cluster.clone(),
                self.checkpoints.clone(),
            ),
            summaries: Summaries::open(&self.cfg().checkpoint.dir),
        });
    }

    /// A step was computed at `step` (the step its parameters were read at).
    pub(super) fn on_step(&mut self, cfg: &Config, step: u64, loss: f32, lr: f32) {
        if let Some(b) = &mut self.beside {
            b.summaries
                .on_step(step, cfg.train.save_summaries_steps, loss, lr);
        }
    }

    /// After a step that moved the global step from `before` to `after`:
    /// with `checkpoint.save_steps` = N, a checkpoint when `after` has
    /// reached the next multiple of N (TensorFlow's `save_checkpoint_steps`).
    ///
    /// The snapshot is taken here, before the chief's next step, so with one
    /// worker, or in sync mode, the checkpoint is at exactly the multiple;
    /// with async workers it is at the first global step the chief sees at or
    /// past it. Writing it goes to the timer's task, off the step loop. The
    /// step at `last_step` is left to the final checkpoint.
    pub(super) async fn after_step(&self, cfg: &Config, before: u64, after: u64) {
        let every = cfg.checkpoint.save_steps;
        if every == 0 || after / every <= before / every || after >= cfg.train.last_step {
            return;
        }
        let Some(b) = &self.beside else { return };
        match self.checkpoints.snapshot(&self.cluster, cfg).await {
            Ok(snapshot) => b.timer.save(snapshot).await,
            Err(e) => {
                warn!(global_step = after, error = %e, "Checkpoint skipped: could not read the variables.")
            }
        }
    }

    /// The chief fills the shards of the `missing` (uninitialized) ps tasks.
    /// One that holds aside a snapshot it restored at start is told to
    /// adopt it when the snapshot is of this run and no older than the
    /// newest checkpoint; the rest are seeded from the newest valid
    /// checkpoint, or with fresh values when there is none (a new run).
    ///
    /// In sync mode the shards count steps in lockstep: a filled shard
    /// resumes at the step of the shards that kept running (the newest of
    /// them and of the sources), its values those of its snapshot, or of
    /// the checkpoint when it has none to adopt: partial recovery (CPR),
    /// the updates its source lacks lost, no step applied twice.
    ///
    /// Errors: a ps that fails the call, or an unreadable checkpoint.
    ///
    /// `seen`: each shard's step as the worker last saw it (what a ps that
    /// restarted had reached, at least).
    pub(super) async fn fill(
        &mut self,
        states: &[PsState],
        missing: &[usize],
        seen: &[u64],
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg();
        let sync = cfg.train.mode == Mode::Sync;
        let specs = self.model.variables();
        let dir = cfg.checkpoint.dir.clone();
        let found =
            tokio::task::spawn_blocking(move || checkpoint::restore_latest(&dir, &specs)).await??;
        let newest = found.as_ref().map(|(_, c)| c.global_step);
        let run = self.run_id(found.as_ref().map(|(_, c)| c.run), states);
        // Like with like: a shard's snapshot against that shard's own count
        // in the checkpoint (in async mode it may count behind ps 0's
        // global step for good), never against the global step (issue 45).
        let shard_in_checkpoint =
            |ps: usize| found.as_ref().map(|(_, c)| c.shard_step(ps, states.len()));
        let mut adopt = Vec::new();
        for &ps in missing {
            let s = &states[ps];
            if !s.restored {
                continue;
            }
            let step = s.restored_step;
            if s.run != run {
                warn!(
                    ps,
                    restored_step = step,
                    snapshot_run = s.run,
                    run,
                    "The ps's snapshot is of another run (its state directory outlived that run); seeding the shard, not adopting it."
                );
            } else if let Some(ckpt) = shard_in_checkpoint(ps).filter(|&c| c > step) {
                warn!(
                    ps,
                    restored_step = step,
                    checkpoint_shard_step = ckpt,
                    checkpoint_step = newest.unwrap_or(0),
                    steps_lost = seen.get(ps).copied().unwrap_or(0).saturating_sub(ckpt),
                    "The ps's snapshot is older than its shard in the newest checkpoint; seeding the shard from the checkpoint."
                );
            } else {
                adopt.push((ps, step, step));
            }
        }
        // Sync: the shards count steps in lockstep (a worker tags each push
        // with the step it read from that shard), so every shard filled
        // here resumes at one step: the newest of the shards that kept
        // running and of the sources (snapshots, the checkpoint). Partial
        // recovery (CPR): the live shards keep their progress; a filled
        // shard has lost the updates its source lacks.
        let seeded_from = (adopt.len() < missing.len()).then_some(newest.unwrap_or(0));
        let resume = (0..states.len())
            .filter(|ps| !missing.contains(ps) && states[*ps].initialized)
            .map(|ps| states[ps].global_step)
            .chain(adopt.iter().map(|a| a.1))
            .chain(seeded_from)
            .max()
            .unwrap_or(0);
        if sync {
            for a in &mut adopt {
                a.2 = resume;
            }
        }
        let adopted = if adopt.is_empty() {
            Vec::new()
        } else {
            self.cluster.adopt(&adopt, run).await?
        };
        let bound = lost_bound(&cfg, states);
        for &(ps, step, resumed_at) in adopt.iter().filter(|(ps, ..)| adopted.contains(ps)) {
            let before = seen.get(ps).copied().unwrap_or(0);
            let steps_lost = before.max(resumed_at) - step;
            if bound.is_some_and(|b| steps_lost > b) {
                // More than a snapshot's interval: the shard came back from
                // older state than its own snapshots should have left.
                warn!(
                    ps,
                    restored_step = step,
                    before,
                    steps_lost,
                    bound_steps = bound.unwrap_or(0),
                    resumed_at,
                    checkpoint_shard_step = shard_in_checkpoint(ps).unwrap_or(0),
                    "The ps restarted and restored its shard from its own snapshot, further behind than ps.snapshot_secs allows: neither its state directory nor its ring neighbour held newer state (put back from an older copy, or its snapshot writes failed)."
                );
            } else {
                info!(
                    ps,
                    restored_step = step,
                    before,
                    steps_lost,
                    resumed_at,
                    "The ps restarted and restored its shard from its own snapshot."
                );
            }
        }
        let rest: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|ps| !adopted.contains(ps))
            .collect();
        if rest.is_empty() {
            return Ok(());
        }
        let all = rest.len() == states.len();
        if !sync {
            return self.seed(found, &rest, all, false, run, None).await;
        }
        if adopt.iter().any(|(ps, ..)| !adopted.contains(ps)) {
            // Told to adopt, but it did not (it restarted again meanwhile):
            // the caller reads the states again and asks anew.
            return Ok(());
        }
        if found.is_none() && !all {
            // No checkpoint to seed one shard from in a live run (the chief
            // saves one at a fresh start: it was deleted): the whole model
            // starts afresh, together.
            let every: Vec<usize> = (0..states.len()).collect();
            return self.seed(found, &every, true, true, run, None).await;
        }
        self.seed(found, &rest, all, false, run, Some(resume)).await
    }

    /// The run this chief trains: the one it learned or started, else the
    /// newest checkpoint's, else that of the shards already initialized,
    /// else a new one (a fresh run).
    fn run_id(&mut self, checkpoint: Option<u64>, states: &[PsState]) -> u64 {
        *self.run.get_or_insert_with(|| {
            checkpoint
                .filter(|&r| r != 0)
                .or_else(|| {
                    states
                        .iter()
                        .find(|s| s.initialized && s.run != 0)
                        .map(|s| s.run)
                })
                .unwrap_or_else(|| rand::random::<u64>().max(1))
        })
    }

    /// Seeds the shards of `missing` ps tasks, as `run`'s, from `found`
    /// (the newest valid checkpoint), or with fresh values when there is
    /// none. With `force`, shards that are still live are overwritten too.
    /// With `at`, the shards count on from that step rather than the
    /// checkpoint's (sync partial recovery: the other shards' step).
    async fn seed(
        &mut self,
        found: Option<(std::path::PathBuf, Checkpoint)>,
        missing: &[usize],
        all: bool,
        force: bool,
        run: u64,
        at: Option<u64>,
    ) -> Result<(), WorkerError> {
        let cfg = self.cfg();
        let optimizer = cfg.train.optimizer();
        // Whether the checkpoint restored is a whole file of this run in
        // this run's directory: seeding from it again gives the same state.
        let mut whole_here = false;
        let (values, shadows, slots, tables, step, from) = match found {
            Some((path, c)) => {
                whole_here = c.run == run
                    && c.increment.as_ref().is_none_or(|i| i.base.is_none())
                    && path.parent() == Some(cfg.checkpoint.dir.as_path());
                let values: Vec<ArrayD<f32>> = c.variables.into_iter().map(|(_, a)| a).collect();
                let shadows: Vec<ArrayD<f32>> = c.shadows.into_iter().map(|(_, a)| a).collect();
                let tables =
                    restored_tables(&cfg, (&c.table_optimizers, c.slots.optimizer), c.tables);
                let slots = restored_slots(optimizer, c.slots, &path);
                (
                    values,
                    Some(shadows),
                    slots,
                    tables,
                    c.global_step,
                    Some(path),
                )
            }
            None => (
                self.model.init(cfg.train.seed),
                None,
                None,
                Vec::new(),
                0,
                None,
            ),
        };
        let checkpoint_step = step;
        let step = at.unwrap_or(step);
        let took = self
            .cluster
            .initialize(
                missing,
                &values,
                shadows.as_deref(),
                slots.as_deref(),
                &tables,
                step,
                force,
                run,
            )
            .await?;
        match &from {
            Some(path) if step != checkpoint_step => {
                info!(ps = ?took, step, checkpoint_step, checkpoint = %path.display(), "Restored the model from the newest valid checkpoint, these shards at the step of the others (partial recovery: the updates since the checkpoint are lost for them alone).")
            }
            Some(path) => {
                info!(ps = ?took, step, checkpoint = %path.display(), "Restored the model from the newest valid checkpoint.")
            }
            None => {
                info!(ps = ?took, seed = cfg.train.seed, run, "Initialized the model with fresh values.")
            }
        }
        // A fresh start or a whole-cluster restore is saved at once, as
        // TensorFlow does — but not a restore of a whole checkpoint of this
        // run in this directory at this very step (a re-shard's, a restart
        // of the whole cluster): the file holds what the save would write
        // again, and seeding from it again gives the same state, so the
        // write (a whole read's worth of table bytes) would only lengthen
        // the pause. A failure is logged and counted; the periodic and
        // final saves try again.
        let saved = whole_here && step == checkpoint_step;
        if all && !took.is_empty() && !saved {
            let shadows = shadows.unwrap_or_else(|| values.clone());
            let slots = slots.unwrap_or_else(|| optimizer.initial_slots(&self.model.variables()));
            let snapshot = Snapshot {
                step,
                values,
                shadows,
                slots,
                run,
                // Every shard was just initialized at this step.
                shard_steps: vec![step; cfg.cluster.ps.len()],
                tables,
                cut: Cut::Plain,
                removed: Vec::new(),
            };
            let _ = self.checkpoints.save(&cfg, snapshot).await;
        }
        Ok(())
    }

    /// The end of the run, however it ended: the timer stopped, then the
    /// final checkpoint, evaluation, and (at `last_step`) telling the ps
    /// tasks the run is complete.
    pub(super) async fn finish(&mut self, outcome: &Outcome, loss: f32) -> Result<(), WorkerError> {
        let mut summaries = None;
        if let Some(b) = self.beside.take() {
            b.timer.stop().await;
            summaries = Some(b.summaries);
        }
        if let Outcome::Reshard { global_step } = outcome {
            return self.reshard(*global_step).await;
        }
        let cfg = self.cfg();
        // At the end of a run keep trying until a stop signal: the ps tasks
        // must hear of it. On a stop, one attempt is all it gets.
        let stopping = matches!(outcome, Outcome::Stopped { .. });
        let mut backoff = Backoff::new();
        let snapshot = loop {
            match self.cluster.snapshot().await {
                Ok(s) => break s,
                Err(e) if !stopping && (e.is_unavailable() || e.needs_pull()) => {
                    backoff.wait(&e.to_string(), &self.shutdown).await?
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.save_final(&snapshot).await?;
        let (step, values, shadows) = (snapshot.step, &snapshot.values, &snapshot.shadows);
        if let Outcome::Finished { .. } = outcome {
            match &self.model {
                Model::Mlp(mlp) => {
                    let mut test = data::load_for(&cfg, Split::Test)?;
                    test.check_labels(mlp.classes())?;
                    test.set_preprocessing(self.preprocessing.clone())?;
                    let (x, _) = test.all();
                    let s = crate::eval::score(mlp, values, shadows, x.view(), test.targets());
                    let loss = format!("{loss:.4}");
                    if test.is_regression() {
                        info!(
                            global_step = step,
                            loss = %loss,
                            test_rmse = %format!("{:.4}", s.rmse),
                            ema_test_rmse = %format!("{:.4}", s.ema_rmse),
                            test_mae = %format!("{:.4}", s.mae),
                            ema_test_mae = %format!("{:.4}", s.ema_mae),
                            "Final evaluation."
                        );
                    } else {
                        info!(
                            global_step = step,
                            loss = %loss,
                            test_accuracy = %format!("{:.4}", s.accuracy),
                            ema_test_accuracy = %format!("{:.4}", s.ema_accuracy),
                            "Final evaluation."
                        );
                    }
                    if let Some(summaries) = &mut summaries {
                        summaries.on_eval(step, &s.present());
                    }
                }
                // Its test rows would be created on the ps by a pull: the
                // final checkpoint, which holds the tables, is scored
                // instead (`dtf eval`, the evaluator, `dtf local`).
                Model::WideDeep(_) => info!(
                    global_step = step,
                    loss = %format!("{loss:.4}"),
                    "Training done; the final checkpoint holds the tables."
                ),
            }
            self.cluster.complete(step).await?;
        }
        Ok(())
    }

    /// The chief's part of a re-shard (`cluster.ps` changed), at `step`:
    /// once every old ps has stopped taking pushes, a checkpoint of their
    /// state, then the word to each that it is written (they start again
    /// under the new list, or exit). On its own start again the chief
    /// seeds the new placement from that checkpoint.
    ///
    /// Bounded throughout: a ps that does not stop taking pushes within
    /// [`RESHARD_FREEZE`] is checkpointed anyway (its pushes after that are
    /// lost), and one that cannot be read within [`RESHARD_READ`] leaves the
    /// new placement to start from the newest checkpoint there is (said at
    /// ERROR): a ps host that is gone must not hold the cluster up.
    pub(super) async fn reshard(&mut self, step: u64) -> Result<(), WorkerError> {
        let began = Instant::now();
        let cfg = self.cfg();
        info!(global_step = step, old = ?self.ps, new = ?cfg.cluster.ps, "cluster.ps changed: re-sharding. Checkpointing the old ps tasks' state once they stop taking pushes.");
        let mut log = Backoff::new();
        let open = loop {
            let open: Vec<usize> = self
                .cluster
                .each_state()
                .await
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.as_ref().is_ok_and(|s| s.resharding))
                .map(|(ps, _)| ps)
                .collect();
            if open.is_empty() {
                break open;
            }
            if began.elapsed() >= RESHARD_FREEZE {
                warn!(ps = ?open, waited_secs = RESHARD_FREEZE.as_secs(), "These ps tasks still take pushes (is their dtf.toml edited too?); checkpointing anyway: what they take from now on is lost.");
                break open;
            }
            if log.should_log() {
                info!(ps = ?open, "Waiting for the ps tasks to reload the new cluster.ps (they then stop taking pushes).");
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = self.shutdown.cancelled() => return Err(WorkerError::Interrupted),
            }
        };
        let mut backoff = Backoff::new();
        let snapshot = loop {
            match self.cluster.snapshot().await {
                Ok(s) => break Some(s),
                Err(e)
                    if began.elapsed() < RESHARD_READ && (e.is_unavailable() || e.needs_pull()) =>
                {
                    backoff.wait(&e.to_string(), &self.shutdown).await?
                }
                Err(e) => {
                    tracing::error!(error = %e, "The old ps tasks cannot be read: the re-shard starts from the newest checkpoint there is, and the steps since it are lost.");
                    break None;
                }
            }
        };
        let (mut at, mut written) = (step, false);
        if let Some(snapshot) = snapshot {
            at = snapshot.step;
            match self.save_final(&snapshot).await {
                Ok(()) => written = true,
                Err(e) => {
                    tracing::error!(error = %e, "The re-shard checkpoint was not written: the re-shard starts from the newest checkpoint there is, and the steps since it are lost.")
                }
            }
        }
        // Only those that re-shard: an older dtf would take the word for
        // the end of the run. The rest are told by the chief started again,
        // once they do (`Worker::ensure_initialized`).
        if !open.is_empty() {
            warn!(ps = ?open, "These ps tasks do not re-shard (their cluster.ps has not changed yet, or they do not answer): they keep the old placement until they do, and are told then.");
        }
        let told: Vec<usize> = (0..self.cluster.num_ps())
            .filter(|ps| !open.contains(ps))
            .collect();
        self.tell_reshard(at, &told, written).await;
        info!(
            global_step = at,
            millis = began.elapsed().as_millis() as u64,
            "Re-shard checkpoint done; starting again under the new cluster.ps."
        );
        Ok(())
    }

    /// Tells the ps tasks `only`, which report re-sharding, that the
    /// re-shard checkpoint (at `step`) is done — `checkpointed`: read from
    /// them and written, so they take no last snapshot: each starts again
    /// under the new list, or exits.
    pub(super) async fn tell_reshard(&self, step: u64, only: &[usize], checkpointed: bool) {
        let answers = self
            .cluster
            .complete_reshard(step, only, checkpointed)
            .await;
        for (&ps, r) in only.iter().zip(answers) {
            if let Err(e) = r {
                warn!(ps, error = %e, "This ps did not take the re-shard (its cluster.ps has not changed yet); the chief, started again, tells it again once it has.");
            }
        }
    }

    /// The final checkpoint, retried a few times: a run is complete only once
    /// it is durable, so a failure here is the chief's error, never a skip.
    async fn save_final(&self, snapshot: &Snapshot) -> Result<(), WorkerError> {
        let cfg = self.cfg();
        let step = snapshot.step;
        let mut backoff = Backoff::new();
        let mut attempt = 1;
        loop {
            match self.checkpoints.save(&cfg, snapshot.clone()).await {
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
                    // The error is already logged by Checkpoints::save.
                    let _ = backoff.wait(&e.to_string(), &self.shutdown).await;
                }
            }
        }
    }
}

/// The checkpoint's slots to restore with the variables when they are the
/// configured optimizer's; else `None` (fresh slots), said once per process:
/// changing `train.optimizer` is a warm start, as TensorFlow's
/// `init_from_checkpoint` allows, and the next checkpoint holds only the new
/// optimizer's slots.
fn restored_slots(
    optimizer: Optimizer,
    saved: checkpoint::Slots,
    path: &std::path::Path,
) -> Option<Vec<ArrayD<f32>>> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if saved.optimizer.name() == optimizer.name() {
        if saved.optimizer != optimizer && !WARNED.swap(true, Ordering::Relaxed) {
            info!(checkpoint = %path.display(), saved = %saved.optimizer.describe(), now = %optimizer.describe(), "Restoring the optimizer's slots; its hyperparameters changed.");
        }
        return Some(saved.tensors.into_iter().map(|(_, a)| a).collect());
    }
    if !WARNED.swap(true, Ordering::Relaxed) {
        let dropped: Vec<&str> = saved.tensors.iter().map(|(n, _)| n.as_str()).collect();
        warn!(
            checkpoint = %path.display(),
            saved = saved.optimizer.name(),
            now = optimizer.name(),
            dropped = dropped.len(),
            "The checkpoint is of another optimizer: the variables are restored, the slots of train.optimizer start fresh, and the checkpoint's slots are dropped from the next checkpoint."
        );
    }
    None
}

/// A checkpoint's tables for this run's rules (`cfg`): each table's slots
/// kept when its rule in the checkpoint (`saved`) is the same, else fresh
/// ones (as [`restored_slots`] does for the variables).
fn restored_tables(
    cfg: &Config,
    saved: (&[(String, crate::optimizer::TableOptimizer)], Optimizer),
    mut tables: Vec<(String, crate::model::table::Rows)>,
) -> Vec<(String, crate::model::table::Rows)> {
    for (name, rows) in &mut tables {
        let now = cfg.table_optimizer(name);
        let then = crate::checkpoint::table_rule(saved.0, saved.1, name);
        if now.map(|o| o.name()) == then.map(|o| o.name()) {
            continue;
        }
        let slots = now.map_or(&[][..], |o| o.slot_names());
        info!(
            table = %name,
            saved = then.map_or("none", |o| o.name()),
            now = now.map_or("none", |o| o.name()),
            "The checkpoint's table is of another optimizer: its rows are restored, their slots start fresh."
        );
        rows.slots = (0..slots.len())
            .map(|k| {
                let init = now.map_or(0.0, |o| o.slot_init(k));
                vec![init; rows.values.len()]
            })
            .collect();
    }
    tables
}

/// The steps a shard restored from its own snapshot may have lost without
/// a fault beyond the one promised: `ps.snapshot_secs` (doubled, for a
/// snapshot late on a loaded machine) and a second, at the rate the live
/// shards report. `None` when no live shard reports a rate (one ps task, or
/// all restarted): the bound cannot be told.
fn lost_bound(cfg: &Config, states: &[PsState]) -> Option<u64> {
    let examples = states
        .iter()
        .filter(|s| s.initialized)
        .map(|s| s.examples_per_sec)
        .fold(0.0, f64::max);
    let steps_per_sec = examples / cfg.train.batch_size.max(1) as f64;
    (steps_per_sec > 0.0)
        .then(|| (steps_per_sec * (2.0 * cfg.ps.snapshot_secs as f64 + 1.0)).ceil() as u64)
}
