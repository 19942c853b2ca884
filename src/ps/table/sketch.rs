//! Admission's counter (`model.tables.min_count`): how many times each id
//! not yet in the table has been pushed, in a count-min sketch of fixed
//! size — [`DEPTH`] rows of [`WIDTH`] saturating `u8` counters, 4 MiB per
//! table per ps whatever the ids (docs/design.md, "Admission and
//! eviction"). An exact map of the ids seen would grow with the very ids
//! admission is there to keep out (DeepRec's counting Bloom filter and
//! Monolith's occurrence threshold bound it the same way).
//!
//! A count-min sketch only overestimates (collisions add, never take
//! away): an id may be admitted a little early, never late. Conservative
//! update (only the counters at the minimum go up) keeps the overestimate
//! small: with a million distinct ids seen once each in one table on one
//! ps (as many as the sketch has columns), 3.9 % read as seen twice
//! (`an_id_is_counted_apart_from_a_million_others`); at 10^5 ids the
//! error is negligible. Past that many distinct ids per table per ps, a
//! share of the rare ids is admitted early: admission weakens, the memory
//! stays 4 MiB.

use crate::model::table::mix64;

/// Rows of the sketch: each id has one counter in each; its count is the least.
pub const DEPTH: usize = 4;

/// Counters a row (a power of two): 2^20 × [`DEPTH`] one-byte counters is
/// 4 MiB per table per ps, allocated only when `min_count` > 1.
pub const WIDTH: usize = 1 << 20;

/// Seeds of the rows' hashes (odd, unrelated constants).
const SEEDS: [u64; DEPTH] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0x85eb_ca77_c2b2_ae63,
];

/// A count-min sketch of `u8` counters that saturate at 255
/// (`model.tables.min_count` is at most that).
#[derive(Debug)]
pub struct Sketch {
    /// `DEPTH` rows of `width` counters, row after row.
    counters: Vec<u8>,
    /// `width − 1`: a counter's column is the hash's low bits.
    mask: usize,
}

impl Sketch {
    /// An empty sketch of [`DEPTH`] rows of `width` counters (rounded up to
    /// a power of two, at least 64).
    pub fn new(width: usize) -> Self {
        let width = width.max(64).next_power_of_two();
        Self {
            counters: vec![0; DEPTH * width],
            mask: width - 1,
        }
    }

    /// Bytes the sketch holds: fixed at its creation, whatever it counted.
    pub fn bytes(&self) -> usize {
        self.counters.capacity()
    }

    /// Where `id`'s counter is in each row.
    fn cells(&self, id: u64) -> [usize; DEPTH] {
        let width = self.mask + 1;
        std::array::from_fn(|k| k * width + (mix64(id ^ SEEDS[k]) as usize & self.mask))
    }

    /// How many times `id` was counted, at least (never less than the truth,
    /// up to 255).
    #[cfg(test)]
    pub fn count(&self, id: u64) -> u8 {
        self.cells(id)
            .iter()
            .map(|&c| self.counters[c])
            .min()
            .unwrap_or(0)
    }

    /// Counts one more sighting of `id`; returns its count after.
    pub fn add(&mut self, id: u64) -> u8 {
        let cells = self.cells(id);
        let least = cells.iter().map(|&c| self.counters[c]).min().unwrap_or(0);
        let next = least.saturating_add(1);
        // Conservative update: a counter above the least already counts
        // other ids' sightings; raising it would only add error.
        for c in cells {
            let v = &mut self.counters[c];
            *v = (*v).max(next);
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sketch_is_4_mib_whatever_it_counts() {
        let mut s = Sketch::new(WIDTH);
        assert_eq!(s.bytes(), 4 << 20);
        for id in 0..2_000_000u64 {
            s.add(id.wrapping_mul(0x2545_f491_4f6c_dd1d));
        }
        assert_eq!(s.bytes(), 4 << 20, "no growth with the ids seen");
    }

    #[test]
    fn counts_never_fall_short_and_saturate_at_255() {
        let mut s = Sketch::new(1 << 10);
        for id in 0..5_000u64 {
            for _ in 0..id % 4 {
                s.add(id);
            }
        }
        for id in 0..5_000u64 {
            assert!(u64::from(s.count(id)) >= id % 4, "id {id}");
        }
        for _ in 0..300 {
            s.add(7);
        }
        assert_eq!(s.count(7), 255);
    }

    #[test]
    fn an_id_is_counted_apart_from_a_million_others() {
        // A million ids seen once each: how many look seen twice?
        let mut s = Sketch::new(WIDTH);
        let n = 1_000_000u64;
        for id in 0..n {
            s.add(mix64(id));
        }
        let over = (0..n).filter(|&id| s.count(mix64(id)) > 1).count();
        assert!(
            (over as f64) < 0.05 * n as f64,
            "{over} of {n} ids seen once counted twice or more"
        );
    }
}
