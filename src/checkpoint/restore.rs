//! Reading checkpoints back: [`load`], [`restore_latest`], [`resolve`].

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::format::{TABLES_KEY, check_base_of, parse, whole_bytes};
use super::layout::{Limit, read, scan_steps};
use super::{
    Checkpoint, CheckpointError, EMA_EXT, INDEX_FILE, Increment, LEGACY_INDEX_FILE, MODEL_EXT,
    model_file_name, parse_model_name,
};
use crate::model::VarSpec;
use crate::model::table::Rows;

/// Whether an index entry is a plain file name — the only kind honoured: the
/// index is a file anyone with write access to the directory can edit, and
/// `../x` or `/x` would make `dtf eval` read outside `checkpoint.dir`.
/// Anything else is ignored with a warning, and the directory scan decides.
fn index_entry_is_plain(dir: &Path, entry: &str) -> bool {
    let plain = !entry.is_empty() && !entry.contains('/') && entry != "." && entry != "..";
    if !plain {
        tracing::warn!(index = %dir.join(INDEX_FILE).display(), entry, "Checkpoint index names a path, not a file name in the directory; ignoring it.");
    }
    plain
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

/// Loads `path` (a `model.ckpt-<N>.safetensors` file) and its
/// `model.ckpt-<N>.ema.safetensors` sibling, verifying as [`super::format::from_bytes`] does,
/// and that the step is `N`. (A differently named `<x>.safetensors` loads with
/// its `<x>.ema.safetensors`, without the name check.)
///
/// A delta (an incremental checkpoint, [`super::Increment`]) is resolved
/// onto its base `model.ckpt-<base>.safetensors` in the same directory,
/// read with the same bounds: the delta's dense state, step, run and shard
/// steps, and each table the base's rows without the delta's removed ids,
/// with the delta's rows put in (replacing the base's row of the same id);
/// `increment` then names the chain and the base, its `removed` empty. A
/// delta whose base is missing, does not verify, is not that chain's base
/// (another chain's, a delta itself, a checkpoint without chain) or holds
/// other tables (names, widths, update rules) does not verify either.
///
/// Only regular files are read, and at most as many bytes as a checkpoint of
/// `expected` can have ([`super::MAX_FILE_BYTES`] without a model; with
/// embedding tables listed in its header, that much more).
///
/// Errors: [`CheckpointError::BadFileName`], [`CheckpointError::Io`] (either
/// file missing or unreadable), [`CheckpointError::NotRegular`] (a FIFO, a
/// device...), [`CheckpointError::TooLarge`], [`CheckpointError::Safetensors`],
/// [`CheckpointError::Invalid`] (a delta that cannot be resolved among them,
/// naming the delta, its base's file and why).
pub fn load(path: &Path, expected: Option<&[VarSpec]>) -> Result<Checkpoint, CheckpointError> {
    let read = read_pair(path, expected)?;
    resolved(path, read.checkpoint, expected)
}

/// A checkpoint as [`load_verbatim`] read it: what it holds, and the two
/// files' bytes as read and verified (a delta's: its resolved state
/// re-encoded whole).
#[derive(Debug, Clone)]
pub struct Verbatim {
    /// What the files hold, as [`load`] returns it.
    pub checkpoint: Checkpoint,
    /// The model file's bytes.
    pub model: Vec<u8>,
    /// The EMA file's bytes.
    pub ema: Vec<u8>,
}

/// [`load`], keeping the bytes it verified: the evaluator copies exactly
/// what it scored into `best/`, even if the chief's retention deletes the
/// files meanwhile. A delta's bytes are not its files' but the resolved
/// checkpoint encoded whole (`format` `dtf-1`, no `chain` nor `base`, the
/// rest of its metadata kept), so that a copy stands alone without its base.
///
/// Errors: as [`load`].
pub fn load_verbatim(
    path: &Path,
    expected: Option<&[VarSpec]>,
) -> Result<Verbatim, CheckpointError> {
    let read = read_pair(path, expected)?;
    if read
        .checkpoint
        .increment
        .as_ref()
        .and_then(Increment::unresolved_base)
        .is_none()
    {
        return Ok(read);
    }
    let checkpoint = resolved(path, read.checkpoint, expected)?;
    let (model, ema) = whole_bytes(&checkpoint, &read.model, path)?;
    Ok(Verbatim {
        checkpoint,
        model,
        ema,
    })
}

/// The pair at `path` read and verified as it is: a delta unresolved.
fn read_pair(path: &Path, expected: Option<&[VarSpec]>) -> Result<Verbatim, CheckpointError> {
    let (ema_path, named_step) = ema_sibling(path)?;
    let (mut model_limit, mut ema_limit) = Limit::pair(expected);
    // Tables: bounded by memory, not by the model. Only a file whose header
    // (read alone, bounded) lists tables gets their room.
    if expected.is_some()
        && super::meta::read_metadata(path).is_ok_and(|m| m.contains_key(TABLES_KEY))
    {
        (model_limit, ema_limit) = (model_limit.with_tables(), ema_limit.with_tables());
    }
    let model = read(path, model_limit)?;
    let ema = read(&ema_path, ema_limit)?;
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
    Ok(Verbatim {
        checkpoint: ckpt,
        model,
        ema,
    })
}

/// `ckpt`, read from `path`, as it stands: itself, or a delta resolved onto
/// its base beside it.
///
/// Errors: [`CheckpointError::Invalid`] naming `path`, its base's file and
/// why the delta cannot be resolved.
fn resolved(
    path: &Path,
    ckpt: Checkpoint,
    expected: Option<&[VarSpec]>,
) -> Result<Checkpoint, CheckpointError> {
    let Some(base_step) = ckpt.increment.as_ref().and_then(Increment::unresolved_base) else {
        return Ok(ckpt);
    };
    let base_name = model_file_name(base_step);
    let base_path = path.with_file_name(&base_name);
    let refuse = |why: String| {
        CheckpointError::invalid(
            path,
            format!(
                "a delta (the tables' rows changed since its base) that cannot be resolved: \
                 its base {base_name} {why}"
            ),
        )
    };
    let base = match read_pair(&base_path, expected) {
        Ok(read) => read.checkpoint,
        Err(CheckpointError::Io {
            path: p, source, ..
        }) if p == base_path && source.kind() == io::ErrorKind::NotFound => {
            return Err(refuse("is missing: deleted by hand?".into()));
        }
        Err(e) => return Err(refuse(format!("does not load: {e}"))),
    };
    check_base(&ckpt, &base).map_err(refuse)?;
    Ok(apply_delta(ckpt, base))
}

/// Whether `base` is `delta`'s: its chain's base, whole, with the same
/// tables (names in order, widths, update rules).
///
/// Errors: what is wrong, for "its base model.ckpt-N.safetensors …".
fn check_base(delta: &Checkpoint, base: &Checkpoint) -> Result<(), String> {
    let chain = delta.increment.as_ref().map_or(0, |i| i.chain);
    check_base_of(base.increment.as_ref().map(|i| (i.chain, i.base)), chain)?;
    let names = |c: &Checkpoint| c.tables.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    if names(base) != names(delta) {
        return Err(format!(
            "holds tables {:?}, the delta {:?}",
            names(base),
            names(delta)
        ));
    }
    for ((name, old), (_, changed)) in base.tables.iter().zip(&delta.tables) {
        let (a, b) = (base.table_optimizer(name), delta.table_optimizer(name));
        if a != b {
            return Err(format!(
                "updates table {name:?} with {}, the delta with {}",
                a.map_or("no optimizer", |o| o.name()),
                b.map_or("no optimizer", |o| o.name())
            ));
        }
        if let (Some(x), Some(y)) = (width(old), width(changed))
            && x != y
        {
            return Err(format!(
                "holds table {name:?} {x} wide, the delta's rows are {y} wide"
            ));
        }
        old.fits(changed)
            .map_err(|e| format!("and the delta disagree on table {name:?}: {e}"))?;
    }
    Ok(())
}

/// Values per row of `rows`; `None` without rows.
fn width(rows: &Rows) -> Option<usize> {
    rows.values.len().checked_div(rows.ids.len())
}

/// `delta` resolved onto `base` ([`check_base`] passed): its own dense state,
/// each table the base's rows patched with the delta's.
fn apply_delta(mut delta: Checkpoint, base: Checkpoint) -> Checkpoint {
    let Some(mut increment) = delta.increment.take() else {
        return delta;
    };
    let removed = std::mem::take(&mut increment.removed);
    delta.tables = base
        .tables
        .into_iter()
        .zip(std::mem::take(&mut delta.tables))
        .zip(removed)
        .map(|(((name, old), (_, changed)), gone)| (name, old.patched(&gone, changed)))
        .collect();
    delta.increment = Some(increment);
    delta
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

/// For `dtf eval`, `dtf inspect` and `dtf status`: a file resolves to itself;
/// a directory with a best index (`best/index.json`, the evaluator's) to the
/// best checkpoint it names, if that verifies; any other directory to its newest checkpoint by the rule [`restore_latest`] uses —
/// the highest step among the `model.ckpt-<N>.safetensors` files that verify
/// (as [`load`] checks them, with no model to compare to) — so the tools and
/// a restarting chief never disagree. If none verifies, the highest step, so
/// that the tools report what is wrong with it.
///
/// The index is a hint, never an override: after a crash (a double SIGTERM
/// between the model file's rename and the index's) it can name an older
/// checkpoint than the newest valid one. When it names another file than the
/// one chosen, a warning says so.
///
/// Errors: [`CheckpointError::Io`] if `path` does not exist or cannot be
/// listed; [`CheckpointError::NotFound`] for a directory without checkpoints.
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    let meta = fs::metadata(path).map_err(|e| CheckpointError::io(path, "open", e))?;
    if !meta.is_dir() {
        return Ok(path.to_path_buf());
    }
    // The evaluator's `best/` directory: its index ranks, not the steps.
    if let Some(best) = super::best::read_index(path).and_then(|i| i.best_file(path))
        && load(&best, None).is_ok()
    {
        return Ok(best);
    }
    let steps = scan_steps(path)?;
    let Some(&highest) = steps.model.last() else {
        return Err(CheckpointError::NotFound {
            path: path.to_path_buf(),
        });
    };
    let newest = steps
        .model
        .iter()
        .rev()
        .map(|&n| path.join(model_file_name(n)))
        .find(|file| load(file, None).is_ok())
        .unwrap_or_else(|| path.join(model_file_name(highest)));
    if let Some(entry) = index_entry(path)
        && newest.file_name().and_then(|n| n.to_str()) != Some(entry.as_str())
    {
        tracing::warn!(index = %path.join(INDEX_FILE).display(), names = entry, using = %newest.display(), "Checkpoint index does not name the newest checkpoint that verifies; using that one.");
    }
    Ok(newest)
}

/// The index's `model_checkpoint_path` in `dir`, if the index is readable
/// and the entry a plain file name: `checkpoint.dtf`, or where a directory
/// from an older dtf has none, its `checkpoint` when that names a
/// `.safetensors` file (a `checkpoint` of TensorFlow's own names its
/// checkpoints, not dtf's).
fn index_entry(dir: &Path) -> Option<String> {
    read_index(dir, INDEX_FILE)
        .or_else(|| read_index(dir, LEGACY_INDEX_FILE).filter(|entry| entry.ends_with(MODEL_EXT)))
}

/// The `model_checkpoint_path` of the index `name` in `dir`, if readable
/// and a plain file name.
pub(super) fn read_index(dir: &Path, name: &str) -> Option<String> {
    let bytes = read(&dir.join(name), Limit::INDEX).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let entry = index_newest(&text)?;
    index_entry_is_plain(dir, entry).then(|| entry.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::{MAX_HEADER_BYTES, from_bytes, inspect};
    use super::*;
    use std::collections::BTreeMap;
    use std::fs::File;

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
        saved(tmp.path(), &[100, 200]);
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
        // `dtf eval DIR` agrees: the index is a hint, not an override.
        assert_eq!(resolve(tmp.path()).unwrap(), path);
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

    fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    }

    /// Runs `f` on a thread, failing the test if it has not returned within
    /// 10 s (a blocked `open` would otherwise hang the test run).
    fn within_deadline<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("blocked: still running after 10 s")
    }

    #[test]
    fn a_fifo_named_like_a_checkpoint_is_skipped_not_waited_on() {
        let tmp = tempfile::tempdir().unwrap();
        saver(tmp.path(), 5).save(&sample(100, &SMALL)).unwrap();
        let fifo = tmp.path().join("model.ckpt-200.safetensors");
        mkfifo(&fifo);
        let dir = tmp.path().to_path_buf();
        let (path, ckpt) = within_deadline(move || restore_latest(&dir, &small_specs()))
            .unwrap()
            .unwrap();
        assert_eq!(path, tmp.path().join("model.ckpt-100.safetensors"));
        assert_eq!(ckpt.global_step, 100);

        let err = within_deadline(move || load(&fifo, None)).unwrap_err();
        assert!(matches!(err, CheckpointError::NotRegular { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("model.ckpt-200.safetensors")
                && msg.contains("a FIFO, not a regular file"),
            "{msg}"
        );
    }

    #[test]
    fn a_checkpoint_symlinked_to_dev_zero_is_refused_not_read_forever() {
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("model.ckpt-200.safetensors");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let err = within_deadline(move || load(&link, None)).unwrap_err();
        assert!(
            err.to_string()
                .contains("a character device, not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn a_file_larger_than_the_model_allows_is_refused_unread() {
        let tmp = tempfile::tempdir().unwrap();
        saved(tmp.path(), &[100, 200]);
        // A sparse file: its size is what counts, not what it holds.
        let big = tmp.path().join("model.ckpt-200.safetensors");
        File::options()
            .write(true)
            .open(&big)
            .unwrap()
            .set_len(MAX_HEADER_BYTES + 4096)
            .unwrap();
        let err = load(&big, Some(&small_specs())).unwrap_err();
        match &err {
            CheckpointError::TooLarge { size, limit, .. } => {
                assert_eq!(*size, MAX_HEADER_BYTES + 4096);
                assert!(*limit < *size, "{err}");
            }
            other => panic!("{other:?}"),
        }
        assert!(err.to_string().contains("of this model"), "{err}");
        let (path, _) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(path, tmp.path().join("model.ckpt-100.safetensors"));
        // Without a model to compare to, only the sane maximum applies.
        assert!(matches!(
            load(&big, None),
            Err(CheckpointError::Safetensors { .. })
        ));
    }

    #[test]
    fn tables_beyond_the_models_size_restore_and_inspect_shows_them() {
        let tmp = tempfile::tempdir().unwrap();
        // 40,000 rows of 16: 5 MB of rows, far beyond the small model's
        // exact bound (its tensors and a 1 MiB header).
        let n = 40_000u64;
        let values: Vec<f32> = (0..n * 16).map(|i| (i % 97) as f32 * 0.01).collect();
        let mut c = sample(300, &SMALL);
        c.tables = vec![(
            "deep/embeddings".into(),
            crate::model::table::Rows {
                ids: (0..n).map(|i| i * 3 + 1).collect(),
                shadows: values.clone(),
                values,
                slots: Vec::new(),
            },
        )];
        saver(tmp.path(), 5).save(&c).unwrap();
        let (_, back) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(back, c);
        let ins = inspect(tmp.path()).unwrap();
        let t = &ins.tables[0];
        assert_eq!(
            (t.name.as_str(), t.rows, t.dim),
            ("deep/embeddings", 40_000, 16)
        );
        // Ids, values and shadows (SGD: no slots).
        assert_eq!(t.bytes, n * 8 + 2 * n * 16 * 4);
        let text = ins.to_string();
        assert!(text.contains("tables:") && text.contains("40000"), "{text}");
        // Without tables in its header, a file that large is refused unread.
        let plain = tmp.path().join("model.ckpt-400.safetensors");
        File::create(&plain).unwrap().set_len(5 << 20).unwrap();
        assert!(matches!(
            load(&plain, Some(&small_specs())),
            Err(CheckpointError::TooLarge { .. })
        ));
    }

    #[test]
    fn an_index_pointing_outside_the_directory_is_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, elsewhere) = (tmp.path().join("ckpt"), tmp.path().join("other"));
        saver(&dir, 5).save(&sample(100, &SMALL)).unwrap();
        saver(&elsewhere, 5).save(&sample(500, &SMALL)).unwrap();
        let outside = elsewhere.join("model.ckpt-500.safetensors");
        for entry in [
            "../other/model.ckpt-500.safetensors".to_string(),
            outside.display().to_string(),
        ] {
            fs::write(
                dir.join(INDEX_FILE),
                format!("model_checkpoint_path: \"{entry}\"\n"),
            )
            .unwrap();
            assert_eq!(
                resolve(&dir).unwrap(),
                dir.join("model.ckpt-100.safetensors"),
                "{entry}"
            );
            assert_eq!(inspect(&dir).unwrap().model.metadata["global_step"], "100");
        }
    }

    #[test]
    fn resolve_takes_the_newest_valid_checkpoint_not_the_newest_file() {
        let tmp = tempfile::tempdir().unwrap();
        saved(tmp.path(), &[100, 200]);
        damage(tmp.path(), Damage::BitFlipInData);
        let valid = tmp.path().join("model.ckpt-100.safetensors");
        assert_eq!(resolve(tmp.path()).unwrap(), valid);
        let (restored, _) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!(restored, valid);
    }
    /// A directory with a whole checkpoint at 20, the chain's base at 40
    /// and its delta at 60, as the saver writes them.
    fn chain_dir() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let s = saver(tmp.path(), 5);
        s.save(&sample_with_adagrad(20)).unwrap();
        s.save(&chain_base(40)).unwrap();
        s.save(&delta_of(&chain_base(40), &chain_full(60))).unwrap();
        tmp
    }

    #[test]
    fn a_delta_resolves_onto_its_base_to_the_whole_state() {
        let tmp = chain_dir();
        let delta = tmp.path().join("model.ckpt-60.safetensors");
        let want = resolved_full(&chain_full(60), 40);
        assert_eq!(load(&delta, Some(&small_specs())).unwrap(), want);
        assert_eq!(load(&delta, None).unwrap(), want);
        let (path, ckpt) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
        assert_eq!((path, ckpt), (delta.clone(), want));
        assert_eq!(resolve(tmp.path()).unwrap(), delta);
    }

    /// Damage to a chain: what it is, how it is done, the reason a load
    /// names, the step restore takes instead.
    type Harm = (&'static str, fn(&Path), &'static str, u64);

    #[test]
    fn a_delta_without_its_base_is_refused_naming_why_and_restore_falls_back() {
        let cases: [Harm; 4] = [
            (
                "base deleted",
                |d| fs::remove_file(d.join("model.ckpt-40.safetensors")).unwrap(),
                "its base model.ckpt-40.safetensors is missing: deleted by hand?",
                20,
            ),
            (
                "another chain's base at its step",
                |d| {
                    let mut other = chain_base(40);
                    other.increment.as_mut().unwrap().chain = 9;
                    write_unchecked(d, &other);
                },
                "its base model.ckpt-40.safetensors is of chain 0000000000000009, the delta of chain 5eed0000000000c4",
                40,
            ),
            (
                "a delta at the base's step",
                |d| write_unchecked(d, &delta_of(&chain_base(30), &chain_full(40))),
                "its base model.ckpt-40.safetensors is itself a delta (on base 30)",
                20,
            ),
            (
                "a whole checkpoint at the base's step",
                |d| write_unchecked(d, &chain_full(40)),
                "its base model.ckpt-40.safetensors is no chain's base",
                40,
            ),
        ];
        for (what, harm, why, fallback) in cases {
            let tmp = chain_dir();
            harm(tmp.path());
            let delta = tmp.path().join("model.ckpt-60.safetensors");
            for expected in [None, Some(small_specs())] {
                let err = load(&delta, expected.as_deref()).unwrap_err();
                let msg = err.to_string();
                assert!(
                    matches!(err, CheckpointError::Invalid { .. }),
                    "{what}: {err:?}"
                );
                assert!(
                    msg.contains("model.ckpt-60.safetensors") && msg.contains(why),
                    "{what}: {msg}"
                );
                assert!(
                    load_verbatim(&delta, expected.as_deref()).is_err(),
                    "{what}"
                );
            }
            let (path, _) = restore_latest(tmp.path(), &small_specs()).unwrap().unwrap();
            let older = tmp.path().join(model_file_name(fallback));
            assert_eq!(path, older, "{what}");
            assert_eq!(resolve(tmp.path()).unwrap(), older, "{what}");
            assert!(delta.exists(), "{what}: the delta is left in place");
        }
    }

    #[test]
    fn a_delta_whose_base_holds_other_tables_is_refused() {
        let tmp = chain_dir();
        let mut narrow = chain_base(40);
        narrow.tables[0].1 = rows_of(&[(1, 0), (2, 0)], 2);
        write_unchecked(tmp.path(), &narrow);
        let err = load(&tmp.path().join("model.ckpt-60.safetensors"), None).unwrap_err();
        assert!(
            err.to_string()
                .contains("holds table \"deep/embeddings\" 2 wide, the delta's rows are 3 wide"),
            "{err}"
        );
        let mut fewer = chain_base(40);
        fewer.tables.pop();
        write_unchecked(tmp.path(), &fewer);
        let err = load(&tmp.path().join("model.ckpt-60.safetensors"), None).unwrap_err();
        assert!(
            err.to_string()
                .contains("holds tables [\"deep/embeddings\"], the delta"),
            "{err}"
        );
    }

    #[test]
    fn load_verbatim_of_a_delta_gives_the_resolved_checkpoint_whole() {
        let tmp = chain_dir();
        // The model's description in the delta's metadata goes with it.
        let extra = BTreeMap::from([("layers".to_string(), "[4,3,2]".to_string())]);
        let delta = delta_of(&chain_base(40), &chain_full(60));
        let (m, e) = super::super::format::to_bytes(&delta, &extra).unwrap();
        fs::write(tmp.path().join("model.ckpt-60.safetensors"), m).unwrap();
        fs::write(tmp.path().join("model.ckpt-60.ema.safetensors"), e).unwrap();

        let path = tmp.path().join("model.ckpt-60.safetensors");
        let v = load_verbatim(&path, Some(&small_specs())).unwrap();
        assert_eq!(v.checkpoint, resolved_full(&chain_full(60), 40));
        let whole = from_bytes(&v.model, &v.ema, Some(&small_specs())).unwrap();
        assert_eq!(whole, chain_full(60));
        assert_eq!(whole.increment, None);
        // It stands alone: a copy elsewhere loads without the base.
        let best = tempfile::tempdir().unwrap();
        let copy = best.path().join("model.ckpt-60.safetensors");
        fs::write(&copy, &v.model).unwrap();
        fs::write(best.path().join("model.ckpt-60.ema.safetensors"), &v.ema).unwrap();
        assert_eq!(load(&copy, None).unwrap(), chain_full(60));
        let meta = super::super::read_metadata(&copy).unwrap();
        assert_eq!(meta["format"], super::super::FORMAT);
        assert_eq!(meta["layers"], "[4,3,2]");
        assert!(
            !meta.contains_key("chain") && !meta.contains_key("base"),
            "{meta:?}"
        );
        // A whole checkpoint's bytes are its files'.
        let base = tmp.path().join("model.ckpt-40.safetensors");
        assert_eq!(
            load_verbatim(&base, None).unwrap().model,
            fs::read(&base).unwrap()
        );
    }
}
