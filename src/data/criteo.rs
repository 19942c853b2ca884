//! Criteo's TSV layout (`data.format = "criteo"`, `data.path`): the Kaggle
//! Display Advertising Challenge's `train.txt` and Criteo 1TB's `day_N`.
//!
//! No header; each line is 40 tab-separated fields: the label (0 or 1),
//! 13 integer features `I1`–`I13` and 26 categorical features `C1`–`C26`
//! (32-bit hashes written in hex). As DLRM reads them: an integer `x`
//! becomes `ln(1 + x)`, a negative one (`I2` has some) or a missing one 0;
//! a categorical value becomes `data::id("Cn", value)`, a missing one the
//! token "" of its field (its own id, not the id of some real value).
//!
//! The file holds both splits: the seeded `data.test_fraction` split
//! (`split_rows`); Kaggle's `test.txt` has no labels and is not a test split.

use super::csv::quote;
use super::{Categorical, DataError, Dataset, Split, format_error, id, split_rows};
use crate::config::DataConfig;
use std::io::BufRead;
use std::path::Path;

/// The integer columns.
pub const INTEGERS: usize = 13;
/// The categorical columns.
pub const CATEGORIES: usize = 26;
/// Fields per line: the label, the integers, the categories.
pub const FIELDS: usize = 1 + INTEGERS + CATEGORIES;

/// The integer columns' names, `I1`–`I13`.
pub fn integer_names() -> Vec<String> {
    (1..=INTEGERS).map(|i| format!("I{i}")).collect()
}

/// The categorical columns' names, `C1`–`C26`.
pub fn category_names() -> Vec<String> {
    (1..=CATEGORIES).map(|i| format!("C{i}")).collect()
}

/// Loads `split` of the file at `cfg.path`.
///
/// Errors: as [`load_both`].
pub fn load(cfg: &DataConfig, split: Split) -> Result<Dataset, DataError> {
    let (train, test) = load_both(cfg)?;
    Ok(if split == Split::Train { train } else { test })
}

/// Both splits of the file at `cfg.path`, read once.
///
/// Errors: [`DataError::Unset`] without `data.path`; [`DataError::Format`]
/// naming the line (and column) of a line without 40 fields, a label that is
/// not 0 or 1, an integer feature that is not an integer; an empty file;
/// [`DataError::Io`], [`DataError::TooLarge`] as every reader.
pub fn load_both(cfg: &DataConfig) -> Result<(Dataset, Dataset), DataError> {
    let path = cfg.path.as_deref().ok_or(DataError::Unset {
        key: "data.path",
        format: "criteo",
    })?;
    let all = read(path)?;
    let (train, test) = split_rows(all.len(), cfg.test_fraction);
    Ok((all.select(&train), all.select(&test)))
}

/// Every line of the file at `path`, as one data set.
///
/// Errors: as [`load_both`].
pub fn read(path: &Path) -> Result<Dataset, DataError> {
    let file = super::open_file(path)?;
    let mut reader = std::io::BufReader::new(file);
    let names = integer_names();
    let fields = category_names();
    let mut values = Vec::new();
    let mut labels = Vec::new();
    let mut categorical = Categorical::new(fields.clone());
    let mut text = String::new();
    let mut line = 0usize;
    loop {
        text.clear();
        let n = reader
            .read_line(&mut text)
            .map_err(|source| DataError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        if n == 0 {
            break;
        }
        line += 1;
        let row = text.trim_end_matches(['\n', '\r']);
        if row.is_empty() {
            continue;
        }
        let cells: Vec<&str> = row.split('\t').collect();
        if cells.len() != FIELDS {
            return Err(format_error(
                path,
                format!(
                    "line {line}: {} fields: expected {FIELDS} tab-separated fields (the \
                     label, I1–I13, C1–C26), as a .txt/.tsv is read: Criteo's layout; a \
                     CSV with a header (comma, tab or semicolon) needs the name .csv",
                    cells.len()
                ),
            ));
        }
        labels.push(match cells[0].trim() {
            "0" => 0,
            "1" => 1,
            other => {
                return Err(format_error(
                    path,
                    format!(
                        "line {line}, column \"label\": label {} is not a number 0 or 1",
                        quote(other)
                    ),
                ));
            }
        });
        for (cell, name) in cells[1..=INTEGERS].iter().zip(&names) {
            values.push(log_count(cell.trim()).ok_or_else(|| {
                format_error(
                    path,
                    format!(
                        "line {line}, column {}: {} is not an integer",
                        quote(name),
                        quote(cell)
                    ),
                )
            })?);
        }
        for (cell, field) in cells[1 + INTEGERS..].iter().zip(&fields) {
            categorical.push_id(id(field, cell.trim()));
            categorical
                .end_cell()
                .map_err(|what| format_error(path, what))?;
        }
    }
    Dataset::with_named_columns(values, labels, names, categorical, path)
}

/// DLRM's transform of an integer feature: `ln(1 + x)`, 0 for a negative or
/// missing (empty) one; None for a cell that is not an integer.
pub fn log_count(cell: &str) -> Option<f32> {
    if cell.is_empty() {
        return Some(0.0);
    }
    let x: i64 = cell.parse().ok()?;
    Some((x.max(0) as f64).ln_1p() as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Batch;

    /// A Criteo line: label, 13 integers, 26 categories.
    fn line(label: &str, ints: &[&str], cats: &[&str]) -> String {
        let mut f = vec![label.to_owned()];
        f.extend((0..INTEGERS).map(|i| ints.get(i).copied().unwrap_or("1").to_owned()));
        f.extend((0..CATEGORIES).map(|i| cats.get(i).copied().unwrap_or("68fd1e64").to_owned()));
        f.join("\t") + "\n"
    }

    fn write(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("train.txt");
        std::fs::write(&path, text).unwrap();
        (d, path)
    }

    #[test]
    fn integers_are_log_counts_and_missing_categories_their_own_token() {
        let text = line("1", &["0", "-3", "", "9"], &["", "a1b2c3d4"]) + &line("0", &[], &[]);
        let (_d, path) = write(&text);
        let ds = read(&path).unwrap();
        assert_eq!(ds.labels(), [1, 0]);
        assert_eq!(ds.features(), 13);
        assert_eq!(ds.names().unwrap()[12], "I13");
        let mut b = Batch::default();
        ds.fill_batch(&[0, 1], &mut b);
        assert_eq!(
            &b.x.row(0).to_vec()[..5],
            [0.0, 0.0, 0.0, 10f32.ln(), 2f32.ln()]
        );
        let c = &b.categorical;
        assert_eq!(c.fields.len(), 26);
        assert_eq!(c.fields[25], "C26");
        assert_eq!(c.get(0, 0), [id("C1", "")]);
        assert_ne!(c.get(0, 0), c.get(1, 0), "missing is not a real value");
        assert_eq!(c.get(0, 1), [id("C2", "a1b2c3d4")]);
        assert_eq!(c.get(1, 1), [id("C2", "68fd1e64")]);
    }

    #[test]
    fn the_split_is_seeded_and_covers_every_line() {
        let text: String = (0..50)
            .map(|i| line(&(i % 2).to_string(), &[&i.to_string()], &[]))
            .collect();
        let (_d, path) = write(&text);
        let cfg = DataConfig {
            format: crate::config::DataFormat::Criteo,
            path: Some(path),
            ..DataConfig::default()
        };
        let (train, test) = load_both(&cfg).unwrap();
        assert_eq!((train.len(), test.len()), (40, 10));
        let first = |d: &Dataset| -> Vec<f32> { d.all().0.column(0).to_vec() };
        let (_, rows) = split_rows(50, 0.2);
        let want: Vec<f32> = rows.iter().map(|&i| (i as f32).ln_1p()).collect();
        assert_eq!(first(&test), want);
        assert_eq!(first(&load(&cfg, Split::Test).unwrap()), want);
    }

    #[test]
    fn bad_lines_name_their_line_and_column() {
        let good = line("0", &[], &[]);
        let cases = [
            (format!("{good}1\t2\t3\n"), "line 2: 3 fields: expected 40"),
            (
                good.clone() + &line("x", &[], &[]),
                "line 2, column \"label\": label \"x\" is not a number",
            ),
            (
                good.clone() + &line("2", &[], &[]),
                "label \"2\" is not a number 0 or 1",
            ),
            (
                line("1", &["1", "2", "3.5"], &[]),
                "line 1, column \"I3\": \"3.5\" is not an integer",
            ),
            (String::new(), "holds no examples"),
        ];
        for (text, want) in cases {
            let (_d, path) = write(&text);
            let msg = read(&path).unwrap_err().to_string();
            assert!(msg.contains(want), "{want}: {msg}");
            assert!(msg.contains("train.txt"), "{msg}");
        }
    }
}
