//! The chief's calls: seeding every shard (or adopting the snapshots the
//! ps tasks hold), the consistent snapshot a checkpoint is made of, and the
//! word that the run is complete or re-shards.

use super::*;
use crate::model::table::Rows;
use crate::placement::split_rows;
use crate::transport::call::{Cut, TableState};

impl Cluster {
    /// Initializes the shards of the ps tasks in `only` from `values` (model
    /// order), optional `shadows` and optional `slots` ([`Snapshot::slots`]
    /// order; `None`: fresh), and `tables` (whole, [`Snapshot::tables`]:
    /// each ps gets the rows it owns under the current ps count; a table
    /// not given starts empty), at `step`, as `run`'s. Returns the shards
    /// that took it.
    #[allow(clippy::too_many_arguments)]
    pub async fn initialize(
        &self,
        only: &[usize],
        values: &[ArrayD<f32>],
        shadows: Option<&[ArrayD<f32>]>,
        slots: Option<&[ArrayD<f32>]>,
        tables: &[(String, Rows)],
        step: u64,
        force: bool,
        run: u64,
    ) -> Result<Vec<usize>, PsCallError> {
        // Whole variables in, each ps's parts out (views: the copy is the encoding).
        let values = self.layout.views(values);
        let shadows = shadows.map(|s| self.layout.views(s));
        // Whole tables in, each ps's rows out (placement::table_owner),
        // staged a page at a time; the Initialize then names the token.
        let mut rows: Vec<Vec<TableState>> = vec![Vec::new(); self.num_ps()];
        for (table, whole) in tables {
            for (ps, part) in split_rows(whole, self.num_ps()).into_iter().enumerate() {
                rows[ps].push(TableState {
                    table: table.clone(),
                    rows: part,
                });
            }
        }
        let tokens: Vec<u64> = (0..self.num_ps())
            .map(|ps| match rows[ps].is_empty() {
                true => 0,
                false => rand::random::<u64>() | 1,
            })
            .collect();
        try_join_all(only.iter().map(|&ps| {
            let (rows, token) = (&rows[ps], tokens[ps]);
            async move { self.stage(ps, token, rows).await.map_err(call(ps)) }
        }))
        .await?;
        let requests = only.iter().map(|&ps| {
            let enc = |src: &[ArrayViewD<f32>]| {
                self.by_ps[ps]
                    .iter()
                    .map(|&i| rpc::encode(&self.specs[i].name, &src[i]))
                    .collect()
            };
            // A shard's slots, and every shard's copy of the non-slot scalars.
            let slots = slots
                .map(|slots| {
                    self.slot_specs
                        .iter()
                        .enumerate()
                        .filter(|(_, spec)| spec.var.is_none_or(|i| self.by_ps[ps].contains(&i)))
                        .map(|(j, spec)| rpc::encode(&spec.name, &self.part_slot(j, slots)))
                        .collect()
                })
                .unwrap_or_default();
            // Tensors inline on both transports: once per run, off the step path.
            let req = pb::InitializeRequest {
                variables: enc(&values),
                shadows: shadows.as_deref().map(enc).unwrap_or_default(),
                global_step: step,
                force,
                slots,
                run,
                staged: tokens[ps],
                ..Default::default()
            };
            (ps, req)
        });
        self.send_initialize(requests).await
    }

    /// Sends the model's dense widths (`layers`, input first) to each ps in
    /// `only`: those started with `model.hidden` wait for them
    /// ([`PsState::needs_widths`]) and then start again with their shard.
    ///
    /// Errors: a ps's refusal (`INVALID_ARGUMENT`: another `model.hidden`).
    pub async fn send_widths(&self, only: &[usize], layers: &[usize]) -> Result<(), PsCallError> {
        let layers: Vec<u64> = layers.iter().map(|&w| w as u64).collect();
        let requests = only.iter().map(|&ps| {
            let req = pb::InitializeRequest {
                layers: layers.clone(),
                ..Default::default()
            };
            (ps, req)
        });
        self.send_initialize(requests).await.map(drop)
    }

    /// Asks each ps in `only` (with the step it restored, and the step to
    /// count on from) to take the snapshot it holds aside, as `run`'s.
    /// Returns the shards that took it.
    pub async fn adopt(
        &self,
        only: &[(usize, u64, u64)],
        run: u64,
    ) -> Result<Vec<usize>, PsCallError> {
        let requests = only.iter().map(|&(ps, held, resume)| {
            let req = pb::InitializeRequest {
                global_step: resume,
                snapshot_step: held,
                run,
                adopt: true,
                ..Default::default()
            };
            (ps, req)
        });
        self.send_initialize(requests).await
    }

    /// Sends each `(ps, request)`; returns the ps tasks that applied theirs.
    pub(super) async fn send_initialize(
        &self,
        requests: impl Iterator<Item = (usize, pb::InitializeRequest)>,
    ) -> Result<Vec<usize>, PsCallError> {
        let replies = try_join_all(requests.map(|(ps, req)| async move {
            let r: Result<pb::InitializeResponse, Status> = match self.shm(ps).await {
                Some((link, mut conn)) => link.call(&mut conn, kind::INITIALIZE, &req).await,
                None => {
                    self.took(ps, Via::Tcp);
                    let mut c = self.clients[ps].clone();
                    c.initialize(req).await.map(|r| r.into_inner())
                }
            };
            r.map(|r| (ps, r.applied)).map_err(call(ps))
        }))
        .await?;
        Ok(replies
            .into_iter()
            .filter(|(_, applied)| *applied)
            .map(|(ps, _)| ps)
            .collect())
    }

    /// Every variable, its EMA shadow and its slots, every table's rows, and
    /// the global step: a consistent snapshot per shard (each table's rows
    /// copied under their own lock just after), for checkpoints and
    /// evaluation.
    pub async fn snapshot(&self) -> Result<Snapshot, PsCallError> {
        let snapshot = self.snapshot_cut(Cut::Plain).await?;
        Ok(snapshot.expect("a whole read always answers"))
    }

    /// [`Cluster::snapshot`], its tables read by `cut` (a base or a delta
    /// of the chief's chain of incremental checkpoints); `None` for a delta
    /// some ps cannot tell (the checkpoint must be whole).
    pub async fn snapshot_cut(&self, cut: Cut) -> Result<Option<Snapshot>, PsCallError> {
        let mut values: Vec<ArrayD<f32>> = self
            .layout
            .vars()
            .iter()
            .map(|s| ArrayD::zeros(s.shape.as_slice()))
            .collect();
        let mut shadows = values.clone();
        let replies = {
            let slots = self
                .slots(&mut values)
                .into_iter()
                .zip(self.slots(&mut shadows));
            try_join_all(slots.enumerate().map(|(ps, (mut v, mut s))| async move {
                self.pull_one(ps, 0, &mut v, Some(&mut s), true, false)
                    .await
                    .map(|(r, _)| r)
                    .map_err(call(ps))
            }))
            .await?
        };
        let step = replies.first().map_or(0, |r| r.global_step);
        let run = replies.first().map_or(0, |r| r.run);
        let shard_steps = replies.iter().map(|r| r.global_step).collect();
        let slots = self.gather_slots(&replies)?;
        // After the shards' tensors, a page at a time.
        let Some(read) = self.read_tables(cut).await? else {
            return Ok(None);
        };
        let (tables, removed) = read
            .into_iter()
            .map(|t| ((t.table, t.rows), t.removed))
            .unzip();
        Ok(Some(Snapshot {
            run,
            shard_steps,
            step,
            values,
            shadows,
            slots,
            tables,
            removed: match cut {
                Cut::Delta(_) => removed,
                Cut::Plain | Cut::Base(_) => Vec::new(),
            },
            cut,
        }))
    }

    /// The optimizer's slots from every shard's snapshot answer, in
    /// [`Snapshot::slots`] order: each slot from the ps holding its
    /// variable, the non-slot scalars from TensorFlow's home for them.
    pub(super) fn gather_slots(
        &self,
        replies: &[pb::PullResponse],
    ) -> Result<Vec<ArrayD<f32>>, PsCallError> {
        let mut slots: Vec<ArrayD<f32>> = self
            .model_slot_specs
            .iter()
            .map(|s| ArrayD::zeros(s.shape.as_slice()))
            .collect();
        let mut got = vec![false; self.slot_specs.len()];
        for (ps, r) in replies.iter().enumerate() {
            for t in &r.slots {
                let bad = |why: &str| PsCallError {
                    ps,
                    status: Status::internal(format!("ps:{ps} sent slot {:?}: {why}", t.name)),
                };
                let j = self
                    .slot_specs
                    .iter()
                    .position(|s| s.name == t.name)
                    .ok_or_else(|| bad("not a slot of this optimizer"))?;
                match self.slot_specs[j].var {
                    Some(i) if self.owner[i] != ps => {
                        return Err(bad("its variable is not on that ps"));
                    }
                    // Every shard keeps a copy; the checkpoint takes TensorFlow's.
                    None if ps != self.non_slot_ps => continue,
                    _ => {}
                }
                let mut part = self.part_slot_mut(j, &mut slots);
                rpc::decode_into(t, &mut part).map_err(|e| call(ps)(e.into()))?;
                got[j] = true;
            }
        }
        if let Some(j) = got.iter().position(|g| !g) {
            let spec = &self.slot_specs[j];
            return Err(PsCallError {
                ps: spec.var.map_or(self.non_slot_ps, |i| self.owner[i]),
                status: Status::internal(format!("slot {:?} missing from the snapshot", spec.name)),
            });
        }
        Ok(slots)
    }

    /// Tells every ps the run is complete (best effort per task).
    pub async fn complete(&self, step: u64) -> Result<(), PsCallError> {
        let req = pb::CompleteRequest {
            global_step: step,
            ..Default::default()
        };
        try_join_all((0..self.num_ps()).map(|ps| self.complete_one(ps, req)))
            .await
            .map(|_| ())
    }

    /// Tells the ps tasks `only` the re-shard checkpoint at `step` is
    /// done (`checkpointed`: written, holding their state): each one's
    /// answer, in that order.
    pub async fn complete_reshard(
        &self,
        step: u64,
        only: &[usize],
        checkpointed: bool,
    ) -> Vec<Result<(), PsCallError>> {
        let req = pb::CompleteRequest {
            global_step: step,
            reshard: true,
            checkpointed,
        };
        futures::future::join_all(only.iter().map(|&ps| self.complete_one(ps, req))).await
    }

    pub(super) async fn complete_one(
        &self,
        ps: usize,
        req: pb::CompleteRequest,
    ) -> Result<(), PsCallError> {
        let r: Result<pb::CompleteResponse, Status> = match self.shm(ps).await {
            Some((link, mut conn)) => link.call(&mut conn, kind::COMPLETE, &req).await,
            None => {
                self.took(ps, Via::Tcp);
                let mut c = self.clients[ps].clone();
                c.complete(req).await.map(|r| r.into_inner())
            }
        };
        r.map(|_| ()).map_err(call(ps))
    }

    /// Part slot `j` (a ps's name for it) as a view of its whole
    /// variable's slot in `slots` ([`Snapshot::slots`] order).
    fn part_slot<'a>(&self, j: usize, slots: &'a [ArrayD<f32>]) -> ArrayViewD<'a, f32> {
        let whole = &slots[self.slot_of[j]];
        match self.slot_specs[j].var {
            Some(p) if !self.layout.whole() => {
                let flat = whole
                    .as_slice()
                    .expect("arrays built by dtf are contiguous");
                let part = &self.layout.parts()[p];
                ArrayViewD::from_shape(part.spec.shape.as_slice(), &flat[part.range.clone()])
                    .expect("a part's range holds its shape")
            }
            _ => whole.view(),
        }
    }

    /// [`Cluster::part_slot`], to write into.
    fn part_slot_mut<'a>(&self, j: usize, slots: &'a mut [ArrayD<f32>]) -> ArrayViewMutD<'a, f32> {
        let whole = &mut slots[self.slot_of[j]];
        match self.slot_specs[j].var {
            Some(p) if !self.layout.whole() => {
                let part = &self.layout.parts()[p];
                let flat = whole
                    .as_slice_mut()
                    .expect("arrays built by dtf are contiguous");
                ArrayViewMutD::from_shape(part.spec.shape.as_slice(), &mut flat[part.range.clone()])
                    .expect("a part's range holds its shape")
            }
            _ => whole.view_mut(),
        }
    }
}
