//! One ps task's shard: its variables, their EMA shadows, their optimizer
//! slots, the step counter, and the rules for applying pushes (async) or
//! aggregating them (sync).
//! Pure state, no I/O: the service in [`super`] wraps it in a mutex, which is
//! what makes every push atomic for the shard.

use crate::model::{self, VarSpec};
use crate::optimizer::{self, Optimizer};
use crate::rpc::{Dims, Short};
use ndarray::{ArrayD, IxDyn};
use std::collections::BTreeSet;

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
    #[error("{0}")]
    NonSlot(String),
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
        crate::rpc::status(code, e)
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
            },
            scratch,
            counters: Counters::default(),
            last_loss: f32::NAN,
            last_step: u64::MAX,
        }
    }

    /// The step no update goes past (`train.last_step`, live: a reload may move it).
    pub fn set_last_step(&mut self, last_step: u64) {
        self.last_step = last_step;
    }

    pub fn specs(&self) -> &[VarSpec] {
        &self.specs
    }
    pub fn is_initialized(&self) -> bool {
        self.values.is_some()
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
        let bytes = self.order_in(
            &expected,
            named
                .into_iter()
                .map(|(n, shape, data)| (n, shape, data, data)),
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
                    optimizer::check_non_slot(&spec.name, v).map_err(ShardError::NonSlot)?;
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
        self.order(
            named
                .into_iter()
                .map(|(n, shape, data)| (n, shape, data, data)),
        )
    }

    /// The checks behind [`Shard::arrange_bytes`]:
    /// each item is `(name, shape, f32 bytes, payload)`; the payloads come
    /// back in model order.
    fn order<'a, T>(
        &self,
        items: impl IntoIterator<Item = (&'a str, &'a [usize], &'a [u8], T)>,
    ) -> Result<Vec<T>, ShardError> {
        let expected: Vec<(&str, &[usize])> = self
            .specs
            .iter()
            .map(|s| (s.name.as_str(), s.shape.as_slice()))
            .collect();
        self.order_in(&expected, items)
    }

    /// [`Shard::order`] against any list of `(name, shape)`: the variables,
    /// or their slots.
    fn order_in<'a, T>(
        &self,
        expected: &[(&str, &[usize])],
        items: impl IntoIterator<Item = (&'a str, &'a [usize], &'a [u8], T)>,
    ) -> Result<Vec<T>, ShardError> {
        let mut out: Vec<Option<T>> = (0..expected.len()).map(|_| None).collect();
        for (name, shape, data, payload) in items {
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
            if let Some(index) = first_non_finite(data) {
                return Err(ShardError::NonFinite {
                    name: name.to_owned(),
                    index,
                });
            }
            if out[i].is_some() {
                return Err(ShardError::Duplicate {
                    name: name.to_owned(),
                });
            }
            out[i] = Some(payload);
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

    /// [`Shard::push_bytes`] from arrays, for the tests below.
    #[cfg(test)]
    fn push(
        &mut self,
        grads: Vec<ArrayD<f32>>,
        lr: f32,
        step: u64,
        worker: u32,
        loss: f32,
    ) -> Result<Pushed, ShardError> {
        let bytes: Vec<&[u8]> = grads
            .iter()
            .map(|g| {
                bytemuck::cast_slice(g.as_slice().expect("arrays built by dtf are contiguous"))
            })
            .collect();
        self.push_bytes(&bytes, lr, step, worker, loss)
    }

    /// Applies (async) or aggregates (sync) a gradient computed at `step` by
    /// `worker`, from little-endian f32 bytes as [`Shard::arrange_bytes`]
    /// returns them: the ps applies a request's gradients without copying them.
    pub fn push_bytes(
        &mut self,
        grads: &[&[u8]],
        lr: f32,
        step: u64,
        worker: u32,
        loss: f32,
    ) -> Result<Pushed, ShardError> {
        if !(lr.is_finite() && lr > 0.0) {
            return Err(ShardError::LearningRate(lr));
        }
        self.values()?;
        // Every update adds one to the step, so at `last_step` none is applied.
        if self.step >= self.last_step {
            return Ok(Pushed::AtLastStep);
        }
        if loss.is_finite() {
            self.last_loss = loss;
        }
        match self.rule {
            Rule::Async => {
                self.apply(grads, lr, step, 1.0)?;
                self.counters.pushes_applied += 1;
                Ok(Pushed::Applied)
            }
            Rule::Sync { replicas, total } => {
                if worker as usize >= total {
                    return Err(ShardError::UnknownWorker { worker, total });
                }
                if step < self.step {
                    self.counters.stale_gradients += 1;
                    return Ok(Pushed::Stale);
                }
                if step > self.step {
                    return Err(ShardError::FutureStep {
                        ps: self.ps,
                        step,
                        current: self.step,
                    });
                }
                if self.pending.workers.contains(&worker) {
                    return Err(ShardError::DuplicatePush { worker, step });
                }
                self.pending.workers.insert(worker);
                for (s, g) in self.pending.sum.iter_mut().zip(grads) {
                    let s = s
                        .as_slice_mut()
                        .expect("arrays built by dtf are contiguous");
                    for (s, g) in s.iter_mut().zip(g.chunks_exact(4)) {
                        *s += le_f32(g);
                    }
                }
                if self.pending.workers.len() < replicas {
                    return Ok(Pushed::Pending);
                }
                let sum = std::mem::take(&mut self.pending.sum);
                let bytes: Vec<&[u8]> = sum
                    .iter()
                    .map(|g| {
                        bytemuck::cast_slice(
                            g.as_slice().expect("arrays built by dtf are contiguous"),
                        )
                    })
                    .collect();
                let applied = self.apply(&bytes, lr, step, 1.0 / replicas as f32);
                self.pending.sum = sum;
                if applied.is_err() {
                    // The sum cannot be taken apart again: the step's
                    // gradients are dropped and its replicas push anew.
                    self.clear_pending();
                }
                applied?;
                self.counters.updates_applied += 1;
                self.counters.gradients_aggregated += replicas as u64;
                self.clear_pending();
                Ok(Pushed::Applied)
            }
        }
    }

    /// The optimizer's update of every variable and its slots with
    /// `scale · g` (SGD: `w -= lr · scale · g`), then the EMA step, then
    /// `step += 1` (and Adam's powers `*= beta`), reading `g` as
    /// little-endian f32 bytes (unaligned is fine: they come straight from
    /// the request).
    ///
    /// Computed into `scratch`, then swapped in only when every new value,
    /// shadow and slot is finite: finite inputs can still overflow (lr 3e38).
    ///
    /// Errors: [`ShardError::Overflow`] naming the first variable that
    /// would become non-finite; nothing changed.
    fn apply(&mut self, grads: &[&[u8]], lr: f32, step: u64, scale: f32) -> Result<(), ShardError> {
        const EXP: u32 = 0x7f80_0000;
        let decay = model::ema_decay(self.ema, step);
        let values = self.values.as_mut().expect("checked by caller");
        let (k, rate) = (lr * scale, 1.0 - decay);
        let (new_w, new_s) = &mut self.scratch;
        let opt = self.optimizer;
        // Adam's step size from this shard's powers, once per update as
        // TensorFlow computes it.
        let alpha = match self.slots.non_slots.as_slice() {
            [beta1_power, beta2_power] => optimizer::adam_alpha(lr, *beta1_power, *beta2_power),
            _ => 0.0,
        };
        let contiguous = "arrays built by dtf are contiguous";
        for i in 0..values.len() {
            let (w, s, g) = (
                values[i].as_slice().expect(contiguous),
                self.shadows[i].as_slice().expect(contiguous),
                grads[i],
            );
            let (nw, ns) = (
                new_w[i].as_slice_mut().expect(contiguous),
                new_s[i].as_slice_mut().expect(contiguous),
            );
            let (slots, next) = (&self.slots.per_var[i], &mut self.scratch_slots[i]);
            let bad = match opt {
                Optimizer::Sgd => {
                    // Plain slices and a branch-free check on the exponent
                    // bits: one vectorized pass over the five arrays.
                    let mut bad = 0u32;
                    let lanes = w
                        .iter()
                        .zip(s)
                        .zip(g.chunks_exact(4))
                        .zip(nw.iter_mut().zip(ns));
                    for (((w, s), g), (nw, ns)) in lanes {
                        let w2 = w - k * le_f32(g);
                        let s2 = model::ema_step(*s, w2, rate);
                        *nw = w2;
                        *ns = s2;
                        bad |= u32::from(w2.to_bits() & EXP == EXP)
                            | u32::from(s2.to_bits() & EXP == EXP);
                    }
                    bad != 0
                }
                Optimizer::Momentum {
                    momentum,
                    use_nesterov,
                } => lanes::<1>(w, s, g, slots, next, nw, ns, rate, |w, g, [a]| {
                    let (w, a) = optimizer::momentum(w, g * scale, a, lr, momentum, use_nesterov);
                    (w, [a])
                }),
                Optimizer::Adam {
                    beta1,
                    beta2,
                    epsilon,
                } => lanes::<2>(w, s, g, slots, next, nw, ns, rate, |w, g, [m, v]| {
                    let (w, m, v) =
                        optimizer::adam(w, g * scale, m, v, alpha, beta1, beta2, epsilon);
                    (w, [m, v])
                }),
                Optimizer::Adagrad { .. } => {
                    lanes::<1>(w, s, g, slots, next, nw, ns, rate, |w, g, [a]| {
                        let (w, a) = optimizer::adagrad(w, g * scale, a, lr);
                        (w, [a])
                    })
                }
            };
            if bad {
                return Err(ShardError::Overflow {
                    lr,
                    name: self.specs[i].name.clone(),
                });
            }
        }
        std::mem::swap(values, new_w);
        std::mem::swap(&mut self.shadows, new_s);
        std::mem::swap(&mut self.slots.per_var, &mut self.scratch_slots);
        // TensorFlow's `_finish`: the powers advance once per update.
        if let (Optimizer::Adam { beta1, beta2, .. }, [p1, p2]) =
            (opt, self.slots.non_slots.as_mut_slice())
        {
            *p1 *= beta1;
            *p2 *= beta2;
        }
        self.step += 1;
        Ok(())
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

/// One pass over a variable for a rule with `K` slots: `rule(w, g, slots)`
/// gives the new value and slots, then the EMA step; new values go to `nw`,
/// `ns` and `next`. Returns whether any new value is NaN or infinite.
///
/// Everything is resliced to one length first, so the loop has no bounds
/// checks left in it and the closure inlines into one pass.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn lanes<const K: usize>(
    w: &[f32],
    s: &[f32],
    g: &[u8],
    slots: &[ArrayD<f32>],
    next: &mut [ArrayD<f32>],
    nw: &mut [f32],
    ns: &mut [f32],
    rate: f32,
    rule: impl Fn(f32, f32, [f32; K]) -> (f32, [f32; K]),
) -> bool {
    const EXP: u32 = 0x7f80_0000;
    let contiguous = "arrays built by dtf are contiguous";
    let n = w.len();
    let (s, g, nw, ns) = (&s[..n], &g[..4 * n], &mut nw[..n], &mut ns[..n]);
    let slots: [&[f32]; K] = std::array::from_fn(|k| &slots[k].as_slice().expect(contiguous)[..n]);
    let mut outs = next.iter_mut();
    let next: [&mut [f32]; K] = std::array::from_fn(|_| {
        let out = outs.next().expect("one scratch array per slot");
        &mut out.as_slice_mut().expect(contiguous)[..n]
    });
    let mut bad = 0u32;
    for j in 0..n {
        let (w2, slots2) = rule(
            w[j],
            le_f32(&g[4 * j..4 * j + 4]),
            std::array::from_fn(|k| slots[k][j]),
        );
        let s2 = model::ema_step(s[j], w2, rate);
        nw[j] = w2;
        ns[j] = s2;
        bad |= u32::from(w2.to_bits() & EXP == EXP) | u32::from(s2.to_bits() & EXP == EXP);
        for k in 0..K {
            next[k][j] = slots2[k];
            bad |= u32::from(slots2[k].to_bits() & EXP == EXP);
        }
    }
    bad != 0
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
mod tests {
    use super::*;

    fn shard(rule: Rule) -> Shard {
        let specs = vec![VarSpec {
            name: "w".into(),
            shape: vec![2],
        }];
        let mut s = Shard::new(0, specs, rule, 0.99, Optimizer::Sgd);
        assert!(s.initialize(vec![ArrayD::zeros(IxDyn(&[2]))], None, None, 0, false));
        s
    }

    /// A one-variable shard (`w = [1, 1]`) applying `optimizer`.
    fn shard_with(rule: Rule, optimizer: Optimizer) -> Shard {
        let specs = vec![VarSpec {
            name: "w".into(),
            shape: vec![2],
        }];
        let mut s = Shard::new(0, specs, rule, 0.99, optimizer);
        assert!(s.initialize(g(1., 1.), None, None, 0, false));
        s
    }

    fn w(s: &Shard) -> Vec<f32> {
        s.values().unwrap()[0].as_slice().unwrap().to_vec()
    }

    fn slot(s: &Shard, k: usize) -> Vec<f32> {
        s.slots().unwrap().per_var[0][k]
            .as_slice()
            .unwrap()
            .to_vec()
    }

    fn near(got: &[f32], want: &[f64]) {
        for (a, b) in got.iter().zip(want) {
            assert!(
                (f64::from(*a) - b).abs() <= 1e-6 * b.abs().max(1e-3),
                "{got:?} vs {want:?}"
            );
        }
    }

    const ADAM: Optimizer = Optimizer::Adam {
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
    };

    /// β1 and β2 as f32, as the shard (and TensorFlow) hold them.
    const B1: f64 = 0.9f32 as f64;
    const B2: f64 = 0.999f32 as f64;

    #[test]
    fn adam_in_the_shard_corrects_bias_and_advances_the_powers() {
        let mut s = shard_with(Rule::Async, ADAM);
        assert_eq!(s.slots().unwrap().non_slots, vec![0.9, 0.999]);
        assert_eq!(s.push(g(0.5, -2.), 0.001, 0, 0, 1.0), Ok(Pushed::Applied));
        // Step 1: m̂ = g, v̂ = g², so w moves by lr·sign(g) (to ε).
        near(&w(&s), &[1.0 - 0.001, 1.0 + 0.001]);
        near(&slot(&s, 0), &[0.5 * (1.0 - B1), -2.0 * (1.0 - B1)]);
        near(&slot(&s, 1), &[0.25 * (1.0 - B2), 4.0 * (1.0 - B2)]);
        near(&s.slots().unwrap().non_slots, &[B1 * B1, B2 * B2]);
        // Step 2, by hand, g = 1: m = m1 + (1 − m1)(1 − β1),
        // v = v1 + (1 − v1)(1 − β2), α = lr·√(1 − β2²)/(1 − β1²).
        assert_eq!(s.push(g(1., 1.), 0.001, 1, 0, 1.0), Ok(Pushed::Applied));
        let (m1, v1) = (0.5 * (1.0 - B1), 0.25 * (1.0 - B2));
        let a1 = 0.001 * (1.0 - B2).sqrt() / (1.0 - B1);
        let w1 = 1.0 - m1 * a1 / (v1.sqrt() + 1e-8);
        let (m2, v2) = (m1 + (1.0 - m1) * (1.0 - B1), v1 + (1.0 - v1) * (1.0 - B2));
        let a2 = 0.001 * (1.0 - B2 * B2).sqrt() / (1.0 - B1 * B1);
        near(&w(&s)[..1], &[w1 - m2 * a2 / (v2.sqrt() + 1e-8)]);
        near(&slot(&s, 0)[..1], &[m2]);
        near(&slot(&s, 1)[..1], &[v2]);
    }

    #[test]
    fn momentum_and_adagrad_in_the_shard() {
        let mut s = shard_with(
            Rule::Async,
            Optimizer::Momentum {
                momentum: 0.9,
                use_nesterov: false,
            },
        );
        s.push(g(0.5, 0.), 0.1, 0, 0, 1.0).unwrap();
        s.push(g(-1., 0.), 0.1, 1, 0, 1.0).unwrap();
        // accum: 0.5, then −0.55; w: 0.95, then 1.005.
        near(&slot(&s, 0), &[-0.55, 0.0]);
        near(&w(&s), &[1.005, 1.0]);
        let mut s = shard_with(
            Rule::Async,
            Optimizer::Adagrad {
                initial_accumulator_value: 0.1,
            },
        );
        assert_eq!(slot(&s, 0), [0.1, 0.1]);
        s.push(g(0.5, 0.), 0.1, 0, 0, 1.0).unwrap();
        near(&slot(&s, 0), &[0.35, 0.1]);
        near(&w(&s), &[1.0 - 0.05 / 0.35f64.sqrt(), 1.0]);
    }

    #[test]
    fn sync_adam_applies_the_average_once_per_step() {
        let mut s = shard_with(
            Rule::Sync {
                replicas: 2,
                total: 2,
            },
            ADAM,
        );
        assert_eq!(s.push(g(0.2, 1.), 0.001, 0, 0, 1.0), Ok(Pushed::Pending));
        assert_eq!(slot(&s, 0), [0.0, 0.0], "nothing applied before the step");
        assert_eq!(s.push(g(0.8, 1.), 0.001, 0, 1, 1.0), Ok(Pushed::Applied));
        // The average gradient is [0.5, 1]: m = (1 − β1)·g, powers advanced once.
        near(&slot(&s, 0), &[0.5 * (1.0 - B1), 1.0 - B1]);
        near(&s.slots().unwrap().non_slots, &[B1 * B1, B2 * B2]);
        near(&w(&s), &[1.0 - 0.001, 1.0 - 0.001]);
        assert_eq!(s.step(), 1);
    }

    #[test]
    fn slots_round_trip_through_arrange_and_initialize() {
        let mut s = shard_with(Rule::Async, ADAM);
        s.push(g(0.5, -2.), 0.001, 0, 0, 1.0).unwrap();
        let before = s.slots().unwrap().clone();
        let bytes =
            |a: &ArrayD<f32>| bytemuck::cast_slice::<f32, u8>(a.as_slice().unwrap()).to_vec();
        let (m, v) = (bytes(&before.per_var[0][0]), bytes(&before.per_var[0][1]));
        let (p1, p2) = (
            before.non_slots[0].to_le_bytes(),
            before.non_slots[1].to_le_bytes(),
        );
        let two: &[usize] = &[2];
        let scalar: &[usize] = &[];
        let named = vec![
            ("w/Adam_1", two, &v[..]),
            ("w/Adam", two, &m[..]),
            ("beta2_power", scalar, &p2[..]),
            ("beta1_power", scalar, &p1[..]),
        ];
        let slots = s.arrange_slots(named.clone()).unwrap();
        assert_eq!(slots, before);
        let mut fresh = shard_with(Rule::Async, ADAM);
        assert!(fresh.initialize(g(1., 1.), None, Some(slots), 1, true));
        assert_eq!(fresh.slots().unwrap(), &before);
        // Every slot is required, and a power must be usable.
        assert!(matches!(
            s.arrange_slots(named[..3].to_vec()),
            Err(ShardError::Missing { .. })
        ));
        let one = 1f32.to_le_bytes();
        let mut bad = named.clone();
        bad[3] = ("beta1_power", scalar, &one[..]);
        assert!(matches!(s.arrange_slots(bad), Err(ShardError::NonSlot(_))));
    }

    #[test]
    fn an_overflowing_slot_is_refused_and_changes_nothing() {
        let mut s = shard_with(
            Rule::Async,
            Optimizer::Adagrad {
                initial_accumulator_value: 0.1,
            },
        );
        let before = s.slots().unwrap().clone();
        // g² overflows the accumulator although w itself would stay finite.
        assert!(matches!(
            s.push(g(3e30, 0.), 0.1, 0, 0, 1.0),
            Err(ShardError::Overflow { .. })
        ));
        assert_eq!(s.slots().unwrap(), &before);
        assert_eq!(w(&s), [1.0, 1.0]);
    }

    fn g(a: f32, b: f32) -> Vec<ArrayD<f32>> {
        vec![ArrayD::from_shape_vec(IxDyn(&[2]), vec![a, b]).unwrap()]
    }

    #[test]
    fn async_applies_each_push() {
        let mut s = shard(Rule::Async);
        assert_eq!(s.push(g(1., 2.), 0.5, 0, 0, 1.0), Ok(Pushed::Applied));
        assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-0.5, -1.0]);
        assert_eq!(s.step(), 1);
        // EMA at step 0: decay min(0.99, 1/10) = 0.1, shadow = 0.1·0 + 0.9·w.
        let sh = s.shadows().unwrap()[0].as_slice().unwrap().to_vec();
        assert!((sh[0] - (-0.45)).abs() < 1e-6, "{sh:?}");
    }

    #[test]
    fn sync_averages_drops_stale_and_refuses_duplicates() {
        let mut s = shard(Rule::Sync {
            replicas: 2,
            total: 3,
        });
        assert_eq!(s.push(g(1., 1.), 1.0, 0, 0, 1.0), Ok(Pushed::Pending));
        assert_eq!(
            s.push(g(9., 9.), 1.0, 0, 0, 1.0),
            Err(ShardError::DuplicatePush { worker: 0, step: 0 })
        );
        assert_eq!(s.step(), 0);
        assert_eq!(s.push(g(3., 5.), 1.0, 0, 1, 1.0), Ok(Pushed::Applied));
        assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-2.0, -3.0]);
        assert_eq!(s.step(), 1);
        // The backup replica's gradient for step 0 arrives late.
        assert_eq!(s.push(g(100., 100.), 1.0, 0, 2, 1.0), Ok(Pushed::Stale));
        assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-2.0, -3.0]);
        assert_eq!(
            s.push(g(1., 1.), 1.0, 5, 2, 1.0),
            Err(ShardError::FutureStep {
                ps: 0,
                step: 5,
                current: 1
            })
        );
        assert_eq!(
            s.push(g(1., 1.), 1.0, 1, 3, 1.0),
            Err(ShardError::UnknownWorker {
                worker: 3,
                total: 3
            })
        );
        let c = s.counters();
        assert_eq!(
            (c.updates_applied, c.gradients_aggregated, c.stale_gradients),
            (1, 2, 1)
        );
    }

    #[test]
    fn arrange_checks_names_shapes_and_values() {
        let s = shard(Rule::Async);
        type Item = (&'static str, Vec<usize>, Vec<u8>);
        let t = |n: &'static str, v: &[f32]| -> Item {
            (
                n,
                vec![v.len()],
                bytemuck::cast_slice::<f32, u8>(v).to_vec(),
            )
        };
        let arrange = |items: &[Item]| {
            s.arrange_bytes(
                items
                    .iter()
                    .map(|(n, shape, d)| (*n, shape.as_slice(), d.as_slice())),
            )
            .map(|_| ())
        };
        assert!(matches!(
            arrange(&[t("x", &[1., 2.])]),
            Err(ShardError::UnknownVariable { .. })
        ));
        assert!(matches!(
            arrange(&[t("w", &[1.])]),
            Err(ShardError::Shape { .. })
        ));
        assert!(matches!(
            arrange(&[t("w", &[1., f32::NAN])]),
            Err(ShardError::NonFinite { index: 1, .. })
        ));
        assert!(matches!(arrange(&[]), Err(ShardError::Missing { .. })));
        assert!(matches!(
            arrange(&[t("w", &[1., 2.]), t("w", &[1., 2.])]),
            Err(ShardError::Duplicate { .. })
        ));
        assert!(arrange(&[t("w", &[1., 2.])]).is_ok());
    }

    #[test]
    fn arrange_bytes_checks_like_arrange_and_push_bytes_applies() {
        let mut s = shard(Rule::Async);
        let bytes = |v: &[f32]| bytemuck::cast_slice::<f32, u8>(v).to_vec();
        let (ok, nan, inf) = (
            bytes(&[1., 2.]),
            bytes(&[1., f32::NAN]),
            bytes(&[f32::NEG_INFINITY, 0.]),
        );
        let two: &[usize] = &[2];
        assert!(matches!(
            s.arrange_bytes([("x", two, &ok[..])]),
            Err(ShardError::UnknownVariable { .. })
        ));
        assert!(matches!(
            s.arrange_bytes([("w", &[1usize][..], &ok[..4])]),
            Err(ShardError::Shape { .. })
        ));
        assert!(matches!(
            s.arrange_bytes([("w", two, &nan[..])]),
            Err(ShardError::NonFinite { index: 1, .. })
        ));
        assert!(matches!(
            s.arrange_bytes([("w", two, &inf[..])]),
            Err(ShardError::NonFinite { index: 0, .. })
        ));
        assert!(matches!(
            s.arrange_bytes([]),
            Err(ShardError::Missing { .. })
        ));
        assert!(matches!(
            s.arrange_bytes([("w", two, &ok[..]), ("w", two, &ok[..])]),
            Err(ShardError::Duplicate { .. })
        ));
        // Unaligned bytes, as they may sit in a request.
        let mut buf = vec![0u8];
        buf.extend_from_slice(&ok);
        let grads = s.arrange_bytes([("w", two, &buf[1..])]).unwrap();
        assert_eq!(s.push_bytes(&grads, 0.5, 0, 0, 1.0), Ok(Pushed::Applied));
        assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-0.5, -1.0]);
    }

    #[test]
    fn an_update_that_would_overflow_is_refused_and_changes_nothing() {
        let mut s = shard(Rule::Async);
        assert_eq!(s.push(g(1., 2.), 0.5, 0, 0, 1.0), Ok(Pushed::Applied));
        let before = (s.values().unwrap().to_vec(), s.shadows().unwrap().to_vec());
        // Finite lr and gradient, but lr · g is -inf for the second element.
        let err = s.push(g(0., 3.), 3e38, 1, 0, 1.0).unwrap_err();
        assert_eq!(
            err,
            ShardError::Overflow {
                lr: 3e38,
                name: "w".into()
            }
        );
        assert!(err.to_string().contains("3e38"), "{err}");
        assert_eq!(s.values().unwrap(), &before.0[..]);
        assert_eq!(s.shadows().unwrap(), &before.1[..]);
        assert_eq!(s.step(), 1);
        for lr in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(matches!(
                s.push(g(1., 1.), lr, 1, 0, 1.0),
                Err(ShardError::LearningRate(_))
            ));
        }
        assert_eq!(s.values().unwrap(), &before.0[..]);
        // The shard still takes a sane update.
        assert_eq!(s.push(g(1., 1.), 0.5, 1, 0, 1.0), Ok(Pushed::Applied));
        assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-1.0, -1.5]);
    }

    #[test]
    fn sync_overflow_drops_the_step_aggregate() {
        let mut s = shard(Rule::Sync {
            replicas: 2,
            total: 2,
        });
        assert_eq!(s.push(g(3e38, 0.), 1.0, 0, 0, 1.0), Ok(Pushed::Pending));
        // The sum of two finite gradients overflows.
        assert!(matches!(
            s.push(g(3e38, 0.), 1.0, 0, 1, 1.0),
            Err(ShardError::Overflow { .. })
        ));
        assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[0.0, 0.0]);
        assert_eq!(s.step(), 0);
        // Both replicas may push the step again.
        assert_eq!(s.push(g(1., 1.), 1.0, 0, 0, 1.0), Ok(Pushed::Pending));
        assert_eq!(s.push(g(3., 5.), 1.0, 0, 1, 1.0), Ok(Pushed::Applied));
        assert_eq!(s.values().unwrap()[0].as_slice().unwrap(), &[-2.0, -3.0]);
    }

    #[test]
    fn no_push_takes_the_step_past_last_step() {
        let mut s = shard(Rule::Async);
        s.set_last_step(2);
        assert_eq!(s.push(g(1., 1.), 1.0, 0, 0, 1.0), Ok(Pushed::Applied));
        assert_eq!(s.push(g(1., 1.), 1.0, 0, 1, 1.0), Ok(Pushed::Applied));
        let at_two = s.values().unwrap().to_vec();
        // Two workers that read step 1 both push; the second is not applied.
        assert_eq!(s.push(g(1., 1.), 1.0, 1, 0, 1.0), Ok(Pushed::AtLastStep));
        assert_eq!((s.step(), s.values().unwrap()), (2, &at_two[..]));
        assert_eq!(s.counters().pushes_applied, 2);
        // A reload that raises last_step lets training go on.
        s.set_last_step(3);
        assert_eq!(s.push(g(1., 1.), 1.0, 2, 0, 1.0), Ok(Pushed::Applied));
        assert_eq!(s.step(), 3);

        let mut s = shard(Rule::Sync {
            replicas: 1,
            total: 2,
        });
        s.set_last_step(1);
        assert_eq!(s.push(g(1., 1.), 1.0, 0, 0, 1.0), Ok(Pushed::Applied));
        assert_eq!(s.push(g(1., 1.), 1.0, 1, 1, 1.0), Ok(Pushed::AtLastStep));
        assert_eq!((s.step(), s.counters().updates_applied), (1, 1));
    }

    #[test]
    fn initialize_does_not_clobber_unless_forced() {
        let mut s = shard(Rule::Async);
        assert!(!s.initialize(g(5., 5.), None, None, 9, false));
        assert_eq!(s.step(), 0);
        assert!(s.initialize(g(5., 5.), None, None, 9, true));
        assert_eq!(s.step(), 9);
    }
}
