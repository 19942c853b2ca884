//! IDX (MNIST-format) files: `data.format = "idx"`, `data.dir`.
//!
//! An IDX file is a big-endian header — a magic number whose third byte is
//! the element type (0x08, unsigned byte) and whose fourth is the number of
//! dimensions, then one u32 per dimension — followed by the elements. Images
//! are `idx3` (n, rows, cols), labels `idx1` (n). Files may be gzipped; that
//! is detected from the gzip magic bytes, not from the name, so a renamed
//! file still loads.

use super::{DataError, Dataset, Features, Split, format_error};
use flate2::Compression;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Magic number of an idx3 unsigned-byte file (images).
const IMAGES_MAGIC: u32 = 0x0000_0803;
/// Magic number of an idx1 unsigned-byte file (labels).
const LABELS_MAGIC: u32 = 0x0000_0801;
/// The first two bytes of every gzip stream (RFC 1952).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

impl Dataset {
    /// Loads `split` from `dir`, taking `<name>.gz` or `<name>`, whichever
    /// exists (`.gz` when both do).
    ///
    /// Errors: [`DataError::Missing`] when a file is in neither form, and those
    /// of [`Dataset::from_files`].
    pub fn load(dir: &Path, split: Split) -> Result<Self, DataError> {
        let (images, labels) = split.file_names();
        let images = find_file(dir, images)?;
        let labels = find_file(dir, labels)?;
        Self::from_files(&images, &labels)
    }

    /// From an idx3 image file and an idx1 label file (gzip or raw, by magic).
    ///
    /// Errors: [`DataError::Io`] when a file cannot be read;
    /// [`DataError::Format`] for a wrong magic number, a truncated file,
    /// trailing bytes, an empty data set, or image and label counts that
    /// disagree.
    pub fn from_files(images: &Path, labels: &Path) -> Result<Self, DataError> {
        let (dims, pixels) = read_idx(images, IMAGES_MAGIC)?;
        let (label_dims, label_bytes) = read_idx(labels, LABELS_MAGIC)?;
        let (n_images, features) = (dims[0], dims[1] * dims[2]);
        let n_labels = label_dims[0];
        if n_images != n_labels {
            return Err(DataError::Format {
                path: labels.to_path_buf(),
                what: format!(
                    "holds {n_labels} labels but {} holds {n_images} images; \
                     the counts must agree",
                    images.display()
                ),
            });
        }
        if n_images == 0 {
            return Err(format_error(images, "holds no images"));
        }
        if features == 0 {
            return Err(format_error(
                images,
                format!(
                    "images are {} × {}: expected a positive size",
                    dims[1], dims[2]
                ),
            ));
        }
        Dataset::new(Features::Bytes(pixels), label_bytes, features, labels)
    }
}

/// The images of `split` in `dir`: how many, and pixels per image, read
/// from the IDX header alone (a check of the configuration costs 16 bytes,
/// not the whole set).
///
/// Errors: [`DataError::Missing`], [`DataError::Io`] when the file cannot
/// be read; [`DataError::Format`] for a header that is not idx3 images.
pub fn images_shape(dir: &Path, split: Split) -> Result<(usize, usize), DataError> {
    let path = find_file(dir, split.file_names().0)?;
    let io = |source| DataError::Io {
        path: path.clone(),
        source,
    };
    let mut file = super::open_file(&path)?;
    let mut head = Vec::with_capacity(16);
    (&mut file).take(16).read_to_end(&mut head).map_err(io)?;
    if head.starts_with(&GZIP_MAGIC) {
        let raw = std::io::Cursor::new(std::mem::take(&mut head)).chain(file);
        MultiGzDecoder::new(raw)
            .take(16)
            .read_to_end(&mut head)
            .map_err(io)?;
    }
    let bad = |what: String| format_error(&path, what);
    let word = |i: usize| {
        head.get(i..i + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    match (word(0), word(4), word(8), word(12)) {
        (Some(m), Some(n), Some(rows), Some(cols)) if m == IMAGES_MAGIC as usize => {
            Ok((n, rows * cols))
        }
        (Some(m), ..) if m != IMAGES_MAGIC as usize => Err(bad(format!(
            "wrong magic number: expected {IMAGES_MAGIC:#010x} (idx3 unsigned-byte images), found {m:#010x}"
        ))),
        _ => Err(bad(format!(
            "truncated header: expected 16 bytes, found {}",
            head.len()
        ))),
    }
}

/// `<dir>/<name>.gz` if it exists, else `<dir>/<name>`.
fn find_file(dir: &Path, name: &str) -> Result<PathBuf, DataError> {
    let gz = dir.join(format!("{name}.gz"));
    let raw = dir.join(name);
    for path in [&gz, &raw] {
        match std::fs::metadata(path) {
            Ok(_) => return Ok(path.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(DataError::Io {
                    path: path.clone(),
                    source,
                });
            }
        }
    }
    Err(DataError::Missing {
        path: gz,
        alt: raw,
        advice: missing_advice(dir),
    })
}

/// What to do about a directory without the IDX files: install the
/// reference data set when it holds nothing, or else say which formats dtf
/// reads, naming a few of the files it does hold — they are the user's own
/// data, and installing a package would not help.
pub(super) fn missing_advice(dir: &Path) -> String {
    const INSTALL: &str = "install the data set with `apt install dataset-fashion-mnist` \
        (Debian package dataset-fashion-mnist) or set data.dir (--data) to a directory \
        holding MNIST-format IDX files";
    let Ok(entries) = std::fs::read_dir(dir) else {
        return INSTALL.to_owned();
    };
    let mut held: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // Nothing, or part of an IDX set (a file lost): the reference advice.
    if held.is_empty() || held.iter().any(|f| f.contains("-ubyte")) {
        return INSTALL.to_owned();
    }
    held.sort();
    let shown: Vec<&str> = held.iter().take(3).map(String::as_str).collect();
    let more = match held.len() - shown.len() {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        "{} holds {}{more}, no MNIST-format IDX files; {}",
        dir.display(),
        shown.join(", "),
        super::FORMATS
    )
}

/// Reads a whole IDX file (decompressing it if it starts with the gzip magic)
/// and checks it against `magic`; returns the dimensions and the elements.
fn read_idx(path: &Path, magic: u32) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let bytes = super::read_file(path)?;
    let bytes = if bytes.starts_with(&GZIP_MAGIC) {
        // A small gzip stream may inflate without end: the header is
        // inflated first, then at most one byte past the elements it
        // declares (and never past this machine's memory), so the length
        // check of `parse_idx` refuses what is longer.
        let corrupt = |e: std::io::Error| {
            io(std::io::Error::new(
                e.kind(),
                format!("corrupt gzip data: {e}"),
            ))
        };
        let limit = super::max_bytes();
        let mut gz = MultiGzDecoder::new(&bytes[..]);
        let header = 4 + 4 * (magic & 0xff) as u64;
        let mut out = Vec::new();
        (&mut gz)
            .take(header)
            .read_to_end(&mut out)
            .map_err(corrupt)?;
        let declared = out
            .get(4..)
            .unwrap_or_default()
            .chunks_exact(4)
            .try_fold(1u64, |n, d| {
                n.checked_mul(u64::from(u32::from_be_bytes([d[0], d[1], d[2], d[3]])))
            })
            .unwrap_or(u64::MAX);
        if declared > limit {
            return Err(DataError::TooLarge {
                path: path.to_path_buf(),
                size: declared,
                limit,
            });
        }
        (&mut gz)
            .take(declared.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(corrupt)?;
        out
    } else {
        bytes
    };
    parse_idx(&bytes, magic).map_err(|what| format_error(path, what))
}

/// Validates an IDX buffer; the error says exactly what is wrong.
fn parse_idx(bytes: &[u8], magic: u32) -> Result<(Vec<usize>, Vec<u8>), String> {
    let kind = |m: u32| match m {
        IMAGES_MAGIC => "idx3 unsigned-byte images",
        LABELS_MAGIC => "idx1 unsigned-byte labels",
        _ => "unknown",
    };
    let ndims = (magic & 0xff) as usize;
    let header = 4 + 4 * ndims;
    if bytes.is_empty() {
        return Err(format!(
            "empty file: expected an IDX file ({}, magic {magic:#010x})",
            kind(magic)
        ));
    }
    if bytes.len() < 4 {
        return Err(format!(
            "truncated header: expected at least {header} bytes, found {}",
            bytes.len()
        ));
    }
    let u32_at =
        |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let found = u32_at(0);
    if found != magic {
        return Err(format!(
            "wrong magic number: expected {magic:#010x} ({}), found {found:#010x} ({}); \
             is this the right file?",
            kind(magic),
            kind(found)
        ));
    }
    if bytes.len() < header {
        return Err(format!(
            "truncated header: expected {header} bytes, found {}",
            bytes.len()
        ));
    }
    let dims: Vec<usize> = (0..ndims).map(|d| u32_at(4 + 4 * d) as usize).collect();
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("dimensions {dims:?} are too large"))?;
    let data = &bytes[header..];
    let what = if ndims == 1 { "labels" } else { "pixels" };
    if data.len() < expected {
        return Err(format!(
            "truncated: expected {expected} bytes of {what} (dimensions {dims:?}), found {}",
            data.len()
        ));
    }
    if data.len() > expected {
        return Err(format!(
            "{} unexpected bytes after the {expected} bytes of {what} (dimensions {dims:?})",
            data.len() - expected
        ));
    }
    Ok((dims, data.to_vec()))
}

/// Writes `header` then `body` to `path`, gzipped when it ends in `.gz`.
fn write_idx(path: &Path, header: &[u32], body: &[u8]) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(4 * header.len() + body.len());
    for h in header {
        bytes.extend_from_slice(&h.to_be_bytes());
    }
    bytes.extend_from_slice(body);
    let file = std::fs::File::create(path)?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut gz = GzEncoder::new(file, Compression::default());
        gz.write_all(&bytes)?;
        gz.finish()?.sync_all()
    } else {
        let mut file = file;
        file.write_all(&bytes)?;
        file.sync_all()
    }
}

fn dim(n: usize) -> std::io::Result<u32> {
    u32::try_from(n).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("dimension {n} does not fit an IDX header (u32)"),
        )
    })
}

/// Writes an idx3 image file (raw, or gzip when `path` ends in `.gz`): for tests and tools.
///
/// Errors: `InvalidInput` when `images.len()` is not a multiple of
/// `rows · cols` (or a dimension exceeds u32), and any I/O error.
pub fn write_idx_images(
    path: &Path,
    images: &[u8],
    rows: usize,
    cols: usize,
) -> std::io::Result<()> {
    let per = rows * cols;
    if per == 0 || !images.len().is_multiple_of(per) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} pixels are not a whole number of {rows} × {cols} images",
                images.len()
            ),
        ));
    }
    let header = [
        IMAGES_MAGIC,
        dim(images.len() / per)?,
        dim(rows)?,
        dim(cols)?,
    ];
    write_idx(path, &header, images)
}

/// Writes an idx1 label file (raw, or gzip when `path` ends in `.gz`).
///
/// Errors: any I/O error.
pub fn write_idx_labels(path: &Path, labels: &[u8]) -> std::io::Result<()> {
    write_idx(path, &[LABELS_MAGIC, dim(labels.len())?], labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` 2×3 images whose pixels encode their index, labels `i % 10`.
    fn sample(n: usize) -> (Vec<u8>, Vec<u8>) {
        let images = (0..n * 6).map(|p| (p % 256) as u8).collect();
        let labels = (0..n).map(|i| (i % 10) as u8).collect();
        (images, labels)
    }

    fn write_split(dir: &Path, split: Split, suffix: &str, n: usize) -> (Vec<u8>, Vec<u8>) {
        let (images, labels) = sample(n);
        let (i, l) = split.file_names();
        write_idx_images(&dir.join(format!("{i}{suffix}")), &images, 2, 3).unwrap();
        write_idx_labels(&dir.join(format!("{l}{suffix}")), &labels).unwrap();
        (images, labels)
    }

    /// An image file of `images` 2×3 images and a label file of the first
    /// `labels` of their labels, named `names`, in a fresh directory.
    fn files(
        names: (&str, &str),
        images: usize,
        labels: usize,
    ) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let (pixels, classes) = sample(images);
        let (i, l) = (dir.path().join(names.0), dir.path().join(names.1));
        write_idx_images(&i, &pixels, 2, 3).unwrap();
        write_idx_labels(&l, &classes[..labels]).unwrap();
        (dir, i, l)
    }

    fn format_message(result: Result<Dataset, DataError>) -> String {
        match result {
            Err(e @ DataError::Format { .. }) => e.to_string(),
            other => panic!("expected a format error, got {other:?}"),
        }
    }

    #[test]
    fn round_trip_raw_and_gz() {
        for suffix in ["", ".gz"] {
            let dir = tempfile::tempdir().unwrap();
            let (images, labels) = write_split(dir.path(), Split::Train, suffix, 7);
            let ds = Dataset::load(dir.path(), Split::Train).unwrap();
            assert_eq!(ds.len(), 7);
            assert_eq!(ds.features(), 6);
            assert_eq!(ds.values, Features::Bytes(images));
            assert_eq!(ds.labels(), &labels[..]);
        }
        // The gzip file really is compressed (detected by magic, not name).
        let dir = tempfile::tempdir().unwrap();
        write_split(dir.path(), Split::Test, ".gz", 3);
        let bytes = std::fs::read(dir.path().join("t10k-images-idx3-ubyte.gz")).unwrap();
        assert_eq!(bytes[..2], GZIP_MAGIC);
    }

    #[test]
    fn images_shape_reads_the_header_alone() {
        for suffix in ["", ".gz"] {
            let dir = tempfile::tempdir().unwrap();
            write_split(dir.path(), Split::Train, suffix, 7);
            assert_eq!(images_shape(dir.path(), Split::Train).unwrap(), (7, 6));
        }
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            images_shape(dir.path(), Split::Train),
            Err(DataError::Missing { .. })
        ));
        // Labels where images belong: the wrong magic number.
        write_idx_labels(&dir.path().join("train-images-idx3-ubyte"), &[1, 2]).unwrap();
        assert!(matches!(
            images_shape(dir.path(), Split::Train),
            Err(DataError::Format { .. })
        ));
    }

    #[test]
    fn gzip_is_detected_by_magic_not_name() {
        let dir = tempfile::tempdir().unwrap();
        let (images, labels) = sample(4);
        let gz_images = dir.path().join("images.gz");
        let gz_labels = dir.path().join("labels.gz");
        write_idx_images(&gz_images, &images, 2, 3).unwrap();
        write_idx_labels(&gz_labels, &labels).unwrap();
        let (plain_images, plain_labels) = (dir.path().join("i"), dir.path().join("l"));
        std::fs::rename(&gz_images, &plain_images).unwrap();
        std::fs::rename(&gz_labels, &plain_labels).unwrap();
        let ds = Dataset::from_files(&plain_images, &plain_labels).unwrap();
        assert_eq!(ds.values, Features::Bytes(images));
    }

    #[test]
    fn gz_is_preferred_when_both_exist() {
        let dir = tempfile::tempdir().unwrap();
        write_split(dir.path(), Split::Train, "", 3);
        write_split(dir.path(), Split::Train, ".gz", 5);
        assert_eq!(Dataset::load(dir.path(), Split::Train).unwrap().len(), 5);
    }

    #[test]
    fn wrong_magic_names_expected_and_found() {
        let (_dir, i, l) = files(("i", "l"), 3, 3);
        // Swapped: labels where images are expected.
        let msg = format_message(Dataset::from_files(&l, &i));
        assert!(msg.contains(&l.display().to_string()), "{msg}");
        assert!(msg.contains("expected 0x00000803"), "{msg}");
        assert!(msg.contains("found 0x00000801"), "{msg}");
    }

    #[test]
    fn truncated_file_says_how_many_bytes() {
        let (_dir, i, l) = files(("i", "l"), 3, 3);
        let bytes = std::fs::read(&i).unwrap();
        std::fs::write(&i, &bytes[..bytes.len() - 5]).unwrap();
        let msg = format_message(Dataset::from_files(&i, &l));
        assert!(msg.contains(&i.display().to_string()), "{msg}");
        assert!(msg.contains("expected 18 bytes of pixels"), "{msg}");
        assert!(msg.contains("found 13"), "{msg}");

        std::fs::write(&i, &bytes[..10]).unwrap();
        let msg = format_message(Dataset::from_files(&i, &l));
        assert!(
            msg.contains("truncated header: expected 16 bytes, found 10"),
            "{msg}"
        );

        std::fs::write(&i, b"").unwrap();
        let msg = format_message(Dataset::from_files(&i, &l));
        assert!(msg.contains("empty file"), "{msg}");
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let (_dir, i, l) = files(("i", "l"), 3, 3);
        let mut bytes = std::fs::read(&i).unwrap();
        bytes.extend_from_slice(&[0, 0]);
        std::fs::write(&i, bytes).unwrap();
        let msg = format_message(Dataset::from_files(&i, &l));
        assert!(msg.contains("2 unexpected bytes"), "{msg}");
    }

    #[test]
    fn corrupt_gzip_is_an_io_error_naming_the_file() {
        let (_dir, i, l) = files(("i.gz", "l"), 3, 3);
        let bytes = std::fs::read(&i).unwrap();
        std::fs::write(&i, &bytes[..bytes.len() / 2]).unwrap();
        let err = Dataset::from_files(&i, &l).unwrap_err();
        assert!(matches!(err, DataError::Io { .. }), "{err:?}");
        assert!(err.to_string().contains(&i.display().to_string()), "{err}");
    }

    #[test]
    fn count_mismatch_names_both_files_and_counts() {
        let (_dir, i, l) = files(("imgs", "lbls"), 4, 3);
        let msg = format_message(Dataset::from_files(&i, &l));
        assert!(msg.contains(&i.display().to_string()), "{msg}");
        assert!(msg.contains(&l.display().to_string()), "{msg}");
        assert!(msg.contains("3 labels"), "{msg}");
        assert!(msg.contains("4 images"), "{msg}");
    }

    #[test]
    fn missing_file_names_path_and_package() {
        let dir = tempfile::tempdir().unwrap();
        let err = Dataset::load(dir.path(), Split::Test).unwrap_err();
        let msg = err.to_string();
        let tried = dir.path().join("t10k-images-idx3-ubyte.gz");
        assert!(msg.contains(&tried.display().to_string()), "{msg}");
        assert!(msg.contains("apt install dataset-fashion-mnist"), "{msg}");
        // Images present, labels missing: the labels are named.
        write_split(dir.path(), Split::Test, "", 2);
        std::fs::remove_file(dir.path().join("t10k-labels-idx1-ubyte")).unwrap();
        let msg = Dataset::load(dir.path(), Split::Test)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("t10k-labels-idx1-ubyte"), "{msg}");
        assert!(!msg.contains("no MNIST-format IDX files"), "{msg}");
        // A directory of the user's own files: the formats dtf reads, not
        // the reference data set's package.
        let own = tempfile::tempdir().unwrap();
        for f in ["ratings.csv", "users.csv"] {
            std::fs::write(own.path().join(f), "a,b\n1,2\n").unwrap();
        }
        let msg = Dataset::load(own.path(), Split::Train)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("holds ratings.csv, users.csv, no MNIST-format IDX files"),
            "{msg}"
        );
        assert!(msg.contains("a CSV with a header"), "{msg}");
        assert!(!msg.contains("apt install"), "{msg}");
    }
}
