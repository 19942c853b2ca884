//! Which format a path given on the command line is (`dtf local --data`,
//! `dtf eval --data`), told from its name and, for a directory, its files.

use super::DataError;
use crate::config::{DataConfig, DataFormat};
use std::path::{Path, PathBuf};

/// A data configuration for a path given on the command line (`dtf local
/// --data`, `dtf eval --data`): a directory holding a `*.inter` file is
/// RecBole's atomic files, any other directory IDX, `*.txt` or `*.tsv` is
/// Criteo's layout, `*.npz` is NumPy, `*.csv`
/// is CSV whose test file is `test` or, when absent, the file beside it with
/// `train` replaced by `test` in its name (Kaggle's `fashion-mnist_train.csv`
/// and `fashion-mnist_test.csv`). Other keys are kept from `base`.
///
/// Errors: [`DataError::UnknownFormat`] for any other path;
/// [`DataError::NotThere`] when it cannot be looked at (both name the formats dtf reads).
pub fn config_for_path(
    base: &DataConfig,
    path: &Path,
    test: Option<&Path>,
) -> Result<DataConfig, DataError> {
    let mut cfg = base.clone();
    let meta = std::fs::metadata(path).map_err(|error| DataError::NotThere {
        path: path.to_path_buf(),
        error,
    })?;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if meta.is_dir() {
        cfg.format = if super::recbole::is_recbole_dir(path) {
            DataFormat::Recbole
        } else {
            DataFormat::Idx
        };
        cfg.dir = path.to_path_buf();
    } else if matches!(ext.as_deref(), Some("txt" | "tsv")) {
        cfg.format = DataFormat::Criteo;
        cfg.path = Some(path.to_path_buf());
    } else if ext.as_deref() == Some("npz") {
        cfg.format = DataFormat::Npz;
        cfg.path = Some(path.to_path_buf());
    } else if ext.as_deref() == Some("csv") {
        cfg.format = DataFormat::Csv;
        cfg.train = Some(path.to_path_buf());
        // The test file given, or the one beside it named with "test"
        // for "train"; with neither, the seeded data.test_fraction split.
        cfg.test = match test {
            Some(t) => Some(t.to_path_buf()),
            None => beside(path).filter(|t| t.exists()),
        };
    } else {
        return Err(DataError::UnknownFormat {
            path: path.to_path_buf(),
        });
    }
    Ok(cfg)
}

/// A data configuration whose test split is `path` (`dtf eval --data`): a
/// directory of IDX files, a `.npz` (its `x_test`, `y_test`), or the test
/// `.csv` itself.
///
/// Errors: as [`config_for_path`].
pub fn test_config_for_path(path: &Path) -> Result<DataConfig, DataError> {
    let is_csv = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    if is_csv {
        return Ok(DataConfig {
            format: DataFormat::Csv,
            test: Some(path.to_path_buf()),
            ..DataConfig::default()
        });
    }
    config_for_path(&DataConfig::default(), path, None)
}

/// `…train….csv` → `…test….csv` in the same directory (the last `train`).
fn beside(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let at = name.rfind("train")?;
    let test = format!("{}test{}", &name[..at], &name[at + "train".len()..]);
    Some(path.with_file_name(test))
}
