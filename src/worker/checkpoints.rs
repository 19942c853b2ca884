//! The chief's checkpoints: how one is written ([`Checkpoints`]) and when
//! ([`CheckpointTimer`], every `checkpoint.save_secs`, off the step loop).

use crate::checkpoint::{self, Checkpoint, ModelMeta, Saver};
use crate::config::{Config, DataFormat};
use crate::data::Preprocessing;
use crate::model::{Model, VarSpec};
use crate::transport::{Cluster, Snapshot};
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
        }
    }

    /// Writes a checkpoint off the hot path. A failure is logged at ERROR
    /// and counted (`dtf_checkpoint_failures_total`), and returned: the
    /// periodic saves go on training, the final one fails the run.
    pub(super) async fn save(
        self: &Arc<Self>,
        cfg: &Config,
        snapshot: Snapshot,
    ) -> Result<std::path::PathBuf, checkpoint::CheckpointError> {
        let step = snapshot.step;
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
            increment: None,
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
                info!(step, path = %path.display(), millis = started.elapsed().as_millis() as u64, "Checkpoint written.");
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
                match cluster.snapshot().await {
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
