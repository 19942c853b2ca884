//! Writing checkpoints: [`Saver`], atomic writes, retention, the index.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::format::{check_base_of, check_chain, to_bytes};
use super::layout::{FILE_MODE, Steps, remove_pair, scan_steps};
use super::{
    Checkpoint, CheckpointError, INDEX_FILE, LEGACY_INDEX_FILE, PREFIX, ema_file_name,
    model_file_name, read_metadata,
};
use crate::files::{self, WriteFn, write_all};

/// Writes checkpoints into one directory and keeps the newest few.
///
/// [`Saver::save`] blocks on disk I/O and fsync; run it with
/// `tokio::task::spawn_blocking`, off the training loop.
#[derive(Debug, Clone)]
pub struct Saver {
    /// The checkpoint directory (created by [`Saver::new`], and by
    /// [`Saver::save`] when it is missing).
    dir: PathBuf,
    /// How many checkpoints to keep; 0 keeps all (as TensorFlow's `Saver`).
    max_to_keep: usize,
    /// How bytes reach a temp file; [`write_all`] except in fault-injection tests.
    write: WriteFn,
    /// More metadata for every model file: the model's description
    /// ([`super::ModelMeta`]).
    metadata: BTreeMap<String, String>,
}

impl Saver {
    /// A saver for `dir`, creating it (mode 0750) if missing.
    /// `max_to_keep == 0` keeps every checkpoint.
    ///
    /// Errors: [`CheckpointError::Io`] if the directory cannot be created or
    /// `dir` exists and is not a directory.
    pub fn new(dir: &Path, max_to_keep: usize) -> Result<Self, CheckpointError> {
        let saver = Saver::at(dir, max_to_keep);
        saver.create_dir()?;
        Ok(saver)
    }

    /// A saver for `dir`, touching nothing until [`Saver::save`] (which
    /// creates the directory when it is missing).
    pub fn at(dir: &Path, max_to_keep: usize) -> Self {
        Saver {
            dir: dir.to_path_buf(),
            max_to_keep,
            write: write_all,
            metadata: BTreeMap::new(),
        }
    }

    /// Keeps the newest `max_to_keep` from the next save on (a reload may
    /// change `checkpoint.max_to_keep`).
    pub fn set_max_to_keep(&mut self, max_to_keep: usize) {
        self.max_to_keep = max_to_keep;
    }

    /// The checkpoint directory, mode 0750, made if missing.
    fn create_dir(&self) -> Result<(), CheckpointError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&self.dir)
            .map_err(|e| CheckpointError::io(&self.dir, "create directory", e))
    }

    /// Writes `meta` into every model file's metadata, so the checkpoint
    /// alone says how to use it (`dtf eval`, `predict`, `export`).
    pub fn with_model(mut self, meta: &super::ModelMeta) -> Self {
        self.set_model(meta);
        self
    }

    /// [`Saver::with_model`] in place: from the next save on.
    pub fn set_model(&mut self, meta: &super::ModelMeta) {
        self.metadata = meta.to_metadata();
    }

    /// Writes `model.ckpt-<step>.ema.safetensors`, then
    /// `model.ckpt-<step>.safetensors`, then the `checkpoint.dtf` index (and removes an older dtf's `checkpoint` index), each
    /// atomically (temp file, fsync, rename, fsync the directory); then deletes
    /// both files of every checkpoint beyond the newest `max_to_keep` by step
    /// (the one just written is always kept). Returns the model file's path.
    ///
    /// Both temp files are written and synced before either is renamed, so a
    /// failed write (ENOSPC, EACCES) changes nothing but leaving no temp file.
    /// Re-saving an existing step replaces its two files one after the other;
    /// a crash between the two renames leaves a pair from the same step.
    ///
    /// A delta (`increment` with a `base`, docs/design.md "Incremental
    /// checkpoints") is written only beside its base: the base's model file
    /// must be in the directory and of the delta's chain (its metadata
    /// alone is read), else nothing is written and the caller saves whole.
    /// Retention keeps the base of every delta it keeps (the one just
    /// written among them), and the index lists those bases among the kept.
    ///
    /// Errors: [`CheckpointError::Invalid`] if `ckpt` would not load back
    /// (non-finite value, a variable without a shadow, a duplicate name, a
    /// step beyond i64, a delta without tables or without one list of
    /// removed ids per table) or is a delta whose base is not in the
    /// directory or not its chain's base ("refusing to save a delta: its
    /// base model.ckpt-N.safetensors is not in the directory; …"), nothing
    /// written; [`CheckpointError::Io`] naming the file that failed.
    pub fn save(&self, ckpt: &Checkpoint) -> Result<PathBuf, CheckpointError> {
        let model_name = model_file_name(ckpt.global_step);
        let model_path = self.dir.join(&model_name);
        let ema_path = self.dir.join(ema_file_name(ckpt.global_step));
        let (model_bytes, ema_bytes) =
            to_bytes(ckpt, &self.metadata).map_err(|p| CheckpointError::invalid(&model_path, p))?;
        if let Some(increment) = &ckpt.increment
            && let Some(base) = increment.base
        {
            self.check_base(base, increment.chain)
                .map_err(|why| CheckpointError::invalid(&model_path, why))?;
        }

        // Removed since the last save (by an operator): made again.
        self.create_dir()?;
        self.remove_stale_temps();
        let model_existed = model_path.exists();
        let ema_tmp = self.write_temp(&ema_path, &ema_bytes)?;
        let model_tmp = match self.write_temp(&model_path, &model_bytes) {
            Ok(t) => t,
            Err(e) => {
                let _ = fs::remove_file(&ema_tmp);
                return Err(e);
            }
        };
        if let Err(e) = files::rename_into_place(&ema_tmp, &ema_path) {
            let _ = fs::remove_file(&model_tmp);
            return Err(e.into());
        }
        if let Err(e) = files::rename_into_place(&model_tmp, &model_path) {
            if !model_existed {
                // An EMA file without its model file is never a candidate, but
                // would confuse an operator; it is ours to remove.
                let _ = fs::remove_file(&ema_path);
            }
            return Err(e.into());
        }
        sync_dir(&self.dir)?;

        let steps = scan_steps(&self.dir)?;
        let (kept, pruned) = retention(&steps, ckpt.global_step, self.max_to_keep, |step| {
            base_of(&self.dir, step)
        });
        let index = index_text(&model_name, &kept);
        self.write_atomically(&self.dir.join(INDEX_FILE), index.as_bytes())?;
        self.remove_legacy_index();

        for step in pruned {
            // The new checkpoint is safe; a file we could not prune is only a
            // disk-usage problem, retried at the next save.
            for (path, e) in remove_pair(&self.dir, step) {
                tracing::warn!(path = %path.display(), error = %e, "Cannot delete old checkpoint file.")
            }
        }
        tracing::debug!(step = ckpt.global_step, path = %model_path.display(), "Checkpoint written.");
        Ok(model_path)
    }

    /// Whether `model.ckpt-<base>.safetensors` is in the directory and the
    /// base of chain `chain` (its metadata alone is read): a delta is
    /// written only beside its base.
    ///
    /// Errors: why not, to follow "refusing to save a delta: …".
    fn check_base(&self, base: u64, chain: u64) -> Result<(), String> {
        let name = model_file_name(base);
        let path = self.dir.join(&name);
        let refuse = |why: String| {
            format!("refusing to save a delta: its base {name} {why}; save this checkpoint whole")
        };
        let meta = match read_metadata(&path) {
            Ok(meta) => meta,
            Err(CheckpointError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(refuse("is not in the directory".into()));
            }
            Err(e) => return Err(refuse(format!("cannot be read: {e}"))),
        };
        let found = check_chain(&meta, &path).map_err(|e| refuse(format!("is unusable: {e}")))?;
        check_base_of(found, chain).map_err(refuse)
    }

    /// Removes the `checkpoint` index an older dtf wrote, which points
    /// `tf.train.latest_checkpoint` at a `.safetensors` file: only a regular
    /// file whose newest entry is one (a `checkpoint` file of TensorFlow's
    /// own, say from `dtf export --tf-checkpoint` into this directory, stays).
    fn remove_legacy_index(&self) {
        let path = self.dir.join(LEGACY_INDEX_FILE);
        let Ok(meta) = fs::symlink_metadata(&path) else {
            return;
        };
        let ours = meta.is_file()
            && super::restore::read_index(&self.dir, LEGACY_INDEX_FILE)
                .is_some_and(|entry| entry.ends_with(super::MODEL_EXT));
        if ours {
            match fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), index = INDEX_FILE, "Removed the old checkpoint index; dtf's index is now checkpoint.dtf.")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "Cannot remove the old checkpoint index.")
                }
            }
        }
    }

    /// Writes `bytes` to a temp file beside `path`, synced; returns the temp path.
    /// On failure the temp file is removed.
    fn write_temp(&self, path: &Path, bytes: &[u8]) -> Result<PathBuf, CheckpointError> {
        Ok(files::write_temp(path, bytes, FILE_MODE, self.write)?)
    }

    /// Temp file, fsync, rename over `path`, fsync the directory.
    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
        Ok(files::write_atomic_with(
            path, bytes, FILE_MODE, self.write,
        )?)
    }

    /// Removes temp files left by a crashed writer: those of a process that no
    /// longer exists (a live one may be mid-write).
    fn remove_stale_temps(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let me = std::process::id();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(pid) = temp_owner(name) else {
                continue;
            };
            if pid != me && !Path::new("/proc").join(pid.to_string()).exists() {
                let path = entry.path();
                match fs::remove_file(&path) {
                    Ok(()) => {
                        tracing::info!(path = %path.display(), "Removed a temp file left by a crash.")
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "Cannot remove stale temp file.")
                    }
                }
            }
        }
    }
}

/// The pid in the name of a temp file [`files::temp_path`] made for a
/// checkpoint file or the index.
fn temp_owner(name: &str) -> Option<u32> {
    let (file, pid) = files::temp_parts(name)?;
    // `checkpoint` covers `checkpoint.dtf` and the index's old name.
    if !(file.starts_with(PREFIX) || file.starts_with(LEGACY_INDEX_FILE)) {
        return None;
    }
    pid.parse().ok()
}

/// fsyncs `dir`, so the renames in it are durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    files::sync_dir(dir).map_err(|e| CheckpointError::io(dir, "fsync directory", e))
}

/// The base's step of the checkpoint at `step` in `dir` when it is a delta
/// (its model file's metadata alone is read); `None` for a whole one, or
/// one whose metadata cannot be read (it does not verify either).
fn base_of(dir: &Path, step: u64) -> Option<u64> {
    let path = dir.join(model_file_name(step));
    let meta = read_metadata(&path).ok()?;
    check_chain(&meta, &path).ok()??.1
}

/// (kept model steps ascending, steps whose files to delete). `current` is
/// always kept; the other places go to the newest steps; and the base of
/// each kept delta (`base_of`) is kept too, beyond those places, as long as
/// a kept delta needs it. EMA files whose model file is gone and that are
/// not kept are deleted too.
fn retention(
    steps: &Steps,
    current: u64,
    max_to_keep: usize,
    base_of: impl Fn(u64) -> Option<u64>,
) -> (Vec<u64>, Vec<u64>) {
    let mut kept: Vec<u64> = if max_to_keep == 0 {
        steps.model.clone()
    } else {
        let others = steps.model.iter().rev().filter(|&&s| s != current);
        std::iter::once(current)
            .chain(others.take(max_to_keep - 1).copied())
            .collect()
    };
    if !kept.contains(&current) {
        kept.push(current);
    }
    let bases: Vec<u64> = kept
        .iter()
        .filter_map(|&s| base_of(s))
        .filter(|b| steps.model.contains(b))
        .collect();
    // A damaged base takes every delta kept on it along: the newest
    // checkpoint older than the oldest base kept stays too (with its own
    // base), for a restore to fall back on.
    if max_to_keep > 0
        && let Some(&oldest) = bases.iter().min()
        && let Some(&fallback) = steps.model.iter().rev().find(|&&s| s < oldest)
    {
        kept.push(fallback);
        kept.extend(base_of(fallback).filter(|b| steps.model.contains(b)));
    }
    kept.extend(bases);
    kept.sort_unstable();
    kept.dedup();
    let keep: HashSet<u64> = kept.iter().copied().collect();
    let mut pruned: Vec<u64> = steps
        .model
        .iter()
        .chain(&steps.ema)
        .copied()
        .filter(|s| !keep.contains(s))
        .collect();
    pruned.sort_unstable();
    pruned.dedup();
    (kept, pruned)
}

fn index_text(newest: &str, kept: &[u64]) -> String {
    let mut text = format!("model_checkpoint_path: \"{newest}\"\n");
    for &step in kept {
        text.push_str(&format!(
            "all_model_checkpoint_paths: \"{}\"\n",
            model_file_name(step)
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{GLOBAL_STEP, load, resolve, restore_latest};
    use super::*;
    use safetensors::{Dtype, SafeTensors};
    use std::fs::File;
    use std::io::{self, Write};
    use std::time::Instant;

    #[test]
    fn round_trip_preserves_values_step_and_shadows() {
        let tmp = tempfile::tempdir().unwrap();
        let ckpt = sample(1200, &SMALL);
        let path = saver(tmp.path(), 5).save(&ckpt).unwrap();
        assert_eq!(path, tmp.path().join("model.ckpt-1200.safetensors"));
        assert!(tmp.path().join("model.ckpt-1200.ema.safetensors").is_file());

        let loaded = load(&path, Some(&small_specs())).unwrap();
        assert_eq!(loaded, ckpt);
        // Without a model to compare to, the file's own order is kept.
        assert_eq!(load(&path, None).unwrap(), ckpt);
        // The on-disk names are TensorFlow's.
        let ema = fs::read(tmp.path().join("model.ckpt-1200.ema.safetensors")).unwrap();
        let ema = SafeTensors::deserialize(&ema).unwrap();
        let mut names = ema.names();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "layer1/biases/ExponentialMovingAverage",
                "layer1/weights/ExponentialMovingAverage",
                "layer2/biases/ExponentialMovingAverage",
                "layer2/weights/ExponentialMovingAverage"
            ]
        );
        let model = fs::read(&path).unwrap();
        let model = SafeTensors::deserialize(&model).unwrap();
        let step = model.tensor(GLOBAL_STEP).unwrap();
        assert_eq!(step.dtype(), Dtype::I64);
        assert!(step.shape().is_empty());
        assert_eq!(step.data(), 1200i64.to_le_bytes());
    }

    #[test]
    fn save_creates_dir_with_mode_0750() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        saver(&dir, 5);
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        // umask may only take bits away.
        assert_eq!(mode & !0o750, 0, "mode {mode:o}");
    }

    #[test]
    fn index_names_newest_and_all_kept() {
        let tmp = tempfile::tempdir().unwrap();
        saved(tmp.path(), &[1000, 1200]);
        let index = fs::read_to_string(tmp.path().join(INDEX_FILE)).unwrap();
        assert_eq!(
            index,
            "model_checkpoint_path: \"model.ckpt-1200.safetensors\"\n\
             all_model_checkpoint_paths: \"model.ckpt-1000.safetensors\"\n\
             all_model_checkpoint_paths: \"model.ckpt-1200.safetensors\"\n"
        );
        assert_eq!(
            resolve(tmp.path()).unwrap(),
            tmp.path().join("model.ckpt-1200.safetensors")
        );
    }

    #[test]
    fn no_index_points_tensorflow_at_a_safetensors_file() {
        // An older dtf's directory: its `checkpoint` index names a
        // .safetensors file, which tf.train.latest_checkpoint would return.
        let tmp = tempfile::tempdir().unwrap();
        saved(tmp.path(), &[100]);
        let legacy = tmp.path().join(LEGACY_INDEX_FILE);
        fs::rename(tmp.path().join(INDEX_FILE), &legacy).unwrap();
        // Still read for the hint where checkpoint.dtf is missing.
        assert_eq!(
            super::super::restore::read_index(tmp.path(), LEGACY_INDEX_FILE).as_deref(),
            Some("model.ckpt-100.safetensors")
        );
        saver(tmp.path(), 5).save(&sample(200, &SMALL)).unwrap();
        assert!(
            !legacy.exists(),
            "the old index is removed by the next save"
        );
        assert!(tmp.path().join(INDEX_FILE).is_file());
        // A `checkpoint` of TensorFlow's own (an export into this
        // directory) names a TF checkpoint: it stays.
        let tf = "model_checkpoint_path: \"model.ckpt-200\"\n";
        fs::write(&legacy, tf).unwrap();
        saver(tmp.path(), 5).save(&sample(300, &SMALL)).unwrap();
        assert_eq!(fs::read_to_string(&legacy).unwrap(), tf);
    }

    #[test]
    fn retention_keeps_newest_two_of_four() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 2);
        for step in [10, 20, 30, 40] {
            s.save(&sample(step, &SMALL)).unwrap();
        }
        assert_eq!(
            names_in(tmp.path()),
            [
                "checkpoint.dtf",
                "model.ckpt-30.ema.safetensors",
                "model.ckpt-30.safetensors",
                "model.ckpt-40.ema.safetensors",
                "model.ckpt-40.safetensors"
            ]
        );
        let index = fs::read_to_string(tmp.path().join(INDEX_FILE)).unwrap();
        assert!(!index.contains("ckpt-20"), "{index}");
        assert!(index.contains("all_model_checkpoint_paths: \"model.ckpt-30.safetensors\""));
    }

    #[test]
    fn retention_always_keeps_the_checkpoint_just_written() {
        // A newer (say damaged) checkpoint is kept for the operator, and the
        // one just written, older by step, must survive it.
        let tmp = tempfile::tempdir().unwrap();
        saver(tmp.path(), 5).save(&sample(1000, &SMALL)).unwrap();
        saver(tmp.path(), 1).save(&sample(800, &SMALL)).unwrap();
        assert!(tmp.path().join("model.ckpt-800.safetensors").is_file());
        let index = fs::read_to_string(tmp.path().join(INDEX_FILE)).unwrap();
        assert!(index.starts_with("model_checkpoint_path: \"model.ckpt-800.safetensors\""));
        assert_eq!(
            names_in(tmp.path()),
            [
                "checkpoint.dtf",
                "model.ckpt-800.ema.safetensors",
                "model.ckpt-800.safetensors"
            ]
        );
    }

    /// Deltas kept keep their base, and the newest checkpoint older than
    /// it too: a damaged base must not take every kept checkpoint along.
    #[test]
    fn retention_keeps_a_fallback_older_than_the_bases_kept_deltas_need() {
        use super::super::layout::Steps;
        let steps = Steps {
            model: vec![10, 20, 30, 40, 50, 60],
            ema: vec![10, 20, 30, 40, 50, 60],
        };
        // 30 is a base; 40, 50 and 60 its deltas; 10 a base, 20 its delta.
        let base_of = |s: u64| match s {
            40 | 50 | 60 => Some(30),
            20 => Some(10),
            _ => None,
        };
        let (kept, pruned) = retention(&steps, 60, 2, base_of);
        assert_eq!(kept, [10, 20, 30, 50, 60]);
        assert_eq!(pruned, [40]);
        // Whole checkpoints only: the newest two, nothing more.
        let (kept, _) = retention(&steps, 60, 2, |_| None);
        assert_eq!(kept, [50, 60]);
    }

    #[test]
    fn max_to_keep_zero_keeps_all() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 0);
        for step in 1..=7 {
            s.save(&sample(step, &SMALL)).unwrap();
        }
        assert_eq!(
            scan_steps(tmp.path()).unwrap().model,
            (1..=7).collect::<Vec<_>>()
        );
    }

    fn fail_model_write(path: &Path, file: &mut File, bytes: &[u8]) -> io::Result<()> {
        let name = path.file_name().unwrap().to_str().unwrap();
        if name.starts_with(".model.ckpt-") && !name.contains(".ema.") {
            file.write_all(&bytes[..bytes.len() / 2])?;
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        file.write_all(bytes)
    }

    fn fail_index_write(path: &Path, file: &mut File, bytes: &[u8]) -> io::Result<()> {
        if path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(".checkpoint.dtf")
        {
            return Err(io::Error::from_raw_os_error(libc::EACCES));
        }
        file.write_all(bytes)
    }

    #[test]
    fn failed_write_changes_nothing_and_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let good = saver(tmp.path(), 1);
        good.save(&sample(100, &SMALL)).unwrap();
        let index = fs::read(tmp.path().join(INDEX_FILE)).unwrap();
        let before = names_in(tmp.path());

        let failing = Saver {
            write: fail_model_write,
            ..good.clone()
        };
        let err = failing.save(&sample(200, &SMALL)).unwrap_err();
        match &err {
            CheckpointError::Io { path, source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
                assert!(
                    path.to_str()
                        .unwrap()
                        .contains("model.ckpt-200.safetensors"),
                    "{err}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(names_in(tmp.path()), before);
        assert_eq!(fs::read(tmp.path().join(INDEX_FILE)).unwrap(), index);
        let (path, ckpt) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(
            (path.file_name().unwrap().to_str().unwrap(), ckpt),
            ("model.ckpt-100.safetensors", sample(100, &SMALL))
        );
    }

    #[test]
    fn failed_index_write_keeps_old_index_and_prunes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let good = saver(tmp.path(), 1);
        good.save(&sample(100, &SMALL)).unwrap();
        let index = fs::read(tmp.path().join(INDEX_FILE)).unwrap();
        let failing = Saver {
            write: fail_index_write,
            ..good.clone()
        };
        let err = failing.save(&sample(200, &SMALL)).unwrap_err();
        assert!(err.to_string().contains(".checkpoint.dtf.tmp-"), "{err}");
        assert_eq!(fs::read(tmp.path().join(INDEX_FILE)).unwrap(), index);
        // Nothing pruned before the index is written: both steps are there.
        assert_eq!(scan_steps(tmp.path()).unwrap().model, [100, 200]);
        assert!(!names_in(tmp.path()).iter().any(|n| n.contains(".tmp-")));
        // The next good save tidies up.
        good.save(&sample(300, &SMALL)).unwrap();
        assert_eq!(scan_steps(tmp.path()).unwrap().model, [300]);
    }

    #[test]
    fn next_save_removes_temp_files_of_dead_processes_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dead = tmp.path().join(".model.ckpt-5.safetensors.tmp-4000000000");
        let live = tmp.path().join(format!(".checkpoint.tmp-{}", 1));
        let unrelated = tmp.path().join(".hidden.tmp-4000000000");
        for p in [&dead, &live, &unrelated] {
            fs::write(p, b"x").unwrap();
        }
        saver(tmp.path(), 5).save(&sample(7, &SMALL)).unwrap();
        assert!(!dead.exists());
        assert!(live.exists(), "pid 1 is alive: its temp file may be in use");
        assert!(unrelated.exists());
    }

    #[test]
    fn save_refuses_what_would_not_load() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        let mut nan = sample(1, &SMALL);
        nan.shadows[0].1[[0, 0]] = f32::INFINITY;
        let mut unshadowed = sample(1, &SMALL);
        unshadowed.shadows.pop();
        let mut reserved = sample(1, &SMALL);
        reserved.variables[0].0 = GLOBAL_STEP.into();
        let mut huge = sample(1, &SMALL);
        huge.global_step = u64::MAX;
        for bad in [nan, unshadowed, reserved, huge] {
            assert!(
                matches!(s.save(&bad), Err(CheckpointError::Invalid { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(names_in(tmp.path()), Vec::<String>::new());
    }

    #[test]
    fn full_size_save_and_load_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let layers = [784, 500, 10];
        let ckpt = sample(20000, &layers);
        let s = saver(tmp.path(), 5);
        let t = Instant::now();
        let path = s.save(&ckpt).unwrap();
        let saved = t.elapsed();
        let t = Instant::now();
        let (_, loaded) = restore_latest(tmp.path(), &specs(&layers))
            .unwrap()
            .unwrap();
        let restored = t.elapsed();
        assert_eq!(loaded, ckpt);
        eprintln!(
            "784-500-10: save {saved:?}, restore {restored:?}, {} bytes",
            fs::metadata(path).unwrap().len()
        );
    }
    #[test]
    fn retention_keeps_the_base_of_kept_deltas_until_none_needs_it() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 2);
        let base = chain_base(10);
        s.save(&base).unwrap();
        for step in [20, 30] {
            s.save(&delta_of(&base, &chain_full(step))).unwrap();
        }
        // The newest two, 20 and 30, are deltas on 10: it stays, and the
        // index lists it among the kept.
        assert_eq!(scan_steps(tmp.path()).unwrap().model, [10, 20, 30]);
        let index = fs::read_to_string(tmp.path().join(INDEX_FILE)).unwrap();
        assert!(
            index.contains("all_model_checkpoint_paths: \"model.ckpt-10.safetensors\""),
            "{index}"
        );
        s.save(&sample_with_adagrad(40)).unwrap();
        assert_eq!(scan_steps(tmp.path()).unwrap().model, [10, 30, 40]);
        assert_eq!(
            load(&tmp.path().join("model.ckpt-30.safetensors"), None).unwrap(),
            resolved_full(&chain_full(30), 10)
        );
        // No kept delta needs 10 any more: it goes as usual.
        s.save(&sample_with_adagrad(50)).unwrap();
        assert_eq!(scan_steps(tmp.path()).unwrap().model, [40, 50]);
        assert_eq!(names_in(tmp.path()).len(), 5, "{:?}", names_in(tmp.path()));
    }

    #[test]
    fn a_delta_is_refused_unless_its_chains_base_is_on_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        let delta = delta_of(&chain_base(10), &chain_full(20));
        let refused = |why: &str| {
            let before = names_in(tmp.path());
            let err = s.save(&delta).unwrap_err();
            assert!(matches!(err, CheckpointError::Invalid { .. }), "{err:?}");
            let msg = err.to_string();
            assert!(
                msg.contains("model.ckpt-20.safetensors")
                    && msg.contains("refusing to save a delta: its base model.ckpt-10.safetensors")
                    && msg.contains(why),
                "{msg}"
            );
            assert_eq!(names_in(tmp.path()), before, "nothing written");
        };
        refused("is not in the directory");
        s.save(&sample_with_adagrad(10)).unwrap();
        refused("is no chain's base");
        let mut other = chain_base(10);
        other.increment.as_mut().unwrap().chain = 9;
        s.save(&other).unwrap();
        refused("is of chain 0000000000000009");
        s.save(&chain_base(10)).unwrap();
        s.save(&delta).unwrap();
        // The caller's fallback: the same state whole.
        s.save(&chain_full(30)).unwrap();
        assert_eq!(scan_steps(tmp.path()).unwrap().model, [10, 20, 30]);
    }
}
