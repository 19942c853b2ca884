//! Files the configuration names and that hold secrets or keys: the token
//! and the TLS files, read once at start.

use super::error::ConfigError;
use super::schema::Config;
use std::path::Path;

impl Config {
    ///
    /// Returns the file's content without surrounding whitespace.
    /// Errors: [`ConfigError::File`] if the file cannot be read, grants any
    /// permission to others (mode & 0o007), or holds only whitespace.
    pub fn read_token(&self) -> Result<String, ConfigError> {
        let key = "security.token_file";
        let path = &self.security.token_file;
        let text = read_file(key, path, true)?;
        let token = String::from_utf8_lossy(&text).trim().to_owned();
        if token.is_empty() {
            return Err(ConfigError::File {
                key,
                path: path.clone(),
                problem: "the file is empty: expected the cluster's shared token".into(),
            });
        }
        Ok(token)
    }
}

/// The content of `path` (named by `key`); if `secret`, refused when the
/// file grants any permission to others (mode & 0o007).
///
/// Errors: [`ConfigError::File`], saying what to do.
pub fn read_file(key: &'static str, path: &Path, secret: bool) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    let fail = |problem: String| ConfigError::File {
        key,
        path: path.to_owned(),
        problem,
    };
    let mut file = std::fs::File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
    if secret {
        // Check the mode of the file we opened, not of the path: no race
        // with a rename between the check and the read.
        let mode = file
            .metadata()
            .map_err(|e| fail(format!("cannot stat: {e}")))?
            .permissions()
            .mode();
        if mode & 0o007 != 0 {
            return Err(fail(format!(
                "the file has mode {:04o}, which lets other users read a secret: \
                 run `chmod 640 {}` (readable by its owner and group only)",
                mode & 0o7777,
                path.display()
            )));
        }
    }
    let mut content = Vec::new();
    file.read_to_end(&mut content)
        .map_err(|e| fail(format!("cannot read: {e}")))?;
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
}
