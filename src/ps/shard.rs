//! One ps task's shard: its variables, their EMA shadows, the step counter,
//! and the rules for applying pushes (async) or aggregating them (sync).
//! Pure state, no I/O: the service in [`super`] wraps it in a mutex, which is
//! what makes every push atomic for the shard.

use crate::model::{self, VarSpec};
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
            | UnknownWorker { .. } => Code::InvalidArgument,
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
    pub fn new(ps: usize, specs: Vec<VarSpec>, rule: Rule, moving_average_decay: f32) -> Self {
        let zeros = || -> Vec<ArrayD<f32>> {
            specs
                .iter()
                .map(|s| ArrayD::zeros(IxDyn(&s.shape)))
                .collect()
        };
        let (sum, scratch) = (zeros(), (zeros(), zeros()));
        Self {
            ps,
            specs,
            values: None,
            shadows: Vec::new(),
            step: 0,
            complete: false,
            rule,
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
        let mut out: Vec<Option<T>> = (0..self.specs.len()).map(|_| None).collect();
        for (name, shape, data, payload) in items {
            let Some(i) = self.specs.iter().position(|s| s.name == name) else {
                return Err(ShardError::UnknownVariable {
                    ps: self.ps,
                    name: name.to_owned(),
                    held: self.specs.iter().map(|s| s.name.clone()).collect(),
                });
            };
            if shape != self.specs[i].shape.as_slice()
                || data.len() != 4 * shape.iter().product::<usize>()
            {
                return Err(ShardError::Shape {
                    name: name.to_owned(),
                    expected: self.specs[i].shape.clone(),
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
            .zip(&self.specs)
            .map(|(a, s)| {
                a.ok_or_else(|| ShardError::Missing {
                    ps: self.ps,
                    name: s.name.clone(),
                })
            })
            .collect()
    }

    /// Sets every variable (and shadow; `None`: shadows start at the values)
    /// and the step. Returns false, changing nothing, when already initialized
    /// and not `force`d.
    pub fn initialize(
        &mut self,
        values: Vec<ArrayD<f32>>,
        shadows: Option<Vec<ArrayD<f32>>>,
        step: u64,
        force: bool,
    ) -> bool {
        if self.values.is_some() && !force {
            return false;
        }
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

    /// `w -= lr · scale · g`, then the EMA step, then `step += 1`, reading
    /// `g` as little-endian f32 bytes (unaligned is fine: they come
    /// straight from the request).
    ///
    /// Computed into `scratch`, then swapped in only when every new value
    /// and shadow is finite: finite inputs can still overflow (lr 3e38).
    ///
    /// Errors: [`ShardError::Overflow`] naming the first variable that
    /// would become non-finite; nothing changed.
    fn apply(&mut self, grads: &[&[u8]], lr: f32, step: u64, scale: f32) -> Result<(), ShardError> {
        const EXP: u32 = 0x7f80_0000;
        let decay = model::ema_decay(self.ema, step);
        let values = self.values.as_mut().expect("checked by caller");
        let (k, rate) = (lr * scale, 1.0 - decay);
        let (new_w, new_s) = &mut self.scratch;
        let arrays = values
            .iter()
            .zip(self.shadows.iter())
            .zip(grads)
            .zip(new_w.iter_mut().zip(new_s.iter_mut()));
        for (i, (((w, s), g), (nw, ns))) in arrays.enumerate() {
            let contiguous = "arrays built by dtf are contiguous";
            let (w, s) = (
                w.as_slice().expect(contiguous),
                s.as_slice().expect(contiguous),
            );
            let (nw, ns) = (
                nw.as_slice_mut().expect(contiguous),
                ns.as_slice_mut().expect(contiguous),
            );
            // Plain slices and a branch-free check on the exponent bits: one
            // vectorized pass over the five arrays.
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
                bad |= u32::from(w2.to_bits() & EXP == EXP) | u32::from(s2.to_bits() & EXP == EXP);
            }
            if bad != 0 {
                return Err(ShardError::Overflow {
                    lr,
                    name: self.specs[i].name.clone(),
                });
            }
        }
        std::mem::swap(values, new_w);
        std::mem::swap(&mut self.shadows, new_s);
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
        let mut s = Shard::new(0, specs, rule, 0.99);
        assert!(s.initialize(vec![ArrayD::zeros(IxDyn(&[2]))], None, 0, false));
        s
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
        assert!(!s.initialize(g(5., 5.), None, 9, false));
        assert_eq!(s.step(), 0);
        assert!(s.initialize(g(5., 5.), None, 9, true));
        assert_eq!(s.step(), 9);
    }
}
