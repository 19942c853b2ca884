//! Files the configuration names: the configuration file itself, and the
//! token and TLS files, read once at start.
//!
//! Only regular files are read, and only up to a bound: a FIFO would block
//! `open()` (and `check-config`, and a daemon's start) until a writer came,
//! and `/dev/zero` would be read until memory ran out.

use super::error::{ConfigError, FileProblem};
use super::schema::Config;
use crate::files::{self, OpenError};
use std::io::Read;
use std::path::Path;

/// The largest token or PEM file read: a PEM chain is a few KiB, a token
/// tens of bytes; anything near this is not what the key should name.
pub const MAX_SECRET_FILE_BYTES: u64 = 1 << 20;

/// The largest configuration file read; the shipped one is about 4 KiB.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;

impl Config {
    /// Reads the bearer token, refusing a file others may read.
    ///
    /// Returns the file's content without surrounding whitespace.
    /// Errors: [`ConfigError::File`] if the file cannot be read, is not a
    /// regular file, is over [`MAX_SECRET_FILE_BYTES`], grants any
    /// permission to others (mode & 0o007), holds only whitespace, or holds
    /// a control character (a second line) inside the token: it travels in
    /// an HTTP header, where a worker could not send it.
    pub fn read_token(&self) -> Result<String, ConfigError> {
        let key = "security.token_file";
        let path = &self.security.token_file;
        let text = read_file(key, path, true)?;
        let token = String::from_utf8_lossy(&text).trim().to_owned();
        let fail = |problem: String| ConfigError::File {
            key,
            path: path.clone(),
            problem,
        };
        if token.is_empty() {
            return Err(fail(
                "the file is empty: expected the cluster's shared token".into(),
            ));
        }
        if let Some((at, c)) = token.char_indices().find(|(_, c)| c.is_control()) {
            return Err(fail(format!(
                "the token holds the control character {c:?} at byte {at}: \
                 expected the token on one line (a trailing newline is fine)"
            )));
        }
        Ok(token)
    }
}

/// The content of `path` (named by `key`); if `secret`, refused when the
/// file grants any permission to others (mode & 0o007).
///
/// Errors: [`ConfigError::File`], saying what to do: see [`FileProblem`].
pub fn read_file(key: &'static str, path: &Path, secret: bool) -> Result<Vec<u8>, ConfigError> {
    read_regular(path, MAX_SECRET_FILE_BYTES, secret).map_err(|problem| ConfigError::File {
        key,
        path: path.to_owned(),
        problem: problem.to_string(),
    })
}

/// Reads `path` if it is a regular file (symlinks followed) of at most
/// `limit` bytes; if `secret`, only if others have no permission on it.
/// Opened with [`files::open_regular`]: never blocks on a FIFO, and the
/// checks are on what was opened, so a rename cannot slip past them.
///
/// Errors: [`FileProblem`].
pub(super) fn read_regular(path: &Path, limit: u64, secret: bool) -> Result<Vec<u8>, FileProblem> {
    use std::os::unix::fs::PermissionsExt;
    let io = |action| move |error| FileProblem::Io { action, error };
    let (file, meta) = files::open_regular(path).map_err(|e| match e {
        OpenError::Io(error) => FileProblem::Io {
            action: "open",
            error,
        },
        OpenError::Special(kind) => FileProblem::NotRegular { kind },
    })?;
    let mode = meta.permissions().mode();
    if secret && mode & 0o007 != 0 {
        return Err(FileProblem::OthersMayRead {
            mode: mode & 0o7777,
            path: path.display().to_string(),
        });
    }
    let mut content = Vec::new();
    // One byte past the limit tells "at the limit" from "over it".
    file.take(limit + 1)
        .read_to_end(&mut content)
        .map_err(io("read"))?;
    if content.len() as u64 > limit {
        return Err(FileProblem::TooLarge { limit });
    }
    Ok(content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn token_config(dir: &Path, content: &str, mode: u32) -> Config {
        let path = dir.join("token");
        std::fs::write(&path, content).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut config = Config::default();
        config.security.token_file = path;
        config
    }

    #[test]
    fn token_file_permissions_and_content() {
        let dir = tempfile::tempdir().unwrap();
        let config = token_config(dir.path(), "s3cret\n", 0o640);
        assert_eq!(config.read_token().unwrap(), "s3cret");

        let config = token_config(dir.path(), "s3cret\n", 0o644);
        let err = config.read_token().unwrap_err().to_string();
        assert!(err.contains("chmod 640") && err.contains("token"), "{err}");

        let config = token_config(dir.path(), " \n", 0o600);
        let err = config.read_token().unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");

        let mut config = Config::default();
        config.security.token_file = dir.path().join("absent");
        let err = config.read_token().unwrap_err().to_string();
        assert!(err.contains("absent"), "{err}");
    }

    /// A FIFO at `dir/name`.
    fn fifo(dir: &Path, name: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        path
    }

    #[test]
    fn a_fifo_as_token_file_is_refused_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.security.token_file = fifo(dir.path(), "token");
        let err = config.read_token().unwrap_err().to_string();
        assert!(
            err.contains("FIFO") && err.contains("security.token_file"),
            "{err}"
        );
        let err = read_file("security.tls_ca", &fifo(dir.path(), "ca"), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("FIFO") && err.contains("security.tls_ca"),
            "{err}"
        );
    }

    #[test]
    fn a_device_or_directory_as_token_file_is_refused() {
        for (path, kind) in [("/dev/zero", "character device"), ("/", "directory")] {
            let err = read_file("security.tls_cert", Path::new(path), false)
                .unwrap_err()
                .to_string();
            assert!(err.contains(kind), "{path}: {err}");
        }
    }

    #[test]
    fn an_oversized_token_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let big = "x".repeat(MAX_SECRET_FILE_BYTES as usize + 1);
        let err = token_config(dir.path(), &big, 0o600)
            .read_token()
            .unwrap_err()
            .to_string();
        assert!(err.contains("larger than 1048576 bytes"), "{err}");
        let exact = "x".repeat(MAX_SECRET_FILE_BYTES as usize);
        assert_eq!(
            token_config(dir.path(), &exact, 0o600)
                .read_token()
                .unwrap(),
            exact
        );
    }

    #[test]
    fn a_token_with_an_embedded_newline_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["abc\ndef\n", "abc\r\ndef", "a\tb", "a\u{7f}b"] {
            let config = token_config(dir.path(), bad, 0o600);
            let err = config.read_token().unwrap_err().to_string();
            assert!(
                err.contains("security.token_file") && err.contains("control character"),
                "{bad:?}: {err}"
            );
            assert!(err.contains(&dir.path().join("token").display().to_string()));
        }
        let config = token_config(dir.path(), "abc def\r\n", 0o600);
        assert_eq!(config.read_token().unwrap(), "abc def");
    }
}
