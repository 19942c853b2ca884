//! The cluster configuration: `/etc/dtf/dtf.toml`, layered with figment
//! (built-in defaults → file → `DTF_…` environment → command line), plus
//! `TF_CONFIG`. Validation, and what may change on reload.

use figment::error::{Actual, Kind};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where the daemons look when no `--config` is given.
pub const DEFAULT_PATH: &str = "/etc/dtf/dtf.toml";

/// The default `data.dir`: where Debian's `dataset-fashion-mnist` installs.
pub const DEFAULT_DATA_DIR: &str = "/usr/share/datasets/fashion-mnist";

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
    /// Decay per epoch (`decay_steps = train_examples / batch_size`) (reloadable).
    pub learning_rate_decay: f32,
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
    /// Directory of `train-images-idx3-ubyte[.gz]` and the other IDX files.
    pub dir: PathBuf,
}

/// `[checkpoint]`: the chief's checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Directory of `model.ckpt-<step>.safetensors` and the `checkpoint` index.
    pub dir: PathBuf,
    /// Seconds between saves (reloadable).
    pub save_secs: u64,
    /// Newest checkpoints kept (reloadable).
    pub max_to_keep: usize,
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

/// A configuration problem: exits 78 (EX_CONFIG).
///
/// Every variant says where the problem is (file, environment variable or
/// `TF_CONFIG`), which key, and what would be right, e.g.
/// `/etc/dtf/dtf.toml: train.batch_size: invalid value 0: expected a positive integer`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A key is unknown, has the wrong type, or its value is out of range.
    #[error("{origin}: {key}: {problem}")]
    Key {
        /// Where the value came from: a file, `environment variable DTF_…`, `TF_CONFIG`.
        origin: String,
        /// The dotted key, e.g. `train.batch_size` or `model.layers[1]`.
        key: String,
        /// What is wrong and what was expected.
        problem: String,
    },
    /// The configuration file could not be read (missing, permissions).
    #[error("{}: cannot read the configuration file: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A document is not valid TOML (or `TF_CONFIG` not valid JSON).
    #[error("{origin}: {message}")]
    Syntax {
        /// The file, or `TF_CONFIG`.
        origin: String,
        /// The parser's message, with line and column where known.
        message: String,
    },
    /// A task index outside the cluster.
    #[error("task {task}: the cluster has {count} {} tasks ({key} in {origin})", task.role)]
    Task {
        /// The task asked for.
        task: TaskId,
        /// How many tasks of its role the cluster has.
        count: usize,
        /// `cluster.ps` or `cluster.worker`.
        key: String,
        /// Where that list came from.
        origin: String,
    },
    /// A reload changes keys that cannot change while running.
    #[error(
        "{} cannot change while running (restart the cluster to change {})",
        keys.join(", "),
        if keys.len() == 1 { "it" } else { "them" }
    )]
    NotReloadable {
        /// The dotted keys that differ, e.g. `cluster.ps`.
        keys: Vec<String>,
    },
    /// A file the configuration names is unusable (missing, readable by
    /// others, empty, not PEM).
    #[error("{} ({key}): {problem}", path.display())]
    File {
        /// The key that names it, e.g. `security.token_file`.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        problem: String,
    },
    /// Anything else, already phrased with its context.
    #[error("{0}")]
    Invalid(String),
}

/// Where each value of a [`Config`] came from, so that errors found after
/// loading (validation, [`Config::check_task`]) can name the file or the
/// environment variable.
///
/// Provenance is not part of a configuration's value: two `Sources` always
/// compare equal, so `Config`'s `==` compares settings only.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// Origin of keys not in `keys` (the file; empty: `configuration`).
    fallback: String,
    /// Dotted key (`train.batch_size`) → origin (`/etc/dtf/dtf.toml`, …).
    keys: BTreeMap<String, String>,
}

impl PartialEq for Sources {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Sources {
    /// Where `key` (dotted, e.g. `cluster.worker` or `cluster.worker[1]`) came from.
    pub fn origin(&self, key: &str) -> &str {
        let key = key.split('[').next().unwrap_or(key);
        match self.keys.get(key) {
            Some(origin) => origin,
            None if self.fallback.is_empty() => "configuration",
            None => &self.fallback,
        }
    }
}

/// The keys [`Config::reload`] applies to a running task; every other key
/// needs a restart of the cluster.
pub const RELOADABLE: &[&str] = &[
    "log.level",
    "checkpoint.save_secs",
    "checkpoint.max_to_keep",
    "train.last_step",
    "train.learning_rate",
    "train.learning_rate_decay",
    "train.log_step_count_steps",
    "train.save_summaries_steps",
    "metrics.listen",
];

/// The environment variable holding the Kubeflow/TensorFlow cluster and task.
pub const TF_CONFIG: &str = "TF_CONFIG";

/// Prefix of the environment variables that override the file:
/// `DTF_<SECTION>__<KEY>`, e.g. `DTF_TRAIN__LAST_STEP=100`.
pub const ENV_PREFIX: &str = "DTF_";

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Ps => "ps",
            Role::Worker => "worker",
        })
    }
}

impl fmt::Display for TaskId {
    /// `ps:0`, `worker:1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.role, self.index)
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
        Self {
            layers: vec![784, 500, 10],
        }
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            dir: DEFAULT_DATA_DIR.into(),
        }
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            dir: "/var/lib/dtf/checkpoints".into(),
            save_secs: 60,
            max_to_keep: 5,
        }
    }
}

impl Default for SecurityConfig {
    fn default() -> Self {
        Self {
            token_file: "/etc/dtf/token".into(),
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
        }
    }
}

impl Config {
    /// Defaults → `path` → `DTF_<SECTION>__<KEY>` environment → `TF_CONFIG`'s
    /// cluster, then [`Config::validate`].
    ///
    /// Only variables of the form `DTF_<SECTION>__<KEY>` are configuration;
    /// other `DTF_…` variables (say `DTF_CONFIG` for the command line) are
    /// left to their users. Values are parsed (`100` is an integer,
    /// `[1, 2]` an array).
    ///
    /// Errors: [`ConfigError`] naming the key, the file (or environment
    /// variable, or `TF_CONFIG`) and what was expected; [`ConfigError::Read`]
    /// if the file cannot be read, [`ConfigError::Syntax`] if it is not TOML.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        // Read the file ourselves rather than with `Toml::file`: that one
        // treats a missing file as empty and searches parent directories for
        // a relative path, neither of which a daemon should do.
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let origin = path.display().to_string();
        let tf_cluster = match std::env::var(TF_CONFIG) {
            Ok(json) => parse_tf_config(&json)?.cluster,
            Err(_) => None,
        };
        let figment = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(&text))
            .merge(
                Env::prefixed(ENV_PREFIX)
                    .filter(|key| key.as_str().contains("__"))
                    .split("__"),
            )
            .merge(TfConfigCluster(tf_cluster));
        extract(&figment, &origin)
    }

    /// Parses a TOML document over the defaults (no environment), then validates.
    /// `origin` names the source in errors.
    ///
    /// Errors: as [`Config::load`].
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let figment =
            Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(text));
        extract(&figment, origin)
    }

    /// The configuration as a TOML document that [`Config::from_toml_str`]
    /// reads back to an equal `Config`; unset options are omitted.
    pub fn to_toml(&self) -> String {
        // Every section is a table of scalars and arrays of scalars, which
        // TOML can always represent.
        toml::to_string(self).expect("a Config is always representable as TOML")
    }

    /// Checks values and cross-key rules (ranges, duplicate addresses, sync replica counts).
    ///
    /// Errors: [`ConfigError::Key`] for the first bad key, naming where it came from.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, problem: String| {
            Err(ConfigError::Key {
                origin: self.sources.origin(key).to_owned(),
                key: key.to_owned(),
                problem,
            })
        };
        let t = &self.train;

        // [cluster]
        let lists = [Role::Ps, Role::Worker].map(|role| self.addresses(role));
        for (key, list) in lists {
            if list.is_empty() {
                return bad(
                    key,
                    "is empty: expected at least one host:port address".into(),
                );
            }
            for (i, address) in list.iter().enumerate() {
                if let Err(why) = check_address(address) {
                    return bad(
                        &format!("{key}[{i}]"),
                        format!("invalid address {address:?}: {why}"),
                    );
                }
            }
        }
        // Every task needs its own address; `seen` maps each to its first entry.
        let entries = lists
            .iter()
            .flat_map(|&(key, list)| list.iter().enumerate().map(move |(i, a)| (key, i, a)));
        let mut seen = BTreeMap::new();
        for (key, i, address) in entries {
            if let Some((first_key, first)) = seen.insert(address, (key, i)) {
                return bad(
                    &format!("{key}[{i}]"),
                    format!(
                        "duplicate address {address:?} (also {first_key}[{first}]): \
                         expected every task to have its own host:port"
                    ),
                );
            }
        }

        // [train]
        if t.batch_size < 1 {
            return bad(
                "train.batch_size",
                invalid(t.batch_size, "a positive integer"),
            );
        }
        if !(t.learning_rate.is_finite() && t.learning_rate > 0.0) {
            return bad(
                "train.learning_rate",
                invalid(t.learning_rate, "a finite number > 0"),
            );
        }
        if !(t.learning_rate_decay > 0.0 && t.learning_rate_decay <= 1.0) {
            return bad(
                "train.learning_rate_decay",
                invalid(t.learning_rate_decay, "a number in (0, 1]"),
            );
        }
        if !(t.regularization_rate.is_finite() && t.regularization_rate >= 0.0) {
            return bad(
                "train.regularization_rate",
                invalid(t.regularization_rate, "a finite number >= 0"),
            );
        }
        if !(t.moving_average_decay >= 0.0 && t.moving_average_decay < 1.0) {
            return bad(
                "train.moving_average_decay",
                invalid(t.moving_average_decay, "a number in [0, 1)"),
            );
        }
        if t.last_step < 1 {
            return bad(
                "train.last_step",
                invalid(t.last_step, "a positive integer"),
            );
        }
        let workers = self.cluster.worker.len();
        let replicas = self.replicas_to_aggregate();
        if !(1..=workers).contains(&replicas) {
            return bad(
                "train.replicas_to_aggregate",
                invalid(replicas, &format!("1 to {workers} (the number of workers)")),
            );
        }
        let total = self.total_num_replicas();
        if !(replicas..=workers).contains(&total) {
            return bad(
                "train.total_num_replicas",
                invalid(
                    total,
                    &format!(
                        "{replicas} (train.replicas_to_aggregate) to {workers} (the number of workers)"
                    ),
                ),
            );
        }
        if t.log_step_count_steps < 1 {
            return bad(
                "train.log_step_count_steps",
                invalid(t.log_step_count_steps, "a positive integer"),
            );
        }
        if t.save_summaries_steps < 1 {
            return bad(
                "train.save_summaries_steps",
                invalid(t.save_summaries_steps, "a positive integer"),
            );
        }

        // [model]
        let layers = &self.model.layers;
        if layers.len() < 2 {
            return bad(
                "model.layers",
                format!(
                    "invalid value {layers:?}: expected at least 2 widths (input first, classes last), \
                     e.g. [784, 500, 10]"
                ),
            );
        }
        if let Some(i) = layers.iter().position(|&w| w == 0) {
            return bad(
                &format!("model.layers[{i}]"),
                invalid(0, "a positive width"),
            );
        }

        // Paths: an empty one would silently mean the working directory.
        for (key, path) in [
            ("data.dir", &self.data.dir),
            ("checkpoint.dir", &self.checkpoint.dir),
            ("security.token_file", &self.security.token_file),
        ] {
            if path.as_os_str().is_empty() {
                return bad(key, "is empty: expected a path".into());
            }
        }
        let tls = self.tls_paths();
        for (key, path) in tls {
            if path.is_some_and(|p| p.as_os_str().is_empty()) {
                return bad(key, "is empty: expected a path (or leave it out)".into());
            }
        }
        if let Some((unset, _)) = tls.iter().find(|(_, p)| p.is_none())
            && let Some((set, _)) = tls.iter().find(|(_, p)| p.is_some())
        {
            return bad(
                set,
                format!(
                    "is set but {unset} is not: TLS needs all of security.tls_cert, \
                     security.tls_key and security.tls_ca (or none of them)"
                ),
            );
        }

        // [checkpoint]
        if self.checkpoint.save_secs < 1 {
            return bad(
                "checkpoint.save_secs",
                invalid(self.checkpoint.save_secs, "a positive number of seconds"),
            );
        }
        if self.checkpoint.max_to_keep < 1 {
            return bad(
                "checkpoint.max_to_keep",
                invalid(self.checkpoint.max_to_keep, "a positive integer"),
            );
        }

        // [metrics]
        let listen = &self.metrics.listen;
        if !listen.is_empty()
            && let Err(why) = check_address(listen)
        {
            return bad(
                "metrics.listen",
                format!("invalid address {listen:?}: {why} (or \"\" for off)"),
            );
        }

        // [log]
        if let Err(why) = check_log_filter(&self.log.level) {
            return bad(
                "log.level",
                format!("invalid value {:?}: {why}", self.log.level),
            );
        }
        Ok(())
    }

    /// Errors unless `task` indexes an address of its role.
    ///
    /// Errors: [`ConfigError::Task`], naming the list and where it came from.
    pub fn check_task(&self, task: TaskId) -> Result<(), ConfigError> {
        let (key, list) = self.addresses(task.role);
        let count = list.len();
        if task.index < count {
            return Ok(());
        }
        Err(ConfigError::Task {
            task,
            count,
            key: key.to_owned(),
            origin: self.sources.origin(key).to_owned(),
        })
    }

    /// `host:port` of a task.
    pub fn address(&self, task: TaskId) -> Option<&str> {
        self.addresses(task.role)
            .1
            .get(task.index)
            .map(String::as_str)
    }

    /// A role's key (`cluster.ps`, `cluster.worker`) and address list.
    fn addresses(&self, role: Role) -> (&'static str, &[String]) {
        match role {
            Role::Ps => ("cluster.ps", &self.cluster.ps),
            Role::Worker => ("cluster.worker", &self.cluster.worker),
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

    /// Reads the bearer token, refusing a file others may read.
    ///
    /// Returns the file's content without surrounding whitespace.
    /// Errors: [`ConfigError::File`] if the file cannot be read, grants any
    /// permission to others (mode & 0o007), or holds only whitespace.
    pub fn read_token(&self) -> Result<String, ConfigError> {
        let key = "security.token_file";
        let path = &self.security.token_file;
        let text = read_file(key, path, true)?;
        let token = String::from_utf8_lossy(&text).trim().to_owned();
        if token.is_empty() {
            return Err(ConfigError::File {
                key,
                path: path.clone(),
                problem: "the file is empty: expected the cluster's shared token".into(),
            });
        }
        Ok(token)
    }

    /// Validates `new` as a reload of `self`: an error names the first key that
    /// cannot change live (cluster, model, mode, ...); otherwise returns `new`.
    ///
    /// `new` must already be validated ([`Config::load`] does). The keys that
    /// may differ are [`RELOADABLE`].
    /// Errors: [`ConfigError::NotReloadable`] naming every such key.
    pub fn reload(&self, new: Config) -> Result<Config, ConfigError> {
        let keys: Vec<String> = self
            .changed_keys(&new)
            .into_iter()
            .filter(|key| !RELOADABLE.contains(&key.as_str()))
            .collect();
        if keys.is_empty() {
            Ok(new)
        } else {
            Err(ConfigError::NotReloadable { keys })
        }
    }

    /// The dotted keys (`section.key`) whose values differ between `self`
    /// and `other`, sorted.
    pub fn changed_keys(&self, other: &Config) -> Vec<String> {
        let (a, b) = (leaves(self), leaves(other));
        let mut keys: Vec<String> = a
            .iter()
            .filter(|(key, value)| b.get(*key) != Some(value))
            .map(|(key, _)| key.clone())
            .chain(b.keys().filter(|key| !a.contains_key(*key)).cloned())
            .collect();
        keys.sort();
        keys
    }
}

/// The task named by `TF_CONFIG` (`{"task": {"type": "worker", "index": 1}}`), if set.
///
/// With a `chief` list in the cluster, the chief is worker 0 and `worker` i
/// is worker i + (number of chiefs), matching how [`Config::load`] builds
/// `cluster.worker`. Task types are `chief`, `worker` and `ps`.
/// Errors: [`ConfigError::Syntax`] for malformed JSON, [`ConfigError::Key`]
/// for an unknown task type.
pub fn task_from_env() -> Result<Option<TaskId>, ConfigError> {
    match std::env::var(TF_CONFIG) {
        Ok(json) => task_from_tf_config(&json),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(ConfigError::Syntax {
            origin: TF_CONFIG.into(),
            message: e.to_string(),
        }),
    }
}

/// [`task_from_env`] on a given `TF_CONFIG` value.
///
/// Errors: as [`task_from_env`].
pub fn task_from_tf_config(json: &str) -> Result<Option<TaskId>, ConfigError> {
    let tf = parse_tf_config(json)?;
    let Some(task) = tf.task else { return Ok(None) };
    let chiefs = tf.cluster.as_ref().map_or(0, |c| c.chief.len());
    let bad_index = |count: usize, list: &str| ConfigError::Key {
        origin: TF_CONFIG.into(),
        key: "task.index".into(),
        problem: format!(
            "invalid value {}: the cluster has {count} {list} tasks",
            task.index
        ),
    };
    let id = match task.kind.as_str() {
        "chief" => {
            if tf.cluster.is_some() && task.index >= chiefs {
                return Err(bad_index(chiefs, "chief"));
            }
            TaskId {
                role: Role::Worker,
                index: task.index,
            }
        }
        "worker" => TaskId {
            role: Role::Worker,
            index: chiefs + task.index,
        },
        "ps" => TaskId {
            role: Role::Ps,
            index: task.index,
        },
        other => {
            return Err(ConfigError::Key {
                origin: TF_CONFIG.into(),
                key: "task.type".into(),
                problem: format!(
                    "invalid value {other:?}: expected \"chief\", \"worker\" or \"ps\""
                ),
            });
        }
    };
    Ok(Some(id))
}

/// `TF_CONFIG` as Kubeflow and TensorFlow write it; other fields
/// (`environment`, `rpc_layer`, an `evaluator` list) are ignored.
#[derive(Debug, Deserialize)]
struct TfConfig {
    #[serde(default)]
    cluster: Option<TfCluster>,
    #[serde(default)]
    task: Option<TfTask>,
}

#[derive(Debug, Clone, Deserialize)]
struct TfCluster {
    #[serde(default)]
    ps: Vec<String>,
    #[serde(default)]
    worker: Vec<String>,
    #[serde(default)]
    chief: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct TfTask {
    #[serde(rename = "type")]
    kind: String,
    index: usize,
}

fn parse_tf_config(json: &str) -> Result<TfConfig, ConfigError> {
    serde_json::from_str(json).map_err(|e| ConfigError::Syntax {
        origin: TF_CONFIG.into(),
        message: format!(
            "{e}: expected JSON like {{\"cluster\": {{\"ps\": [\"host:port\"], \"worker\": [\"host:port\"]}}, \
             \"task\": {{\"type\": \"worker\", \"index\": 0}}}}"
        ),
    })
}

/// The figment layer for `TF_CONFIG`'s cluster: `cluster.ps` and
/// `cluster.worker` (chief ++ worker), each only if `TF_CONFIG` has it.
struct TfConfigCluster(Option<TfCluster>);

impl Provider for TfConfigCluster {
    fn metadata(&self) -> Metadata {
        Metadata::named(TF_CONFIG)
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut cluster = Dict::new();
        if let Some(tf) = &self.0 {
            if !tf.ps.is_empty() {
                cluster.insert("ps".into(), Value::serialize(&tf.ps)?);
            }
            let workers: Vec<&String> = tf.chief.iter().chain(&tf.worker).collect();
            if !workers.is_empty() {
                cluster.insert("worker".into(), Value::serialize(&workers)?);
            }
        }
        let mut dict = Dict::new();
        if !cluster.is_empty() {
            dict.insert("cluster".into(), cluster.into());
        }
        Ok(Profile::Default.collect(dict))
    }
}

/// Extracts, records where each value came from, validates.
fn extract(figment: &Figment, file: &str) -> Result<Config, ConfigError> {
    let mut config: Config = figment
        .extract()
        .map_err(|e| figment_error(e, figment, file))?;
    let keys = leaves(&config)
        .into_keys()
        .map(|key| {
            let origin = describe_origin(figment.find_metadata(&key), &key, file);
            (key, origin)
        })
        .collect();
    config.sources = Sources {
        fallback: file.to_owned(),
        keys,
    };
    config.validate()?;
    Ok(config)
}

/// Every `section.key` of a config with its value.
fn leaves(config: &Config) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    // A Config is plain data: serializing it to JSON cannot fail, and an
    // error would only leave the map empty.
    if let Ok(serde_json::Value::Object(sections)) = serde_json::to_value(config) {
        for (section, table) in sections {
            match table {
                serde_json::Value::Object(fields) => out.extend(
                    fields
                        .into_iter()
                        .map(|(field, value)| (format!("{section}.{field}"), value)),
                ),
                other => {
                    out.insert(section, other);
                }
            }
        }
    }
    out
}

/// Names the provider that supplied `key` as an operator would look for it.
fn describe_origin(metadata: Option<&Metadata>, key: &str, file: &str) -> String {
    match metadata {
        Some(md) if md.name.starts_with("TOML") => file.to_owned(),
        Some(md) if md.name == TF_CONFIG => TF_CONFIG.to_owned(),
        Some(md) if md.name.contains("environment variable") => {
            format!("environment variable {}", env_var_name(key))
        }
        Some(_) => format!("built-in default (not set in {file})"),
        None => file.to_owned(),
    }
}

/// The `DTF_…` variable that set `key` (`train.last_step` →
/// `DTF_TRAIN__LAST_STEP`), spelled as it is in the environment.
fn env_var_name(key: &str) -> String {
    let key = key.split('[').next().unwrap_or(key);
    std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .find(|name| {
            name.get(..ENV_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(ENV_PREFIX))
                && name[ENV_PREFIX.len()..]
                    .replace("__", ".")
                    .to_ascii_lowercase()
                    .starts_with(key)
        })
        .unwrap_or_else(|| {
            format!(
                "{ENV_PREFIX}{}",
                key.to_ascii_uppercase().replace('.', "__")
            )
        })
}

/// Turns figment's error into one naming the key, where it came from, and
/// what was expected.
fn figment_error(error: figment::Error, figment: &Figment, file: &str) -> ConfigError {
    // figment may chain several errors; the first is enough to act on.
    let error = error
        .into_iter()
        .next()
        .unwrap_or_else(|| figment::Error::from("invalid configuration"));
    let mut path = error.path.clone();
    // figment usually has the unknown field in the path already.
    if let Kind::UnknownField(field, _) = &error.kind
        && path.last() != Some(field)
    {
        path.push(field.clone());
    }
    if path.is_empty() {
        // Not about a key: a TOML syntax error, reported with line and column.
        let origin = describe_origin(error.metadata.as_ref(), "", file);
        return ConfigError::Syntax {
            origin,
            message: error.kind.to_string().trim_end().to_owned(),
        };
    }
    // `model.layers.1` reads better as `model.layers[1]`.
    let mut key = String::new();
    for (i, part) in path.iter().enumerate() {
        if i >= 2 && part.parse::<usize>().is_ok() {
            key.push_str(&format!("[{part}]"));
        } else {
            if i > 0 {
                key.push('.');
            }
            key.push_str(part);
        }
    }
    let lookup = path.iter().take(2).cloned().collect::<Vec<_>>().join(".");
    let metadata = figment.find_metadata(&lookup).or(error.metadata.as_ref());
    let origin = describe_origin(metadata, &lookup, file);
    let problem = describe_kind(&error.kind, path.len() == 1);
    ConfigError::Key {
        origin,
        key,
        problem,
    }
}

fn describe_kind(kind: &Kind, top_level: bool) -> String {
    match kind {
        Kind::UnknownField(field, valid) => {
            let what = if top_level { "section" } else { "key" };
            let mut problem = format!("unknown {what}");
            if let Some(close) = closest(field, valid) {
                problem.push_str(&format!(" (did you mean `{close}`?)"));
            }
            problem.push_str(&format!("; expected one of: {}", valid.join(", ")));
            problem
        }
        Kind::InvalidType(actual, expected) => {
            format!(
                "expected {}, found {}",
                describe_expected(expected),
                describe_actual(actual)
            )
        }
        Kind::InvalidValue(actual, expected) => {
            format!(
                "invalid value {}: expected {}",
                raw_value(actual),
                describe_expected(expected)
            )
        }
        Kind::InvalidLength(len, expected) => format!("invalid length {len}: expected {expected}"),
        Kind::UnknownVariant(found, valid) => {
            let valid: Vec<String> = valid.iter().map(|v| format!("{v:?}")).collect();
            format!(
                "invalid value {found:?}: expected one of {}",
                valid.join(", ")
            )
        }
        Kind::MissingField(field) => format!("missing key `{field}`"),
        Kind::DuplicateField(field) => format!("key `{field}` given twice"),
        Kind::ISizeOutOfRange(v) => format!("invalid value {v}: out of range"),
        Kind::USizeOutOfRange(v) => format!("invalid value {v}: out of range"),
        other => other.to_string(),
    }
}

/// serde's names for what it expected, in an operator's words.
fn describe_expected(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative integer".into(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer".into(),
        "f32" | "f64" => "a number".into(),
        "a sequence" => "an array".into(),
        "variant identifier" => "a string".into(),
        e if e.starts_with("struct ") || e == "a map" => "a table".into(),
        e => e.into(),
    }
}

/// A value as written in the file: `-3`, `"x"`.
fn raw_value(actual: &Actual) -> String {
    match actual {
        Actual::Unsigned(v) => v.to_string(),
        Actual::Signed(v) => v.to_string(),
        Actual::Float(v) => v.to_string(),
        Actual::Bool(v) => v.to_string(),
        Actual::Str(v) => format!("{v:?}"),
        other => describe_actual(other),
    }
}

fn describe_actual(actual: &Actual) -> String {
    match actual {
        Actual::Bool(v) => format!("a boolean ({v})"),
        Actual::Unsigned(v) => format!("an integer ({v})"),
        Actual::Signed(v) => format!("an integer ({v})"),
        Actual::Float(v) => format!("a float ({v})"),
        Actual::Char(v) => format!("a string ({v:?})"),
        Actual::Str(v) => format!("a string ({v:?})"),
        Actual::Seq => "an array".into(),
        Actual::Map => "a table".into(),
        Actual::Unit | Actual::Option => "nothing".into(),
        other => other.to_string(),
    }
}

/// The valid name closest to a misspelt one, if any is close.
fn closest<'a>(found: &str, valid: &[&'a str]) -> Option<&'a str> {
    valid
        .iter()
        .map(|v| (edit_distance(found, v), *v))
        .filter(|(d, v)| *d <= 2.max(v.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn invalid(value: impl fmt::Display, expected: &str) -> String {
    format!("invalid value {value}: expected {expected}")
}

/// The content of `path` (named by `key`); if `secret`, refused when the
/// file grants any permission to others (mode & 0o007).
///
/// Errors: [`ConfigError::File`], saying what to do.
pub fn read_file(key: &'static str, path: &Path, secret: bool) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    let fail = |problem: String| ConfigError::File {
        key,
        path: path.to_owned(),
        problem,
    };
    let mut file = std::fs::File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
    if secret {
        // Check the mode of the file we opened, not of the path: no race
        // with a rename between the check and the read.
        let mode = file
            .metadata()
            .map_err(|e| fail(format!("cannot stat: {e}")))?
            .permissions()
            .mode();
        if mode & 0o007 != 0 {
            return Err(fail(format!(
                "the file has mode {:04o}, which lets other users read a secret: \
                 run `chmod 640 {}` (readable by its owner and group only)",
                mode & 0o7777,
                path.display()
            )));
        }
    }
    let mut content = Vec::new();
    file.read_to_end(&mut content)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
    Ok(content)
}

/// `host:port` with a non-empty host (a name, an IPv4 address or a
/// bracketed IPv6 address) and a port in 1–65535.
fn check_address(address: &str) -> Result<(), String> {
    const EXPECTED: &str = "expected host:port with a port in 1-65535, e.g. 10.0.0.1:2222";
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(format!("no port: {EXPECTED}"));
    };
    match port.parse::<u16>() {
        Ok(p) if p >= 1 => {}
        _ => return Err(format!("bad port {port:?}: {EXPECTED}")),
    }
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    };
    if !host_ok {
        return Err(format!(
            "bad host {host:?}: {EXPECTED} (IPv6 in brackets: [::1]:2222)"
        ));
    }
    Ok(())
}

/// A tracing filter. `EnvFilter` takes any bare word as a target name, so
/// a misspelt level (`degub`) would quietly turn logging off; bare words
/// must be levels.
fn check_log_filter(filter: &str) -> Result<(), String> {
    const EXPECTED: &str = "expected a level (off, error, warn, info, debug, trace) or directives like \"dtf=debug,info\"";
    if filter.trim().is_empty() {
        return Err(EXPECTED.into());
    }
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let is_level = ["off", "error", "warn", "info", "debug", "trace"]
            .iter()
            .any(|l| l.eq_ignore_ascii_case(directive));
        if !directive.contains(['=', '[', ':']) && !is_level {
            return Err(format!("{directive:?} is not a level: {EXPECTED}"));
        }
    }
    tracing_subscriber::EnvFilter::try_new(filter)
        .map(drop)
        .map_err(|e| format!("{e}: {EXPECTED}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::{Mutex, MutexGuard};

    /// Serializes the tests that read or write the process environment
    /// (`Config::load` reads `DTF_…` and `TF_CONFIG`).
    fn env_lock() -> MutexGuard<'static, ()> {
        static LOCK: Mutex<()> = Mutex::new(());
        LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn set_env(key: &str, value: &str) {
        // SAFETY: only tests holding `env_lock` touch the environment, and no
        // other thread of this test binary calls into C code that reads it.
        unsafe { std::env::set_var(key, value) }
    }

    fn remove_env(key: &str) {
        // SAFETY: as in `set_env`.
        unsafe { std::env::remove_var(key) }
    }

    /// A config file in a fresh temp dir; keep the dir alive while using it.
    fn write_config(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dtf.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// The error for `text`, asserting it names `key` and the origin.
    fn error_for(text: &str, key: &str) -> String {
        let err = Config::from_toml_str(text, "/etc/dtf/test.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(key), "{err:?} does not name {key}");
        assert!(
            err.contains("/etc/dtf/test.toml"),
            "{err:?} does not name the file"
        );
        err
    }

    const TWO_WORKERS: &str = "[cluster]\nps = [\"h:1\"]\nworker = [\"h:2\", \"h:3\"]\n";

    #[test]
    fn shipped_config_is_the_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/etc/dtf/dtf.toml");
        let text = std::fs::read_to_string(path).unwrap();
        assert_eq!(
            Config::from_toml_str(&text, path).unwrap(),
            Config::default()
        );
        // Every key is documented, the optional ones commented out.
        for key in leaves(&Config::default()).keys() {
            let field = key.split('.').nth(1).unwrap();
            assert!(
                text.contains(&format!("\n{field} = ")),
                "{key} missing from {path}"
            );
        }
        for key in [
            "replicas_to_aggregate",
            "total_num_replicas",
            "tls_cert",
            "tls_key",
            "tls_ca",
        ] {
            assert!(
                text.contains(&format!("\n# {key} = ")),
                "{key} should be shown commented out"
            );
        }
    }

    #[test]
    fn error_display_format() {
        let err =
            Config::from_toml_str("[train]\nbatch_size = 0\n", "/etc/dtf/dtf.toml").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/dtf/dtf.toml: train.batch_size: invalid value 0: expected a positive integer"
        );
    }

    #[test]
    fn unknown_keys_are_errors_with_hints() {
        let err = error_for("[trian]\nlast_step = 5\n", "trian");
        assert!(err.contains("unknown section"), "{err}");
        assert!(err.contains("did you mean `train`"), "{err}");
        let err = error_for("[train]\nbatch_sise = 5\n", "train.batch_sise");
        assert!(err.contains("unknown key"), "{err}");
        assert!(err.contains("did you mean `batch_size`"), "{err}");
        assert!(err.contains("last_step"), "valid keys listed: {err}");
        error_for("stray = 1\n", "stray");
        // `sources` is bookkeeping, not a key.
        error_for("sources = 1\n", "sources");
    }

    #[test]
    fn wrong_types_are_errors() {
        let err = error_for("[train]\nbatch_size = \"big\"\n", "train.batch_size");
        assert!(
            err.contains("expected a non-negative integer, found a string"),
            "{err}"
        );
        let err = error_for("[train]\nlearning_rate = \"x\"\n", "train.learning_rate");
        assert!(err.contains("expected a number"), "{err}");
        let err = error_for("[train]\nmode = \"fast\"\n", "train.mode");
        assert!(err.contains("\"async\", \"sync\""), "{err}");
        let err = error_for("[model]\nlayers = [784, \"x\", 10]\n", "model.layers[1]");
        assert!(err.contains("found a string"), "{err}");
        let err = error_for("[train]\nlast_step = -1\n", "train.last_step");
        assert!(
            err.ends_with("invalid value -1: expected a non-negative integer"),
            "{err}"
        );
        error_for("cluster = 3\n", "cluster");
    }

    #[test]
    fn syntax_errors_name_the_file() {
        let err = Config::from_toml_str("[train\n", "/x/dtf.toml").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err:?}");
        assert!(err.to_string().starts_with("/x/dtf.toml: "), "{err}");
    }

    #[test]
    fn out_of_range_values_are_errors() {
        let cases: &[(&str, &str)] = &[
            ("[train]\nbatch_size = 0", "train.batch_size"),
            ("[train]\nlearning_rate = 0.0", "train.learning_rate"),
            ("[train]\nlearning_rate = -0.1", "train.learning_rate"),
            ("[train]\nlearning_rate = inf", "train.learning_rate"),
            ("[train]\nlearning_rate = nan", "train.learning_rate"),
            (
                "[train]\nlearning_rate_decay = 0.0",
                "train.learning_rate_decay",
            ),
            (
                "[train]\nlearning_rate_decay = 1.5",
                "train.learning_rate_decay",
            ),
            (
                "[train]\nregularization_rate = -1e-4",
                "train.regularization_rate",
            ),
            (
                "[train]\nmoving_average_decay = 1.0",
                "train.moving_average_decay",
            ),
            (
                "[train]\nmoving_average_decay = -0.5",
                "train.moving_average_decay",
            ),
            ("[train]\nlast_step = 0", "train.last_step"),
            (
                "[train]\nlog_step_count_steps = 0",
                "train.log_step_count_steps",
            ),
            (
                "[train]\nsave_summaries_steps = 0",
                "train.save_summaries_steps",
            ),
            ("[model]\nlayers = [784]", "model.layers"),
            ("[model]\nlayers = [784, 0, 10]", "model.layers[1]"),
            ("[cluster]\nps = []", "cluster.ps"),
            ("[cluster]\nworker = []", "cluster.worker"),
            ("[checkpoint]\nsave_secs = 0", "checkpoint.save_secs"),
            ("[checkpoint]\nmax_to_keep = 0", "checkpoint.max_to_keep"),
            ("[checkpoint]\ndir = \"\"", "checkpoint.dir"),
            ("[metrics]\nlisten = \"9464\"", "metrics.listen"),
            ("[log]\nlevel = \"degub\"", "log.level"),
            ("[log]\nlevel = \"dtf=loud\"", "log.level"),
            ("[log]\nlevel = \"\"", "log.level"),
        ];
        for (text, key) in cases {
            let err = error_for(text, key);
            assert!(err.contains("expected"), "{err}");
        }
    }

    #[test]
    fn sync_replica_counts_are_checked() {
        let ok = format!(
            "{TWO_WORKERS}[train]\nmode = \"sync\"\nreplicas_to_aggregate = 1\ntotal_num_replicas = 2\n"
        );
        let config = Config::from_toml_str(&ok, "f").unwrap();
        assert_eq!(
            (config.replicas_to_aggregate(), config.total_num_replicas()),
            (1, 2)
        );
        let err = error_for(
            &format!("{TWO_WORKERS}[train]\nreplicas_to_aggregate = 3\n"),
            "train.replicas_to_aggregate",
        );
        assert!(err.contains("1 to 2"), "{err}");
        error_for(
            &format!("{TWO_WORKERS}[train]\nreplicas_to_aggregate = 0\n"),
            "train.replicas_to_aggregate",
        );
        error_for(
            &format!("{TWO_WORKERS}[train]\nreplicas_to_aggregate = 2\ntotal_num_replicas = 1\n"),
            "train.total_num_replicas",
        );
        error_for(
            &format!("{TWO_WORKERS}[train]\ntotal_num_replicas = 3\n"),
            "train.total_num_replicas",
        );
    }

    #[test]
    fn addresses_are_checked() {
        let err = error_for(
            "[cluster]\nps = [\"a:1\"]\nworker = [\"b:2\", \"a:1\"]\n",
            "cluster.worker[1]",
        );
        assert!(
            err.contains("duplicate address \"a:1\" (also cluster.ps[0])"),
            "{err}"
        );
        error_for(
            "[cluster]\nworker = [\"b:2\", \"b:2\"]\n",
            "cluster.worker[1]",
        );
        for bad in [
            "host",
            "host:0",
            "host:65536",
            ":80",
            "ho st:1",
            "::1:80",
            "[nope]:80",
            "h:x",
        ] {
            error_for(&format!("[cluster]\nps = [\"{bad}\"]\n"), "cluster.ps[0]");
        }
        for good in [
            "10.0.0.1:2222",
            "ps-0.dtf.svc.cluster.local:2222",
            "[::1]:2222",
            "h:65535",
        ] {
            Config::from_toml_str(&format!("[cluster]\nps = [\"{good}\"]\n"), "f").unwrap();
        }
    }

    #[test]
    fn task_outside_cluster() {
        let config = Config::from_toml_str(TWO_WORKERS, "/etc/dtf/dtf.toml").unwrap();
        config
            .check_task(TaskId {
                role: Role::Worker,
                index: 1,
            })
            .unwrap();
        config
            .check_task(TaskId {
                role: Role::Ps,
                index: 0,
            })
            .unwrap();
        let err = config
            .check_task(TaskId {
                role: Role::Worker,
                index: 3,
            })
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "task worker:3: the cluster has 2 worker tasks (cluster.worker in /etc/dtf/dtf.toml)"
        );
        let err = config
            .check_task(TaskId {
                role: Role::Ps,
                index: 1,
            })
            .unwrap_err();
        assert!(
            err.to_string().contains("cluster.ps in /etc/dtf/dtf.toml"),
            "{err}"
        );
    }

    #[test]
    fn to_toml_round_trips_and_omits_none() {
        let mut config = Config::from_toml_str(TWO_WORKERS, "f").unwrap();
        let text = config.to_toml();
        assert!(!text.contains("replicas_to_aggregate"), "{text}");
        assert_eq!(Config::from_toml_str(&text, "f").unwrap(), config);
        config.train.replicas_to_aggregate = Some(2);
        config.train.mode = Mode::Sync;
        config.cluster.placement = Placement::Greedy;
        assert_eq!(
            Config::from_toml_str(&config.to_toml(), "f").unwrap(),
            config
        );
    }

    #[test]
    fn load_layers_file_env_and_tf_config() {
        let _env = env_lock();
        let (_dir, path) = write_config("[train]\nlast_step = 50\nbatch_size = 32\n");
        let file = path.display().to_string();

        // A missing file is an error naming it.
        let missing = _dir.path().join("absent.toml");
        let err = Config::load(&missing).unwrap_err().to_string();
        assert!(err.contains("absent.toml"), "{err}");

        let config = Config::load(&path).unwrap();
        assert_eq!((config.train.last_step, config.train.batch_size), (50, 32));
        assert_eq!(config.sources.origin("train.last_step"), file);

        // The environment overrides the file; other DTF_ variables are not config.
        set_env("DTF_TRAIN__LAST_STEP", "100");
        set_env("DTF_LOG__LEVEL", "debug");
        set_env("DTF_CONFIG", "/somewhere/else.toml");
        set_env("DTF_CLUSTER__WORKER", "[\"h:2\", \"h:3\"]");
        let config = Config::load(&path).unwrap();
        assert_eq!(config.train.last_step, 100);
        assert_eq!(config.train.batch_size, 32);
        assert_eq!(config.log.level, "debug");
        assert_eq!(config.cluster.worker, ["h:2", "h:3"]);
        assert_eq!(
            config.sources.origin("train.last_step"),
            "environment variable DTF_TRAIN__LAST_STEP"
        );

        // Errors in the environment name the variable, not the file.
        set_env("DTF_TRAIN__LAST_STEP", "0");
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with("environment variable DTF_TRAIN__LAST_STEP: train.last_step:"),
            "{err}"
        );
        set_env("DTF_TRAIN__LAST_STEP", "many");
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains("DTF_TRAIN__LAST_STEP"), "{err}");
        assert!(err.contains("found a string"), "{err}");
        remove_env("DTF_TRAIN__LAST_STEP");
        set_env("DTF_TRAIN__BATCH_SISE", "1");
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "environment variable DTF_TRAIN__BATCH_SISE: train.batch_sise: unknown key"
            ),
            "{err}"
        );
        remove_env("DTF_TRAIN__BATCH_SISE");
        remove_env("DTF_LOG__LEVEL");
        remove_env("DTF_CONFIG");
        remove_env("DTF_CLUSTER__WORKER");

        // TF_CONFIG without a chief: lists taken as they are.
        set_env(
            "TF_CONFIG",
            r#"{"cluster": {"ps": ["p:1"], "worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 1}}"#,
        );
        let config = Config::load(&path).unwrap();
        assert_eq!(config.cluster.ps, ["p:1"]);
        assert_eq!(config.cluster.worker, ["w:1", "w:2"]);
        assert_eq!(
            task_from_env().unwrap(),
            Some(TaskId {
                role: Role::Worker,
                index: 1
            })
        );
        let err = config
            .check_task(TaskId {
                role: Role::Worker,
                index: 2,
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("(cluster.worker in TF_CONFIG)"), "{err}");

        // With a chief: it becomes worker 0, the workers shift by one.
        set_env(
            "TF_CONFIG",
            r#"{"cluster": {"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1", "w:2"]},
                "task": {"type": "worker", "index": 1}, "environment": "cloud"}"#,
        );
        let config = Config::load(&path).unwrap();
        assert_eq!(config.cluster.worker, ["c:1", "w:1", "w:2"]);
        assert_eq!(
            task_from_env().unwrap(),
            Some(TaskId {
                role: Role::Worker,
                index: 2
            })
        );
        set_env(
            "TF_CONFIG",
            r#"{"cluster": {"chief": ["c:1"], "ps": ["p:1"]}, "task": {"type": "chief", "index": 0}}"#,
        );
        assert_eq!(Config::load(&path).unwrap().cluster.worker, ["c:1"]);
        assert_eq!(
            task_from_env().unwrap(),
            Some(TaskId {
                role: Role::Worker,
                index: 0
            })
        );
        set_env(
            "TF_CONFIG",
            r#"{"cluster": {"ps": ["p:1"], "worker": ["p:1"]}}"#,
        );
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(
            err.starts_with("TF_CONFIG: cluster.worker[0]: duplicate address"),
            "{err}"
        );

        // Malformed TF_CONFIG is an error naming it, for the cluster and the task.
        set_env("TF_CONFIG", "{\"cluster\": ");
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.starts_with("TF_CONFIG: "), "{err}");
        let err = task_from_env().unwrap_err().to_string();
        assert!(err.starts_with("TF_CONFIG: "), "{err}");
        set_env(
            "TF_CONFIG",
            r#"{"task": {"type": "evaluator", "index": 0}}"#,
        );
        let err = task_from_env().unwrap_err().to_string();
        assert!(
            err.contains("task.type") && err.contains("evaluator"),
            "{err}"
        );

        remove_env("TF_CONFIG");
        assert_eq!(task_from_env().unwrap(), None);
        assert_eq!(
            Config::load(&path).unwrap().cluster,
            ClusterConfig::default()
        );
    }

    fn token_config(dir: &Path, content: &str, mode: u32) -> Config {
        let path = dir.join("token");
        std::fs::write(&path, content).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut config = Config::default();
        config.security.token_file = path;
        config
    }

    #[test]
    fn token_file_permissions_and_content() {
        let dir = tempfile::tempdir().unwrap();
        let config = token_config(dir.path(), "s3cret\n", 0o640);
        assert_eq!(config.read_token().unwrap(), "s3cret");

        let config = token_config(dir.path(), "s3cret\n", 0o644);
        let err = config.read_token().unwrap_err().to_string();
        assert!(err.contains("chmod 640") && err.contains("token"), "{err}");

        let config = token_config(dir.path(), " \n", 0o600);
        let err = config.read_token().unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");

        let mut config = Config::default();
        config.security.token_file = dir.path().join("absent");
        let err = config.read_token().unwrap_err().to_string();
        assert!(err.contains("absent"), "{err}");
    }

    #[test]
    fn tls_needs_all_three_files_or_none() {
        let base = "[security]\ntls_cert = \"/c\"\ntls_key = \"/k\"\ntls_ca = \"/a\"\n";
        let all = Config::from_toml_str(&format!("{TWO_WORKERS}{base}"), "/etc/dtf/test.toml");
        assert_eq!(all.unwrap().security.tls_key, Some("/k".into()));
        let err = error_for(
            &format!("{TWO_WORKERS}[security]\ntls_cert = \"/c\"\ntls_ca = \"/a\"\n"),
            "security.tls_key",
        );
        assert!(err.contains("security.tls_cert"), "{err}");
        error_for(
            &format!("{TWO_WORKERS}{}", base.replace("\"/a\"", "\"\"")),
            "security.tls_ca",
        );
        // A change of TLS files needs a restart.
        let old = Config::default();
        let mut new = old.clone();
        new.security.tls_ca = Some("/a".into());
        assert_eq!(old.changed_keys(&new), ["security.tls_ca"]);
        assert!(old.reload(new).is_err());
    }

    #[test]
    fn reload_accepts_live_keys_only() {
        let old = Config::default();
        let mut new = old.clone();
        new.train.last_step = 30000;
        new.log.level = "debug".into();
        new.checkpoint.save_secs = 10;
        assert_eq!(
            old.changed_keys(&new),
            ["checkpoint.save_secs", "log.level", "train.last_step"]
        );
        assert_eq!(old.reload(new.clone()).unwrap(), new);

        let rejected = |change: fn(&mut Config), key: &str| {
            let mut new = old.clone();
            change(&mut new);
            let err = old.reload(new).unwrap_err().to_string();
            assert_eq!(
                err,
                format!("{key} cannot change while running (restart the cluster to change it)")
            );
        };
        rejected(|c| c.cluster.ps.push("h:9".into()), "cluster.ps");
        rejected(|c| c.model.layers = vec![784, 10], "model.layers");
        rejected(|c| c.train.mode = Mode::Sync, "train.mode");
        rejected(
            |c| c.train.replicas_to_aggregate = Some(1),
            "train.replicas_to_aggregate",
        );

        let mut new = old.clone();
        new.train.batch_size = 7;
        new.train.seed = 1;
        let err = old.reload(new).unwrap_err().to_string();
        assert!(
            err.starts_with("train.batch_size, train.seed cannot change"),
            "{err}"
        );
    }

    #[test]
    fn reloadable_keys_are_real_keys() {
        let keys = leaves(&Config::default());
        for key in RELOADABLE {
            assert!(keys.contains_key(*key), "{key} is not a config key");
        }
    }

    #[test]
    fn task_display() {
        assert_eq!(
            TaskId {
                role: Role::Ps,
                index: 0
            }
            .to_string(),
            "ps:0"
        );
        assert_eq!(
            TaskId {
                role: Role::Worker,
                index: 1
            }
            .to_string(),
            "worker:1"
        );
    }
}
