//! Which snapshot a starting ps restores: the one holding the highest step
//! (not the highest name), and only when it is newer than this shard's own
//! count in the newest checkpoint (issue 45).

use super::{DeltaFile, PsService, Restored, list, list_deltas, load, of_this_shard, remove_temps};
use crate::checkpoint;
use crate::config::Config;
use crate::model::Mlp;
use crate::model::TableSpec;
use crate::ps::shard::Shard;
use std::fs;
use std::path::PathBuf;
use std::time::{Instant, SystemTime};
use tracing::{info, warn};

/// What the newest checkpoint says of ps `task`'s shard, when
/// `checkpoint.dir` can be read on this host: `Some(None)` when it exists
/// and holds none that verifies, `None` when it cannot be told (no such
/// directory here: a ps on another host).
fn newest_checkpoint(config: &Config, task: usize) -> Option<Option<CheckpointStep>> {
    let dir = &config.checkpoint.dir;
    if !dir.is_dir() {
        return None;
    }
    let specs = Mlp::new(&config.model.layers).ok()?.variables();
    match checkpoint::restore_latest(dir, &specs) {
        Ok(found) => Some(found.map(|(_, c)| CheckpointStep {
            shard: c.shard_step(task, config.cluster.ps.len()),
            global: c.global_step,
            run: c.run,
        })),
        Err(_) => None,
    }
}

/// The newest checkpoint as one shard sees it.
#[derive(Debug, Clone, Copy)]
struct CheckpointStep {
    /// The shard's own update count in it: what its snapshots' steps are
    /// compared with (in async mode a shard may count behind ps 0).
    shard: u64,
    /// Its global step (ps 0's count), for the log.
    global: u64,
    /// Its run (0: unknown).
    run: u64,
}

/// The snapshot to restore among `files` (whole snapshots) and `deltas`:
/// every whole one is read and checked ([`load`]) with the deltas of its
/// chain applied in order, up to the first missing or invalid one
/// ([`Restored::patch`]); of those that verify the one holding the highest
/// step wins — of the run `prefer` when one of its files verifies (the
/// newest checkpoint's run, where it can be seen) — wherever it sits in the
/// listing: a file's name says nothing a file cannot fake (issue 45).
/// Every file passed over as invalid is named with its reason.
pub(super) fn choose(
    (files, deltas): (&[(u64, PathBuf)], &[DeltaFile]),
    (shard, tables): (&Shard, &[TableSpec]),
    identity: &str,
    prefer: Option<u64>,
    task: usize,
) -> Option<(PathBuf, Restored)> {
    let mut best: Option<(PathBuf, Restored)> = None;
    for (_, path) in files {
        let r = match load(path, shard, identity, tables) {
            Ok(r) if r.seq == 0 => r,
            Ok(_) => {
                warn!(ps = task, snapshot = %path.display(), "Snapshot ignored: it is a delta named as a whole snapshot.");
                continue;
            }
            Err(e) => {
                warn!(ps = task, error = %e, "Snapshot ignored.");
                continue;
            }
        };
        let r = patch_chain(r, deltas, (shard, tables), identity, task);
        let rank = |r: &Restored| (prefer.is_some_and(|run| r.run == run), r.step);
        if best.as_ref().is_none_or(|(_, b)| rank(&r) > rank(b)) {
            best = Some((path.clone(), r));
        }
    }
    best
}

/// `whole` with the deltas of its chain among `deltas` applied in order,
/// up to the first missing, invalid or unfitting one (each one passed over
/// is named with its reason; the state stays that of the delta before).
fn patch_chain(
    whole: Restored,
    deltas: &[DeltaFile],
    (shard, tables): (&Shard, &[TableSpec]),
    identity: &str,
    task: usize,
) -> Restored {
    let Some(chain) = whole.chain else {
        return whole;
    };
    let mut r = whole;
    for (_, seq, path) in deltas.iter().filter(|d| d.0 == chain) {
        if *seq <= r.seq {
            continue;
        }
        if *seq != r.seq + 1 {
            warn!(ps = task, delta = %path.display(), after = r.seq, "Snapshot delta ignored, with those after it: the one before it is missing.");
            break;
        }
        let patched = load(path, shard, identity, tables)
            .map_err(|e| e.to_string())
            .and_then(|d| {
                r.patch(d)
                    .map_err(|e| format!("snapshot {}: {e}", path.display()))
            });
        if let Err(e) = patched {
            warn!(ps = task, error = %e, step = r.step, "Snapshot delta ignored, with those after it: the shard is restored as the one before left it.");
            break;
        }
    }
    r
}

/// Deletes the deltas of `chain` past `seq`, where its restore stopped
/// (one unreadable at this start): the shard goes on from `seq` on a
/// timeline of its own, and those deltas, were they readable at a later
/// start, would carry the abandoned one past it.
pub(super) fn forget_past(dir: &std::path::Path, chain: u64, seq: u32, task: usize) {
    for (_, _, path) in list_deltas(dir)
        .into_iter()
        .filter(|d| d.0 == chain && d.1 > seq)
    {
        match fs::remove_file(&path) {
            Ok(()) => {
                warn!(ps = task, delta = %path.display(), "Snapshot delta past the restored state deleted: the shard goes on from the delta before it.")
            }
            Err(e) => {
                warn!(ps = task, delta = %path.display(), error = %e, "Cannot delete a snapshot delta past the restored state.")
            }
        }
    }
}

/// At start (and again when the ring neighbour's copy has been fetched
/// beside the ps's own): reads the shard's newest valid snapshot — by the
/// step it holds ([`choose`]) — when it is newer than this shard's count in
/// the newest checkpoint, and holds it aside for the chief
/// ([`Snapshotting::pending`]), which decides the step it resumes at (in a
/// sync run of several ps tasks, that of the shards that kept running).
/// Every snapshot passed over is named with its reason.
pub(in crate::ps) fn restore(service: &PsService, config: &Config) -> Restore {
    let task = service.inner.task;
    let snap = &service.inner.snapshots;
    let Some(dir) = snap.dir.as_deref() else {
        return Restore::Passed;
    };
    if config.ps.snapshot_secs == 0 {
        return Restore::Passed;
    }
    remove_temps(dir);
    // Files of another identity (after a re-shard, every one) are passed
    // over on their headers, before the newest checkpoint is read — a
    // whole read of it, tables and all, to compare steps.
    let files: Vec<(u64, PathBuf)> = list(dir)
        .into_iter()
        .filter(|(_, path)| match of_this_shard(path, &snap.identity) {
            Ok(()) => true,
            Err(e) => {
                warn!(ps = task, error = %e, "Snapshot ignored.");
                false
            }
        })
        .collect();
    if files.is_empty() {
        return Restore::Nothing;
    }
    let newest = newest_checkpoint(config, task);
    let prefer = newest.flatten().map(|c| c.run).filter(|&run| run != 0);
    let tables = service.table_specs();
    let restored = {
        let shard = service.lock();
        let deltas = list_deltas(dir);
        choose(
            (&files, &deltas),
            (&shard, &tables),
            &snap.identity,
            prefer,
            task,
        )
    };
    let Some((path, r)) = restored else {
        return Restore::Nothing;
    };
    match newest {
        Some(Some(ckpt)) if ckpt.shard >= r.step => {
            info!(
                ps = task,
                snapshot_step = r.step,
                checkpoint_shard_step = ckpt.shard,
                checkpoint_step = ckpt.global,
                "Snapshot not restored: the newest checkpoint holds this shard as new; waiting for the chief to seed the shard."
            );
            return Restore::Passed;
        }
        Some(None) => {
            warn!(ps = task, snapshot = %path.display(), checkpoint_dir = %config.checkpoint.dir.display(), "Snapshot not restored: checkpoint.dir holds no checkpoint, so this is a new run; waiting for the chief.");
            return Restore::Passed;
        }
        _ => {}
    }
    let age = fs::metadata(&path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok());
    if let Some(chain) = r.chain {
        forget_past(dir, chain, r.seq, task);
    }
    let (step, run, chain, deltas) = (r.step, r.run, r.chain, r.seq);
    *snap.pending() = Some(r);
    let mut stats = snap.stats();
    stats.restored = Some(step);
    stats.restored_deltas = deltas;
    stats.written_chain = chain;
    let at = Instant::now().checked_sub(age.unwrap_or_default());
    stats.last = Some((step, at.unwrap_or_else(Instant::now)));
    stats.written = Some(path.clone());
    info!(ps = task, step, run, snapshot = %path.display(), deltas, age_secs = age.map_or(0.0, |a| a.as_secs_f64()), "Shard restored from its snapshot. It is held until the chief adopts it (the same run) or seeds the shard (another run).");
    Restore::Held
}

/// What [`restore`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::ps) enum Restore {
    /// A snapshot, held aside for the chief.
    Held,
    /// A valid snapshot passed over (the checkpoint is as new, a new run),
    /// or snapshots off.
    Passed,
    /// No valid snapshot of its own: a new or emptied disk.
    Nothing,
}
