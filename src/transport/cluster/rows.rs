//! [`Cluster::pull_rows`] and [`Cluster::push_rows`]: the embedding tables'
//! rows, moved by id. Each id goes to the ps that owns it
//! (`placement::table_owner`), every ps is asked at once, and only the rows
//! a batch touches cross the wire — whatever the tables' size. On shared
//! memory the rows travel in the call's message (a batch's rows vary in
//! number; the region's fixed areas hold the dense shard).

use super::{Cluster, call};
use crate::model::table::Rows;
use crate::placement::table_owner;
use crate::transport::PAGE_BYTES;
use crate::transport::call::{Cut, RowsPage, RowsPushed, TableRead, TableRows, TableState};
use crate::transport::pb;
use crate::transport::proto::RowsError;
use crate::transport::shm::kind;
use crate::transport::{PsCallError, Via};
use futures::future::try_join_all;
use prost::Message;
use tonic::Status;

/// One table's ids split by owner: for each ps, the ids it owns and where
/// each sits in the caller's list.
struct Split {
    /// `ids[ps]`: the ids ps `ps` owns, in the caller's order.
    ids: Vec<Vec<u64>>,
    /// `at[ps][i]`: the caller's index of `ids[ps][i]`.
    at: Vec<Vec<usize>>,
}

impl Split {
    fn of(ids: &[u64], num_ps: usize) -> Self {
        let mut split = Self {
            ids: vec![Vec::new(); num_ps],
            at: vec![Vec::new(); num_ps],
        };
        for (i, &id) in ids.iter().enumerate() {
            let ps = table_owner(id, num_ps);
            split.ids[ps].push(id);
            split.at[ps].push(i);
        }
        split
    }
}

/// Reads of one ps's table that may start again because its rows were
/// renumbered between two pages (eviction under `model.tables.max_rows`
/// compacts them; a restore replaces them): past this many, the read
/// fails `ABORTED`.
const TABLE_READ_TRIES: usize = 5;

/// Why one read of a table stopped.
enum Renumbered {
    /// The same process renumbered the rows: read again.
    Generation(Status),
    /// Anything else, the ps restarted included.
    Other(Status),
}

impl From<Status> for Renumbered {
    fn from(s: Status) -> Self {
        Self::Other(s)
    }
}

impl Cluster {
    /// The rows `ids` of each `(table, ids)`, in `ids`' order: `ids.len() ×
    /// dim` values per table (with `shadows`, the EMA shadows: evaluation).
    /// A row that does not exist yet is created by its ps with the table's
    /// initializer. The caller deduplicates `ids` (a repeated id is pulled
    /// twice). Every ps is asked at once, each for the ids it owns.
    ///
    /// Errors: the first ps that failed ([`PsCallError`]: `NOT_FOUND` for
    /// a table the model does not have, `FAILED_PRECONDITION` before the
    /// chief initialized the ps), or `INTERNAL` for an answer that does not
    /// fit the request.
    pub async fn pull_rows(
        &self,
        tables: &[(&str, &[u64])],
        shadows: bool,
    ) -> Result<Vec<Vec<f32>>, PsCallError> {
        let num_ps = self.num_ps();
        let splits: Vec<Split> = tables
            .iter()
            .map(|(_, ids)| Split::of(ids, num_ps))
            .collect();
        let answers = try_join_all((0..num_ps).map(|ps| {
            let req = pb::PullRowsRequest {
                tables: tables
                    .iter()
                    .zip(&splits)
                    .map(|((name, _), split)| pb::TableRows {
                        table: (*name).to_owned(),
                        ids: split.ids[ps].clone(),
                        ..Default::default()
                    })
                    .collect(),
                shadows,
            };
            async move { self.pull_rows_one(ps, req).await.map_err(call(ps)) }
        }))
        .await?;
        let mut out: Vec<Vec<f32>> = Vec::with_capacity(tables.len());
        for (t, ((name, ids), split)) in tables.iter().zip(&splits).enumerate() {
            let mut values = Vec::new();
            for (ps, answer) in answers.iter().enumerate() {
                let got = answer
                    .get(t)
                    .filter(|r| r.table == *name && r.ids == split.ids[ps])
                    .ok_or_else(|| {
                        call(ps)(Status::internal(format!(
                            "ps:{ps} answered a pull of table {name:?} with other rows"
                        )))
                    })?;
                if split.ids[ps].is_empty() {
                    continue;
                }
                let dim = got.values.len() / split.ids[ps].len();
                if values.is_empty() {
                    values = vec![0.0; ids.len() * dim];
                } else if values.len() != ids.len() * dim {
                    return Err(call(ps)(Status::internal(format!(
                        "ps:{ps} answered rows of table {name:?} {dim} wide, another ps otherwise"
                    ))));
                }
                for (row, &i) in got.values.chunks_exact(dim.max(1)).zip(&split.at[ps]) {
                    values[i * dim..(i + 1) * dim].copy_from_slice(row);
                }
            }
            out.push(values);
        }
        Ok(out)
    }

    /// Pushes a step's sparse gradients: for each `(table, ids, grads)`,
    /// `grads` is `ids.len() × dim` (a repeated id's rows are summed by the
    /// ps). Every ps gets one push with the rows it owns — an empty one
    /// when it owns none, so that a sync step counts every worker on every
    /// ps. `step` is the global step the worker read its parameters at;
    /// call it before the step's dense push ([`Cluster::step`]), so that a
    /// sync step's rows are in before its dense update lets the next step
    /// start.
    ///
    /// Returns whether any ps dropped the rows as stale (sync), and whether
    /// the run is complete.
    ///
    /// Errors: as [`Cluster::pull_rows`]; `INVALID_ARGUMENT` for gradients
    /// whose length is not `ids.len() × dim`, or not finite;
    /// `ALREADY_EXISTS` (sync) when a ps had this worker's rows for `step`
    /// already (a retry) and no other ps failed.
    pub async fn push_rows(
        &self,
        tables: &[(&str, &[u64], &[f32])],
        learning_rate: f32,
        step: u64,
        worker: u32,
    ) -> Result<RowsPushed, PsCallError> {
        let num_ps = self.num_ps();
        let mut per_ps: Vec<Vec<TableRows>> = vec![Vec::with_capacity(tables.len()); num_ps];
        for (name, ids, grads) in tables {
            if ids.is_empty() && !grads.is_empty()
                || !ids.is_empty() && !grads.len().is_multiple_of(ids.len())
            {
                return Err(call(0)(Status::from(RowsError::Width {
                    table: (*name).to_owned(),
                    what: "the gradient",
                    values: grads.len(),
                    ids: ids.len(),
                })));
            }
            let dim = grads.len().checked_div(ids.len()).unwrap_or(0);
            let split = Split::of(ids, num_ps);
            for (ps, rows) in per_ps.iter_mut().enumerate() {
                let mut values = Vec::with_capacity(split.ids[ps].len() * dim);
                for &i in &split.at[ps] {
                    values.extend_from_slice(&grads[i * dim..(i + 1) * dim]);
                }
                rows.push(TableRows {
                    table: (*name).to_owned(),
                    ids: split.ids[ps].clone(),
                    values,
                });
            }
        }
        let pushes = per_ps.into_iter().enumerate().map(|(ps, rows)| {
            let req = pb::PushRowsRequest {
                gradients: rows.iter().map(pb::TableRows::from).collect(),
                learning_rate,
                step,
                worker,
            };
            async move { self.push_rows_one(ps, req).await.map_err(call(ps)) }
        });
        // Every ps's push runs to its end, as the dense push's do: a retry
        // whose rows one ps already has (`ALREADY_EXISTS`, sync) must still
        // reach the ps that lacks them.
        let answers = super::settle(futures::future::join_all(pushes).await)?;
        Ok(answers
            .iter()
            .fold(RowsPushed::default(), |acc, r| RowsPushed {
                stale: acc.stale || r.stale,
                incarnation: 0,
                complete: acc.complete || r.complete,
            }))
    }

    /// One ps's `PullRows`, over shared memory when it can; the answer's
    /// tables checked.
    async fn pull_rows_one(
        &self,
        ps: usize,
        req: pb::PullRowsRequest,
    ) -> Result<Vec<TableRows>, Status> {
        let answer: pb::PullRowsResponse = match self.shm(ps).await {
            Some((link, mut conn)) => link.call(&mut conn, kind::PULL_ROWS, &req).await?,
            None => {
                self.took(ps, Via::Tcp);
                let sent = req.encoded_len();
                let r = self.clients[ps].clone().pull_rows(req).await?.into_inner();
                self.count(ps, sent, r.encoded_len());
                r
            }
        };
        answer
            .tables
            .iter()
            .map(|t| TableRows::try_from(t).map_err(|e| Status::internal(format!("ps:{ps}: {e}"))))
            .collect()
    }

    /// One ps's `PushRows`, over shared memory when it can.
    async fn push_rows_one(
        &self,
        ps: usize,
        req: pb::PushRowsRequest,
    ) -> Result<RowsPushed, Status> {
        let answer: pb::PushRowsResponse = match self.shm(ps).await {
            Some((link, mut conn)) => link.call(&mut conn, kind::PUSH_ROWS, &req).await?,
            None => {
                self.took(ps, Via::Tcp);
                let sent = req.encoded_len();
                let r = self.clients[ps].clone().push_rows(req).await?.into_inner();
                self.count(ps, sent, r.encoded_len());
                r
            }
        };
        Ok(RowsPushed::from(&answer))
    }

    /// Every table, from every ps, in the model's order: each ps's rows
    /// read a page at a time ([`PAGE_BYTES`]; tables far larger than a
    /// message), merged and sorted by id, with the ids dropped since the
    /// chain's base (a delta's; empty otherwise). Each row is as new as its
    /// page: in async mode a table read while training goes on is not one
    /// moment's, as TensorFlow's `Saver` reads variables while they train.
    /// `cut`: whole ([`Cut::Plain`], [`Cut::Base`]) or the rows changed
    /// since the chain's base ([`Cut::Delta`]; `None` when a ps cannot tell
    /// them: the checkpoint must be whole).
    ///
    /// Errors: the first ps that failed; `ABORTED` when a ps's table was
    /// replaced (a restore, or [`TABLE_READ_TRIES`] evictions under
    /// `model.tables.max_rows`) between two pages, `INTERNAL` for pages
    /// that do not fit together.
    pub(super) async fn read_tables(
        &self,
        cut: Cut,
    ) -> Result<Option<Vec<TableRead>>, PsCallError> {
        let mut out = Vec::with_capacity(self.tables.len());
        for table in &self.tables {
            let parts =
                try_join_all((0..self.num_ps()).map(|ps| async move {
                    self.read_table(ps, table, cut).await.map_err(call(ps))
                }))
                .await?;
            let Some(parts) = parts.into_iter().collect::<Option<Vec<_>>>() else {
                return Ok(None);
            };
            let (rows, removed): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
            let rows = crate::placement::merge_rows(rows);
            let mut removed: Vec<u64> = removed.concat();
            removed.sort_unstable();
            removed.dedup();
            removed.retain(|id| rows.ids.binary_search(id).is_err());
            out.push(TableRead {
                table: table.clone(),
                rows,
                removed,
            });
        }
        Ok(Some(out))
    }

    /// Table `table`'s rows on ps `ps` (and a delta's dropped ids), read
    /// again from the start when its rows were renumbered between two pages
    /// of the same process (an eviction by a push under
    /// `model.tables.max_rows`, or a restore), at most [`TABLE_READ_TRIES`]
    /// times in all. `None`: a delta the ps does not have.
    async fn read_table(
        &self,
        ps: usize,
        table: &str,
        cut: Cut,
    ) -> Result<Option<(Rows, Vec<u64>)>, Status> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.read_table_once(ps, table, cut).await {
                Err(Renumbered::Generation(_)) if tries < TABLE_READ_TRIES => continue,
                Err(Renumbered::Generation(s) | Renumbered::Other(s)) => return Err(s),
                Ok(rows) => return Ok(rows),
            }
        }
    }

    /// [`Cluster::read_table`], once.
    async fn read_table_once(
        &self,
        ps: usize,
        table: &str,
        cut: Cut,
    ) -> Result<Option<(Rows, Vec<u64>)>, Renumbered> {
        let bad = |why: String| {
            Renumbered::Other(Status::internal(format!("ps:{ps} table {table:?}: {why}")))
        };
        let (chain, base) = cut.wire();
        let (mut rows, mut removed, mut generation) = (Rows::default(), Vec::new(), None);
        loop {
            let req = pb::ReadRowsRequest {
                table: table.to_owned(),
                start: rows.len() as u64,
                max_rows: 0,
                chain,
                base,
            };
            let answer: pb::ReadRowsResponse = match self.shm(ps).await {
                Some((link, mut conn)) => link.call(&mut conn, kind::READ_ROWS, &req).await?,
                None => {
                    self.took(ps, Via::Tcp);
                    let sent = req.encoded_len();
                    let r = self.clients[ps].clone().read_rows(req).await?.into_inner();
                    self.count(ps, sent, r.encoded_len());
                    r
                }
            };
            let page = RowsPage::try_from(&answer).map_err(|e| bad(e.to_string()))?;
            if page.state.table != table {
                return Err(bad(format!("answered with table {:?}", page.state.table)));
            }
            if matches!(cut, Cut::Delta(_)) && !page.delta {
                return Ok(None);
            }
            let now = (page.generation, page.incarnation);
            if let Some(g) = generation.filter(|&g: &(u64, u64)| g != now) {
                let s = Status::aborted(format!(
                    "ps:{ps} replaced table {table:?}'s rows (a restore, or evictions under \
                     model.tables.max_rows) while they were read"
                ));
                return Err(if g.1 == now.1 {
                    Renumbered::Generation(s)
                } else {
                    Renumbered::Other(s)
                });
            }
            if generation.is_none() {
                removed = page.removed;
            }
            generation = Some(now);
            let got = page.state.rows.len();
            rows.append(page.state.rows).map_err(bad)?;
            if got > 0 && rows.len() == got {
                // After the first page: room for the rest, once (at most 64
                // pages' worth, whatever total a ps claims; past it, growth).
                let rest = usize::try_from(page.total)
                    .unwrap_or(usize::MAX)
                    .saturating_sub(got);
                rows.reserve(rest.min(got * 64));
            }
            if rows.len() as u64 >= page.total {
                return Ok(Some((rows, removed)));
            }
            if got == 0 {
                return Err(bad(format!(
                    "an empty page at row {} of {}",
                    rows.len(),
                    page.total
                )));
            }
        }
    }

    /// Stages `tables` (this ps's rows of each) on ps `ps` under `token`
    /// for its next `Initialize`, a page ([`PAGE_BYTES`]) at a time.
    pub(super) async fn stage(
        &self,
        ps: usize,
        token: u64,
        tables: &[TableState],
    ) -> Result<(), Status> {
        for t in tables {
            let per_page = (PAGE_BYTES / t.rows.row_bytes()).max(1);
            let mut start = 0;
            // An empty table too: the ps then knows it is staged, empty.
            loop {
                let end = (start + per_page).min(t.rows.len());
                let page = TableState {
                    table: t.table.clone(),
                    rows: t.rows.slice(start..end),
                };
                let req = pb::StageRowsRequest {
                    token,
                    rows: Some(pb::TableRows::from(&page)),
                };
                match self.shm(ps).await {
                    Some((link, mut conn)) => {
                        link.call::<pb::StageRowsResponse>(&mut conn, kind::STAGE_ROWS, &req)
                            .await?;
                    }
                    None => {
                        self.took(ps, Via::Tcp);
                        let sent = req.encoded_len();
                        self.clients[ps].clone().stage_rows(req).await?;
                        self.count(ps, sent, 0);
                    }
                }
                start = end;
                if start >= t.rows.len() {
                    break;
                }
            }
        }
        Ok(())
    }
}
