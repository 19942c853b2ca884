//! One ps task's shard: its variables, their EMA shadows, their optimizer
//! slots, the step counter, and the rules for applying pushes (async) or
//! aggregating them (sync).
//! Pure state, no I/O: the service in [`super`] wraps it in a mutex, which is
//! what makes every push atomic for the shard. `update` turns pushes into
//! updates; this file holds the state and the checks on what comes in.

use crate::model::VarSpec;
use crate::optimizer::{self, Optimizer};
use crate::transport::proto::{Dims, Short};
use ndarray::{ArrayD, IxDyn};
use std::collections::BTreeSet;

mod update;

/// Why a request was refused. Nothing changed.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ShardError {
    #[error(
        "ps:{ps} is not initialized: the chief (worker 0) has not initialized or restored it yet"
    )]
    NotInitialized { ps: usize },
    #[error("ps:{ps} does not hold variable {} (it holds {held:?})", Short(name))]
    UnknownVariable {
        ps: usize,
        name: String,
        held: Vec<String>,
    },
    #[error(
        "variable {}: shape {}, expected {}",
        Short(name),
        Dims(got),
        Dims(expected)
    )]
    Shape {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("variable {} given twice", Short(name))]
    Duplicate { name: String },
    #[error("variable {name} missing: every variable of ps:{ps} is required")]
    Missing { ps: usize, name: String },
    #[error(
        "{} has a non-finite value (NaN or infinity) at flat index {index}",
        Short(name)
    )]
    NonFinite { name: String, index: usize },
    #[error("learning rate {0} is not a finite positive number; state unchanged")]
    LearningRate(f32),
    /// The update would leave a variable or its shadow NaN or infinite
    /// although every input was finite: refused, so one bad push cannot
    /// poison every worker that pulls afterwards.
    #[error("learning rate {lr:e} × gradient overflows {name}; state unchanged")]
    Overflow { lr: f32, name: String },
    /// Checkpoints store the step as i64.
    #[error("global step {0} is above {max}, the largest a checkpoint can hold", max = i64::MAX)]
    StepRange(u64),
    #[error("worker {worker} already pushed a gradient for step {step}")]
    DuplicatePush { worker: u32, step: u64 },
    #[error("gradient for step {step}, but ps:{ps} is at step {current}: pull again")]
    FutureStep { ps: usize, step: u64, current: u64 },
    #[error("worker {worker} is not one of the {total} replicas (train.total_num_replicas)")]
    UnknownWorker { worker: u32, total: usize },
    /// A non-slot scalar (Adam's `beta1_power`) outside what the rule can use.
    #[error(transparent)]
    NonSlot(#[from] optimizer::NonSlotError),
}

impl From<ShardError> for tonic::Status {
    fn from(e: ShardError) -> Self {
        use ShardError::*;
        use tonic::Code;
        let code = match e {
            NotInitialized { .. } | FutureStep { .. } => Code::FailedPrecondition,
            UnknownVariable { .. } => Code::NotFound,
            DuplicatePush { .. } => Code::AlreadyExists,
            Shape { .. }
            | Duplicate { .. }
            | Missing { .. }
            | NonFinite { .. }
            | LearningRate(_)
            | Overflow { .. }
            | StepRange(_)
            | UnknownWorker { .. }
            | NonSlot(_) => Code::InvalidArgument,
        };
        crate::transport::proto::status(code, e)
    }
}

/// How pushes become updates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Every push is applied at once; the step advances per push.
    Async,
    /// SyncReplicasOptimizer: average `replicas` fresh gradients per step.
    Sync {
        /// Gradients averaged into one update.
        replicas: usize,
        /// Workers allowed to push (indices `0..total`).
        total: usize,
    },
}

/// What became of a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Applied (async) or completed the step's aggregate (sync).
    Applied,
    /// Sync: counted towards the step; waiting for more replicas.
    Pending,
    /// Sync: computed on an older step; dropped.
    Stale,
    /// The shard is at `train.last_step`: not applied, so the run ends at
    /// exactly that step (TensorFlow's async workers overshoot it).
    AtLastStep,
}

/// Counters a test or an operator can read through `State`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Async pushes applied.
    pub pushes_applied: u64,
    /// Sync updates applied.
    pub updates_applied: u64,
    /// Gradients that went into sync updates.
    pub gradients_aggregated: u64,
    /// Sync gradients dropped as stale.
    pub stale_gradients: u64,
}

/// The sync accumulator for the current step.
#[derive(Debug)]
struct Pending {
    /// Workers whose gradient is in `sum`.
    workers: BTreeSet<u32>,
    /// Sum of their gradients, per variable.
    sum: Vec<ArrayD<f32>>,
    /// The learning rate of the latest gradient in: the step's update uses
    /// it when a change of membership completes the step ([`Shard::set_sync`]).
    lr: f32,
}

/// An optimizer's state for the variables of a shard.
#[derive(Debug, Clone, PartialEq)]
pub struct Slots {
    /// `per_var[i][k]`: slot `k` ([`Optimizer::slot_names`]) of variable `i`.
    pub per_var: Vec<Vec<ArrayD<f32>>>,
    /// The non-slot scalars ([`Optimizer::non_slot_names`]): this shard's copy.
    pub non_slots: Vec<f32>,
}

/// A shard's state.
#[derive(Debug)]
pub struct Shard {
    /// This ps task's index.
    ps: usize,
    /// The variables held here, in model order.
    specs: Vec<VarSpec>,
    /// Current values; `None` until initialized.
    values: Option<Vec<ArrayD<f32>>>,
    /// EMA shadows, same order.
    shadows: Vec<ArrayD<f32>>,
    /// Updates applied (on ps 0: `global_step`).
    step: u64,
    /// The chief declared the run complete.
    complete: bool,
    /// Async or sync.
    rule: Rule,
    /// The update rule, whose slots are `slots`.
    optimizer: Optimizer,
    /// The optimizer's slots and non-slot scalars; empty until initialized.
    slots: Slots,
    /// Where updated slots are computed, swapped in with `scratch`.
    scratch_slots: Vec<Vec<ArrayD<f32>>>,
    /// `moving_average_decay`.
    ema: f32,
    /// Sync accumulator.
    pending: Pending,
    /// Where an update is computed before it replaces `values` and
    /// `shadows` (swapped, not copied): a refused update leaves the shard
    /// untouched, and the double buffer costs no extra pass.
    scratch: (Vec<ArrayD<f32>>, Vec<ArrayD<f32>>),
    /// For `State`.
    counters: Counters,
    /// Loss of the latest push.
    last_loss: f32,
    /// `train.last_step`: no update takes `step` past it.
    last_step: u64,
    /// The run the state belongs to (the chief's run id; 0: unknown).
    run: u64,
    /// Values per job of an update ([`chunk`]); `usize::MAX`: one job
    /// per part, all on the calling thread.
    chunk: usize,
}

/// The fewest values worth a job on another core: below it, the hand-off
/// costs more than the pass (tens of microseconds).
const PARALLEL_MIN: usize = 16 * 1024;

/// The fewest cores on which a ps applies in parallel. Measured on 2 cores
/// (docs/benchmarks.md, issue 44): there the ps shares its cores with the
/// workers, no core is idle to take a job, and the hand-off only added
/// CPU (0.1–0.3 ms a push); `RAYON_NUM_THREADS` overrides the count.
const PARALLEL_CORES: usize = 4;

/// Values per job for an update of `specs` on `threads` cores: the values
/// spread evenly over the cores, at least [`PARALLEL_MIN`] a job; or
/// `usize::MAX` (serial) below [`PARALLEL_CORES`] or with too few values
/// for two jobs.
fn chunk(specs: &[VarSpec], threads: usize) -> usize {
    let values: usize = specs
        .iter()
        .map(|s| s.shape.iter().product::<usize>())
        .sum();
    if threads < PARALLEL_CORES || values < 2 * PARALLEL_MIN {
        return usize::MAX;
    }
    values.div_ceil(threads).max(PARALLEL_MIN)
}

impl Shard {
    pub fn new(
        ps: usize,
        specs: Vec<VarSpec>,
        rule: Rule,
        moving_average_decay: f32,
        optimizer: Optimizer,
    ) -> Self {
        let zeros = || -> Vec<ArrayD<f32>> {
            specs
                .iter()
                .map(|s| ArrayD::zeros(IxDyn(&s.shape)))
                .collect()
        };
        let (sum, scratch) = (zeros(), (zeros(), zeros()));
        let scratch_slots = specs
            .iter()
            .map(|s| {
                (0..optimizer.slot_names().len())
                    .map(|_| ArrayD::zeros(IxDyn(&s.shape)))
                    .collect()
            })
            .collect();
        Self {
            ps,
            // rayon's pool: `available_parallelism` threads, which respects
            // the CPU affinity and cgroup quota systemd sets.
            chunk: chunk(&specs, rayon::current_num_threads()),
            specs,
            values: None,
            shadows: Vec::new(),
            step: 0,
            complete: false,
            rule,
            optimizer,
            slots: Slots {
                per_var: Vec::new(),
                non_slots: Vec::new(),
            },
            scratch_slots,
            ema: moving_average_decay,
            pending: Pending {
                workers: BTreeSet::new(),
                sum,
                lr: 0.0,
            },
            scratch,
            counters: Counters::default(),
            last_loss: f32::NAN,
            last_step: u64::MAX,
            run: 0,
        }
    }

    /// The step no update goes past (`train.last_step`, live: a reload may move it).
    pub fn set_last_step(&mut self, last_step: u64) {
        self.last_step = last_step;
    }

    /// Whether updates run in parallel, in jobs of [`PARALLEL_MIN`] values
    /// (whatever the cores); tests compare both ways.
    #[cfg(test)]
    pub(super) fn set_parallel(&mut self, on: bool) {
        self.chunk = if on { PARALLEL_MIN } else { usize::MAX };
    }

    pub fn specs(&self) -> &[VarSpec] {
        &self.specs
    }
    pub fn is_initialized(&self) -> bool {
        self.values.is_some()
    }
    /// The run the state belongs to ([`crate::checkpoint::Checkpoint::run`]).
    pub fn run(&self) -> u64 {
        self.run
    }
    /// Sets it, with the values that belong to it ([`Shard::initialize`]).
    pub fn set_run(&mut self, run: u64) {
        self.run = run;
    }
    pub fn step(&self) -> u64 {
        self.step
    }
    pub fn is_complete(&self) -> bool {
        self.complete
    }
    pub fn counters(&self) -> Counters {
        self.counters
    }
    pub fn last_loss(&self) -> f32 {
        self.last_loss
    }
    pub fn set_complete(&mut self) {
        self.complete = true;
    }

    /// Current values, or [`ShardError::NotInitialized`].
    pub fn values(&self) -> Result<&[ArrayD<f32>], ShardError> {
        self.values
            .as_deref()
            .ok_or(ShardError::NotInitialized { ps: self.ps })
    }

    /// EMA shadows, or [`ShardError::NotInitialized`].
    pub fn shadows(&self) -> Result<&[ArrayD<f32>], ShardError> {
        self.values()?;
        Ok(&self.shadows)
    }

    /// The optimizer this shard applies.
    pub fn optimizer(&self) -> Optimizer {
        self.optimizer
    }

    /// The optimizer's slots, or [`ShardError::NotInitialized`].
    pub fn slots(&self) -> Result<&Slots, ShardError> {
        self.values()?;
        Ok(&self.slots)
    }

    /// Puts a request's slot tensors (named as TensorFlow names them:
    /// `layer1/weights/Adam`, `beta1_power`) into a [`Slots`], after checking
    /// that every slot of the shard's variables and every non-slot scalar
    /// appears exactly once, with its shape and finite values.
    pub fn arrange_slots<'a>(
        &self,
        named: impl IntoIterator<Item = (&'a str, &'a [usize], &'a [u8])>,
    ) -> Result<Slots, ShardError> {
        let specs = self.optimizer.slot_specs(&self.specs);
        let expected: Vec<(&str, &[usize])> = specs
            .iter()
            .map(|s| (s.name.as_str(), s.shape.as_slice()))
            .collect();
        let bytes = self.order_in(&expected, named)?;
        non_finite(
            specs
                .iter()
                .map(|s| s.name.as_str())
                .zip(bytes.iter().copied()),
        )?;
        let mut slots = Slots {
            per_var: vec![Vec::new(); self.specs.len()],
            non_slots: Vec::new(),
        };
        for (spec, b) in specs.iter().zip(bytes) {
            let values: Vec<f32> = bytemuck::pod_collect_to_vec(b);
            match spec.var {
                Some(i) => slots.per_var[i].push(
                    ArrayD::from_shape_vec(IxDyn(&spec.shape), values)
                        .expect("order_in checked the shape"),
                ),
                None => {
                    let v = values[0];
                    optimizer::check_non_slot(&spec.name, v)?;
                    slots.non_slots.push(v);
                }
            }
        }
        Ok(slots)
    }

    /// Fresh slots: TensorFlow's initial values.
    fn fresh_slots(&self) -> Slots {
        Slots {
            per_var: self
                .specs
                .iter()
                .map(|s| {
                    (0..self.optimizer.slot_names().len())
                        .map(|_| ArrayD::from_elem(IxDyn(&s.shape), self.optimizer.slot_init()))
                        .collect()
                })
                .collect(),
            non_slots: self.optimizer.non_slot_init(),
        }
    }

    /// Puts tensors that stay in a request's bytes into model order:
    /// `(name, shape, little-endian f32 bytes)` in, the bytes in model order
    /// out, after checking that each variable of the shard appears exactly
    /// once with its shape and finite values. Nothing is copied.
    pub fn arrange_bytes<'a>(
        &self,
        named: impl IntoIterator<Item = (&'a str, &'a [usize], &'a [u8])>,
    ) -> Result<Vec<&'a [u8]>, ShardError> {
        let bytes = self.arrange_gradients(named)?;
        self.check_finite(&bytes)?;
        Ok(bytes)
    }

    /// [`Shard::arrange_bytes`] without the finiteness check, for a push:
    /// [`Shard::push_bytes`] checks it (fused into the update when async,
    /// so the hot path reads the gradient once).
    pub fn arrange_gradients<'a>(
        &self,
        named: impl IntoIterator<Item = (&'a str, &'a [usize], &'a [u8])>,
    ) -> Result<Vec<&'a [u8]>, ShardError> {
        let expected: Vec<(&str, &[usize])> = self
            .specs
            .iter()
            .map(|s| (s.name.as_str(), s.shape.as_slice()))
            .collect();
        self.order_in(&expected, named)
    }

    /// `NonFinite` for the first NaN or infinity in `bytes` (model order,
    /// as [`Shard::arrange_gradients`] returns them).
    pub(super) fn check_finite(&self, bytes: &[&[u8]]) -> Result<(), ShardError> {
        non_finite(
            self.specs
                .iter()
                .map(|s| s.name.as_str())
                .zip(bytes.iter().copied()),
        )
    }

    /// The checks behind [`Shard::arrange_gradients`] and
    /// [`Shard::arrange_slots`]: each `(name, shape)` of `expected` (the
    /// variables, or their slots) once, with its shape; the bytes come back
    /// in `expected`'s order.
    fn order_in<'a>(
        &self,
        expected: &[(&str, &[usize])],
        items: impl IntoIterator<Item = (&'a str, &'a [usize], &'a [u8])>,
    ) -> Result<Vec<&'a [u8]>, ShardError> {
        let mut out: Vec<Option<&[u8]>> = vec![None; expected.len()];
        for (name, shape, data) in items {
            let Some(i) = expected.iter().position(|s| s.0 == name) else {
                return Err(ShardError::UnknownVariable {
                    ps: self.ps,
                    name: name.to_owned(),
                    held: expected.iter().map(|s| s.0.to_owned()).collect(),
                });
            };
            if shape != expected[i].1 || data.len() != 4 * shape.iter().product::<usize>() {
                return Err(ShardError::Shape {
                    name: name.to_owned(),
                    expected: expected[i].1.to_vec(),
                    got: shape.to_vec(),
                });
            }
            if out[i].is_some() {
                return Err(ShardError::Duplicate {
                    name: name.to_owned(),
                });
            }
            out[i] = Some(data);
        }
        out.into_iter()
            .zip(expected)
            .map(|(a, s)| {
                a.ok_or_else(|| ShardError::Missing {
                    ps: self.ps,
                    name: s.0.to_owned(),
                })
            })
            .collect()
    }

    /// Sets every variable (and shadow; `None`: shadows start at the values;
    /// and slots, from [`Shard::arrange_slots`]; `None`: fresh slots) and the
    /// step. Returns false, changing nothing, when already initialized and
    /// not `force`d.
    pub fn initialize(
        &mut self,
        values: Vec<ArrayD<f32>>,
        shadows: Option<Vec<ArrayD<f32>>>,
        slots: Option<Slots>,
        step: u64,
        force: bool,
    ) -> bool {
        if self.values.is_some() && !force {
            return false;
        }
        self.slots = slots.unwrap_or_else(|| self.fresh_slots());
        self.shadows = shadows.unwrap_or_else(|| values.clone());
        self.values = Some(values);
        self.step = step;
        self.clear_pending();
        true
    }

    fn clear_pending(&mut self) {
        self.pending.workers.clear();
        for s in &mut self.pending.sum {
            s.fill(0.0);
        }
    }
}

/// The f32 in four little-endian bytes (`b.len() == 4`).
#[inline(always)]
fn le_f32(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// `NonFinite` for the first NaN or infinity among `(name, f32 bytes)`.
fn non_finite<'a>(named: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Result<(), ShardError> {
    for (name, b) in named {
        if let Some(index) = first_non_finite(b) {
            return Err(ShardError::NonFinite {
                name: name.to_owned(),
                index,
            });
        }
    }
    Ok(())
}

/// Flat index of the first NaN or infinity in little-endian f32 bytes.
///
/// The common case, all finite, is one branch-free pass on the exponent bits
/// (vectorized); only a bad tensor is scanned again for the index.
fn first_non_finite(data: &[u8]) -> Option<usize> {
    const EXP: u32 = 0x7f80_0000;
    let bad = data.chunks_exact(4).fold(0u32, |acc, b| {
        acc | u32::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & EXP == EXP)
    });
    if bad == 0 {
        return None;
    }
    data.chunks_exact(4).position(|b| !le_f32(b).is_finite())
}

#[cfg(test)]
mod tests;
