//! Where a configuration comes from: figment layering (built-in defaults →
//! file → `DTF_…` environment → `TF_CONFIG`'s cluster → the daemon's command
//! line), which file a daemon reads (none, launched TensorFlow's way), and
//! which task this process is (`--task N`, or `TF_CONFIG`'s task).

use super::error::{ConfigError, FileProblem};
use super::origin::{ENV_PREFIX, Sources, TF_CONFIG, describe_origin, figment_error};
use super::schema::{Config, leaves};
use super::secret::{MAX_CONFIG_FILE_BYTES, read_regular};
use super::task::{Role, TaskId};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::Deserialize;
use std::path::{Path, PathBuf};

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
    /// if the file cannot be read, is not a regular file (a FIFO would block,
    /// `/dev/zero` never end) or is over [`MAX_CONFIG_FILE_BYTES`];
    /// [`ConfigError::Syntax`] if it is not TOML.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Config::load_file(Some(path))
    }

    /// As [`Config::load`], the daemon's command line ([`set_command_line`])
    /// last; `None`: no file at all (a task launched TensorFlow's way, see
    /// [`daemon_file`]), every key the layers above leave unset at its
    /// built-in default.
    ///
    /// Errors: as [`Config::load`].
    pub fn load_file(file: Option<&Path>) -> Result<Self, ConfigError> {
        let command_line = COMMAND_LINE.get().map_or(&[][..], Vec::as_slice);
        Config::load_layers(file, command_line)
    }

    /// Defaults → `file` → `DTF_…` environment → `TF_CONFIG`'s cluster →
    /// `command_line`, then [`Config::validate`].
    ///
    /// Errors: as [`Config::load`].
    fn load_layers(file: Option<&Path>, command_line: &[Override]) -> Result<Self, ConfigError> {
        // Read the file ourselves rather than with `Toml::file`: that one
        // treats a missing file as empty and searches parent directories for
        // a relative path, neither of which a daemon should do.
        let (text, origin) = match file {
            Some(path) => (read_config_text(path)?, path.display().to_string()),
            None => (String::new(), NO_FILE_ORIGIN.to_owned()),
        };
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
        let figment = command_line.iter().fold(figment, |f, o| f.merge(o));
        extract(&figment, &origin)
    }

    /// Defaults → `file` (when given) → `DTF_<SECTION>__<KEY>` environment →
    /// `overrides` in order, then [`Config::validate`]: `dtf local`'s flags
    /// (`--optimizer`, `--set section.key=value`) over what a daemon would read.
    /// A value is parsed as the environment's are (`0.1` a float, `[64, 32]`
    /// an array, `adam` a string); errors name the override's flag.
    ///
    /// Errors: as [`Config::load`]; [`ConfigError::Key`] naming the flag for
    /// an override that is not a key or not a valid value.
    pub fn load_with(file: Option<&Path>, overrides: &[Override]) -> Result<Self, ConfigError> {
        let (text, origin) = match file {
            Some(path) => (read_config_text(path)?, path.display().to_string()),
            None => (String::new(), "the command line".to_owned()),
        };
        let mut figment = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(&text))
            .merge(
                Env::prefixed(ENV_PREFIX)
                    .filter(|key| key.as_str().contains("__"))
                    .split("__"),
            );
        for o in overrides {
            figment = figment.merge(o);
        }
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

    /// Loads `file` with the daemon's `command_line` over every other layer
    /// (as [`Config::load_file`] does once [`set_command_line`] has them)
    /// for the `role` daemon, and resolves which task this process is:
    /// `task` (the command line's `--task N`), else `TF_CONFIG`'s task, which
    /// must be of `role`.
    ///
    /// Errors: as [`Config::load`]; [`ConfigError::WrongRole`],
    /// [`ConfigError::NoTask`], or [`ConfigError::Task`] for an index
    /// outside the cluster.
    pub fn load_task(
        file: Option<&Path>,
        command_line: &[Override],
        task: Option<usize>,
        role: Role,
    ) -> Result<(Config, TaskId), ConfigError> {
        let cfg = Config::load_layers(file, command_line)?;
        let index = match (task, task_from_env()?) {
            (Some(i), _) => i,
            (None, Some(t)) if t.role == role => t.index,
            // One evaluator per cluster: nothing to choose between.
            (None, None) if role == Role::Evaluator => 0,
            (None, Some(t)) => {
                return Err(ConfigError::WrongRole {
                    named: t.role,
                    daemon: role,
                });
            }
            (None, None) => return Err(ConfigError::NoTask),
        };
        let id = TaskId { role, index };
        cfg.check_task(id)?;
        Ok((cfg, id))
    }
}

/// The daemon's own command-line keys (`--ps_hosts`), over every layer of
/// every [`Config::load`] of this process: set once, at start, so a reload
/// of the file keeps them.
static COMMAND_LINE: std::sync::OnceLock<Vec<Override>> = std::sync::OnceLock::new();

/// Sets the keys the daemon's command line gave ([`COMMAND_LINE`]); a
/// second call changes nothing (a process has one command line).
pub fn set_command_line(overrides: Vec<Override>) {
    let _ = COMMAND_LINE.set(overrides);
}

/// How errors name the configuration when there is no file: the keys not
/// set elsewhere are the defaults of a task launched with flags alone.
const NO_FILE_ORIGIN: &str = "the command line";

/// The spelling of "no configuration file" for `--config` and
/// `DTF_CONFIG`: the Unix idiom, and what a test uses to be sure no
/// `/etc/dtf/dtf.toml` of the host is read.
pub const NO_FILE: &str = "/dev/null";

/// Which configuration file a daemon reads, `None` for none:
///
/// - the one `named` by `--config` or `DTF_CONFIG`, which must exist; [`NO_FILE`]
///   names none;
/// - else `default` (`/etc/dtf/dtf.toml`), unless it does not exist and the
///   cluster comes from the `command_line` (`--ps_hosts`, `--worker_hosts`) or
///   `TF_CONFIG`: TensorFlow's way of launching a task, where there is no
///   file and every other key takes its default (or a `DTF_…` variable's value).
///
/// Only a file that does not exist is left out: one that cannot be read
/// (permissions, a dangling link) is still read, and its error reported.
///
/// Errors: [`ConfigError::NoFile`] when `default` does not exist and nothing
/// else gives the cluster.
pub fn daemon_file(
    named: Option<&Path>,
    command_line: &[Override],
    default: &Path,
) -> Result<Option<PathBuf>, ConfigError> {
    // A cluster from the command line, or a TF_CONFIG that names one (not merely a task).
    let cluster_given = || {
        command_line.iter().any(|o| o.key.starts_with("cluster."))
            || std::env::var(TF_CONFIG).is_ok_and(|t| {
                serde_json::from_str::<serde_json::Value>(&t)
                    .is_ok_and(|v| v.get("cluster").is_some())
            })
    };
    if let Some(path) = named {
        if path != Path::new(NO_FILE) {
            return Ok(Some(path.to_owned()));
        }
        // No file at all: the cluster must come from somewhere, or the daemon would
        // start on the built-in 127.0.0.1 addresses.
        return if cluster_given() {
            Ok(None)
        } else {
            Err(ConfigError::NoCluster)
        };
    }
    let absent = matches!(
        default.symlink_metadata(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound
    );
    if !absent {
        return Ok(Some(default.to_owned()));
    }
    if cluster_given() {
        Ok(None)
    } else {
        Err(ConfigError::NoFile {
            path: default.to_owned(),
        })
    }
}

/// The text of the configuration file at `path`: a regular file of at most
/// [`MAX_CONFIG_FILE_BYTES`], UTF-8; [`NO_FILE`] reads as empty.
///
/// Errors: [`ConfigError::Read`].
fn read_config_text(path: &Path) -> Result<String, ConfigError> {
    if path == Path::new(NO_FILE) {
        return Ok(String::new());
    }
    read_regular(path, MAX_CONFIG_FILE_BYTES, false)
        .and_then(|bytes| {
            String::from_utf8(bytes).map_err(|e| FileProblem::Io {
                action: "read",
                error: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            })
        })
        .map_err(|problem| ConfigError::Read {
            path: path.to_owned(),
            problem,
        })
}

/// One key set on a command line (`--set train.optimizer=adam`, or a flag
/// such as `--optimizer adam` that stands for its key).
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The dotted key, `section.key` (`section.table.key` in a sub-table).
    pub key: String,
    /// The value as typed; parsed as the environment's values are.
    pub value: String,
    /// What set it, for errors: `--optimizer`, `--set train.optimizer=adam`.
    pub flag: String,
}

impl Override {
    /// `section.key=value` as `--set` takes it.
    ///
    /// Errors: a sentence saying what a `--set` argument must look like.
    pub fn parse_set(arg: &str) -> Result<Self, String> {
        let (key, value) = arg.split_once('=').ok_or_else(|| {
            format!("{arg:?} has no '=': expected section.key=value, e.g. train.optimizer=adam")
        })?;
        let key = key.trim();
        // `section.key`, or `section.table.key` for a sub-table (`model.tables.max_rows`).
        let well_formed =
            (2..=3).contains(&key.split('.').count()) && key.split('.').all(|p| !p.is_empty());
        if !well_formed {
            return Err(format!(
                "{key:?} is not a key: expected section.key=value, e.g. train.learning_rate=0.1"
            ));
        }
        Ok(Override {
            key: key.to_owned(),
            value: value.trim().to_owned(),
            flag: format!("--set {arg}"),
        })
    }

    /// `key` set to the string `value` by `flag` (a path, say): quoted, so a
    /// value that looks like a number, a boolean or an array stays a string.
    pub fn string(key: &str, value: &str, flag: String) -> Self {
        Override {
            key: key.to_owned(),
            value: format!("{value:?}"),
            flag,
        }
    }

    /// What a shell reads back as this override: `--set key=value`.
    pub fn as_set(&self) -> String {
        format!("{}={}", self.key, self.value)
    }
}

impl Provider for &Override {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.flag.clone())
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let value: Value = self
            .value
            .parse()
            .unwrap_or_else(|e: std::convert::Infallible| match e {});
        Serialized::default(&self.key, value).data()
    }
}

/// The task named by `TF_CONFIG` (`{"task": {"type": "worker", "index": 1}}`), if set.
///
/// With a `chief` list in the cluster, the chief is worker 0 and `worker` i
/// is worker i + (number of chiefs), matching how [`Config::load`] builds
/// `cluster.worker`. Task types are `chief`, `worker`, `ps` and `evaluator`.
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
        "evaluator" => TaskId {
            role: Role::Evaluator,
            index: task.index,
        },
        other => {
            return Err(ConfigError::Key {
                origin: TF_CONFIG.into(),
                key: "task.type".into(),
                problem: format!(
                    "invalid value {other:?}: expected \"chief\", \"worker\", \"ps\" or \"evaluator\""
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
    /// TensorFlow 1.x's older name for the chief; read only to refuse a
    /// second chief, which would leave two tasks each thinking it is worker 0.
    #[serde(default)]
    master: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct TfTask {
    #[serde(rename = "type")]
    kind: String,
    index: usize,
}

/// Parses `TF_CONFIG`, refusing more than one chief.
///
/// Errors: [`ConfigError::Syntax`] for malformed JSON; [`ConfigError::Key`]
/// naming `TF_CONFIG` for two chiefs (`chief` and `master` count together).
fn parse_tf_config(json: &str) -> Result<TfConfig, ConfigError> {
    let tf: TfConfig = parse_tf_json(json)?;
    if let Some(cluster) = &tf.cluster {
        let chiefs: Vec<&String> = cluster.chief.iter().chain(&cluster.master).collect();
        if chiefs.len() > 1 {
            let key = if cluster.chief.len() > 1 {
                "cluster.chief"
            } else {
                "cluster.master"
            };
            return Err(ConfigError::Key {
                origin: TF_CONFIG.into(),
                key: key.into(),
                problem: format!(
                    "{} chiefs {chiefs:?} (cluster.chief and cluster.master together): \
                     expected at most one chief, the task that is worker 0",
                    chiefs.len()
                ),
            });
        }
    }
    Ok(tf)
}

fn parse_tf_json(json: &str) -> Result<TfConfig, ConfigError> {
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
    config.kind_defaults();
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_util::*;
    use crate::config::*;

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
    }

    #[test]
    fn load_takes_the_cluster_and_task_from_tf_config() {
        let _env = env_lock();
        let (_dir, path) = write_config("[train]\nlast_step = 50\nbatch_size = 32\n");

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
        remove_env("TF_CONFIG");
    }

    #[test]
    fn a_malformed_tf_config_or_task_is_an_error_naming_it() {
        let _env = env_lock();
        let (_dir, path) = write_config("[train]\nlast_step = 50\nbatch_size = 32\n");
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
        assert_eq!(
            task_from_env().unwrap(),
            Some(TaskId {
                role: Role::Evaluator,
                index: 0
            })
        );
        set_env("TF_CONFIG", r#"{"task": {"type": "master", "index": 0}}"#);
        let err = task_from_env().unwrap_err().to_string();
        assert!(err.contains("task.type") && err.contains("master"), "{err}");

        remove_env("TF_CONFIG");
        assert_eq!(task_from_env().unwrap(), None);
        assert_eq!(
            Config::load(&path).unwrap().cluster,
            ClusterConfig::default()
        );
    }

    #[test]
    fn a_fifo_or_dev_zero_as_config_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dtf.toml");
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains("FIFO") && err.contains("dtf.toml"), "{err}");
        let err = Config::load(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/dev/zero") && err.contains("character device"),
            "{err}"
        );
        let (_dir, big) = write_config(&"#".repeat(MAX_CONFIG_FILE_BYTES as usize + 1));
        let err = Config::load(&big).unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
    }

    #[test]
    fn tf_config_with_two_chiefs_is_refused() {
        for (json, key) in [
            (
                r#"{"cluster": {"chief": ["c:1", "c:2"], "ps": ["p:1"]}, "task": {"type": "chief", "index": 1}}"#,
                "cluster.chief",
            ),
            (
                r#"{"cluster": {"chief": ["c:1"], "master": ["m:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}"#,
                "cluster.master",
            ),
        ] {
            let err = task_from_tf_config(json).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("TF_CONFIG: {key}: 2 chiefs")),
                "{err}"
            );
            let _env = env_lock();
            let (_dir, path) = write_config("");
            set_env("TF_CONFIG", json);
            let err = Config::load(&path).unwrap_err().to_string();
            remove_env("TF_CONFIG");
            assert!(err.starts_with("TF_CONFIG: "), "{err}");
        }
    }
}
