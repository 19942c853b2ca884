//! The file both checkpoints and ps snapshots are: a safetensors file whose
//! string metadata carries a `crc32:<tensor>` for every tensor (so bit rot
//! inside the data is caught, not only in the header), with a header of at
//! most [`MAX_HEADER_BYTES`]. What the metadata says besides (format,
//! step, identity) is each format's own: `checkpoint/format.rs` for
//! checkpoints, `ps/snapshot.rs` for snapshots. This module knows neither,
//! so both can use it.

use std::collections::HashMap;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensorError, SafeTensors};

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
