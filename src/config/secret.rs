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
        let fail = |problem: String| ConfigError::File {
            key,
            path: path.clone(),
            problem,
        };
        let text = match read_regular(path, MAX_SECRET_FILE_BYTES, true) {
            Ok(text) => text,
            Err(FileProblem::Io { error, .. }) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(fail(no_token_file(path)));
            }
            Err(problem) => return Err(fail(problem.to_string())),
        };
        let token = String::from_utf8_lossy(&text).trim().to_owned();
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

/// What to do when the token file `path` does not exist: make one (the
/// command the .deb's postinst runs, with the mode the token needs), or
/// point at the cluster's own, in each of the three ways a task is told.
fn no_token_file(path: &Path) -> String {
    // Quoted for the shell: the command is meant to be pasted (spaces, quotes, `;`).
    let path = format!("'{}'", path.display().to_string().replace('\'', r"'\''"));
    format!(
        "no such file: every task of a cluster proves itself with the same token. Make one once \
         with `(umask 027; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > {path})` \
         (mode 0640 or stricter: other users may not read it) and copy that file to every host \
         of the cluster; or point at the cluster's token with --token-file FILE (dtf-ps, \
         dtf-worker), DTF_SECURITY__TOKEN_FILE=FILE, or security.token_file in dtf.toml"
    )
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

    /// Issue 43: a missing token said only `No such file or directory`; the
    /// error now says how to make one, and every way to point at another.
    #[test]
    fn a_missing_token_file_says_how_to_make_one_and_how_to_point_at_one() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("token");
        let mut config = Config::default();
        config.security.token_file = absent.clone();
        let err = config.read_token().unwrap_err().to_string();
        let make = format!(
            "(umask 027; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > '{}')",
            absent.display()
        );
        assert!(err.contains(&make), "{err}");
        for way in [
            "--token-file FILE",
            "DTF_SECURITY__TOKEN_FILE=FILE",
            "security.token_file in dtf.toml",
            "copy that file to every host",
            "0640",
        ] {
            assert!(err.contains(way), "{way:?} not in {err}");
        }
        assert!(
            err.starts_with(&format!(
                "{} (security.token_file): no such file",
                absent.display()
            )),
            "{err}"
        );

        // The command it gives makes a token the daemons accept.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&make)
            .status()
            .unwrap();
        assert!(out.success());
        let token = config.read_token().unwrap();
        assert_eq!(token.len(), 64, "{token}");
        assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
        let mode = std::fs::metadata(&absent).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
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
