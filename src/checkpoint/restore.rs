//! Reading checkpoints back: [`load`], [`restore_latest`], [`resolve`], and
//! the directory scan they share with retention.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::format::parse;
use super::{
    Checkpoint, CheckpointError, EMA_EXT, INDEX_FILE, MODEL_EXT, model_file_name, parse_ema_name,
    parse_model_name,
};
use crate::model::VarSpec;

/// Steps found in `dir`: (model files, EMA files), each ascending.
pub(super) struct Steps {
    /// Steps of `model.ckpt-<N>.safetensors` files.
    pub(super) model: Vec<u64>,
    /// Steps of `model.ckpt-<N>.ema.safetensors` files.
    pub(super) ema: Vec<u64>,
}

pub(super) fn scan_steps(dir: &Path) -> Result<Steps, CheckpointError> {
    let entries = fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, "list directory", e))?;
    let mut steps = Steps {
        model: Vec::new(),
        ema: Vec::new(),
    };
    for entry in entries {
        let entry = entry.map_err(|e| CheckpointError::io(dir, "list directory", e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = parse_model_name(name) {
            steps.model.push(n);
        } else if let Some(n) = parse_ema_name(name) {
            steps.ema.push(n);
        }
    }
    steps.model.sort_unstable();
    steps.ema.sort_unstable();
    Ok(steps)
}

/// The `model_checkpoint_path` of an index file's text, if it has one.
fn index_newest(text: &str) -> Option<&str> {
    text.lines().find_map(|line| {
        let value = line.trim().strip_prefix("model_checkpoint_path:")?.trim();
        value.strip_prefix('"')?.strip_suffix('"')
    })
}

/// The EMA sibling of a model file path, and the step in its name if it has
/// the canonical `model.ckpt-<step>.safetensors` form.
pub(super) fn ema_sibling(path: &Path) -> Result<(PathBuf, Option<u64>), CheckpointError> {
    let bad = || CheckpointError::BadFileName {
        path: path.to_path_buf(),
    };
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(bad)?;
    if name.ends_with(EMA_EXT) {
        return Err(CheckpointError::invalid(
            path,
            "this is the EMA file; pass its model file, model.ckpt-<step>.safetensors",
        ));
    }
    let stem = name.strip_suffix(MODEL_EXT).ok_or_else(bad)?;
    Ok((
        path.with_file_name(format!("{stem}{EMA_EXT}")),
        parse_model_name(name),
    ))
}

pub(super) fn read(path: &Path) -> Result<Vec<u8>, CheckpointError> {
    fs::read(path).map_err(|e| CheckpointError::io(path, "read", e))
}

/// Loads `path` (a `model.ckpt-<N>.safetensors` file) and its
/// `model.ckpt-<N>.ema.safetensors` sibling, verifying as [`from_bytes`] does,
/// and that the step is `N`. (A differently named `<x>.safetensors` loads with
/// its `<x>.ema.safetensors`, without the name check.)
///
/// Errors: [`CheckpointError::BadFileName`], [`CheckpointError::Io`] (either
/// file missing or unreadable), [`CheckpointError::Safetensors`],
/// [`CheckpointError::Invalid`].
pub fn load(path: &Path, expected: Option<&[VarSpec]>) -> Result<Checkpoint, CheckpointError> {
    let (ema_path, named_step) = ema_sibling(path)?;
    let model = read(path)?;
    let ema = read(&ema_path)?;
    let ckpt = parse(&model, path, &ema, &ema_path, expected)?;
    if let Some(n) = named_step
        && n != ckpt.global_step
    {
        return Err(CheckpointError::invalid(
            path,
            format!(
                "holds global_step {}, but its name says {n}: renamed by hand?",
                ckpt.global_step
            ),
        ));
    }
    Ok(ckpt)
}

/// The newest checkpoint in `dir` that verifies against `expected`.
///
/// Candidates are every `model.ckpt-<N>.safetensors` in `dir`, newest step
/// first — not the index, which a crash may leave stale. A damaged one is
/// skipped with a warning and left in place for the operator. Temp files are
/// ignored.
///
/// Returns `Ok(None)` when `dir` is missing or holds no checkpoint.
/// Errors: [`CheckpointError::Io`] if `dir` cannot be listed;
/// [`CheckpointError::NoneValid`] if it holds checkpoints and none verifies —
/// starting afresh then would bury them under new ones, so the operator decides.
pub fn restore_latest(
    dir: &Path,
    expected: &[VarSpec],
) -> Result<Option<(PathBuf, Checkpoint)>, CheckpointError> {
    let steps = match scan_steps(dir) {
        Ok(s) => s,
        Err(CheckpointError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut newest_error = None;
    for &step in steps.model.iter().rev() {
        let path = dir.join(model_file_name(step));
        match load(&path, Some(expected)) {
            Ok(ckpt) => return Ok(Some((path, ckpt))),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "Skipping a checkpoint that does not verify; it is left in place.");
                newest_error.get_or_insert(e);
            }
        }
    }
    match newest_error {
        None => Ok(None),
        Some(e) => Err(CheckpointError::NoneValid {
            path: dir.to_path_buf(),
            count: steps.model.len(),
            newest: Box::new(e),
        }),
    }
}

/// For `dtf eval` and `dtf inspect`: a file resolves to itself; a directory to
/// its newest checkpoint — the index's `model_checkpoint_path` if that file
/// exists, else the highest-step `model.ckpt-<N>.safetensors`.
///
/// Errors: [`CheckpointError::Io`] if `path` does not exist or cannot be
/// listed; [`CheckpointError::NotFound`] for a directory without checkpoints.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    let meta = fs::metadata(path).map_err(|e| CheckpointError::io(path, "open", e))?;
    if !meta.is_dir() {
        return Ok(path.to_path_buf());
    }
    if let Ok(text) = fs::read_to_string(path.join(INDEX_FILE))
        && let Some(newest) = index_newest(&text)
    {
        let candidate = path.join(newest);
        if candidate.is_file() {
            return Ok(candidate);
        }
        tracing::warn!(index = %path.join(INDEX_FILE).display(), missing = %candidate.display(), "Checkpoint index is stale; using the newest file instead.");
    }
    let steps = scan_steps(path)?;
    match steps.model.last() {
        Some(&n) => Ok(path.join(model_file_name(n))),
        None => Err(CheckpointError::NotFound {
            path: path.to_path_buf(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn restore_skips_damaged_newest_and_leaves_it_in_place() {
        for how in [
            Damage::Truncated,
            Damage::GarbageHeader,
            Damage::WrongShape,
            Damage::MissingEma,
            Damage::NonFinite,
            Damage::BitFlipInData,
            Damage::EmaOfOtherStep,
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let s = saver(tmp.path(), 5);
            s.save(&sample(100, &SMALL)).unwrap();
            s.save(&sample(200, &SMALL)).unwrap();
            damage(tmp.path(), how);
            let before = names_in(tmp.path());

            let newest = tmp.path().join("model.ckpt-200.safetensors");
            assert!(
                load(&newest, Some(&small_specs())).is_err(),
                "{how:?} loads"
            );
            let (path, ckpt) = restore_latest(tmp.path(), &small_specs())
                .unwrap()
                .unwrap_or_else(|| panic!("{how:?}: nothing restored"));
            assert_eq!(
                path,
                tmp.path().join("model.ckpt-100.safetensors"),
                "{how:?}"
            );
            assert_eq!(ckpt, sample(100, &SMALL), "{how:?}");
            assert_eq!(names_in(tmp.path()), before, "{how:?}: files changed");
        }
    }

    #[test]
    fn errors_say_what_is_wrong_and_where() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&sample(200, &SMALL)).unwrap();
        let path = tmp.path().join("model.ckpt-200.safetensors");
        let wrong = specs(&[4, 7, 2]);
        let msg = load(&path, Some(&wrong)).unwrap_err().to_string();
        assert!(msg.contains("model.ckpt-200.safetensors"), "{msg}");
        assert!(
            msg.contains("layer1/weights") && msg.contains("[4, 3]") && msg.contains("[4, 7]"),
            "{msg}"
        );

        damage(tmp.path(), Damage::MissingEma);
        let msg = load(&path, Some(&small_specs())).unwrap_err().to_string();
        assert!(msg.contains("model.ckpt-200.ema.safetensors"), "{msg}");
    }

    #[test]
    fn load_checks_the_step_in_the_file_name() {
        let tmp = tempfile::tempdir().unwrap();
        saver(tmp.path(), 5).save(&sample(100, &SMALL)).unwrap();
        for ext in [MODEL_EXT, EMA_EXT] {
            fs::rename(
                tmp.path().join(format!("model.ckpt-100{ext}")),
                tmp.path().join(format!("model.ckpt-300{ext}")),
            )
            .unwrap();
        }
        let err = load(&tmp.path().join("model.ckpt-300.safetensors"), None).unwrap_err();
        assert!(err.to_string().contains("name says 300"), "{err}");
        assert!(matches!(
            load(&tmp.path().join("model.ckpt-300.ema.safetensors"), None),
            Err(CheckpointError::Invalid { .. })
        ));
        assert!(matches!(
            load(&tmp.path().join("weights.bin"), None),
            Err(CheckpointError::BadFileName { .. })
        ));
    }

    #[test]
    fn load_rejects_variables_the_model_does_not_have() {
        let tmp = tempfile::tempdir().unwrap();
        let path = saver(tmp.path(), 5)
            .save(&sample(100, &[4, 3, 3, 2]))
            .unwrap();
        let err = load(&path, Some(&small_specs())).unwrap_err().to_string();
        assert!(err.contains("layer3/weights"), "{err}");
    }

    #[test]
    fn restore_finds_newest_file_when_index_points_at_missing_file() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&sample(100, &SMALL)).unwrap();
        s.save(&sample(200, &SMALL)).unwrap();
        fs::write(
            tmp.path().join(INDEX_FILE),
            "model_checkpoint_path: \"model.ckpt-900.safetensors\"\n",
        )
        .unwrap();
        let (path, ckpt) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(path, tmp.path().join("model.ckpt-200.safetensors"));
        assert_eq!(ckpt.global_step, 200);
        assert_eq!(resolve(tmp.path()).unwrap(), path);
    }

    #[test]
    fn restore_ignores_a_stale_index_naming_an_older_checkpoint() {
        // A crash after the model file's rename and before the index's.
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&sample(100, &SMALL)).unwrap();
        let index = fs::read(tmp.path().join(INDEX_FILE)).unwrap();
        s.save(&sample(200, &SMALL)).unwrap();
        fs::write(tmp.path().join(INDEX_FILE), index).unwrap();
        let (path, _) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(path, tmp.path().join("model.ckpt-200.safetensors"));
        // resolve trusts an index whose file exists: that is what an operator's
        // `dtf eval DIR` sees, documented as "the index's newest".
        assert_eq!(
            resolve(tmp.path()).unwrap(),
            tmp.path().join("model.ckpt-100.safetensors")
        );
    }

    #[test]
    fn resolve_without_index_takes_highest_step_and_files_resolve_to_themselves() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        for step in [9, 10, 100] {
            s.save(&sample(step, &SMALL)).unwrap();
        }
        fs::remove_file(tmp.path().join(INDEX_FILE)).unwrap();
        let newest = tmp.path().join("model.ckpt-100.safetensors");
        assert_eq!(resolve(tmp.path()).unwrap(), newest);
        assert_eq!(resolve(&newest).unwrap(), newest);
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            resolve(empty.path()),
            Err(CheckpointError::NotFound { .. })
        ));
        assert!(matches!(
            resolve(&empty.path().join("nope")),
            Err(CheckpointError::Io { .. })
        ));
    }

    #[test]
    fn restore_on_missing_or_empty_dir_is_none() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(
            restore_latest(&tmp.path().join("missing"), &small_specs())
                .unwrap()
                .is_none()
        );
        assert!(
            restore_latest(tmp.path(), &small_specs())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn restore_ignores_temp_files_and_odd_names() {
        let tmp = tempfile::tempdir().unwrap();
        saver(tmp.path(), 5).save(&sample(100, &SMALL)).unwrap();
        for name in [
            ".model.ckpt-300.safetensors.tmp-12345",
            ".model.ckpt-300.ema.safetensors.tmp-12345",
            "model.ckpt-0400.safetensors",
            "model.ckpt-+500.safetensors",
            "model.ckpt-600.safetensors.bak",
        ] {
            fs::write(tmp.path().join(name), b"partial").unwrap();
        }
        let (path, _) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(path, tmp.path().join("model.ckpt-100.safetensors"));
    }

    #[test]
    fn restore_errors_when_every_checkpoint_is_damaged() {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&sample(200, &SMALL)).unwrap();
        damage(tmp.path(), Damage::Truncated);
        match restore_latest(tmp.path(), &small_specs()) {
            Err(CheckpointError::NoneValid {
                count: 1, newest, ..
            }) => {
                assert!(matches!(*newest, CheckpointError::Safetensors { .. }))
            }
            other => panic!("{other:?}"),
        }
        assert!(tmp.path().join("model.ckpt-200.safetensors").exists());
    }
}
