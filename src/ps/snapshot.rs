//! Each ps task's own snapshots of its shard: its fast recovery after a
//! crash, beside the chief's checkpoints (the portable, consistent artifact).
//!
//! Every `ps.snapshot_secs` the shard's state — values, EMA shadows, the
//! optimizer's slots and non-slot scalars, and the step (on ps 0 the global
//! step) — is copied under the shard lock (the only time pushes wait: one
//! `memcpy` of the state into buffers kept from the last snapshot), then
//! encoded and written off the lock: a safetensors file with a CRC per tensor,
//! to a temp file, fsync, rename, fsync the directory. The newest two are
//! kept. Only applied updates are copied: in sync mode a step whose gradients
//! are still being summed is not in the snapshot, so after a restore it is
//! aggregated anew, never applied twice.
//!
//! A file carries its identity (the shard's task, the number of ps tasks,
//! the placement, the variables, the optimizer): a ps restores only its own
//! shard of this model, and ignores any other file with a warning. It also
//! carries the run (the chief's run id, in every checkpoint too). At start
//! [`restore`] reads the newest valid snapshot when it is newer than the
//! newest checkpoint it can see, and holds it aside: the shard stays
//! uninitialized (workers wait) until the chief, which knows its run,
//! adopts it ([`PsService::adopt`]) or seeds the shard as without snapshots.
//! The state directory outlives runs, and a ps on a host that cannot see
//! `checkpoint.dir` cannot tell a new run from its own restart: only the
//! chief can.

use super::PsService;
use super::shard::{Shard, Slots};
use crate::checkpoint::EMA_SUFFIX;
use crate::checkpoint::container::{self, MAX_HEADER_BYTES, ParseError};
use crate::config::Config;
use crate::model::{TableSpec, VarSpec};
use crate::optimizer::SlotSpec;
use crate::transport::call::TableState;
use ndarray::ArrayD;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tracing::warn;

mod periodic;
mod restore;
pub(super) use periodic::run;
pub(super) use restore::{Restore, restore};

/// The `format` metadata of a snapshot file (a checkpoint's is `dtf-1`).
const FORMAT: &str = "dtf-snapshot-1";
/// Metadata key of the shard's identity (JSON, compared as text).
const IDENTITY: &str = "identity";
/// Metadata key of the shard's step.
const STEP: &str = "step";
/// Metadata key of the run the state belongs to (a decimal u64; absent: 0).
const RUN: &str = "run";
/// Metadata key of a snapshot's chain: a random id (16 hex digits) drawn
/// for each whole snapshot and carried by the deltas after it (absent:
/// no delta follows).
const CHAIN: &str = "chain";
/// Metadata key of a delta's place in its chain: 1 for the first after the
/// whole snapshot (absent: a whole snapshot).
const SEQ: &str = "seq";
/// How long a stopping ps gives its last snapshot.
const FINAL_WRITE: Duration = Duration::from_secs(10);

/// Why a snapshot could not be used or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// Unusable: damaged, foreign, or not a dtf snapshot.
    #[error("snapshot {path}: {why}")]
    Invalid { path: PathBuf, why: String },
}

impl SnapshotError {
    fn io(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> Self {
        let path = path.to_path_buf();
        move |source| SnapshotError::Io { path, what, source }
    }
    fn invalid(path: &Path, why: impl Into<String>) -> Self {
        SnapshotError::Invalid {
            path: path.to_path_buf(),
            why: why.into(),
        }
    }
}

/// The directory of ps task `task`'s snapshots: `ps-<task>` under
/// `ps.snapshot_dir`, else under `$STATE_DIRECTORY` (the units'
/// `StateDirectory=dtf`: `/var/lib/dtf/ps-0`), else `$XDG_STATE_HOME/dtf`,
/// else `~/.local/state/dtf`. `None` when none of these is known.
pub fn dir(config: &Config, task: usize) -> Option<PathBuf> {
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let base = if !config.ps.snapshot_dir.is_empty() {
        PathBuf::from(&config.ps.snapshot_dir)
    } else if let Some(dirs) = env("STATE_DIRECTORY") {
        // systemd lists one path per StateDirectory= entry.
        let first = dirs.to_string_lossy().split(':').next()?.to_owned();
        PathBuf::from(first)
    } else if let Some(state) = env("XDG_STATE_HOME") {
        Path::new(&state).join("dtf")
    } else {
        Path::new(&env("HOME")?).join(".local/state/dtf")
    };
    Some(base.join(format!("ps-{task}")))
}

/// What makes a snapshot this shard's: the task, the number of ps tasks and
/// the placement (which variables it holds, which rows it owns), the
/// variables' names and shapes, the tables' names and widths (when the
/// model has tables), and the optimizer with its hyperparameters (its slots).
pub fn identity(config: &Config, task: usize, specs: &[VarSpec]) -> String {
    let vars: Vec<(&str, &[usize])> = specs
        .iter()
        .map(|s| (s.name.as_str(), s.shape.as_slice()))
        .collect();
    let mut id = serde_json::json!({
        "task": task,
        "ps_tasks": config.cluster.ps.len(),
        "placement": config.cluster.placement,
        "layers": config.model.layers,
        "variables": vars,
        "optimizer": config.train.optimizer().describe(),
    });
    // Only with tables: an MLP's snapshots keep the identity they had.
    let tables: Vec<(String, usize)> = crate::placement::tables(config)
        .into_iter()
        .map(|t| (t.name, t.dim))
        .collect();
    if !tables.is_empty() {
        id["tables"] = serde_json::json!(tables);
    }
    // Only with tables' own optimizers: snapshots of tables that follow
    // `train.optimizer` keep the identity they had.
    let rules = config.own_table_optimizers();
    if !rules.is_empty() {
        id["table_optimizers"] = serde_json::json!(rules);
    }
    id.to_string()
}

/// A copy of a shard's state, taken under its lock. Kept between snapshots,
/// so the next copy reuses its buffers (no allocation under the lock).
#[derive(Debug, Default)]
pub struct Image {
    /// The shard's step when copied.
    pub step: u64,
    /// The run its state belongs to.
    pub run: u64,
    /// Its variables, shard order.
    pub values: Vec<ArrayD<f32>>,
    /// Their EMA shadows.
    pub shadows: Vec<ArrayD<f32>>,
    /// The optimizer's slots and this shard's copy of the non-slot scalars.
    pub slots: Option<Slots>,
    /// Every table's rows this ps holds (copied after the shard, each
    /// table under its own lock); in a delta, those changed since the
    /// snapshot before.
    pub tables: Vec<TableState>,
    /// In a delta, each table's ids dropped since the snapshot before
    /// (`tables`' order); empty in a whole snapshot.
    pub removed: Vec<Vec<u64>>,
    /// The chain it starts (a whole snapshot) or continues (a delta).
    pub chain: u64,
    /// 0: a whole snapshot; n: the nth delta after it.
    pub seq: u32,
}

impl Image {
    /// Copies `shard`'s state into this image (its buffers reused when the
    /// shapes match). Returns false, copying nothing, before the shard is
    /// initialized.
    pub fn copy_from(&mut self, shard: &Shard) -> bool {
        let (Ok(values), Ok(shadows), Ok(slots)) = (shard.values(), shard.shadows(), shard.slots())
        else {
            return false;
        };
        copy_arrays(&mut self.values, values);
        copy_arrays(&mut self.shadows, shadows);
        match &mut self.slots {
            Some(mine) if mine.per_var.len() == slots.per_var.len() => {
                for (m, s) in mine.per_var.iter_mut().zip(&slots.per_var) {
                    copy_arrays(m, s);
                }
                mine.non_slots.clone_from(&slots.non_slots);
            }
            mine => *mine = Some(slots.clone()),
        }
        self.step = shard.step();
        self.run = shard.run();
        true
    }

    /// The snapshot file's bytes: every tensor (variables by name, shadows as
    /// `<var>/ExponentialMovingAverage`, slots by TensorFlow's names,
    /// non-slot scalars as 0-d tensors; each table as a checkpoint holds it,
    /// `NAME/ids`, `NAME/values`, `NAME/<slot>` of its spec in `tables` and
    /// `NAME/ExponentialMovingAverage`) with its CRC, the step and `identity`.
    ///
    /// Errors: the safetensors encoder's, as text.
    pub fn encode(
        &self,
        specs: &[VarSpec],
        slot_specs: &[SlotSpec],
        tables: &[TableSpec],
        identity: &str,
    ) -> Result<Vec<u8>, String> {
        let mut tensors: Vec<container::TableTensor<'_>> = Vec::new();
        for (spec, (v, s)) in specs.iter().zip(self.values.iter().zip(&self.shadows)) {
            tensors.push((
                spec.name.clone(),
                Dtype::F32,
                spec.shape.clone(),
                le_bytes(v),
            ));
            let shadow = format!("{}{EMA_SUFFIX}", spec.name);
            tensors.push((shadow, Dtype::F32, spec.shape.clone(), le_bytes(s)));
        }
        let slots = self.slots.as_ref().ok_or("no slots copied")?;
        for spec in slot_specs {
            let bytes: &[u8] = match spec.var {
                Some(i) => le_bytes(&slots.per_var[i][spec.index]),
                None => bytemuck::bytes_of(&slots.non_slots[spec.index]),
            };
            tensors.push((spec.name.clone(), Dtype::F32, spec.shape.clone(), bytes));
        }
        for (i, t) in self.tables.iter().enumerate() {
            let slots = tables
                .iter()
                .find(|s| s.name == t.table)
                .ok_or_else(|| format!("table {:?} is not one of the model's", t.table))?
                .slots;
            let (rows, shadows) = container::table_tensors(&t.table, &t.rows, slots);
            tensors.extend(rows);
            tensors.push(shadows);
            if self.seq > 0 {
                let removed = self.removed.get(i).map_or(&[][..], Vec::as_slice);
                tensors.push(container::removed_tensor(&t.table, removed));
            }
        }
        let mut meta = HashMap::from([
            ("format".to_owned(), FORMAT.to_owned()),
            (IDENTITY.to_owned(), identity.to_owned()),
            (STEP.to_owned(), self.step.to_string()),
            (RUN.to_owned(), self.run.to_string()),
        ]);
        if !tables.is_empty() {
            meta.insert(CHAIN.to_owned(), format!("{:016x}", self.chain));
        }
        if self.seq > 0 {
            meta.insert(SEQ.to_owned(), self.seq.to_string());
        }
        container::encode_named(&tensors, meta)
    }
}

/// An array's f32s as the little-endian bytes they are in memory (dtf
/// runs on little-endian machines only, as its wire format assumes).
fn le_bytes(a: &ArrayD<f32>) -> &[u8] {
    bytemuck::cast_slice(a.as_slice().expect("arrays built by dtf are contiguous"))
}

/// `dst` made equal to `src`: copied in place when the shapes match.
fn copy_arrays(dst: &mut Vec<ArrayD<f32>>, src: &[ArrayD<f32>]) {
    if dst.len() == src.len() && dst.iter().zip(src).all(|(d, s)| d.shape() == s.shape()) {
        for (d, s) in dst.iter_mut().zip(src) {
            d.assign(s);
        }
    } else {
        *dst = src.to_vec();
    }
}

/// `shard-<step>.safetensors`.
fn file_name(step: u64) -> String {
    format!("shard-{step}.safetensors")
}

/// Where [`write`] puts the snapshot of `step` in `dir`.
pub(super) fn path(dir: &Path, step: u64) -> PathBuf {
    dir.join(file_name(step))
}

/// The step in a snapshot's file name.
fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("shard-")?.strip_suffix(".safetensors")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `shard-delta-<chain>-<seq>.safetensors`: the `seq`th delta after the
/// whole snapshot of chain `chain`.
fn delta_name(chain: u64, seq: u32) -> String {
    format!("shard-delta-{chain:016x}-{seq}.safetensors")
}

/// The chain and place in a delta's file name.
fn parse_delta_name(name: &str) -> Option<(u64, u32)> {
    let rest = name
        .strip_prefix("shard-delta-")?
        .strip_suffix(".safetensors")?;
    let (chain, seq) = rest.split_once('-')?;
    let hex = chain.len() == 16 && chain.bytes().all(|b| b.is_ascii_hexdigit());
    // As written: from 1, no leading zero (one name per delta).
    let digits =
        !seq.starts_with('0') && !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit());
    (hex && digits).then_some(())?;
    Some((u64::from_str_radix(chain, 16).ok()?, seq.parse().ok()?))
}

/// A delta file: its chain, its place in it, its path.
pub(super) type DeltaFile = (u64, u32, PathBuf);

/// The deltas in `dir`, in chain then seq order.
pub(super) fn list_deltas(dir: &Path) -> Vec<DeltaFile> {
    let mut found: Vec<DeltaFile> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let (chain, seq) = parse_delta_name(e.file_name().to_str()?)?;
            Some((chain, seq, e.path()))
        })
        .collect();
    found.sort_by_key(|f| (f.0, f.1));
    found
}

/// Writes the `seq`th delta of chain `chain` in `dir` (made 0750 if
/// missing): temp file, fsync, rename, fsync the directory. Nothing is
/// deleted: a chain's deltas go when a newer whole snapshot is written.
///
/// Errors: [`SnapshotError::Io`]; a failed write leaves no temp file.
pub(super) fn write_delta(
    dir: &Path,
    chain: u64,
    seq: u32,
    bytes: &[u8],
) -> Result<PathBuf, SnapshotError> {
    write_named(dir, &delta_name(chain, seq), bytes)
}

/// The snapshot files in `dir`, newest (highest step) first.
pub(super) fn list(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((parse_name(e.file_name().to_str()?)?, e.path())))
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found
}

/// Writes `bytes` as the (whole) snapshot of `step` in `dir` (made 0750 if
/// missing): temp file, fsync, rename, fsync the directory. Then deletes
/// every other snapshot but `keep_also` (the one this process wrote before,
/// in case the newest is damaged), so at most two remain, all of this
/// process's timeline, and every delta but those of the chains `keep_chains`
/// (the new snapshot's, and `keep_also`'s).
///
/// Errors: [`SnapshotError::Io`]; a failed write leaves no temp file and the
/// older snapshots in place.
pub fn write(
    dir: &Path,
    step: u64,
    bytes: &[u8],
    keep_also: Option<&Path>,
    keep_chains: &[u64],
) -> Result<PathBuf, SnapshotError> {
    let path = write_beside(dir, step, bytes)?;
    let deltas = list_deltas(dir)
        .into_iter()
        .filter(|(chain, ..)| !keep_chains.contains(chain))
        .map(|(.., path)| path);
    let wholes = list(dir).into_iter().map(|(_, path)| path);
    for old in wholes.chain(deltas) {
        if old != path
            && Some(old.as_path()) != keep_also
            && let Err(e) = fs::remove_file(&old)
        {
            warn!(path = %old.display(), error = %e, "Cannot delete an old snapshot.");
        }
    }
    Ok(path)
}

/// [`write`] without deleting anything: the file joins those in `dir`, and
/// [`restore`] chooses among them by what they hold (a copy fetched from the
/// ring goes beside the ps's own, which may be newer).
///
/// Errors: [`SnapshotError::Io`]; a failed write leaves no temp file.
pub(super) fn write_beside(dir: &Path, step: u64, bytes: &[u8]) -> Result<PathBuf, SnapshotError> {
    write_named(dir, &file_name(step), bytes)
}

/// `bytes` written as `dir/name` (`dir` made 0750 if missing): temp file,
/// fsync, rename, fsync the directory.
fn write_named(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, SnapshotError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
        .map_err(SnapshotError::io(dir, "create directory"))?;
    let path = dir.join(name);
    crate::files::write_atomic(&path, bytes, 0o640).map_err(SnapshotError::io(&path, "write"))?;
    Ok(path)
}

/// Removes temp files a crashed writer left in `dir` (only this task
/// writes there, and it has just started).
pub(super) fn remove_temps(dir: &Path) {
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        if name
            .to_str()
            .and_then(crate::files::temp_parts)
            .is_some_and(|(file, _)| file.starts_with("shard-"))
        {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// A snapshot read back and checked: the state to initialize the shard with.
pub struct Restored {
    pub step: u64,
    /// The run it belongs to (0: unknown).
    pub run: u64,
    pub values: Vec<ArrayD<f32>>,
    pub shadows: Vec<ArrayD<f32>>,
    pub slots: Slots,
    /// Every table's rows, checked against its width (in a delta, those
    /// changed since the snapshot before).
    pub tables: Vec<TableState>,
    /// In a delta: each table's rows dropped since the snapshot before.
    pub removed: Vec<Vec<u64>>,
    /// Its chain (`None`: a snapshot that no delta follows).
    pub chain: Option<u64>,
    /// 0: a whole snapshot; n: the nth delta of its chain (after
    /// [`Restored::patch`], the deltas applied).
    pub seq: u32,
}

impl Restored {
    /// This whole snapshot with `delta`, the next of its chain, applied:
    /// the delta's dense state, step and run, and the tables' rows patched
    /// ([`Rows::patched`](crate::model::table::Rows::patched)).
    ///
    /// Errors: a delta of another chain or place, an older step, or rows
    /// that do not fit the table's; nothing changed.
    pub fn patch(&mut self, delta: Restored) -> Result<(), String> {
        if delta.chain != self.chain || delta.seq != self.seq + 1 {
            return Err(format!(
                "it is delta {} of chain {:016x}, expected delta {} of {:016x}",
                delta.seq,
                delta.chain.unwrap_or(0),
                self.seq + 1,
                self.chain.unwrap_or(0)
            ));
        }
        if delta.step < self.step {
            return Err(format!(
                "it holds step {}, older than the {} it follows",
                delta.step, self.step
            ));
        }
        for (t, d) in self.tables.iter().zip(&delta.tables) {
            t.rows
                .fits(&d.rows)
                .map_err(|e| format!("table {}: {e}", t.table))?;
        }
        let mut removed = delta.removed.into_iter();
        for (t, d) in self.tables.iter_mut().zip(delta.tables) {
            let gone = removed.next().unwrap_or_default();
            let rows = std::mem::take(&mut t.rows);
            t.rows = rows.patched(&gone, d.rows);
        }
        self.step = delta.step;
        self.run = delta.run;
        self.values = delta.values;
        self.shadows = delta.shadows;
        self.slots = delta.slots;
        self.seq = delta.seq;
        Ok(())
    }
}

/// The largest file a snapshot of a shard of `specs` may be: its tensors
/// (values, shadows, `optimizer`'s slots and non-slot scalars), `rows`
/// bytes of table rows (rows are made as ids arrive, so nothing tells
/// their number before the file is read: [`rows_bound`]), and a header of
/// at most [`MAX_HEADER_BYTES`].
pub(super) fn size_bound(
    specs: &[VarSpec],
    optimizer: &crate::optimizer::Optimizer,
    rows: u64,
) -> u64 {
    let floats: u64 = specs
        .iter()
        .map(|s| s.shape.iter().product::<usize>() as u64)
        .sum();
    let copies = 2 + optimizer.slot_names().len() as u64;
    4 * (floats * copies + optimizer.non_slot_names().len() as u64) + rows + 8 + MAX_HEADER_BYTES
}

/// The bytes of table rows a snapshot may hold: none without tables; as
/// many as a checkpoint may ([`crate::checkpoint::MAX_FILE_BYTES`]) in the
/// ps's own directory (`ring` false); as many as one message carries
/// ([`crate::transport::TABLE_BYTES`]) in a ring copy.
pub(super) fn rows_bound(tables: bool, ring: bool) -> u64 {
    match (tables, ring) {
        (false, _) => 0,
        (true, false) => crate::checkpoint::MAX_FILE_BYTES,
        (true, true) => crate::transport::TABLE_BYTES as u64,
    }
}

/// A snapshot file's bytes, checked: every tensor as read, its step, run,
/// chain and place in it.
pub(super) struct Checked<'a> {
    pub tensors: SafeTensors<'a>,
    pub step: u64,
    pub run: u64,
    pub chain: Option<u64>,
    pub seq: u32,
}

/// Checks a snapshot file's bytes (`path` names it in errors): the header
/// bound, the format, `identity`, the step and run, and every tensor's
/// dtype and CRC. What the shard's own checks add is [`load`]'s.
///
/// Errors: [`SnapshotError::Invalid`] saying what is wrong.
fn another_shard(path: &Path, held: Option<&str>, identity: &str) -> SnapshotError {
    SnapshotError::invalid(
        path,
        format!(
            "it is of another run or shard: it holds {}, this shard is {identity}",
            held.unwrap_or("no identity")
        ),
    )
}

/// Refuses the file at `path` when its header names another identity,
/// before its body is read: after a re-shard every snapshot on the disk is
/// of the old placement, each up to a whole shard's bytes. Any other
/// problem is left to [`verify`], which reads the whole file.
pub(super) fn of_this_shard(path: &Path, identity: &str) -> Result<(), SnapshotError> {
    match crate::checkpoint::read_metadata(path) {
        Ok(meta) if meta.get("format").map(String::as_str) == Some(FORMAT) => {
            match meta.get(IDENTITY).map(String::as_str) {
                Some(held) if held != identity => Err(another_shard(path, Some(held), identity)),
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

pub(super) fn verify<'a>(
    path: &Path,
    bytes: &'a [u8],
    identity: &str,
) -> Result<Checked<'a>, SnapshotError> {
    let (tensors, meta) = container::parse(bytes).map_err(|e| match e {
        ParseError::HeaderTooLarge(_) => SnapshotError::invalid(
            path,
            format!("its header claims more than {MAX_HEADER_BYTES} bytes"),
        ),
        ParseError::Safetensors(e) => SnapshotError::invalid(path, e.to_string()),
    })?;
    let get = |k: &str| meta.get(k).map(String::as_str);
    if get("format") != Some(FORMAT) {
        return Err(SnapshotError::invalid(
            path,
            format!(
                "metadata format is {:?}, expected \"{FORMAT}\" (not a dtf snapshot)",
                get("format")
            ),
        ));
    }
    if get(IDENTITY) != Some(identity) {
        return Err(another_shard(path, get(IDENTITY), identity));
    }
    let step: u64 = get(STEP)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| SnapshotError::invalid(path, format!("metadata step is {:?}", get(STEP))))?;
    let run: u64 = match get(RUN) {
        None => 0,
        Some(text) => text
            .parse()
            .map_err(|_| SnapshotError::invalid(path, format!("metadata run is {text:?}")))?,
    };
    let chain = match get(CHAIN) {
        None => None,
        Some(text) => Some(
            u64::from_str_radix(text, 16)
                .map_err(|_| SnapshotError::invalid(path, format!("metadata chain is {text:?}")))?,
        ),
    };
    let seq: u32 = match get(SEQ) {
        None => 0,
        Some(text) => text
            .parse()
            .ok()
            .filter(|&n| n > 0 && chain.is_some())
            .ok_or_else(|| SnapshotError::invalid(path, format!("metadata seq is {text:?}")))?,
    };
    // A delta's name says its chain and place: a file whose name claims
    // others was renamed by hand.
    let name = path.file_name().and_then(|n| n.to_str());
    if let Some((named_chain, named_seq)) = name.and_then(parse_delta_name)
        && (Some(named_chain) != chain || named_seq != seq)
    {
        return Err(SnapshotError::invalid(
            path,
            format!(
                "it is delta {seq} of chain {:016x} but is named for delta {named_seq} of \
                 {named_chain:016x}; it is not restored",
                chain.unwrap_or(0)
            ),
        ));
    }
    if seq > 0 && name.is_some_and(|n| parse_name(n).is_some()) {
        return Err(SnapshotError::invalid(
            path,
            "it is a delta named as a whole snapshot; it is not restored",
        ));
    }
    // A file's identity is what it holds: one whose name claims another step
    // (an older snapshot renamed, or a backup put back under a newer name)
    // would otherwise be taken for the newest (issue 45).
    if let Some(named) = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(parse_name)
        && named != step
    {
        return Err(SnapshotError::invalid(
            path,
            format!(
                "it holds step {step} but is named for step {named}: an older snapshot renamed \
                 or put back by hand; it is not restored"
            ),
        ));
    }
    for (name, view) in tensors.iter() {
        // A table's ids are I64 (load checks they are a table's).
        let ids = (name.ends_with(container::IDS_SUFFIX)
            || name.ends_with(container::REMOVED_SUFFIX))
            && view.dtype() == Dtype::I64;
        if view.dtype() != Dtype::F32 && !ids {
            return Err(SnapshotError::invalid(
                path,
                format!("tensor {name:?} is {:?}, expected F32", view.dtype()),
            ));
        }
        // A missing CRC and a wrong one are alike here: the file is damaged.
        if container::check_crc(&meta, name, view.data()).is_err() {
            return Err(SnapshotError::invalid(
                path,
                format!("tensor {name:?} fails its checksum: the file is damaged"),
            ));
        }
    }
    Ok(Checked {
        tensors,
        step,
        run,
        chain,
        seq,
    })
}

/// Reads and checks the snapshot at `path` for `shard` and the tables
/// `tables`: a regular file no larger than [`size_bound`], [`verify`], then
/// the shard's own checks (every variable, shadow and slot exactly once,
/// its shape, finite values) and each table's (ids ascending, rows as wide
/// as the table, finite: [`container::read_rows`]).
///
/// Errors: [`SnapshotError`] saying what is wrong; nothing is changed.
pub fn load(
    path: &Path,
    shard: &Shard,
    identity: &str,
    tables: &[TableSpec],
) -> Result<Restored, SnapshotError> {
    let rows = rows_bound(!tables.is_empty(), false);
    let bound = size_bound(shard.specs(), &shard.optimizer(), rows);
    of_this_shard(path, identity)?;
    let bytes = read_regular(path, bound)?;
    let Checked {
        tensors,
        step,
        run,
        chain,
        seq,
    } = verify(path, &bytes, identity)?;
    let restored_tables = tables
        .iter()
        .map(|t| {
            container::read_rows(&tensors, &tensors, &t.name, t.slots, Some(t.dim))
                .map(|rows| TableState {
                    table: t.name.clone(),
                    rows,
                })
                .map_err(|p| SnapshotError::invalid(path, p.why))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let removed = match seq {
        0 => Vec::new(),
        _ => tables
            .iter()
            .map(|t| {
                // Not checked against the rows: a snapshot from before
                // removed ids left out the ones created again may list them.
                container::read_removed(&tensors, &t.name, &[])
                    .map_err(|why| SnapshotError::invalid(path, why))
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    let table_tensors: std::collections::HashSet<String> = tables
        .iter()
        .flat_map(|t| {
            container::table_tensor_names(&t.name, t.slots)
                .into_iter()
                .chain([format!("{}{EMA_SUFFIX}", t.name)])
                .chain((seq > 0).then(|| format!("{}{}", t.name, container::REMOVED_SUFFIX)))
        })
        .collect();
    let views: Vec<(&str, TensorView<'_>)> = tensors.iter().collect();
    let (mut values, mut shadows, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    for (name, view) in &views {
        let name: &str = name;
        // The tables' tensors were read above; anything else is left to the
        // shard's checks, which refuse what it does not hold.
        if table_tensors.contains(name) {
            continue;
        }
        let item = (name, view.shape(), view.data());
        if let Some(var) = name.strip_suffix(EMA_SUFFIX) {
            shadows.push((var, item.1, item.2));
        } else if shard.specs().iter().any(|s| s.name == name) {
            values.push(item);
        } else {
            slots.push(item);
        }
    }
    let invalid = |e: super::shard::ShardError| SnapshotError::invalid(path, e.to_string());
    let arrays = |bytes: Vec<&[u8]>| -> Vec<ArrayD<f32>> {
        bytes
            .into_iter()
            .zip(shard.specs())
            .map(|(b, spec)| {
                ArrayD::from_shape_vec(spec.shape.as_slice(), bytemuck::pod_collect_to_vec(b))
                    .expect("arrange_bytes checked the shape")
            })
            .collect()
    };
    Ok(Restored {
        step,
        run,
        values: arrays(shard.arrange_bytes(values).map_err(invalid)?),
        shadows: arrays(shard.arrange_bytes(shadows).map_err(invalid)?),
        slots: shard.arrange_slots(slots).map_err(invalid)?,
        tables: restored_tables,
        removed,
        chain,
        seq,
    })
}

/// Reads `path` if it is a regular file of at most `limit` bytes, opened
/// non-blocking (a FIFO named like a snapshot cannot hang the ps) and
/// checked on the open descriptor.
pub(super) fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, SnapshotError> {
    use crate::files::ReadError;
    crate::files::read_bounded(path, limit).map_err(|e| match e {
        ReadError::Io { what, source } => SnapshotError::io(path, what)(source),
        ReadError::Special(what) => {
            SnapshotError::invalid(path, format!("it is {what}, not a regular file"))
        }
        ReadError::TooLarge { size, limit } => SnapshotError::invalid(
            path,
            format!("it is {size} bytes, more than the {limit} a snapshot of this shard can take"),
        ),
    })
}

/// A ps's snapshots: where, whose, and how they have gone.
pub(super) struct Snapshotting {
    /// `<ps.snapshot_dir>/ps-<task>`; `None`: no place known, no snapshots.
    pub dir: Option<PathBuf>,
    /// [`identity`] of this shard: what every file must carry to be restored.
    pub identity: String,
    /// For `State` and `/metrics`.
    stats: std::sync::Mutex<Stats>,
    /// The snapshot restored at start, until the chief adopts it or seeds
    /// the shard.
    pending: std::sync::Mutex<Option<Restored>>,
    /// `ps.snapshot_full_every`: with tables, one snapshot in this many is
    /// whole, the others deltas.
    pub full_every: u32,
    /// `ps.snapshot_delta_min_bytes`: deltas only after a whole snapshot
    /// of at least this many bytes.
    pub delta_min_bytes: u64,
}

impl Snapshotting {
    /// The snapshot settings of ps `task`, and no snapshot yet.
    pub(super) fn new(config: &Config, task: usize, specs: &[VarSpec]) -> Self {
        let dir = dir(config, task);
        if dir.is_none() && config.ps.snapshot_secs > 0 {
            warn!(
                ps = task,
                "No snapshots: ps.snapshot_dir is empty and neither $STATE_DIRECTORY, $XDG_STATE_HOME nor $HOME is set."
            );
        }
        Self {
            dir,
            identity: identity(config, task, specs),
            stats: std::sync::Mutex::new(Stats::default()),
            pending: std::sync::Mutex::new(None),
            full_every: config.ps.snapshot_full_every,
            delta_min_bytes: config.ps.snapshot_delta_min_bytes,
        }
    }

    /// The snapshot restored at start and held aside for the chief.
    pub(super) fn pending(&self) -> std::sync::MutexGuard<'_, Option<Restored>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shard was seeded (not from the snapshot held aside): that
    /// snapshot is dropped, and nothing on disk is kept beside the next one
    /// (it may be another run's).
    pub(super) fn seeded(&self) {
        // One lock at a time (`State` takes them too).
        let held = self.pending().take().is_some();
        let mut stats = self.stats();
        if held || stats.restored.is_some() {
            stats.restored = None;
            stats.last = None;
            stats.written = None;
            stats.written_chain = None;
            stats.restored_deltas = 0;
        }
        // The shard's rows were replaced: the next snapshot is whole.
        stats.chain = None;
    }

    pub(super) fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What `State` and `/metrics` report of the snapshots.
#[derive(Debug, Default)]
pub(super) struct Stats {
    /// The step and the moment of the newest snapshot's copy (or restore).
    pub last: Option<(u64, Instant)>,
    /// The file this process wrote (or restored) last: kept beside the next.
    pub written: Option<PathBuf>,
    /// Writes that failed since start.
    pub failures: u64,
    /// The latest write failed (the ERROR is logged once per run of failures).
    pub failing: bool,
    /// Bytes of the latest file.
    pub bytes: u64,
    /// Seconds the latest encode and write took.
    pub write_secs: f64,
    /// Seconds the latest copy held the shard lock.
    pub copy_secs: f64,
    /// The step restored at start, if any (until the shard is seeded
    /// instead).
    pub restored: Option<u64>,
    /// The tables' update count at the newest snapshot
    /// ([`PsService::tables_version`]).
    pub tables_version: u64,
    /// The chain the next delta continues (`None`: the next snapshot is
    /// whole).
    pub chain: Option<Chain>,
    /// The chain of `written` (its deltas are kept with it).
    pub written_chain: Option<u64>,
    /// The deltas applied at start on the whole snapshot restored.
    pub restored_deltas: u32,
}

/// The chain of whole snapshot and deltas being written.
#[derive(Debug, Clone, Copy)]
pub(super) struct Chain {
    pub id: u64,
    /// The latest delta written (0: only the whole snapshot).
    pub seq: u32,
    /// Bytes of the whole snapshot, and of its deltas so far.
    pub whole_bytes: u64,
    pub delta_bytes: u64,
}

#[cfg(test)]
mod tests;
