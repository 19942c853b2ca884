//! Categorical features ([`Categorical`], ids in CSR layout), the batch a
//! model consumes ([`Batch`]: dense x, labels and the batch's ids), and the
//! seeded train/test split of data sets that ship one file ([`split_rows`]).

use super::Dataset;
use ndarray::Array2;

/// Categorical features of a set of examples, as ids (CSR layout).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Categorical {
    /// Field names, in column order (e.g. ["user_id", "item_id", "gender", "genre"]).
    pub fields: Vec<String>,
    /// Example e, field f: ids[offsets[e * F + f] .. offsets[e * F + f + 1]] (F = fields.len()).
    /// A `token` field has exactly one id; a `token_seq` field 0..n (its embeddings are averaged).
    pub offsets: Vec<u32>,
    /// Every id of every example's every field, in that order; see `data::id`.
    pub ids: Vec<u64>,
}

impl Categorical {
    /// No examples yet, of these fields.
    pub fn new(fields: Vec<String>) -> Self {
        Categorical {
            fields,
            offsets: vec![0],
            ids: Vec::new(),
        }
    }

    /// The number of fields, F.
    pub fn width(&self) -> usize {
        self.fields.len()
    }

    /// The number of examples.
    pub fn len(&self) -> usize {
        match self.fields.len() {
            0 => 0,
            f => self.offsets.len().saturating_sub(1) / f,
        }
    }

    /// True when there are no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids of example `e`'s field `f`.
    ///
    /// # Panics
    ///
    /// When `e >= len()` or `f >= width()`.
    pub fn get(&self, e: usize, f: usize) -> &[u64] {
        let cell = e * self.fields.len() + f;
        &self.ids[self.offsets[cell] as usize..self.offsets[cell + 1] as usize]
    }

    /// Adds one id to the cell being filled (the next example's next field).
    pub fn push_id(&mut self, id: u64) {
        self.ids.push(id);
    }

    /// Closes the cell being filled: the ids pushed since the last close are
    /// its ids (none for an empty `token_seq`).
    ///
    /// Errors: a sentence when the data holds 2³² ids or more (offsets are
    /// u32, half the memory of u64, and no in-memory data set of this
    /// machine's comes near).
    pub fn end_cell(&mut self) -> Result<(), String> {
        let end = u32::try_from(self.ids.len()).map_err(|_| {
            format!(
                "holds more than {} categorical ids: more than one data set in memory can index",
                u32::MAX
            )
        })?;
        self.offsets.push(end);
        Ok(())
    }

    /// Removes the cells after the first `examples` examples (a row whose
    /// later cell failed to parse).
    pub fn truncate(&mut self, examples: usize) {
        let cells = examples * self.fields.len();
        self.offsets.truncate(cells + 1);
        self.ids.truncate(self.offsets[cells] as usize);
    }

    /// Empties it, keeping the fields and the buffers' capacity.
    pub fn clear(&mut self) {
        self.offsets.clear();
        self.offsets.push(0);
        self.ids.clear();
    }

    /// Fills `out` with the examples `indices`, in that order, reusing its
    /// buffers (no allocation once they have grown to a batch's size).
    ///
    /// # Panics
    ///
    /// When an index is `>= len()`.
    pub fn select_into(&self, indices: &[usize], out: &mut Categorical) {
        if out.fields != self.fields {
            out.fields.clone_from(&self.fields);
        }
        out.clear();
        let f = self.fields.len();
        for &e in indices {
            let cells = &self.offsets[e * f..=(e + 1) * f];
            let (start, end) = (cells[0] as usize, cells[f] as usize);
            let base = out.ids.len() as u32;
            out.ids.extend_from_slice(&self.ids[start..end]);
            out.offsets
                .extend(cells[1..].iter().map(|&o| base + (o - cells[0])));
        }
    }

    /// The examples `indices` as a new set (a split of the data set).
    pub fn select(&self, indices: &[usize]) -> Categorical {
        let mut out = Categorical::new(self.fields.clone());
        self.select_into(indices, &mut out);
        out
    }
}

/// One mini-batch, as the model consumes it: caller-owned and refilled in
/// place each step by [`Dataset::fill_batch`].
#[derive(Debug, Clone)]
pub struct Batch {
    /// Dense features, batch × features, preprocessed (standardized).
    /// Zero columns wide when the data has only categorical features.
    pub x: Array2<f32>,
    /// One label per example: a class index, 0/1 for binary data.
    pub y: Vec<u8>,
    /// The batch's categorical ids; no fields when the data has none.
    pub categorical: Categorical,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            x: Array2::zeros((0, 0)),
            y: Vec::new(),
            categorical: Categorical::default(),
        }
    }
}

impl Dataset {
    /// Fills `batch` with the examples `indices`: dense x (preprocessed),
    /// labels and the categorical ids. Its buffers are reused: after the
    /// first steps, a step allocates nothing.
    ///
    /// # Panics
    ///
    /// When an index is `>= len()` (indices come from `Batches`).
    pub fn fill_batch(&self, indices: &[usize], batch: &mut Batch) {
        self.batch(indices, &mut batch.x, &mut batch.y);
        match self.categorical() {
            Some(c) => c.select_into(indices, &mut batch.categorical),
            None => {
                batch.categorical.fields.clear();
                batch.categorical.clear();
            }
        }
    }
}

/// The seed of [`split_rows`]. Fixed, not `train.seed`: every task of a run,
/// the evaluator and a later `dtf eval` must cut the same test split, whatever
/// seed a run trains with.
pub const SPLIT_SEED: u64 = 0x6474_662d_7370_6c74; // "dtf-splt"

/// The rows of a `rows`-row file that form the test split when the data set
/// ships no test file: `round(rows · fraction)` rows (at least 1 and at most
/// rows − 1 when rows ≥ 2), the rows whose `xxh3_64(row index, SPLIT_SEED)`
/// are smallest — a uniformly random subset, the same on every machine and
/// in every version (xxh3 is pinned by `data::id`'s tests, unlike `StdRng`,
/// whose algorithm rand may change). Returns (train rows, test rows), each
/// in file order.
pub fn split_rows(rows: usize, fraction: f64) -> (Vec<usize>, Vec<usize>) {
    let mut want = (rows as f64 * fraction).round() as usize;
    if rows >= 2 {
        want = want.clamp(1, rows - 1);
    }
    let mut keyed: Vec<(u64, usize)> = (0..rows)
        .map(|i| {
            let key = xxhash_rust::xxh3::xxh3_64_with_seed(&(i as u64).to_le_bytes(), SPLIT_SEED);
            (key, i)
        })
        .collect();
    keyed.sort_unstable();
    let mut test: Vec<usize> = keyed[..want.min(rows)].iter().map(|&(_, i)| i).collect();
    test.sort_unstable();
    let mut is_test = vec![false; rows];
    test.iter().for_each(|&i| is_test[i] = true);
    let train = (0..rows).filter(|&i| !is_test[i]).collect();
    (train, test)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Categorical {
        // 3 examples × 2 fields; field 1 is a sequence (0..3 ids).
        let mut c = Categorical::new(vec!["user".into(), "genre".into()]);
        for (u, g) in [(1u64, vec![10u64, 11]), (2, vec![]), (3, vec![12, 13, 14])] {
            c.push_id(u);
            c.end_cell().unwrap();
            g.iter().for_each(|&i| c.push_id(i));
            c.end_cell().unwrap();
        }
        c
    }

    #[test]
    fn csr_cells_hold_their_ids() {
        let c = sample();
        assert_eq!(c.len(), 3);
        assert_eq!(c.width(), 2);
        assert_eq!(c.offsets, [0, 1, 3, 4, 4, 5, 8]);
        assert_eq!(c.get(0, 1), [10, 11]);
        assert_eq!(c.get(1, 1), [] as [u64; 0]);
        assert_eq!(c.get(2, 0), [3]);
        let mut t = c.clone();
        t.truncate(1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.ids, [1, 10, 11]);
    }

    #[test]
    fn select_into_reorders_and_reuses_buffers() {
        let c = sample();
        let mut out = Categorical::default();
        c.select_into(&[2, 0, 2], &mut out);
        assert_eq!(out.fields, c.fields);
        assert_eq!(out.len(), 3);
        assert_eq!(out.offsets, [0, 1, 4, 5, 7, 8, 11]);
        assert_eq!(out.get(0, 1), [12, 13, 14]);
        assert_eq!(out.get(1, 0), [1]);
        assert_eq!(out.get(2, 1), [12, 13, 14]);
        let (ids, offsets) = (out.ids.as_ptr(), out.offsets.as_ptr());
        c.select_into(&[1, 0], &mut out);
        assert_eq!(
            out.ids.as_ptr(),
            ids,
            "a smaller batch reuses the ids buffer"
        );
        assert_eq!(out.offsets.as_ptr(), offsets);
        assert_eq!(out.ids, [2, 1, 10, 11]);
        assert_eq!(out.offsets, [0, 1, 1, 2, 4]);
    }

    #[test]
    fn split_is_deterministic_exact_and_disjoint() {
        let (train, test) = split_rows(1000, 0.2);
        assert_eq!((train.len(), test.len()), (800, 200));
        assert_eq!(split_rows(1000, 0.2), (train.clone(), test.clone()));
        let mut all: Vec<usize> = train.iter().chain(&test).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        // Random, not the file's head or tail.
        assert!(test.iter().any(|&i| i < 500) && test.iter().any(|&i| i >= 500));
        // Pinned: the split of a data set never changes between versions.
        assert_eq!(&split_rows(10, 0.2).1, &PINNED_TEST_ROWS_OF_10);
        // Small files keep a row on each side.
        assert_eq!(split_rows(2, 0.01).1.len(), 1);
        assert_eq!(split_rows(2, 0.99).0.len(), 1);
    }

    // Computed outside dtf: the 2 smallest of Python's
    // `xxhash.xxh3_64_intdigest(struct.pack("<Q", i), seed=SPLIT_SEED)`, i < 10.
    const PINNED_TEST_ROWS_OF_10: [usize; 2] = [7, 9];
}
