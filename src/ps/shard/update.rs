//! How a push becomes an update: async pushes applied at once, sync ones
//! summed until the step has its replicas, and the optimizer's pass over
//! every variable, its EMA shadow and its slots.

use super::{Pushed, Rule, Shard, ShardError, le_f32};
use crate::kernel;
use crate::model;
use crate::optimizer::{self, Optimizer};

impl Shard {
    /// [`Shard::push_bytes`] from arrays, for the tests below.
    #[cfg(test)]
    pub(super) fn push(
        &mut self,
        grads: Vec<ndarray::ArrayD<f32>>,
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
    /// `worker`, from little-endian f32 bytes as [`Shard::arrange_gradients`]
    /// returns them: the ps applies a request's gradients without copying them.
    ///
    /// A NaN or infinite gradient is refused (`NonFinite`), changing nothing:
    /// async, the update's own check finds it (a non-finite gradient makes a
    /// non-finite value or slot, and nothing is swapped in), so the common
    /// case reads the gradient once; sync, before it enters the sum.
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
        match self.rule {
            Rule::Async => {
                self.apply(grads, lr, step, 1.0).map_err(|overflow| {
                    // Whose fault: a non-finite gradient, or the update.
                    self.check_finite(grads).err().unwrap_or(overflow)
                })?;
                self.counters.pushes_applied += 1;
                if loss.is_finite() {
                    self.last_loss = loss;
                }
                Ok(Pushed::Applied)
            }
            Rule::Sync { replicas, total } => {
                self.check_finite(grads)?;
                if loss.is_finite() {
                    self.last_loss = loss;
                }
                self.push_sync(grads, lr, step, worker, replicas, total)
            }
        }
    }

    /// The sync rule: counts `worker`'s gradient for the current step and,
    /// with the step's `replicas` gradients in, applies their average.
    fn push_sync(
        &mut self,
        grads: &[&[u8]],
        lr: f32,
        step: u64,
        worker: u32,
        replicas: usize,
        total: usize,
    ) -> Result<Pushed, ShardError> {
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
        self.pending.lr = lr;
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
        self.apply_pending()
    }

    /// Sync: the step's gradients a step waits for and the workers allowed
    /// to push change (the membership changed, `super::super::workers`). A
    /// step that already holds the new number of gradients is applied now,
    /// with the learning rate of its latest gradient: no step waits for a
    /// worker that left. Async: nothing to do.
    ///
    /// Returns whether a step was applied.
    ///
    /// Errors: as [`Shard::push_bytes`]'s update ([`ShardError::Overflow`]);
    /// the step's gradients are then dropped and its replicas push anew.
    pub fn set_sync(&mut self, replicas: usize, total: usize) -> Result<bool, ShardError> {
        let Rule::Sync { .. } = self.rule else {
            return Ok(false);
        };
        self.rule = Rule::Sync { replicas, total };
        let due = !self.pending.workers.is_empty()
            && self.pending.workers.len() >= replicas
            && self.values.is_some()
            && self.step < self.last_step;
        if !due {
            return Ok(false);
        }
        self.apply_pending().map(|p| p == Pushed::Applied)
    }

    /// Sync: applies the average of the step's gradients in `pending`.
    fn apply_pending(&mut self) -> Result<Pushed, ShardError> {
        let (lr, step) = (self.pending.lr, self.step);
        let replicas = self.pending.workers.len();
        let sum = std::mem::take(&mut self.pending.sum);
        let bytes: Vec<&[u8]> = sum
            .iter()
            .map(|g| {
                bytemuck::cast_slice(g.as_slice().expect("arrays built by dtf are contiguous"))
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
        let decay = model::ema_decay(self.ema, step);
        // Adam's step size from this shard's powers, once per update as
        // TensorFlow computes it.
        let alpha = match self.slots.non_slots.as_slice() {
            [beta1_power, beta2_power] => optimizer::adam_alpha(lr, *beta1_power, *beta2_power),
            _ => 0.0,
        };
        // SGD's `w -= lr · scale · g` as one product.
        let (k, rate) = (lr * scale, 1.0 - decay);
        let values = self.values.as_mut().expect("checked by caller");
        let contiguous = "arrays built by dtf are contiguous";
        let (new_w, new_s) = &mut self.scratch;
        let consts = Consts {
            optimizer: self.optimizer,
            lr,
            scale,
            k,
            alpha,
            rate,
        };
        // Jobs of at most `chunk` values: a range of one part, whose pass
        // reads and writes only that range of its arrays (every rule is
        // elementwise).
        let chunk = self.chunk.max(1);
        let mut jobs: Vec<Job<'_>> = Vec::new();
        let outs = (new_w.iter_mut().zip(new_s.iter_mut())).zip(self.scratch_slots.iter_mut());
        for (part, ((nw, ns), next)) in outs.enumerate() {
            let w = values[part].as_slice().expect(contiguous);
            let sh = self.shadows[part].as_slice().expect(contiguous);
            let slots: Vec<&[f32]> = self.slots.per_var[part]
                .iter()
                .map(|a| a.as_slice().expect(contiguous))
                .collect();
            let mut nw = nw.as_slice_mut().expect(contiguous);
            let mut ns = ns.as_slice_mut().expect(contiguous);
            let mut next: Vec<&mut [f32]> = next
                .iter_mut()
                .map(|a| a.as_slice_mut().expect(contiguous))
                .collect();
            for at in (0..w.len()).step_by(chunk) {
                let end = (at + chunk).min(w.len());
                let len = end - at;
                jobs.push(Job {
                    part,
                    w: &w[at..end],
                    sh: &sh[at..end],
                    g: &grads[part][4 * at..4 * end],
                    slots: slots.iter().map(|a| &a[at..end]).collect(),
                    nw: take(&mut nw, len),
                    ns: take(&mut ns, len),
                    next: next.iter_mut().map(|rest| take(rest, len)).collect(),
                });
            }
        }
        // One pass per rule, compiled for AVX-512 where the CPU has it
        // (the same IEEE operations lane by lane: the same bits).
        let run = |mut j: Job<'_>| {
            kernel::simd(
                #[inline(always)]
                || pass(&consts, j.w, j.sh, j.g, &j.slots, &mut j.next, j.nw, j.ns),
            )
        };
        // The jobs on the ps's cores at once; each value comes out the same
        // whichever thread computes it.
        let parts: Vec<usize> = jobs.iter().map(|j| j.part).collect();
        let mut bad = vec![false; jobs.len()];
        let mut each = jobs.into_iter().zip(bad.iter_mut());
        if self.chunk != usize::MAX {
            // The calling thread takes the first job itself.
            let first = each.next();
            rayon::in_place_scope(|s| {
                for (j, b) in each {
                    s.spawn(move |_| *b = run(j));
                }
                if let Some((j, b)) = first {
                    *b = run(j);
                }
            });
        } else {
            each.for_each(|(j, b)| *b = run(j));
        }
        if let Some(i) = bad.iter().position(|&b| b) {
            return Err(ShardError::Overflow {
                lr,
                name: self.specs[parts[i]].name.clone(),
            });
        }
        std::mem::swap(values, new_w);
        std::mem::swap(&mut self.shadows, new_s);
        std::mem::swap(&mut self.slots.per_var, &mut self.scratch_slots);
        // TensorFlow's `_finish`: the powers advance once per update.
        if let (Optimizer::Adam { beta1, beta2, .. }, [p1, p2]) =
            (self.optimizer, self.slots.non_slots.as_mut_slice())
        {
            *p1 *= beta1;
            *p2 *= beta2;
        }
        self.step += 1;
        Ok(())
    }
}

/// The first `len` values of `rest`, which keeps the others.
fn take<'a>(rest: &mut &'a mut [f32], len: usize) -> &'a mut [f32] {
    let (head, tail) = std::mem::take(rest).split_at_mut(len);
    *rest = tail;
    head
}

/// A range of one part's arrays, for an update's [`pass`].
struct Job<'a> {
    /// Which part (model order).
    part: usize,
    w: &'a [f32],
    sh: &'a [f32],
    g: &'a [u8],
    slots: Vec<&'a [f32]>,
    next: Vec<&'a mut [f32]>,
    nw: &'a mut [f32],
    ns: &'a mut [f32],
}

/// What an update's pass needs besides the arrays: the rule and the
/// step's scalars, computed once per update.
pub(super) struct Consts {
    /// The rule and its hyperparameters.
    pub optimizer: Optimizer,
    /// The learning rate.
    pub lr: f32,
    /// What the gradient is multiplied by (sync: `1/replicas`).
    pub scale: f32,
    /// SGD's `lr · scale`.
    pub k: f32,
    /// Adam's step size ([`optimizer::adam_alpha`]).
    pub alpha: f32,
    /// The EMA's `1 − decay`.
    pub rate: f32,
}

/// The optimizer's pass over one variable: `w`, its shadow `sh`, gradient
/// bytes `g` and `slots` in; `nw`, `ns`, `next` out. One loop per rule
/// (each [`lanes`] instance reads every input once), inlined all the way
/// so that [`kernel::simd`] compiles it for the vector width it dispatches to.
/// Returns whether any new value is NaN or infinite.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn pass(
    c: &Consts,
    w: &[f32],
    sh: &[f32],
    g: &[u8],
    slots: &[&[f32]],
    next: &mut [&mut [f32]],
    nw: &mut [f32],
    ns: &mut [f32],
) -> bool {
    let &Consts {
        optimizer,
        lr,
        scale,
        k,
        alpha,
        rate,
    } = c;
    match optimizer {
        Optimizer::Sgd => lanes::<0>(w, sh, g, slots, next, nw, ns, rate, |w, g, []| {
            (w - k * g, [])
        }),
        Optimizer::Momentum {
            momentum,
            use_nesterov,
        } => lanes::<1>(w, sh, g, slots, next, nw, ns, rate, |w, g, [a]| {
            let (w, a) = optimizer::momentum(w, g * scale, a, lr, momentum, use_nesterov);
            (w, [a])
        }),
        Optimizer::Adam {
            beta1,
            beta2,
            epsilon,
        } => lanes::<2>(w, sh, g, slots, next, nw, ns, rate, |w, g, [m, v]| {
            let (w, m, v) = optimizer::adam(w, g * scale, m, v, alpha, beta1, beta2, epsilon);
            (w, [m, v])
        }),
        Optimizer::Adagrad { .. } => {
            lanes::<1>(w, sh, g, slots, next, nw, ns, rate, |w, g, [a]| {
                let (w, a) = optimizer::adagrad(w, g * scale, a, lr);
                (w, [a])
            })
        }
    }
}

/// One pass over a variable for a rule with `K` slots: `rule(w, g, slots)`
/// gives the new value and slots, then the EMA step; new values go to `nw`,
/// `ns` and `next`. Returns whether any new value is NaN or infinite.
///
/// Everything is resliced to one length first, so the loop has no bounds
/// checks left in it and the closure inlines into one pass. The pass runs
/// in blocks of [`BLOCK`] elements computed into arrays on the stack, then
/// copied out: the compiler cannot prove that the slots' output slices
/// (taken from arrays in a list) do not overlap the inputs, and with that
/// many pointers it gave up vectorizing a loop that wrote them directly
/// (Adam ran at scalar speed, ~10× SGD); stores into locals need no such
/// proof, and the copies out are memcpys of data still in L1.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn lanes<const K: usize>(
    w: &[f32],
    s: &[f32],
    g: &[u8],
    slots: &[&[f32]],
    next: &mut [&mut [f32]],
    nw: &mut [f32],
    ns: &mut [f32],
    rate: f32,
    rule: impl Fn(f32, f32, [f32; K]) -> (f32, [f32; K]),
) -> bool {
    const EXP: u32 = 0x7f80_0000;
    let n = w.len();
    let (s, g, nw, ns) = (&s[..n], &g[..4 * n], &mut nw[..n], &mut ns[..n]);
    let slots: [&[f32]; K] = std::array::from_fn(|k| &slots[k][..n]);
    let mut outs = next.iter_mut();
    let next: [&mut [f32]; K] = std::array::from_fn(|_| {
        let out = outs.next().expect("one scratch array per slot");
        &mut out[..n]
    });
    let mut bad = 0u32;
    // Set once per pass, not per block: each block writes the first `len`
    // of each before reading them (zeroing them per block cost the ps ~15 %
    // of its CPU in memset under SGD).
    let (mut w2, mut s2, mut slots2) = ([0.0f32; BLOCK], [0.0f32; BLOCK], [[0.0f32; BLOCK]; K]);
    let mut j0 = 0;
    while j0 < n {
        let len = BLOCK.min(n - j0);
        let (w, s, g) = (
            &w[j0..j0 + len],
            &s[j0..j0 + len],
            &g[4 * j0..4 * (j0 + len)],
        );
        let slots: [&[f32]; K] = std::array::from_fn(|k| &slots[k][j0..j0 + len]);
        for j in 0..len {
            let (wj, sj) = rule(
                w[j],
                le_f32(&g[4 * j..4 * j + 4]),
                std::array::from_fn(|k| slots[k][j]),
            );
            let ej = model::ema_step(s[j], wj, rate);
            w2[j] = wj;
            s2[j] = ej;
            bad |= u32::from(wj.to_bits() & EXP == EXP) | u32::from(ej.to_bits() & EXP == EXP);
            for k in 0..K {
                slots2[k][j] = sj[k];
                bad |= u32::from(sj[k].to_bits() & EXP == EXP);
            }
        }
        nw[j0..j0 + len].copy_from_slice(&w2[..len]);
        ns[j0..j0 + len].copy_from_slice(&s2[..len]);
        for k in 0..K {
            next[k][j0..j0 + len].copy_from_slice(&slots2[k][..len]);
        }
        j0 += len;
    }
    bad != 0
}

/// Elements per block of [`lanes`]: 2 + K arrays of 1 KiB on the stack.
const BLOCK: usize = 256;
