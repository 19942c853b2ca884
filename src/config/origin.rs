//! Where a value came from: the layers' names (a file, a `DTF_…` variable,
//! `TF_CONFIG`, a command-line flag, the built-in default), each key's
//! [`Sources`], and figment's errors translated into a [`ConfigError`] that
//! names the key, its origin and what was expected, with a "did you mean"
//! for misspelt names.

use super::error::ConfigError;
use figment::error::{Actual, Kind};
use figment::{Figment, Metadata};
use std::collections::BTreeMap;

/// The environment variable holding the Kubeflow/TensorFlow cluster and task.
pub const TF_CONFIG: &str = "TF_CONFIG";

/// Prefix of the environment variables that override the file:
/// `DTF_<SECTION>__<KEY>`, e.g. `DTF_TRAIN__LAST_STEP=100`.
pub const ENV_PREFIX: &str = "DTF_";

/// Where each value of a [`Config`](super::Config) came from, so that
/// errors found after loading (validation, `Config::check_task`) can name
/// the file or the environment variable.
///
/// Provenance is not part of a configuration's value: two `Sources` always
/// compare equal, so `Config`'s `==` compares settings only.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// Origin of keys not in `keys` (the file; empty: `configuration`).
    pub(super) fallback: String,
    /// Dotted key (`train.batch_size`) → origin (`/etc/dtf/dtf.toml`, …).
    pub(super) keys: BTreeMap<String, String>,
}

impl PartialEq for Sources {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Sources {
    /// Whether `key` was set by a file, the environment or a flag rather
    /// than left at its built-in default.
    pub fn is_set(&self, key: &str) -> bool {
        !self.origin(key).starts_with(DEFAULT_ORIGIN)
    }

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

/// How an origin starts for a key no source set.
pub(super) const DEFAULT_ORIGIN: &str = "built-in default";

/// Names the provider that supplied `key` as an operator would look for it.
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
