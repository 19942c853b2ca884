//! The best checkpoints' directory (`checkpoint.dir/best/`): copies of
//! checkpoint pairs and `index.json`, which lists them best first with the
//! scores they were ranked by. The evaluator decides what goes in
//! (`evaluator::Best`); this module only stores it, atomically:
//!
//! 1. the index is rewritten with the new pair's step under `pending`
//!    (steps whose files may exist but are not kept);
//! 2. the new pair is written beside the others (temp file, fsync, rename);
//! 3. the index is replaced with the new ranking, the steps that dropped
//!    out under `pending` (temp file, fsync, rename, fsync the directory);
//! 4. the pairs that dropped out are deleted, and the index rewritten without them under
//!    `pending` (those that could not be deleted stay there).
//!
//! So the index only ever names files that are complete, and a crash leaves
//! at worst a pair the index lists as pending, which [`BestDir::open`]
//! deletes. Nothing else is ever deleted: not a pair the index does not
//! mention (it may be an operator's), and nothing at all when the index
//! does not parse (it is set aside as `index.json.invalid`, every file is
//! kept, and a warning says so). `best` itself must not be a symbolic link:
//! a `best -> .` link once had the evaluator delete the training
//! checkpoints.
//! [`super::resolve`] reads the index, so `dtf eval checkpoint.dir/best`
//! evaluates the best checkpoint, not the newest.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::layout::{FILE_MODE, Limit, read, remove_pair};
use super::{CheckpointError, ema_file_name, model_file_name, parse_ema_name, parse_model_name};
use crate::files;

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
    /// What it was ranked by, beside the two above in the index's JSON
    /// (`accuracy`, `ema_accuracy`, `loss`, and `auc`, `ema_auc` for a
    /// binary model). They compare as [`crate::eval::Scores`] do (NaN
    /// equals NaN): an MLP entry, whose AUCs are NaN, equals itself read
    /// back, so reopening does not rewrite an unchanged index.
    #[serde(flatten)]
    pub scores: crate::eval::Scores,
}

/// `index.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Index {
    /// The metric the entries are ranked by (`ema_accuracy`, `accuracy`,
    /// `loss`, `auc`, `ema_auc`).
    pub metric: String,
    /// The kept checkpoints, best first.
    pub checkpoints: Vec<Entry>,
    /// Steps whose pairs may be in the directory but are not kept: one
    /// being written, ones that dropped out. The only files
    /// [`BestDir::open`] deletes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<u64>,
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
    match load_index(dir) {
        Loaded::Valid(i) => Some(i),
        Loaded::Missing | Loaded::Invalid => None,
    }
}

/// What reading an index found.
enum Loaded {
    /// No index file.
    Missing,
    /// One that cannot be read or parsed (warned about): decide nothing on it.
    Invalid,
    /// An index.
    Valid(Index),
}

fn load_index(dir: &Path) -> Loaded {
    let path = dir.join(INDEX);
    let bytes = match read(&path, Limit::INDEX) {
        Ok(b) => b,
        Err(CheckpointError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Loaded::Missing;
        }
        Err(e) => {
            tracing::warn!(error = %e, "Cannot read the best checkpoints' index; ignoring it.");
            return Loaded::Invalid;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(i) => Loaded::Valid(i),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "The best checkpoints' index is not valid; ignoring it.");
            Loaded::Invalid
        }
    }
}

/// The best checkpoints' directory, open for writing.
#[derive(Debug)]
pub struct BestDir {
    /// `checkpoint.dir/best`.
    dir: PathBuf,
    /// The index as last written (or read): what step 1 of
    /// [`BestDir::replace`] marks a new pair pending in.
    current: Index,
}

impl BestDir {
    /// Creates `dir` (mode 0750) if needed and returns it with its index
    /// (`None` if there is none), keeping only the entries whose two files
    /// exist. Deletes the pairs the index lists as pending and temp files:
    /// what a crash between the steps of [`BestDir::replace`] leaves. An
    /// index that does not parse deletes nothing: it is renamed to
    /// `index.json.invalid` and every pair stays.
    ///
    /// Errors: [`CheckpointError::Io`] if `dir` is a symbolic link, or
    /// cannot be created or listed.
    pub fn open(dir: &Path) -> Result<(Self, Option<Index>), CheckpointError> {
        create_dir(dir)?;
        let mut index = match load_index(dir) {
            Loaded::Valid(i) => Some(i),
            Loaded::Missing => None,
            Loaded::Invalid => {
                let aside = dir.join(format!("{INDEX}.invalid"));
                tracing::warn!(dir = %dir.display(), aside = %aside.display(), "Keeping every file in the best checkpoints' directory: its index cannot be read. It is set aside and a new one started.");
                fs::rename(dir.join(INDEX), &aside).map_err(|e| {
                    CheckpointError::io(&aside, "set the unreadable index aside", e)
                })?;
                None
            }
        };
        if let Some(i) = &mut index {
            i.checkpoints.retain(|e| {
                let named = parse_model_name(&e.file) == Some(e.global_step);
                named
                    && dir.join(&e.file).is_file()
                    && dir.join(ema_file_name(e.global_step)).is_file()
            });
        }
        let kept: HashSet<u64> = index
            .iter()
            .flat_map(|i| i.checkpoints.iter().map(|e| e.global_step))
            .collect();
        let pending: HashSet<u64> = index
            .iter()
            .flat_map(|i| i.pending.iter().copied())
            .filter(|s| !kept.contains(s))
            .collect();
        let entries =
            fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, "list directory", e))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let step = parse_model_name(name).or_else(|| parse_ema_name(name));
            let stale = match step {
                Some(step) => pending.contains(&step),
                None => files::temp_parts(name).is_some(),
            };
            if stale {
                let path = entry.path();
                match fs::remove_file(&path) {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "Removed a file the best checkpoints' index lists as not kept.")
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "Cannot remove a stale file.")
                    }
                }
            }
        }
        if let Some(i) = &mut index {
            i.pending.clear();
        }
        Ok((
            Self {
                dir: dir.to_path_buf(),
                current: index.clone().unwrap_or_else(|| Index {
                    metric: String::new(),
                    checkpoints: Vec::new(),
                    pending: Vec::new(),
                }),
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
    /// Errors: [`CheckpointError::Io`] naming the file; the ranking is then
    /// unchanged, and a pair written for it is deleted again.
    pub fn replace(
        &mut self,
        index: &Index,
        added: Option<(u64, &[u8], &[u8])>,
        removed: &[u64],
    ) -> Result<(), CheckpointError> {
        let mut written = Vec::new();
        let result = (|| {
            // Removed and made again (or replaced by a link) since it was opened?
            create_dir(&self.dir)?;
            if let Some((step, model, ema)) = added {
                // The pair is pending before it exists: a crash after its
                // rename leaves a pair the next open knows it may delete.
                let mut marked = self.current.clone();
                marked.pending.push(step);
                self.write_index(&marked)?;
                // EMA first, as the Saver does: a model file is the candidate.
                for (name, bytes) in [(ema_file_name(step), ema), (model_file_name(step), model)] {
                    let path = self.dir.join(name);
                    write_atomically(&path, bytes)?;
                    written.push(path);
                }
            }
            let mut index = index.clone();
            index.pending = removed.to_vec();
            self.write_index(&index)?;
            self.current = index;
            Ok(())
        })();
        if let Err(e) = result {
            // A step already kept was rewritten with the same bytes: its
            // files are the kept ones, not ours to delete.
            let kept = |s: u64| self.current.checkpoints.iter().any(|e| e.global_step == s);
            if !added.is_some_and(|(s, _, _)| kept(s)) {
                for path in written {
                    let _ = fs::remove_file(path);
                }
            }
            return Err(e);
        }
        let mut left = Vec::new();
        for &step in removed {
            // Not in the index any more: removed at the next open.
            for (path, e) in remove_pair(&self.dir, step) {
                tracing::warn!(path = %path.display(), error = %e, "Cannot delete a checkpoint that dropped out of the best.");
                left.push(step);
            }
        }
        left.dedup();
        if left != self.current.pending {
            // Gone: the index stops naming them, so it says what the directory holds. A
            // failure here loses nothing (the next open clears what is pending).
            let mut index = self.current.clone();
            index.pending = left;
            match self.write_index(&index) {
                Ok(()) => self.current = index,
                Err(e) => {
                    tracing::warn!(error = %e, "Cannot rewrite the best checkpoints' index after a removal.")
                }
            }
        }
        Ok(())
    }
}

impl BestDir {
    /// Replaces the index atomically (temp file, fsync, rename, fsync the directory).
    fn write_index(&self, index: &Index) -> Result<(), CheckpointError> {
        let path = self.dir.join(INDEX);
        let text = serde_json::to_vec_pretty(index)
            .map_err(|e| CheckpointError::io(&path, "encode", io::Error::other(e)))?;
        Ok(files::write_atomic_with(
            &path,
            &text,
            FILE_MODE,
            files::write_all,
        )?)
    }
}

/// Makes `dir` (mode 0750) if it is missing, refusing a symbolic link.
fn create_dir(dir: &Path) -> Result<(), CheckpointError> {
    crate::files::refuse_symlink(dir).map_err(|e| CheckpointError::io(dir, "use", e))?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
        .map_err(|e| CheckpointError::io(dir, "create directory", e))
}

/// Temp file (mode 0640), fsync, rename over `path`; the directory is not
/// synced here: the index written next ([`BestDir::write_index`]) syncs it,
/// and the pair is pending until then anyway.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let tmp = files::write_temp(path, bytes, FILE_MODE, files::write_all)?;
    Ok(files::rename_into_place(&tmp, path)?)
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
            scores: crate::eval::Scores {
                accuracy: 0.5,
                ema_accuracy,
                loss: 1.0,
                ..crate::eval::Scores::none()
            },
        }
    }

    #[test]
    fn the_directory_resolves_to_its_best_not_its_newest() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(DIR);
        let (mut best, index) = BestDir::open(&dir).unwrap();
        assert!(index.is_none());
        let (m100, e100) =
            to_bytes(&sample(100, &SMALL), &std::collections::BTreeMap::new()).unwrap();
        let (m200, e200) =
            to_bytes(&sample(200, &SMALL), &std::collections::BTreeMap::new()).unwrap();
        let one = Index {
            metric: "ema_accuracy".into(),
            checkpoints: vec![entry(100, 0.9)],
            pending: vec![],
        };
        best.replace(&one, Some((100, &m100, &e100)), &[]).unwrap();
        let two = Index {
            metric: "ema_accuracy".into(),
            checkpoints: vec![entry(100, 0.9), entry(200, 0.8)],
            pending: vec![],
        };
        best.replace(&two, Some((200, &m200, &e200)), &[]).unwrap();
        let file = resolve(&dir).unwrap();
        assert_eq!(file, dir.join("model.ckpt-100.safetensors"));
        assert_eq!(load(&file, None).unwrap(), sample(100, &SMALL));
        assert_eq!(read_index(&dir).unwrap(), two);

        // A pair marked pending and then written (a crash before the
        // index that names it) goes at open.
        let (m300, e300) =
            to_bytes(&sample(300, &SMALL), &std::collections::BTreeMap::new()).unwrap();
        let mut marked = two.clone();
        marked.pending = vec![300];
        best.write_index(&marked).unwrap();
        fs::write(dir.join(model_file_name(300)), m300).unwrap();
        fs::write(dir.join(ema_file_name(300)), e300).unwrap();
        let (mut best, _) = BestDir::open(&dir).unwrap();
        let dropped = Index {
            metric: "ema_accuracy".into(),
            checkpoints: vec![entry(100, 0.9)],
            pending: vec![],
        };
        best.replace(&dropped, None, &[200]).unwrap();
        // Its pair deleted, the index on disk no longer names step 200 as pending.
        assert_eq!(read_index(&dir).unwrap(), dropped);
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
            pending: vec![],
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

    /// Issue 25: with `best -> .` the evaluator deleted the training
    /// checkpoints; with `best -> archive/`, the archive's pair.
    #[test]
    fn a_best_that_is_a_link_is_refused_and_nothing_behind_it_is_deleted() {
        let tmp = tempfile::tempdir().unwrap();
        saved(tmp.path(), &[100, 200]);
        let archive = tmp.path().join("archive");
        saved(&archive, &[50]);
        let before = (names_in(tmp.path()), names_in(&archive));
        for target in [Path::new("."), Path::new("archive")] {
            let link = tmp.path().join(DIR);
            let _ = fs::remove_file(&link);
            std::os::unix::fs::symlink(target, &link).unwrap();
            let err = BestDir::open(&link).unwrap_err().to_string();
            assert!(err.contains("symbolic link"), "{err}");
            fs::remove_file(&link).unwrap();
            assert_eq!((names_in(tmp.path()), names_in(&archive)), before);
        }
    }

    /// Issue 25: an index that did not parse made every pair in `best/`
    /// stale, the only copy of a step among them.
    #[test]
    fn an_index_that_does_not_parse_deletes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(DIR);
        saved(&dir, &[100, 200]);
        fs::write(
            dir.join(INDEX),
            b"{\"metric\": \"loss\", \"checkpoints\": [",
        )
        .unwrap();
        let files: Vec<String> = names_in(&dir)
            .into_iter()
            .filter(|n| n.starts_with("model"))
            .collect();
        let (_, index) = BestDir::open(&dir).unwrap();
        assert!(index.is_none());
        for f in &files {
            assert!(dir.join(f).is_file(), "{f} was deleted");
        }
        assert!(dir.join("index.json.invalid").is_file());
        // Nor at the next open, after a new index is written.
        let (mut best, _) = BestDir::open(&dir).unwrap();
        let one = Index {
            metric: "loss".into(),
            checkpoints: vec![],
            pending: vec![],
        };
        best.replace(&one, None, &[]).unwrap();
        BestDir::open(&dir).unwrap();
        for f in &files {
            assert!(dir.join(f).is_file(), "{f} was deleted after a new index");
        }
    }

    /// An index written before non-finite scores were kept out holds
    /// `null` for a NaN: it reads back as NaN, not as no index.
    #[test]
    fn an_index_with_a_null_score_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let mut index = Index {
            metric: "loss".into(),
            checkpoints: vec![entry(100, 0.9)],
            pending: vec![],
        };
        index.checkpoints[0].scores.loss = f32::NAN;
        fs::write(tmp.path().join(INDEX), serde_json::to_vec(&index).unwrap()).unwrap();
        let read = read_index(tmp.path()).unwrap();
        assert!(read.checkpoints[0].scores.loss.is_nan());
    }
}
