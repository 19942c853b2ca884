//! One embedding table's rows on one ps task: the sparse variable beside the
//! dense shard (docs/design.md, "Sparse variables"). Pure state, no I/O; the
//! service keeps each table behind its own mutex, apart from the shard's,
//! so dense and sparse updates never wait for each other.
//!
//! Rows are stored compactly: an id → row index (`HashTable<u32>`: 4 bytes
//! an entry plus hashbrown's control byte, the id itself read back from
//! `ids`) and one arena of f32 in which row `r` holds its value, its EMA
//! shadow (none under `[model.tables] moving_average = false`) and its
//! optimizer slots back to back (`stride` floats). A row is
//! created on first touch, a pull's or a push's, with the table's
//! initializer ([`TableSpec::init_row`]: the same on every ps and every
//! restart), its shadow equal to it and fresh slots. `update` applies
//! pushes (sparse SGD and Adagrad) and aggregates sync steps; `evict`
//! applies `[model.tables]`: admission (a row only once its id was pushed
//! `min_count` times, counted in `sketch`), eviction (`steps_to_live`,
//! `max_rows`) and the `max_rows` bound at every push. Under admission or
//! `max_rows` only pushes create rows. `changes` keeps which rows changed
//! since the last snapshot (a bit a row), for incremental snapshots.

use crate::model::TableSpec;
pub use crate::model::table::Rows;
use crate::model::table::mix64;
use crate::optimizer::TableOptimizer;
use crate::ps::memory::Room;
use hashbrown::HashTable;
use std::sync::Arc;

mod changes;
mod evict;
mod sketch;
mod update;

pub use changes::Delta;
pub use evict::Policy;
pub use update::Outcome;

/// Why a table refused a call. Nothing changed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TableError {
    #[error("ps:{ps} holds no table {name:?} (it holds {held:?})")]
    UnknownTable {
        ps: usize,
        name: String,
        held: Vec<String>,
    },
    #[error(
        "table {table}: train.optimizer = \"{optimizer}\" cannot update embedding rows; use \"sgd\" or \"adagrad\", or set model.tables.optimizer"
    )]
    Optimizer {
        table: String,
        optimizer: &'static str,
    },
    #[error("table {table}: {ids} ids need {} values ({ids} × dim {dim}), got {values}", ids * dim)]
    Length {
        table: String,
        ids: usize,
        dim: usize,
        values: usize,
    },
    #[error("table {table}: the gradient of row {id} has a non-finite value (NaN or infinity)")]
    NonFinite { table: String, id: u64 },
    #[error("table {table}: {ids} ids in one call, above the {max} a call may carry")]
    TooManyIds {
        table: String,
        ids: usize,
        max: usize,
    },
    #[error("learning rate {0} is not a finite positive number; state unchanged")]
    LearningRate(f32),
    #[error("learning rate {lr:e} × gradient overflows a row of table {table}; state unchanged")]
    Overflow { lr: f32, table: String },
    #[error("worker {worker} is not one of the {total} replicas (train.total_num_replicas)")]
    UnknownWorker { worker: u32, total: usize },
    #[error("table {table}: worker {worker} already pushed rows for step {step}")]
    DuplicatePush {
        table: String,
        worker: u32,
        step: u64,
    },
    #[error(
        "table {table}: row {id} given {got} values in a snapshot or checkpoint, expected {expected}"
    )]
    Corrupt {
        table: String,
        id: u64,
        expected: usize,
        got: usize,
    },
}

impl From<TableError> for tonic::Status {
    fn from(e: TableError) -> Self {
        let code = match e {
            TableError::UnknownTable { .. } => tonic::Code::NotFound,
            TableError::DuplicatePush { .. } => tonic::Code::AlreadyExists,
            _ => tonic::Code::InvalidArgument,
        };
        crate::transport::proto::status(code, e)
    }
}

/// The most ids one pull or push may name per table: 4 Mi rows of 16
/// floats is 256 MiB, far above a batch's and below what a ps can afford
/// to create at once.
pub const MAX_IDS_PER_CALL: usize = 1 << 22;

/// Counters for `State` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableCounters {
    /// Async pushes applied.
    pub pushes_applied: u64,
    /// Sync steps applied.
    pub updates_applied: u64,
    /// Sync pushes dropped as stale (an older step than the table's).
    pub stale: u64,
    /// Rows dropped by eviction (`steps_to_live`, `max_rows`).
    pub evicted: u64,
    /// Gradient rows dropped because their id was not admitted yet
    /// (`min_count`) or there was no room under `max_rows`.
    pub refused: u64,
}

/// One table's rows on this ps.
#[derive(Debug)]
pub struct Table {
    /// Its name, width and initializer.
    spec: TableSpec,
    /// The rows' update rule (`[model.tables]`).
    optimizer: TableOptimizer,
    /// Slots per row (0 to 2).
    slots: usize,
    /// Floats per row in `arena`: value, shadow, slots.
    stride: usize,
    /// Floats of a row's EMA shadow: `dim`, or 0 when the table keeps none
    /// (`[model.tables] moving_average = false`: reads of shadows give the
    /// values, as TensorFlow's EMA model reads a variable it does not average).
    shadow: usize,
    /// Row index by id; the hash of an entry is [`mix64`] of `ids[entry]`.
    index: HashTable<u32>,
    /// The id of each row, in creation order.
    ids: Vec<u64>,
    /// Every row's value, shadow and slots, `stride` floats a row.
    arena: Vec<f32>,
    /// `moving_average_decay` (unused without shadows).
    ema: f32,
    /// Async or sync, and the sync steps in progress (`update`).
    sync: update::Sync,
    /// For `State`.
    counters: TableCounters,
    /// Bumped when [`Table::load`] replaces the rows or eviction drops
    /// some: row `r` of one generation is not row `r` of another
    /// ([`Table::page`]).
    generation: u64,
    /// Admission and eviction (`[model.tables]`).
    policy: Policy,
    /// Admission's counts of the ids without a row (`min_count` > 1 only).
    sketch: Option<sketch::Sketch>,
    /// Each row's last update's step, beside `ids` (`steps_to_live` or
    /// `max_rows` set only; empty otherwise).
    touched: Vec<u32>,
    /// The newest step a push or a restore brought: eviction's now.
    clock: u64,
    /// Whether this ps's memory has room for new rows (`ps::memory`: the
    /// cgroup's limit), shared by its tables.
    room: Arc<Room>,
    /// The rows changed since the last snapshot (incremental snapshots)
    /// and since the base of the chief's chain of checkpoints.
    changes: changes::Tracked,
}

impl Table {
    /// An empty table of `spec`, updated by `optimizer`, its rows' EMA
    /// shadows kept with `moving_average_decay` (`None`: no shadows).
    pub fn new(
        spec: TableSpec,
        optimizer: TableOptimizer,
        rule: crate::ps::shard::Rule,
        moving_average_decay: Option<f32>,
    ) -> Self {
        let slots = optimizer.slot_names().len();
        let shadow = if moving_average_decay.is_some() {
            spec.dim
        } else {
            0
        };
        Self {
            stride: (1 + slots) * spec.dim + shadow,
            shadow,
            spec,
            optimizer,
            slots,
            index: HashTable::new(),
            ids: Vec::new(),
            arena: Vec::new(),
            ema: moving_average_decay.unwrap_or(0.0),
            sync: update::Sync::new(rule),
            counters: TableCounters::default(),
            generation: 0,
            policy: Policy::default(),
            sketch: None,
            touched: Vec::new(),
            clock: 0,
            room: Arc::default(),
            changes: changes::Tracked::new(false),
        }
    }

    /// This table keeping which rows change between snapshots (`on`:
    /// incremental snapshots, [`Table::cut`]).
    pub fn with_changes(mut self, on: bool) -> Self {
        self.changes = changes::Tracked::new(on);
        self
    }

    pub fn spec(&self) -> &TableSpec {
        &self.spec
    }
    pub fn name(&self) -> &str {
        &self.spec.name
    }
    pub fn dim(&self) -> usize {
        self.spec.dim
    }
    /// Rows held.
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    pub fn counters(&self) -> TableCounters {
        self.counters
    }
    /// The optimizer whose slots the rows carry.
    pub fn optimizer(&self) -> TableOptimizer {
        self.optimizer
    }

    /// Where slot `k` starts in a row (after the value and the shadow).
    fn slot_at(&self, k: usize) -> usize {
        (1 + k) * self.spec.dim + self.shadow
    }

    /// Row `row`'s value, shadow and slots as a page carries them (no
    /// shadows when the table keeps none), appended to `out`.
    fn copy_row(&self, row: &[f32], out: &mut Rows) {
        let dim = self.spec.dim;
        out.values.extend_from_slice(&row[..dim]);
        out.shadows.extend_from_slice(&row[dim..dim + self.shadow]);
        for (k, s) in out.slots.iter_mut().enumerate() {
            let at = self.slot_at(k);
            s.extend_from_slice(&row[at..at + dim]);
        }
    }

    /// An empty page for `n` rows.
    fn rows_for(&self, n: usize) -> Rows {
        let dim = self.spec.dim;
        Rows {
            ids: Vec::with_capacity(n),
            values: Vec::with_capacity(n * dim),
            shadows: Vec::with_capacity(n * self.shadow),
            slots: vec![Vec::with_capacity(n * dim); self.slots],
        }
    }

    /// Bytes of memory the table holds for its rows: the arena, the ids and
    /// the index (its buckets and control bytes), by capacity.
    pub fn memory_bytes(&self) -> usize {
        let buckets = match self.index.capacity() {
            0 => 0,
            // hashbrown keeps its tables at most 7/8 full, in powers of two.
            c => (c * 8 / 7).next_power_of_two(),
        };
        4 * self.arena.capacity()
            + 8 * self.ids.capacity()
            + 4 * self.touched.capacity()
            + buckets * (4 + 1)
            + self.sketch_bytes()
            + self.changes.bytes()
    }

    /// The row index of `id`, if it exists.
    fn find(&self, id: u64) -> Option<usize> {
        let ids = &self.ids;
        self.index
            .find(mix64(id), |&r| ids[r as usize] == id)
            .map(|&r| r as usize)
    }

    /// The row index of `id`, created (initialized, shadow = value, fresh
    /// slots) when absent.
    fn row(&mut self, id: u64) -> usize {
        if let Some(r) = self.find(id) {
            return r;
        }
        let r = self.ids.len();
        let ids = &self.ids;
        self.index
            .insert_unique(mix64(id), r as u32, |&r| mix64(ids[r as usize]));
        let (dim, start) = (self.spec.dim, self.arena.len());
        // Grown by an eighth, not doubled: a table is most of a ps's memory,
        // and doubling would leave up to half of it unused (the target is
        // at most 2 × (row + slots) bytes per row, docs/design.md). Large
        // reallocations are mremaps, so the extra growths cost little.
        if self.arena.capacity() - start < self.stride {
            self.arena.reserve_exact((start / 8).max(64 * self.stride));
            self.ids.reserve_exact((self.ids.len() / 8).max(64));
            if self.policy.stamps() {
                self.touched.reserve_exact((self.ids.len() / 8).max(64));
            }
        }
        self.ids.push(id);
        if self.policy.stamps() {
            self.touched.push(self.now());
        }
        self.arena.resize(start + self.stride, 0.0);
        let shadow = self.shadow;
        let row = &mut self.arena[start..start + self.stride];
        for k in 0..self.slots {
            let at = (1 + k) * dim + shadow;
            row[at..at + dim].fill(self.optimizer.slot_init(k));
        }
        self.spec.init_row(id, &mut row[..dim]);
        let (value, rest) = row.split_at_mut(dim);
        rest[..shadow].copy_from_slice(&value[..shadow]);
        self.changes.mark(r);
        r
    }

    /// Checks a call's id count.
    fn check_ids(&self, ids: usize) -> Result<(), TableError> {
        if ids > MAX_IDS_PER_CALL {
            return Err(TableError::TooManyIds {
                table: self.spec.name.clone(),
                ids,
                max: MAX_IDS_PER_CALL,
            });
        }
        Ok(())
    }

    /// The values (or, `shadows`, the EMA shadows) of rows `ids`, in their
    /// order (`ids.len() × dim`), appended to `out`; absent rows are
    /// created, or under admission or `max_rows` ([`Policy::pull_creates`]),
    /// or when memory is short ([`Room`]), read as their initial values,
    /// uncreated.
    ///
    /// Errors: [`TableError::TooManyIds`].
    pub fn pull(
        &mut self,
        ids: &[u64],
        shadows: bool,
        out: &mut Vec<f32>,
    ) -> Result<(), TableError> {
        self.check_ids(ids.len())?;
        let dim = self.spec.dim;
        out.reserve(ids.len() * dim);
        let at = if shadows { self.shadow } else { 0 };
        if !self.policy.pull_creates() || !self.room.has_room() {
            for &id in ids {
                match self.find(id) {
                    Some(r) => {
                        let start = r * self.stride + at;
                        out.extend_from_slice(&self.arena[start..start + dim]);
                    }
                    None => {
                        // A new row's shadow equals its value: one init.
                        let n = out.len();
                        out.resize(n + dim, 0.0);
                        self.spec.init_row(id, &mut out[n..]);
                    }
                }
            }
            return Ok(());
        }
        for &id in ids {
            let r = self.row(id);
            let start = r * self.stride + at;
            out.extend_from_slice(&self.arena[start..start + dim]);
        }
        Ok(())
    }

    /// Every row, sorted by id (a test's view; snapshots and checkpoints
    /// read [`Table::page`]s, which leave the lock between them).
    pub fn rows(&self) -> Rows {
        crate::placement::merge_rows(vec![self.page(0, self.len())])
    }

    /// Which rows [`Table::page`]'s row numbers refer to: it changes when
    /// [`Table::load`] replaces them.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Bytes a row takes in a [`Table::page`]: its id, value, shadow and slots.
    pub fn row_bytes(&self) -> usize {
        8 + 4 * self.stride
    }

    /// Rows `start..start + max_rows` (fewer at the end) with their shadows
    /// and slots, in the order they were created: a reader that goes on
    /// from `start + rows` until it reaches [`Table::len`] has every row,
    /// those created meanwhile included, as long as the
    /// [`Table::generation`] stays the same.
    pub fn page(&self, start: usize, max_rows: usize) -> Rows {
        let end = start.saturating_add(max_rows).min(self.ids.len());
        let start = start.min(end);
        let mut out = self.rows_for(end - start);
        out.ids.extend_from_slice(&self.ids[start..end]);
        for row in self.arena[start * self.stride..end * self.stride].chunks_exact(self.stride) {
            self.copy_row(row, &mut out);
        }
        out
    }

    /// Whether [`Table::load`] would take `rows`.
    ///
    /// Errors: [`TableError::Corrupt`] when an array's length is not
    /// `ids × dim`, [`TableError::NonFinite`] for a NaN or infinity.
    pub fn check(&self, rows: &Rows) -> Result<(), TableError> {
        let (dim, n) = (self.spec.dim, rows.ids.len());
        let corrupt = |got: usize| TableError::Corrupt {
            table: self.spec.name.clone(),
            id: rows.ids.first().copied().unwrap_or(0),
            expected: n * dim,
            got,
        };
        for a in std::iter::once(&rows.values)
            .chain((!rows.shadows.is_empty()).then_some(&rows.shadows))
            .chain(rows.slots.iter().take(self.slots))
        {
            if a.len() != n * dim {
                return Err(corrupt(a.len()));
            }
            if let Some(i) = a.iter().position(|v| !v.is_finite()) {
                return Err(TableError::NonFinite {
                    table: self.spec.name.clone(),
                    id: rows.ids[i / dim.max(1)],
                });
            }
        }
        Ok(())
    }

    /// Replaces every row with `rows` (a restore of step `step`; `shadows`
    /// empty: the values; a slot array missing: fresh slots), and forgets
    /// any sync step in progress. The rows count as updated at `step`
    /// (snapshots and checkpoints keep no stamps); past `max_rows`, the
    /// first ones in id order are dropped (counted as evicted). Evicted ids
    /// are simply absent: they start again from their initial values.
    ///
    /// Errors: those of [`Table::check`]; nothing changed.
    pub fn load(&mut self, rows: &Rows, step: u64) -> Result<(), TableError> {
        self.check(rows)?;
        let dim = self.spec.dim;
        self.index.clear();
        self.ids.clear();
        self.arena.clear();
        self.touched.clear();
        self.sync.clear();
        self.changes.lose();
        self.generation += 1;
        self.clock = step;
        for (i, &id) in rows.ids.iter().enumerate() {
            let r = self.row(id);
            let row = &mut self.arena[r * self.stride..(r + 1) * self.stride];
            let src = i * dim..(i + 1) * dim;
            row[..dim].copy_from_slice(&rows.values[src.clone()]);
            let shadow = if rows.shadows.is_empty() {
                &rows.values
            } else {
                &rows.shadows
            };
            row[dim..dim + self.shadow].copy_from_slice(&shadow[src.clone()][..self.shadow]);
            for k in 0..self.slots {
                let at = (1 + k) * dim + self.shadow;
                let dst = &mut row[at..at + dim];
                match rows.slots.get(k) {
                    Some(s) => dst.copy_from_slice(&s[src.clone()]),
                    None => dst.fill(self.optimizer.slot_init(k)),
                }
            }
        }
        self.evict();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
