//! Files that come from outside (configuration, secrets, checkpoints, data)
//! and files dtf writes.
//!
//! Reading: dtf reads only regular files, so a FIFO or a device named like
//! one of its files is refused by name instead of blocking or reading
//! forever ([`open_regular`]: non-blocking open, then a type check on the
//! descriptor). Each reader bounds its size by what its format allows.
//!
//! Writing: every file dtf writes goes to a temporary file beside it, is
//! fsynced and renamed over the old one ([`write_atomic`]), so a full disk
//! or a crash leaves the old file whole. A writer that puts several files in
//! place together (a checkpoint's pair) uses the steps themselves:
//! [`write_temp`], [`rename_into_place`], [`sync_dir`]. A directory dtf deletes or
//! overwrites in is never reached through a symbolic link it did not make
//! ([`refuse_symlink`]).

use std::fs::{self, File, FileType, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What a file of type `t` is, in words, when it is not a regular file;
/// `None` for a regular file.
pub fn special_kind(t: FileType) -> Option<&'static str> {
    Some(if t.is_file() {
        return None;
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_dir() {
        "a directory"
    } else {
        "a special file"
    })
}

/// Why [`open_regular`] did not return a file.
#[derive(Debug)]
pub enum OpenError {
    /// The operating system's error (missing, permission...).
    Io(io::Error),
    /// The path is not a regular file: what it is, in words.
    Special(&'static str),
}

/// Opens `path` for reading if it is a regular file, without ever blocking:
/// `O_NONBLOCK` makes `open` return at once on a FIFO (a blocking open waits
/// for a writer, deaf to SIGTERM), and the type is checked on the opened
/// descriptor (`fstat`), so a path swapped after a check cannot slip past
/// it. On a regular file `O_NONBLOCK` changes nothing. Returns the file and
/// its metadata.
///
/// Errors: [`OpenError::Io`], [`OpenError::Special`].
pub fn open_regular(path: &Path) -> Result<(File, fs::Metadata), OpenError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(OpenError::Io)?;
    let meta = file.metadata().map_err(OpenError::Io)?;
    match special_kind(meta.file_type()) {
        Some(kind) => Err(OpenError::Special(kind)),
        None => Ok((file, meta)),
    }
}

/// Why [`read_bounded`] read nothing.
#[derive(Debug)]
pub enum ReadError {
    /// The operating system's error, and the step it failed at (`open`,
    /// `stat`, `read`).
    Io {
        /// The step.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The path is not a regular file: what it is, in words.
    Special(&'static str),
    /// The file is larger than the reader's bound.
    TooLarge {
        /// Its size.
        size: u64,
        /// The bound.
        limit: u64,
    },
}

/// Reads `path` whole if it is a regular file of at most `limit` bytes:
/// [`open_regular`] (never blocks on a FIFO, checks the opened descriptor),
/// the size checked on that descriptor, then at most `limit` bytes read even
/// if the file grows meanwhile. Memory is allocated as the bytes arrive, not
/// up front (a bound may be gigabytes).
///
/// Errors: [`ReadError`].
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    use std::io::Read;
    let (file, meta) = open_regular(path).map_err(|e| match e {
        OpenError::Io(source) => ReadError::Io {
            what: "open",
            source,
        },
        OpenError::Special(kind) => ReadError::Special(kind),
    })?;
    if meta.len() > limit {
        return Err(ReadError::TooLarge {
            size: meta.len(),
            limit,
        });
    }
    let mut bytes = Vec::new();
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|source| ReadError::Io {
            what: "read",
            source,
        })?;
    Ok(bytes)
}

/// Refuses `path` if it is a symbolic link: dtf deletes and overwrites only
/// in directories it reaches without one it did not make (a `best -> .`
/// link once made the evaluator delete the training checkpoints). A path
/// that does not exist is fine.
///
/// Errors: an [`io::Error`] saying so, or the error of `lstat`.
pub fn refuse_symlink(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(io::Error::other(format!(
            "{} is a symbolic link: dtf does not delete or overwrite files through a link \
             it did not make; make it a directory",
            path.display()
        ))),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether `a` and `b` are the same file (device and inode), following
/// links; false when either does not exist.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// `.<name>.tmp-<pid>` beside `path`: hidden, and named so that no reader
/// of the directory takes it for the file itself.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// The parts of a name [`temp_path`] made, `.<name>.tmp-<pid>`: the name of
/// the file it stands for and the writer's pid as written (not checked to
/// be a number). `None` for any other name.
pub fn temp_parts(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix('.')?.rsplit_once(".tmp-")
}

/// Writes one byte buffer to an open file: a seam, so that a test can
/// inject ENOSPC half-way through a file ([`write_all`] everywhere else).
pub type WriteFn = fn(&Path, &mut File, &[u8]) -> io::Result<()>;

/// Writes all of `bytes`: how every write but a fault-injection test's goes.
pub fn write_all(_path: &Path, file: &mut File, bytes: &[u8]) -> io::Result<()> {
    file.write_all(bytes)
}

/// Why [`write_temp`], [`rename_into_place`] or [`write_atomic_with`]
/// failed: the step and the file it acted on, for the caller's message.
#[derive(Debug)]
pub struct WriteError {
    /// The file acted on: the temp file, the file renamed over, or the
    /// directory synced.
    pub path: PathBuf,
    /// The step: `create`, `write`, `fsync`, `rename into place`, `fsync
    /// directory`.
    pub action: &'static str,
    /// The operating system's error.
    pub source: io::Error,
}

/// Writes `bytes` with `write` to a new temp file beside `path` ([`temp_path`],
/// mode `mode`), fsynced; returns its path. A temp file of the same name left
/// by an earlier writer is removed first and the new one created exclusively,
/// so a planted link is not followed. On any error the temp file is removed.
///
/// Errors: [`WriteError`] naming the temp file.
pub fn write_temp(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    write: WriteFn,
) -> Result<PathBuf, WriteError> {
    let tmp = temp_path(path);
    let at = |action: &'static str| {
        let path = tmp.clone();
        move |source| WriteError {
            path,
            action,
            source,
        }
    };
    let result = (|| {
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(at("create")(e)),
            _ => {}
        }
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(at("create"))?;
        write(&tmp, &mut file, bytes).map_err(at("write"))?;
        file.sync_all().map_err(at("fsync"))
    })();
    match result {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Renames the temp file `tmp` over `path`; on failure removes `tmp`. The
/// rename is durable only once the directory is synced ([`sync_dir`]): a
/// caller renaming several files syncs once after the last.
///
/// Errors: [`WriteError`] naming `path`.
pub fn rename_into_place(tmp: &Path, path: &Path) -> Result<(), WriteError> {
    fs::rename(tmp, path).map_err(|source| {
        let _ = fs::remove_file(tmp);
        WriteError {
            path: path.to_path_buf(),
            action: "rename into place",
            source,
        }
    })
}

/// Writes `bytes` to `path` atomically: [`write_temp`] (with `write`),
/// [`rename_into_place`], fsync the directory. On any error the temp file is
/// removed and `path` is as it was.
///
/// Errors: [`WriteError`] of the step that failed.
pub fn write_atomic_with(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    write: WriteFn,
) -> Result<(), WriteError> {
    let tmp = write_temp(path, bytes, mode, write)?;
    rename_into_place(&tmp, path)?;
    let dir = parent_dir(path);
    sync_dir(dir).map_err(|source| WriteError {
        path: dir.to_path_buf(),
        action: "fsync directory",
        source,
    })
}

/// Writes `bytes` to `path` atomically: a new temp file beside it (mode
/// `mode`, created exclusively so a planted link is not followed), fsync,
/// rename over `path`, fsync the directory. On any error the temp file is
/// removed and `path` is as it was.
///
/// Errors: the [`io::Error`] of the step that failed.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    write_atomic_with(path, bytes, mode, write_all).map_err(|e| e.source)
}

/// The directory `path` is in (`.` for a bare name).
fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// fsyncs the directory `dir`, so a rename in it is durable.
///
/// Errors: the [`io::Error`] of `open` or `fsync`.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Raises this process's soft limit of open descriptors to its hard limit
/// (children inherit it) and returns the soft limit now in force. A fresh
/// shell's soft limit is 1024, far below what a ps under a flood of
/// connections, or a `dtf local` cluster, may hold; the units set
/// `LimitNOFILE=` themselves.
pub fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_and_leaves_no_temp() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("out.bin");
        fs::write(&path, b"old").unwrap();
        write_atomic(&path, b"new", 0o640).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_link_is_refused_and_same_file_sees_through_names() {
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("best");
        std::os::unix::fs::symlink(".", &link).unwrap();
        assert!(refuse_symlink(&link).is_err());
        assert!(refuse_symlink(tmp.path()).is_ok());
        assert!(refuse_symlink(&tmp.path().join("missing")).is_ok());
        let f = tmp.path().join("f");
        fs::write(&f, b"x").unwrap();
        assert!(same_file(&f, &tmp.path().join("best/f")));
        assert!(!same_file(&f, &tmp.path().join("g")));
    }
}
