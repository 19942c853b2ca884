//! [`ConfigError`], and [`FileProblem`]: why a file the configuration
//! names could not be read. Types only: turning figment's errors into a
//! [`ConfigError`] is `origin`'s job.

use super::task::{Role, TaskId};
use std::path::PathBuf;

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
    /// The reason is in the message, not a `source`: printed with its
    /// chain (`{:#}`), it would otherwise say the same thing twice.
    #[error("{}: cannot read the configuration file: {problem}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        problem: FileProblem,
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
    /// `TF_CONFIG` names a task of the other role, and no `--task` was given.
    #[error("TF_CONFIG names a {named} task, but this is the dtf-{daemon} daemon (pass --task N)")]
    WrongRole {
        /// The role `TF_CONFIG`'s task has.
        named: Role,
        /// The role of the daemon that was started.
        daemon: Role,
    },
    /// A daemon's default configuration file does not exist, and neither
    /// its command line nor `TF_CONFIG` gives the cluster.
    #[error(
        "{}: no such file: give the configuration file with --config FILE (or DTF_CONFIG=FILE), \
         or launch the task as TensorFlow 1.x does, with --ps_hosts, --worker_hosts, --job_name \
         and --task_index (no file needed: every other key takes its default)",
        path.display()
    )]
    NoFile {
        /// The default path, `/etc/dtf/dtf.toml`.
        path: PathBuf,
    },
    /// `--config /dev/null` (no file), and nothing else gives the cluster.
    #[error(
        "--config /dev/null names no file, and no cluster is given: launch the task as \
         TensorFlow 1.x does, with --ps_hosts, --worker_hosts, --job_name and --task_index, \
         or set TF_CONFIG with its \"cluster\""
    )]
    NoCluster,
    /// Neither `--task` nor `TF_CONFIG` says which task this process is.
    #[error("no task index: pass --task N (TensorFlow's --task_index N) or set TF_CONFIG")]
    NoTask,
}

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileProblem {
    /// Opening, inspecting or reading it failed. (`error`, not `source`:
    /// the message already holds it; see [`ConfigError::Read`].)
    #[error("cannot {action}: {error}")]
    Io {
        /// `open`, `stat` or `read`.
        action: &'static str,
        /// The system's reason.
        error: std::io::Error,
    },
    /// A FIFO, socket, device or directory.
    #[error("it is {kind}, not a regular file: expected a file with the content")]
    NotRegular {
        /// What it is instead, e.g. `a FIFO`.
        kind: &'static str,
    },
    /// Over the size bound.
    #[error("it is larger than {limit} bytes: expected a small text file")]
    TooLarge {
        /// The bound, in bytes.
        limit: u64,
    },
    /// A secret that other users may read.
    #[error(
        "the file has mode {mode:04o}, which lets other users read a secret: \
         run `chmod 640 {path}` (readable by its owner and group only)"
    )]
    OthersMayRead {
        /// The permission bits.
        mode: u32,
        /// The file, for the command to run.
        path: String,
    },
}

#[cfg(test)]
mod tests {
    use crate::config::*;

    #[test]
    fn error_display_format() {
        let err =
            Config::from_toml_str("[train]\nbatch_size = 0\n", "/etc/dtf/dtf.toml").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/dtf/dtf.toml: train.batch_size: invalid value 0: expected a positive integer"
        );
    }
}
