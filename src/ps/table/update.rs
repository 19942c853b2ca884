//! How a push of rows becomes an update: duplicate ids summed, then applied
//! at once (async) or summed with the other replicas' pushes of the same
//! step until `replicas` workers are in (sync), then the optimizer's pass
//! over only those rows — the table's rule (`optimizer::table`: SGD,
//! Adagrad, FTRL-Proximal, lazy Adam, as TensorFlow's sparse kernels
//! compute them), each updated row's EMA shadow with it.
//!
//! Sync follows TensorFlow's `SparseConditionalAccumulator` (what
//! `SyncReplicasOptimizer` uses for `IndexedSlices`, reduction `MEAN`): the
//! gradients of a step are summed row by row, and each row is divided by
//! the number of gradients that held it — its mean over the workers that
//! touched it, not over all replicas (TensorFlow's
//! `sparse_conditional_accumulator.h`, "average element-wise"). A row one
//! worker pushed twice within its push counts once: its duplicates are one
//! gradient's, summed first.

use super::{Table, TableError};
use crate::model;
use crate::model::table::IdMap;
use crate::ps::shard::Rule;
use std::collections::{BTreeMap, BTreeSet};

/// What became of a push of rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied (async), or completed its step's aggregate (sync).
    Applied,
    /// Sync: counted towards its step; waiting for more replicas.
    Pending,
    /// Sync: for a step the table has passed; dropped.
    Stale,
    /// The ps is at `train.last_step`: not applied.
    AtLastStep,
}

/// Sync steps whose aggregate is being gathered at once, at most: a worker
/// one step ahead of a straggler's push is normal; more is a step that will
/// never complete (its worker left), dropped when a newer one needs room.
const MAX_PENDING_STEPS: usize = 4;

/// One sync step's aggregate.
#[derive(Debug, Default)]
struct Step {
    /// Workers whose rows are in.
    workers: BTreeSet<u32>,
    /// Row of `ids` by id.
    at: IdMap<usize>,
    /// The ids pushed for the step, first-seen order.
    ids: Vec<u64>,
    /// Their summed gradients, `ids.len() × dim`.
    sum: Vec<f32>,
    /// How many workers' gradients hold each id.
    count: Vec<u32>,
    /// The learning rate of the latest push in.
    lr: f32,
}

/// The rule and, in sync mode, the steps in progress.
#[derive(Debug)]
pub(super) struct Sync {
    /// Async, or sync with its replicas.
    rule: Rule,
    /// Steps below this one are stale (the newest applied step + 1).
    next: u64,
    /// Aggregates by step.
    steps: BTreeMap<u64, Step>,
}

impl Sync {
    pub(super) fn new(rule: Rule) -> Self {
        Self {
            rule,
            next: 0,
            steps: BTreeMap::new(),
        }
    }

    /// Forgets the steps in progress (the table was replaced).
    pub(super) fn clear(&mut self) {
        self.steps.clear();
    }
}

/// `ids` with each repeated id once, its gradient rows summed, in
/// first-seen order.
fn dedup(ids: &[u64], grads: &[f32], dim: usize) -> (Vec<u64>, Vec<f32>) {
    let mut at: IdMap<usize> = IdMap::with_capacity_and_hasher(ids.len(), Default::default());
    let (mut out_ids, mut out) = (
        Vec::with_capacity(ids.len()),
        Vec::with_capacity(grads.len()),
    );
    for (i, &id) in ids.iter().enumerate() {
        let g = &grads[i * dim..(i + 1) * dim];
        match at.get(&id) {
            Some(&j) => {
                for (s, g) in out[j * dim..(j + 1) * dim].iter_mut().zip(g) {
                    *s += g;
                }
            }
            None => {
                at.insert(id, out_ids.len());
                out_ids.push(id);
                out.extend_from_slice(g);
            }
        }
    }
    (out_ids, out)
}

impl Table {
    /// Applies (async) or aggregates (sync) `worker`'s gradient rows `grads`
    /// (`ids.len() × dim`) for rows `ids`, computed at `step` with learning
    /// rate `lr`. Repeated ids are summed. `at_last_step`: the ps's dense
    /// shard is at `train.last_step`, so nothing is applied.
    ///
    /// Errors: [`TableError::Length`], [`TableError::LearningRate`],
    /// [`TableError::NonFinite`], [`TableError::TooManyIds`],
    /// [`TableError::Overflow`] (a finite gradient whose update is not),
    /// and in sync mode [`TableError::UnknownWorker`] and
    /// [`TableError::DuplicatePush`]; nothing changed.
    pub fn push(
        &mut self,
        ids: &[u64],
        grads: &[f32],
        lr: f32,
        step: u64,
        worker: u32,
        at_last_step: bool,
    ) -> Result<Outcome, TableError> {
        let dim = self.spec.dim;
        self.check_ids(ids.len())?;
        if grads.len() != ids.len() * dim {
            return Err(TableError::Length {
                table: self.spec.name.clone(),
                ids: ids.len(),
                dim,
                values: grads.len(),
            });
        }
        if !(lr.is_finite() && lr > 0.0) {
            return Err(TableError::LearningRate(lr));
        }
        if let Some(i) = grads.iter().position(|g| !g.is_finite()) {
            return Err(TableError::NonFinite {
                table: self.spec.name.clone(),
                id: ids[i / dim],
            });
        }
        if at_last_step {
            return Ok(Outcome::AtLastStep);
        }
        let (ids, grads) = dedup(ids, grads, dim);
        self.see_step(step);
        match self.sync.rule {
            Rule::Async => {
                // Admission counts each id once per push (duplicates summed above).
                let (ids, grads) = self.admit(ids, grads);
                self.apply(&ids, &grads, None, lr, step)?;
                self.counters.pushes_applied += 1;
                Ok(Outcome::Applied)
            }
            Rule::Sync { replicas, total } => {
                if worker as usize >= total {
                    return Err(TableError::UnknownWorker { worker, total });
                }
                self.push_sync(ids, grads, lr, step, worker, replicas)
            }
        }
    }

    /// Sync: adds `worker`'s (deduplicated) rows to `step`'s aggregate and
    /// applies it once `replicas` workers are in.
    fn push_sync(
        &mut self,
        ids: Vec<u64>,
        grads: Vec<f32>,
        lr: f32,
        step: u64,
        worker: u32,
        replicas: usize,
    ) -> Result<Outcome, TableError> {
        let dim = self.spec.dim;
        if step < self.sync.next {
            self.counters.stale += 1;
            return Ok(Outcome::Stale);
        }
        if self
            .sync
            .steps
            .get(&step)
            .is_some_and(|s| s.workers.contains(&worker))
        {
            return Err(TableError::DuplicatePush {
                table: self.spec.name.clone(),
                worker,
                step,
            });
        }
        // Admission counts a push it will take, once per id; a stale or
        // duplicate push changed nothing, its sightings included.
        let (ids, grads) = self.admit(ids, grads);
        if !self.sync.steps.contains_key(&step) && self.sync.steps.len() >= MAX_PENDING_STEPS {
            // Room for the new step: the oldest is one that never completed.
            if let Some((_, old)) = self.sync.steps.pop_first() {
                self.counters.stale += old.workers.len() as u64;
            }
        }
        let agg = self.sync.steps.entry(step).or_default();
        agg.workers.insert(worker);
        agg.lr = lr;
        for (i, &id) in ids.iter().enumerate() {
            let g = &grads[i * dim..(i + 1) * dim];
            match agg.at.get(&id) {
                Some(&j) => {
                    for (s, g) in agg.sum[j * dim..(j + 1) * dim].iter_mut().zip(g) {
                        *s += g;
                    }
                    agg.count[j] += 1;
                }
                None => {
                    agg.at.insert(id, agg.ids.len());
                    agg.ids.push(id);
                    agg.sum.extend_from_slice(g);
                    agg.count.push(1);
                }
            }
        }
        if agg.workers.len() < replicas {
            return Ok(Outcome::Pending);
        }
        self.apply_step(step)
    }

    /// Sync: the replicas a step waits for changed (the membership did).
    /// Applies the oldest step that now has enough gradients, if any;
    /// returns whether one was applied.
    ///
    /// Errors: as the update ([`TableError::Overflow`]); that step's
    /// gradients are then dropped.
    pub fn set_sync(&mut self, replicas: usize, total: usize) -> Result<bool, TableError> {
        let Rule::Sync { .. } = self.sync.rule else {
            return Ok(false);
        };
        self.sync.rule = Rule::Sync { replicas, total };
        let due = self
            .sync
            .steps
            .iter()
            .find(|(_, s)| !s.workers.is_empty() && s.workers.len() >= replicas)
            .map(|(&k, _)| k);
        match due {
            Some(step) => self.apply_step(step).map(|o| o == Outcome::Applied),
            None => Ok(false),
        }
    }

    /// Sync: applies `step`'s aggregate (each row its mean over the
    /// gradients that held it), then forgets it and every older step.
    fn apply_step(&mut self, step: u64) -> Result<Outcome, TableError> {
        let agg = self.sync.steps.remove(&step).unwrap_or_default();
        while let Some((_, old)) = self.sync.steps.pop_first_if_below(step) {
            self.counters.stale += old.workers.len() as u64;
        }
        self.sync.next = step + 1;
        let scale: Vec<f32> = agg.count.iter().map(|&c| 1.0 / c as f32).collect();
        self.apply(&agg.ids, &agg.sum, Some(&scale), agg.lr, step)?;
        self.counters.updates_applied += 1;
        Ok(Outcome::Applied)
    }

    /// The optimizer's update of rows `ids` with `scale[i] · grads[i]`
    /// (`None`: 1), then each row's EMA step (decay from `step`). Rows are
    /// created first if absent; the new values are computed aside and
    /// written only when all are finite.
    ///
    /// Under `max_rows`, room is made first ([`Table::make_room`]); the
    /// new rows it has no room for are left out. When the ps's memory is
    /// short (`ps::memory`), every new row is ([`Table::existing_only`]).
    ///
    /// Errors: [`TableError::Overflow`]; no row changed (rows created for
    /// the push stay, at their initial values).
    fn apply(
        &mut self,
        ids: &[u64],
        grads: &[f32],
        scale: Option<&[f32]>,
        lr: f32,
        step: u64,
    ) -> Result<(), TableError> {
        let kept = match self.has_room() {
            true => self.make_room(ids),
            false => self.existing_only(ids),
        };
        if let Some(kept) = kept {
            let dim = self.spec.dim;
            let ids: Vec<u64> = kept.iter().map(|&i| ids[i]).collect();
            let grads: Vec<f32> = kept
                .iter()
                .flat_map(|&i| &grads[i * dim..(i + 1) * dim])
                .copied()
                .collect();
            let scale: Option<Vec<f32>> = scale.map(|s| kept.iter().map(|&i| s[i]).collect());
            return self.apply_rows(&ids, &grads, scale.as_deref(), lr, step);
        }
        self.apply_rows(ids, grads, scale, lr, step)
    }

    /// [`Table::apply`] once the rows have room.
    fn apply_rows(
        &mut self,
        ids: &[u64],
        grads: &[f32],
        scale: Option<&[f32]>,
        lr: f32,
        step: u64,
    ) -> Result<(), TableError> {
        let (dim, stride, slots, shadow) = (self.spec.dim, self.stride, self.slots, self.shadow);
        // Where the slots start: after the value and the shadow, if any.
        let base = dim + shadow;
        let rate = 1.0 - model::ema_decay(self.ema, step);
        let optimizer = self.optimizer;
        let step_size = optimizer.rate(lr, step);
        let rows: Vec<usize> = ids.iter().map(|&id| self.row(id)).collect();
        let mut next = vec![0.0f32; rows.len() * stride];
        let mut bad = false;
        let mut slot = [0.0f32; crate::optimizer::MAX_SLOTS];
        for (i, &r) in rows.iter().enumerate() {
            let old = &self.arena[r * stride..(r + 1) * stride];
            let new = &mut next[i * stride..(i + 1) * stride];
            let s = scale.map_or(1.0, |s| s[i]);
            let g = &grads[i * dim..(i + 1) * dim];
            for j in 0..dim {
                for (k, v) in slot[..slots].iter_mut().enumerate() {
                    *v = old[base + k * dim + j];
                }
                let w = optimizer.apply(old[j], g[j] * s, &mut slot[..slots], step_size);
                new[j] = w;
                bad |= !w.is_finite();
                if shadow > 0 {
                    let sh = model::ema_step(old[dim + j], w, rate);
                    new[dim + j] = sh;
                    bad |= !sh.is_finite();
                }
                for (k, &v) in slot[..slots].iter().enumerate() {
                    new[base + k * dim + j] = v;
                    bad |= !v.is_finite();
                }
            }
        }
        if bad {
            return Err(TableError::Overflow {
                lr,
                table: self.spec.name.clone(),
            });
        }
        for (i, &r) in rows.iter().enumerate() {
            self.arena[r * stride..(r + 1) * stride]
                .copy_from_slice(&next[i * stride..(i + 1) * stride]);
            self.changes.mark(r);
        }
        if !self.touched.is_empty() {
            for &r in &rows {
                self.touch(r, step);
            }
        }
        Ok(())
    }
}

/// `BTreeMap::pop_first` for keys below a bound.
trait PopBelow<V> {
    fn pop_first_if_below(&mut self, bound: u64) -> Option<(u64, V)>;
}

impl<V> PopBelow<V> for BTreeMap<u64, V> {
    fn pop_first_if_below(&mut self, bound: u64) -> Option<(u64, V)> {
        match self.first_key_value() {
            Some((&k, _)) if k < bound => self.pop_first(),
            _ => None,
        }
    }
}
