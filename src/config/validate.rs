//! Validation: one function per section, each returning the first bad key
//! as a [`ConfigError::Key`] that names it, where its value came from, and
//! what would be right.

use super::error::ConfigError;
use super::schema::{Config, DataFormat, ModelConfig, Role, TaskId};
use super::size::memory_bytes;
use std::collections::BTreeMap;
use std::fmt;

impl Config {
    /// Checks values and cross-key rules (ranges, duplicate addresses, sync replica counts).
    ///
    /// Errors: [`ConfigError::Key`] for the first bad key, naming where it came from.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_cluster()?;
        self.validate_train()?;
        self.validate_optimizer()?;
        self.validate_sync()?;
        self.validate_model()?;
        self.check_fits(memory_bytes())?;
        self.validate_data()?;
        self.validate_checkpoint()?;
        self.validate_eval()?;
        self.validate_security()?;
        self.validate_metrics()?;
        self.validate_log()
    }

    /// Errors unless `task` indexes an address of its role.
    ///
    /// Errors: [`ConfigError::Task`], naming the list and where it came from.
    pub fn check_task(&self, task: TaskId) -> Result<(), ConfigError> {
        let (key, list) = self.addresses(task.role);
        // The evaluator has no address: a cluster has one, task 0 (TF's
        // `evaluator` task type, whose index is always 0 too).
        let count = if task.role == Role::Evaluator {
            1
        } else {
            list.len()
        };
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
                return Err(self.bad(
                    key,
                    "is empty: expected at least one host:port address".into(),
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
        ] {
            if value < 1 {
                return Err(self.bad(key, invalid(value, "a positive integer")));
            }
        }
        Ok(())
    }

    /// The optimizers' hyperparameters, every one of them whichever optimizer
    /// is chosen: a bad value is a mistake even where it is not used yet.
    fn validate_optimizer(&self) -> Result<(), ConfigError> {
        let t = &self.train;
        // A decay of 1 or more never forgets (Adam's bias correction then
        // divides by zero); below 0 it oscillates.
        for (key, value) in [
            ("train.momentum", t.momentum),
            ("train.beta1", t.beta1),
            ("train.beta2", t.beta2),
        ] {
            if !(0.0..1.0).contains(&value) {
                return Err(self.bad(key, invalid(value, "a number in [0, 1)")));
            }
        }
        // Adam divides by `√v + epsilon` with `v` starting at 0, Adagrad by
        // `√accum`: either at 0 divides zero by zero on a zero gradient.
        for (key, value) in [
            ("train.epsilon", t.epsilon),
            (
                "train.initial_accumulator_value",
                t.initial_accumulator_value,
            ),
        ] {
            if !(value > 0.0 && value.is_finite()) {
                return Err(self.bad(key, invalid(value, "a finite number above 0")));
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
                invalid(replicas, &format!("1 to {workers} (the number of workers)")),
            ));
        }
        let total = self.total_num_replicas();
        if !(replicas..=workers).contains(&total) {
            return Err(self.bad(
                "train.total_num_replicas",
                invalid(
                    total,
                    &format!(
                        "{replicas} (train.replicas_to_aggregate) to {workers} (the number of workers)"
                    ),
                ),
            ));
        }
        Ok(())
    }

    /// `[model]`: at least two widths, none zero; `hidden` only without `layers`.
    fn validate_model(&self) -> Result<(), ConfigError> {
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
        Ok(())
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
            DataFormat::Csv => &[("data.train", &d.train), ("data.test", &d.test)],
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
        Ok(())
    }

    /// `[eval]`: at least one best checkpoint kept (the metric's names are
    /// checked by its type).
    fn validate_eval(&self) -> Result<(), ConfigError> {
        if self.eval.keep_best < 1 {
            return Err(self.bad(
                "eval.keep_best",
                invalid(self.eval.keep_best, "a positive integer"),
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

/// The largest `train.learning_rate`. The reference program uses 0.8; plain
/// SGD far above that sends every variable to infinity within steps (1e30
/// did at once), which the ps would then serve to every worker.
pub const MAX_LEARNING_RATE: f32 = 10.0;

/// The largest `train.regularization_rate` (the reference uses 1e-4): at 1,
/// the L2 term already outweighs any cross-entropy gradient.
pub const MAX_REGULARIZATION_RATE: f32 = 1.0;

/// The endpoints a valid `host:port` names, for the duplicate check: an IP
/// literal as its socket address (`[::ffff:127.0.0.1]` and `127.0.0.1` are
/// one), `localhost` as both loopback addresses, any other name as itself,
/// lowercased (DNS names are case-insensitive).
///
/// Other names are not resolved: validation runs in `check-config` and at
/// every start and reload, and a resolver that waits on an unreachable DNS
/// server would hang it. Two different names for one host are not caught;
/// the second task then fails to bind, naming its address.
fn endpoints(address: &str) -> Vec<String> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let Some((host, port)) = address.rsplit_once(':') else {
        return vec![address.to_owned()];
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let socket = |ip: IpAddr| {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        port.parse().map_or_else(
            |_| address.to_owned(),
            |p| SocketAddr::new(ip, p).to_string(),
        )
    };
    if let Ok(ip) = bare.parse::<IpAddr>() {
        vec![socket(ip)]
    } else if bare.eq_ignore_ascii_case("localhost") {
        vec![
            socket(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            socket(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        ]
    } else {
        vec![address.to_ascii_lowercase()]
    }
}

/// `invalid value <value>: expected <expected>`, the shape of every range error.
fn invalid(value: impl fmt::Display, expected: &str) -> String {
    format!("invalid value {value}: expected {expected}")
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
    use crate::config::test_util::*;

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
            ("[train]\nmomentum = 1.0", "train.momentum"),
            ("[train]\nmomentum = -0.1", "train.momentum"),
            ("[train]\nbeta1 = 1.0", "train.beta1"),
            ("[train]\nbeta2 = nan", "train.beta2"),
            ("[train]\nepsilon = 0.0", "train.epsilon"),
            (
                "[train]\ninitial_accumulator_value = 0.0",
                "train.initial_accumulator_value",
            ),
            (
                "[train]\ninitial_accumulator_value = inf",
                "train.initial_accumulator_value",
            ),
            ("[model]\nlayers = [784]", "model.layers"),
            ("[model]\nlayers = [784, 0, 10]", "model.layers[1]"),
            ("[cluster]\nps = []", "cluster.ps"),
            ("[cluster]\nworker = []", "cluster.worker"),
            ("[checkpoint]\nsave_secs = 0", "checkpoint.save_secs"),
            ("[checkpoint]\nmax_to_keep = 0", "checkpoint.max_to_keep"),
            (
                "[checkpoint]\nsave_secs = 10\nsave_steps = 100",
                "checkpoint.save_steps",
            ),
            ("[eval]\nkeep_best = 0", "eval.keep_best"),
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
    fn optimizers_take_tensorflow_defaults_and_their_keys() {
        use crate::optimizer::Optimizer;
        let default = Config::from_toml_str("", "f").unwrap();
        assert_eq!(default.train.optimizer(), Optimizer::Sgd);
        let adam = Config::from_toml_str("[train]\noptimizer = \"adam\"\n", "f").unwrap();
        assert_eq!(
            adam.train.optimizer(),
            Optimizer::Adam {
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8
            }
        );
        let momentum = Config::from_toml_str(
            "[train]\noptimizer = \"momentum\"\nmomentum = 0.5\nuse_nesterov = true\n",
            "f",
        )
        .unwrap();
        assert_eq!(
            momentum.train.optimizer(),
            Optimizer::Momentum {
                momentum: 0.5,
                use_nesterov: true
            }
        );
        let adagrad = Config::from_toml_str("[train]\noptimizer = \"adagrad\"\n", "f").unwrap();
        assert_eq!(
            adagrad.train.optimizer(),
            Optimizer::Adagrad {
                initial_accumulator_value: 0.1
            }
        );
        let err = Config::from_toml_str("[train]\noptimizer = \"rmsprop\"\n", "f")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("train.optimizer") || err.contains("rmsprop"),
            "{err}"
        );
        assert!(err.contains("adam"), "the error lists the choices: {err}");
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
    fn a_huge_learning_rate_is_refused_naming_the_range() {
        let err = error_for("[train]\nlearning_rate = 1e30", "train.learning_rate");
        assert!(err.contains("expected a number in (0, 10]"), "{err}");
        let err = error_for(
            "[train]\nregularization_rate = 1e30",
            "train.regularization_rate",
        );
        assert!(err.contains("[0, 1]"), "{err}");
        let err = error_for(
            "[train]\nlearning_rate = 5.0\nregularization_rate = 0.5",
            "train.regularization_rate",
        );
        assert!(err.contains("train.learning_rate = 5"), "{err}");
        Config::from_toml_str(
            "[train]\nlearning_rate = 0.8\nregularization_rate = 0.0001",
            "/f",
        )
        .unwrap();
    }

    #[test]
    fn localhost_and_127_0_0_1_on_one_port_are_a_duplicate() {
        let err = error_for(
            "[cluster]\nps = [\"localhost:7000\"]\nworker = [\"127.0.0.1:7000\"]\n",
            "cluster.worker[0]",
        );
        assert!(
            err.contains("also cluster.ps[0], \"localhost:7000\", the same endpoint"),
            "{err}"
        );
        for (a, b) in [
            ("[::1]:7000", "localhost:7000"),
            ("[::ffff:10.0.0.1]:7000", "10.0.0.1:7000"),
            ("Host-A:7000", "host-a:7000"),
        ] {
            error_for(
                &format!("[cluster]\nps = [\"{a}\"]\nworker = [\"{b}\"]\n"),
                "cluster.worker[0]",
            );
        }
        Config::from_toml_str(
            "[cluster]\nps = [\"localhost:7000\"]\nworker = [\"127.0.0.1:7001\"]\n",
            "/f",
        )
        .unwrap();
    }

    #[test]
    fn hidden_widths_take_the_data_shape_and_layers_must_fit_it() {
        let mut c = Config::from_toml_str("[model]\nhidden = [32, 16]\n", "f").unwrap();
        c.resolve_layers(20, 3, "d").unwrap();
        assert_eq!(c.model.layers, [20, 32, 16, 3]);
        error_for("[model]\nhidden = [32, 0]\n", "model.hidden[1]");
        error_for("[model]\nhidden = [32]\nlayers = [5, 3]\n", "model.hidden");

        let mut c = Config::from_toml_str("[model]\nlayers = [20, 8, 3]\n", "f").unwrap();
        c.resolve_layers(20, 2, "d").unwrap();
        let err = c.resolve_layers(21, 3, "the npz").unwrap_err().to_string();
        assert!(
            err.contains("model.layers[0]") && err.contains("21 features"),
            "{err}"
        );
        let err = c.resolve_layers(20, 5, "d").unwrap_err().to_string();
        assert!(
            err.contains("model.layers[2]") && err.contains("labels up to 4"),
            "{err}"
        );
    }

    #[test]
    fn each_data_format_needs_its_paths() {
        error_for("[data]\nformat = \"npz\"\n", "data.path");
        error_for("[data]\nformat = \"csv\"\ntrain = \"a.csv\"\n", "data.test");
        error_for(
            "[data]\nformat = \"csv\"\ntrain = \"a\"\ntest = \"b\"\nlabel = \"\"\n",
            "data.label",
        );
        Config::from_toml_str("[data]\nformat = \"npz\"\npath = \"x.npz\"\n", "f").unwrap();
    }
}
