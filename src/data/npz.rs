//! NumPy `.npz` data sets: `data.format = "npz"`, `data.path`.
//!
//! Keras's layout (`mnist.npz`, `fashion_mnist`): `x_train`, `y_train`,
//! `x_test`, `y_test`. `x` is `[N, …]` of uint8 (kept as bytes, scaled by
//! 1/255) or float32/float64 (kept as f32, used as is or standardized);
//! every dimension after the first is flattened into the row. `y` is `[N]`
//! (or `[N, 1]`) of integer class indices.
//!
//! Both `np.savez` (stored) and `np.savez_compressed` (deflate) archives
//! load. The archive's declared sizes are checked against this machine's
//! memory, and each array's shape against its data, before anything is
//! allocated: a hostile file is refused, not believed.

use super::{DataError, Dataset, Features, Split, format_error, max_bytes};
use std::io::{Cursor, Read, Write};
use std::path::Path;

/// The arrays of `split`: features and labels.
fn names(split: Split) -> (&'static str, &'static str) {
    match split {
        Split::Train => ("x_train", "y_train"),
        Split::Test => ("x_test", "y_test"),
    }
}

/// One array read from an archive: its shape and its values.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// uint8 values.
    U8(Vec<u64>, Vec<u8>),
    /// float32 (or float64, narrowed) values.
    F32(Vec<u64>, Vec<f32>),
    /// Any integer type, widened.
    I64(Vec<u64>, Vec<i64>),
}

impl Array {
    /// The array's shape.
    pub fn shape(&self) -> &[u64] {
        match self {
            Array::U8(s, _) | Array::F32(s, _) | Array::I64(s, _) => s,
        }
    }
}

/// Loads `split` (`x_train`/`y_train` or `x_test`/`y_test`) from the `.npz` at `path`.
///
/// Errors: [`DataError::Io`] when the file cannot be read or is not a zip
/// archive; [`DataError::Format`] naming the missing or bad array (a dtype
/// that is not uint8/float for `x` or integer for `y`, a shape that does
/// not match its data or the other array, a label outside 0–255);
/// [`DataError::TooLarge`] for an array larger than this machine's memory.
/// With `regression` (`model.task = "regression"`) `y` holds real values, of any numeric
/// dtype (finite, as every array read).
pub fn load(path: &Path, split: Split, regression: bool) -> Result<Dataset, DataError> {
    let (xn, yn) = names(split);
    let mut archive = open(path)?;
    let x = read_array(&mut archive, path, xn)?;
    let y = read_array(&mut archive, path, yn)?;
    let n = x.shape().first().copied().unwrap_or(0);
    let features = x.shape().iter().skip(1).product::<u64>();
    let values = match x {
        Array::U8(_, v) => Features::Bytes(v),
        Array::F32(_, v) => Features::Floats(v),
        Array::I64(..) => {
            return Err(format_error(
                path,
                format!("{xn} holds integers other than uint8: expected uint8 or float32 features"),
            ));
        }
    };
    let y_shape = y.shape().to_vec();
    let labels_ok = match y_shape.as_slice() {
        [m] | [m, 1] => *m == n,
        _ => false,
    };
    if !labels_ok {
        return Err(format_error(
            path,
            format!("{yn} has shape {y_shape:?}: expected [{n}] (one class index per row of {xn})"),
        ));
    }
    let features = usize::try_from(features)
        .map_err(|_| format_error(path, format!("{xn} rows are too wide")))?;
    let what = format!("{} ({xn}, {yn})", path.display());
    if regression {
        let targets: Vec<f32> = match y {
            Array::U8(_, v) => v.into_iter().map(f32::from).collect(),
            Array::I64(_, v) => v.into_iter().map(|l| l as f32).collect(),
            Array::F32(_, v) => v,
        };
        // Finite already: reading an array refuses NaN and infinities.
        let mut ds = Dataset::new(values, vec![0; targets.len()], features, Path::new(&what))?;
        ds.set_targets(targets)?;
        return Ok(ds);
    }
    let labels = match y {
        Array::U8(_, v) => v,
        Array::I64(_, v) => {
            let mut out = Vec::with_capacity(v.len());
            for (i, l) in v.into_iter().enumerate() {
                out.push(u8::try_from(l).map_err(|_| {
                    format_error(
                        path,
                        format!("{yn}[{i}] is {l}: expected a class index in 0..=255"),
                    )
                })?);
            }
            out
        }
        Array::F32(..) => {
            return Err(format_error(
                path,
                format!(
                    "{yn} holds floats: expected integer class indices (model.task = \
                     \"regression\" reads real values)"
                ),
            ));
        }
    };
    Dataset::new(values, labels, features, Path::new(&what))
}

/// Reads one array `x` (`x.npy` in the archive) of the `.npz` at `path`,
/// as [`load`] does. For `dtf predict --input FILE.npz`.
///
/// Errors: as [`load`].
pub fn load_array(path: &Path, name: &str) -> Result<Array, DataError> {
    let mut archive = open(path)?;
    read_array(&mut archive, path, name)
}

/// Reads a single `.npy` file.
///
/// Errors: as [`load`].
pub fn load_npy(path: &Path) -> Result<Array, DataError> {
    let bytes = super::read_file(path)?;
    parse_npy(&bytes).map_err(|what| format_error(path, what))
}

type Archive = zip::ZipArchive<std::fs::File>;

fn open(path: &Path) -> Result<Archive, DataError> {
    let file = super::open_file(path)?;
    zip::ZipArchive::new(file).map_err(|e| {
        format_error(
            path,
            format!("not a readable .npz (zip) archive: {e}; expected a file from np.savez"),
        )
    })
}

fn read_array(archive: &mut Archive, path: &Path, name: &str) -> Result<Array, DataError> {
    let entry_name = format!("{name}.npy");
    if archive.index_for_name(&entry_name).is_none() {
        let present: Vec<String> = archive
            .file_names()
            .filter_map(|n| n.ok())
            .map(|n| n.trim_end_matches(".npy").to_owned())
            .collect();
        return Err(format_error(
            path,
            format!(
                "has no array {name:?} (it holds {present:?}); expected x_train, y_train, \
                 x_test and y_test as np.savez(path, x_train=…, y_train=…, …) writes them"
            ),
        ));
    }
    let mut entry = archive
        .by_name(&entry_name)
        .map_err(|e| format_error(path, format!("array {name:?}: {e}")))?;
    let limit = max_bytes();
    let declared = entry.size();
    if declared > limit {
        return Err(DataError::TooLarge {
            path: path.join(&entry_name),
            size: declared,
            limit,
        });
    }
    let bytes = read_npy(&mut entry, limit)
        .map_err(|what| format_error(path, format!("array {name:?}: {what}")))?;
    parse_npy(&bytes).map_err(|what| format_error(path, format!("array {name:?}: {what}")))
}

/// The longest `.npy` header read (numpy writes some 128 bytes).
const MAX_NPY_HEADER: usize = 1 << 20;

/// Reads one `.npy` stream as its own header says it is long: the header
/// first, then exactly the bytes its shape and dtype declare, and one more
/// to notice a stream that holds more. Neither the archive's declared size
/// nor the stream's real length decide how much is decompressed: a small
/// array that inflates to gigabytes is refused after its declared bytes,
/// not held in memory. At most `limit` bytes of data are read.
///
/// Errors: a message for a stream that is not an `.npy`, a header too long,
/// a dtype dtf does not read, data larger than `limit` or longer than
/// declared; the decompressor's error.
fn read_npy(r: &mut impl Read, limit: u64) -> Result<Vec<u8>, String> {
    let io = |e: std::io::Error| format!("cannot decompress: {e}");
    let mut bytes = vec![0u8; 10];
    r.read_exact(&mut bytes).map_err(io)?;
    if &bytes[..6] != b"\x93NUMPY" {
        return Err("not a readable .npy array: it does not start with \\x93NUMPY".into());
    }
    let header_len = if bytes[6] == 1 {
        u16::from_le_bytes([bytes[8], bytes[9]]) as usize
    } else {
        bytes.resize(12, 0);
        r.read_exact(&mut bytes[10..]).map_err(io)?;
        u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize
    };
    if header_len > MAX_NPY_HEADER {
        return Err(format!(
            "has a header of {header_len} bytes: at most {MAX_NPY_HEADER} are read"
        ));
    }
    let start = bytes.len();
    bytes.resize(start + header_len, 0);
    r.read_exact(&mut bytes[start..]).map_err(io)?;
    let (shape, ts) = npy_header(&bytes)?;
    let need = shape
        .iter()
        .try_fold(ts.size_field(), |a, &d| a.checked_mul(d))
        .filter(|&n| n <= limit)
        .ok_or_else(|| {
            format!("shape {shape:?} of {ts} is larger than this machine's memory ({limit} bytes)")
        })?;
    // Grows as it is read: a shape is only a claim until the bytes arrive.
    bytes.reserve(need.min(64 << 20) as usize);
    r.take(need.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    let data = (bytes.len() - start - header_len) as u64;
    if data > need {
        return Err(format!(
            "holds more data than its shape {shape:?} of {ts} declares ({need} bytes)"
        ));
    }
    Ok(bytes)
}

/// The shape and element type an `.npy` buffer's header declares, if dtf
/// reads that type (a message naming the dtype if not).
fn npy_header(bytes: &[u8]) -> Result<(Vec<u64>, npyz::TypeStr), String> {
    let mut cursor = Cursor::new(bytes);
    let npy =
        npyz::NpyFile::new(&mut cursor).map_err(|e| format!("not a readable .npy array: {e}"))?;
    let (shape, dtype) = (npy.shape().to_vec(), npy.dtype());
    let npyz::DType::Plain(ts) = dtype else {
        return Err(format!(
            "has a structured dtype {}: expected a plain numeric array",
            dtype.descr()
        ));
    };
    use npyz::TypeChar::{Float, Int, Uint};
    match (ts.type_char(), ts.size_field()) {
        (Uint | Int, 1 | 2 | 4 | 8) | (Float, 4 | 8) => Ok((shape, ts)),
        _ => Err(format!(
            "has dtype {ts} ({}): expected uint8 or float32 (features) or integers (labels)",
            describe_dtype(&ts)
        )),
    }
}

/// numpy's name for the kind of a dtype dtf does not read.
fn describe_dtype(ts: &npyz::TypeStr) -> &'static str {
    use npyz::TypeChar::*;
    match ts.type_char() {
        Object => "Python objects",
        UnicodeStr => "unicode strings",
        ByteStr => "byte strings",
        RawData => "raw bytes",
        Bool => "booleans",
        Complex => "complex numbers",
        TimeDelta | DateTime => "dates or times",
        Float => "floats of an unsupported width",
        Int | Uint => "integers of an unsupported width",
        _ => "a type dtf does not read",
    }
}

/// Parses a whole `.npy` buffer: header by `npyz`, data here (little or big
/// endian), after checking that the data is exactly what the shape says.
fn parse_npy(bytes: &[u8]) -> Result<Array, String> {
    let (shape, ts) = npy_header(bytes)?;
    let mut cursor = Cursor::new(bytes);
    let fortran = npyz::NpyFile::new(&mut cursor)
        .map_err(|e| format!("not a readable .npy array: {e}"))?
        .order()
        == npyz::Order::Fortran;
    let data = &bytes[cursor.position() as usize..];
    if fortran && shape.len() > 1 {
        return Err("is in Fortran order: expected C order (save np.ascontiguousarray(a))".into());
    }
    let size = ts.size_field();
    let count = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} is too large"))?;
    if count.checked_mul(size) != Some(data.len() as u64) {
        return Err(format!(
            "shape {shape:?} of {ts} needs {} bytes of data, the file has {}",
            u128::from(count) * u128::from(size),
            data.len()
        ));
    }
    let big = ts.endianness() == npyz::Endianness::Big;
    macro_rules! conv {
        ($t:ty, $n:expr) => {
            data.chunks_exact($n).map(|c| {
                let a: [u8; $n] = c.try_into().expect("chunks_exact");
                if big {
                    <$t>::from_be_bytes(a)
                } else {
                    <$t>::from_le_bytes(a)
                }
            })
        };
    }
    use npyz::TypeChar::{Float, Int, Uint};
    let array = match (ts.type_char(), size) {
        (Uint, 1) => Array::U8(shape, data.to_vec()),
        (Float, 4) => Array::F32(shape, conv!(f32, 4).collect()),
        (Float, 8) => Array::F32(shape, conv!(f64, 8).map(|v| v as f32).collect()),
        (Int, 1) => Array::I64(shape, data.iter().map(|&b| i64::from(b as i8)).collect()),
        (Int, 2) => Array::I64(shape, conv!(i16, 2).map(i64::from).collect()),
        (Int, 4) => Array::I64(shape, conv!(i32, 4).map(i64::from).collect()),
        (Int, 8) => Array::I64(shape, conv!(i64, 8).collect()),
        (Uint, 2) => Array::I64(shape, conv!(u16, 2).map(i64::from).collect()),
        (Uint, 4) => Array::I64(shape, conv!(u32, 4).map(i64::from).collect()),
        (Uint, 8) => Array::I64(
            shape,
            conv!(u64, 8)
                .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
                .collect(),
        ),
        _ => {
            return Err(format!(
                "has dtype {ts}: expected uint8 or float32 (features) or integers (labels)"
            ));
        }
    };
    if let Array::F32(_, v) = &array
        && let Some(i) = v.iter().position(|x| !x.is_finite())
    {
        return Err(format!("holds a non-finite value at flat index {i}"));
    }
    Ok(array)
}

/// An `.npy` file's bytes for `array` (C order, little endian).
pub fn npy_bytes(array: &Array) -> Vec<u8> {
    let (descr, body): (&str, Vec<u8>) = match array {
        Array::U8(_, v) => ("|u1", v.clone()),
        Array::F32(_, v) => ("<f4", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Array::I64(_, v) => ("<i8", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
    };
    let shape = array.shape();
    let dims = match shape {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n', padded to 64.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&body);
    out
}

/// Writes an `.npz` of the named arrays, as `np.savez` does (stored, not
/// compressed): for tests and tools.
///
/// Errors: any I/O or zip error.
pub fn write_npz(path: &Path, arrays: &[(&str, Array)]) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    let mut zip = zip::ZipWriter::new(file);
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(true);
    for (name, array) in arrays {
        zip.start_file(format!("{name}.npy"), options)
            .map_err(std::io::Error::other)?;
        zip.write_all(&npy_bytes(array))?;
    }
    zip.finish().map_err(std::io::Error::other)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keras(dir: &Path, y_test: Array) -> std::path::PathBuf {
        let path = dir.join("data.npz");
        write_npz(
            &path,
            &[
                ("x_train", Array::U8(vec![3, 2, 2], (0..12).collect())),
                ("y_train", Array::U8(vec![3], vec![0, 1, 2])),
                ("x_test", Array::F32(vec![2, 4], vec![0.5; 8])),
                ("y_test", y_test),
            ],
        )
        .unwrap();
        path
    }

    #[test]
    fn keras_layout_loads_bytes_and_floats() {
        let dir = tempfile::tempdir().unwrap();
        let path = keras(dir.path(), Array::I64(vec![2], vec![1, 0]));
        let train = load(&path, Split::Train, false).unwrap();
        assert_eq!((train.len(), train.features()), (3, 4));
        assert_eq!(train.values, Features::Bytes((0..12).collect()));
        assert_eq!(train.labels(), &[0, 1, 2]);
        let test = load(&path, Split::Test, false).unwrap();
        assert_eq!(test.values, Features::Floats(vec![0.5; 8]));
        assert_eq!(test.labels(), &[1, 0]);
    }

    /// `model.task = "regression"`: `y` of any numeric dtype is read as values, each finite.
    #[test]
    fn with_regression_y_holds_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = keras(dir.path(), Array::F32(vec![2], vec![2.5, -1.0]));
        let test = load(&path, Split::Test, true).unwrap();
        assert_eq!(test.targets(), crate::model::Targets::Values(&[2.5, -1.0]));
        let train = load(&path, Split::Train, true).unwrap();
        assert_eq!(
            train.targets(),
            crate::model::Targets::Values(&[0.0, 1.0, 2.0])
        );
        // Floats are refused as classes, pointing at model.task.
        let msg = load(&path, Split::Test, false).unwrap_err().to_string();
        assert!(msg.contains("model.task = \"regression\""), "{msg}");
        let path = keras(dir.path(), Array::F32(vec![2], vec![2.5, f32::NAN]));
        let msg = load(&path, Split::Test, true).unwrap_err().to_string();
        assert!(
            msg.contains("y_test") && msg.contains("non-finite"),
            "{msg}"
        );
    }

    #[test]
    fn bad_arrays_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = keras(dir.path(), Array::I64(vec![2], vec![1, 300]));
        let msg = load(&path, Split::Test, false).unwrap_err().to_string();
        assert!(msg.contains("y_test[1] is 300"), "{msg}");
        let path = keras(dir.path(), Array::I64(vec![3], vec![1, 0, 0]));
        let msg = load(&path, Split::Test, false).unwrap_err().to_string();
        assert!(msg.contains("y_test has shape [3]"), "{msg}");
        let path = keras(dir.path(), Array::F32(vec![2], vec![1.0, 0.0]));
        let msg = load(&path, Split::Test, false).unwrap_err().to_string();
        assert!(msg.contains("y_test holds floats"), "{msg}");
        // A missing array.
        let path = dir.path().join("partial.npz");
        write_npz(&path, &[("x_train", Array::U8(vec![1, 1], vec![1]))]).unwrap();
        let msg = load(&path, Split::Train, false).unwrap_err().to_string();
        assert!(msg.contains("no array \"y_train\""), "{msg}");
        // Not a zip at all.
        std::fs::write(&path, b"hello").unwrap();
        let msg = load(&path, Split::Train, false).unwrap_err().to_string();
        assert!(msg.contains("not a readable .npz"), "{msg}");
    }

    #[test]
    fn a_shape_that_lies_about_its_data_is_refused() {
        let mut bytes = npy_bytes(&Array::U8(vec![2, 2], vec![1, 2, 3, 4]));
        bytes.truncate(bytes.len() - 1);
        let msg = parse_npy(&bytes).unwrap_err();
        assert!(
            msg.contains("needs 4 bytes of data, the file has 3"),
            "{msg}"
        );
        // A huge claimed shape with no data: refused before any allocation.
        let huge = npy_bytes(&Array::U8(vec![1 << 40, 1 << 20], vec![]));
        let msg = parse_npy(&huge).unwrap_err();
        assert!(msg.contains("needs"), "{msg}");
    }

    #[test]
    fn npy_round_trips() {
        for a in [
            Array::U8(vec![2, 3], vec![1, 2, 3, 4, 5, 6]),
            Array::F32(vec![3], vec![1.5, -2.0, 0.0]),
            Array::I64(vec![1, 2], vec![-7, 9]),
        ] {
            assert_eq!(parse_npy(&npy_bytes(&a)).unwrap(), a);
        }
    }
}
