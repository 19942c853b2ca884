//! The file both checkpoints and ps snapshots are: a safetensors file whose
//! string metadata carries a `crc32:<tensor>` for every tensor (so bit rot
//! inside the data is caught, not only in the header), with a header of at
//! most [`MAX_HEADER_BYTES`]. What the metadata says besides (format,
//! step, identity) is each format's own: `checkpoint/format.rs` for
//! checkpoints, `ps/snapshot.rs` for snapshots. This module knows neither,
//! so both can use it; an embedding table's tensors are the same in both
//! ([`table_tensors`], [`read_rows`]).

use std::collections::HashMap;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensorError, SafeTensors};

use super::EMA_SUFFIX;
use crate::model::table::Rows;

/// Metadata key prefix of each tensor's CRC-32: `crc32:<tensor>`.
pub const CRC_PREFIX: &str = "crc32:";

/// The most bytes a checkpoint's or snapshot's safetensors header may
/// declare. dtf's own headers are small (per tensor: its entry and its CRC,
/// plus the variable list: about 150 bytes each, so this allows thousands of
/// tensors); the safetensors crate alone allows 100 MB, which costs seconds
/// and gigabytes to parse, so the bound is checked before parsing (and at
/// save time).
pub const MAX_HEADER_BYTES: u64 = 1 << 20;

/// A tensor's CRC-32 as its `crc32:<name>` metadata holds it (8 hex
/// digits): checkpoints and ps snapshots alike.
pub fn crc32(bytes: &[u8]) -> String {
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    format!("{:08x}", crc.sum())
}

/// The metadata key of `tensor`'s CRC-32.
pub fn crc_key(tensor: &str) -> String {
    format!("{CRC_PREFIX}{tensor}")
}

/// A tensor to write: its name, dtype, shape and little-endian bytes.
pub struct Entry<'a> {
    /// Its name in the file.
    pub name: &'a str,
    /// Its dtype.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: &'a [usize],
    /// Its bytes, little-endian.
    pub bytes: &'a [u8],
}

/// Why [`encode`] made no file.
#[derive(Debug)]
pub enum EncodeError {
    /// A tensor's bytes do not fit its dtype and shape.
    Tensor {
        /// The tensor.
        name: String,
        /// The encoder's complaint.
        source: SafeTensorError,
    },
    /// The encoder refused the whole.
    File(SafeTensorError),
}

/// One safetensors file of `tensors` with `meta` and a `crc32:<name>` per
/// tensor added to it.
///
/// Errors: [`EncodeError`].
pub fn encode<'a>(
    tensors: impl IntoIterator<Item = Entry<'a>>,
    mut meta: HashMap<String, String>,
) -> Result<Vec<u8>, EncodeError> {
    let tensors = tensors.into_iter();
    let mut views = Vec::with_capacity(tensors.size_hint().0);
    for t in tensors {
        meta.insert(crc_key(t.name), crc32(t.bytes));
        let view = TensorView::new(t.dtype, t.shape.to_vec(), t.bytes).map_err(|source| {
            EncodeError::Tensor {
                name: t.name.to_owned(),
                source,
            }
        })?;
        views.push((t.name, view));
    }
    safetensors::serialize(views, Some(meta)).map_err(EncodeError::File)
}

/// A tensor as the writers hold it: name, dtype, shape, little-endian bytes.
pub type Named<B> = (String, Dtype, Vec<usize>, B);

/// [`encode`] of `tensors` held as [`Named`] tuples, its error one line.
///
/// Errors: which tensor does not fit its dtype and shape, or what the
/// encoder refused.
pub fn encode_named<B: AsRef<[u8]>>(
    tensors: &[Named<B>],
    meta: HashMap<String, String>,
) -> Result<Vec<u8>, String> {
    let entries = tensors.iter().map(|(name, dtype, shape, bytes)| Entry {
        name,
        dtype: *dtype,
        shape,
        bytes: bytes.as_ref(),
    });
    encode(entries, meta).map_err(|e| match e {
        EncodeError::Tensor { name, source } => format!("cannot encode tensor {name:?}: {source}"),
        EncodeError::File(e) => e.to_string(),
    })
}

/// The header length a safetensors file declares (its first 8 bytes, little
/// endian), if it has 8 bytes.
pub fn header_len(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
}

/// Why [`parse`] read nothing.
#[derive(Debug)]
pub enum ParseError {
    /// The header claims this many bytes, more than [`MAX_HEADER_BYTES`];
    /// refused before parsing.
    HeaderTooLarge(u64),
    /// Not a safetensors file (truncated, garbage header, bad offsets).
    Safetensors(SafeTensorError),
}

/// Refuses a header longer than [`MAX_HEADER_BYTES`] before anything parses
/// it. (A file too short to have a length is left to the parser's error.)
///
/// Errors: [`ParseError::HeaderTooLarge`].
pub fn check_header_len(bytes: &[u8]) -> Result<(), ParseError> {
    match header_len(bytes) {
        Some(n) if n > MAX_HEADER_BYTES => Err(ParseError::HeaderTooLarge(n)),
        _ => Ok(()),
    }
}

/// The tensors and the string metadata of `bytes`, the header bound checked
/// first. The CRCs are checked tensor by tensor by the caller
/// ([`check_crc`]), among its own checks of each.
///
/// Errors: [`ParseError`].
pub fn parse(bytes: &[u8]) -> Result<(SafeTensors<'_>, HashMap<String, String>), ParseError> {
    check_header_len(bytes)?;
    let tensors = SafeTensors::deserialize(bytes).map_err(ParseError::Safetensors)?;
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(ParseError::Safetensors)?;
    Ok((tensors, header.metadata().clone().unwrap_or_default()))
}

/// Why a tensor failed [`check_crc`].
#[derive(Debug)]
pub enum CrcError {
    /// The metadata has no `crc32:<name>`.
    Missing,
    /// The bytes' CRC is not the metadata's.
    Mismatch {
        /// The CRC of the bytes.
        got: String,
        /// The metadata's.
        want: String,
    },
}

/// Checks tensor `name`'s bytes `data` against its `crc32:<name>` in `meta`.
///
/// Errors: [`CrcError`].
pub fn check_crc(meta: &HashMap<String, String>, name: &str, data: &[u8]) -> Result<(), CrcError> {
    let Some(want) = meta.get(&crc_key(name)) else {
        return Err(CrcError::Missing);
    };
    let got = crc32(data);
    if *want != got {
        return Err(CrcError::Mismatch {
            got,
            want: want.clone(),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Embedding tables: the same tensors in checkpoints and ps snapshots

/// A table's ids: `NAME/ids`, I64 (the ids' 64 bits), one per row.
pub const IDS_SUFFIX: &str = "/ids";
/// A table's values: `NAME/values`, F32, rows × dim. Its slots are
/// `NAME/<slot>` (`NAME/Adagrad`) and its EMA shadows
/// `NAME/ExponentialMovingAverage`, each of that shape.
pub const VALUES_SUFFIX: &str = "/values";

/// A tensor of a table as it is written: its name, dtype, shape and bytes.
pub type TableTensor<'a> = (String, Dtype, Vec<usize>, &'a [u8]);

/// The tensors of table `name` holding `rows`: (ids, values and one per
/// slot of `slot_names`; its shadows, the values when `rows` has none).
/// No rows: shape `[0, 0]` (nothing holds the width). dtf runs on
/// little-endian machines only, so the bytes are the arrays' own.
pub fn table_tensors<'a>(
    name: &str,
    rows: &'a Rows,
    slot_names: &[&str],
) -> (Vec<TableTensor<'a>>, TableTensor<'a>) {
    let n = rows.ids.len();
    let shape = vec![n, rows.values.len().checked_div(n).unwrap_or(0)];
    let f32s = |t: String, a: &'a [f32]| (t, Dtype::F32, shape.clone(), bytemuck::cast_slice(a));
    let mut tensors = vec![
        (
            format!("{name}{IDS_SUFFIX}"),
            Dtype::I64,
            vec![n],
            bytemuck::cast_slice(&rows.ids),
        ),
        f32s(format!("{name}{VALUES_SUFFIX}"), &rows.values),
    ];
    for (slot, a) in slot_names.iter().zip(&rows.slots) {
        tensors.push(f32s(format!("{name}/{slot}"), a));
    }
    let shadows = if rows.shadows.is_empty() {
        &rows.values
    } else {
        &rows.shadows
    };
    (tensors, f32s(format!("{name}{EMA_SUFFIX}"), shadows))
}

/// The names of table `name`'s tensors in the file of values (ids, values,
/// the slots of `slot_names`), as [`table_tensors`] writes them.
pub fn table_tensor_names(name: &str, slot_names: &[&str]) -> Vec<String> {
    [
        format!("{name}{IDS_SUFFIX}"),
        format!("{name}{VALUES_SUFFIX}"),
    ]
    .into_iter()
    .chain(slot_names.iter().map(|s| format!("{name}/{s}")))
    .collect()
}

/// A delta's ids of a table's rows dropped since its base (a checkpoint's)
/// or since the snapshot before it (a ps snapshot's): `NAME/removed`, I64.
pub const REMOVED_SUFFIX: &str = "/removed";

/// The tensor of table `name`'s dropped ids `removed` ([`REMOVED_SUFFIX`]).
pub fn removed_tensor<'a>(name: &str, removed: &'a [u64]) -> TableTensor<'a> {
    (
        format!("{name}{REMOVED_SUFFIX}"),
        Dtype::I64,
        vec![removed.len()],
        bytemuck::cast_slice(removed),
    )
}

/// Table `name`'s dropped ids from `values` ([`removed_tensor`]), checked
/// by [`check_removed`] against the rows' `ids`.
///
/// Errors: what is wrong, naming the tensor.
pub fn read_removed(values: &SafeTensors<'_>, name: &str, ids: &[u64]) -> Result<Vec<u64>, String> {
    let tensor = format!("{name}{REMOVED_SUFFIX}");
    let view = values
        .tensor(&tensor)
        .map_err(|_| format!("it is a delta without tensor {tensor:?}"))?;
    if view.dtype() != Dtype::I64 || view.shape().len() != 1 {
        return Err(format!(
            "tensor {tensor:?} is {:?} of shape {:?}, expected an I64 vector (the ids dropped)",
            view.dtype(),
            view.shape()
        ));
    }
    let removed: Vec<u64> = bytemuck::pod_collect_to_vec(view.data());
    check_removed(name, &removed, ids)?;
    Ok(removed)
}

/// A delta's dropped ids of table `name` must be strictly ascending and none
/// of them among its rows' `ids` (a row is either changed or dropped).
///
/// Errors: which id breaks which rule.
pub fn check_removed(name: &str, removed: &[u64], ids: &[u64]) -> Result<(), String> {
    if let Some(i) = removed.windows(2).position(|w| w[0] >= w[1]) {
        return Err(format!(
            "table {name:?}: its removed ids are not strictly ascending at {} ({} then {})",
            i + 1,
            removed[i],
            removed[i + 1]
        ));
    }
    // Both sorted: one merge pass.
    let (mut i, mut j) = (0, 0);
    while i < removed.len() && j < ids.len() {
        match removed[i].cmp(&ids[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                return Err(format!(
                    "table {name:?}: id {} is both among its rows and removed",
                    removed[i]
                ));
            }
        }
    }
    Ok(())
}

/// Why [`read_rows`] could not read a table.
#[derive(Debug)]
pub struct RowsProblem {
    /// The problem is in the file of shadows (a checkpoint's EMA file).
    pub in_shadows: bool,
    /// What is wrong and what would be right.
    pub why: String,
}

/// Table `name`'s rows from `values` (ids, values, the slots of
/// `slot_names`) and `shadows` (its EMA shadows; the same file in a
/// snapshot): ids an I64 vector, strictly ascending (sorted, no id twice);
/// every array F32 of shape ids × dim (`dim` when given), finite.
///
/// Errors: [`RowsProblem`], never a panic.
pub fn read_rows(
    values: &SafeTensors<'_>,
    shadows: &SafeTensors<'_>,
    name: &str,
    slot_names: &[&str],
    dim: Option<usize>,
) -> Result<Rows, RowsProblem> {
    let in_values = |why: String| RowsProblem {
        in_shadows: false,
        why,
    };
    let ids_name = format!("{name}{IDS_SUFFIX}");
    let view = values
        .tensor(&ids_name)
        .map_err(|_| in_values(format!("tensor {ids_name:?} is missing")))?;
    if view.dtype() != Dtype::I64 || view.shape().len() != 1 {
        return Err(in_values(format!(
            "tensor {ids_name:?} is {:?} of shape {:?}, expected an I64 vector (one id per row)",
            view.dtype(),
            view.shape()
        )));
    }
    let ids: Vec<u64> = bytemuck::pod_collect_to_vec(view.data());
    if let Some(i) = ids.windows(2).position(|w| w[0] >= w[1]) {
        return Err(in_values(format!(
            "table {name:?}: its ids are not strictly ascending at row {} ({} then {}): an id \
             twice, or unsorted (a table is saved sorted by id, each id once)",
            i + 1,
            ids[i],
            ids[i + 1]
        )));
    }
    let n = ids.len();
    let values_name = format!("{name}{VALUES_SUFFIX}");
    let (shape, vals) = f32_rows(values, &values_name, None).map_err(in_values)?;
    let width_ok = match (dim, n) {
        (_, 0) => true,
        (Some(d), _) => shape[1] == d,
        (None, _) => true,
    };
    if shape[0] != n || !width_ok {
        let want = dim.map_or("dim".to_owned(), |d| d.to_string());
        return Err(in_values(format!(
            "table {name:?}: {values_name:?} has shape {shape:?}, expected [{n}, {want}]: one row \
             per id, each as wide as the table"
        )));
    }
    let slots = slot_names
        .iter()
        .map(|s| f32_rows(values, &format!("{name}/{s}"), Some(&shape)).map(|r| r.1))
        .collect::<Result<_, _>>()
        .map_err(in_values)?;
    let (_, shadows) =
        f32_rows(shadows, &format!("{name}{EMA_SUFFIX}"), Some(&shape)).map_err(|why| {
            RowsProblem {
                in_shadows: true,
                why,
            }
        })?;
    Ok(Rows {
        ids,
        values: vals,
        shadows,
        slots,
    })
}

/// A 2-D F32 tensor (of `shape` when given), finite: its shape and values.
fn f32_rows(
    file: &SafeTensors<'_>,
    tensor: &str,
    shape: Option<&[usize]>,
) -> Result<(Vec<usize>, Vec<f32>), String> {
    let view = file
        .tensor(tensor)
        .map_err(|_| format!("tensor {tensor:?} is missing"))?;
    if view.dtype() != Dtype::F32 || view.shape().len() != 2 {
        return Err(format!(
            "tensor {tensor:?} is {:?} of shape {:?}, expected F32 rows × dim",
            view.dtype(),
            view.shape()
        ));
    }
    if let Some(shape) = shape
        && view.shape() != shape
    {
        return Err(format!(
            "tensor {tensor:?} has shape {:?}, its table's values {shape:?}",
            view.shape()
        ));
    }
    let values: Vec<f32> = bytemuck::pod_collect_to_vec(view.data());
    if let Some(i) = values.iter().position(|x| !x.is_finite()) {
        return Err(format!(
            "tensor {tensor:?} holds a non-finite value ({}) at flat index {i}",
            values[i]
        ));
    }
    Ok((view.shape().to_vec(), values))
}
