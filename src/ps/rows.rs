//! The ps's embedding tables as a service: each table behind a lock of its
//! own, apart from the dense shard's, so a push of rows and a dense push
//! never wait for each other (docs/design.md, "Sparse variables"). The
//! functions here run on either transport, as `calls.rs`'s do: the
//! adapters turn a request into [`TableRows`] and back.

use super::PsService;
use super::table::{Outcome, Table, TableError};
use crate::config::{Config, Mode};
use crate::transport::call::{PushRows, RowsPushed, TableRows, TableState};
use std::sync::{Mutex, MutexGuard};
use tonic::Status;
use tracing::warn;

/// This ps's tables, each behind its own lock, in the model's order.
pub(super) struct Tables {
    /// The tables.
    list: Vec<Mutex<Table>>,
    /// Their names, same order (read without locking).
    names: Vec<String>,
}

impl Tables {
    /// The model's tables (`placement::tables`), empty.
    ///
    /// Errors: [`TableError::Optimizer`] when the optimizer has no sparse
    /// rule (config validation refuses it first).
    pub(super) fn new(config: &Config) -> Result<Self, TableError> {
        let rule = match config.train.mode {
            Mode::Async => super::shard::Rule::Async,
            Mode::Sync => super::shard::Rule::Sync {
                replicas: config.replicas_to_aggregate(),
                total: config.total_num_replicas(),
            },
        };
        let specs = crate::placement::tables(config);
        let names = specs.iter().map(|s| s.name.clone()).collect();
        let list = specs
            .into_iter()
            .map(|spec| {
                Table::new(
                    spec,
                    config.train.optimizer(),
                    rule,
                    config.train.moving_average_decay,
                )
                .map(Mutex::new)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { list, names })
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
                let outcome = self.inner.tables.lock(i).push(
                    &t.ids,
                    &t.values,
                    req.learning_rate,
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

    /// Every table's rows, each copied under its own lock: what snapshots
    /// and checkpoints save.
    pub fn table_states(&self) -> Vec<TableState> {
        (0..self.inner.tables.names().len())
            .map(|i| {
                let t = self.inner.tables.lock(i);
                TableState {
                    table: t.name().to_owned(),
                    rows: t.rows(),
                }
            })
            .collect()
    }

    /// Replaces the rows of the tables named in `states` (a restore); a
    /// table not named keeps its rows. Every table is checked before any
    /// is replaced.
    ///
    /// Errors: `NOT_FOUND` for a table this ps does not hold,
    /// `INVALID_ARGUMENT` for rows that are not `dim` wide or not finite;
    /// nothing changed then.
    pub fn load_tables(&self, states: &[TableState]) -> Result<(), Status> {
        let mut which = Vec::with_capacity(states.len());
        for s in states {
            let i = self.inner.tables.find(self.inner.task, &s.table)?;
            self.inner.tables.lock(i).check(&s.rows)?;
            which.push(i);
        }
        for (s, &i) in states.iter().zip(&which) {
            self.inner.tables.lock(i).load(&s.rows)?;
        }
        Ok(())
    }

    /// Replaces every table's rows: those named in `states`, the others
    /// emptied (the shard seeded anew: nothing of its rows before stays).
    ///
    /// Errors: as [`PsService::load_tables`]; nothing changed then.
    pub(super) fn replace_tables(&self, mut states: Vec<TableState>) -> Result<(), Status> {
        for name in self.inner.tables.names() {
            if !states.iter().any(|s| &s.table == name) {
                states.push(TableState {
                    table: name.clone(),
                    rows: Default::default(),
                });
            }
        }
        self.load_tables(&states)
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
