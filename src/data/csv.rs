//! CSV data sets: `data.format = "csv"`, `data.train`, `data.test`, `data.label`.
//!
//! Kaggle's layout (`fashion-mnist_train.csv`: `label,pixel1,…,pixel784`): a
//! header line, then one row per example. The column named `data.label`
//! holds the class index (an integer 0–255), or class names (iris's
//! `species`: `setosa`, `versicolor`, `virginica`) when its values are not
//! all integers 0–255: each distinct name of the training file is a class,
//! numbered in sorted order ([`LabelNames`]), or with `data.threshold` a
//! number that becomes a binary label (1 when ≥ the threshold). Every other
//! column is a feature: numeric, or categorical when one of its values is not
//! a number (an empty cell included) or `data.categorical` names it (zip
//! codes, numeric ids). A categorical cell becomes one id, `data::id(column,
//! cell)`; an empty one is the token "". The numeric features of a file whose
//! every numeric cell is an integer 0–255 are byte data, held as bytes and
//! scaled by 1/255 as IDX pixels are; any other number makes them float data
//! (f32, used as is or standardized; always standardized beside categorical
//! features).
//!
//! Telling the columns apart costs nothing for numeric files: the rows are
//! read once assuming the named columns are the only categorical ones, and
//! read again only when a cell that is not a number shows otherwise.

use super::{Categorical, DataError, Dataset, Features, format_error, id};
use crate::config::DataConfig;
use labels::LabelColumn;
pub(crate) use labels::parse_label;
use std::path::Path;

/// Rows of features read from a CSV file.
#[derive(Debug)]
pub struct Rows {
    /// The feature values, row-major.
    pub values: Features,
    /// The label of each row, when the file has the label column.
    pub labels: Option<Vec<u8>>,
    /// The classes' names, in class order, when the labels were names.
    pub class_names: Option<Vec<String>>,
    /// Each row's label as a real value ([`LabelNames::Values`]).
    pub targets: Option<Vec<f32>>,
    /// Features per row.
    pub features: usize,
    /// The features' column names, in the order of `values`.
    pub names: Vec<String>,
    /// The categorical columns' ids, when the file has such columns.
    pub categorical: Option<Categorical>,
}

/// Which columns are categorical.
#[derive(Debug, Clone, Copy)]
pub enum CategoricalColumns<'a> {
    /// None: a cell that is not a number is an error (a model trained on
    /// numbers alone: `dtf predict`, `dtf eval`).
    Refused,
    /// These, and every column with a cell that is not a number (a
    /// training file).
    Detect(&'a [String]),
    /// Exactly these, in this order (a test file read as its training
    /// file was).
    Exactly(&'a [String]),
}

/// What a label that is not a class index is.
#[derive(Debug, Clone, Copy)]
pub enum LabelNames<'a> {
    /// An error: the labels are class indices (a model trained on them).
    Refused,
    /// A class name, when any label is not an integer 0–255: the distinct
    /// names in sorted order are the classes (a training file).
    Detect,
    /// One of these names (sorted), or an error naming it (a test file read
    /// as its training file was, or with a checkpoint's names).
    Exactly(&'a [String]),
    /// No class at all: every label is a real value, a finite f32, or an error naming it
    /// (`model.task = "regression"`).
    Values,
    /// Not read at all: whatever the column holds (`dtf predict`, which leaves the labels
    /// out, of a classifier or a regression model alike).
    Skipped,
}

impl<'a> LabelNames<'a> {
    /// [`LabelNames::Exactly`] the training file's names, when it had them;
    /// else [`LabelNames::Refused`].
    pub fn of(train: Option<&'a [String]>) -> Self {
        train.map_or(LabelNames::Refused, LabelNames::Exactly)
    }
}

/// How to read a CSV file ([`read_with`]).
#[derive(Debug, Clone, Copy)]
pub struct Options<'a> {
    /// The label column's name.
    pub label: Option<&'a str>,
    /// Whether the label column must be there.
    pub require_label: bool,
    /// The numeric features by name, in this order (see [`read_named`]).
    pub names: Option<&'a [String]>,
    /// Which columns are categorical.
    pub categorical: CategoricalColumns<'a>,
    /// A binary label: 1 when the label is at least this (`data.threshold`).
    pub threshold: Option<f64>,
    /// What a label that is not a class index is.
    pub label_names: LabelNames<'a>,
    /// The delimiter (`data.delimiter`); `None`: told from the header line.
    pub delimiter: Option<u8>,
}

/// Loads the CSV file at `path` as `cfg` says (`data.label`,
/// `data.threshold`, `data.categorical`, `data.delimiter`); as a test file
/// when `train` is the training split: its numeric columns matched to the
/// training file's by name, categorical exactly where the training file's
/// are, and its labels the training file's class names when it had names.
///
/// Errors: as [`read_with`].
pub fn load_config(
    path: &Path,
    cfg: &DataConfig,
    train: Option<&Dataset>,
) -> Result<Dataset, DataError> {
    let labels = match train {
        Some(t) if t.is_regression() => LabelNames::Values,
        Some(t) => LabelNames::of(t.class_names()),
        None => LabelNames::Detect,
    };
    load_config_with(path, cfg, train, labels)
}

/// [`load_config`] with the labels read as `labels` says (a test file
/// read without its training split: the training file's names, from
/// [`class_names`]).
///
/// Errors: as [`read_with`].
pub fn load_config_with(
    path: &Path,
    cfg: &DataConfig,
    train: Option<&Dataset>,
    labels: LabelNames,
) -> Result<Dataset, DataError> {
    let fields = train
        .and_then(|t| t.categorical())
        .map(|c| c.fields.as_slice());
    let opts = Options {
        label: Some(&cfg.label),
        require_label: true,
        names: train.and_then(Dataset::names),
        categorical: match (train, fields) {
            (Some(_), Some(f)) => CategoricalColumns::Exactly(f),
            (Some(_), None) => CategoricalColumns::Exactly(&[]),
            (None, _) => CategoricalColumns::Detect(&cfg.categorical),
        },
        threshold: cfg.threshold,
        label_names: labels,
        delimiter: cfg.delimiter_byte(),
    };
    dataset(path, read_with(path, &opts)?)
}

/// A data set of `rows` read from `path`.
fn dataset(path: &Path, rows: Rows) -> Result<Dataset, DataError> {
    let labels = rows.labels.unwrap_or_default();
    let mut ds = match rows.categorical {
        Some(c) => Dataset::with_categorical(rows.values, labels, rows.features, c, path)?,
        None => Dataset::new(rows.values, labels, rows.features, path)?,
    };
    ds.set_names(rows.names);
    ds.set_class_names(rows.class_names);
    if let Some(t) = rows.targets {
        ds.set_targets(t)?;
    }
    Ok(ds)
}

/// The class names of the training CSV file at `path` (its column
/// `cfg.label`), in class order; `None` when its labels are class indices
/// (or `data.threshold` makes them binary). Reads the file, keeping the
/// label column alone.
///
/// Errors: as [`read_with`], for the header and the labels.
pub fn class_names(path: &Path, cfg: &DataConfig) -> Result<Option<Vec<String>>, DataError> {
    if cfg.threshold.is_some() {
        return Ok(None);
    }
    let mut labels = LabelColumn::new(LabelNames::Detect, None);
    match each_label(path, cfg, |line, column, text| {
        labels.push(path, line, column, text)
    })? {
        Some(column) => Ok(labels.finish(path, &column)?.1),
        None => Ok(None),
    }
}

/// The first label of the training CSV file at `path` (its column `cfg.label`) that is a
/// number but not an integer (`12.5`), when every label is a finite number: a real-valued
/// label, which `dtf local` trains as regression. `None` for class indices, names, or
/// labels that are all integers.
///
/// Errors: as [`read_with`], for the header and the label column.
pub fn real_label(path: &Path, cfg: &DataConfig) -> Result<Option<String>, DataError> {
    let (mut first, mut numbers) = (None, true);
    each_label(path, cfg, |_, _, text| {
        match text.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => {
                if first.is_none() && v.fract() != 0.0 {
                    first = Some(text.trim().to_owned());
                }
            }
            _ => numbers = false,
        }
        Ok(())
    })?;
    Ok(first.filter(|_| numbers))
}

/// Calls `each` with the line, the column's name and the cell of every row's label of the
/// CSV file at `path` (its column `cfg.label`), reading that column alone. Returns the
/// column's name; `None` when the header has none such.
///
/// Errors: as [`read_with`], for the header and the rows; `each`'s.
fn each_label(
    path: &Path,
    cfg: &DataConfig,
    mut each: impl FnMut(u64, &str, &str) -> Result<(), DataError>,
) -> Result<Option<String>, DataError> {
    let mut reader = reader(path, cfg.delimiter_byte())?;
    let (headers, label_at) = read_header(&mut reader, path, Some(&cfg.label), true)?;
    let Some(j) = label_at else {
        return Ok(None);
    };
    let mut record = ::csv::ByteRecord::new();
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(csv_error(path, e)),
        }
        let line = record.position().map_or(0, |p| p.line());
        let text = std::str::from_utf8(record.get(j).unwrap_or_default()).unwrap_or("");
        each(line, &headers[j], text)?;
    }
    Ok(Some(headers[j].clone()))
}

/// Loads the CSV file at `path` with its labels in the column `label`.
///
/// Errors: [`DataError::Io`] when it cannot be read; [`DataError::Format`]
/// naming the line (and column) of a row with the wrong number of cells, a
/// cell that is not a number, a label that is not a class index 0–255, and
/// naming the label column when the header lacks it;
/// [`DataError::TooLarge`] for a file larger than this machine's memory.
pub fn load(path: &Path, label: &str) -> Result<Dataset, DataError> {
    load_named(path, label, None, LabelNames::Refused, None)
}

/// [`load`], with the features in the order of `names` (the training
/// split's columns, or those a checkpoint recorded) when given: columns
/// are matched by their header names, not their positions; labels read as
/// `labels` says (a checkpoint's class names), cells split at `delimiter`
/// (`None`: told from the header line).
///
/// Errors: as [`read_named`]; [`DataError::Format`] naming a label that is
/// not one of the class names.
pub fn load_named(
    path: &Path,
    label: &str,
    names: Option<&[String]>,
    labels: LabelNames,
    delimiter: Option<u8>,
) -> Result<Dataset, DataError> {
    let opts = Options {
        label: Some(label),
        require_label: true,
        names,
        categorical: CategoricalColumns::Refused,
        threshold: None,
        label_names: labels,
        delimiter,
    };
    dataset(path, read_with(path, &opts)?)
}

/// Reads the CSV file at `path`: its features, and its labels when the column
/// `label` is there (`require_label`: it must be).
///
/// Errors: as [`load`].
pub fn read(path: &Path, label: Option<&str>, require_label: bool) -> Result<Rows, DataError> {
    read_named(path, label, require_label, None)
}

/// [`read`], matching the feature columns to `names` by their header names
/// when given: the rows come out in the order of `names`, whatever the
/// file's order. The same rows with their columns reordered once scored
/// 0.994 then 0.154 without a word, as columns were taken by position.
///
/// Errors: as [`load`]; [`DataError::Format`] naming the columns of `names`
/// the header lacks, the header's feature columns `names` lacks, and a
/// column name the header has twice.
pub fn read_named(
    path: &Path,
    label: Option<&str>,
    require_label: bool,
    names: Option<&[String]>,
) -> Result<Rows, DataError> {
    read_with(
        path,
        &Options {
            label,
            require_label,
            names,
            categorical: CategoricalColumns::Refused,
            threshold: None,
            label_names: LabelNames::Refused,
            delimiter: None,
        },
    )
}

/// Reads the CSV file at `path` as `opts` says.
///
/// Errors: as [`read_named`]; [`DataError::Format`] naming a column of
/// `data.categorical` (or of the training file's categorical ones) that the
/// header lacks, and a label that is not a number with a threshold.
pub fn read_with(path: &Path, opts: &Options) -> Result<Rows, DataError> {
    let named = match opts.categorical {
        CategoricalColumns::Refused => None,
        CategoricalColumns::Detect(n) | CategoricalColumns::Exactly(n) => Some(n.to_vec()),
    };
    match read_pass(path, opts, named.as_deref())? {
        Pass::Done(rows) => Ok(rows),
        // Cells that are not numbers made more columns categorical: read
        // again with them (at most once: the first pass saw every cell).
        Pass::Again(more) => match read_pass(path, opts, Some(&more))? {
            Pass::Done(rows) => Ok(rows),
            Pass::Again(_) => unreachable!("the second pass knows every categorical column"),
        },
    }
}

/// What one pass over a file found.
enum Pass {
    /// The rows.
    Done(Rows),
    /// More categorical columns than the pass assumed: these, in header order.
    Again(Vec<String>),
}

/// One pass over the file with the categorical columns `cat` (None: none
/// allowed). In `Detect` mode a cell that is not a number adds its column
/// and the pass goes on classifying only.
fn read_pass(path: &Path, opts: &Options, cat: Option<&[String]>) -> Result<Pass, DataError> {
    let mut reader = reader(path, opts.delimiter)?;
    let (headers, label_at) = read_header(&mut reader, path, opts.label, opts.require_label)?;
    let cat_at = categorical_columns(path, &headers, label_at, cat)?;
    let detect = matches!(opts.categorical, CategoricalColumns::Detect(_));
    let columns = feature_columns(path, &headers, label_at, &cat_at, opts.names)?;
    let features = columns.len();
    if features == 0 && cat_at.is_empty() {
        return Err(format_error(path, "line 1: no feature columns"));
    }
    let mut cells = Cells {
        bytes: Some(Vec::new()),
        floats: Vec::new(),
    };
    let fields: Vec<String> = cat_at
        .iter()
        .map(|&j| headers[j].trim().to_owned())
        .collect();
    let mut categorical = Categorical::new(fields.clone());
    // Set once a cell shows another categorical column: from then on the
    // pass only classifies.
    let mut more: Option<Vec<bool>> = None;
    let mut labels = LabelColumn::new(opts.label_names, opts.threshold);
    let mut record = ::csv::ByteRecord::new();
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(csv_error(path, e)),
        }
        let line = record.position().map_or(0, |p| p.line());
        let at = |j: usize| {
            std::str::from_utf8(record.get(j).unwrap_or_default())
                .unwrap_or("")
                .trim()
        };
        if let Some(found) = more.as_mut() {
            for &j in &columns {
                if !is_number(at(j)) {
                    found[j] = true;
                }
            }
            continue;
        }
        if let Some(j) = label_at {
            labels.push(path, line, &headers[j], at(j))?;
        }
        for &j in &columns {
            let cell = at(j);
            if cells.push(cell) {
                continue;
            }
            if detect && cell.parse::<f32>().is_err() {
                let mut found = vec![false; headers.len()];
                found[j] = true;
                more = Some(found);
                break;
            }
            return Err(format_error(
                path,
                format!(
                    "line {line}, column {}: {} is not a finite number",
                    quote(&headers[j]),
                    quote(cell)
                ),
            ));
        }
        if more.is_some() {
            continue;
        }
        for (&j, field) in cat_at.iter().zip(&fields) {
            categorical.push_id(id(field, at(j)));
            categorical
                .end_cell()
                .map_err(|what| format_error(path, what))?;
        }
    }
    if let Some(found) = more {
        let again = (0..headers.len())
            .filter(|&j| found[j] || cat_at.contains(&j))
            .map(|j| headers[j].trim().to_owned())
            .collect();
        return Ok(Pass::Again(again));
    }
    let values = match cells.bytes {
        Some(b) => Features::Bytes(b),
        None => Features::Floats(cells.floats),
    };
    let targets = labels.take_values();
    let (labels, class_names) = match label_at {
        Some(j) => {
            let (l, n) = labels.finish(path, &headers[j])?;
            (Some(l), n)
        }
        None => (None, None),
    };
    Ok(Pass::Done(Rows {
        values,
        labels,
        class_names,
        targets: targets.filter(|_| label_at.is_some()),
        features,
        names: columns
            .iter()
            .map(|&j| headers[j].trim().to_owned())
            .collect(),
        categorical: (!cat_at.is_empty()).then_some(categorical),
    }))
}

/// A numeric cell: a number (non-finite ones are numbers that the reader
/// refuses, not categories).
fn is_number(cell: &str) -> bool {
    cell.parse::<f32>().is_ok()
}

/// The header positions of the categorical columns `names` (None: none).
///
/// Errors: [`DataError::Format`] naming a column the header lacks, or the
/// label column.
fn categorical_columns(
    path: &Path,
    headers: &[String],
    label_at: Option<usize>,
    names: Option<&[String]>,
) -> Result<Vec<usize>, DataError> {
    let mut at = Vec::new();
    for n in names.unwrap_or_default() {
        match headers.iter().position(|h| h.trim() == n) {
            Some(j) if Some(j) == label_at => {
                return Err(format_error(
                    path,
                    format!(
                        "line 1: {} is the label column, not a categorical feature",
                        quote(n)
                    ),
                ));
            }
            Some(j) => at.push(j),
            None => {
                return Err(format_error(
                    path,
                    format!(
                        "line 1: no column {} (data.categorical, or a categorical column of \
                         the training file)",
                        quote(n)
                    ),
                ));
            }
        }
    }
    Ok(at)
}

/// The feature columns' names of the CSV file at `path` (its header
/// without the column `label`), reading the header alone, split at
/// `delimiter` (`None`: told from the header line).
///
/// Errors: as [`load`], for the header.
pub fn header_names(
    path: &Path,
    label: &str,
    delimiter: Option<u8>,
) -> Result<Vec<String>, DataError> {
    let mut reader = reader(path, delimiter)?;
    let (headers, label_at) = read_header(&mut reader, path, Some(label), false)?;
    Ok(feature_columns(path, &headers, label_at, &[], None)?
        .into_iter()
        .map(|j| headers[j].trim().to_owned())
        .collect())
}

/// The header positions of the feature columns, in the order rows are
/// read: the file's own without `names`, else the order of `names`.
///
/// Errors: [`DataError::Format`] as [`read_named`] says.
fn feature_columns(
    path: &Path,
    headers: &[String],
    label_at: Option<usize>,
    cat_at: &[usize],
    names: Option<&[String]>,
) -> Result<Vec<usize>, DataError> {
    let own: Vec<usize> = (0..headers.len())
        .filter(|&j| Some(j) != label_at && !cat_at.contains(&j))
        .collect();
    let Some(names) = names else {
        return Ok(own);
    };
    let list = |v: &[&str]| {
        let shown: Vec<String> = v.iter().take(5).map(|n| quote(n)).collect();
        let more = v.len().saturating_sub(5);
        if more > 0 {
            format!("{} and {more} more", shown.join(", "))
        } else {
            shown.join(", ")
        }
    };
    let mut seen = std::collections::HashMap::new();
    for &j in &own {
        if let Some(first) = seen.insert(headers[j].trim(), j) {
            return Err(format_error(
                path,
                format!(
                    "line 1: columns {} and {} are both named {}: features are matched by name",
                    first + 1,
                    j + 1,
                    quote(headers[j].trim())
                ),
            ));
        }
    }
    let missing: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| !seen.contains_key(n))
        .collect();
    let wanted: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    let extra: Vec<&str> = own
        .iter()
        .map(|&j| headers[j].trim())
        .filter(|n| !wanted.contains(n))
        .collect();
    if !missing.is_empty() || !extra.is_empty() {
        let mut what =
            String::from("line 1: the columns do not match the features the model was trained on");
        if !missing.is_empty() {
            what.push_str(&format!("; missing {}", list(&missing)));
        }
        if !extra.is_empty() {
            what.push_str(&format!("; not trained on {}", list(&extra)));
        }
        return Err(format_error(path, what));
    }
    Ok(names.iter().map(|n| seen[n.as_str()]).collect())
}

/// The header's column names and where the label column is among them.
///
/// Errors: [`DataError::Format`] for a missing header, or a missing label
/// column when `require_label`.
fn read_header<R: std::io::Read>(
    reader: &mut ::csv::Reader<R>,
    path: &Path,
    label: Option<&str>,
    require_label: bool,
) -> Result<(Vec<String>, Option<usize>), DataError> {
    let headers = reader
        .headers()
        .map_err(|e| csv_error(path, e))?
        .iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    if headers.is_empty() || headers.iter().all(String::is_empty) {
        return Err(format_error(
            path,
            "line 1: no header: expected a header line naming the columns",
        ));
    }
    let label_at = label.and_then(|l| headers.iter().position(|h| h.trim() == l));
    if require_label && label_at.is_none() {
        return Err(format_error(
            path,
            format!(
                "line 1: no column {} among {} columns (first {}): name the label column \
                 with --label (dtf local, eval, predict) or data.label (dtf.toml)",
                quote(label.unwrap_or_default()),
                headers.len(),
                quote(headers.first().map(String::as_str).unwrap_or_default())
            ),
        ));
    }
    Ok((headers, label_at))
}

/// The most bytes of a cell or column name an error message quotes.
pub const QUOTE_BYTES: usize = 200;

/// `text` quoted for an error message, cut at [`QUOTE_BYTES`] (a 20 MB cell
/// once made a 20 MB error line) with the length it had.
pub fn quote(text: &str) -> String {
    if text.len() <= QUOTE_BYTES {
        return format!("{text:?}");
    }
    let mut end = QUOTE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &text[..end], text.len())
}

/// The feature cells read so far: bytes while every cell is an integer
/// 0–255, floats from the first cell that is not.
struct Cells {
    /// Every cell so far, while all are bytes.
    bytes: Option<Vec<u8>>,
    /// Every cell so far, once one is not a byte.
    floats: Vec<f32>,
}

impl Cells {
    /// Adds one cell; false when it is not a finite number.
    fn push(&mut self, cell: &str) -> bool {
        if let Some(b) = self.bytes.as_mut() {
            if let Ok(v) = cell.parse::<u8>() {
                b.push(v);
                return true;
            }
            // The first cell that is not a byte: the file is float data.
            self.floats = b.iter().map(|&v| f32::from(v)).collect();
            self.bytes = None;
        }
        match cell.parse::<f32>() {
            Ok(v) if v.is_finite() => {
                self.floats.push(v);
                true
            }
            _ => false,
        }
    }
}

mod labels;
mod reader;
use reader::csv_error;
pub(crate) use reader::reader;
#[cfg(test)]
mod tests;
