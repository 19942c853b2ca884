//! Admission and eviction (`[model.tables]`, docs/design.md "Admission and
//! eviction"): which pushed ids may create a row (`min_count`, counted in a
//! [`Sketch`]), which rows are dropped when the ps takes its snapshot or
//! the chief reads the table for a checkpoint (`steps_to_live`,
//! `max_rows`), and the bound `max_rows` keeps at every push: a push that
//! would create rows past it first drops the least recently updated rows.
//!
//! Each row's last update is a `u32` step beside its id (4 bytes a row,
//! kept only when `steps_to_live` or `max_rows` is set): the step of the
//! push that last changed it, or for a row created by a pull or a restore,
//! the newest step the table had seen then. Steps past `u32::MAX` read as
//! `u32::MAX` (config validation keeps `steps_to_live` below it).

use super::Table;
use super::sketch::{Sketch, WIDTH};
use crate::model::table::mix64;
use crate::ps::memory::Room;
use std::sync::Arc;

/// `[model.tables]` as one table applies it. The default is no admission
/// and no eviction: today's table, at today's cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Pushes of an id before its row is created and trained (1: the first).
    pub min_count: u32,
    /// Rows not updated for more than this many steps are dropped at a
    /// snapshot or checkpoint (0: never).
    pub steps_to_live: u64,
    /// The most rows this table holds on this ps (0: unbounded).
    pub max_rows: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            min_count: 1,
            steps_to_live: 0,
            max_rows: 0,
        }
    }
}

impl Policy {
    /// Whether rows carry their last update's step.
    pub(super) fn stamps(&self) -> bool {
        self.steps_to_live > 0 || self.max_rows > 0
    }

    /// Whether a pull creates the rows it reads (today's behaviour). Under
    /// admission or a bound only a push does: a pull of an absent row
    /// reads its initial value, so reads never use up admission or room.
    pub(super) fn pull_creates(&self) -> bool {
        self.min_count <= 1 && self.max_rows == 0
    }
}

/// A step as a row's stamp.
fn stamp(step: u64) -> u32 {
    u32::try_from(step).unwrap_or(u32::MAX)
}

impl Table {
    /// This table under `policy`: its sketch allocated when `min_count` > 1
    /// (a table's rows must be empty: a new table).
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.sketch = (policy.min_count > 1).then(|| Sketch::new(WIDTH));
        self.touched = if policy.stamps() {
            vec![stamp(self.clock); self.ids.len()]
        } else {
            Vec::new()
        };
        self.policy = policy;
        self
    }

    /// The policy it applies.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Bytes of the admission sketch (0 without admission).
    pub fn sketch_bytes(&self) -> usize {
        self.sketch.as_ref().map_or(0, Sketch::bytes)
    }

    /// The newest step a push brought.
    pub(super) fn see_step(&mut self, step: u64) {
        self.clock = self.clock.max(step);
    }

    /// The stamp a row created now gets.
    pub(super) fn now(&self) -> u32 {
        stamp(self.clock)
    }

    /// Notes that row `r` was updated at `step` (when rows carry stamps).
    pub(super) fn touch(&mut self, r: usize, step: u64) {
        if let Some(t) = self.touched.get_mut(r) {
            *t = stamp(step);
        }
    }

    /// Admission: of a push's (deduplicated) `ids` and `grads`, those
    /// whose row exists or whose id has now been pushed `min_count` times;
    /// the others are counted and their gradients dropped
    /// ([`super::TableCounters::refused`]). Without admission, everything.
    pub(super) fn admit(&mut self, ids: Vec<u64>, grads: Vec<f32>) -> (Vec<u64>, Vec<f32>) {
        let Some(mut sketch) = self.sketch.take() else {
            return (ids, grads);
        };
        let (dim, min) = (self.spec.dim, self.policy.min_count);
        let mut keep = Vec::with_capacity(ids.len());
        let mut out = Vec::with_capacity(grads.len());
        for (i, &id) in ids.iter().enumerate() {
            if self.find(id).is_some() || u32::from(sketch.add(id)) >= min {
                keep.push(id);
                out.extend_from_slice(&grads[i * dim..(i + 1) * dim]);
            } else {
                self.counters.refused += 1;
            }
        }
        self.sketch = Some(sketch);
        (keep, out)
    }

    /// Under the memory bound (`ps::memory`): the positions in `ids` of
    /// those whose row exists, the others counted as refused and their
    /// gradients dropped; `None` when every one has its row.
    pub(super) fn existing_only(&mut self, ids: &[u64]) -> Option<Vec<usize>> {
        let kept: Vec<usize> = (0..ids.len())
            .filter(|&i| self.find(ids[i]).is_some())
            .collect();
        if kept.len() == ids.len() {
            return None;
        }
        self.counters.refused += (ids.len() - kept.len()) as u64;
        Some(kept)
    }

    /// This table under `room`, the ps's memory bound (`ps::memory`).
    pub fn with_room(mut self, room: Arc<Room>) -> Self {
        self.room = room;
        self
    }

    /// Whether new rows may be made now (the ps's memory bound).
    pub(super) fn has_room(&self) -> bool {
        self.room.has_room()
    }

    /// The bound at a push: room for the absent rows of `ids` (about to be
    /// created), made by dropping the least recently updated rows that the
    /// push does not touch — down to an eighth below `max_rows`, so that
    /// the O(rows) pass runs once per `max_rows / 8` new rows, not once per
    /// row. Returns `None` when every id has its row or room for it;
    /// otherwise (more new ids in one push than room could be made for)
    /// the positions in `ids` of those kept — rows that exist, and the new
    /// ones there is room for —, the others counted as refused and their
    /// gradients dropped.
    pub(super) fn make_room(&mut self, ids: &[u64]) -> Option<Vec<usize>> {
        let max = self.policy.max_rows;
        // Far from the bound (or none): no lookups.
        if max == 0 || self.len() + ids.len() <= max {
            return None;
        }
        let present: Vec<Option<usize>> = ids.iter().map(|&id| self.find(id)).collect();
        let absent = present.iter().filter(|p| p.is_none()).count();
        if self.len() + absent <= max {
            return None;
        }
        let mut keep = vec![false; self.len()];
        for r in present.iter().flatten() {
            keep[*r] = true;
        }
        let target = max.saturating_sub(absent).saturating_sub(max / 8);
        self.drop_oldest(target, &keep);
        let mut room = max.saturating_sub(self.len());
        let mut kept = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            if self.find(id).is_some() {
                kept.push(i);
            } else if room > 0 {
                room -= 1;
                kept.push(i);
            } else {
                self.counters.refused += 1;
            }
        }
        (kept.len() < ids.len()).then_some(kept)
    }

    /// Eviction at a snapshot or checkpoint: drops the rows not updated
    /// for more than `steps_to_live` steps (the table's newest step the
    /// reference), then the least recently updated past `max_rows`.
    /// Returns the rows dropped.
    pub fn evict(&mut self) -> usize {
        if !self.policy.stamps() || self.is_empty() {
            return 0;
        }
        let before = self.len();
        let ttl = self.policy.steps_to_live;
        if ttl > 0 {
            let now = self.clock;
            let dead: Vec<bool> = self
                .touched
                .iter()
                .map(|&t| now.saturating_sub(u64::from(t)) > ttl)
                .collect();
            if dead.iter().any(|&d| d) {
                self.remove(&dead);
            }
        }
        if self.policy.max_rows > 0 && self.len() > self.policy.max_rows {
            let keep = vec![false; self.len()];
            self.drop_oldest(self.policy.max_rows, &keep);
        }
        before - self.len()
    }

    /// Drops the least recently updated rows (the oldest created first
    /// among equals) not marked in `keep` until `target` rows are left, or
    /// only marked ones.
    fn drop_oldest(&mut self, target: usize, keep: &[bool]) {
        let n = self.len();
        if n <= target {
            return;
        }
        let mut candidates: Vec<(u32, u32)> = (0..n)
            .filter(|&r| !keep[r])
            .map(|r| (self.touched.get(r).copied().unwrap_or(0), r as u32))
            .collect();
        let k = (n - target).min(candidates.len());
        if k == 0 {
            return;
        }
        if k < candidates.len() {
            candidates.select_nth_unstable(k - 1);
        }
        let mut dead = vec![false; n];
        for &(_, r) in &candidates[..k] {
            dead[r as usize] = true;
        }
        self.remove(&dead);
    }

    /// Removes the rows marked `dead`, the others kept in creation order;
    /// the row numbers change ([`Table::generation`]).
    fn remove(&mut self, dead: &[bool]) {
        self.changes.compact(dead, &self.ids);
        let stride = self.stride;
        let mut w = 0;
        for (r, &gone) in dead.iter().enumerate() {
            if gone {
                continue;
            }
            if w != r {
                self.ids[w] = self.ids[r];
                self.arena
                    .copy_within(r * stride..(r + 1) * stride, w * stride);
                if !self.touched.is_empty() {
                    self.touched[w] = self.touched[r];
                }
            }
            w += 1;
        }
        self.counters.evicted += (self.ids.len() - w) as u64;
        self.ids.truncate(w);
        self.arena.truncate(w * stride);
        self.touched.truncate(w);
        self.index.clear();
        let ids = &self.ids;
        for (r, &id) in ids.iter().enumerate() {
            self.index
                .insert_unique(mix64(id), r as u32, |&r| mix64(ids[r as usize]));
        }
        self.generation += 1;
    }
}

#[cfg(test)]
mod tests;
