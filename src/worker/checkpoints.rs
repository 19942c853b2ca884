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
    /// The chain of incremental checkpoints the periodic saves extend;
    /// `None`: the next one is whole, a new chain's base.
    chain: Mutex<Option<Chain>>,
}

/// A chain of incremental checkpoints: its base, whole, then deltas of the
/// rows changed since it (docs/design.md, "Incremental checkpoints").
#[derive(Debug, Clone, Copy)]
struct Chain {
    /// Its id, random: the ps tasks count each table's changes for it.
    id: u64,
    /// The base's global step.
    base: u64,
    /// Deltas taken since the base.
    deltas: u32,
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
            chain: Mutex::default(),
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
        let every = cfg.checkpoint.full_every;
        if every <= 1 || crate::placement::tables(cfg).is_empty() {
            return cluster.snapshot().await;
        }
        let chain = *self.chain.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = chain.filter(|c| c.deltas + 1 < every) {
            match cluster.snapshot_cut(Cut::Delta(c.id)).await {
                // Not a step since the base (rows alone moved, or none):
                // a delta would take the base's name; a new base does.
                Ok(Some(snapshot)) if snapshot.step <= c.base => {}
                Ok(Some(snapshot)) => {
                    self.set_chain(Some(Chain {
                        deltas: c.deltas + 1,
                        ..c
                    }));
                    return Ok(snapshot);
                }
                Ok(None) => {
                    info!(chain = %format!("{:016x}", c.id), "A ps cannot tell the rows changed since the chain's base (it restarted, or its rows were replaced): this checkpoint is whole.")
                }
                Err(e) => {
                    warn!(error = %e, "The delta could not be read; this checkpoint is whole.")
                }
            }
        }
        let id = rand::random::<u64>().max(1);
        let snapshot = cluster.snapshot_cut(Cut::Base(id)).await?;
        let snapshot = snapshot.expect("a whole read always answers");
        self.set_chain(Some(Chain {
            id,
            base: snapshot.step,
            deltas: 0,
        }));
        Ok(snapshot)
    }

    fn set_chain(&self, chain: Option<Chain>) {
        *self.chain.lock().unwrap_or_else(PoisonError::into_inner) = chain;
    }

    /// Where `snapshot` sits in a chain, as its checkpoint says it
    /// ([`checkpoint::Increment`]); `None` on its own (or a delta whose
    /// chain was given up since: then it is not written).
    fn increment(&self, snapshot: &mut Snapshot) -> Result<Option<Increment>, ()> {
        let chain = *self.chain.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(match snapshot.cut {
            Cut::Plain => None,
            Cut::Base(id) => Some(Increment {
                chain: id,
                base: None,
                removed: Vec::new(),
            }),
            Cut::Delta(id) => match chain.filter(|c| c.id == id) {
                Some(c) => Some(Increment {
                    chain: id,
                    base: Some(c.base),
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
                "a delta of a chain given up since (its base was not written); the next checkpoint is whole",
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
        match &result {
            Ok(path) => {
                crate::metrics::global().checkpoint_written(started.elapsed());
                info!(step, path = %path.display(), kind, millis = started.elapsed().as_millis() as u64, "Checkpoint written.");
            }
            Err(e) => {
                // A chain whose base or delta failed: the next checkpoint
                // is whole (the ps tasks may hold no base for its deltas).
                if chain.is_some() {
                    let mut held = self.chain.lock().unwrap_or_else(PoisonError::into_inner);
                    if held.is_some_and(|c| Some(c.id) == chain) {
                        *held = None;
                    }
                }
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
