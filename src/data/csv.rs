//! CSV data sets: `data.format = "csv"`, `data.train`, `data.test`, `data.label`.
//!
//! Kaggle's layout (`fashion-mnist_train.csv`: `label,pixel1,…,pixel784`): a
//! header line, then one row per example. The column named `data.label`
//! holds the class index (an integer 0–255); every other column is a numeric
//! feature. A file whose every feature cell is an integer 0–255 is byte data,
//! held as bytes and scaled by 1/255 as IDX pixels are; any other number makes
//! the whole file float data (f32, used as is or standardized).

use super::{DataError, Dataset, Features, format_error};
use std::path::Path;

/// Rows of features read from a CSV file.
#[derive(Debug)]
pub struct Rows {
    /// The feature values, row-major.
    pub values: Features,
    /// The label of each row, when the file has the label column.
    pub labels: Option<Vec<u8>>,
    /// Features per row.
    pub features: usize,
    /// The features' column names, in the order of `values`.
    pub names: Vec<String>,
}

/// Loads the CSV file at `path` with its labels in the column `label`.
///
/// Errors: [`DataError::Io`] when it cannot be read; [`DataError::Format`]
/// naming the line (and column) of a row with the wrong number of cells, a
/// cell that is not a number, a label that is not a class index 0–255, and
/// naming the label column when the header lacks it;
/// [`DataError::TooLarge`] for a file larger than this machine's memory.
pub fn load(path: &Path, label: &str) -> Result<Dataset, DataError> {
    load_named(path, label, None)
}

/// [`load`], with the features in the order of `names` (the training
/// split's columns, or those a checkpoint recorded) when given: columns
/// are matched by their header names, not their positions.
///
/// Errors: as [`read_named`].
pub fn load_named(
    path: &Path,
    label: &str,
    names: Option<&[String]>,
) -> Result<Dataset, DataError> {
    let rows = read_named(path, Some(label), true, names)?;
    let labels = rows.labels.unwrap_or_default();
    let mut ds = Dataset::new(rows.values, labels, rows.features, path)?;
    ds.set_names(rows.names);
    Ok(ds)
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
    let file = super::open_file(path)?;
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(std::io::BufReader::new(file));
    let (headers, label_at) = read_header(&mut reader, path, label, require_label)?;
    let columns = feature_columns(path, &headers, label_at, names)?;
    let features = columns.len();
    if features == 0 {
        return Err(format_error(path, "line 1: no feature columns"));
    }
    let mut cells = Cells {
        bytes: Some(Vec::new()),
        floats: Vec::new(),
    };
    let mut labels = Vec::new();
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
        for j in label_at.into_iter().chain(columns.iter().copied()) {
            let cell = at(j);
            if Some(j) == label_at {
                labels.push(cell.parse::<u8>().map_err(|_| {
                    format_error(
                        path,
                        format!(
                            "line {line}, column {}: label {} is not a class index: \
                             expected an integer 0–255",
                            quote(&headers[j]),
                            quote(cell)
                        ),
                    )
                })?);
            } else if !cells.push(cell) {
                return Err(format_error(
                    path,
                    format!(
                        "line {line}, column {}: {} is not a finite number",
                        quote(&headers[j]),
                        quote(cell)
                    ),
                ));
            }
        }
    }
    let values = match cells.bytes {
        Some(b) => Features::Bytes(b),
        None => Features::Floats(cells.floats),
    };
    Ok(Rows {
        values,
        labels: label_at.map(|_| labels),
        features,
        names: columns
            .iter()
            .map(|&j| headers[j].trim().to_owned())
            .collect(),
    })
}

/// The feature columns' names of the CSV file at `path` (its header
/// without the column `label`), reading the header alone.
///
/// Errors: as [`load`], for the header.
pub fn header_names(path: &Path, label: &str) -> Result<Vec<String>, DataError> {
    let file = super::open_file(path)?;
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(std::io::BufReader::new(file));
    let (headers, label_at) = read_header(&mut reader, path, Some(label), false)?;
    Ok(feature_columns(path, &headers, label_at, None)?
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
    names: Option<&[String]>,
) -> Result<Vec<usize>, DataError> {
    let own: Vec<usize> = (0..headers.len())
        .filter(|&j| Some(j) != label_at)
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
                "line 1: no column {} among {} columns (first {}): set data.label to the \
                 label column's name",
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

/// A csv crate error as a format error naming the line.
fn csv_error(path: &Path, e: ::csv::Error) -> DataError {
    let what = match e.kind() {
        ::csv::ErrorKind::UnequalLengths {
            pos,
            expected_len,
            len,
        } => format!(
            "line {}: {len} cells, the header has {expected_len}: every row needs one cell per column",
            pos.as_ref().map_or(0, |p| p.line())
        ),
        ::csv::ErrorKind::Io(err) => {
            return DataError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(err.kind(), err.to_string()),
            };
        }
        _ => match e.position() {
            Some(p) => format!("line {}: {e}", p.line()),
            None => e.to_string(),
        },
    };
    format_error(path, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("train.csv");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn byte_columns_stay_bytes_and_floats_make_floats() {
        let (_d, path) = write("label,p1,p2\n3,0,255\n1,7,8\n");
        let ds = load(&path, "label").unwrap();
        assert_eq!(ds.values, Features::Bytes(vec![0, 255, 7, 8]));
        assert_eq!(ds.labels(), &[3, 1]);
        assert_eq!(ds.features(), 2);
        // The label column may be anywhere; a float anywhere makes floats.
        let (_d, path) = write("a,b,y\n1,2.5,0\n3,-4,1\n");
        let ds = load(&path, "y").unwrap();
        assert_eq!(ds.values, Features::Floats(vec![1.0, 2.5, 3.0, -4.0]));
        assert_eq!(ds.labels(), &[0, 1]);
    }

    #[test]
    fn bad_rows_are_refused_with_their_line() {
        let cases = [
            (
                "label,p1\n1,2\n1,2,3\n",
                "line 3: 3 cells, the header has 2",
            ),
            (
                "label,p1\n1,2\n1,abc\n",
                "line 3, column \"p1\": \"abc\" is not",
            ),
            ("label,p1\n1,nan\n", "line 2, column \"p1\": \"nan\" is not"),
            (
                "label,p1\n1,2\n300,2\n",
                "line 3, column \"label\": label \"300\"",
            ),
            ("y,p1\n1,2\n", "no column \"label\""),
            ("label,p1\n", "holds no examples"),
            ("", "no header"),
        ];
        for (text, want) in cases {
            let (_d, path) = write(text);
            let msg = load(&path, "label").unwrap_err().to_string();
            assert!(msg.contains(want), "{text:?}: {msg}");
            assert!(msg.contains(&path.display().to_string()), "{msg}");
        }
    }

    #[test]
    fn rows_without_labels_for_predict() {
        let (_d, path) = write("p1,p2\n1,2\n3,4\n");
        let rows = read(&path, Some("label"), false).unwrap();
        assert_eq!(rows.labels, None);
        assert_eq!(rows.values, Features::Bytes(vec![1, 2, 3, 4]));
        // With the label column present, it is left out of the features.
        let (_d, path) = write("label,p1,p2\n1,1,2\n");
        let rows = read(&path, Some("label"), false).unwrap();
        assert_eq!(rows.features, 2);
        assert_eq!(rows.labels, Some(vec![1]));
    }
}
