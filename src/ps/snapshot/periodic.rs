//! The snapshot loop: a copy of the shard under its lock every
//! `ps.snapshot_secs`, encoded and written off it, paced so that large
//! tables never make snapshots cost the ps more than a set share.

use super::super::PsService;
use super::{Chain, FINAL_WRITE, Image, SnapshotError, write, write_delta};
use crate::model::VarSpec;
use crate::optimizer::SlotSpec;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

/// The snapshot loop of a ps: every `ps.snapshot_secs` a copy under the
/// lock, written off it; a last one when `stop` is cancelled (a graceful
/// stop then loses nothing), but for a re-shard's. A write that fails is counted, and logged at
/// ERROR once until one succeeds again; training goes on.
pub(in crate::ps) async fn run(service: PsService, every: Duration, stop: CancellationToken) {
    let mut image = Image::default();
    let layout = {
        let shard = service.lock();
        let specs = shard.specs().to_vec();
        let slots = shard.optimizer().slot_specs(&specs);
        std::sync::Arc::new((specs, slots, service.table_specs()))
    };
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = ticks.tick() => false,
            _ = stop.cancelled() => true,
        };
        // A re-shard's stop takes no last snapshot: the chief's re-shard
        // checkpoint holds this very state (pushes were refused since), and
        // the shard starts again under another placement, where it would
        // not be taken — it would only lengthen the pause (10 s for a
        // shard of 10 million rows, docs/benchmarks.md).
        let checkpointed = &service.inner.reshard.checkpointed;
        if last && checkpointed.load(std::sync::atomic::Ordering::Acquire) {
            info!(
                ps = service.inner.task,
                "No last snapshot: the chief's re-shard checkpoint holds this shard's state."
            );
            return;
        }
        let once = take(&service, &mut image, &layout);
        if last {
            let _ = tokio::time::timeout(FINAL_WRITE, once).await;
            return;
        }
        let started = tokio::time::Instant::now();
        let rest = match once.await {
            // A whole snapshot's cost is spread over its chain's deltas.
            Some(share) => pause(started.elapsed() / share.max(1), every, true),
            None => Duration::ZERO,
        };
        if !rest.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(rest) => {}
                _ = stop.cancelled() => {}
            }
        }
    }
}

/// Whether the next snapshot of chain `c` is whole: while the whole one
/// is under `min_bytes` (cheap, and the ring keeps every one), one in
/// `full_every`, or sooner when its deltas add up to more than the whole
/// snapshot (a restore would then read more than a whole one costs).
fn whole_due(c: Chain, full_every: u32, min_bytes: u64) -> bool {
    c.whole_bytes < min_bytes || c.seq + 1 >= full_every || c.delta_bytes > c.whole_bytes
}

/// A snapshot may take at most 1/this of the time from one to the next.
const SNAPSHOT_PACE: u32 = 20;

/// How long to wait, beyond the next tick, after a snapshot that `took`
/// this long, taken every `every`, of a shard holding table rows (`rows`).
///
/// Large tables make a snapshot long (every row copied a page at a time,
/// sorted, written): the next waits until this one took at most
/// 1/[`SNAPSHOT_PACE`] of the time between them, so that snapshots never
/// cost the ps more than that share — 5 million rows took seconds each,
/// and back to back they stalled training. A shard without table rows is
/// not paced: its snapshot is a memcpy and a write, and on a loaded machine
/// pacing it by its fsync stretched the time between snapshots past what a
/// ps kill may lose (`ps.snapshot_secs` + 1 s; the chaos harness's
/// step-monotonic check caught it).
fn pause(took: Duration, every: Duration, rows: bool) -> Duration {
    if rows {
        took.saturating_mul(SNAPSHOT_PACE).saturating_sub(every)
    } else {
        Duration::ZERO
    }
}

/// What [`take`] writes: the shard's variables, their slots, and the
/// tables (their slots' names).
type Layout = (Vec<VarSpec>, Vec<SlotSpec>, Vec<crate::model::TableSpec>);

/// One snapshot: the copy (timed: what pushes waited), then the write on a
/// blocking thread. Nothing is written while neither the shard nor its
/// tables have moved since the last one. Returns, for a snapshot that held
/// table rows, over how many snapshots its cost is spread (a whole one
/// that deltas follow over `ps.snapshot_full_every`, any other over
/// itself): the pace of the next ([`pause`]).
async fn take(
    service: &PsService,
    image: &mut Image,
    layout: &std::sync::Arc<Layout>,
) -> Option<u32> {
    let snap = &service.inner.snapshots;
    let dir = snap.dir.clone()?;
    let copied = {
        let shard = service.lock();
        let started = Instant::now();
        // Rows move without the step (async pushes of rows alone).
        let tables = service.tables_version();
        let unchanged = {
            let stats = snap.stats();
            stats.last.is_some_and(|(s, _)| s == shard.step()) && stats.tables_version == tables
        };
        if unchanged {
            // Nothing new: the snapshot on disk is current.
            let mut stats = snap.stats();
            if let Some(last) = &mut stats.last {
                last.1 = Instant::now();
            }
            return None;
        }
        let copied = image.copy_from(&shard);
        (copied, started.elapsed(), tables)
    };
    let (true, copy_took, tables_version) = copied else {
        return None;
    };
    // The rows, each table under its own lock, after the shard's: dense
    // pushes do not wait for them (docs/design.md, "Sparse variables").
    // Only those changed since the last snapshot, unless this one is whole.
    let (chain, keep, keep_chain) = {
        let stats = snap.stats();
        (stats.chain, stats.written.clone(), stats.written_chain)
    };
    let whole = chain.is_none_or(|c| whole_due(c, snap.full_every, snap.delta_min_bytes));
    let cut_started = Instant::now();
    let (tables, removed) = service.table_cut(whole);
    let rows_took = cut_started.elapsed();
    image.tables = tables;
    (image.chain, image.seq, image.removed) = match (removed, chain) {
        (Some(removed), Some(c)) => (c.id, c.seq + 1, removed),
        _ => (rand::random(), 0, Vec::new()),
    };
    let at = Instant::now() - copy_took;
    let (layout, identity) = (layout.clone(), snap.identity.clone());
    let img = std::mem::take(image);
    let started = Instant::now();
    let (step, id, seq) = (img.step, img.chain, img.seq);
    let held: usize = img.tables.iter().map(|t| t.rows.len()).sum();
    let rows = held > 0;
    // A new whole snapshot keeps the one before and its deltas.
    let keep_chains = [Some(id), keep_chain];
    let (img, result) = tokio::task::spawn_blocking(move || {
        let mut img = img;
        let keep_chains: Vec<u64> = keep_chains.into_iter().flatten().collect();
        let result = img
            .encode(&layout.0, &layout.1, &layout.2, &identity)
            .map_err(|why| SnapshotError::invalid(&dir, why))
            .and_then(|bytes| {
                let path = match seq {
                    0 => write(&dir, step, &bytes, keep.as_deref(), &keep_chains),
                    _ => write_delta(&dir, id, seq, &bytes),
                };
                path.map(|p| (p, bytes))
            });
        // The dense arrays are kept for the next copy; the rows' copy is
        // not: a table may be most of the ps's memory, and holding a second
        // copy of it between snapshots would double that.
        img.tables = Vec::new();
        img.removed = Vec::new();
        (img, result)
    })
    .await
    .unwrap_or_else(|e| {
        let e = SnapshotError::invalid(Path::new(""), format!("the writing task failed: {e}"));
        (Image::default(), Err(e))
    });
    *image = img;
    let took = started.elapsed();
    let mut stats = snap.stats();
    stats.copy_secs = copy_took.as_secs_f64();
    match result {
        Ok((path, bytes)) => {
            let len = bytes.len();
            if seq == 0 {
                // Its ring neighbour keeps a copy of each whole snapshot (the
                // ring: `ps/replica.rs`).
                service.inner.ring.offer(step, bytes);
                stats.written = Some(path.clone());
                stats.written_chain = Some(id);
                stats.chain = Some(Chain {
                    id,
                    seq: 0,
                    whole_bytes: len as u64,
                    delta_bytes: 0,
                });
            } else if let Some(c) = &mut stats.chain {
                c.seq = seq;
                c.delta_bytes += len as u64;
            }
            if stats.failing {
                info!(ps = service.inner.task, step, path = %path.display(), "Snapshots written again.");
            }
            debug!(ps = service.inner.task, step, path = %path.display(), bytes = len, rows = held, delta = seq, rows_copy_millis = rows_took.as_millis() as u64, millis = took.as_millis() as u64, "Snapshot written.");
            stats.failing = false;
            stats.last = Some((step, at));
            stats.tables_version = tables_version;
            stats.bytes = len as u64;
            stats.write_secs = took.as_secs_f64();
        }
        Err(e) => {
            // The rows this one held are no longer marked changed: only a
            // whole snapshot holds them now.
            stats.chain = None;
            stats.failures += 1;
            if !stats.failing {
                error!(ps = service.inner.task, step, error = %e, "Snapshot not written; training goes on, and a crash of this ps would go back further (the previous snapshot, or the newest checkpoint).");
            }
            stats.failing = true;
        }
    }
    // A whole snapshot that deltas will follow is paced as its share of
    // the chain; one that none will (under `snapshot_delta_min_bytes`, or
    // not written) as itself, as before deltas.
    let chained = seq == 0
        && stats
            .chain
            .is_some_and(|c| c.whole_bytes >= snap.delta_min_bytes);
    rows.then_some(if chained { snap.full_every } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_snapshot_is_due_when_small_every_nth_time_or_outweighed() {
        let c = |seq, whole_bytes, delta_bytes| Chain {
            id: 1,
            seq,
            whole_bytes,
            delta_bytes,
        };
        assert!(!whole_due(c(0, 100, 0), 20, 100));
        assert!(whole_due(c(0, 99, 0), 20, 100));
        assert!(!whole_due(c(18, 100, 100), 20, 0));
        assert!(whole_due(c(19, 100, 0), 20, 0));
        assert!(whole_due(c(3, 100, 101), 20, 0));
        assert!(whole_due(c(0, 100, 0), 1, 0));
    }

    #[test]
    fn only_a_shard_with_table_rows_is_paced() {
        let (ms, every) = (Duration::from_millis, Duration::from_secs(1));
        // A dense shard whose write took long (a loaded disk): the next
        // snapshot comes at the next tick, whatever the write took.
        assert_eq!(pause(ms(300), every, false), Duration::ZERO);
        assert_eq!(pause(Duration::MAX, every, false), Duration::ZERO);
        // Tables: at most 1/20 of the time between two snapshots.
        assert_eq!(pause(ms(30), every, true), Duration::ZERO);
        assert_eq!(pause(ms(300), every, true), ms(5000));
        assert_eq!(pause(Duration::MAX, every, true), Duration::MAX - every);
    }
}
