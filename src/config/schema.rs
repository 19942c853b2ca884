//! The schema: every section and key of `dtf.toml`, with its default.
//!
//! Types only, and what can be read off them without I/O (a task's address,
//! the effective sync replica counts). Loading is in `load`, checking in
//! `validate`.

use super::origin::Sources;
use super::task::{Role, TaskId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where the daemons look when no `--config` is given.
pub const DEFAULT_PATH: &str = "/etc/dtf/dtf.toml";

/// The default `data.dir`: where Debian's `dataset-fashion-mnist` installs.
pub const DEFAULT_DATA_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Training mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Each push applied at once.
    Async,
    /// SyncReplicasOptimizer: gradients averaged per step.
    Sync,
}

/// `train.optimizer`: which update rule the ps tasks apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// `GradientDescentOptimizer`.
    Sgd,
    /// `MomentumOptimizer` (`train.momentum`, `train.use_nesterov`).
    Momentum,
    /// `AdamOptimizer` (`train.beta1`, `train.beta2`, `train.epsilon`).
    Adam,
    /// `AdagradOptimizer` (`train.initial_accumulator_value`).
    Adagrad,
}

/// How variables are assigned to ps tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// `replica_device_setter`'s default: creation order, round-robin.
    RoundRobin,
    /// Largest variable first onto the ps with the fewest bytes.
    Greedy,
}

/// `model.partitioner`: how a variable splits into parts along its first
/// axis before placement (TensorFlow's partitioners).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partitioner {
    /// Every variable whole: today's placement.
    None,
    /// `fixed_size_partitioner(model.partitions)`.
    Fixed,
    /// `MinSizePartitioner(model.min_shard_bytes, model.max_shards)`.
    MinSize,
}

/// The whole file. Every section has defaults; unknown keys are errors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[cluster]`: task addresses and placement.
    pub cluster: ClusterConfig,
    /// `[train]`: hyperparameters, mode, run length.
    pub train: TrainConfig,
    /// `[model]`: the MLP's layer widths.
    pub model: ModelConfig,
    /// `[data]`: the dataset directory.
    pub data: DataConfig,
    /// `[checkpoint]`: where and how often the chief saves.
    pub checkpoint: CheckpointConfig,
    /// `[eval]`: what the evaluator keeps of the checkpoints it scores.
    pub eval: EvalConfig,
    /// `[ps]`: each ps task's own snapshots of its shard.
    pub ps: PsConfig,
    /// `[security]`: the shared token.
    pub security: SecurityConfig,
    /// `[metrics]`: the Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// `[log]`: the log filter.
    pub log: LogConfig,
    /// Where each value came from, for error messages; not a setting (not
    /// read from or written to TOML, ignored by `==`).
    #[serde(skip)]
    pub sources: Sources,
}

/// `[cluster]`: who is where. Not reloadable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// host:port of each ps task.
    pub ps: Vec<String>,
    /// host:port of each worker task; worker 0 is the chief.
    pub worker: Vec<String>,
    /// Variable placement strategy.
    pub placement: Placement,
    /// ps tasks exit 0 once the chief marks the run complete.
    pub ps_exit_when_complete: bool,
    /// How a task reaches each ps: shared memory on this host, or TCP.
    pub transport: Transport,
    /// Directory of the ps tasks' shared-memory sockets; empty: the default
    /// (`$RUNTIME_DIRECTORY`, else `/run/dtf` when it exists, else
    /// `$XDG_RUNTIME_DIR/dtf`, else `/tmp/dtf-<uid>`).
    pub runtime_dir: String,
    /// How tensors cross a TCP link (shared memory is always exact).
    pub compression: Compression,
}

/// `cluster.transport`: how a task reaches a ps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Shared memory to a ps on this host, gRPC over TCP to the others.
    Auto,
    /// gRPC over TCP to every ps (benchmarks, debugging).
    Tcp,
}

/// `cluster.compression`: how tensors travel over TCP (`transport::compress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// f32, exact.
    None,
    /// bfloat16 both ways, rounded to nearest even.
    Bf16,
    /// One bit per value and a scale per block, with error feedback both ways.
    Onebit,
}

/// `[train]`: hyperparameters and the run's length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// `async` (each push applied at once) or `sync` (averaged per step).
    pub mode: Mode,
    /// Examples per mini-batch, per worker step.
    pub batch_size: usize,
    /// Base learning rate (reloadable).
    pub learning_rate: f32,
    /// `exponential_decay`: the decay per `learning_rate_decay_steps` (reloadable).
    pub learning_rate_decay: f32,
    /// The learning rate's schedule, TensorFlow's: `exponential_decay` (the reference
    /// program's), `piecewise_constant` or `cosine_decay` (reloadable).
    pub lr_schedule: LrSchedule,
    /// `exponential_decay` and `cosine_decay`'s `decay_steps`; 0: one epoch
    /// (`train_examples / batch_size`) for `exponential_decay`, the steps after warmup to
    /// `last_step` for `cosine_decay` (reloadable).
    pub learning_rate_decay_steps: u64,
    /// `exponential_decay`: decay in whole steps of `decay_steps` (reloadable).
    pub staircase: bool,
    /// `piecewise_constant`: the steps where the rate changes, increasing (reloadable).
    pub lr_boundaries: Vec<u64>,
    /// `piecewise_constant`: the rates, one more than `lr_boundaries` (reloadable).
    pub lr_values: Vec<f32>,
    /// `cosine_decay`: the fraction of `learning_rate` it ends at (TF's `alpha`) (reloadable).
    pub cosine_alpha: f32,
    /// Steps of linear warmup up to the schedule's first rate (`1/warmup_steps` of it at
    /// step 0), before any schedule (reloadable).
    pub warmup_steps: u64,
    /// Each worker scales a step's gradients to this global norm when they exceed it
    /// (`tf.clip_by_global_norm`); 0: no clipping.
    pub clip_norm: f32,
    /// L2 weight on the weight matrices (`Σ‖W‖²/2`).
    pub regularization_rate: f32,
    /// Upper bound of the EMA decay of the shadow variables.
    pub moving_average_decay: f32,
    /// Training stops once `global_step` reaches this (reloadable).
    pub last_step: u64,
    /// Sync: gradients averaged per update; default the number of workers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas_to_aggregate: Option<usize>,
    /// Sync: workers taking part (extras are backups); default `replicas_to_aggregate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_num_replicas: Option<usize>,
    /// Seeds init and each worker's shuffling.
    pub seed: u64,
    /// Progress line every this many local steps (reloadable).
    pub log_step_count_steps: u64,
    /// Summaries every this many global steps (reloadable).
    pub save_summaries_steps: u64,
    /// The update rule; its slots live on the ps tasks (not reloadable).
    pub optimizer: OptimizerKind,
    /// Momentum: the accumulator's decay.
    pub momentum: f32,
    /// Momentum: Nesterov's variant.
    pub use_nesterov: bool,
    /// Adam: decay of the first moment.
    pub beta1: f32,
    /// Adam: decay of the second moment.
    pub beta2: f32,
    /// Adam: added to `√v` (TensorFlow's "epsilon hat").
    pub epsilon: f32,
    /// Adagrad: what every accumulator starts at.
    pub initial_accumulator_value: f32,
    /// The workers' GEMMs: `float32`, or `mixed_bfloat16` (bf16 inputs, f32
    /// sums; everything else, the ps and checkpoints stay f32). Keras's
    /// policy names. Not reloadable.
    pub precision: crate::kernel::Precision,
    /// Flush denormals to zero (MXCSR's FTZ and DAZ) in every thread that
    /// computes — worker steps, ps updates, the evaluator — as TensorFlow
    /// does (`kernel::flush_denormals`). Off: IEEE subnormals, at the
    /// cost of microcode assists on Intel cores. Not reloadable: set once
    /// per thread as it starts.
    pub flush_denormals: bool,
}

impl TrainConfig {
    /// The optimizer these keys describe (those of the other optimizers are ignored).
    pub fn optimizer(&self) -> crate::optimizer::Optimizer {
        use crate::optimizer::Optimizer;
        match self.optimizer {
            OptimizerKind::Sgd => Optimizer::Sgd,
            OptimizerKind::Momentum => Optimizer::Momentum {
                momentum: self.momentum,
                use_nesterov: self.use_nesterov,
            },
            OptimizerKind::Adam => Optimizer::Adam {
                beta1: self.beta1,
                beta2: self.beta2,
                epsilon: self.epsilon,
            },
            OptimizerKind::Adagrad => Optimizer::Adagrad {
                initial_accumulator_value: self.initial_accumulator_value,
            },
        }
    }
}

/// `train.lr_schedule`: TensorFlow's learning-rate schedules by their names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrSchedule {
    /// `learning_rate · learning_rate_decay^(step / decay_steps)`, floored with `staircase`.
    ExponentialDecay,
    /// `lr_values[i]` for steps in `(lr_boundaries[i−1], lr_boundaries[i]]`.
    PiecewiseConstant,
    /// From `learning_rate` down a half cosine to `cosine_alpha · learning_rate`.
    CosineDecay,
}

/// `[model]`: the MLP's shape. Not reloadable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Widths, input first, classes last. With `hidden` set, filled in from
    /// the data (its width, its classes) around the hidden widths.
    pub layers: Vec<usize>,
    /// Only the hidden widths (`[500]`); the input width and the class count
    /// come from the data. Exclusive with an explicit `layers`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<usize>>,
    /// `mlp` (dense data) or `wide_deep` (embedding tables on the ps).
    pub kind: ModelKind,
    /// Width of a `wide_deep` embedding row.
    pub embedding_dim: usize,
    /// How each variable splits into parts along its first axis.
    pub partitioner: Partitioner,
    /// `fixed`: the number of parts of every variable.
    pub partitions: usize,
    /// `min_size`: a variable of B bytes splits into `ceil(B / min_shard_bytes)` parts.
    pub min_shard_bytes: usize,
    /// `min_size`: the most parts of one variable; 0: the ps count.
    pub max_shards: usize,
    /// The hidden layers' activation: `relu`, `tanh`, `sigmoid` or `gelu`.
    pub activation: crate::model::Activation,
    /// The probability that training drops a hidden layer's value (`tf.nn.dropout`'s
    /// `rate`); evaluation and prediction drop nothing. 0: no dropout.
    pub dropout: f32,
    /// What the label is: a class (`classification`, softmax cross-entropy) or a real value
    /// (`regression`: one linear output, mean squared error, RMSE and MAE reported).
    pub task: ModelTask,
    /// `[model.tables]`: admission and eviction of embedding rows.
    pub tables: TablesConfig,
}

/// `[model.tables]`: which embedding rows a ps creates and keeps
/// (docs/design.md, "Admission and eviction"). Needs a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TablesConfig {
    /// Pushes of an id (counted on the ps that owns it) before its row is
    /// created and trained; until then it reads as its initial value and
    /// its gradients are dropped. 1: every id at once.
    pub min_count: u32,
    /// Rows not updated for more than this many global steps are dropped
    /// at the ps's snapshots and the chief's checkpoints. 0: never.
    pub steps_to_live: u64,
    /// The most rows of one table one ps holds; past it the least recently
    /// updated rows are dropped. 0: unbounded.
    pub max_rows: u64,
    /// The embedding tables' update rule (wide & deep's deep part). Absent:
    /// `train.optimizer`'s, which must then be `sgd` or `adagrad`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<TableOptimizerKind>,
    /// The wide part's (`wide/weights`), as `DNNLinearCombinedClassifier`'s
    /// `linear_optimizer`. Absent: `model.tables.optimizer`'s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linear_optimizer: Option<TableOptimizerKind>,
    /// The embedding tables' learning rate, following the schedule as
    /// `train.learning_rate` does (a push's rate × this / that). 0: the
    /// model's.
    pub learning_rate: f32,
    /// The wide part's, likewise. 0: `model.tables.learning_rate`'s.
    pub linear_learning_rate: f32,
    /// FTRL: L1 strength (`l1_regularization_strength`).
    pub ftrl_l1: f32,
    /// FTRL: L2 strength (`l2_regularization_strength`).
    pub ftrl_l2: f32,
    /// FTRL: the accumulator's power (`learning_rate_power`, ≤ 0).
    pub ftrl_learning_rate_power: f32,
    /// FTRL: what every accumulator starts at (> 0).
    pub ftrl_initial_accumulator_value: f32,
    /// Whether each row keeps an EMA shadow (`train.moving_average_decay`),
    /// as TensorFlow's `ExponentialMovingAverage` over every trainable
    /// variable does. false: none, a row `dim` floats smaller; the EMA model
    /// reads the tables' values, as TensorFlow's reads a variable outside
    /// the average's `var_list`.
    pub moving_average: bool,
}

/// `model.tables.optimizer`: the rules an embedding table can be updated by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TableOptimizerKind {
    /// `w -= lr·g` on the pushed rows.
    Sgd,
    /// Sparse Adagrad (`train.initial_accumulator_value`).
    Adagrad,
    /// FTRL-Proximal (`model.tables.ftrl_*`).
    Ftrl,
    /// Lazy Adam (`train.beta1`, `train.beta2`, `train.epsilon`).
    LazyAdam,
}

/// What the model predicts (`model.task`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelTask {
    /// A class index (or name) per example: softmax over the classes.
    #[default]
    Classification,
    /// A real value per example (a price): one linear output, mean squared error.
    Regression,
}

impl ModelTask {
    /// The name in `dtf.toml` and in a checkpoint's metadata.
    pub fn name(self) -> &'static str {
        match self {
            ModelTask::Classification => "classification",
            ModelTask::Regression => "regression",
        }
    }
}

/// Which model (`model.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// The dense MLP.
    #[default]
    Mlp,
    /// Wide & deep: the tables `deep/embeddings` and `wide/weights` on the ps.
    WideDeep,
}

/// The format of a data set (`data.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// MNIST-format IDX files in `data.dir`.
    Idx,
    /// One NumPy `.npz` at `data.path`: `x_train`, `y_train`, `x_test`, `y_test`.
    Npz,
    /// CSV files `data.train` and `data.test` with a header and a label column.
    Csv,
    /// RecBole atomic files in `data.dir`: `NAME.inter`, joined with
    /// `NAME.user` and `NAME.item` where present.
    Recbole,
    /// Criteo's TSV layout at `data.path`: label, I1–I13, C1–C26.
    Criteo,
}

/// `[data]`: where the data set is, in which format, and how it is preprocessed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `idx` (`dir`), `npz` (`path`) or `csv` (`train`, `test`, `label`).
    pub format: DataFormat,
    /// Directory of `train-images-idx3-ubyte[.gz]` and the other IDX files.
    pub dir: PathBuf,
    /// The `.npz` file (format `npz`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The training CSV file (format `csv`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train: Option<PathBuf>,
    /// The test CSV file (format `csv`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test: Option<PathBuf>,
    /// The column holding the label (formats `csv`, `recbole`).
    pub label: String,
    /// Standardize features with the training split's mean and std (data
    /// with categorical features always is).
    pub standardize: bool,
    /// A binary label from a numeric column: 1 when the value is at least
    /// this, else 0 (RecBole's ratings: 4.0). Unset: the column holds class
    /// indices. DESIGN.md wrote `0.0` as the default; an unset key is kept
    /// apart from 0.0 so that class labels 0–255 stay class labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    /// CSV columns that are categorical although every value is a number
    /// (zip codes, numeric ids); a column with any other value always is.
    pub categorical: Vec<String>,
    /// The test split's share of a data set that ships no test file
    /// (RecBole's `NAME.inter`, Criteo's file): a seeded random split.
    pub test_fraction: f64,
    /// The CSV files' delimiter: `auto` (the header line's comma, tab or
    /// semicolon, whichever it holds most of) or one ASCII character (`|`).
    pub delimiter: String,
}

/// `data.delimiter`'s default.
pub const AUTO_DELIMITER: &str = "auto";

impl DataConfig {
    /// The CSV delimiter `data.delimiter` names: `None` for `auto` (told from
    /// the header line), else its one byte; `None` too for a value that
    /// validation refuses (`Config::validate` names it first).
    pub fn delimiter_byte(&self) -> Option<u8> {
        match self.delimiter.as_bytes() {
            [b] if self.delimiter != AUTO_DELIMITER => Some(*b),
            _ => None,
        }
    }
}

/// `[checkpoint]`: the chief's checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Directory of `model.ckpt-<step>.safetensors` and the `checkpoint.dtf` index.
    pub dir: PathBuf,
    /// Seconds between saves (reloadable). Unset (`None`) means
    /// [`DEFAULT_SAVE_SECS`] when `save_steps` is 0 and no timed saves when
    /// it is not: setting both is an error, as in TensorFlow's `RunConfig`,
    /// and a default of 60 that could not be left out would make every
    /// `save_steps` an error. See [`CheckpointConfig::save_interval`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub save_secs: Option<u64>,
    /// Save every this many global steps instead (TensorFlow's
    /// `save_checkpoint_steps`); 0: off, save by time (reloadable).
    pub save_steps: u64,
    /// Newest checkpoints kept (reloadable).
    pub max_to_keep: usize,
    /// With embedding tables: every this many periodic checkpoints one
    /// holds every row, and those between only the rows changed since it
    /// (`checkpoint::Increment`, "Incremental checkpoints"); 1: every
    /// checkpoint whole (reloadable). Dense variables are whole in every one.
    pub full_every: u32,
}

/// The most `checkpoint.full_every` may be: each delta holds every row
/// changed since its chain's whole checkpoint, so a long chain's deltas
/// approach the whole's size anyway.
pub const MAX_CHECKPOINT_FULL_EVERY: u32 = 1000;

/// `[ps]`: each ps task's snapshots of its shard (`ps::snapshot`), its
/// fast recovery after a crash. Not reloadable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PsConfig {
    /// Seconds between snapshots of each shard; 0: off (a restarted ps is
    /// re-seeded from the newest checkpoint).
    pub snapshot_secs: u64,
    /// Directory under which ps task N keeps `ps-N/`; empty: the default
    /// (`$STATE_DIRECTORY`, the units' `/var/lib/dtf`, else
    /// `$XDG_STATE_HOME/dtf`, else `~/.local/state/dtf`).
    pub snapshot_dir: String,
    /// With embedding tables: every this many snapshots one holds every
    /// row, and those between hold only the rows changed since the one
    /// before (`ps::snapshot`, "Incremental snapshots"); 1: every snapshot
    /// whole. Dense variables are whole in every snapshot.
    pub snapshot_full_every: u32,
    /// Deltas start once a whole snapshot of the shard is this many bytes;
    /// below, every snapshot is whole (it costs little, and the ring
    /// neighbour, which keeps whole snapshots, then has every one).
    pub snapshot_delta_min_bytes: u64,
}

impl Default for PsConfig {
    fn default() -> Self {
        Self {
            snapshot_secs: 1,
            snapshot_dir: String::new(),
            snapshot_full_every: DEFAULT_SNAPSHOT_FULL_EVERY,
            snapshot_delta_min_bytes: DEFAULT_SNAPSHOT_DELTA_MIN_BYTES,
        }
    }
}

/// `ps.snapshot_delta_min_bytes` when it is not set: 64 MiB, a whole
/// snapshot of about half a second here (docs/benchmarks.md).
pub const DEFAULT_SNAPSHOT_DELTA_MIN_BYTES: u64 = 64 << 20;

/// `ps.snapshot_full_every` when it is not set.
pub const DEFAULT_SNAPSHOT_FULL_EVERY: u32 = 20;

/// The most `ps.snapshot_full_every` may be: a restore reads at most this
/// many deltas after the full snapshot.
pub const MAX_SNAPSHOT_FULL_EVERY: u32 = 1000;

/// `checkpoint.save_secs` when neither it nor `checkpoint.save_steps` is set.
pub const DEFAULT_SAVE_SECS: u64 = 60;

/// `[eval]`: the evaluator's best checkpoints. Not reloadable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// How many of the best checkpoints `checkpoint.dir/best/` keeps.
    pub keep_best: usize,
    /// What "best" means. Left unset, `model.kind`'s default: `ema_accuracy`
    /// for the MLP, `ema_auc` for wide & deep, `ema_rmse` for `model.task = "regression"`
    /// (`Config::kind_defaults`).
    pub metric: Metric,
}

/// The score that ranks checkpoints in `checkpoint.dir/best/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Test accuracy of the EMA shadows; higher is better.
    EmaAccuracy,
    /// Test accuracy of the raw variables; higher is better.
    Accuracy,
    /// Test cross-entropy of the raw variables (a binary model's: its log
    /// loss); lower is better.
    Loss,
    /// Test AUC of the raw variables (wide & deep only); higher is better.
    Auc,
    /// Test AUC of the EMA shadows (wide & deep only); higher is better.
    EmaAuc,
    /// Test root-mean-square error of the raw variables (`model.task = "regression"`
    /// only); lower is better.
    Rmse,
    /// Test root-mean-square error of the EMA shadows (regression only); lower is better.
    EmaRmse,
}

impl Metric {
    /// The name in `dtf.toml` and in the TensorBoard tags.
    pub fn name(self) -> &'static str {
        match self {
            Metric::EmaAccuracy => "ema_accuracy",
            Metric::Accuracy => "accuracy",
            Metric::Loss => "loss",
            Metric::Auc => "auc",
            Metric::EmaAuc => "ema_auc",
            Metric::Rmse => "rmse",
            Metric::EmaRmse => "ema_rmse",
        }
    }

    /// Whether only a regression model has this score (a classifier's RMSE is NaN).
    pub fn regression_only(self) -> bool {
        matches!(self, Metric::Rmse | Metric::EmaRmse)
    }

    /// Whether only a binary model (wide & deep) has this score: the MLP's
    /// AUC is NaN, and nothing would ever rank.
    pub fn binary_only(self) -> bool {
        matches!(self, Metric::Auc | Metric::EmaAuc)
    }

    /// Whether score `a` is better than `b` (NaN is never better).
    pub fn better(self, a: f32, b: f32) -> bool {
        match self {
            Metric::Loss | Metric::Rmse | Metric::EmaRmse => a < b,
            _ => a > b,
        }
    }
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            keep_best: 3,
            metric: Metric::EmaAccuracy,
        }
    }
}

impl CheckpointConfig {
    /// How often the chief saves by time: `None` when it saves by steps
    /// (`save_steps` > 0), else `save_secs` or [`DEFAULT_SAVE_SECS`].
    pub fn save_interval(&self) -> Option<std::time::Duration> {
        if self.save_steps > 0 {
            return None;
        }
        Some(std::time::Duration::from_secs(
            self.save_secs.unwrap_or(DEFAULT_SAVE_SECS),
        ))
    }
}

/// `[security]`: authentication, and optional mutual TLS.
///
/// TLS is on when all three `tls_*` paths are set, off when none is; every
/// task then presents `tls_cert` and accepts only peers whose certificate
/// `tls_ca` signed. The paths are the same on every host, their contents each
/// host's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityConfig {
    /// File holding the cluster's shared bearer token.
    pub token_file: PathBuf,
    /// PEM certificate chain of this host (its names: the hosts in `cluster.*`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`, readable by owner and group only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate(s) of the authority that signed every task's certificate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
}

/// `[metrics]`: Prometheus endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// host:port to serve /metrics on; empty: off.
    pub listen: String,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter: `info`, `debug`, `dtf=debug,info` (reloadable).
    pub level: String,
}
/// As the config spells it: `async`, `sync`.
impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Async => "async",
            Mode::Sync => "sync",
        })
    }
}

impl Config {
    /// The configuration as a TOML document that [`Config::from_toml_str`]
    /// reads back to an equal `Config`; unset options are omitted.
    pub fn to_toml(&self) -> String {
        // Every section is a table of scalars and arrays of scalars, which
        // TOML can always represent.
        toml::to_string(self).expect("a Config is always representable as TOML")
    }

    /// `host:port` of a task.
    pub fn address(&self, task: TaskId) -> Option<&str> {
        self.addresses(task.role)
            .1
            .get(task.index)
            .map(String::as_str)
    }

    /// A role's key (`cluster.ps`, `cluster.worker`) and address list; the
    /// evaluator has none (it serves nothing but its metrics).
    pub(super) fn addresses(&self, role: Role) -> (&'static str, &[String]) {
        match role {
            Role::Ps => ("cluster.ps", &self.cluster.ps),
            Role::Worker => ("cluster.worker", &self.cluster.worker),
            Role::Evaluator => ("evaluator", &[]),
        }
    }

    /// The update rule of embedding table `table` (`[model.tables]
    /// optimizer`, `linear_optimizer` for the wide part), or `None` when
    /// none is set and `train.optimizer` has no sparse form (validation
    /// refuses that for a model with tables).
    pub fn table_optimizer(&self, table: &str) -> Option<crate::optimizer::TableOptimizer> {
        use crate::optimizer::TableOptimizer;
        let (t, train) = (&self.model.tables, &self.train);
        let kind = match table {
            crate::model::table::WIDE => t.linear_optimizer.or(t.optimizer),
            _ => t.optimizer,
        };
        Some(match kind {
            None => return TableOptimizer::from_dense(train.optimizer()),
            Some(TableOptimizerKind::Sgd) => TableOptimizer::Sgd,
            Some(TableOptimizerKind::Adagrad) => TableOptimizer::Adagrad {
                initial_accumulator_value: train.initial_accumulator_value,
            },
            Some(TableOptimizerKind::Ftrl) => TableOptimizer::Ftrl {
                learning_rate_power: t.ftrl_learning_rate_power,
                initial_accumulator_value: t.ftrl_initial_accumulator_value,
                l1: t.ftrl_l1,
                l2: t.ftrl_l2,
            },
            Some(TableOptimizerKind::LazyAdam) => TableOptimizer::LazyAdam {
                beta1: train.beta1,
                beta2: train.beta2,
                epsilon: train.epsilon,
            },
        })
    }

    /// Each table's rule when the tables have rules of their own
    /// (`[model.tables] optimizer` or `linear_optimizer` set): what
    /// checkpoints record and snapshot identities name; empty when they
    /// follow `train.optimizer` (files as they were before such rules).
    pub fn own_table_optimizers(&self) -> Vec<(String, crate::optimizer::TableOptimizer)> {
        let t = &self.model.tables;
        if t.optimizer.is_none() && t.linear_optimizer.is_none() {
            return Vec::new();
        }
        crate::placement::tables(self)
            .into_iter()
            .filter_map(|spec| Some((spec.name.clone(), self.table_optimizer(&spec.name)?)))
            .collect()
    }

    /// What a push's learning rate is multiplied by for table `table`:
    /// its own rate (`[model.tables] learning_rate`, `linear_learning_rate`
    /// for the wide part) over `train.learning_rate`, so that the schedule
    /// shapes both alike; 1 when it has none.
    pub fn table_learning_rate_scale(&self, table: &str) -> f32 {
        let t = &self.model.tables;
        let own = match table {
            crate::model::table::WIDE if t.linear_learning_rate > 0.0 => t.linear_learning_rate,
            _ => t.learning_rate,
        };
        match own > 0.0 && self.train.learning_rate > 0.0 {
            true => own / self.train.learning_rate,
            false => 1.0,
        }
    }

    /// Sync: gradients per update (default: the number of workers).
    pub fn replicas_to_aggregate(&self) -> usize {
        self.train
            .replicas_to_aggregate
            .unwrap_or(self.cluster.worker.len())
    }

    /// Sync: workers taking part (default: `replicas_to_aggregate`).
    pub fn total_num_replicas(&self) -> usize {
        self.train
            .total_num_replicas
            .unwrap_or_else(|| self.replicas_to_aggregate())
    }

    /// `security.tls_cert`, `tls_key` and `tls_ca` with their keys.
    pub fn tls_paths(&self) -> [(&'static str, Option<&Path>); 3] {
        let sec = &self.security;
        [
            ("security.tls_cert", sec.tls_cert.as_deref()),
            ("security.tls_key", sec.tls_key.as_deref()),
            ("security.tls_ca", sec.tls_ca.as_deref()),
        ]
    }
}

/// Every `section.key` of a config with its value.
pub(super) fn leaves(config: &Config) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    // A Config is plain data: serializing it to JSON cannot fail, and an
    // error would only leave the map empty. Through text, not `to_value`:
    // that widens an f32 to f64 (`0.01` would read `0.009999999776482582`).
    if let Ok(serde_json::Value::Object(sections)) = json_value(config) {
        for (section, table) in sections {
            match table {
                table @ serde_json::Value::Object(_) => flatten(&mut out, section, table),
                other => {
                    out.insert(section, other);
                }
            }
        }
    }
    out
}

/// The leaves of `value` under `prefix`: a sub-table (`[model.tables]`)
/// gives dotted keys (`model.tables.max_rows`).
fn flatten(
    out: &mut BTreeMap<String, serde_json::Value>,
    prefix: String,
    value: serde_json::Value,
) {
    match value {
        serde_json::Value::Object(fields) => {
            for (field, value) in fields {
                flatten(out, format!("{prefix}.{field}"), value);
            }
        }
        other => {
            out.insert(prefix, other);
        }
    }
}

/// `value` as a JSON value whose numbers print as they were written: an
/// `f32` as the shortest decimal that reads back to it (`0.01`, `0.9`), not
/// as the f64 it widens to (`0.009999999776482582`), which is what
/// `serde_json::to_value` would keep.
///
/// Errors: as `serde_json::to_string` (never for plain data).
pub fn json_value<T: Serialize>(value: &T) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::from_str(&serde_json::to_string(value)?)
}

mod defaults;
#[cfg(test)]
mod tests;
