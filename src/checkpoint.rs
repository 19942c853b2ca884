//! Checkpoints: safetensors files of the variables and their EMA shadows,
//! an index, atomic writes, retention, and restore of the newest valid one.
//!
//! A checkpoint at step `N` is two files in the checkpoint directory:
//!
//! - `model.ckpt-N.safetensors`: every variable as F32 plus `global_step` as
//!   an I64 scalar (TensorFlow keeps the step as a variable too);
//! - `model.ckpt-N.ema.safetensors`: the shadows, `<var>/ExponentialMovingAverage`.
//!
//! Both carry string metadata: `format = "dtf-1"`, `global_step`, `kind`
//! (`variables` or `ema`), `crc32:<tensor>` (CRC-32 of the tensor's bytes, so
//! that bit rot inside the data is caught, not only in the header), and in the
//! model file `variables`, a JSON list of the variable names in model order
//! (safetensors itself keeps no order). Any safetensors reader (Python
//! `safetensors.numpy.load_file`, PyTorch) loads them as they are.
//!
//! The `checkpoint` index names the newest and all kept checkpoints, in the
//! spirit of TensorFlow's file of that name. It is a convenience for people
//! and for [`resolve`]; [`restore_latest`] does not trust it and scans the
//! directory instead, because a crash can leave it stale.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensorError, SafeTensors};

use crate::model::VarSpec;

/// Value of the `format` metadata key this module writes and accepts.
pub const FORMAT: &str = "dtf-1";
/// Name of the text index in a checkpoint directory.
pub const INDEX_FILE: &str = "checkpoint";
/// Name of the step tensor in the model file.
pub const GLOBAL_STEP: &str = "global_step";
/// Suffix of a shadow's tensor name in the EMA file (TensorFlow's naming).
pub const EMA_SUFFIX: &str = "/ExponentialMovingAverage";

const PREFIX: &str = "model.ckpt-";
const MODEL_EXT: &str = ".safetensors";
const EMA_EXT: &str = ".ema.safetensors";
const CRC_PREFIX: &str = "crc32:";
/// Stand-ins for file names when [`from_bytes`] parses buffers that came from nowhere.
const MODEL_BYTES: &str = "<model bytes>";
const EMA_BYTES: &str = "<ema bytes>";

/// One training state: the step, every variable and every EMA shadow.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The step the variables were read at.
    pub global_step: u64,
    /// Every variable, in model order, f32.
    pub variables: Vec<(String, ArrayD<f32>)>,
    /// EMA shadows keyed by the *variable's* name (on disk:
    /// `<var>/ExponentialMovingAverage`), in the same order as `variables`.
    pub shadows: Vec<(String, ArrayD<f32>)>,
}

/// What went wrong with a checkpoint; every variant names the file or directory.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file system operation failed (missing file, ENOSPC, EACCES, ...).
    #[error("checkpoint {path}: cannot {action}: {source}")]
    Io {
        /// The file or directory acted on.
        path: PathBuf,
        /// What was being done, e.g. "write", "rename into place".
        action: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// The bytes are not a safetensors file (truncated, garbage header, bad offsets).
    #[error(
        "checkpoint {path}: not a readable safetensors file ({source}); \
         expected a complete file written by dtf (truncated or corrupted?)"
    )]
    Safetensors {
        /// The file that failed to parse.
        path: PathBuf,
        /// The parser's complaint.
        source: SafeTensorError,
    },
    /// The file is a safetensors file, but not a valid dtf checkpoint or not
    /// one of this model; `problem` says what was found and what was expected.
    #[error("checkpoint {path}: {problem}")]
    Invalid {
        /// The offending file.
        path: PathBuf,
        /// What is wrong and what would be right.
        problem: String,
    },
    /// A path that should name a model checkpoint file does not.
    #[error(
        "checkpoint {path}: not a checkpoint file name; expected \
         `model.ckpt-<step>.safetensors` (its EMA sibling is found from it)"
    )]
    BadFileName {
        /// The path given.
        path: PathBuf,
    },
    /// A directory holds no checkpoint at all.
    #[error("checkpoint directory {path}: no `model.ckpt-<step>.safetensors` file in it")]
    NotFound {
        /// The directory searched.
        path: PathBuf,
    },
    /// A directory holds checkpoints but none of them verifies.
    #[error(
        "checkpoint directory {path}: none of its {count} checkpoints verifies \
         (newest: {newest}); fix the configuration to match them, or move them \
         away to start afresh"
    )]
    NoneValid {
        /// The directory searched.
        path: PathBuf,
        /// How many candidates were tried.
        count: usize,
        /// Why the newest was rejected.
        newest: Box<CheckpointError>,
    },
}

impl CheckpointError {
    pub(crate) fn io(path: &Path, action: &'static str, source: io::Error) -> Self {
        CheckpointError::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    }

    fn invalid(path: &Path, problem: impl Into<String>) -> Self {
        CheckpointError::Invalid {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}

/// Writes one byte buffer to an open file; a seam so tests can inject ENOSPC.
type WriteFn = fn(&Path, &mut File, &[u8]) -> io::Result<()>;

fn write_all(_path: &Path, file: &mut File, bytes: &[u8]) -> io::Result<()> {
    file.write_all(bytes)
}

/// Writes checkpoints into one directory and keeps the newest few.
///
/// [`Saver::save`] blocks on disk I/O and fsync; run it with
/// `tokio::task::spawn_blocking`, off the training loop.
#[derive(Debug, Clone)]
pub struct Saver {
    /// The checkpoint directory (created by [`Saver::new`]).
    dir: PathBuf,
    /// How many checkpoints to keep; 0 keeps all (as TensorFlow's `Saver`).
    max_to_keep: usize,
    /// How bytes reach a temp file; [`write_all`] except in fault-injection tests.
    write: WriteFn,
}

impl Saver {
    /// A saver for `dir`, creating it (mode 0750) if missing.
    /// `max_to_keep == 0` keeps every checkpoint.
    ///
    /// Errors: [`CheckpointError::Io`] if the directory cannot be created or
    /// `dir` exists and is not a directory.
    pub fn new(dir: &Path, max_to_keep: usize) -> Result<Self, CheckpointError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|e| CheckpointError::io(dir, "create directory", e))?;
        Ok(Saver {
            dir: dir.to_path_buf(),
            max_to_keep,
            write: write_all,
        })
    }

    /// Writes `model.ckpt-<step>.ema.safetensors`, then
    /// `model.ckpt-<step>.safetensors`, then the `checkpoint` index, each
    /// atomically (temp file, fsync, rename, fsync the directory); then deletes
    /// both files of every checkpoint beyond the newest `max_to_keep` by step
    /// (the one just written is always kept). Returns the model file's path.
    ///
    /// Both temp files are written and synced before either is renamed, so a
    /// failed write (ENOSPC, EACCES) changes nothing but leaving no temp file.
    /// Re-saving an existing step replaces its two files one after the other;
    /// a crash between the two renames leaves a pair from the same step.
    ///
    /// Errors: [`CheckpointError::Invalid`] if `ckpt` would not load back
    /// (non-finite value, a variable without a shadow, a duplicate name, a
    /// step beyond i64); [`CheckpointError::Io`] naming the file that failed.
    pub fn save(&self, ckpt: &Checkpoint) -> Result<PathBuf, CheckpointError> {
        let model_name = model_file_name(ckpt.global_step);
        let model_path = self.dir.join(&model_name);
        let ema_path = self.dir.join(ema_file_name(ckpt.global_step));
        let (model_bytes, ema_bytes) =
            to_bytes(ckpt).map_err(|p| CheckpointError::invalid(&model_path, p))?;

        self.remove_stale_temps();
        let model_existed = model_path.exists();
        let ema_tmp = self.write_temp(&ema_path, &ema_bytes)?;
        let model_tmp = match self.write_temp(&model_path, &model_bytes) {
            Ok(t) => t,
            Err(e) => {
                let _ = fs::remove_file(&ema_tmp);
                return Err(e);
            }
        };
        if let Err(e) = fs::rename(&ema_tmp, &ema_path) {
            let _ = fs::remove_file(&ema_tmp);
            let _ = fs::remove_file(&model_tmp);
            return Err(CheckpointError::io(&ema_path, "rename into place", e));
        }
        if let Err(e) = fs::rename(&model_tmp, &model_path) {
            let _ = fs::remove_file(&model_tmp);
            if !model_existed {
                // An EMA file without its model file is never a candidate, but
                // would confuse an operator; it is ours to remove.
                let _ = fs::remove_file(&ema_path);
            }
            return Err(CheckpointError::io(&model_path, "rename into place", e));
        }
        sync_dir(&self.dir)?;

        let steps = scan_steps(&self.dir)?;
        let (kept, pruned) = retention(&steps, ckpt.global_step, self.max_to_keep);
        let index = index_text(&model_name, &kept);
        self.write_atomically(&self.dir.join(INDEX_FILE), index.as_bytes())?;

        for step in pruned {
            for path in [
                self.dir.join(model_file_name(step)),
                self.dir.join(ema_file_name(step)),
            ] {
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    // The new checkpoint is safe; a file we could not prune is
                    // only a disk-usage problem, retried at the next save.
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "Cannot delete old checkpoint file.")
                    }
                }
            }
        }
        tracing::debug!(step = ckpt.global_step, path = %model_path.display(), "Checkpoint written.");
        Ok(model_path)
    }

    /// Writes `bytes` to a temp file beside `path`, synced; returns the temp path.
    /// On failure the temp file is removed.
    fn write_temp(&self, path: &Path, bytes: &[u8]) -> Result<PathBuf, CheckpointError> {
        let tmp = temp_path(path);
        let result = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o640)
                .open(&tmp)
                .map_err(|e| CheckpointError::io(&tmp, "create", e))?;
            (self.write)(&tmp, &mut file, bytes)
                .map_err(|e| CheckpointError::io(&tmp, "write", e))?;
            file.sync_all()
                .map_err(|e| CheckpointError::io(&tmp, "fsync", e))
        })();
        match result {
            Ok(()) => Ok(tmp),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Temp file, fsync, rename over `path`, fsync the directory.
    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
        let tmp = self.write_temp(path, bytes)?;
        if let Err(e) = fs::rename(&tmp, path) {
            let _ = fs::remove_file(&tmp);
            return Err(CheckpointError::io(path, "rename into place", e));
        }
        sync_dir(&self.dir)
    }

    /// Removes temp files left by a crashed writer: those of a process that no
    /// longer exists (a live one may be mid-write).
    fn remove_stale_temps(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let me = std::process::id();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(pid) = temp_owner(name) else {
                continue;
            };
            if pid != me && !Path::new("/proc").join(pid.to_string()).exists() {
                let path = entry.path();
                match fs::remove_file(&path) {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "Removed a temp file left by a crash.")
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "Cannot remove stale temp file.")
                    }
                }
            }
        }
    }
}

/// `.<name>.tmp-<pid>` beside `path`: hidden, and never matching a checkpoint name.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("checkpoint");
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// The pid in a temp file name written by [`temp_path`] for a checkpoint file.
fn temp_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    if !(rest.starts_with(PREFIX) || rest.starts_with(INDEX_FILE)) {
        return None;
    }
    let (_, pid) = rest.rsplit_once(".tmp-")?;
    pid.parse().ok()
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| CheckpointError::io(dir, "fsync directory", e))
}

fn model_file_name(step: u64) -> String {
    format!("{PREFIX}{step}{MODEL_EXT}")
}

fn ema_file_name(step: u64) -> String {
    format!("{PREFIX}{step}{EMA_EXT}")
}

/// The step in a canonical `model.ckpt-<step>.safetensors` name (no sign, no
/// leading zeros, so one step has one name); `None` for anything else,
/// including EMA files and temp files.
pub fn parse_model_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(MODEL_EXT)?;
    parse_step(digits)
}

fn parse_ema_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(EMA_EXT)?;
    parse_step(digits)
}

fn parse_step(digits: &str) -> Option<u64> {
    let n: u64 = digits.parse().ok()?;
    (digits.bytes().all(|b| b.is_ascii_digit()) && n.to_string() == digits).then_some(n)
}

/// Steps found in `dir`: (model files, EMA files), each ascending.
struct Steps {
    model: Vec<u64>,
    ema: Vec<u64>,
}

fn scan_steps(dir: &Path) -> Result<Steps, CheckpointError> {
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

/// (kept model steps ascending, steps whose files to delete). `current` is
/// always kept; the other places go to the newest steps. EMA files whose
/// model file is gone and that are not kept are deleted too.
fn retention(steps: &Steps, current: u64, max_to_keep: usize) -> (Vec<u64>, Vec<u64>) {
    let mut kept: Vec<u64> = if max_to_keep == 0 {
        steps.model.clone()
    } else {
        let others = steps.model.iter().rev().filter(|&&s| s != current);
        std::iter::once(current)
            .chain(others.take(max_to_keep - 1).copied())
            .collect()
    };
    if !kept.contains(&current) {
        kept.push(current);
    }
    kept.sort_unstable();
    let keep: HashSet<u64> = kept.iter().copied().collect();
    let mut pruned: Vec<u64> = steps
        .model
        .iter()
        .chain(&steps.ema)
        .copied()
        .filter(|s| !keep.contains(s))
        .collect();
    pruned.sort_unstable();
    pruned.dedup();
    (kept, pruned)
}

fn index_text(newest: &str, kept: &[u64]) -> String {
    let mut text = format!("model_checkpoint_path: \"{newest}\"\n");
    for &step in kept {
        text.push_str(&format!(
            "all_model_checkpoint_paths: \"{}\"\n",
            model_file_name(step)
        ));
    }
    text
}

/// The `model_checkpoint_path` of an index file's text, if it has one.
fn index_newest(text: &str) -> Option<&str> {
    text.lines().find_map(|line| {
        let value = line.trim().strip_prefix("model_checkpoint_path:")?.trim();
        value.strip_prefix('"')?.strip_suffix('"')
    })
}

// ---------------------------------------------------------------------------
// Encoding

fn crc32(bytes: &[u8]) -> String {
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    format!("{:08x}", crc.sum())
}

fn f32_bytes(a: &ArrayD<f32>) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len() * 4);
    for x in a.iter() {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Checks that `ckpt` would load back, so that a bad state (a diverged run's
/// NaNs) is refused at save time instead of becoming the newest checkpoint.
fn check_saveable(ckpt: &Checkpoint) -> Result<(), String> {
    if i64::try_from(ckpt.global_step).is_err() {
        return Err(format!(
            "global_step {} does not fit the on-disk int64",
            ckpt.global_step
        ));
    }
    let mut names = HashSet::new();
    for (name, value) in &ckpt.variables {
        if name == GLOBAL_STEP || name.ends_with(EMA_SUFFIX) || name.is_empty() {
            return Err(format!(
                "refusing to save a variable named {name:?}: the name is reserved"
            ));
        }
        if !names.insert(name.as_str()) {
            return Err(format!("refusing to save: variable {name:?} appears twice"));
        }
        if let Some(i) = value.iter().position(|x| !x.is_finite()) {
            return Err(format!(
                "refusing to save: variable {name:?} holds a non-finite value at flat index {i}"
            ));
        }
    }
    let shadows: HashMap<&str, &ArrayD<f32>> =
        ckpt.shadows.iter().map(|(n, a)| (n.as_str(), a)).collect();
    if shadows.len() != ckpt.shadows.len() {
        return Err("refusing to save: a shadow appears twice".into());
    }
    for (name, value) in &ckpt.variables {
        let Some(shadow) = shadows.get(name.as_str()) else {
            return Err(format!(
                "refusing to save: variable {name:?} has no EMA shadow"
            ));
        };
        if shadow.shape() != value.shape() {
            return Err(format!(
                "refusing to save: shadow of {name:?} has shape {:?}, the variable {:?}",
                shadow.shape(),
                value.shape()
            ));
        }
        if let Some(i) = shadow.iter().position(|x| !x.is_finite()) {
            return Err(format!(
                "refusing to save: shadow of {name:?} holds a non-finite value at flat index {i}"
            ));
        }
    }
    if let Some((name, _)) = ckpt
        .shadows
        .iter()
        .find(|(n, _)| !names.contains(n.as_str()))
    {
        return Err(format!(
            "refusing to save: shadow {name:?} belongs to no variable"
        ));
    }
    Ok(())
}

/// Serializes a checkpoint to (model file bytes, EMA file bytes).
fn to_bytes(ckpt: &Checkpoint) -> Result<(Vec<u8>, Vec<u8>), String> {
    check_saveable(ckpt)?;
    encode(ckpt)
}

/// [`to_bytes`] without the checks (tests use it to write damaged checkpoints).
fn encode(ckpt: &Checkpoint) -> Result<(Vec<u8>, Vec<u8>), String> {
    let step = ckpt.global_step.to_string();
    let var_names: Vec<&str> = ckpt.variables.iter().map(|(n, _)| n.as_str()).collect();

    let mut model: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = ckpt
        .variables
        .iter()
        .map(|(n, a)| (n.clone(), Dtype::F32, a.shape().to_vec(), f32_bytes(a)))
        .collect();
    let step_i64 = i64::try_from(ckpt.global_step).map_err(|e| e.to_string())?;
    model.push((
        GLOBAL_STEP.to_string(),
        Dtype::I64,
        Vec::new(),
        step_i64.to_le_bytes().to_vec(),
    ));
    let mut model_meta = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("global_step".to_string(), step.clone()),
        ("kind".to_string(), "variables".to_string()),
        (
            "variables".to_string(),
            serde_json::to_string(&var_names).map_err(|e| e.to_string())?,
        ),
    ]);

    let by_name: HashMap<&str, &ArrayD<f32>> =
        ckpt.shadows.iter().map(|(n, a)| (n.as_str(), a)).collect();
    let ema: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = ckpt
        .variables
        .iter()
        .filter_map(|(n, _)| by_name.get(n.as_str()).map(|a| (n, a)))
        .map(|(n, a)| {
            (
                format!("{n}{EMA_SUFFIX}"),
                Dtype::F32,
                a.shape().to_vec(),
                f32_bytes(a),
            )
        })
        .collect();
    let mut ema_meta = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("global_step".to_string(), step),
        ("kind".to_string(), "ema".to_string()),
    ]);

    let encode_file = |tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
                       meta: &mut HashMap<String, String>|
     -> Result<Vec<u8>, String> {
        let mut views = Vec::with_capacity(tensors.len());
        for (name, dtype, shape, bytes) in tensors {
            meta.insert(format!("{CRC_PREFIX}{name}"), crc32(bytes));
            let view = TensorView::new(*dtype, shape.clone(), bytes)
                .map_err(|e| format!("cannot encode tensor {name:?}: {e}"))?;
            views.push((name.as_str(), view));
        }
        safetensors::serialize(views, Some(meta.clone())).map_err(|e| e.to_string())
    };
    Ok((
        encode_file(&model, &mut model_meta)?,
        encode_file(&ema, &mut ema_meta)?,
    ))
}

// ---------------------------------------------------------------------------
// Decoding and verification

/// A parsed file: its tensors and metadata, checked for format, kind and CRCs.
struct Parsed<'a> {
    tensors: SafeTensors<'a>,
    meta: HashMap<String, String>,
    global_step: u64,
}

fn parse_file<'a>(bytes: &'a [u8], path: &Path, kind: &str) -> Result<Parsed<'a>, CheckpointError> {
    let tensors =
        SafeTensors::deserialize(bytes).map_err(|source| CheckpointError::Safetensors {
            path: path.to_path_buf(),
            source,
        })?;
    let (_, header) =
        SafeTensors::read_metadata(bytes).map_err(|source| CheckpointError::Safetensors {
            path: path.to_path_buf(),
            source,
        })?;
    let meta = header.metadata().clone().unwrap_or_default();
    let get = |key: &str| meta.get(key).map(String::as_str);
    match get("format") {
        Some(FORMAT) => {}
        other => {
            return Err(CheckpointError::invalid(
                path,
                format!(
                    "metadata format is {other:?}, expected \"{FORMAT}\" (not a dtf checkpoint?)"
                ),
            ));
        }
    }
    if get("kind") != Some(kind) {
        return Err(CheckpointError::invalid(
            path,
            format!("metadata kind is {:?}, expected \"{kind}\"", get("kind")),
        ));
    }
    let global_step = get("global_step").and_then(parse_step).ok_or_else(|| {
        CheckpointError::invalid(
            path,
            format!(
                "metadata global_step is {:?}, expected a non-negative integer",
                get("global_step")
            ),
        )
    })?;
    for (name, view) in tensors.iter() {
        let Some(want) = meta.get(&format!("{CRC_PREFIX}{name}")) else {
            return Err(CheckpointError::invalid(
                path,
                format!("tensor {name:?} has no \"{CRC_PREFIX}{name}\" checksum in the metadata"),
            ));
        };
        let got = crc32(view.data());
        if *want != got {
            return Err(CheckpointError::invalid(
                path,
                format!(
                    "tensor {name:?} fails its checksum (crc32 {got}, metadata says {want}): the data is corrupted"
                ),
            ));
        }
    }
    Ok(Parsed {
        tensors,
        meta,
        global_step,
    })
}

/// An F32 tensor's values, checked for dtype, shape and finiteness.
fn read_f32(
    parsed: &Parsed<'_>,
    path: &Path,
    tensor: &str,
    shape: Option<&[usize]>,
) -> Result<ArrayD<f32>, CheckpointError> {
    let view = parsed
        .tensors
        .tensor(tensor)
        .map_err(|_| CheckpointError::invalid(path, format!("tensor {tensor:?} is missing")))?;
    if view.dtype() != Dtype::F32 {
        return Err(CheckpointError::invalid(
            path,
            format!(
                "tensor {tensor:?} has dtype {:?}, expected F32",
                view.dtype()
            ),
        ));
    }
    if let Some(shape) = shape
        && view.shape() != shape
    {
        return Err(CheckpointError::invalid(
            path,
            format!(
                "tensor {tensor:?} has shape {:?}, the model expects {shape:?} (a checkpoint of a different model?)",
                view.shape()
            ),
        ));
    }
    let values: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if let Some(i) = values.iter().position(|x| !x.is_finite()) {
        return Err(CheckpointError::invalid(
            path,
            format!(
                "tensor {tensor:?} holds a non-finite value ({}) at flat index {i}",
                values[i]
            ),
        ));
    }
    ArrayD::from_shape_vec(IxDyn(view.shape()), values)
        .map_err(|e| CheckpointError::invalid(path, format!("tensor {tensor:?}: {e}")))
}

fn parse(
    model: &[u8],
    model_path: &Path,
    ema: &[u8],
    ema_path: &Path,
    expected: Option<&[VarSpec]>,
) -> Result<Checkpoint, CheckpointError> {
    let m = parse_file(model, model_path, "variables")?;
    let e = parse_file(ema, ema_path, "ema")?;
    if m.global_step != e.global_step {
        return Err(CheckpointError::invalid(
            ema_path,
            format!(
                "EMA file is of global_step {}, its model file {} of {}: they must be a pair",
                e.global_step,
                model_path.display(),
                m.global_step
            ),
        ));
    }

    let step_view = m
        .tensors
        .tensor(GLOBAL_STEP)
        .map_err(|_| CheckpointError::invalid(model_path, "tensor \"global_step\" is missing"))?;
    if step_view.dtype() != Dtype::I64 || !step_view.shape().is_empty() {
        return Err(CheckpointError::invalid(
            model_path,
            format!(
                "tensor \"global_step\" is {:?} of shape {:?}, expected an I64 scalar (shape [])",
                step_view.dtype(),
                step_view.shape()
            ),
        ));
    }
    let step_bytes: [u8; 8] = step_view.data().try_into().map_err(|_| {
        CheckpointError::invalid(model_path, "tensor \"global_step\" is not 8 bytes")
    })?;
    let step_value = i64::from_le_bytes(step_bytes);
    if u64::try_from(step_value).ok() != Some(m.global_step) {
        return Err(CheckpointError::invalid(
            model_path,
            format!(
                "tensor global_step is {step_value}, the metadata says {}: they must agree",
                m.global_step
            ),
        ));
    }

    let listed: Vec<String> = m
        .meta
        .get("variables")
        .and_then(|s| serde_json::from_str(s).ok())
        .ok_or_else(|| {
            CheckpointError::invalid(
                model_path,
                "metadata \"variables\" is missing or not a JSON list of names",
            )
        })?;
    let in_file: HashSet<&str> = m
        .tensors
        .iter()
        .map(|(n, _)| n)
        .filter(|n| *n != GLOBAL_STEP)
        .collect();
    let listed_set: HashSet<&str> = listed.iter().map(String::as_str).collect();
    if listed_set != in_file || listed_set.len() != listed.len() {
        let mut extra: Vec<&&str> = in_file.difference(&listed_set).collect();
        extra.sort();
        return Err(CheckpointError::invalid(
            model_path,
            format!(
                "metadata \"variables\" {listed:?} does not list the file's tensors exactly once (unlisted: {extra:?})"
            ),
        ));
    }

    // What to read, in which order, with which shapes.
    let specs: Vec<(String, Option<&[usize]>)> = match expected {
        Some(expected) => {
            let want: HashSet<&str> = expected.iter().map(|v| v.name.as_str()).collect();
            let mut extra: Vec<&str> = listed
                .iter()
                .map(String::as_str)
                .filter(|n| !want.contains(n))
                .collect();
            if !extra.is_empty() {
                extra.sort_unstable();
                return Err(CheckpointError::invalid(
                    model_path,
                    format!(
                        "holds variables {extra:?} the model does not have (a checkpoint of a different model?)"
                    ),
                ));
            }
            expected
                .iter()
                .map(|v| (v.name.clone(), Some(v.shape.as_slice())))
                .collect()
        }
        None => listed.iter().map(|n| (n.clone(), None)).collect(),
    };

    let mut variables = Vec::with_capacity(specs.len());
    let mut shadows = Vec::with_capacity(specs.len());
    for (name, shape) in &specs {
        let value = read_f32(&m, model_path, name, *shape)?;
        let shadow = read_f32(
            &e,
            ema_path,
            &format!("{name}{EMA_SUFFIX}"),
            Some(value.shape()),
        )?;
        variables.push((name.clone(), value));
        shadows.push((name.clone(), shadow));
    }
    if e.tensors.len() != specs.len() {
        let want: HashSet<String> = specs
            .iter()
            .map(|(n, _)| format!("{n}{EMA_SUFFIX}"))
            .collect();
        let mut extra: Vec<&str> = e
            .tensors
            .iter()
            .map(|(n, _)| n)
            .filter(|n| !want.contains(*n))
            .collect();
        extra.sort_unstable();
        return Err(CheckpointError::invalid(
            ema_path,
            format!("holds tensors {extra:?} that shadow no variable of the model file"),
        ));
    }
    Ok(Checkpoint {
        global_step: m.global_step,
        variables,
        shadows,
    })
}

/// Parses a checkpoint from the bytes of its model file and its EMA file —
/// what [`load`] uses after reading the two files.
///
/// Verifies: both are safetensors with `format = "dtf-1"` and the right
/// `kind`; every tensor's CRC-32; both files' `global_step` agree, with the
/// model file's `global_step` tensor; all variables F32 and finite, each with
/// a shadow of its shape. With `expected`, the variables are exactly those
/// names with those shapes, returned in that order; without, in the order the
/// file lists them.
///
/// Errors: [`CheckpointError::Safetensors`] or [`CheckpointError::Invalid`],
/// with `<model bytes>` or `<ema bytes>` for the path. Never panics.
pub fn from_bytes(
    model: &[u8],
    ema: &[u8],
    expected: Option<&[VarSpec]>,
) -> Result<Checkpoint, CheckpointError> {
    parse(
        model,
        Path::new(MODEL_BYTES),
        ema,
        Path::new(EMA_BYTES),
        expected,
    )
}

/// The EMA sibling of a model file path, and the step in its name if it has
/// the canonical `model.ckpt-<step>.safetensors` form.
fn ema_sibling(path: &Path) -> Result<(PathBuf, Option<u64>), CheckpointError> {
    let bad = || CheckpointError::BadFileName {
        path: path.to_path_buf(),
    };
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(bad)?;
    if name.ends_with(EMA_EXT) {
        return Err(CheckpointError::invalid(
            path,
            "this is the EMA file; pass its model file, model.ckpt-<step>.safetensors",
        ));
    }
    let stem = name.strip_suffix(MODEL_EXT).ok_or_else(bad)?;
    Ok((
        path.with_file_name(format!("{stem}{EMA_EXT}")),
        parse_model_name(name),
    ))
}

fn read(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    fs::read(path).map_err(|e| CheckpointError::io(path, "read", e))
}

/// Loads `path` (a `model.ckpt-<N>.safetensors` file) and its
/// `model.ckpt-<N>.ema.safetensors` sibling, verifying as [`from_bytes`] does,
/// and that the step is `N`. (A differently named `<x>.safetensors` loads with
/// its `<x>.ema.safetensors`, without the name check.)
///
/// Errors: [`CheckpointError::BadFileName`], [`CheckpointError::Io`] (either
/// file missing or unreadable), [`CheckpointError::Safetensors`],
/// [`CheckpointError::Invalid`].
pub fn load(path: &Path, expected: Option<&[VarSpec]>) -> Result<Checkpoint, CheckpointError> {
    let (ema_path, named_step) = ema_sibling(path)?;
    let model = read(path)?;
    let ema = read(&ema_path)?;
    let ckpt = parse(&model, path, &ema, &ema_path, expected)?;
    if let Some(n) = named_step
        && n != ckpt.global_step
    {
        return Err(CheckpointError::invalid(
            path,
            format!(
                "holds global_step {}, but its name says {n}: renamed by hand?",
                ckpt.global_step
            ),
        ));
    }
    Ok(ckpt)
}

/// The newest checkpoint in `dir` that verifies against `expected`.
///
/// Candidates are every `model.ckpt-<N>.safetensors` in `dir`, newest step
/// first — not the index, which a crash may leave stale. A damaged one is
/// skipped with a warning and left in place for the operator. Temp files are
/// ignored.
///
/// Returns `Ok(None)` when `dir` is missing or holds no checkpoint.
/// Errors: [`CheckpointError::Io`] if `dir` cannot be listed;
/// [`CheckpointError::NoneValid`] if it holds checkpoints and none verifies —
/// starting afresh then would bury them under new ones, so the operator decides.
pub fn restore_latest(
    dir: &Path,
    expected: &[VarSpec],
) -> Result<Option<(PathBuf, Checkpoint)>, CheckpointError> {
    let steps = match scan_steps(dir) {
        Ok(s) => s,
        Err(CheckpointError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut newest_error = None;
    for &step in steps.model.iter().rev() {
        let path = dir.join(model_file_name(step));
        match load(&path, Some(expected)) {
            Ok(ckpt) => return Ok(Some((path, ckpt))),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "Skipping a checkpoint that does not verify; it is left in place.");
                newest_error.get_or_insert(e);
            }
        }
    }
    match newest_error {
        None => Ok(None),
        Some(e) => Err(CheckpointError::NoneValid {
            path: dir.to_path_buf(),
            count: steps.model.len(),
            newest: Box::new(e),
        }),
    }
}

/// For `dtf eval` and `dtf inspect`: a file resolves to itself; a directory to
/// its newest checkpoint — the index's `model_checkpoint_path` if that file
/// exists, else the highest-step `model.ckpt-<N>.safetensors`.
///
/// Errors: [`CheckpointError::Io`] if `path` does not exist or cannot be
/// listed; [`CheckpointError::NotFound`] for a directory without checkpoints.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    let meta = fs::metadata(path).map_err(|e| CheckpointError::io(path, "open", e))?;
    if !meta.is_dir() {
        return Ok(path.to_path_buf());
    }
    if let Ok(text) = fs::read_to_string(path.join(INDEX_FILE))
        && let Some(newest) = index_newest(&text)
    {
        let candidate = path.join(newest);
        if candidate.is_file() {
            return Ok(candidate);
        }
        tracing::warn!(index = %path.join(INDEX_FILE).display(), missing = %candidate.display(), "Checkpoint index is stale; using the newest file instead.");
    }
    let steps = scan_steps(path)?;
    match steps.model.last() {
        Some(&n) => Ok(path.join(model_file_name(n))),
        None => Err(CheckpointError::NotFound {
            path: path.to_path_buf(),
        }),
    }
}

// ---------------------------------------------------------------------------
// Inspection

/// One tensor as a file declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Name in the file, e.g. `layer1/weights/ExponentialMovingAverage`.
    pub name: String,
    /// safetensors dtype, e.g. `F32`.
    pub dtype: String,
    /// Dimensions; `[]` for a scalar.
    pub shape: Vec<usize>,
}

/// What one safetensors file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectedFile {
    /// The file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its `__metadata__`, including the `crc32:<tensor>` checksums.
    pub metadata: BTreeMap<String, String>,
    /// Its tensors, sorted by name.
    pub tensors: Vec<TensorEntry>,
}

/// What a checkpoint holds, for `dtf inspect`; `Display` prints a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// The model file.
    pub model: InspectedFile,
    /// The EMA file, or why it could not be read.
    pub ema: Result<InspectedFile, String>,
    /// `None` if the pair verifies as [`load`] checks it (without a model to
    /// compare to); else what is wrong.
    pub problem: Option<String>,
}

fn inspect_file(path: &Path) -> Result<InspectedFile, CheckpointError> {
    let bytes = read(path)?;
    let (_, header) =
        SafeTensors::read_metadata(&bytes).map_err(|source| CheckpointError::Safetensors {
            path: path.to_path_buf(),
            source,
        })?;
    let mut tensors: Vec<TensorEntry> = header
        .tensors()
        .into_iter()
        .map(|(name, info)| TensorEntry {
            name,
            dtype: format!("{:?}", info.dtype),
            shape: info.shape.clone(),
        })
        .collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(InspectedFile {
        path: path.to_path_buf(),
        bytes: bytes.len() as u64,
        metadata: header
            .metadata()
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        tensors,
    })
}

/// What the checkpoint at `path` (a model file, or a directory as [`resolve`]
/// takes it) holds: the tensors (name, dtype, shape) and metadata of both
/// files, and whether they verify.
///
/// Errors: those of [`resolve`]; [`CheckpointError::Io`] or
/// [`CheckpointError::Safetensors`] if the model file cannot be read or its
/// header parsed. A damaged EMA file or failed verification is reported in
/// the [`Inspection`], not as an error.
pub fn inspect(path: &Path) -> Result<Inspection, CheckpointError> {
    let path = resolve(path)?;
    let (ema_path, _) = ema_sibling(&path)?;
    let model = inspect_file(&path)?;
    let ema = inspect_file(&ema_path).map_err(|e| e.to_string());
    let problem = load(&path, None).err().map(|e| e.to_string());
    Ok(Inspection {
        model,
        ema,
        problem,
    })
}

impl fmt::Display for InspectedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} ({} bytes)", self.path.display(), self.bytes)?;
        let meta: Vec<String> = self
            .metadata
            .iter()
            .filter(|(k, _)| !k.starts_with(CRC_PREFIX))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        writeln!(f, "  metadata: {}", meta.join(" "))?;
        let width = self
            .tensors
            .iter()
            .map(|t| t.name.len())
            .max()
            .unwrap_or(0)
            .max(4);
        writeln!(
            f,
            "  {:<width$}  {:<5}  {:<12}  crc32",
            "name", "dtype", "shape"
        )?;
        for t in &self.tensors {
            let crc = self
                .metadata
                .get(&format!("{CRC_PREFIX}{}", t.name))
                .map_or("-", String::as_str);
            let shape = format!("{:?}", t.shape);
            writeln!(
                f,
                "  {:<width$}  {:<5}  {shape:<12}  {crc}",
                t.name, t.dtype
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.model)?;
        match &self.ema {
            Ok(ema) => write!(f, "{ema}")?,
            Err(e) => writeln!(f, "EMA file: {e}")?,
        }
        match &self.problem {
            None => writeln!(f, "verification: ok"),
            Some(p) => writeln!(f, "verification: FAILED: {p}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Instant;

    /// The variables of an MLP with these widths, built by hand (model.rs's
    /// own `variables()` is not under test here).
    fn specs(layers: &[usize]) -> Vec<VarSpec> {
        let mut out = Vec::new();
        for (i, w) in layers.windows(2).enumerate() {
            out.push(VarSpec {
                name: format!("layer{}/weights", i + 1),
                shape: vec![w[0], w[1]],
            });
            out.push(VarSpec {
                name: format!("layer{}/biases", i + 1),
                shape: vec![w[1]],
            });
        }
        out
    }

    const SMALL: [usize; 3] = [4, 3, 2];

    /// A checkpoint whose every value depends on the step, the variable and
    /// the position, so a mix-up of any of them shows.
    fn sample(step: u64, layers: &[usize]) -> Checkpoint {
        let make = |k: usize, s: &VarSpec, offset: f32| {
            let n: usize = s.shape.iter().product();
            let v = (0..n)
                .map(|i| step as f32 + k as f32 * 0.25 + i as f32 * 1e-3 + offset)
                .collect();
            ArrayD::from_shape_vec(IxDyn(&s.shape), v).unwrap()
        };
        let specs = specs(layers);
        Checkpoint {
            global_step: step,
            variables: specs
                .iter()
                .enumerate()
                .map(|(k, s)| (s.name.clone(), make(k, s, 0.0)))
                .collect(),
            shadows: specs
                .iter()
                .enumerate()
                .map(|(k, s)| (s.name.clone(), make(k, s, -0.5)))
                .collect(),
        }
    }

    fn small_specs() -> Vec<VarSpec> {
        specs(&SMALL)
    }

    fn saver(dir: &Path, keep: usize) -> Saver {
        Saver::new(dir, keep).unwrap()
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn round_trip_preserves_values_step_and_shadows() {
        let tmp = tempfile::tempdir().unwrap();
        let ckpt = sample(1200, &SMALL);
        let path = saver(tmp.path(), 5).save(&ckpt).unwrap();
        assert_eq!(path, tmp.path().join("model.ckpt-1200.safetensors"));
        assert!(tmp.path().join("model.ckpt-1200.ema.safetensors").is_file());

        let loaded = load(&path, Some(&small_specs())).unwrap();
        assert_eq!(loaded, ckpt);
        // Without a model to compare to, the file's own order is kept.
        assert_eq!(load(&path, None).unwrap(), ckpt);
        // The on-disk names are TensorFlow's.
        let ema = fs::read(tmp.path().join("model.ckpt-1200.ema.safetensors")).unwrap();
        let ema = SafeTensors::deserialize(&ema).unwrap();
        let mut names = ema.names();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "layer1/biases/ExponentialMovingAverage",
                "layer1/weights/ExponentialMovingAverage",
                "layer2/biases/ExponentialMovingAverage",
                "layer2/weights/ExponentialMovingAverage"
            ]
        );
        let model = fs::read(&path).unwrap();
        let model = SafeTensors::deserialize(&model).unwrap();
        let step = model.tensor(GLOBAL_STEP).unwrap();
        assert_eq!(step.dtype(), Dtype::I64);
        assert!(step.shape().is_empty());
        assert_eq!(step.data(), 1200i64.to_le_bytes());
    }

    #[test]
    fn save_creates_dir_with_mode_0750() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        saver(&dir, 5);
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        // umask may only take bits away.
        assert_eq!(mode & !0o750, 0, "mode {mode:o}");
    }

    #[test]
    fn index_names_newest_and_all_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&sample(1000, &SMALL)).unwrap();
        s.save(&sample(1200, &SMALL)).unwrap();
        let index = fs::read_to_string(tmp.path().join(INDEX_FILE)).unwrap();
        assert_eq!(
            index,
            "model_checkpoint_path: \"model.ckpt-1200.safetensors\"\n\
             all_model_checkpoint_paths: \"model.ckpt-1000.safetensors\"\n\
             all_model_checkpoint_paths: \"model.ckpt-1200.safetensors\"\n"
        );
        assert_eq!(
            resolve(tmp.path()).unwrap(),
            tmp.path().join("model.ckpt-1200.safetensors")
        );
    }

    #[test]
    fn retention_keeps_newest_two_of_four() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 2);
        for step in [10, 20, 30, 40] {
            s.save(&sample(step, &SMALL)).unwrap();
        }
        assert_eq!(
            names_in(tmp.path()),
            [
                "checkpoint",
                "model.ckpt-30.ema.safetensors",
                "model.ckpt-30.safetensors",
                "model.ckpt-40.ema.safetensors",
                "model.ckpt-40.safetensors"
            ]
        );
        let index = fs::read_to_string(tmp.path().join(INDEX_FILE)).unwrap();
        assert!(!index.contains("ckpt-20"), "{index}");
        assert!(index.contains("all_model_checkpoint_paths: \"model.ckpt-30.safetensors\""));
    }

    #[test]
    fn retention_always_keeps_the_checkpoint_just_written() {
        // A newer (say damaged) checkpoint is kept for the operator, and the
        // one just written, older by step, must survive it.
        let tmp = tempfile::tempdir().unwrap();
        saver(tmp.path(), 5).save(&sample(1000, &SMALL)).unwrap();
        saver(tmp.path(), 1).save(&sample(800, &SMALL)).unwrap();
        assert!(tmp.path().join("model.ckpt-800.safetensors").is_file());
        let index = fs::read_to_string(tmp.path().join(INDEX_FILE)).unwrap();
        assert!(index.starts_with("model_checkpoint_path: \"model.ckpt-800.safetensors\""));
        assert_eq!(
            names_in(tmp.path()),
            [
                "checkpoint",
                "model.ckpt-800.ema.safetensors",
                "model.ckpt-800.safetensors"
            ]
        );
    }

    #[test]
    fn max_to_keep_zero_keeps_all() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 0);
        for step in 1..=7 {
            s.save(&sample(step, &SMALL)).unwrap();
        }
        assert_eq!(
            scan_steps(tmp.path()).unwrap().model,
            (1..=7).collect::<Vec<_>>()
        );
    }

    /// Ways to damage the step-200 checkpoint of a directory that also holds a
    /// good step-100 one.
    #[derive(Debug, Clone, Copy)]
    enum Damage {
        Truncated,
        GarbageHeader,
        WrongShape,
        MissingEma,
        NonFinite,
        BitFlipInData,
        EmaOfOtherStep,
    }

    fn damage(dir: &Path, how: Damage) {
        let model = dir.join("model.ckpt-200.safetensors");
        let ema = dir.join("model.ckpt-200.ema.safetensors");
        match how {
            Damage::Truncated => {
                let bytes = fs::read(&model).unwrap();
                fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
            }
            Damage::GarbageHeader => {
                let mut bytes = fs::read(&model).unwrap();
                bytes[8..40].fill(b'#');
                fs::write(&model, bytes).unwrap();
            }
            Damage::WrongShape => {
                let (m, e) = encode(&sample(200, &[4, 5, 2])).unwrap();
                fs::write(&model, m).unwrap();
                fs::write(&ema, e).unwrap();
            }
            Damage::MissingEma => fs::remove_file(&ema).unwrap(),
            Damage::NonFinite => {
                let mut c = sample(200, &SMALL);
                c.variables[1].1[[2]] = f32::NAN;
                let (m, e) = encode(&c).unwrap();
                fs::write(&model, m).unwrap();
                fs::write(&ema, e).unwrap();
            }
            Damage::BitFlipInData => {
                let mut bytes = fs::read(&ema).unwrap();
                let at = bytes.len() - 3;
                bytes[at] ^= 0x10;
                fs::write(&ema, bytes).unwrap();
            }
            Damage::EmaOfOtherStep => {
                let (_, e) = encode(&sample(100, &SMALL)).unwrap();
                fs::write(&ema, e).unwrap();
            }
        }
    }

    #[test]
    fn restore_skips_damaged_newest_and_leaves_it_in_place() {
        for how in [
            Damage::Truncated,
            Damage::GarbageHeader,
            Damage::WrongShape,
            Damage::MissingEma,
            Damage::NonFinite,
            Damage::BitFlipInData,
            Damage::EmaOfOtherStep,
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let s = saver(tmp.path(), 5);
            s.save(&sample(100, &SMALL)).unwrap();
            s.save(&sample(200, &SMALL)).unwrap();
            damage(tmp.path(), how);
            let before = names_in(tmp.path());

            let newest = tmp.path().join("model.ckpt-200.safetensors");
            assert!(
                load(&newest, Some(&small_specs())).is_err(),
                "{how:?} loads"
            );
            let (path, ckpt) = restore_latest(tmp.path(), &small_specs())
                .unwrap()
                .unwrap_or_else(|| panic!("{how:?}: nothing restored"));
            assert_eq!(
                path,
                tmp.path().join("model.ckpt-100.safetensors"),
                "{how:?}"
            );
            assert_eq!(ckpt, sample(100, &SMALL), "{how:?}");
            assert_eq!(names_in(tmp.path()), before, "{how:?}: files changed");
        }
    }

    #[test]
    fn errors_say_what_is_wrong_and_where() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&sample(200, &SMALL)).unwrap();
        let path = tmp.path().join("model.ckpt-200.safetensors");
        let wrong = specs(&[4, 7, 2]);
        let msg = load(&path, Some(&wrong)).unwrap_err().to_string();
        assert!(msg.contains("model.ckpt-200.safetensors"), "{msg}");
        assert!(
            msg.contains("layer1/weights") && msg.contains("[4, 3]") && msg.contains("[4, 7]"),
            "{msg}"
        );

        damage(tmp.path(), Damage::MissingEma);
        let msg = load(&path, Some(&small_specs())).unwrap_err().to_string();
        assert!(msg.contains("model.ckpt-200.ema.safetensors"), "{msg}");
    }

    #[test]
    fn load_checks_the_step_in_the_file_name() {
        let tmp = tempfile::tempdir().unwrap();
        saver(tmp.path(), 5).save(&sample(100, &SMALL)).unwrap();
        for ext in [MODEL_EXT, EMA_EXT] {
            fs::rename(
                tmp.path().join(format!("model.ckpt-100{ext}")),
                tmp.path().join(format!("model.ckpt-300{ext}")),
            )
            .unwrap();
        }
        let err = load(&tmp.path().join("model.ckpt-300.safetensors"), None).unwrap_err();
        assert!(err.to_string().contains("name says 300"), "{err}");
        assert!(matches!(
            load(&tmp.path().join("model.ckpt-300.ema.safetensors"), None),
            Err(CheckpointError::Invalid { .. })
        ));
        assert!(matches!(
            load(&tmp.path().join("weights.bin"), None),
            Err(CheckpointError::BadFileName { .. })
        ));
    }

    #[test]
    fn load_rejects_variables_the_model_does_not_have() {
        let tmp = tempfile::tempdir().unwrap();
        let path = saver(tmp.path(), 5)
            .save(&sample(100, &[4, 3, 3, 2]))
            .unwrap();
        let err = load(&path, Some(&small_specs())).unwrap_err().to_string();
        assert!(err.contains("layer3/weights"), "{err}");
    }

    #[test]
    fn restore_finds_newest_file_when_index_points_at_missing_file() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&sample(100, &SMALL)).unwrap();
        s.save(&sample(200, &SMALL)).unwrap();
        fs::write(
            tmp.path().join(INDEX_FILE),
            "model_checkpoint_path: \"model.ckpt-900.safetensors\"\n",
        )
        .unwrap();
        let (path, ckpt) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(path, tmp.path().join("model.ckpt-200.safetensors"));
        assert_eq!(ckpt.global_step, 200);
        assert_eq!(resolve(tmp.path()).unwrap(), path);
    }

    #[test]
    fn restore_ignores_a_stale_index_naming_an_older_checkpoint() {
        // A crash after the model file's rename and before the index's.
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&sample(100, &SMALL)).unwrap();
        let index = fs::read(tmp.path().join(INDEX_FILE)).unwrap();
        s.save(&sample(200, &SMALL)).unwrap();
        fs::write(tmp.path().join(INDEX_FILE), index).unwrap();
        let (path, _) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(path, tmp.path().join("model.ckpt-200.safetensors"));
        // resolve trusts an index whose file exists: that is what an operator's
        // `dtf eval DIR` sees, documented as "the index's newest".
        assert_eq!(
            resolve(tmp.path()).unwrap(),
            tmp.path().join("model.ckpt-100.safetensors")
        );
    }

    #[test]
    fn resolve_without_index_takes_highest_step_and_files_resolve_to_themselves() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        for step in [9, 10, 100] {
            s.save(&sample(step, &SMALL)).unwrap();
        }
        fs::remove_file(tmp.path().join(INDEX_FILE)).unwrap();
        let newest = tmp.path().join("model.ckpt-100.safetensors");
        assert_eq!(resolve(tmp.path()).unwrap(), newest);
        assert_eq!(resolve(&newest).unwrap(), newest);
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            resolve(empty.path()),
            Err(CheckpointError::NotFound { .. })
        ));
        assert!(matches!(
            resolve(&empty.path().join("nope")),
            Err(CheckpointError::Io { .. })
        ));
    }

    #[test]
    fn restore_on_missing_or_empty_dir_is_none() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(
            restore_latest(&tmp.path().join("missing"), &small_specs())
                .unwrap()
                .is_none()
        );
        assert!(
            restore_latest(tmp.path(), &small_specs())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn restore_ignores_temp_files_and_odd_names() {
        let tmp = tempfile::tempdir().unwrap();
        saver(tmp.path(), 5).save(&sample(100, &SMALL)).unwrap();
        for name in [
            ".model.ckpt-300.safetensors.tmp-12345",
            ".model.ckpt-300.ema.safetensors.tmp-12345",
            "model.ckpt-0400.safetensors",
            "model.ckpt-+500.safetensors",
            "model.ckpt-600.safetensors.bak",
        ] {
            fs::write(tmp.path().join(name), b"partial").unwrap();
        }
        let (path, _) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(path, tmp.path().join("model.ckpt-100.safetensors"));
    }

    #[test]
    fn restore_errors_when_every_checkpoint_is_damaged() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&sample(200, &SMALL)).unwrap();
        damage(tmp.path(), Damage::Truncated);
        match restore_latest(tmp.path(), &small_specs()) {
            Err(CheckpointError::NoneValid {
                count: 1, newest, ..
            }) => {
                assert!(matches!(*newest, CheckpointError::Safetensors { .. }))
            }
            other => panic!("{other:?}"),
        }
        assert!(tmp.path().join("model.ckpt-200.safetensors").exists());
    }

    fn fail_model_write(path: &Path, file: &mut File, bytes: &[u8]) -> io::Result<()> {
        let name = path.file_name().unwrap().to_str().unwrap();
        if name.starts_with(".model.ckpt-") && !name.contains(".ema.") {
            file.write_all(&bytes[..bytes.len() / 2])?;
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        file.write_all(bytes)
    }

    fn fail_index_write(path: &Path, file: &mut File, bytes: &[u8]) -> io::Result<()> {
        if path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(".checkpoint")
        {
            return Err(io::Error::from_raw_os_error(libc::EACCES));
        }
        file.write_all(bytes)
    }

    #[test]
    fn failed_write_changes_nothing_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let good = saver(tmp.path(), 1);
        good.save(&sample(100, &SMALL)).unwrap();
        let index = fs::read(tmp.path().join(INDEX_FILE)).unwrap();
        let before = names_in(tmp.path());

        let failing = Saver {
            write: fail_model_write,
            ..good.clone()
        };
        let err = failing.save(&sample(200, &SMALL)).unwrap_err();
        match &err {
            CheckpointError::Io { path, source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
                assert!(
                    path.to_str()
                        .unwrap()
                        .contains("model.ckpt-200.safetensors"),
                    "{err}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(names_in(tmp.path()), before);
        assert_eq!(fs::read(tmp.path().join(INDEX_FILE)).unwrap(), index);
        let (path, ckpt) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(
            (path.file_name().unwrap().to_str().unwrap(), ckpt),
            ("model.ckpt-100.safetensors", sample(100, &SMALL))
        );
    }

    #[test]
    fn failed_index_write_keeps_old_index_and_prunes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let good = saver(tmp.path(), 1);
        good.save(&sample(100, &SMALL)).unwrap();
        let index = fs::read(tmp.path().join(INDEX_FILE)).unwrap();
        let failing = Saver {
            write: fail_index_write,
            ..good.clone()
        };
        let err = failing.save(&sample(200, &SMALL)).unwrap_err();
        assert!(err.to_string().contains(".checkpoint.tmp-"), "{err}");
        assert_eq!(fs::read(tmp.path().join(INDEX_FILE)).unwrap(), index);
        // Nothing pruned before the index is written: both steps are there.
        assert_eq!(scan_steps(tmp.path()).unwrap().model, [100, 200]);
        assert!(!names_in(tmp.path()).iter().any(|n| n.contains(".tmp-")));
        // The next good save tidies up.
        good.save(&sample(300, &SMALL)).unwrap();
        assert_eq!(scan_steps(tmp.path()).unwrap().model, [300]);
    }

    #[test]
    fn next_save_removes_temp_files_of_dead_processes_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dead = tmp.path().join(".model.ckpt-5.safetensors.tmp-4000000000");
        let live = tmp.path().join(format!(".checkpoint.tmp-{}", 1));
        let unrelated = tmp.path().join(".hidden.tmp-4000000000");
        for p in [&dead, &live, &unrelated] {
            fs::write(p, b"x").unwrap();
        }
        saver(tmp.path(), 5).save(&sample(7, &SMALL)).unwrap();
        assert!(!dead.exists());
        assert!(live.exists(), "pid 1 is alive: its temp file may be in use");
        assert!(unrelated.exists());
    }

    #[test]
    fn save_refuses_what_would_not_load() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        let mut nan = sample(1, &SMALL);
        nan.shadows[0].1[[0, 0]] = f32::INFINITY;
        let mut unshadowed = sample(1, &SMALL);
        unshadowed.shadows.pop();
        let mut reserved = sample(1, &SMALL);
        reserved.variables[0].0 = GLOBAL_STEP.into();
        let mut huge = sample(1, &SMALL);
        huge.global_step = u64::MAX;
        for bad in [nan, unshadowed, reserved, huge] {
            assert!(
                matches!(s.save(&bad), Err(CheckpointError::Invalid { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(names_in(tmp.path()), Vec::<String>::new());
    }

    #[test]
    fn inspect_lists_both_files() {
        let tmp = tempfile::tempdir().unwrap();
        saver(tmp.path(), 5).save(&sample(200, &SMALL)).unwrap();
        let ins = inspect(tmp.path()).unwrap();
        assert_eq!(ins.problem, None);
        assert_eq!(ins.model.metadata["global_step"], "200");
        assert_eq!(ins.model.metadata["kind"], "variables");
        let step = ins
            .model
            .tensors
            .iter()
            .find(|t| t.name == GLOBAL_STEP)
            .unwrap();
        assert_eq!(
            (step.dtype.as_str(), step.shape.as_slice()),
            ("I64", &[][..])
        );
        let ema = ins.ema.as_ref().unwrap();
        assert_eq!(ema.tensors.len(), 4);
        assert_eq!(ema.metadata["kind"], "ema");
        let text = ins.to_string();
        assert!(
            text.contains("layer1/weights/ExponentialMovingAverage  F32    [4, 3]"),
            "{text}"
        );
        assert!(text.contains("verification: ok"), "{text}");

        damage(tmp.path(), Damage::MissingEma);
        let ins = inspect(tmp.path()).unwrap();
        assert!(ins.ema.is_err());
        assert!(ins.to_string().contains("verification: FAILED"));
    }

    #[test]
    fn full_size_save_and_load_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let layers = [784, 500, 10];
        let ckpt = sample(20000, &layers);
        let s = saver(tmp.path(), 5);
        let t = Instant::now();
        let path = s.save(&ckpt).unwrap();
        let saved = t.elapsed();
        let t = Instant::now();
        let (_, loaded) = restore_latest(tmp.path(), &specs(&layers))
            .unwrap()
            .unwrap();
        let restored = t.elapsed();
        assert_eq!(loaded, ckpt);
        eprintln!(
            "784-500-10: save {saved:?}, restore {restored:?}, {} bytes",
            fs::metadata(path).unwrap().len()
        );
    }

    fn valid_pair() -> (Vec<u8>, Vec<u8>) {
        to_bytes(&sample(77, &SMALL)).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_bytes_never_panic(model in proptest::collection::vec(any::<u8>(), 0..512),
                                       ema in proptest::collection::vec(any::<u8>(), 0..512)) {
            let (good_model, good_ema) = valid_pair();
            prop_assert!(from_bytes(&model, &ema, None).is_err());
            prop_assert!(from_bytes(&model, &good_ema, Some(&small_specs())).is_err());
            prop_assert!(from_bytes(&good_model, &ema, Some(&small_specs())).is_err());
        }

        #[test]
        fn mutated_checkpoints_are_rejected_or_unchanged(
            in_ema in any::<bool>(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let (mut model, mut ema) = valid_pair();
            let target = if in_ema { &mut ema } else { &mut model };
            for (at, byte) in &flips {
                let i = at.index(target.len());
                target[i] = *byte;
            }
            if let Some(cut) = cut {
                let len = cut.index(target.len());
                target.truncate(len);
            }
            for expected in [None, Some(small_specs())] {
                // Some header bytes are slack (padding spaces may become other
                // whitespace): if it loads, the content must be the original.
                if let Ok(c) = from_bytes(&model, &ema, expected.as_deref()) {
                    prop_assert_eq!(c, sample(77, &SMALL));
                }
            }
        }

        #[test]
        fn header_json_with_arbitrary_values_never_panics(
            dtype in prop::sample::select(vec!["F32", "I64", "F16", "BOOL", "U8", "F4"]),
            shape in proptest::collection::vec(0usize..6, 0..4),
            step in prop::sample::select(vec!["77", "-1", "", "007", "99999999999999999999"]),
        ) {
            // A well-formed safetensors file whose content is wrong in various ways.
            let n: usize = shape.iter().product();
            let header = format!(
                r#"{{"__metadata__":{{"format":"dtf-1","kind":"variables","global_step":"{step}","variables":"[\"layer1/weights\"]"}},"layer1/weights":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[0,{n}]}}}}"#
            );
            let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
            bytes.extend(header.as_bytes());
            bytes.extend(std::iter::repeat_n(0u8, n));
            let (_, ema) = valid_pair();
            prop_assert!(from_bytes(&bytes, &ema, None).is_err());
        }
    }
}
