//! The evaluator (`dtf-evaluator`, `TF_CONFIG` task type `evaluator`):
//! TensorFlow's `SidecarEvaluator` and `BestExporter` in one task beside
//! training. It talks to no ps; everything it needs is in `checkpoint.dir`.
//!
//! - It watches `checkpoint.dir` (inotify, as the config watcher does, plus
//!   a rescan every [`RESCAN`] in case an event is lost or the directory
//!   does not exist yet) and scores each new checkpoint once: test accuracy
//!   of the variables and of their EMA shadows, and test loss; for wide &
//!   deep (`model.kind`), AUC raw and EMA too, log loss as the loss and
//!   accuracy at ½ ([`eval::binary`]).
//! - Newest first: when training writes faster than it scores, the newest
//!   unscored checkpoint is always next, so it never falls behind for good;
//!   older ones are scored when it has nothing newer to do (those the
//!   chief's retention deleted meanwhile are gone, and skipped).
//! - The scores go to TensorBoard as `accuracy`, `ema_accuracy` and `loss`
//!   (and `auc`, `ema_auc` for wide & deep; `rmse`, `ema_rmse`, `mae`, `ema_mae` and no
//!   accuracy for regression) at the checkpoint's step in `checkpoint.dir/eval/events.out.tfevents.*`,
//!   to Prometheus, and to `eval/evaluated.jsonl`, a line per checkpoint:
//!   what it remembers across restarts, so nothing is scored twice.
//! - The `[eval] keep_best` best by `[eval] metric` are copied to
//!   `checkpoint.dir/best/` ([`crate::checkpoint::best`]): the very bytes it
//!   verified and scored, so the chief's retention deleting the originals
//!   meanwhile does not matter.
//! - A checkpoint that does not verify (half-written by something other
//!   than dtf's atomic saver, or damaged) is skipped with a warning, and
//!   tried again only once its files change: a copy still in progress is
//!   scored when it completes, a damaged file is not read over and over.
//! - It exits 0 once it has scored a checkpoint at or past `train.last_step`
//!   and has nothing left to score: the run is over.

/// A log event carrying a checkpoint's [`Scores`] as fields (`accuracy`,
/// `ema_accuracy`, `loss`, `auc`, `ema_auc`, `rmse`, `ema_rmse`, `mae`, `ema_mae`), then the event's own fields
/// and message: `scores_event!(info, scores, step, "Checkpoint scored.")`.
macro_rules! scores_event {
    ($level:ident, $scores:expr, $($rest:tt)+) => {{
        let s = &$scores;
        tracing::$level!(
            accuracy = s.accuracy,
            ema_accuracy = s.ema_accuracy,
            loss = s.loss,
            auc = s.auc,
            ema_auc = s.ema_auc,
            rmse = s.rmse,
            ema_rmse = s.ema_rmse,
            mae = s.mae,
            ema_mae = s.ema_mae,
            $($rest)+
        )
    }};
}

mod ledger;
mod ranking;

use ledger::append_ledger;
pub use ledger::{Record, read_ledger};
pub use ranking::Best;

use crate::checkpoint::best::{self, Entry};
use crate::checkpoint::{self, CheckpointError};
use crate::config::{Config, Metric};
use crate::data::{self, Dataset};
use crate::eval::{self, Scores};
use crate::model::{Mlp, Model, VarSpec, WideDeep};
use crate::summary::EventWriter;
use ndarray::{Array2, ArrayD};
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The evaluator's directory under `checkpoint.dir`: events and ledger.
pub const EVAL_DIR: &str = "eval";
/// The ledger in [`EVAL_DIR`]: one JSON object per scored checkpoint.
pub const LEDGER: &str = "evaluated.jsonl";
/// How often the directory is rescanned without an inotify event.
pub const RESCAN: Duration = Duration::from_secs(5);

/// Why the evaluator cannot work (it exits 1; systemd restarts it).
#[derive(Debug, thiserror::Error)]
pub enum EvaluatorError {
    /// The test set cannot be read or does not fit the model.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// `model.layers` does not describe a model.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// The test rows do not fit the model.
    #[error(
        "model.layers takes {inputs} (dense) inputs, the rows of {data} have {features} features"
    )]
    Width {
        /// The model's input width.
        inputs: usize,
        /// The data set, as [`data::describe`] names it.
        data: String,
        /// The rows' width.
        features: usize,
    },
    /// The test labels cannot give an AUC (wide & deep): one class only.
    #[error("the test split of {data} cannot be scored by AUC: {source}")]
    Labels {
        /// The data set, as [`data::describe`] names it.
        data: String,
        /// What is wrong with the labels.
        source: crate::binary_metrics::BinaryMetricsError,
    },
    /// `best/` cannot be created or listed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The ledger cannot be read or written.
    #[error("evaluator ledger {path}: {source}")]
    Ledger {
        /// `checkpoint.dir/eval/evaluated.jsonl`.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A blocking task panicked.
    #[error("the evaluation task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What the files of a checkpoint looked like when it failed to verify:
/// (size, mtime) of the model and the EMA file, `None` where missing.
type Signature = [Option<(u64, SystemTime)>; 2];

/// The evaluator's state: the model and test set, what it has scored, the
/// best set, and where it writes.
pub struct Evaluator {
    /// `checkpoint.dir`.
    dir: PathBuf,
    /// `checkpoint.dir/eval`.
    eval_dir: PathBuf,
    /// The model of `model.kind` and `model.layers`, with its test split.
    scorer: Scorer,
    /// Its dense variables, to verify checkpoints against.
    specs: Vec<VarSpec>,
    /// The events file, created at the first score; `None` before, or after
    /// a write error (then off for this run, as the chief's summaries).
    events: Option<EventWriter>,
    /// The events file could not be written: do not try again.
    events_off: bool,
    /// Every checkpoint scored, by step (from the ledger, then this run).
    scored: BTreeMap<u64, Scores>,
    /// Checkpoints that did not verify, with what their files looked like.
    failed: HashMap<u64, Signature>,
    /// The best checkpoints.
    best: Best,
    /// Steps to try, ascending (the newest last), from the last listing of
    /// the directory: taken one by one, so that scanning is linear in the
    /// directory's entries however many of them fail to verify.
    queue: Vec<u64>,
    /// How many times the directory was listed (for tests of the above).
    listings: usize,
}

impl Evaluator {
    /// Loads the test set, the ledger and the best set for `cfg`.
    ///
    /// Errors: [`EvaluatorError`]: no usable test set, a ledger or `best/`
    /// that cannot be read or created.
    pub fn open(cfg: &Config) -> Result<Self, EvaluatorError> {
        // Both splits: the test rows take the training split's
        // preprocessing (its mean and std with `data.standardize`), and the
        // model embeds the training split's fields, as the worker's does.
        let (train, test) = data::load_both_for(cfg)?;
        let fields = train.categorical().map_or(0, |c| c.fields.len());
        // Scored in f32 whatever the training precision, as `dtf eval` does.
        let model = Model::new(&cfg.model, fields, crate::kernel::Precision::Float32)?;
        drop(train);
        test.check_labels(model.classes())?;
        if test.features() != model.dense_inputs() {
            return Err(EvaluatorError::Width {
                inputs: model.dense_inputs(),
                data: data::describe(&cfg.data),
                features: test.features(),
            });
        }
        let specs = model.variables();
        let scorer = match model {
            Model::Mlp(mlp) => {
                let (x, _) = test.all();
                Scorer::Mlp { mlp, x, test }
            }
            Model::WideDeep(model) => {
                // Every checkpoint's AUC would be NaN: say so once, now.
                let (_, y) = test.all();
                crate::binary_metrics::auc(&vec![0.0; y.len()], &y).map_err(|source| {
                    EvaluatorError::Labels {
                        data: data::describe(&cfg.data),
                        source,
                    }
                })?;
                Scorer::WideDeep { model, test }
            }
        };
        let dir = cfg.checkpoint.dir.clone();
        let eval_dir = dir.join(EVAL_DIR);
        fs::create_dir_all(&eval_dir).map_err(|source| EvaluatorError::Ledger {
            path: eval_dir.clone(),
            source,
        })?;
        let scored = read_ledger(&eval_dir.join(LEDGER))?;
        let best = Best::open(&dir.join(best::DIR), cfg.eval.metric, cfg.eval.keep_best)?;
        Ok(Evaluator {
            specs,
            scorer,
            events: None,
            events_off: false,
            scored,
            failed: HashMap::new(),
            best,
            dir,
            eval_dir,
            queue: Vec::new(),
            listings: 0,
        })
    }

    /// How many times the directory has been listed.
    pub fn listings(&self) -> usize {
        self.listings
    }

    /// Every checkpoint scored so far, by step.
    pub fn scored(&self) -> &BTreeMap<u64, Scores> {
        &self.scored
    }

    /// The best checkpoints.
    pub fn best(&self) -> &Best {
        &self.best
    }

    /// Lists the directory again: what [`Evaluator::next_step`] takes from is
    /// every checkpoint not scored yet, but those that failed and have not
    /// changed since. Call it when the directory may have changed (an
    /// inotify event, the periodic rescan); `next` calls it when it has
    /// nothing left.
    pub fn rescan(&mut self) {
        self.listings += 1;
        self.queue.clear();
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut steps: Vec<u64> = entries
            .flatten()
            .filter_map(|e| checkpoint::parse_model_name(e.file_name().to_str()?))
            .filter(|s| !self.scored.contains_key(s))
            .filter(|s| self.failed.get(s) != Some(&self.signature(*s)))
            .collect();
        steps.sort_unstable();
        self.queue = steps;
    }

    /// The step to score next: the newest checkpoint of the last listing
    /// not scored yet (listing the directory again when none is left).
    pub fn next_step(&mut self) -> Option<u64> {
        if self.queue.is_empty() {
            self.rescan();
        }
        while let Some(step) = self.queue.pop() {
            if !self.scored.contains_key(&step) {
                return Some(step);
            }
        }
        None
    }

    fn signature(&self, step: u64) -> Signature {
        let look = |name: String| {
            let m = fs::metadata(self.dir.join(name)).ok()?;
            Some((m.len(), m.modified().ok()?))
        };
        [
            look(checkpoint::model_file_name(step)),
            look(checkpoint::ema_file_name(step)),
        ]
    }

    /// Scores the checkpoint at `step` (blocking: run it off the runtime).
    /// Returns its record, or `None` when it does not verify (logged; tried
    /// again once its files change) or is gone.
    ///
    /// Errors: [`EvaluatorError::Ledger`] when the ledger cannot be written.
    pub fn evaluate(&mut self, step: u64) -> Result<Option<Record>, EvaluatorError> {
        let path = self.dir.join(checkpoint::model_file_name(step));
        let signature = self.signature(step);
        let started = std::time::Instant::now();
        let verbatim = match checkpoint::load_verbatim(&path, Some(&self.specs)) {
            Ok(v) => v,
            Err(e) => {
                if signature[0].is_none() {
                    debug!(step, "Checkpoint gone before it was scored (retention).");
                } else {
                    crate::metrics::global().eval_skipped();
                    warn!(step, error = %e, "Checkpoint not scored: it does not verify (half-written or damaged); it is tried again if its files change.");
                }
                self.failed.insert(step, signature);
                return Ok(None);
            }
        };
        self.failed.remove(&step);
        let tensors = |named: &[(String, ArrayD<f32>)]| -> Vec<ArrayD<f32>> {
            named.iter().map(|(_, a)| a.clone()).collect()
        };
        let ckpt = &verbatim.checkpoint;
        let (values, shadows) = (tensors(&ckpt.variables), tensors(&ckpt.shadows));
        let scores = self.scorer.score(step, &values, &shadows, &ckpt.tables);
        // Best set, ledger, events, in that order: a crash before the ledger
        // line means the checkpoint is scored again after a restart, which
        // the best set takes as the same entry, and no event was written yet;
        // a crash after it can cost one event, never write one twice.
        let kept = match self
            .best
            .offer(step, scores, &verbatim.model, &verbatim.ema)
        {
            Ok(kept) => kept,
            Err(e) => {
                warn!(step, error = %e, "Best checkpoints not updated.");
                false
            }
        };
        let record = Record {
            global_step: step,
            scores,
        };
        // The directory may have been removed and made again meanwhile.
        fs::create_dir_all(&self.eval_dir).map_err(|source| EvaluatorError::Ledger {
            path: self.eval_dir.clone(),
            source,
        })?;
        append_ledger(&self.eval_dir.join(LEDGER), &record)?;
        self.scored.insert(step, scores);
        self.write_events(step, scores);
        let best = self.best.entries().first();
        crate::metrics::global().evaluated(
            step,
            scores,
            best.map(|b| score_of(b, self.best.metric)),
        );
        scores_event!(
            info,
            scores,
            step,
            best = kept,
            millis = started.elapsed().as_millis() as u64,
            "Checkpoint scored."
        );
        Ok(Some(record))
    }

    fn write_events(&mut self, step: u64, s: Scores) {
        if self.events_off {
            return;
        }
        if self.events.is_none() {
            match EventWriter::create(&self.eval_dir) {
                Ok(w) => self.events = Some(w),
                Err(e) => {
                    warn!(error = %e, "TensorBoard events are off for this run.");
                    self.events_off = true;
                    return;
                }
            }
        }
        if let Some(w) = &mut self.events {
            let mut values = s.present();
            values.push(("loss", s.loss));
            if let Err(e) = w.scalars(step, &values) {
                warn!(error = %e, "Event not written; TensorBoard events are off for this run.");
                self.events = None;
                self.events_off = true;
            }
        }
    }

    /// The highest step scored when it is at or past `last_step`: the run
    /// is over as far as the evaluator is concerned.
    pub fn complete(&self, last_step: u64) -> Option<u64> {
        self.scored
            .keys()
            .next_back()
            .copied()
            .filter(|&s| s >= last_step)
    }

    /// One line for systemd's STATUS= and logs.
    pub fn status(&self) -> String {
        let newest = match self.scored.iter().next_back() {
            Some((step, s)) if !s.ema_auc.is_nan() => format!(
                "step {step}: ema_auc {:.4}, auc {:.4}, log loss {:.4}",
                s.ema_auc, s.auc, s.loss
            ),
            Some((step, s)) if !s.ema_rmse.is_nan() => format!(
                "step {step}: ema_rmse {:.4}, rmse {:.4}, mae {:.4}",
                s.ema_rmse, s.rmse, s.mae
            ),
            Some((step, s)) => format!(
                "step {step}: ema_accuracy {:.4}, accuracy {:.4}, loss {:.4}",
                s.ema_accuracy, s.accuracy, s.loss
            ),
            None => "nothing scored yet".into(),
        };
        match self.best.entries().first() {
            Some(b) => format!(
                "{} scored, newest {newest}; best step {} ({} {:.4})",
                self.scored.len(),
                b.global_step,
                self.best.metric.name(),
                score_of(b, self.best.metric)
            ),
            None => format!("{} scored, {newest}", self.scored.len()),
        }
    }
}

fn score_of(e: &Entry, metric: Metric) -> f32 {
    e.scores.get(metric)
}

/// The model and the test split in the form its scoring takes.
enum Scorer {
    /// The MLP on the dense test rows.
    Mlp {
        /// The model.
        mlp: Mlp,
        /// The test rows.
        x: Array2<f32>,
        /// The test split, for its labels (classes or values).
        test: Dataset,
    },
    /// Wide & deep on the test split, its categorical ids included.
    WideDeep {
        /// The model.
        model: WideDeep,
        /// The test split (labels checked to hold both classes).
        test: Dataset,
    },
}

impl Scorer {
    /// Scores the dense `values` and `shadows` (verified against the
    /// model's variables) and, for wide & deep, the checkpoint's `tables`.
    /// A side that cannot be scored (NaN logits: diverged) is NaN, logged:
    /// a record all the same, never kept among the best.
    fn score(
        &self,
        step: u64,
        values: &[ArrayD<f32>],
        shadows: &[ArrayD<f32>],
        tables: &[(String, crate::model::table::Rows)],
    ) -> Scores {
        match self {
            Scorer::Mlp { mlp, x, test } => {
                eval::score(mlp, values, shadows, x.view(), test.targets())
            }
            Scorer::WideDeep { model, test } => {
                let tables = eval::binary::tables(model, tables);
                let nan = eval::binary::Binary {
                    auc: f32::NAN,
                    log_loss: f32::NAN,
                    accuracy: f32::NAN,
                };
                let side = |params: &[ArrayD<f32>], ema: bool| {
                    eval::binary::score(model, params, &tables, ema, test).unwrap_or_else(|e| {
                        warn!(step, ema, error = %e, "Checkpoint scored NaN: its test split cannot be scored.");
                        nan
                    })
                };
                let (raw, ema) = (side(values, false), side(shadows, true));
                Scores {
                    accuracy: raw.accuracy,
                    ema_accuracy: ema.accuracy,
                    loss: raw.log_loss,
                    auc: raw.auc,
                    ema_auc: ema.auc,
                    ..Scores::none()
                }
            }
        }
    }
}

/// Watches `dir` and sends `()` when something in it is created, renamed
/// or written; `None` if it cannot be watched (yet): the rescan covers it.
fn watch_dir(dir: &Path, tx: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
    use notify::{EventKind, RecursiveMode, Watcher};
    let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && matches!(ev.kind, EventKind::Create(_) | EventKind::Modify(_))
        {
            let _ = tx.send(());
        }
    })
    .ok()?;
    watcher.watch(dir, RecursiveMode::NonRecursive).ok()?;
    debug!(dir = %dir.display(), "Watching the checkpoint directory.");
    Some(watcher)
}

/// What the evaluator tells systemd: readiness, then a status line after
/// each checkpoint. `daemon::Notifier` implements it.
pub trait Reporter: Sync {
    /// `READY=1` with a `STATUS=` line.
    fn ready(&self, status: &str);
    /// `STATUS=` only.
    fn status(&self, status: &str);
}

/// The evaluator's job: open, say ready, then score checkpoints until the
/// run is complete or `shutdown`.
///
/// Errors: [`EvaluatorError`] when the test set, the ledger or `best/`
/// cannot be used; a checkpoint that does not verify is never an error.
pub async fn run(
    config: watch::Receiver<Arc<Config>>,
    reporter: &dyn Reporter,
    shutdown: CancellationToken,
) -> Result<(), EvaluatorError> {
    let cfg = config.borrow().clone();
    let dir = cfg.checkpoint.dir.clone();
    let opened = {
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || Evaluator::open(&cfg))
    };
    let mut ev = opened.await??;
    info!(dir = %dir.display(), scored_before = ev.scored().len(), best = ev.best().entries().len(), metric = cfg.eval.metric.name(), "Evaluator ready.");
    reporter.ready(&format!(
        "evaluator: watching {}; {}",
        dir.display(),
        ev.status()
    ));
    let (wake_tx, mut wake) = mpsc::unbounded_channel();
    let mut watcher = None;
    let mut watched = None;
    let mut rescan_due = true;
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        // Drain the events that led here: this listing sees what they announced.
        let mut woke = false;
        while wake.try_recv().is_ok() {
            woke = true;
        }
        // A directory removed and made again is a new inode: watch the new one.
        let inode = fs::metadata(&dir)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        if inode != watched {
            watcher = None;
            watched = inode;
            woke = true;
        }
        if watcher.is_none() {
            watcher = watch_dir(&dir, wake_tx.clone());
        }
        if woke || rescan_due {
            ev.rescan();
            rescan_due = false;
        }
        let next = ev.next_step();
        if let Some(step) = next {
            let (back, result) = tokio::task::spawn_blocking(move || {
                let r = ev.evaluate(step);
                crate::metrics::global().computed_here();
                (ev, r)
            })
            .await?;
            ev = back;
            if result?.is_some() {
                reporter.status(&format!("evaluator: {}", ev.status()));
            }
            continue;
        }
        let last_step = config.borrow().train.last_step;
        if let Some(step) = ev.complete(last_step) {
            info!(
                global_step = step,
                "The run is complete and every checkpoint is scored; exiting."
            );
            reporter.status(&format!("evaluator: run complete; {}", ev.status()));
            return Ok(());
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = wake.recv() => {
                // Let a burst of events (temp file, renames, index) settle.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ = tokio::time::sleep(RESCAN) => rescan_due = true,
        }
    }
}

#[cfg(test)]
mod tests;
