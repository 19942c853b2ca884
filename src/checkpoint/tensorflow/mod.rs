//! TensorFlow V2 checkpoints ("tensor bundles"), both ways: what `dtf export
//! --tf-checkpoint` writes and `dtf local --init-from` reads.
//!
//! A checkpoint with prefix `DIR/model.ckpt-N` is two files, as
//! `tensorflow/core/util/tensor_bundle/tensor_bundle.cc` writes them:
//!
//! - `model.ckpt-N.data-00000-of-00001`: the tensors' raw little-endian
//!   bytes, one after another in key order, nothing aligned;
//! - `model.ckpt-N.index`: a LevelDB-format table ([`table`]) whose key ""
//!   holds a `BundleHeaderProto` (one shard, little-endian, version 1) and
//!   each tensor's name a `BundleEntryProto` (dtype, shape, shard 0, offset
//!   and size in the data file, the masked CRC-32C of its bytes).
//!
//! Beside them, `DIR/checkpoint` is the text `CheckpointState` that
//! `tf.train.Saver` keeps and `tf.train.latest_checkpoint` reads. (dtf's own
//! checkpoint directory does not have one: see [`super::INDEX_FILE`].)
//!
//! Only the dtypes dtf has are read and written: `DT_FLOAT` (every variable,
//! shadow and slot) and `DT_INT64` (`global_step`, an embedding table's
//! ids); a `DT_INT32` step (some TF programs make one) is read as an int64.
//! Partitioned variables (entries with slices) and multi-shard bundles are
//! refused with a message saying so.

mod convert;
pub mod table;

pub use convert::{Taken, from_dtf, to_checkpoint};

use std::path::{Path, PathBuf};

use prost::Message;

use super::CheckpointError;
use super::layout::FILE_MODE;

/// Generated from `proto/tensorflow/tensor_bundle.proto`; only this module sees it.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/tensorflow.rs"));
}

/// The file `tf.train.Saver` names its checkpoints in.
pub const STATE_FILE: &str = "checkpoint";
/// The one data file of a single-shard bundle.
pub const DATA_SUFFIX: &str = ".data-00000-of-00001";
/// The index file's suffix.
pub const INDEX_SUFFIX: &str = ".index";
/// `kTensorBundleVersion`, the producer version written in the header.
const BUNDLE_VERSION: i32 = 1;
/// The largest `.index` read: an entry is some 60 bytes, so a million
/// tensors; far above any model here.
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// A tensor's element type, of those dtf has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// `DT_FLOAT`.
    F32,
    /// `DT_INT64`.
    I64,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::I64 => 8,
        }
    }

    /// TensorFlow's name, for messages.
    pub fn tf_name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::I64 => "int64",
        }
    }

    fn to_pb(self) -> pb::DataType {
        match self {
            Dtype::F32 => pb::DataType::DtFloat,
            Dtype::I64 => pb::DataType::DtInt64,
        }
    }
}

/// One tensor of a bundle: its name, type, shape and little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// TensorFlow's name (`layer1/weights`).
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its dimensions (empty: a scalar).
    pub shape: Vec<u64>,
    /// Its elements, little-endian, `dtype.size()` bytes each.
    pub data: Vec<u8>,
}

impl Tensor {
    /// An f32 tensor.
    pub fn f32(
        name: impl Into<String>,
        shape: &[usize],
        values: impl Iterator<Item = f32>,
    ) -> Self {
        Tensor {
            name: name.into(),
            dtype: Dtype::F32,
            shape: shape.iter().map(|&d| d as u64).collect(),
            data: values.flat_map(f32::to_le_bytes).collect(),
        }
    }

    /// Its elements as f32, if it is an f32 tensor.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.dtype == Dtype::F32).then(|| {
            self.data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        })
    }

    /// Its elements as i64, if it is an int64 tensor.
    pub fn to_i64(&self) -> Option<Vec<i64>> {
        (self.dtype == Dtype::I64).then(|| {
            self.data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect()
        })
    }
}

/// `DIR/model.ckpt-N`: the prefix of the checkpoint at step `step` in `dir`.
pub fn prefix(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("{}{step}", super::PREFIX))
}

/// `prefix` with `suffix` appended (not an extension: prefixes have dots).
fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The index file of the checkpoint `prefix`.
pub fn index_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, INDEX_SUFFIX)
}

/// The data file of the checkpoint `prefix`.
pub fn data_path(prefix: &Path) -> PathBuf {
    with_suffix(prefix, DATA_SUFFIX)
}

/// The two files' bytes (index, data) of a bundle of `tensors`, whose names
/// must be distinct and non-empty.
pub fn encode(tensors: &[Tensor]) -> (Vec<u8>, Vec<u8>) {
    let mut sorted: Vec<&Tensor> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    let header = pb::BundleHeaderProto {
        num_shards: 1,
        endianness: pb::bundle_header_proto::Endianness::Little as i32,
        version: Some(pb::VersionDef {
            producer: BUNDLE_VERSION,
            ..Default::default()
        }),
    };
    let mut entries = vec![(Vec::new(), header.encode_to_vec())];
    let mut data = Vec::new();
    for t in sorted {
        let entry = pb::BundleEntryProto {
            dtype: t.dtype.to_pb() as i32,
            shape: Some(pb::TensorShapeProto {
                dim: t
                    .shape
                    .iter()
                    .map(|&d| pb::tensor_shape_proto::Dim {
                        size: d as i64,
                        name: String::new(),
                    })
                    .collect(),
                unknown_rank: false,
            }),
            shard_id: 0,
            offset: data.len() as i64,
            size: t.data.len() as i64,
            crc32c: table::mask(crc32c::crc32c(&t.data)),
            slices: Vec::new(),
        };
        data.extend_from_slice(&t.data);
        entries.push((t.name.as_bytes().to_vec(), entry.encode_to_vec()));
    }
    (table::build(&entries), data)
}

/// Writes the checkpoint `dir/model.ckpt-<step>` of `tensors` (data file,
/// then index, each atomically) and `dir/checkpoint` naming it newest, and
/// every other complete checkpoint in `dir`, as `tf.train.Saver` would;
/// creates `dir`. Returns the prefix.
///
/// Errors: [`CheckpointError::Io`].
pub fn write(dir: &Path, step: u64, tensors: &[Tensor]) -> Result<PathBuf, CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, "create directory", e))?;
    let prefix = prefix(dir, step);
    let (index, data) = encode(tensors);
    let write = |path: &Path, bytes: &[u8]| {
        crate::files::write_atomic_with(path, bytes, FILE_MODE, crate::files::write_all)
    };
    // The data first: an index is never there without its data.
    write(&data_path(&prefix), &data)?;
    write(&index_path(&prefix), &index)?;
    let mut steps = steps_in(dir)?;
    steps.retain(|&s| s != step);
    steps.push(step);
    write(&dir.join(STATE_FILE), state_text(&steps).as_bytes())?;
    Ok(prefix)
}

/// The steps of the complete checkpoints (index and data file) in `dir`, ascending.
fn steps_in(dir: &Path) -> Result<Vec<u64>, CheckpointError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, "list directory", e))?;
    let mut steps = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(step) = name
            .to_str()
            .and_then(|n| n.strip_prefix(super::PREFIX))
            .and_then(|n| n.strip_suffix(INDEX_SUFFIX))
            .and_then(super::parse_step)
        else {
            continue;
        };
        if data_path(&prefix(dir, step)).is_file() {
            steps.push(step);
        }
    }
    steps.sort_unstable();
    Ok(steps)
}

/// The `checkpoint` file's text: the last of `steps` newest, all of them kept.
fn state_text(steps: &[u64]) -> String {
    let name = |s: u64| format!("{}{s}", super::PREFIX);
    let mut text = String::new();
    if let Some(&newest) = steps.last() {
        text.push_str(&format!("model_checkpoint_path: \"{}\"\n", name(newest)));
    }
    for &s in steps {
        text.push_str(&format!("all_model_checkpoint_paths: \"{}\"\n", name(s)));
    }
    text
}

/// The checkpoint prefix a directory's `checkpoint` file names newest
/// (relative paths are taken in `dir`, as TensorFlow takes them); `None`
/// when there is no such file or it names nothing.
///
/// Errors: [`CheckpointError::Io`] and the bounds of [`super::layout::read`].
pub fn latest(dir: &Path) -> Result<Option<PathBuf>, CheckpointError> {
    let path = dir.join(STATE_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let bytes = super::layout::read(&path, super::layout::Limit::INDEX)?;
    let text = String::from_utf8_lossy(&bytes);
    let named = text.lines().find_map(|line| {
        let value = line.trim().strip_prefix("model_checkpoint_path:")?.trim();
        value.strip_prefix('"')?.strip_suffix('"')
    });
    Ok(named.map(|n| dir.join(n)))
}

/// Whether `path` is a TensorFlow checkpoint prefix: `path.index` exists.
pub fn is_prefix(path: &Path) -> bool {
    index_path(path).is_file()
}

/// Reads the checkpoint `prefix` (`DIR/model.ckpt-N`): every tensor, in key
/// order, each checked against its entry (dtype, shape, size, place in the
/// data file, CRC-32C). Only regular files are read, the index at most 64
/// MiB and the data file at most [`super::MAX_FILE_BYTES`].
///
/// Errors: [`CheckpointError::Io`], [`CheckpointError::NotRegular`],
/// [`CheckpointError::TooLarge`], and [`CheckpointError::Invalid`] naming the
/// file and what is wrong with it (a damaged table, a CRC mismatch, an entry
/// outside the data file, a dtype or layout dtf does not read).
pub fn read(prefix: &Path) -> Result<Vec<Tensor>, CheckpointError> {
    let index_path = index_path(prefix);
    let data_path = data_path(prefix);
    let index = super::layout::read(
        &index_path,
        super::layout::Limit {
            bytes: MAX_INDEX_BYTES,
            allowed: "a TensorFlow checkpoint index may have here",
        },
    )?;
    let bad = |problem: String| CheckpointError::invalid(&index_path, problem);
    let entries = table::parse(&index).map_err(&bad)?;
    let Some((key, header)) = entries.first().filter(|(k, _)| k.is_empty()) else {
        return Err(bad(
            "no bundle header (the entry with the empty key): not a TensorFlow V2 checkpoint index"
                .into(),
        ));
    };
    debug_assert!(key.is_empty());
    let header = pb::BundleHeaderProto::decode(header.as_slice())
        .map_err(|e| bad(format!("the bundle header does not parse: {e}")))?;
    if header.num_shards != 1 {
        return Err(bad(format!(
            "the checkpoint has {} data shards; dtf reads single-shard checkpoints \
             ({DATA_SUFFIX}), as tf.train.Saver writes from one process",
            header.num_shards
        )));
    }
    if header.endianness != pb::bundle_header_proto::Endianness::Little as i32 {
        return Err(bad(
            "the checkpoint is big-endian; dtf reads little-endian ones".into(),
        ));
    }
    // Only what the entries cover: a data file longer than its index says (a sparse 4 GiB
    // file beside a small index) is refused, not read into memory.
    let covered = entries[1..]
        .iter()
        .filter_map(|(_, value)| pb::BundleEntryProto::decode(value.as_slice()).ok())
        .map(|e| {
            u64::try_from(e.offset)
                .unwrap_or(0)
                .saturating_add(u64::try_from(e.size).unwrap_or(0))
        })
        .max()
        .unwrap_or(0);
    let data = super::layout::read(
        &data_path,
        super::layout::Limit {
            bytes: covered.min(super::MAX_FILE_BYTES),
            allowed: "its index's entries cover in a TensorFlow checkpoint's data",
        },
    )?;
    entries[1..]
        .iter()
        .map(|(key, value)| tensor(key, value, &data, &index_path, &data_path))
        .collect()
}

/// One entry of the index, its bytes taken from `data` and checked.
fn tensor(
    key: &[u8],
    value: &[u8],
    data: &[u8],
    index_path: &Path,
    data_path: &Path,
) -> Result<Tensor, CheckpointError> {
    // Escaped: a hostile index's name must not reach a terminal as control bytes.
    let name = String::from_utf8_lossy(key).escape_debug().to_string();
    let bad = |problem: String| CheckpointError::invalid(index_path, format!("{name}: {problem}"));
    let entry = pb::BundleEntryProto::decode(value)
        .map_err(|e| bad(format!("its entry does not parse: {e}")))?;
    if !entry.slices.is_empty() {
        return Err(bad(
            "a partitioned variable (saved in slices); dtf reads whole tensors only".into(),
        ));
    }
    if entry.shard_id != 0 {
        return Err(bad(format!(
            "in shard {}, of a single-shard checkpoint",
            entry.shard_id
        )));
    }
    let (dtype, widen) = match pb::DataType::try_from(entry.dtype) {
        Ok(pb::DataType::DtFloat) => (Dtype::F32, false),
        Ok(pb::DataType::DtInt64) => (Dtype::I64, false),
        Ok(pb::DataType::DtInt32) => (Dtype::I64, true),
        _ => {
            return Err(bad(format!(
                "dtype {} (TensorFlow's DataType number); dtf reads float32, int64 and int32",
                entry.dtype
            )));
        }
    };
    let shape = entry.shape.unwrap_or_default();
    if shape.unknown_rank {
        return Err(bad("a shape of unknown rank".into()));
    }
    let dims: Vec<u64> = shape
        .dim
        .iter()
        .map(|d| u64::try_from(d.size))
        .collect::<Result<_, _>>()
        .map_err(|_| bad("a negative dimension".into()))?;
    let stored_elem = if widen { 4 } else { dtype.size() };
    let expected = dims
        .iter()
        .try_fold(stored_elem, |n, &d| n.checked_mul(d))
        .ok_or_else(|| bad(format!("shape {dims:?} overflows")))?;
    let (offset, size) = (entry.offset, entry.size);
    if u64::try_from(size).ok() != Some(expected) {
        return Err(bad(format!(
            "{size} bytes, but shape {dims:?} of {} takes {expected}",
            if widen { "int32" } else { dtype.tf_name() }
        )));
    }
    let range = u64::try_from(offset)
        .ok()
        .and_then(|o| Some(o..o.checked_add(expected)?))
        .filter(|r| r.end <= data.len() as u64)
        .ok_or_else(|| {
            CheckpointError::invalid(
                data_path,
                format!(
                    "{name}: {expected} bytes at offset {offset} run past the file's {} \
                     bytes (truncated?)",
                    data.len()
                ),
            )
        })?;
    let bytes = &data[range.start as usize..range.end as usize];
    let actual = crc32c::crc32c(bytes);
    if table::unmask(entry.crc32c) != actual {
        return Err(CheckpointError::invalid(
            data_path,
            format!(
                "{name}: CRC-32C mismatch at offset {offset} (index says {:#010x}, the bytes \
                 give {actual:#010x}): the data file is damaged",
                table::unmask(entry.crc32c)
            ),
        ));
    }
    let data = if widen {
        bytes
            .chunks_exact(4)
            .flat_map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
            .collect()
    } else {
        bytes.to_vec()
    };
    Ok(Tensor {
        name,
        dtype,
        shape: dims,
        data,
    })
}

#[cfg(test)]
mod tests;
