//! The cluster configuration: `/etc/dtf/dtf.toml`, layered with figment
//! (built-in defaults → file → `DTF_…` environment → command line), plus
//! `TF_CONFIG`. Validation, and what may change on reload.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where the daemons look when no `--config` is given.
pub const DEFAULT_PATH: &str = "/etc/dtf/dtf.toml";

/// A task's role in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Parameter server: holds a shard of the variables.
    Ps,
    /// Worker: computes gradients; worker 0 is the chief.
    Worker,
}

/// One task of the cluster, e.g. `worker:1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskId {
    /// ps or worker.
    pub role: Role,
    /// Index into the role's address list.
    pub index: usize,
}

/// Training mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Each push applied at once.
    Async,
    /// SyncReplicasOptimizer: gradients averaged per step.
    Sync,
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

/// The whole file. Every section has defaults; unknown keys are errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub cluster: ClusterConfig,
    pub train: TrainConfig,
    pub model: ModelConfig,
    pub data: DataConfig,
    pub checkpoint: CheckpointConfig,
    pub security: SecurityConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
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
}

/// `[train]`: hyperparameters and the run's length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub mode: Mode,
    pub batch_size: usize,
    pub learning_rate: f32,
    pub learning_rate_decay: f32,
    pub regularization_rate: f32,
    pub moving_average_decay: f32,
    /// Training stops once `global_step` reaches this (reloadable).
    pub last_step: u64,
    /// Sync: gradients averaged per update; default the number of workers.
    pub replicas_to_aggregate: Option<usize>,
    /// Sync: workers taking part (extras are backups); default `replicas_to_aggregate`.
    pub total_num_replicas: Option<usize>,
    /// Seeds init and each worker's shuffling.
    pub seed: u64,
    /// Progress line every this many local steps.
    pub log_step_count_steps: u64,
    /// Summaries every this many global steps.
    pub save_summaries_steps: u64,
}

/// `[model]`: the MLP's shape. Not reloadable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Widths, input first, classes last.
    pub layers: Vec<usize>,
}

/// `[data]`: where the IDX files are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    pub dir: PathBuf,
}

/// `[checkpoint]`: the chief's checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    pub dir: PathBuf,
    /// Seconds between saves (reloadable).
    pub save_secs: u64,
    /// Newest checkpoints kept (reloadable).
    pub max_to_keep: usize,
}

/// `[security]`: authentication (and optional TLS).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityConfig {
    /// File holding the cluster's shared bearer token.
    pub token_file: PathBuf,
}

/// `[metrics]`: Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// host:port to serve /metrics on; empty: off.
    pub listen: String,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A tracing filter: `info`, `debug`, `dtf=debug,info`.
    pub level: String,
}

/// A configuration problem: exits 78 (EX_CONFIG).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Invalid(String),
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster: ClusterConfig::default(),
            train: TrainConfig::default(),
            model: ModelConfig::default(),
            data: DataConfig::default(),
            checkpoint: CheckpointConfig::default(),
            security: SecurityConfig::default(),
            metrics: MetricsConfig::default(),
            log: LogConfig::default(),
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            ps: vec!["127.0.0.1:2222".into()],
            worker: vec!["127.0.0.1:2223".into()],
            placement: Placement::RoundRobin,
            ps_exit_when_complete: true,
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Async,
            batch_size: 100,
            learning_rate: 0.01,
            learning_rate_decay: 0.99,
            regularization_rate: 0.0001,
            moving_average_decay: 0.99,
            last_step: 20000,
            replicas_to_aggregate: None,
            total_num_replicas: None,
            seed: 0,
            log_step_count_steps: 100,
            save_summaries_steps: 100,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self { layers: vec![784, 500, 10] }
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        Self { dir: "/usr/share/datasets/fashion-mnist".into() }
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self { dir: "/var/lib/dtf/checkpoints".into(), save_secs: 60, max_to_keep: 5 }
    }
}

impl Default for SecurityConfig {
    fn default() -> Self {
        Self { token_file: "/etc/dtf/token".into() }
    }
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self { listen: String::new() }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { level: "info".into() }
    }
}

impl Config {
    /// Defaults → `path` → `DTF_<SECTION>__<KEY>` environment → `TF_CONFIG`'s
    /// cluster, then [`Config::validate`].
    ///
    /// Errors: [`ConfigError`] naming the key, the file and what was expected.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        todo!()
    }

    /// Parses a TOML document over the defaults (no environment), then validates.
    /// `origin` names the source in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        todo!()
    }

    /// Checks values and cross-key rules (ranges, duplicate addresses, sync replica counts).
    pub fn validate(&self) -> Result<(), ConfigError> {
        todo!()
    }

    /// Errors unless `task` indexes an address of its role.
    pub fn check_task(&self, task: TaskId) -> Result<(), ConfigError> {
        todo!()
    }

    /// `host:port` of a task.
    pub fn address(&self, task: TaskId) -> Option<&str> {
        match task.role {
            Role::Ps => self.cluster.ps.get(task.index),
            Role::Worker => self.cluster.worker.get(task.index),
        }
        .map(String::as_str)
    }

    /// Sync: gradients per update (default: the number of workers).
    pub fn replicas_to_aggregate(&self) -> usize {
        self.train.replicas_to_aggregate.unwrap_or(self.cluster.worker.len())
    }

    /// Sync: workers taking part (default: `replicas_to_aggregate`).
    pub fn total_num_replicas(&self) -> usize {
        self.train.total_num_replicas.unwrap_or_else(|| self.replicas_to_aggregate())
    }

    /// Reads the bearer token, refusing a file others may read.
    pub fn read_token(&self) -> Result<String, ConfigError> {
        todo!()
    }

    /// Validates `new` as a reload of `self`: an error names the first key that
    /// cannot change live (cluster, model, mode, ...); otherwise returns `new`.
    pub fn reload(&self, new: Config) -> Result<Config, ConfigError> {
        todo!()
    }

    /// The config as TOML.
    pub fn to_toml(&self) -> String {
        todo!()
    }

    /// Dotted keys whose values differ.
    pub fn changed_keys(&self, other: &Config) -> Vec<String> {
        todo!()
    }
}

/// The task named by `TF_CONFIG` (`{"task": {"type": "worker", "index": 1}}`), if set.
pub fn task_from_env() -> Result<Option<TaskId>, ConfigError> {
    todo!()
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        todo!()
    }
}
