//! What a checkpoint directory holds and the plain file work on it that
//! saving, restoring and the best checkpoints' directory share: the scan of
//! its steps, the one bounded way its files are read ([`read`], [`Limit`]),
//! removing a pair, and the mode of the files written. It imports none of
//! them, so they do not import each other.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{
    CheckpointError, MAX_FILE_BYTES, MAX_HEADER_BYTES, ema_file_name, model_file_name,
    parse_ema_name, parse_model_name,
};
use crate::model::VarSpec;
use crate::optimizer::MAX_SLOTS;

/// The mode of every file a checkpoint, the index and `best/` write.
pub(super) const FILE_MODE: u32 = 0o640;

/// The most bytes of the `checkpoint.dtf` index read: about 60 bytes a line, so
/// some 17,000 kept checkpoints (`max_to_keep = 0` keeps all).
const MAX_INDEX_BYTES: u64 = 1 << 20;

/// Steps found in `dir`: (model files, EMA files), each ascending.
pub(super) struct Steps {
    /// Steps of `model.ckpt-<N>.safetensors` files.
    pub(super) model: Vec<u64>,
    /// Steps of `model.ckpt-<N>.ema.safetensors` files.
    pub(super) ema: Vec<u64>,
}

pub(super) fn scan_steps(dir: &Path) -> Result<Steps, CheckpointError> {
    let entries = fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, "list directory", e))?;
    let mut steps = Steps {
        model: Vec::new(),
        ema: Vec::new(),
    };
    for entry in entries {
        let entry = entry.map_err(|e| CheckpointError::io(dir, "list directory", e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = parse_model_name(name) {
            steps.model.push(n);
        } else if let Some(n) = parse_ema_name(name) {
            steps.ema.push(n);
        }
    }
    steps.model.sort_unstable();
    steps.ema.sort_unstable();
    Ok(steps)
}

/// Reads a checkpoint file, refusing what is not a regular file or is larger
/// than `limit` bytes — the one way checkpoint files are read.
///
/// `O_NONBLOCK` makes `open` return at once on a FIFO (it would otherwise wait
/// for a writer, before the daemon has logged anything and deaf to SIGTERM);
/// the checks run on the opened descriptor (`fstat`), so a file swapped after
/// a `stat` of the path cannot slip past them. Reads at most `limit` bytes
/// even if the file grows meanwhile. (On a regular file `O_NONBLOCK` changes
/// nothing.)
///
/// Errors: [`CheckpointError::Io`], [`CheckpointError::NotRegular`],
/// [`CheckpointError::TooLarge`].
pub(super) fn read(path: &Path, limit: Limit) -> Result<Vec<u8>, CheckpointError> {
    use crate::files::ReadError;
    crate::files::read_bounded(path, limit.bytes).map_err(|e| match e {
        ReadError::Io { what, source } => CheckpointError::io(path, what, source),
        ReadError::Special(what) => CheckpointError::NotRegular {
            path: path.to_path_buf(),
            what,
        },
        ReadError::TooLarge { size, limit: bytes } => CheckpointError::TooLarge {
            path: path.to_path_buf(),
            size,
            limit: bytes,
            allowed: limit.allowed,
        },
    })
}

/// The most bytes [`read`] takes from one file.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limit {
    /// The bound itself.
    pub(super) bytes: u64,
    /// What the bound allows, for [`CheckpointError::TooLarge`].
    pub(super) allowed: &'static str,
}

impl Limit {
    /// For a model unknown here: [`MAX_FILE_BYTES`].
    pub(super) const ANY: Limit = Limit {
        bytes: MAX_FILE_BYTES,
        allowed: "dtf reads as a checkpoint file when the model is not known",
    };

    /// For the `checkpoint.dtf` index: a line per kept checkpoint.
    pub(super) const INDEX: Limit = Limit {
        bytes: MAX_INDEX_BYTES,
        allowed: "a checkpoint index may have",
    };

    /// (model file, EMA file) bounds: with the model known, exactly its f32
    /// tensors (and the model file's 8-byte `global_step`, and room for the
    /// slots of any optimizer: [`MAX_SLOTS`] per variable and two f32
    /// scalars), 8 bytes of header length and at most [`MAX_HEADER_BYTES`]
    /// of header.
    pub(super) fn pair(expected: Option<&[VarSpec]>) -> (Limit, Limit) {
        let Some(expected) = expected else {
            return (Limit::ANY, Limit::ANY);
        };
        let tensors = expected.iter().fold(0u64, |sum, v| {
            let n = v
                .shape
                .iter()
                .fold(1u64, |n, &d| n.saturating_mul(d as u64));
            sum.saturating_add(n.saturating_mul(4))
        });
        let bound = |data: u64| Limit {
            bytes: data.saturating_add(8 + MAX_HEADER_BYTES),
            allowed: "a checkpoint file of this model can take (its tensors \
                      and a header of at most 1 MiB): not a checkpoint of this model?",
        };
        let slots = tensors.saturating_mul(MAX_SLOTS as u64).saturating_add(8);
        (
            bound(tensors.saturating_add(8).saturating_add(slots)),
            bound(tensors),
        )
    }

    /// This bound with room for embedding tables: their size is not known
    /// from the model (rows are made as ids arrive), so they are bounded by
    /// memory's sane maximum, [`MAX_FILE_BYTES`], on top of the model's.
    pub(super) fn with_tables(self) -> Limit {
        Limit {
            bytes: self.bytes.saturating_add(MAX_FILE_BYTES),
            allowed: "a checkpoint file of this model can take (its tensors, a header of at \
                      most 1 MiB, and at most 8 GiB of embedding tables): not a checkpoint \
                      of this model?",
        }
    }
}

/// Deletes the checkpoint pair of `step` in `dir`; a file already gone is
/// fine. Returns the files that could not be deleted, with why, for the
/// caller to log: either way the caller goes on.
pub(super) fn remove_pair(dir: &Path, step: u64) -> Vec<(PathBuf, io::Error)> {
    [model_file_name(step), ema_file_name(step)]
        .into_iter()
        .map(|name| dir.join(name))
        .filter_map(|path| match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Some((path, e)),
            _ => None,
        })
        .collect()
}
