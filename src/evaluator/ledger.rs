//! The evaluator's ledger (`eval/evaluated.jsonl`): one [`Record`] per
//! scored checkpoint, appended as it is scored and read back at start, so
//! a restarted evaluator scores nothing twice. Bounded and torn-line
//! tolerant: a crash mid-append costs one line, not the ledger.

use super::EvaluatorError;
use crate::eval::Scores;
use crate::files::{self, OpenError};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, BufRead, Read, Write};
use std::path::Path;
use tracing::warn;

/// The largest ledger read: about 90 bytes a line, so some 700,000 checkpoints.
const MAX_LEDGER_BYTES: u64 = 64 << 20;

/// The longest ledger line read (a record is some 90 bytes).
pub(super) const MAX_LEDGER_LINE: usize = 4096;

/// One line of the ledger.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// The checkpoint's step.
    pub global_step: u64,
    /// Its scores.
    #[serde(flatten)]
    pub scores: Scores,
}

/// Opens the ledger at `path` for reading with [`files::open_regular`]:
/// without blocking, and only if it is a regular file (a FIFO would make
/// the evaluator deaf to SIGTERM).
fn open_ledger(path: &Path) -> io::Result<fs::File> {
    files::open_regular(path)
        .map(|(file, _)| file)
        .map_err(|e| match e {
            OpenError::Io(e) => e,
            OpenError::Special(kind) => not_regular(kind),
        })
}

/// Opens the ledger at `path` for appending, creating it (mode 0640), with
/// the checks of [`open_ledger`]: non-blocking, and the opened file's type.
fn open_ledger_append(path: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    match files::special_kind(file.metadata()?.file_type()) {
        Some(kind) => Err(not_regular(kind)),
        None => Ok(file),
    }
}

/// The error for a ledger path that is `kind`, not a regular file.
fn not_regular(kind: &str) -> io::Error {
    io::Error::other(format!(
        "is {kind}, not a regular file: remove it and the evaluator starts a new ledger"
    ))
}

/// The ledger's records by step; a missing ledger is empty. A line that
/// does not parse (the torn last line of a crash, bytes that are not
/// UTF-8, a line longer than a record can be) is skipped with a warning.
/// At most [`MAX_LEDGER_BYTES`] are read, a line at a time.
///
/// Errors: [`EvaluatorError::Ledger`] when it cannot be read.
pub fn read_ledger(path: &Path) -> Result<BTreeMap<u64, Scores>, EvaluatorError> {
    let err = |source| EvaluatorError::Ledger {
        path: path.to_path_buf(),
        source,
    };
    let file = match open_ledger(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(err(e)),
    };
    let mut reader = std::io::BufReader::new(file.take(MAX_LEDGER_BYTES));
    let mut out = BTreeMap::new();
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        let n = (&mut reader)
            .take(MAX_LEDGER_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(err)?;
        if n == 0 {
            break;
        }
        if line.len() > MAX_LEDGER_LINE {
            warn!(path = %path.display(), line = number, "Skipping a ledger line longer than a record can be.");
            // The rest of the long line.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                let n = (&mut reader)
                    .take(1 << 16)
                    .read_until(b'\n', &mut rest)
                    .map_err(err)?;
                if n == 0 || rest.last() == Some(&b'\n') {
                    break;
                }
            }
            continue;
        }
        let text = match std::str::from_utf8(&line) {
            Ok(t) => t.trim(),
            Err(e) => {
                warn!(path = %path.display(), line = number, error = %e, "Skipping a ledger line that is not UTF-8.");
                continue;
            }
        };
        if text.is_empty() {
            continue;
        }
        match serde_json::from_str::<Record>(text) {
            Ok(r) => {
                out.insert(r.global_step, r.scores);
            }
            Err(e) => {
                warn!(path = %path.display(), line = number, error = %e, "Skipping a ledger line that does not parse.")
            }
        }
    }
    Ok(out)
}

/// Appends `record` as one line, after a newline if a crash left the last
/// line torn (so the torn line does not swallow this one): only the last
/// byte is read, whatever the ledger's size.
pub(super) fn append_ledger(path: &Path, record: &Record) -> Result<(), EvaluatorError> {
    use std::os::unix::fs::FileExt;
    let err = |source| EvaluatorError::Ledger {
        path: path.to_path_buf(),
        source,
    };
    let mut file = open_ledger_append(path).map_err(err)?;
    let len = file.metadata().map_err(err)?.len();
    let mut last = [b'\n'];
    if len > 0 {
        file.read_exact_at(&mut last, len - 1).map_err(err)?;
    }
    let mut line = if last[0] != b'\n' {
        "\n".to_string()
    } else {
        String::new()
    };
    line.push_str(&serde_json::to_string(record).map_err(|e| err(io::Error::other(e)))?);
    line.push('\n');
    file.write_all(line.as_bytes()).map_err(err)
}
