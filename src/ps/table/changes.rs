//! Which rows changed since the last snapshot, so that a snapshot of a
//! large table can hold only those (`ps.snapshot_full_every`, docs/design.md
//! "Incremental snapshots"): one bit a row beside `ids`, set by every row
//! creation and update, and the ids of the rows eviction dropped. Kept only
//! when the ps's snapshots are incremental; 1/8 byte a row.

use super::Table;
use crate::model::table::Rows;

/// Dropped ids [`Changes`] always has room for, however few rows remain.
const MIN_REMOVED: usize = 4096;

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
        let c = &self.changes;
        let whole = full || !c.on || c.lost;
        let delta = (!whole).then(|| {
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
            Delta {
                rows: self.gather(&rows),
                removed,
            }
        });
        let c = &mut self.changes;
        c.bits.clear();
        c.count = 0;
        c.removed.clear();
        c.lost = false;
        delta
    }

    /// Rows `rows` (row numbers) with their shadows and slots, in that order.
    fn gather(&self, rows: &[usize]) -> Rows {
        let (dim, n) = (self.spec.dim, rows.len());
        let mut out = Rows {
            ids: Vec::with_capacity(n),
            values: Vec::with_capacity(n * dim),
            shadows: Vec::with_capacity(n * dim),
            slots: vec![Vec::with_capacity(n * dim); self.slots],
        };
        for &r in rows {
            let row = &self.arena[r * self.stride..(r + 1) * self.stride];
            out.ids.push(self.ids[r]);
            out.values.extend_from_slice(&row[..dim]);
            out.shadows.extend_from_slice(&row[dim..2 * dim]);
            for (k, s) in out.slots.iter_mut().enumerate() {
                s.extend_from_slice(&row[(2 + k) * dim..(3 + k) * dim]);
            }
        }
        out
    }

    /// Rows changed since the last cut (0 when changes are not kept).
    pub fn changed(&self) -> usize {
        self.changes.count
    }
}
