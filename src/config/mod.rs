//! The cluster configuration: `/etc/dtf/dtf.toml`, layered with figment
//! (built-in defaults → file → `DTF_…` environment → command line), plus
//! `TF_CONFIG`. Validation, and what may change on reload.
//!
//! Its rooms, along the seams a change usually follows:
//!
//! - `schema` — the sections and keys, with their defaults.
//! - `task` — [`Role`] and [`TaskId`]: which task a process is.
//! - `load` — figment layering, `TF_CONFIG`, which file a daemon reads (none,
//!   launched with TensorFlow's flags) and which task this process is.
//! - `origin` — where each value came from ([`Sources`], the `DTF_…` and
//!   `TF_CONFIG` names), and figment's errors turned into ones that name the
//!   key, its origin and what was expected.
//! - `validate` — one check per section; the first bad key is the error.
//! - `size` — the model-size bound: what a model and a batch need against `MemTotal`.
//! - `error` — [`ConfigError`] and [`FileProblem`]: types only, a leaf.
//! - `reload` — [`LIVE_KEYS`]: what may change while running, and what applies it.
//! - `secret` — the configuration, token and TLS files, read with a bound.
//! - `watcher` — the file's watcher: a reload when what `dtf.toml` resolves to changes.

mod error;
mod load;
mod origin;
mod reload;
mod schema;
mod secret;
mod size;
mod task;
mod validate;
pub mod watcher;

pub use error::{ConfigError, FileProblem};
pub use load::{
    NO_FILE, Override, daemon_file, set_command_line, task_from_env, task_from_tf_config,
};
pub use origin::{ENV_PREFIX, Sources, TF_CONFIG};
pub use reload::{Applier, LIVE_KEYS, LiveKey, is_live};
pub use schema::{
    AUTO_DELIMITER, CheckpointConfig, ClusterConfig, Compression, Config, DEFAULT_DATA_DIR,
    DEFAULT_PATH, DEFAULT_SAVE_SECS, DataConfig, DataFormat, EvalConfig, LogConfig, LrSchedule,
    Metric, MetricsConfig, Mode, ModelConfig, ModelKind, ModelTask, OptimizerKind, Partitioner,
    Placement, PsConfig, SecurityConfig, TableOptimizerKind, TablesConfig, TrainConfig, Transport,
    json_value,
};
pub use secret::{MAX_CONFIG_FILE_BYTES, MAX_SECRET_FILE_BYTES, read_file};
pub use size::{FALLBACK_MEMORY_BYTES, memory_bytes};
pub use task::{Role, TaskId};
pub use validate::{MAX_BATCH_SIZE, MAX_LEARNING_RATE, MAX_REGULARIZATION_RATE};

/// What the unit tests of every room share: the environment lock, temp
/// config files, and the check that an error names its key and file.
#[cfg(test)]
pub(crate) mod test_util {
    use super::Config;
    use std::path::PathBuf;
    use std::sync::{Mutex, MutexGuard};

    /// Serializes the tests that read or write the process environment
    /// (`Config::load` reads `DTF_…` and `TF_CONFIG`).
    pub fn env_lock() -> MutexGuard<'static, ()> {
        static LOCK: Mutex<()> = Mutex::new(());
        LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn set_env(key: &str, value: &str) {
        // SAFETY: only tests holding `env_lock` touch the environment, and no
        // other thread of this test binary calls into C code that reads it.
        unsafe { std::env::set_var(key, value) }
    }

    pub fn remove_env(key: &str) {
        // SAFETY: as in `set_env`.
        unsafe { std::env::remove_var(key) }
    }

    /// A config file in a fresh temp dir; keep the dir alive while using it.
    pub fn write_config(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dtf.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// The error for `text`, asserting it names `key` and the origin.
    pub fn error_for(text: &str, key: &str) -> String {
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

    pub const TWO_WORKERS: &str = "[cluster]\nps = [\"h:1\"]\nworker = [\"h:2\", \"h:3\"]\n";
}
