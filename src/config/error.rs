//! [`ConfigError`], and figment's errors translated into it: the key, where
//! its value came from (file, `DTF_…` variable, `TF_CONFIG`), and what was
//! expected, with a "did you mean" for misspelt names.

use super::load::{ENV_PREFIX, TF_CONFIG};
use super::schema::{Role, TaskId};
use super::secret::FileProblem;
use figment::error::{Actual, Kind};
use figment::{Figment, Metadata};
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
    /// Neither `--task` nor `TF_CONFIG` says which task this process is.
    #[error("no task index: pass --task N or set TF_CONFIG")]
    NoTask,
}

/// Names the provider that supplied `key` as an operator would look for it.
/// How an origin starts for a key no source set.
pub(super) const DEFAULT_ORIGIN: &str = "built-in default";

pub(super) fn describe_origin(metadata: Option<&Metadata>, key: &str, file: &str) -> String {
    match metadata {
        Some(md) if md.name.starts_with("TOML") => file.to_owned(),
        Some(md) if md.name == TF_CONFIG => TF_CONFIG.to_owned(),
        // A command-line override names its flag (`--set train.optimizer=adm`).
        Some(md) if md.name.starts_with("--") => md.name.to_string(),
        Some(md) if md.name.contains("environment variable") => {
            format!("environment variable {}", env_var_name(key))
        }
        Some(_) => format!("{DEFAULT_ORIGIN} (not set in {file})"),
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
pub(super) fn figment_error(error: figment::Error, figment: &Figment, file: &str) -> ConfigError {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_util::*;
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
}
