//! The csv crate's reader over a data file: the delimiter told from the header line, and
//! its errors as the data's.

use super::{DataError, format_error};
use std::path::Path;

/// A reader of the delimited file at `path`, its header first, split at
/// `delimiter` (`data.delimiter`) or, when `None`, at the delimiter its
/// header line uses: a comma, a tab or a semicolon, whichever it holds most
/// of (a comma when it holds none: one column). A TSV export or a European
/// spreadsheet's CSV is then read as it comes.
///
/// Errors: as [`super::super::open_file`]; [`DataError::Io`] reading the header.
pub(crate) fn reader(
    path: &Path,
    delimiter: Option<u8>,
) -> Result<::csv::Reader<std::io::BufReader<std::fs::File>>, DataError> {
    use std::io::{BufRead, Seek};
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::io::BufReader::new(super::super::open_file(path)?);
    if let Some(d) = delimiter {
        return Ok(::csv::ReaderBuilder::new()
            .has_headers(true)
            .delimiter(d)
            .from_reader(file));
    }
    // The header line alone, bounded: a file without newlines is not read whole here.
    let mut first = Vec::new();
    std::io::Read::take(&mut file, 1 << 20)
        .read_until(b'\n', &mut first)
        .map_err(io)?;
    file.rewind().map_err(io)?;
    Ok(::csv::ReaderBuilder::new()
        .has_headers(true)
        .delimiter(detect_delimiter(&first))
        .from_reader(file))
}

/// The delimiter of a header line: [`reader`]'s rule.
pub(super) fn detect_delimiter(line: &[u8]) -> u8 {
    let count = |d: u8| line.iter().filter(|&&b| b == d).count();
    let mut best = b',';
    for d in [b'\t', b';'] {
        if count(d) > count(best) {
            best = d;
        }
    }
    best
}

/// A csv crate error as a format error naming the line.
pub(super) fn csv_error(path: &Path, e: ::csv::Error) -> DataError {
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
