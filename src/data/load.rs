//! Loading a data set's splits in its format: the training and test splits, a CSV's
//! seeded split when it has no test file, the labels as `model.task` reads them, and the
//! preprocessing the training split implies.

use super::{DataError, Dataset, Split, criteo, csv, npz, recbole, split_rows};
use crate::config::{DataConfig, DataFormat, ModelTask};

/// Loads `split` of the data set `cfg` describes, in its format, with the
/// default preprocessing (bytes / 255, floats as they are), its labels classes.
///
/// Errors: [`DataError`] naming the file and what is wrong in it; `Unset`
/// when the format's path keys are not set.
pub fn load(cfg: &DataConfig, split: Split) -> Result<Dataset, DataError> {
    load_task(cfg, ModelTask::Classification, split)
}

/// [`load`] with the labels `config.model.task` says: classes, or real values
/// (regression: a CSV label column or an npz's `y`, each a finite f32).
///
/// Errors: as [`load`], and naming a label that is not a finite number for regression.
pub fn load_for(config: &crate::config::Config, split: Split) -> Result<Dataset, DataError> {
    load_task(&config.data, config.model.task, split)
}

/// How a training CSV's label column is read for `task`.
fn first_labels(task: ModelTask) -> csv::LabelNames<'static> {
    match task {
        ModelTask::Classification => csv::LabelNames::Detect,
        ModelTask::Regression => csv::LabelNames::Values,
    }
}

/// [`load`] with the labels `task` says ([`load_for`]'s, for a caller without a whole
/// configuration: `dtf eval`, with a checkpoint's task).
///
/// Errors: as [`load_for`].
pub fn load_task(cfg: &DataConfig, task: ModelTask, split: Split) -> Result<Dataset, DataError> {
    let regression = task == ModelTask::Regression;
    match cfg.format {
        DataFormat::Idx => Dataset::load(&cfg.dir, split),
        DataFormat::Npz => {
            let path = cfg.path.as_deref().ok_or(DataError::Unset {
                key: "data.path",
                format: "npz",
            })?;
            npz::load(path, split, regression)
        }
        DataFormat::Csv if cfg.test.is_none() => Ok(csv_split(cfg, task)?.take(split)),
        DataFormat::Csv => {
            let (key, path) = match split {
                Split::Train => ("data.train", cfg.train.as_deref()),
                Split::Test => ("data.test", cfg.test.as_deref()),
            };
            let path = path.ok_or(DataError::Unset { key, format: "csv" })?;
            match (split, cfg.train.as_deref()) {
                (Split::Test, _) if regression => {
                    csv::load_config_with(path, cfg, None, csv::LabelNames::Values)
                }
                // The classes are the training file's names, whichever
                // file is read first (the chief's final evaluation reads
                // the test file alone).
                (Split::Test, Some(train)) => {
                    let names = csv::class_names(train, cfg)?;
                    csv::load_config_with(path, cfg, None, csv::LabelNames::of(names.as_deref()))
                }
                (Split::Test, None) => {
                    csv::load_config_with(path, cfg, None, csv::LabelNames::Refused)
                }
                (Split::Train, _) => csv::load_config_with(path, cfg, None, first_labels(task)),
            }
        }
        DataFormat::Recbole => recbole::load(cfg, split),
        DataFormat::Criteo => criteo::load(cfg, split),
    }
}

/// Both splits of a CSV training file with no test file: the seeded
/// `data.test_fraction` split of its rows ([`split_rows`]), the same on every
/// task, as RecBole's and Criteo's.
///
/// Errors: as [`csv::load_config`]; `Unset` without `data.train`.
fn csv_split(cfg: &DataConfig, task: ModelTask) -> Result<Both, DataError> {
    let path = cfg.train.as_deref().ok_or(DataError::Unset {
        key: "data.train",
        format: "csv",
    })?;
    let all = csv::load_config_with(path, cfg, None, first_labels(task))?;
    let (train, test) = split_rows(all.len(), cfg.test_fraction);
    Ok(Both(all.select(&train), all.select(&test)))
}

/// A training and a test split.
struct Both(Dataset, Dataset);

impl Both {
    fn take(self, split: Split) -> Dataset {
        match split {
            Split::Train => self.0,
            Split::Test => self.1,
        }
    }
}

/// Loads both splits and the preprocessing the training split implies
/// (standardization when `cfg.standardize`), applied to both.
///
/// Errors: as [`load`]; [`DataError::SplitWidths`] when the splits' widths differ.
pub fn load_both(cfg: &DataConfig) -> Result<(Dataset, Dataset), DataError> {
    load_both_task(cfg, ModelTask::Classification)
}

/// [`load_both`] with the labels `config.model.task` says ([`load_for`]).
///
/// Errors: as [`load_for`]; [`DataError::SplitWidths`].
pub fn load_both_for(config: &crate::config::Config) -> Result<(Dataset, Dataset), DataError> {
    load_both_task(&config.data, config.model.task)
}

/// [`load_both`] with the labels `task` says.
///
/// Errors: as [`load_both_for`].
pub fn load_both_task(cfg: &DataConfig, task: ModelTask) -> Result<(Dataset, Dataset), DataError> {
    let (mut train, mut test) = match cfg.format {
        // One file holds both splits: read it once.
        DataFormat::Recbole => recbole::load_both(cfg)?,
        DataFormat::Criteo => criteo::load_both(cfg)?,
        DataFormat::Csv if cfg.test.is_none() => {
            let both = csv_split(cfg, task)?;
            (both.0, both.1)
        }
        _ => {
            let train = load_task(cfg, task, Split::Train)?;
            // A CSV test file's columns are matched to the training file's by
            // name, and its categorical columns are the training file's.
            let test = match (&cfg.format, &cfg.test) {
                (DataFormat::Csv, Some(path)) => csv::load_config(path, cfg, Some(&train))?,
                _ => load_task(cfg, task, Split::Test)?,
            };
            (train, test)
        }
    };
    if train.features() != test.features() {
        return Err(DataError::SplitWidths {
            path: test.labels_path.clone(),
            train: train.features(),
            test: test.features(),
        });
    }
    let p = train.fitted_preprocessing(cfg.standardize);
    train.preprocessing = p.clone();
    test.preprocessing = p;
    Ok((train, test))
}
