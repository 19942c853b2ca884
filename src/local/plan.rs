//! What `dtf local` will run, settled before anything is created: the
//! configuration from the file, the environment and the flags; the data the
//! command line names, its label column and the model's widths; every key
//! validated. A command line that cannot run fails here, with nothing left
//! behind and an error that names the flag or the file the user gave.

use super::{LocalError, Options};
use crate::config::{Config, DataFormat, ModelConfig, ModelKind, ModelTask};
use crate::data;
use std::path::{Path, PathBuf};

/// Column names taken for the label when the user names none and the CSV
/// has no `label` column: the names scikit-learn, Kaggle and pandas users give
/// it. More than one of them in a file is ambiguous, and an error.
const LABEL_NAMES: &[&str] = &[
    "label", "labels", "class", "classes", "target", "y", "category", "species", "digit",
];

/// The configuration `opts` asks for, with the data's shape in the model and
/// every key valid, but no cluster yet: [`super::prepare`] adds the ports,
/// the token and the run directory's paths.
///
/// `notes` gets a line for each choice made for the user (an inferred label
/// column, the widths taken from the data).
///
/// Errors: [`LocalError::Config`] naming the key and the flag, file or
/// environment variable that set it; [`LocalError::Data`] naming the data
/// file; [`LocalError::Resolve`] when the model does not fit the data.
pub fn plan(opts: &Options, notes: &mut Vec<String>) -> Result<Config, LocalError> {
    let mut cfg = Config::load_with(opts.config.as_deref(), &opts.overrides)?;
    if let Some(d) = &opts.data {
        cfg.data = data::config_for_path(&cfg.data, d, opts.test.as_deref())?;
    }
    if cfg.data.format == DataFormat::Csv && !cfg.sources.is_set("data.label") {
        let train = cfg.data.train.clone().unwrap_or_default();
        let label = infer_label(&train, cfg.data.delimiter_byte())?;
        if label != cfg.data.label {
            notes.push(format!(
                "label column {label:?} (from {}; --label picks another)",
                train.display()
            ));
            cfg.data.label = label;
        }
    }
    // A label of real numbers (a price) trains a regression model, unless the user chose
    // the task or made the label binary with a threshold.
    if cfg.data.format == DataFormat::Csv
        && !cfg.sources.is_set("model.task")
        && cfg.data.threshold.is_none()
        && let Some(train) = cfg.data.train.clone()
        && let Some(value) = data::csv::real_label(&train, &cfg.data)?
    {
        cfg.model.task = ModelTask::Regression;
        cfg.task_defaults();
        notes.push(format!(
            "label column {:?} holds real numbers (such as {value}): regression, one output \
             trained on the mean squared error, RMSE and MAE reported (model.task; --set \
             model.task=classification or --threshold for classes)",
            cfg.data.label
        ));
    }
    // Data with categorical fields trains wide & deep, unless the user
    // chose a model: the MLP would refuse it.
    if !cfg.sources.is_set("model.kind") && data::has_categorical(&cfg)? {
        cfg.model.kind = ModelKind::WideDeep;
        cfg.kind_defaults();
        let rules: Vec<String> = crate::placement::tables(&cfg)
            .iter()
            .map(|t| {
                let rule = cfg.table_optimizer(&t.name);
                format!("{} {}", t.name, rule.map_or("?", |o| o.name()))
            })
            .collect();
        notes.push(format!(
            "model wide_deep: {} has categorical fields (embedding tables on the ps: {}; \
             optimizer {}, learning rate {})",
            data::describe(&cfg.data),
            rules.join(", "),
            cfg.train.optimizer().name(),
            cfg.train.learning_rate
        ));
    }
    // Widths nobody chose are the default model's hidden layers around the
    // data's own input width and classes: a CSV of 4 features needs no
    // `[model]` table.
    if cfg.model.hidden.is_none() && !cfg.sources.is_set("model.layers") {
        let layers = ModelConfig::default().layers;
        cfg.model.hidden = Some(layers[1..layers.len() - 1].to_vec());
    }
    // The data's shape goes into the tasks' config once, here: they need not
    // read the data for it, and a model that does not fit fails now.
    let shape = data::resolve_model(&mut cfg)?;
    cfg.model.hidden = None;
    if let Some(names) = &shape.class_names {
        notes.push(format!(
            "label column {:?} holds {} class names: {}",
            cfg.data.label,
            names.len(),
            names.join(", ")
        ));
    }
    if cfg.data.format == DataFormat::Csv && cfg.data.test.is_none() {
        notes.push(format!(
            "no test file: testing on {}, training on the other {} examples \
             (data.test_fraction; --test names a test file)",
            data::describe(&cfg.data),
            shape.examples
        ));
    }
    if cfg.train.batch_size > shape.examples {
        return Err(cfg
            .bad(
                "train.batch_size",
                format!(
                    "{} is more than the {} training examples in {}",
                    cfg.train.batch_size,
                    shape.examples,
                    data::describe(&cfg.data)
                ),
            )
            .into());
    }
    // The cluster's shape, with placeholder addresses, so that the sync
    // replica counts and the rest are checked against it now.
    cfg.cluster.ps = (0..opts.ps)
        .map(|i| format!("127.0.0.1:{}", i + 1))
        .collect();
    cfg.cluster.worker = (0..opts.workers)
        .map(|i| format!("127.0.0.1:{}", opts.ps + i + 1))
        .collect();
    if let Some(dir) = &opts.checkpoint_dir {
        cfg.checkpoint.dir = dir.clone();
    }
    cfg.validate()?;
    Ok(cfg)
}

/// The label column of the training CSV at `path` when the user named none:
/// `label` if the header has it, else the one column with a usual label name.
///
/// Errors: [`LocalError::Data`] when the header cannot be read, or names no
/// such column or several, listing the columns it saw and the flag that picks one.
fn infer_label(path: &Path, delimiter: Option<u8>) -> Result<String, LocalError> {
    let headers = csv_header(path, delimiter)?;
    if headers.iter().any(|h| h == "label") {
        return Ok("label".into());
    }
    let found: Vec<&String> = headers
        .iter()
        .filter(|h| LABEL_NAMES.contains(&h.to_ascii_lowercase().as_str()))
        .collect();
    match found.as_slice() {
        [one] => Ok((*one).clone()),
        _ => {
            let shown = headers
                .iter()
                .take(12)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            let more = if headers.len() > 12 { ", …" } else { "" };
            let why = if found.is_empty() {
                "no column is called \"label\" (nor class, target, y, …)".to_owned()
            } else {
                format!("several columns could be the label ({found:?})")
            };
            Err(data::DataError::Format {
                path: path.to_path_buf(),
                what: format!(
                    "line 1: {why}; its {} columns are {shown}{more}: name the label column \
                     with --label",
                    headers.len()
                ),
            }
            .into())
        }
    }
}

/// The column names on the first line of the CSV file at `path`, split at
/// `delimiter` (`data.delimiter`; `None`: told from the line).
///
/// Errors: [`data::DataError`] naming the file.
fn csv_header(path: &Path, delimiter: Option<u8>) -> Result<Vec<String>, data::DataError> {
    let mut reader = data::csv::reader(path, delimiter)?;
    let headers = reader.headers().map_err(|e| data::DataError::Format {
        path: path.to_path_buf(),
        what: format!("line 1: {e}"),
    })?;
    Ok(headers.iter().map(|h| h.trim().to_owned()).collect())
}

/// `path` as an absolute path, so that the run directory's `dtf.toml` and
/// the resume command mean the same file from any directory.
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d_train.csv");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn the_label_column_is_inferred_only_when_unambiguous() {
        let (_d, p) = csv("x0,x1,label\n1,2,0\n");
        assert_eq!(infer_label(&p, None).unwrap(), "label");
        let (_d, p) = csv("x0,x1,Species\n1,2,0\n");
        assert_eq!(infer_label(&p, None).unwrap(), "Species");
        let (_d, p) = csv("a,b,c\n1,2,0\n");
        let err = infer_label(&p, None).unwrap_err().to_string();
        assert!(
            err.contains("a, b, c") && err.contains("--label") && err.contains("d_train.csv"),
            "{err}"
        );
        let (_d, p) = csv("y,target,x\n1,2,0\n");
        let err = infer_label(&p, None).unwrap_err().to_string();
        assert!(err.contains("several") && err.contains("--label"), "{err}");
    }
}
