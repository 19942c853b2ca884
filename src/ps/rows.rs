//! The ps's embedding tables as a service: each table behind a lock of its
//! own, apart from the dense shard's, so a push of rows and a dense push
//! never wait for each other (docs/design.md, "Sparse variables"). The
//! functions here run on either transport, as `calls.rs`'s do: the
//! adapters turn a request into [`TableRows`] and back.

use super::PsService;
use super::memory::Room;
use super::table::{Outcome, Policy, Table, TableCounters, TableError};
use crate::config::{Config, Mode};
use crate::model::table::Rows;
use crate::transport::PAGE_BYTES;
use crate::transport::call::{Cut, PushRows, RowsPage, RowsPushed, TableRows, TableState};
use std::sync::{Arc, Mutex, MutexGuard};
use tonic::Status;
use tracing::{debug, info, warn};

/// This ps's tables, each behind its own lock, in the model's order.
pub(super) struct Tables {
    /// The tables.
    list: Vec<Mutex<Table>>,
    /// Their names, same order (read without locking).
    names: Vec<String>,
    /// Rows staged for the next `Initialize` ([`PsService::stage_rows`]).
    staged: Mutex<Staged>,
    /// Per table, the delta of the chief's checkpoint being read, with its
    /// chain, from its first page to its last ([`Tables::read_delta`]).
    held: Vec<Mutex<Option<Held>>>,
    /// The cuts made, each held delta's number (its pages' generation).
    cuts: std::sync::atomic::AtomicU64,
    /// Whether memory has room for new rows (`ps::memory`), shared by
    /// every table.
    pub(super) room: Arc<Room>,
}

/// A table's delta cut for a chief's checkpoint, held until its last page
/// is read.
struct Held {
    chain: u64,
    /// Which cut: two cuts' pages are not one delta.
    cut: u64,
    delta: super::table::Delta,
}

/// Rows staged under one token, table by table.
#[derive(Default)]
struct Staged {
    token: u64,
    tables: Vec<TableState>,
}

impl Tables {
    /// The model's tables (`placement::tables`), empty.
    ///
    /// Errors: [`TableError::Optimizer`] when the optimizer has no sparse
    /// rule (config validation refuses it first).
    /// With `snapshots` (the snapshot loop runs) and `ps.snapshot_full_every`
    /// > 1 each table keeps which rows change between snapshots.
    pub(super) fn new(config: &Config, snapshots: bool) -> Result<Self, TableError> {
        let room = Arc::new(Room::default());
        let rule = match config.train.mode {
            Mode::Async => super::shard::Rule::Async,
            Mode::Sync => super::shard::Rule::Sync {
                replicas: config.replicas_to_aggregate(),
                total: config.total_num_replicas(),
            },
        };
        let keys = &config.model.tables;
        let policy = Policy {
            min_count: keys.min_count,
            steps_to_live: keys.steps_to_live,
            max_rows: usize::try_from(keys.max_rows).unwrap_or(usize::MAX),
        };
        let specs = crate::placement::tables(config);
        let names = specs.iter().map(|s| s.name.clone()).collect();
        let specs_len = specs.len();
        // Incremental snapshots: each table keeps which rows change.
        let incremental = snapshots && config.ps.snapshot_full_every > 1;
        let list = specs
            .into_iter()
            .map(|spec| {
                let optimizer =
                    config
                        .table_optimizer(&spec.name)
                        .ok_or_else(|| TableError::Optimizer {
                            table: spec.name.clone(),
                            optimizer: config.train.optimizer().name(),
                        })?;
                let ema = config.model.tables.moving_average;
                let t = Table::new(
                    spec,
                    optimizer,
                    rule,
                    ema.then_some(config.train.moving_average_decay),
                )
                .with_policy(policy)
                .with_room(room.clone())
                .with_changes(incremental);
                if policy != Policy::default() {
                    info!(
                        table = t.name(),
                        min_count = policy.min_count,
                        sketch_bytes = t.sketch_bytes(),
                        steps_to_live = policy.steps_to_live,
                        max_rows = policy.max_rows,
                        "Table rows admitted and evicted (model.tables)."
                    );
                }
                Ok(Mutex::new(t))
            })
            .collect::<Result<_, TableError>>()?;
        Ok(Self {
            held: (0..specs_len).map(|_| Mutex::default()).collect(),
            cuts: std::sync::atomic::AtomicU64::new(0),
            list,
            names,
            staged: Mutex::default(),
            room,
        })
    }

    /// Bytes the tables hold for their rows ([`Table::memory_bytes`]),
    /// and the deltas held for a chief's checkpoint.
    pub(super) fn memory_bytes(&self) -> u64 {
        (0..self.list.len())
            .map(|i| {
                let held = self.held[i].lock().unwrap_or_else(|e| e.into_inner());
                let d = held.as_ref().map_or(0, |h| {
                    let rows = &h.delta.rows;
                    rows.ids.len() * rows.row_bytes() + 8 * h.delta.removed.len()
                });
                drop(held);
                (self.lock(i).memory_bytes() + d) as u64
            })
            .sum()
    }

    /// The tables' names, in order.
    pub(super) fn names(&self) -> &[String] {
        &self.names
    }

    /// Table `i`, locked.
    pub(super) fn lock(&self, i: usize) -> MutexGuard<'_, Table> {
        // A panic under the lock would be a bug in Table; its rows are
        // still the best there are.
        self.list[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Table `i`'s rows, sorted by id, copied a page ([`PAGE_BYTES`]) at a
    /// time: the lock is left between pages, so pushes go on meanwhile and
    /// each row is as new as when its page was copied. A restore between
    /// two pages starts the copy again.
    fn copy(&self, i: usize) -> Rows {
        'again: loop {
            let (mut pages, mut generation) = (Vec::new(), None);
            loop {
                let t = self.lock(i);
                if generation.is_some_and(|g| g != t.generation()) {
                    continue 'again;
                }
                generation = Some(t.generation());
                let start = pages.iter().map(Rows::len).sum();
                let page = t.page(start, (PAGE_BYTES / t.row_bytes()).max(1));
                let done = start + page.len() >= t.len();
                drop(t);
                pages.push(page);
                if done {
                    return crate::placement::merge_rows(pages);
                }
            }
        }
    }

    /// Eviction on table `i` (`steps_to_live`, `max_rows`), before a
    /// snapshot or a checkpoint reads it.
    fn evict(&self, i: usize, ps: usize) {
        let mut t = self.lock(i);
        let evicted = t.evict();
        if evicted > 0 {
            debug!(
                ps,
                table = t.name(),
                evicted,
                rows = t.len(),
                "Table rows evicted."
            );
        }
    }

    /// A page of table `i`'s delta of chain `chain` into `answer`: at row 0
    /// the delta is cut ([`Table::cut_delta`]) and held, later pages come
    /// from what is held, and the last one lets it go. `answer.delta` false
    /// when the table cannot tell what changed since that chain's base, or
    /// holds no delta of it (read already, or another cut since).
    fn read_delta(&self, i: usize, chain: u64, start: usize, rows: usize, answer: &mut RowsPage) {
        let mut held = self.held[i].lock().unwrap_or_else(|e| e.into_inner());
        if start == 0 {
            match self.lock(i).cut_delta(chain) {
                Some(delta) => {
                    let cut = 1 + self.cuts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    *held = Some(Held { chain, cut, delta });
                }
                // Another chain's cut is its reader's: a stale chief's
                // request does not take it away.
                None if held.as_ref().is_some_and(|h| h.chain != chain) => return,
                None => *held = None,
            }
        }
        let Some(h) = held.as_ref().filter(|h| h.chain == chain) else {
            return;
        };
        let delta = &h.delta;
        let end = start.saturating_add(rows).min(delta.rows.len());
        answer.delta = true;
        answer.state.rows = delta.rows.slice(start.min(end)..end);
        answer.total = delta.rows.len() as u64;
        // A cut's own number: pages of two cuts (two readers) do not mix,
        // the reader's generation check starts it again.
        answer.generation = h.cut;
        if start == 0 {
            answer.removed = delta.removed.clone();
        }
        if end >= delta.rows.len() {
            *held = None;
        }
    }

    /// What is held of table `i` for a chief's delta goes: a whole read
    /// started (the chief took a whole checkpoint instead, or a new base).
    fn drop_held(&self, i: usize) {
        *self.held[i].lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Each table's name, rows held and counters, in order (`State`).
    pub(super) fn counts(&self) -> Vec<(String, u64, TableCounters)> {
        (0..self.list.len())
            .map(|i| {
                let t = self.lock(i);
                (t.name().to_owned(), t.len() as u64, t.counters())
            })
            .collect()
    }

    /// The index of table `name`, or [`TableError::UnknownTable`].
    fn find(&self, ps: usize, name: &str) -> Result<usize, TableError> {
        self.names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| TableError::UnknownTable {
                ps,
                name: name.to_owned(),
                held: self.names.clone(),
            })
    }
}

impl PsService {
    /// Refuses row calls before the chief initialized the shard: rows made
    /// then would be replaced by its restore.
    fn rows_ready(&self) -> Result<(), Status> {
        self.serving()?;
        if !self.lock().is_initialized() {
            return Err(super::shard::ShardError::NotInitialized {
                ps: self.inner.task,
            }
            .into());
        }
        Ok(())
    }

    /// `PullRows` on either transport: each table's rows `ids` (values, or
    /// with `shadows` their EMA shadows), created when absent.
    ///
    /// Errors: `FAILED_PRECONDITION` before the shard is initialized,
    /// `NOT_FOUND` for a table this ps does not hold, `INVALID_ARGUMENT`
    /// for too many ids.
    pub fn pull_rows(&self, tables: &[TableRows], shadows: bool) -> Result<Vec<TableRows>, Status> {
        self.rows_ready()?;
        let mut out = Vec::with_capacity(tables.len());
        for t in tables {
            let i = self.inner.tables.find(self.inner.task, &t.table)?;
            let mut values = Vec::new();
            self.inner
                .tables
                .lock(i)
                .pull(&t.ids, shadows, &mut values)?;
            out.push(TableRows {
                table: t.table.clone(),
                ids: t.ids.clone(),
                values,
            });
        }
        Ok(out)
    }

    /// `PushRows` on either transport: each table's gradient rows applied
    /// (async) or added to the step's aggregate (sync), table by table,
    /// each under its own lock. Every table is checked before any is
    /// updated, so a malformed push changes nothing.
    ///
    /// Errors: as [`PsService::pull_rows`], `UNAVAILABLE` while the cluster
    /// re-shards, and the tables' refusals ([`TableError`]).
    pub fn push_rows(&self, req: PushRows, grads: &[TableRows]) -> Result<RowsPushed, Status> {
        self.rows_ready()?;
        let _pushing = self.inner.reshard.pushing();
        if self.inner.reshard.is_on() {
            return Err(self.resharding_status());
        }
        let (complete, at_last_step) = {
            let s = self.lock();
            let last = self.inner.config.borrow().train.last_step;
            (s.is_complete(), s.step() >= last)
        };
        let mut which = Vec::with_capacity(grads.len());
        for t in grads {
            let i = self.inner.tables.find(self.inner.task, &t.table)?;
            let dim = self.inner.tables.lock(i).dim();
            if t.values.len() != t.ids.len() * dim {
                return Err(TableError::Length {
                    table: t.table.clone(),
                    ids: t.ids.len(),
                    dim,
                    values: t.values.len(),
                }
                .into());
            }
            which.push(i);
        }
        let mut stale = false;
        if !complete {
            for (t, &i) in grads.iter().zip(&which) {
                // The table's own rate, as a multiple of the model's.
                let scale = self
                    .inner
                    .config
                    .borrow()
                    .table_learning_rate_scale(&t.table);
                let outcome = self.inner.tables.lock(i).push(
                    &t.ids,
                    &t.values,
                    req.learning_rate * scale,
                    req.step,
                    req.worker,
                    at_last_step,
                )?;
                stale |= outcome == Outcome::Stale;
            }
        }
        Ok(RowsPushed {
            stale,
            incarnation: self.inner.incarnation,
            complete,
        })
    }

    /// Every table's rows, sorted by id, each copied a page at a time
    /// under its lock ([`PAGE_BYTES`]): what the ps's snapshots save.
    /// Eviction (`[model.tables]`) runs on each table first.
    pub fn table_states(&self) -> Vec<TableState> {
        let tables = &self.inner.tables;
        (0..tables.names().len())
            .map(|i| {
                tables.evict(i, self.inner.task);
                TableState {
                    table: tables.names()[i].clone(),
                    rows: tables.copy(i),
                }
            })
            .collect()
    }

    /// The tables as the next snapshot holds them ([`Table::cut`]): with
    /// `full` false, tables to hold and every one's changes since the last
    /// cut kept, only those — each table's changed rows and `Some` of the
    /// ids dropped; otherwise every table whole and `None`.
    /// Eviction runs first, as for [`PsService::table_states`].
    pub(super) fn table_cut(&self, full: bool) -> (Vec<TableState>, Option<Vec<Vec<u64>>>) {
        let tables = &self.inner.tables;
        let names = tables.names();
        let mut cuts = Vec::with_capacity(names.len());
        for i in 0..names.len() {
            tables.evict(i, self.inner.task);
            cuts.push(tables.lock(i).cut(full));
        }
        if names.is_empty() || cuts.iter().any(Option::is_none) {
            // The changes start again from each cut: the whole copy, read
            // after them, holds every row as new or newer.
            return (self.table_states(), None);
        }
        let (states, removed) = cuts
            .into_iter()
            .flatten()
            .zip(names)
            .map(|(d, name)| {
                let state = TableState {
                    table: name.clone(),
                    rows: d.rows,
                };
                (state, d.removed)
            })
            .unzip();
        (states, Some(removed))
    }

    /// `ReadRows` on either transport: rows `start..` of `table` (at most
    /// `max_rows`, and at most [`PAGE_BYTES`]; 0: as many as that), with
    /// their shadows and slots, in the order this ps created them. A read
    /// from row 0 (the chief's checkpoint, or a re-shard's) runs eviction
    /// (`[model.tables]`) on the table first. `cut`: a chain's base counts
    /// the table's changes from its first page; a delta's pages are those
    /// of the rows changed since the base, sorted by id, cut at its first
    /// page ([`Tables::read_delta`]).
    ///
    /// Errors: `UNAVAILABLE` while the ps stops, `NOT_FOUND` for a table
    /// this ps does not hold.
    pub fn read_rows(
        &self,
        table: &str,
        start: u64,
        max_rows: u32,
        cut: Cut,
    ) -> Result<RowsPage, Status> {
        self.serving()?;
        let tables = &self.inner.tables;
        let i = tables.find(self.inner.task, table)?;
        if start == 0 {
            tables.evict(i, self.inner.task);
            // Before the table's lock: a delta's reader takes the two the
            // other way round.
            if !matches!(cut, Cut::Delta(_)) {
                tables.drop_held(i);
            }
        }
        let start = usize::try_from(start).unwrap_or(usize::MAX);
        let page = |t: &Table| {
            let bound = (PAGE_BYTES / t.row_bytes()).max(1);
            match max_rows {
                0 => bound,
                n => (n as usize).min(bound),
            }
        };
        let mut t = tables.lock(i);
        let mut answer = RowsPage {
            incarnation: self.inner.incarnation,
            ..RowsPage::default()
        };
        answer.state.table = table.to_owned();
        match cut {
            Cut::Delta(chain) => {
                let rows = page(&t);
                drop(t);
                tables.read_delta(i, chain, start, rows, &mut answer);
            }
            Cut::Plain | Cut::Base(_) => {
                if let (Cut::Base(chain), 0) = (cut, start) {
                    t.cut_base(chain);
                }
                answer.state.rows = t.page(start, page(&t));
                answer.total = t.len() as u64;
                answer.generation = t.generation();
            }
        }
        Ok(answer)
    }

    /// `StageRows` on either transport: `state`'s rows (a page of a table
    /// this ps owns, with shadows and slots) kept for the `Initialize`
    /// whose `staged` is `token`, after those staged under it before; a
    /// new token first discards what an older one staged.
    ///
    /// Errors: `UNAVAILABLE` while the ps stops, `NOT_FOUND` for a table
    /// this ps does not hold, `INVALID_ARGUMENT` for token 0, rows not the
    /// table's width or not finite, a page unlike the ones before it, or
    /// more rows than a table can index; nothing staged then.
    pub fn stage_rows(&self, token: u64, state: TableState) -> Result<(), Status> {
        self.serving()?;
        if token == 0 {
            return Err(Status::invalid_argument(
                "StageRows: token 0 names no Initialize",
            ));
        }
        let tables = &self.inner.tables;
        let i = tables.find(self.inner.task, &state.table)?;
        tables.lock(i).check(&state.rows)?;
        let mut staged = tables.staged.lock().unwrap_or_else(|e| e.into_inner());
        if staged.token != token {
            *staged = Staged {
                token,
                tables: Vec::new(),
            };
        }
        let Some(held) = staged.tables.iter_mut().find(|t| t.table == state.table) else {
            staged.tables.push(state);
            return Ok(());
        };
        if held.rows.len() + state.rows.len() > u32::MAX as usize {
            return Err(Status::invalid_argument(format!(
                "StageRows: table {:?} would hold more than {} rows on one ps",
                state.table,
                u32::MAX
            )));
        }
        held.rows.append(state.rows).map_err(|e| {
            Status::invalid_argument(format!("StageRows: table {:?}: {e}", state.table))
        })
    }

    /// The rows staged under `token` for this `Initialize` (none for 0),
    /// taken: staging starts empty again.
    ///
    /// Errors: `FAILED_PRECONDITION` when what is staged is another
    /// token's (this ps restarted since, or another chief staged after).
    pub(super) fn take_staged(&self, token: u64) -> Result<Vec<TableState>, Status> {
        let mut staged = self
            .inner
            .tables
            .staged
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let held = std::mem::take(&mut *staged);
        match token {
            0 => Ok(Vec::new()),
            t if t == held.token => Ok(held.tables),
            t => Err(Status::failed_precondition(format!(
                "ps:{}: the rows staged for this Initialize (token {t:#x}) are not here: \
                 the ps restarted or another chief staged rows since; seed again",
                self.inner.task
            ))),
        }
    }

    /// Replaces the rows of the tables named in `states` (a restore of
    /// global step `step`: the rows' last update, for eviction); a table
    /// not named keeps its rows. Every table is checked before any is
    /// replaced.
    ///
    /// Errors: `NOT_FOUND` for a table this ps does not hold,
    /// `INVALID_ARGUMENT` for rows that are not `dim` wide or not finite;
    /// nothing changed then.
    pub fn load_tables(&self, states: &[TableState], step: u64) -> Result<(), Status> {
        let mut which = Vec::with_capacity(states.len());
        for s in states {
            let i = self.inner.tables.find(self.inner.task, &s.table)?;
            self.inner.tables.lock(i).check(&s.rows)?;
            which.push(i);
        }
        for (s, &i) in states.iter().zip(&which) {
            self.inner.tables.lock(i).load(&s.rows, step)?;
        }
        Ok(())
    }

    /// Replaces every table's rows: those named in `states`, the others
    /// emptied (the shard seeded anew: nothing of its rows before stays).
    ///
    /// Errors: as [`PsService::load_tables`]; nothing changed then.
    pub(super) fn replace_tables(
        &self,
        mut states: Vec<TableState>,
        step: u64,
    ) -> Result<(), Status> {
        for name in self.inner.tables.names() {
            if !states.iter().any(|s| &s.table == name) {
                states.push(TableState {
                    table: name.clone(),
                    rows: Default::default(),
                });
            }
        }
        self.load_tables(&states, step)
    }

    /// The tables' specs, in order (what a snapshot of them is checked against).
    pub(super) fn table_specs(&self) -> Vec<crate::model::TableSpec> {
        (0..self.inner.tables.names().len())
            .map(|i| self.inner.tables.lock(i).spec().clone())
            .collect()
    }

    /// Updates applied to the rows since this process started, all tables
    /// together: what moved since the last snapshot, the step aside.
    pub(super) fn tables_version(&self) -> u64 {
        (0..self.inner.tables.names().len())
            .map(|i| {
                let c = self.inner.tables.lock(i).counters();
                c.pushes_applied + c.updates_applied
            })
            .sum()
    }

    /// Sync: the replicas a step waits for changed; each table applies a
    /// step that now has them.
    pub(super) fn set_tables_sync(&self, replicas: usize, total: usize) {
        for i in 0..self.inner.tables.names().len() {
            let mut t = self.inner.tables.lock(i);
            if let Err(e) = t.set_sync(replicas, total) {
                warn!(ps = self.inner.task, table = t.name(), error = %e, "The table's step failed; its rows are dropped.");
            }
        }
    }
}
