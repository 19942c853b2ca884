//! The best checkpoints' directory (`checkpoint.dir/best/`): copies of
//! checkpoint pairs and `index.json`, which lists them best first with the
//! scores they were ranked by. The evaluator decides what goes in
//! (`evaluator::Best`); this module only stores it, atomically:
//!
//! 1. a new pair is written beside the others (temp file, fsync, rename);
//! 2. the index is replaced (temp file, fsync, rename, fsync the directory);
//! 3. the pair that dropped out is deleted.
//!
//! So the index only ever names files that are complete, and a crash leaves
//! at worst a pair the index does not name, which [`BestDir::open`] deletes.
//! [`super::resolve`] reads the index, so `dtf eval checkpoint.dir/best`
//! evaluates the best checkpoint, not the newest.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::restore::{Limit, read};
use super::save::{remove_pair, sync_dir, write_all, write_temp};
use super::{CheckpointError, ema_file_name, model_file_name, parse_ema_name, parse_model_name};

/// The directory's name under `checkpoint.dir`.
pub const DIR: &str = "best";
/// The index's name in it.
pub const INDEX: &str = "index.json";

/// One kept checkpoint and its scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Its model file's name in the directory (`model.ckpt-N.safetensors`).
    pub file: String,
    /// Its step.
    pub global_step: u64,
    /// Test accuracy of the raw variables.
    pub accuracy: f32,
    /// Test accuracy of the EMA shadows.
    pub ema_accuracy: f32,
    /// Test cross-entropy of the raw variables.
    pub loss: f32,
}

/// `index.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Index {
    /// The metric the entries are ranked by (`ema_accuracy`, `accuracy`, `loss`).
    pub metric: String,
    /// The kept checkpoints, best first.
    pub checkpoints: Vec<Entry>,
}

impl Index {
    /// The best entry's model file in `dir`, if it is a plain file name
    /// there (the index is a file anyone with write access can edit, and
    /// `../x` would read outside the directory).
    pub fn best_file(&self, dir: &Path) -> Option<PathBuf> {
        let first = self.checkpoints.first()?;
        parse_model_name(&first.file).map(|_| dir.join(&first.file))
    }
}

/// Reads `dir/index.json`; `None` if it is missing, not a regular file,
/// larger than an index can be, or not an index (a warning says which).
pub fn read_index(dir: &Path) -> Option<Index> {
    let path = dir.join(INDEX);
    let bytes = match read(&path, Limit::INDEX) {
        Ok(b) => b,
        Err(CheckpointError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return None;
        }
        Err(e) => {
            tracing::warn!(error = %e, "Cannot read the best checkpoints' index; ignoring it.");
            return None;
        }
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| tracing::warn!(path = %path.display(), error = %e, "The best checkpoints' index is not valid; ignoring it."))
        .ok()
}

/// The best checkpoints' directory, open for writing.
#[derive(Debug)]
pub struct BestDir {
    /// `checkpoint.dir/best`.
    dir: PathBuf,
}

impl BestDir {
    /// Creates `dir` (mode 0750) if needed and returns it with its index
    /// (`None` if there is none), keeping only the entries whose two files
    /// exist. Deletes pairs and temp files the index does not name: what a
    /// crash between the steps of [`BestDir::replace`] leaves.
    ///
    /// Errors: [`CheckpointError::Io`] if the directory cannot be created
    /// or listed.
    pub fn open(dir: &Path) -> Result<(Self, Option<Index>), CheckpointError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|e| CheckpointError::io(dir, "create directory", e))?;
        let mut index = read_index(dir);
        if let Some(i) = &mut index {
            i.checkpoints.retain(|e| {
                let named = parse_model_name(&e.file) == Some(e.global_step);
                named
                    && dir.join(&e.file).is_file()
                    && dir.join(ema_file_name(e.global_step)).is_file()
            });
        }
        let kept: Vec<u64> = index
            .iter()
            .flat_map(|i| i.checkpoints.iter().map(|e| e.global_step))
            .collect();
        let entries =
            fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, "list directory", e))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let step = parse_model_name(name).or_else(|| parse_ema_name(name));
            let stale = match step {
                Some(step) => !kept.contains(&step),
                None => name.starts_with('.') && name.contains(".tmp-"),
            };
            if stale {
                let path = entry.path();
                match fs::remove_file(&path) {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "Removed a file the best checkpoints' index does not name.")
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "Cannot remove a stale file.")
                    }
                }
            }
        }
        Ok((
            Self {
                dir: dir.to_path_buf(),
            },
            index,
        ))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Makes the directory hold `index`: writes the pair of `added` (step,
    /// model bytes, EMA bytes) if given, then the index, then deletes the
    /// pairs of `removed`. Each write is atomic (see the module's steps).
    ///
    /// Errors: [`CheckpointError::Io`] naming the file; the index is then
    /// unchanged, and a pair written for it is deleted again.
    pub fn replace(
        &self,
        index: &Index,
        added: Option<(u64, &[u8], &[u8])>,
        removed: &[u64],
    ) -> Result<(), CheckpointError> {
        let mut written = Vec::new();
        let result = (|| {
            if let Some((step, model, ema)) = added {
                // EMA first, as the Saver does: a model file is the candidate.
                for (name, bytes) in [(ema_file_name(step), ema), (model_file_name(step), model)] {
                    let path = self.dir.join(name);
                    write_atomically(&path, bytes)?;
                    written.push(path);
                }
            }
            let text = serde_json::to_vec_pretty(index).map_err(|e| {
                CheckpointError::io(&self.dir.join(INDEX), "encode", io::Error::other(e))
            })?;
            write_atomically(&self.dir.join(INDEX), &text)?;
            sync_dir(&self.dir)
        })();
        if let Err(e) = result {
            for path in written {
                let _ = fs::remove_file(path);
            }
            return Err(e);
        }
        for &step in removed {
            // Not in the index any more: removed at the next open.
            for (path, e) in remove_pair(&self.dir, step) {
                tracing::warn!(path = %path.display(), error = %e, "Cannot delete a checkpoint that dropped out of the best.")
            }
        }
        Ok(())
    }
}

/// Temp file (mode 0640), fsync, rename over `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let tmp = write_temp(path, bytes, write_all)?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        CheckpointError::io(path, "rename into place", e)
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::format::to_bytes;
    use super::super::{load, resolve};
    use super::*;

    fn entry(step: u64, ema_accuracy: f32) -> Entry {
        Entry {
            file: model_file_name(step),
            global_step: step,
            accuracy: 0.5,
            ema_accuracy,
            loss: 1.0,
        }
    }

    #[test]
    fn the_directory_resolves_to_its_best_not_its_newest() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(DIR);
        let (best, index) = BestDir::open(&dir).unwrap();
        assert!(index.is_none());
        let (m100, e100) =
            to_bytes(&sample(100, &SMALL), &std::collections::BTreeMap::new()).unwrap();
        let (m200, e200) =
            to_bytes(&sample(200, &SMALL), &std::collections::BTreeMap::new()).unwrap();
        let one = Index {
            metric: "ema_accuracy".into(),
            checkpoints: vec![entry(100, 0.9)],
        };
        best.replace(&one, Some((100, &m100, &e100)), &[]).unwrap();
        let two = Index {
            metric: "ema_accuracy".into(),
            checkpoints: vec![entry(100, 0.9), entry(200, 0.8)],
        };
        best.replace(&two, Some((200, &m200, &e200)), &[]).unwrap();
        let file = resolve(&dir).unwrap();
        assert_eq!(file, dir.join("model.ckpt-100.safetensors"));
        assert_eq!(load(&file, None).unwrap(), sample(100, &SMALL));
        assert_eq!(read_index(&dir).unwrap(), two);

        // A pair the index does not name (a crash before the index) goes at open.
        let (m300, e300) =
            to_bytes(&sample(300, &SMALL), &std::collections::BTreeMap::new()).unwrap();
        fs::write(dir.join(model_file_name(300)), m300).unwrap();
        fs::write(dir.join(ema_file_name(300)), e300).unwrap();
        let dropped = Index {
            metric: "ema_accuracy".into(),
            checkpoints: vec![entry(100, 0.9)],
        };
        best.replace(&dropped, None, &[200]).unwrap();
        let (_, index) = BestDir::open(&dir).unwrap();
        assert_eq!(index.unwrap(), dropped);
        let mut names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "index.json",
                "model.ckpt-100.ema.safetensors",
                "model.ckpt-100.safetensors"
            ]
        );
    }

    #[test]
    fn an_index_naming_a_path_or_garbage_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        saved(tmp.path(), &[100, 200]);
        let mut index = Index {
            metric: "loss".into(),
            checkpoints: vec![entry(100, 0.9)],
        };
        index.checkpoints[0].file = "../elsewhere/model.ckpt-100.safetensors".into();
        fs::write(tmp.path().join(INDEX), serde_json::to_vec(&index).unwrap()).unwrap();
        assert_eq!(
            resolve(tmp.path()).unwrap(),
            tmp.path().join("model.ckpt-200.safetensors")
        );
        fs::write(tmp.path().join(INDEX), b"{not json").unwrap();
        assert_eq!(
            resolve(tmp.path()).unwrap(),
            tmp.path().join("model.ckpt-200.safetensors")
        );
    }
}
