//! The chief's checkpoints: how one is written ([`Checkpoints`]) and when
//! ([`CheckpointTimer`], every `checkpoint.save_secs`, off the step loop);
//! with embedding tables and `checkpoint.full_every` > 1, the periodic ones
//! as chains of a whole checkpoint and deltas ([`Checkpoints::snapshot`]).

use crate::checkpoint::Increment;
use crate::checkpoint::{self, Checkpoint, ModelMeta, Saver};
use crate::config::{Config, DataFormat};
use crate::data::Preprocessing;
use crate::model::{Model, VarSpec};
use crate::transport::call::Cut;
use crate::transport::{Cluster, PsCallError, Snapshot};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The chief's checkpoints: one [`Saver`] and one [`ModelMeta`], made once
/// (the data's header read once); at each save the keys a reload may change
/// (`checkpoint.max_to_keep`, the `[train]` table) are taken afresh.
pub(super) struct Checkpoints {
    specs: Vec<VarSpec>,
    /// Everything needed to use a checkpoint without the config or the data.
    meta: ModelMeta,
    /// One save at a time (the timer, a re-seed, the final save).
    saver: Mutex<Saver>,
    /// The chains of incremental checkpoints.
    chains: Mutex<Chains>,
    /// One periodic snapshot at a time (the timer's and the step loop's,
    /// across a reload from `save_secs` to `save_steps`): a ps holds one
    /// delta a table for its reader.
    taking: tokio::sync::Mutex<()>,
}

/// The chains of incremental checkpoints: the one the periodic saves
/// extend, and the recent chains' bases, which the deltas still queued
/// for writing name.
#[derive(Debug, Default)]
struct Chains {
    /// `None`: the next periodic checkpoint is whole, a new chain's base.
    current: Option<Chain>,
    /// The newest chains' bases, oldest first ([`RECENT_BASES`]).
    bases: Vec<Base>,
}

/// Chains whose bases [`Chains`] remembers: more than snapshots can be
/// queued for writing.
const RECENT_BASES: usize = 8;

/// A chain of incremental checkpoints: its base, whole, then deltas of the
/// rows changed since it (docs/design.md, "Incremental checkpoints").
#[derive(Debug, Clone, Copy)]
struct Chain {
    /// Its id, random: the ps tasks count each table's changes for it.
    id: u64,
    /// Deltas taken since the base.
    deltas: u32,
}

/// A chain's base.
#[derive(Debug, Clone, Copy)]
struct Base {
    chain: u64,
    /// Its global step.
    step: u64,
    /// `None` until its save ends, then whether it was written.
    written: Option<bool>,
}

impl Chains {
    fn base(&self, chain: u64) -> Option<Base> {
        self.bases.iter().find(|b| b.chain == chain).copied()
    }

    /// A new chain, of a base at `step`.
    fn start(&mut self, chain: u64, step: u64) {
        self.current = Some(Chain {
            id: chain,
            deltas: 0,
        });
        self.bases.push(Base {
            chain,
            step,
            written: None,
        });
        if self.bases.len() > RECENT_BASES {
            self.bases.remove(0);
        }
    }

    /// How the save of a checkpoint of `chain` (its base when `base`) ended.
    fn saved(&mut self, chain: u64, base: bool, ok: bool) {
        if base && let Some(b) = self.bases.iter_mut().find(|b| b.chain == chain) {
            b.written = Some(ok);
        }
        // A failed base, or delta: the next checkpoint is whole.
        if !ok && self.current.is_some_and(|c| c.id == chain) {
            self.current = None;
        }
    }
}

impl Checkpoints {
    /// `fields`: the data's categorical fields (wide & deep's inputs);
    /// `class_names`: the training labels' names, when they were names.
    pub(super) fn new(
        cfg: &Config,
        model: &Model,
        preprocessing: &Preprocessing,
        fields: &[String],
        class_names: Option<Vec<String>>,
    ) -> Self {
        let meta = ModelMeta {
            layers: model.layers().to_vec(),
            activation: cfg.model.activation,
            dropout: cfg.model.dropout,
            classes: model.classes(),
            task: cfg.model.task,
            preprocessing: preprocessing.clone(),
            label: (cfg.data.format == DataFormat::Csv).then(|| cfg.data.label.clone()),
            hyperparameters: None,
            training_data: Some(cfg.data.clone()),
            features: crate::data::feature_names(&cfg.data)
                .filter(|names| names.len() == model.dense_inputs()),
            class_names,
            wide_deep: match model {
                Model::Mlp(_) => None,
                Model::WideDeep(m) => Some(checkpoint::WideDeepMeta {
                    fields: fields.to_vec(),
                    embedding_dim: m.dim(),
                }),
            },
        };
        Checkpoints {
            specs: model.variables(),
            meta,
            saver: Mutex::new(Saver::at(&cfg.checkpoint.dir, cfg.checkpoint.max_to_keep)),
            chains: Mutex::default(),
            taking: tokio::sync::Mutex::new(()),
        }
    }

    fn chains(&self) -> std::sync::MutexGuard<'_, Chains> {
        self.chains.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The delta the current chain takes next, if it takes one: fewer than
    /// `every - 1` since its base, whose save has not failed and which,
    /// once written, is still in `dir` (retention, an operator, a reload of
    /// `full_every` to 1 and back may have removed it since).
    fn next_delta(&self, every: u32, dir: &std::path::Path) -> Option<(Chain, Base)> {
        let chains = self.chains();
        let c = chains.current.filter(|c| c.deltas + 1 < every)?;
        let base = chains.base(c.id)?;
        drop(chains);
        match base.written {
            Some(false) => None,
            None => Some((c, base)),
            Some(true) => {
                let path = dir.join(checkpoint::model_file_name(base.step));
                let chain = format!("{:016x}", c.id);
                let meta = checkpoint::read_metadata(&path).ok()?;
                (meta.get("chain") == Some(&chain)).then_some((c, base))
            }
        }
    }

    /// A periodic checkpoint's snapshot. With embedding tables and
    /// `checkpoint.full_every` > 1, a delta of the current chain (the rows
    /// changed since its base) while it has fewer than `full_every - 1`
    /// and every ps can tell them, else the base of a new chain, whole;
    /// otherwise whole on its own.
    pub(super) async fn snapshot(
        &self,
        cluster: &Cluster,
        cfg: &Config,
    ) -> Result<Snapshot, PsCallError> {
        let _one = self.taking.lock().await;
        let every = cfg.checkpoint.full_every;
        if every <= 1 || crate::placement::tables(cfg).is_empty() {
            self.chains().current = None;
            return cluster.snapshot().await;
        }
        if let Some((c, base)) = self.next_delta(every, &cfg.checkpoint.dir) {
            match cluster.snapshot_cut(Cut::Delta(c.id)).await {
                // Not a step since the base (rows alone moved, or none):
                // a delta would take the base's name; a new base does.
                Ok(Some(snapshot)) if snapshot.step <= base.step => {}
                Ok(Some(snapshot)) => {
                    self.chains().current = Some(Chain {
                        deltas: c.deltas + 1,
                        ..c
                    });
                    return Ok(snapshot);
                }
                Ok(None) => {
                    info!(chain = %format!("{:016x}", c.id), "A ps cannot tell the rows changed since the chain's base (it restarted, its rows were replaced, or most of them changed): this checkpoint is whole.")
                }
                Err(e) => {
                    warn!(error = %e, "The delta could not be read; this checkpoint is whole.")
                }
            }
        }
        let id = rand::random::<u64>().max(1);
        let snapshot = cluster.snapshot_cut(Cut::Base(id)).await?;
        let snapshot = snapshot.expect("a whole read always answers");
        self.chains().start(id, snapshot.step);
        Ok(snapshot)
    }

    /// Where `snapshot` sits in a chain, as its checkpoint says it
    /// ([`checkpoint::Increment`]); `None` on its own (or a delta of a
    /// chain too old to remember: then it is not written).
    fn increment(&self, snapshot: &mut Snapshot) -> Result<Option<Increment>, ()> {
        let chains = self.chains();
        Ok(match snapshot.cut {
            Cut::Plain => None,
            Cut::Base(id) => Some(Increment {
                chain: id,
                base: None,
                removed: Vec::new(),
            }),
            Cut::Delta(id) => match chains.base(id) {
                Some(b) => Some(Increment {
                    chain: id,
                    base: Some(b.step),
                    removed: std::mem::take(&mut snapshot.removed),
                }),
                None => return Err(()),
            },
        })
    }

    /// Writes a checkpoint off the hot path. A failure is logged at ERROR
    /// and counted (`dtf_checkpoint_failures_total`), and returned: the
    /// periodic saves go on training, the final one fails the run.
    pub(super) async fn save(
        self: &Arc<Self>,
        cfg: &Config,
        snapshot: Snapshot,
    ) -> Result<std::path::PathBuf, checkpoint::CheckpointError> {
        let mut snapshot = snapshot;
        let step = snapshot.step;
        let Ok(increment) = self.increment(&mut snapshot) else {
            let e = std::io::Error::other(
                "a delta of a chain too old to remember; the next checkpoint is whole",
            );
            crate::metrics::global().checkpoint_failed();
            tracing::error!(step, error = %e, "Checkpoint not written; the previous checkpoint stays.");
            return Err(checkpoint::CheckpointError::io(
                &cfg.checkpoint.dir,
                "save",
                e,
            ));
        };
        let kind = match &increment {
            None => "whole",
            Some(Increment { base: None, .. }) => "base",
            Some(_) => "delta",
        };
        let chain = increment.as_ref().map(|i| i.chain);
        let optimizer = cfg.train.optimizer();
        let names = || self.specs.iter().map(|s| s.name.clone());
        let slot_names = optimizer
            .slot_specs(&self.specs)
            .into_iter()
            .map(|s| s.name);
        let ckpt = Checkpoint {
            global_step: step,
            variables: names().zip(snapshot.values).collect(),
            shadows: names().zip(snapshot.shadows).collect(),
            slots: checkpoint::Slots {
                optimizer,
                tensors: slot_names.zip(snapshot.slots).collect(),
            },
            run: snapshot.run,
            shard_steps: snapshot.shard_steps,
            table_optimizers: cfg.own_table_optimizers(),
            increment,
            tables: snapshot.tables,
        };
        let meta = ModelMeta {
            hyperparameters: crate::config::json_value(&cfg.train).ok(),
            ..self.meta.clone()
        };
        let keep = cfg.checkpoint.max_to_keep;
        let at = cfg.checkpoint.dir.clone();
        let started = Instant::now();
        let this = self.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut saver = this.saver.lock().unwrap_or_else(PoisonError::into_inner);
            saver.set_max_to_keep(keep);
            saver.set_model(&meta);
            saver.save(&ckpt)
        })
        .await
        .unwrap_or_else(|e| {
            let e = std::io::Error::other(format!("the saving task failed: {e}"));
            Err(checkpoint::CheckpointError::io(&at, "save", e))
        });
        if let Some(chain) = chain {
            // A failed base or delta: the next checkpoint is whole.
            self.chains().saved(chain, kind == "base", result.is_ok());
        }
        match &result {
            Ok(path) => {
                crate::metrics::global().checkpoint_written(started.elapsed());
                info!(step, path = %path.display(), kind, millis = started.elapsed().as_millis() as u64, "Checkpoint written.");
            }
            Err(e) => {
                crate::metrics::global().checkpoint_failed();
                tracing::error!(step, error = %e, "Checkpoint not written; the previous checkpoint stays.")
            }
        }
        result
    }
}

/// The chief's periodic saver: a task of its own, so saving never stalls steps.
pub(super) struct CheckpointTimer {
    stop: CancellationToken,
    /// Snapshots the step loop took (`checkpoint.save_steps`), to write.
    saves: mpsc::Sender<Snapshot>,
    task: tokio::task::JoinHandle<()>,
}

impl CheckpointTimer {
    pub(super) fn start(
        config: watch::Receiver<Arc<Config>>,
        cluster: Cluster,
        checkpoints: Arc<Checkpoints>,
    ) -> Self {
        let stop = CancellationToken::new();
        let token = stop.clone();
        // Two queued: a save slower than N steps then slows the chief down
        // rather than dropping checkpoints that were asked for by step.
        let (saves, mut queued) = mpsc::channel::<Snapshot>(2);
        let task = tokio::spawn(async move {
            let mut last = Instant::now();
            loop {
                let cfg = config.borrow().clone();
                // None: saving by steps (checkpoint.save_steps), not by time.
                let due = cfg.checkpoint.save_interval().map(|i| last + i);
                let recheck = Instant::now() + Duration::from_secs(1);
                tokio::select! {
                    // Saves asked for by step first, and all of them before
                    // stopping: each was promised by `checkpoint.save_steps`.
                    biased;
                    Some(snapshot) = queued.recv() => {
                        // Logged and counted there; training goes on.
                        let _ = checkpoints.save(&cfg, snapshot).await;
                        last = Instant::now();
                        continue;
                    }
                    _ = token.cancelled() => {
                        queued.close();
                        while let Some(snapshot) = queued.recv().await {
                            let _ = checkpoints.save(&cfg, snapshot).await;
                        }
                        return;
                    }
                    // Re-read the interval at least every second: a reload may shorten it.
                    _ = tokio::time::sleep_until(due.map_or(recheck, |d| d.min(recheck)).into()) => {}
                }
                let Some(due) = due else { continue };
                if Instant::now() < due {
                    continue;
                }
                last = Instant::now();
                match checkpoints.snapshot(&cluster, &cfg).await {
                    Ok(snapshot) => {
                        // Logged and counted there; training goes on.
                        let _ = checkpoints.save(&cfg, snapshot).await;
                    }
                    Err(e) => {
                        warn!(error = %e, "Checkpoint skipped: could not read the variables.")
                    }
                }
            }
        });
        Self { stop, saves, task }
    }

    /// Queues a snapshot for writing; waits while two are queued already.
    pub(super) async fn save(&self, snapshot: Snapshot) {
        let _ = self.saves.send(snapshot).await;
    }

    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}
