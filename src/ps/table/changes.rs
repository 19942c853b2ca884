//! Which rows changed, so that a snapshot or a checkpoint of a large table
//! can hold only those (docs/design.md "Incremental snapshots",
//! "Incremental checkpoints"): one bit a row beside `ids`, set by every row
//! creation and update, and the ids of the rows eviction dropped. Two
//! trackers: the snapshot loop's, reset at every snapshot and kept only
//! when the ps's snapshots are incremental ([`Table::cut`]), and the
//! chief's checkpoints', kept from the first base a chief reads
//! (`checkpoint.full_every`) and reset only at the next base, so each delta
//! holds every change since its base ([`Table::cut_base`],
//! [`Table::cut_delta`]). 1/8 byte a row each.

use super::Table;
use crate::model::table::Rows;

/// Dropped ids [`Changes`] always has room for, however few rows remain.
const MIN_REMOVED: usize = 4096;

/// The most dropped ids a checkpoint's delta of one table holds: they go
/// in the first page's message (`ReadRowsResponse.removed`, up to 10
/// bytes an id), beside a page of rows. Past it the checkpoint is whole.
const MAX_DELTA_REMOVED: usize = crate::transport::PAGE_BYTES / 16;

/// The rows changed since the last cut ([`Table::cut`]).
#[derive(Debug, Default)]
pub(super) struct Changes {
    /// Kept at all (incremental snapshots on).
    on: bool,
    /// Bit `r`: row `r` changed since the last cut.
    bits: Vec<u64>,
    /// Rows whose bit is set.
    count: usize,
    /// Ids of the rows dropped since the last cut.
    removed: Vec<u64>,
    /// The rows were replaced ([`Table::load`]) or nothing was cut yet:
    /// the next cut must be a full copy.
    lost: bool,
}

/// What changed in a table since the last cut: its rows (sorted by id,
/// with shadows and slots) and the ids of the rows dropped, which are
/// absent from `rows` unless created again since.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    pub rows: Rows,
    pub removed: Vec<u64>,
}

/// A table's two trackers of its changed rows.
#[derive(Debug, Default)]
pub(super) struct Tracked {
    /// Since the last snapshot.
    snapshot: Changes,
    /// Since the base of the chief's chain of checkpoints `chain`.
    checkpoint: Changes,
    /// The chain the checkpoint tracker counts for; 0: none yet.
    chain: u64,
}

impl Tracked {
    /// Snapshot changes kept when `snapshots`; checkpoint changes from the
    /// first base a chief reads.
    pub(super) fn new(snapshots: bool) -> Self {
        Self {
            snapshot: Changes::new(snapshots),
            checkpoint: Changes::new(false),
            chain: 0,
        }
    }

    pub(super) fn mark(&mut self, r: usize) {
        self.snapshot.mark(r);
        self.checkpoint.mark(r);
    }

    pub(super) fn compact(&mut self, dead: &[bool], ids: &[u64]) {
        self.snapshot.compact(dead, ids);
        self.checkpoint.compact(dead, ids);
    }

    pub(super) fn lose(&mut self) {
        self.snapshot.lose();
        self.checkpoint.lose();
    }

    pub(super) fn bytes(&self) -> usize {
        self.snapshot.bytes() + self.checkpoint.bytes()
    }
}

impl Changes {
    pub(super) fn new(on: bool) -> Self {
        Self {
            on,
            lost: true,
            ..Self::default()
        }
    }

    /// Row `r` changed.
    pub(super) fn mark(&mut self, r: usize) {
        if !self.on {
            return;
        }
        let (word, bit) = (r / 64, 1u64 << (r % 64));
        if word >= self.bits.len() {
            self.bits.resize(word + 1, 0);
        }
        if self.bits[word] & bit == 0 {
            self.bits[word] |= bit;
            self.count += 1;
        }
    }

    fn is_set(&self, r: usize) -> bool {
        self.bits
            .get(r / 64)
            .is_some_and(|w| w & (1 << (r % 64)) != 0)
    }

    /// The rows were compacted ([`Table`]'s `remove`): row `r` kept moved
    /// to the place given by `dead`'s order, the ids of dead rows noted —
    /// up to as many as the table holds rows (and at least
    /// [`MIN_REMOVED`]): past that, a whole copy is cheaper than the list,
    /// and the next cut is whole ([`Changes::lose`]), so the list never
    /// outgrows the table however long nothing cuts it.
    pub(super) fn compact(&mut self, dead: &[bool], ids: &[u64]) {
        if !self.on {
            return;
        }
        let dropped = dead.iter().filter(|&&d| d).count();
        if self.lost || self.removed.len() + dropped > (dead.len() - dropped).max(MIN_REMOVED) {
            self.lose();
            return;
        }
        let mut bits = vec![0u64; self.bits.len()];
        let (mut w, mut count) = (0, 0);
        for (r, &gone) in dead.iter().enumerate() {
            if gone {
                self.removed.push(ids[r]);
                continue;
            }
            if self.is_set(r) {
                bits[w / 64] |= 1 << (w % 64);
                count += 1;
            }
            w += 1;
        }
        self.bits = bits;
        self.count = count;
    }

    /// The rows were replaced wholesale: only a full copy holds them.
    pub(super) fn lose(&mut self) {
        self.lost = true;
        self.bits.clear();
        self.count = 0;
        self.removed.clear();
    }

    /// Counting starts again from here (a full copy is read now).
    fn restart(&mut self) {
        self.bits.clear();
        self.count = 0;
        self.removed.clear();
        self.lost = false;
    }

    /// Bytes held.
    pub(super) fn bytes(&self) -> usize {
        8 * (self.bits.capacity() + self.removed.capacity())
    }
}

impl Table {
    /// A snapshot's cut: the rows changed and dropped since the last cut,
    /// or `None` when the snapshot must copy the table whole — `full`
    /// asked for, no cut since the rows were loaded, or changes not kept.
    /// Either way the changes start again from here: the caller's full
    /// copy, read after this, holds every row as new as this cut or newer.
    /// (A delta of most rows costs about what a whole copy does; the
    /// snapshot loop makes the next one whole once its deltas outweigh it.)
    pub fn cut(&mut self, full: bool) -> Option<Delta> {
        let c = &self.changes.snapshot;
        let delta = (!full && c.on && !c.lost).then(|| self.gather_changed(c));
        self.changes.snapshot.restart();
        delta
    }

    /// A chief's checkpoint of chain `chain` starts with this table whole:
    /// its changes are counted from here, for that chain alone. The caller
    /// reads every row after this.
    pub fn cut_base(&mut self, chain: u64) {
        let c = &mut self.changes;
        c.checkpoint.on = true;
        c.checkpoint.restart();
        c.chain = chain;
    }

    /// A delta checkpoint of chain `chain`: every row changed and dropped
    /// since [`Table::cut_base`] of that chain (the counting goes on); `None`
    /// when this table cannot tell — another chain's base was read since,
    /// none was, its rows were replaced since (a restore, a seeding), or
    /// more rows were dropped than it keeps ids of or a delta carries
    /// ([`MAX_DELTA_REMOVED`]) — and the checkpoint must be whole; `None`
    /// too when the changed rows outweigh a page and a quarter of the
    /// table: the copy, made at once under the table's lock and held until
    /// read, would cost about what a whole read does, in memory and pushes
    /// held back.
    pub fn cut_delta(&self, chain: u64) -> Option<Delta> {
        let (c, k) = (&self.changes, &self.changes.checkpoint);
        let known = chain != 0 && c.chain == chain && k.on && !k.lost;
        let bound = crate::transport::PAGE_BYTES.max(self.len() * self.row_bytes() / 4);
        let small = k.count * self.row_bytes() <= bound && k.removed.len() <= MAX_DELTA_REMOVED;
        (known && small).then(|| self.gather_changed(k))
    }

    /// The rows `c` says changed (sorted by id) and the ids it says were dropped.
    fn gather_changed(&self, c: &Changes) -> Delta {
        let mut rows = Vec::with_capacity(c.count);
        for (w, &word) in c.bits.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                rows.push(w * 64 + word.trailing_zeros() as usize);
                word &= word - 1;
            }
        }
        rows.sort_unstable_by_key(|&r| self.ids[r]);
        let mut removed = c.removed.clone();
        removed.sort_unstable();
        removed.dedup();
        // An id dropped and created again since is a changed row, not a removal.
        removed.retain(|&id| self.find(id).is_none());
        Delta {
            rows: self.gather(&rows),
            removed,
        }
    }

    /// Rows `rows` (row numbers) with their shadows and slots, in that order.
    fn gather(&self, rows: &[usize]) -> Rows {
        let mut out = self.rows_for(rows.len());
        for &r in rows {
            out.ids.push(self.ids[r]);
            self.copy_row(
                &self.arena[r * self.stride..(r + 1) * self.stride],
                &mut out,
            );
        }
        out
    }

    /// Rows changed since the last snapshot's cut (0 when changes are not kept).
    pub fn changed(&self) -> usize {
        self.changes.snapshot.count
    }
}
