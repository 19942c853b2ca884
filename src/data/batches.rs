//! Mini-batches: shuffled indices, a new permutation each epoch.

use rand::SeedableRng;
use rand::seq::SliceRandom;

/// An endless stream of shuffled mini-batch indices: a new permutation each epoch.
///
/// When fewer than `batch_size` indices remain in an epoch they are dropped
/// and a fresh permutation starts, so every batch is full and every index
/// appears at most once per epoch (what `tf.data`'s
/// `shuffle().batch(drop_remainder=True)` does). With 60000 examples and
/// batches of 100 nothing is ever dropped.
#[derive(Debug)]
pub struct Batches {
    /// Current permutation of 0..len.
    order: Vec<usize>,
    /// Next position in `order`.
    pos: usize,
    /// Examples per batch.
    batch_size: usize,
    /// Seeded per worker.
    rng: rand::rngs::StdRng,
}

impl Batches {
    /// Batches of `batch_size` indices into `0..len`, shuffled from `seed`.
    ///
    /// # Panics
    ///
    /// When `batch_size` is 0 or larger than `len` (the config is validated
    /// against the data set before this is built).
    pub fn new(len: usize, batch_size: usize, seed: u64) -> Self {
        assert!(
            batch_size > 0 && batch_size <= len,
            "batch size {batch_size} must be in 1..={len} (the number of examples)"
        );
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..len).collect();
        order.shuffle(&mut rng);
        Batches {
            order,
            pos: 0,
            batch_size,
            rng,
        }
    }

    /// The next `batch_size` indices (wrapping into a fresh permutation).
    pub fn next_indices(&mut self) -> &[usize] {
        if self.pos + self.batch_size > self.order.len() {
            // Shuffling the previous permutation gives a uniform one again.
            self.order.shuffle(&mut self.rng);
            self.pos = 0;
        }
        let start = self.pos;
        self.pos += self.batch_size;
        &self.order[start..self.pos]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn batches_cover_every_index_once_per_epoch() {
        let (len, bs) = (100, 10);
        let mut b = Batches::new(len, bs, 3);
        let mut epochs = Vec::new();
        for _ in 0..3 {
            let mut seen = Vec::new();
            for _ in 0..len / bs {
                let idx = b.next_indices();
                assert_eq!(idx.len(), bs);
                seen.extend_from_slice(idx);
            }
            let set: HashSet<usize> = seen.iter().copied().collect();
            assert_eq!(set.len(), len);
            assert!(set.iter().all(|&i| i < len));
            epochs.push(seen);
        }
        assert_ne!(epochs[0], epochs[1], "each epoch is a new permutation");
        assert_ne!(epochs[0], (0..len).collect::<Vec<_>>(), "shuffled");
    }

    #[test]
    fn batches_drop_the_remainder() {
        // 10 examples, batches of 4: two batches per epoch, 2 indices dropped.
        let mut b = Batches::new(10, 4, 0);
        for _ in 0..5 {
            let mut seen = HashSet::new();
            for _ in 0..2 {
                for &i in b.next_indices() {
                    assert!(seen.insert(i), "index {i} twice in one epoch");
                }
            }
            assert_eq!(seen.len(), 8);
        }
    }

    #[test]
    fn batches_are_deterministic_per_seed() {
        let take = |seed| {
            let mut b = Batches::new(50, 7, seed);
            (0..20)
                .flat_map(|_| b.next_indices().to_vec())
                .collect::<Vec<_>>()
        };
        assert_eq!(take(1), take(1));
        assert_ne!(take(1), take(2));
    }
}
