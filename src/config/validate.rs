//! Validation: one function per section, each returning the first bad key
//! as a [`ConfigError::Key`] that names it, where its value came from, and
//! what would be right.

use super::error::ConfigError;
use super::schema::{
    Config, DataFormat, Metric, Mode, ModelConfig, ModelKind, OptimizerKind, Partitioner,
};
use super::size::memory_bytes;
use super::task::{Role, TaskId};
use std::collections::BTreeMap;
use std::fmt;

mod address;
mod regression;
mod train;
mod widths;
pub(super) use address::same_endpoint;
use address::{check_address, endpoints};

impl Config {
    /// Checks values and cross-key rules (ranges, duplicate addresses, sync replica counts).
    ///
    /// Errors: [`ConfigError::Key`] for the first bad key, naming where it came from.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_cluster()?;
        self.validate_train()?;
        self.validate_optimizer()?;
        self.validate_schedule()?;
        self.validate_sync()?;
        self.validate_model()?;
        self.check_fits(memory_bytes())?;
        self.validate_data()?;
        self.validate_checkpoint()?;
        self.validate_eval()?;
        self.validate_task()?;
        self.validate_ps()?;
        self.validate_security()?;
        self.validate_metrics()?;
        self.validate_log()
    }

    /// Errors unless `task` indexes an address of its role (and, a sync
    /// worker, one of the `train.total_num_replicas` replicas).
    ///
    /// Errors: [`ConfigError::Task`], naming the list and where it came
    /// from; [`ConfigError::Key`] for a sync worker past the replicas.
    pub fn check_task(&self, task: TaskId) -> Result<(), ConfigError> {
        let (key, list) = self.addresses(task.role);
        // The evaluator has no address: a cluster has one, task 0 (TF's
        // `evaluator` task type, whose index is always 0 too).
        let count = if task.role == Role::Evaluator {
            1
        } else {
            list.len()
        };
        if task.index >= count {
            return Err(ConfigError::Task {
                task,
                count,
                key: key.to_owned(),
                origin: self.sources.origin(key).to_owned(),
            });
        }
        // Sync steps take gradients from workers 0..total_num_replicas only:
        // the ps tasks refuse any other's pushes, so a worker past it would
        // fail every step (and, restarted, again).
        let total = self.total_num_replicas();
        if task.role == Role::Worker && self.train.mode == Mode::Sync && task.index >= total {
            return Err(self.bad(
                "train.total_num_replicas",
                format!(
                    "{total}: worker {} is not one of the replicas (sync steps take gradients from \
                     workers 0 to {}; unset, it is train.replicas_to_aggregate); raise it to {} to \
                     let every worker in cluster.worker take part",
                    task.index,
                    total.saturating_sub(1),
                    self.cluster.worker.len()
                ),
            ));
        }
        Ok(())
    }

    /// The error for `key`, naming where its value came from.
    pub fn bad(&self, key: &str, problem: String) -> ConfigError {
        ConfigError::Key {
            origin: self.sources.origin(key).to_owned(),
            key: key.to_owned(),
            problem,
        }
    }

    /// `[cluster]`: non-empty lists of valid, distinct addresses.
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let lists = [Role::Ps, Role::Worker].map(|role| self.addresses(role));
        for (key, list) in lists {
            if list.is_empty() {
                // A reload that empties the worker list would remove the chief.
                let why = if key == "cluster.worker" {
                    " (worker 0 is the chief, which a running cluster cannot lose)"
                } else {
                    ""
                };
                return Err(self.bad(
                    key,
                    format!("is empty: expected at least one host:port address{why}"),
                ));
            }
            for (i, address) in list.iter().enumerate() {
                if let Err(why) = check_address(address) {
                    return Err(self.bad(
                        &format!("{key}[{i}]"),
                        format!("invalid address {address:?}: {why}"),
                    ));
                }
            }
        }
        // Every task needs its own address; `seen` maps each endpoint to its
        // first entry, so `localhost:X` meets `127.0.0.1:X`.
        let entries = lists
            .iter()
            .flat_map(|&(key, list)| list.iter().enumerate().map(move |(i, a)| (key, i, a)));
        let mut seen = BTreeMap::new();
        for (key, i, address) in entries {
            for endpoint in endpoints(address) {
                if let Some((first_key, first, earlier)) = seen.insert(endpoint, (key, i, address))
                {
                    let same = if earlier == address {
                        String::new()
                    } else {
                        format!(", {earlier:?}, the same endpoint")
                    };
                    return Err(self.bad(
                        &format!("{key}[{i}]"),
                        format!(
                            "duplicate address {address:?} (also {first_key}[{first}]{same}): \
                             expected every task to have its own host:port"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `[train]`: the hyperparameters and step counts.
    fn validate_train(&self) -> Result<(), ConfigError> {
        let t = &self.train;
        if t.batch_size < 1 {
            return Err(self.bad(
                "train.batch_size",
                invalid(t.batch_size, "a positive integer"),
            ));
        }
        if t.batch_size > MAX_BATCH_SIZE {
            return Err(self.bad(
                "train.batch_size",
                invalid(
                    t.batch_size,
                    &format!("an integer from 1 to {MAX_BATCH_SIZE}"),
                ),
            ));
        }
        if !(t.learning_rate > 0.0 && t.learning_rate <= MAX_LEARNING_RATE) {
            return Err(self.bad(
                "train.learning_rate",
                invalid(
                    t.learning_rate,
                    &format!("a number in (0, {MAX_LEARNING_RATE}]"),
                ),
            ));
        }
        if !(t.learning_rate_decay > 0.0 && t.learning_rate_decay <= 1.0) {
            return Err(self.bad(
                "train.learning_rate_decay",
                invalid(t.learning_rate_decay, "a number in (0, 1]"),
            ));
        }
        if !(t.regularization_rate >= 0.0 && t.regularization_rate <= MAX_REGULARIZATION_RATE) {
            return Err(self.bad(
                "train.regularization_rate",
                invalid(
                    t.regularization_rate,
                    &format!("a number in [0, {MAX_REGULARIZATION_RATE}]"),
                ),
            ));
        }
        // The L2 term alone updates every weight by `w -= lr·reg·w`: with
        // lr·reg > 2 each step multiplies the weights by a factor below -1,
        // and they grow to infinity whatever the data.
        if f64::from(t.learning_rate) * f64::from(t.regularization_rate) > 2.0 {
            return Err(self.bad(
                "train.regularization_rate",
                format!(
                    "invalid value {}: with train.learning_rate = {} the weight decay alone \
                     diverges: expected learning_rate × regularization_rate <= 2",
                    t.regularization_rate, t.learning_rate
                ),
            ));
        }
        if !(t.moving_average_decay >= 0.0 && t.moving_average_decay < 1.0) {
            return Err(self.bad(
                "train.moving_average_decay",
                invalid(t.moving_average_decay, "a number in [0, 1)"),
            ));
        }
        for (key, value) in [
            ("train.last_step", t.last_step),
            ("train.log_step_count_steps", t.log_step_count_steps),
            ("train.save_summaries_steps", t.save_summaries_steps),
            ("train.seed", t.seed.max(1)),
            ("checkpoint.save_steps", self.checkpoint.save_steps.max(1)),
        ] {
            // A dtf.toml holds TOML's integers, i64: `dtf local` writes one for its tasks.
            if !(1..=TOML_MAX).contains(&value) {
                return Err(self.bad(
                    key,
                    invalid(value, "a positive integer of at most 2^63 - 1"),
                ));
            }
        }
        Ok(())
    }

    /// `model.kind = "wide_deep"`'s own defaults for the keys nobody set:
    /// those of TensorFlow's wide & deep parameter-server program (Adagrad,
    /// learning rate 0.05, batch 256, hidden widths 64 and 32), not the MLP's;
    /// and the evaluator ranks its best checkpoints by EMA AUC, the score a
    /// click-through model is judged by (accuracy at ½ says little when
    /// most labels are 0).
    pub(crate) fn kind_defaults(&mut self) {
        self.task_defaults();
        if self.model.kind != ModelKind::WideDeep {
            return;
        }
        if !self.sources.is_set("train.optimizer") {
            self.train.optimizer = OptimizerKind::Adagrad;
        }
        if !self.sources.is_set("train.learning_rate") {
            self.train.learning_rate = WIDE_DEEP_LEARNING_RATE;
        }
        if !self.sources.is_set("train.batch_size") {
            self.train.batch_size = WIDE_DEEP_BATCH_SIZE;
        }
        if self.model.hidden.is_none() && !self.sources.is_set("model.layers") {
            self.model.hidden = Some(WIDE_DEEP_HIDDEN.to_vec());
        }
        if !self.sources.is_set("eval.metric") {
            self.eval.metric = Metric::EmaAuc;
        }
    }

    /// A model with embedding tables: rows at least one wide, and a rule
    /// the ps applies to them sparsely (`Config::table_optimizer`).
    fn validate_tables(&self) -> Result<(), ConfigError> {
        self.validate_table_policy()?;
        if self.model.kind != ModelKind::WideDeep {
            return Ok(());
        }
        if self.model.embedding_dim == 0 {
            return Err(self.bad(
                "model.embedding_dim",
                invalid(0, "a positive width, e.g. 16"),
            ));
        }
        for spec in crate::placement::tables(self) {
            if self.table_optimizer(&spec.name).is_none() {
                return Err(self.bad(
                    "train.optimizer",
                    format!(
                        "\"{}\" cannot update embedding tables (model.kind = \"wide_deep\"); \
                         use \"sgd\" or \"adagrad\", or give the tables their own with \
                         model.tables.optimizer (sgd, adagrad, ftrl, lazy_adam)",
                        self.train.optimizer().name()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `train.replicas_to_aggregate` and `train.total_num_replicas` against
    /// the number of workers.
    fn validate_sync(&self) -> Result<(), ConfigError> {
        let workers = self.cluster.worker.len();
        let replicas = self.replicas_to_aggregate();
        if !(1..=workers).contains(&replicas) {
            return Err(self.bad(
                "train.replicas_to_aggregate",
                invalid(
                    replicas,
                    &format!("1 to {workers} (the number of workers in cluster.worker)"),
                ),
            ));
        }
        let total = self.total_num_replicas();
        if !(replicas..=workers).contains(&total) {
            return Err(self.bad(
                "train.total_num_replicas",
                invalid(
                    total,
                    &format!(
                        "{replicas} (train.replicas_to_aggregate) to {workers} (the number of workers in cluster.worker)"
                    ),
                ),
            ));
        }
        Ok(())
    }

    fn validate_model(&self) -> Result<(), ConfigError> {
        if !(0.0..1.0).contains(&self.model.dropout) {
            return Err(self.bad(
                "model.dropout",
                invalid(
                    self.model.dropout,
                    "a probability in [0, 1) (tf.nn.dropout's rate; 0: none)",
                ),
            ));
        }
        if let Some(hidden) = &self.model.hidden {
            if self.model.layers != ModelConfig::default().layers {
                return Err(self.bad(
                    "model.hidden",
                    format!(
                        "is set together with model.layers = {:?}: expected one of them \
                         (hidden: the data gives the input width and the classes)",
                        self.model.layers
                    ),
                ));
            }
            if let Some(i) = hidden.iter().position(|&w| w == 0) {
                return Err(self.bad(
                    &format!("model.hidden[{i}]"),
                    invalid(0, "a positive width"),
                ));
            }
        }
        let layers = &self.model.layers;
        if layers.len() < 2 {
            return Err(self.bad(
                "model.layers",
                format!(
                    "invalid value {layers:?}: expected at least 2 widths (input first, classes last), \
                     e.g. [784, 500, 10]"
                ),
            ));
        }
        if let Some(i) = layers.iter().position(|&w| w == 0) {
            return Err(self.bad(
                &format!("model.layers[{i}]"),
                invalid(0, "a positive width"),
            ));
        }
        self.validate_partitioner()
    }

    /// `model.partitioner` and the keys each kind reads.
    fn validate_partitioner(&self) -> Result<(), ConfigError> {
        let m = &self.model;
        match m.partitioner {
            Partitioner::Fixed if m.partitions == 0 => Err(self.bad(
                "model.partitions",
                invalid(0, "a positive number of parts for partitioner = \"fixed\""),
            )),
            Partitioner::None | Partitioner::MinSize if m.partitions != 0 => Err(self.bad(
                "model.partitions",
                format!(
                    "is {} but only partitioner = \"fixed\" reads it: expected \
                     model.partitioner = \"fixed\", or no model.partitions",
                    m.partitions
                ),
            )),
            Partitioner::MinSize if m.min_shard_bytes == 0 => Err(self.bad(
                "model.min_shard_bytes",
                invalid(0, "a positive byte count (TensorFlow's default: 262144)"),
            )),
            _ => Ok(()),
        }
    }

    /// `[data]`: an empty `dir` would silently mean the working directory;
    /// each format needs its path keys.
    fn validate_data(&self) -> Result<(), ConfigError> {
        let d = &self.data;
        if d.dir.as_os_str().is_empty() {
            return Err(self.bad("data.dir", "is empty: expected a path".into()));
        }
        let needed: &[(&str, &Option<std::path::PathBuf>)] = match d.format {
            DataFormat::Idx => &[],
            DataFormat::Npz => &[("data.path", &d.path)],
            // No data.test: the seeded data.test_fraction split of data.train.
            DataFormat::Csv => &[("data.train", &d.train)],
            DataFormat::Recbole => &[],
            DataFormat::Criteo => &[("data.path", &d.path)],
        };
        for (key, value) in needed {
            if value.as_ref().is_none_or(|p| p.as_os_str().is_empty()) {
                return Err(self.bad(
                    "data.format",
                    format!(
                        "is {:?}, which needs {key} (a file path), and {key} is not set",
                        d.format
                    ),
                ));
            }
        }
        if d.format == DataFormat::Csv && d.label.trim().is_empty() {
            return Err(self.bad(
                "data.label",
                "is empty: expected the name of the CSV column holding the class index".into(),
            ));
        }
        if !(d.test_fraction > 0.0 && d.test_fraction < 1.0) {
            return Err(self.bad(
                "data.test_fraction",
                format!(
                    "is {}: expected a share of the examples above 0 and below 1 (0.2: 80/20)",
                    d.test_fraction
                ),
            ));
        }
        let one = d.delimiter.as_bytes();
        let bad_byte = |b: u8| !b.is_ascii() || matches!(b, b'"' | b'\n' | b'\r');
        if d.delimiter != crate::config::AUTO_DELIMITER && (one.len() != 1 || bad_byte(one[0])) {
            return Err(self.bad(
                "data.delimiter",
                format!(
                    "is {:?}: expected \"auto\" (the header line's comma, tab or semicolon) \
                     or one ASCII character other than a quote or a newline: \",\", \"\\t\", \
                     \";\", \"|\"",
                    d.delimiter
                ),
            ));
        }
        if let Some(t) = d.threshold.filter(|t| !t.is_finite()) {
            return Err(self.bad(
                "data.threshold",
                format!("is {t}: expected a finite number (RecBole's ratings: 4.0)"),
            ));
        }
        Ok(())
    }

    /// Puts the data's shape into the model: with `model.hidden`, the widths
    /// become `[features, hidden…, classes]`; with `model.layers` alone, its
    /// first width must be the data's and its last hold every class.
    /// `data` names the data set in errors.
    ///
    /// Errors: [`ConfigError::Key`] naming `model.layers[i]` (a mismatch) or
    /// `model.layers`/`train.batch_size` (the resolved model does not fit).
    pub fn resolve_layers(
        &mut self,
        features: usize,
        classes: usize,
        data: &str,
    ) -> Result<(), ConfigError> {
        if let Some(hidden) = &self.model.hidden {
            let mut layers = vec![features];
            layers.extend(hidden);
            layers.push(classes);
            self.model.layers = layers;
            return self.check_fits(memory_bytes());
        }
        let layers = &self.model.layers;
        let last = layers.len() - 1;
        if layers[0] != features {
            return Err(self.bad(
                "model.layers[0]",
                format!(
                    "is {}, but the data ({data}) has {features} features per row: expected \
                     {features}, or give only the hidden widths as model.hidden",
                    layers[0]
                ),
            ));
        }
        if layers[last] < classes {
            return Err(self.bad(
                &format!("model.layers[{last}]"),
                format!(
                    "is {}, but the data ({data}) has labels up to {}: expected at least \
                     {classes} classes, or give only the hidden widths as model.hidden",
                    layers[last],
                    classes - 1
                ),
            ));
        }
        Ok(())
    }

    /// `[checkpoint]`: a directory and positive counts.
    fn validate_checkpoint(&self) -> Result<(), ConfigError> {
        let c = &self.checkpoint;
        if c.dir.as_os_str().is_empty() {
            return Err(self.bad("checkpoint.dir", "is empty: expected a path".into()));
        }
        if let Some(secs) = c.save_secs {
            if secs < 1 {
                return Err(self.bad(
                    "checkpoint.save_secs",
                    invalid(secs, "a positive number of seconds"),
                ));
            }
            // TensorFlow's RunConfig refuses both too: which would win is a guess.
            if c.save_steps > 0 {
                return Err(self.bad(
                    "checkpoint.save_secs",
                    format!(
                        "is set ({secs}) and so is checkpoint.save_steps ({}) (from {}): \
                         expected one of them; remove checkpoint.save_secs to save every \
                         {} steps, or set checkpoint.save_steps = 0 to save by time",
                        c.save_steps,
                        self.sources.origin("checkpoint.save_steps"),
                        c.save_steps
                    ),
                ));
            }
        }
        if c.max_to_keep < 1 {
            return Err(self.bad(
                "checkpoint.max_to_keep",
                invalid(c.max_to_keep, "a positive integer"),
            ));
        }
        let max = super::schema::MAX_CHECKPOINT_FULL_EVERY;
        if !(1..=max).contains(&c.full_every) {
            return Err(self.bad(
                "checkpoint.full_every",
                invalid(
                    c.full_every,
                    &format!("an integer from 1 (every checkpoint whole) to {max}"),
                ),
            ));
        }
        Ok(())
    }

    /// `[eval]`: at least one best checkpoint kept (the metric's names are
    /// checked by its type), and an AUC metric only for a model that has an
    /// AUC (wide & deep).
    fn validate_eval(&self) -> Result<(), ConfigError> {
        if self.eval.keep_best < 1 {
            return Err(self.bad(
                "eval.keep_best",
                invalid(self.eval.keep_best, "a positive integer"),
            ));
        }
        let metric = self.eval.metric;
        if metric.binary_only() && self.model.kind != ModelKind::WideDeep {
            return Err(self.bad(
                "eval.metric",
                format!(
                    "\"{}\" is a binary model's score (model.kind = \"wide_deep\"); the MLP's \
                     are \"ema_accuracy\", \"accuracy\" and \"loss\" (a regression model's: \
                     \"ema_rmse\", \"rmse\", \"loss\")",
                    metric.name()
                ),
            ));
        }
        Ok(())
    }

    /// `[security]`: a token path, and the TLS paths all set or none.
    fn validate_security(&self) -> Result<(), ConfigError> {
        if self.security.token_file.as_os_str().is_empty() {
            return Err(self.bad("security.token_file", "is empty: expected a path".into()));
        }
        let tls = self.tls_paths();
        for (key, path) in tls {
            if path.is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(self.bad(key, "is empty: expected a path (or leave it out)".into()));
            }
        }
        if let Some((unset, _)) = tls.iter().find(|(_, p)| p.is_none())
            && let Some((set, _)) = tls.iter().find(|(_, p)| p.is_some())
        {
            return Err(self.bad(
                set,
                format!(
                    "is set but {unset} is not: TLS needs all of security.tls_cert, \
                     security.tls_key and security.tls_ca (or none of them)"
                ),
            ));
        }
        Ok(())
    }

    /// `[ps]`: a snapshot interval of at most a day (0: off), and a
    /// directory that is absolute when given.
    fn validate_ps(&self) -> Result<(), ConfigError> {
        let secs = self.ps.snapshot_secs;
        if secs > MAX_SNAPSHOT_SECS {
            return Err(self.bad(
                "ps.snapshot_secs",
                invalid(
                    secs,
                    &format!("an integer from 0 (off) to {MAX_SNAPSHOT_SECS}"),
                ),
            ));
        }
        let every = self.ps.snapshot_full_every;
        if !(1..=super::schema::MAX_SNAPSHOT_FULL_EVERY).contains(&every) {
            return Err(self.bad(
                "ps.snapshot_full_every",
                invalid(
                    every,
                    &format!(
                        "an integer from 1 (every snapshot whole) to {}",
                        super::schema::MAX_SNAPSHOT_FULL_EVERY
                    ),
                ),
            ));
        }
        let dir = &self.ps.snapshot_dir;
        if !dir.is_empty() && !std::path::Path::new(dir).is_absolute() {
            return Err(self.bad(
                "ps.snapshot_dir",
                invalid(
                    format_args!("{dir:?}"),
                    "an absolute path (or \"\" for the state directory)",
                ),
            ));
        }
        Ok(())
    }

    /// `[metrics]`: empty (off) or an address.
    fn validate_metrics(&self) -> Result<(), ConfigError> {
        let listen = &self.metrics.listen;
        if !listen.is_empty()
            && let Err(why) = check_address(listen)
        {
            return Err(self.bad(
                "metrics.listen",
                format!("invalid address {listen:?}: {why} (or \"\" for off)"),
            ));
        }
        Ok(())
    }

    /// `[log]`: a filter whose bare words are levels.
    fn validate_log(&self) -> Result<(), ConfigError> {
        if let Err(why) = check_log_filter(&self.log.level) {
            return Err(self.bad(
                "log.level",
                format!("invalid value {:?}: {why}", self.log.level),
            ));
        }
        Ok(())
    }
}

/// The largest `train.batch_size`: a worker holds a batch's activations for
/// every layer, and no data set dtf reads has more examples than this.
pub const MAX_BATCH_SIZE: usize = 1_000_000;

/// `model.kind = "wide_deep"`'s learning rate when none is set (TensorFlow's
/// wide & deep program's Adagrad).
pub const WIDE_DEEP_LEARNING_RATE: f32 = 0.05;

/// `model.kind = "wide_deep"`'s batch size when none is set.
pub const WIDE_DEEP_BATCH_SIZE: usize = 256;

/// `model.kind = "wide_deep"`'s hidden widths when neither `model.hidden` nor
/// `model.layers` is set.
pub const WIDE_DEEP_HIDDEN: [usize; 2] = [64, 32];

/// The largest `train.learning_rate`. The reference program uses 0.8; plain
/// SGD far above that sends every variable to infinity within steps (1e30
/// did at once), which the ps would then serve to every worker.
pub const MAX_LEARNING_RATE: f32 = 10.0;

/// The largest `train.regularization_rate` (the reference uses 1e-4): at 1,
/// the L2 term already outweighs any cross-entropy gradient.
pub const MAX_REGULARIZATION_RATE: f32 = 1.0;

/// The largest integer a TOML file holds (an i64), so the largest a dtf.toml can say.
const TOML_MAX: u64 = i64::MAX as u64;

/// The longest `ps.snapshot_secs`: a day. Beyond it a snapshot would be
/// older than any checkpoint, which the ps then prefers anyway.
pub const MAX_SNAPSHOT_SECS: u64 = 86_400;

/// `invalid value <value>: expected <expected>`, the shape of every range error.
fn invalid(value: impl fmt::Display, expected: &str) -> String {
    format!("invalid value {value}: expected {expected}")
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
mod tests;
