//! Embedding tables as every process derives them from the config: a
//! [`TableSpec`] is to a sparse variable what [`super::VarSpec`] is to a
//! dense one. The rows themselves live on the ps (`ps::table`), spread
//! over the ps tasks by `placement::table_owner`; this file says what a
//! table is called, how wide its rows are, and what a new row holds.

use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

/// The wide & deep model's embedding table (`model.embedding_dim` wide).
pub const EMBEDDINGS: &str = "deep/embeddings";
/// The wide & deep model's linear part: one weight per id.
pub const WIDE: &str = "wide/weights";
/// Standard deviation of a new embedding row's truncated normal.
pub const EMBEDDING_STDDEV: f32 = 0.01;

/// A sparse variable: rows of `dim` f32 keyed by a 64-bit id, each created
/// on first touch.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    /// TensorFlow-style name, e.g. `deep/embeddings`; its checkpoint
    /// tensors are `NAME/ids`, `NAME/values` and `NAME/<slot>`.
    pub name: String,
    /// Values per row.
    pub dim: usize,
    /// What a new row holds.
    pub init: TableInit,
    /// The suffixes of its optimizer's slots (`Adagrad`; `Ftrl`, `Ftrl_1`),
    /// in the order a row holds them: what its snapshots and checkpoints
    /// name (`Config::table_optimizer`; none until placement sets them).
    pub slots: &'static [&'static str],
}

/// A table's rows as they are saved and restored (snapshots, checkpoints,
/// the chief's seeding): sorted by id, each array row-major (`ids.len() × dim`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    /// The ids, ascending.
    pub ids: Vec<u64>,
    /// Their values.
    pub values: Vec<f32>,
    /// Their EMA shadows (empty: the values).
    pub shadows: Vec<f32>,
    /// Their optimizer slots, one array per slot name (`Adagrad`); none:
    /// fresh ones.
    pub slots: Vec<Vec<f32>>,
}

impl Rows {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Rows `range` (a page of these rows).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Rows {
        let dim = self.values.len().checked_div(self.ids.len()).unwrap_or(0);
        let floats = |a: &[f32]| match a.is_empty() {
            true => Vec::new(),
            false => a[range.start * dim..range.end * dim].to_vec(),
        };
        Rows {
            ids: self.ids[range.clone()].to_vec(),
            values: floats(&self.values),
            shadows: floats(&self.shadows),
            slots: self.slots.iter().map(|s| floats(s)).collect(),
        }
    }

    /// Bytes a row takes on the wire: its id and every array's floats.
    pub fn row_bytes(&self) -> usize {
        let floats =
            self.values.len() + self.shadows.len() + self.slots.iter().map(Vec::len).sum::<usize>();
        8 + 4 * floats.checked_div(self.ids.len()).unwrap_or(0)
    }

    /// Room for `more` rows like those held (a table read page by page, its
    /// size known from the first: no doubling past it).
    pub fn reserve(&mut self, more: usize) {
        let per_row = |a: &Vec<f32>| a.len().checked_div(self.ids.len()).unwrap_or(0) * more;
        let (values, shadows) = (per_row(&self.values), per_row(&self.shadows));
        let slots: Vec<usize> = self.slots.iter().map(per_row).collect();
        self.ids.reserve_exact(more);
        self.values.reserve_exact(values);
        self.shadows.reserve_exact(shadows);
        for (s, n) in self.slots.iter_mut().zip(slots) {
            s.reserve_exact(n);
        }
    }

    /// Appends `more` (a next page of the same table). Pages must agree on
    /// what they carry: shadows or none, and as many slot arrays.
    ///
    /// Errors: a description of the disagreement; nothing appended.
    pub fn append(&mut self, more: Rows) -> Result<(), String> {
        if self.ids.is_empty() {
            *self = more;
            return Ok(());
        }
        if more.ids.is_empty() {
            return Ok(());
        }
        if self.shadows.is_empty() != more.shadows.is_empty()
            || self.slots.len() != more.slots.len()
        {
            return Err(format!(
                "a page with {} shadows and {} slot arrays follows one with {} and {}",
                more.shadows.len(),
                more.slots.len(),
                self.shadows.len(),
                self.slots.len()
            ));
        }
        self.ids.extend_from_slice(&more.ids);
        self.values.extend_from_slice(&more.values);
        self.shadows.extend_from_slice(&more.shadows);
        for (s, m) in self.slots.iter_mut().zip(more.slots) {
            s.extend_from_slice(&m);
        }
        Ok(())
    }

    /// Whether [`Rows::patched`] takes `changed`: both carry the same
    /// arrays (shadows or none, as many slot arrays), or one is empty.
    ///
    /// Errors: a description of the disagreement.
    pub fn fits(&self, changed: &Rows) -> Result<(), String> {
        let agree = self.ids.is_empty()
            || changed.ids.is_empty()
            || (self.shadows.is_empty() == changed.shadows.is_empty()
                && self.slots.len() == changed.slots.len());
        if agree {
            return Ok(());
        }
        Err(format!(
            "a delta with {} shadows and {} slot arrays on rows with {} and {}",
            changed.shadows.len(),
            changed.slots.len(),
            self.shadows.len(),
            self.slots.len()
        ))
    }

    /// These rows with a delta applied (an incremental snapshot's, on its
    /// base): the ids in `removed` dropped, then every row of `changed`
    /// put in, replacing the row of its id; still sorted by id. Both must
    /// be sorted, and `changed` must [fit](Rows::fits): where it does not,
    /// its arrays are taken as these rows' (missing ones read as zeros).
    pub fn patched(self, removed: &[u64], changed: Rows) -> Rows {
        if changed.ids.is_empty() && removed.is_empty() {
            return self;
        }
        let dim = [&self, &changed]
            .iter()
            .find(|r| !r.ids.is_empty())
            .map_or(0, |r| r.values.len() / r.ids.len());
        let template = if self.ids.is_empty() { &changed } else { &self };
        let mut out = Rows {
            ids: Vec::with_capacity(self.ids.len() + changed.ids.len()),
            values: Vec::new(),
            shadows: Vec::new(),
            slots: vec![Vec::new(); template.slots.len()],
        };
        let with_shadows = !template.shadows.is_empty();
        let put = |out: &mut Rows, from: &Rows, i: usize| {
            let span = i * dim..(i + 1) * dim;
            out.ids.push(from.ids[i]);
            out.values.extend_from_slice(&from.values[span.clone()]);
            let part = |a: &[f32]| a.get(span.clone()).map_or(vec![0.0; dim], <[f32]>::to_vec);
            if with_shadows {
                out.shadows.extend(part(&from.shadows));
            }
            for (k, o) in out.slots.iter_mut().enumerate() {
                o.extend(part(from.slots.get(k).map_or(&[][..], Vec::as_slice)));
            }
        };
        let (mut i, mut j, mut gone) = (0, 0, removed.iter().peekable());
        while i < self.ids.len() || j < changed.ids.len() {
            let old = self.ids.get(i).copied().unwrap_or(u64::MAX);
            let new = changed.ids.get(j).copied().unwrap_or(u64::MAX);
            if j < changed.ids.len() && (i == self.ids.len() || new <= old) {
                put(&mut out, &changed, j);
                j += 1;
                if new == old {
                    i += 1;
                }
                continue;
            }
            while gone.next_if(|&&g| g < old).is_some() {}
            if gone.next_if(|&&g| g == old).is_none() {
                put(&mut out, &self, i);
            }
            i += 1;
        }
        out
    }
}

/// What a row holds when it is created.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TableInit {
    /// Zeros (the wide part's weights, as TensorFlow's linear model starts).
    Zeros,
    /// A truncated normal (redrawn beyond 2σ) of this standard deviation.
    TruncatedNormal {
        /// σ.
        stddev: f32,
    },
}

impl TableSpec {
    /// Writes the initial value of row `id` into `out` (`dim` values).
    ///
    /// Deterministic in (table name, id) alone: every ps, every restart and
    /// every ps count creates the same row, so where a row lives (and
    /// whether it was created before a crash) never changes its start.
    ///
    /// A generator per row: xoshiro256++, seeded through splitmix64 — named
    /// and pinned, unlike rand's `StdRng` (ChaCha12, whose key setup and
    /// first block made a 16-wide row cost 260–275 ns against 145–160,
    /// measured) or `SmallRng` (another algorithm on 32-bit hosts): a
    /// table of 10⁷ ids creates a row for nearly every id a batch holds.
    pub fn init_row(&self, id: u64, out: &mut [f32]) {
        match self.init {
            TableInit::Zeros => out.fill(0.0),
            TableInit::TruncatedNormal { stddev } => {
                let mut rng = Xoshiro256PlusPlus::seed_from_u64(row_seed(&self.name, id));
                for v in out.iter_mut() {
                    *v = super::truncated_normal(&mut rng) * stddev;
                }
            }
        }
    }
}

/// The seed of row `id` of table `name`: the name's FNV-1a hash mixed with
/// the id by splitmix64's finalizer (so neighbouring ids get unrelated seeds).
fn row_seed(name: &str, id: u64) -> u64 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    mix64(h ^ mix64(id))
}

/// Wide & deep's two tables, `dim` wide embeddings.
pub fn wide_deep(dim: usize) -> Vec<TableSpec> {
    vec![
        TableSpec {
            name: EMBEDDINGS.to_owned(),
            dim,
            init: TableInit::TruncatedNormal {
                stddev: EMBEDDING_STDDEV,
            },
            slots: &[],
        },
        TableSpec {
            name: WIDE.to_owned(),
            dim: 1,
            init: TableInit::Zeros,
            slots: &[],
        },
    ]
}

/// A `HashMap` keyed by row ids ([`IdHasher`]).
pub type IdMap<V> = std::collections::HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

/// Hashes a row id with [`mix64`], as the ps's row index does: ids are
/// already hashes of (field, value) (`data::id`), so SipHash's cost buys
/// nothing on the step's hot path; the finalizer spreads ids that are not.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys come here (`write_u64`); anything else still hashes.
        for &b in bytes {
            self.0 = mix64(self.0 ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = mix64(id);
    }
}

/// splitmix64's finalizer: every input bit flips each output bit with
/// probability about ½ (Stafford's variant 13, as in `SplittableRandom`).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `deep/embeddings` row 42's first value: a dependency update that
    /// changes how rows start (rand_xoshiro, rand_distr's sampling) is noticed.
    const PINNED_ROW_42: f32 = -0.000_473_091_03;

    #[test]
    fn a_row_starts_the_same_wherever_and_whenever_it_is_created() {
        let t = &wide_deep(16)[0];
        let (mut a, mut b, mut c) = ([0.0; 16], [0.0; 16], [0.0; 16]);
        t.init_row(42, &mut a);
        t.init_row(42, &mut b);
        t.init_row(43, &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|v| v.abs() <= 2.0 * EMBEDDING_STDDEV));
        assert!(a.iter().any(|&v| v != 0.0));
        // Another table's row 42 is another row.
        let other = TableSpec {
            name: "other".into(),
            ..t.clone()
        };
        other.init_row(42, &mut c);
        assert_ne!(a, c);
    }

    #[test]
    fn rows_start_truncated_normal_over_many_ids_and_pinned_per_id() {
        let t = &wide_deep(16)[0];
        let mut row = [0.0f32; 16];
        let (mut n, mut sum, mut squares) = (0.0f64, 0.0f64, 0.0f64);
        for id in 0..20_000u64 {
            t.init_row(id, &mut row);
            for &v in &row {
                let z = f64::from(v / EMBEDDING_STDDEV);
                assert!(z.abs() <= 2.0, "row {id}: {v}");
                (n, sum, squares) = (n + 1.0, sum + z, squares + z * z);
            }
        }
        // A standard normal cut at ±2σ: mean 0, standard deviation 0.8796.
        let mean = sum / n;
        let std = (squares / n - mean * mean).sqrt();
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((std - 0.8796).abs() < 0.01, "std {std}");
        // The generator is pinned (xoshiro256++ seeded by splitmix64): a
        // row starts the same in every version, on every platform.
        t.init_row(42, &mut row);
        assert_eq!(row[0], PINNED_ROW_42, "{row:?}");
    }

    #[test]
    fn pages_sliced_and_appended_give_the_rows_back() {
        let rows = Rows {
            ids: vec![1, 2, 3],
            values: vec![1.0, 1.5, 2.0, 2.5, 3.0, 3.5],
            shadows: vec![],
            slots: vec![vec![0.1; 6]],
        };
        assert_eq!(rows.row_bytes(), 8 + 4 * 4);
        let mut back = Rows::default();
        for r in [0..2, 2..2, 2..3] {
            back.append(rows.slice(r)).unwrap();
        }
        assert_eq!(back, rows);
        // A page that carries shadows cannot follow one that does not.
        let other = Rows {
            shadows: vec![0.0; 2],
            ..rows.slice(0..1)
        };
        assert!(back.append(other).is_err());
        assert_eq!(back, rows, "nothing appended");
    }

    #[test]
    fn wide_weights_start_at_zero() {
        let t = &wide_deep(16)[1];
        let mut w = [1.0];
        t.init_row(7, &mut w);
        assert_eq!((t.dim, w), (1, [0.0]));
    }
}
