//! The MLP and its math: forward, loss, backprop, init, learning-rate
//! schedule and EMA decay — the reference program's semantics exactly
//! (see docs/design.md "The model and its math").
//!
//! Parameters are passed around as `ArrayD<f32>` because that is how they
//! travel (wire, checkpoints); the math views them as 2-D/1-D arrays without
//! copying. The training step's matrix products, where nearly all of its
//! time is spent, go through [`crate::kernel::gemm`] in the model's
//! [`Precision`] (f32: matrixmultiply; `mixed_bfloat16`: bf16 inputs, f32
//! sums); evaluation's go through ndarray's `.dot()` in f32.

use crate::kernel::{self, Precision};
use ndarray::{
    Array2, ArrayBase, ArrayD, ArrayView1, ArrayView2, Data, DataMut, Ix1, Ix2, IxDyn, s,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, StandardNormal};

/// Standard deviation of the truncated-normal weight initializer.
pub const INIT_STDDEV: f32 = 0.1;

/// Rows per forward pass in [`Mlp::accuracy`]: bounds the activations' memory
/// (1000 × 500 f32 = 2 MB for the default model) whatever the data set size.
const EVAL_CHUNK: usize = 1000;

/// A model variable as every process derives it from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarSpec {
    /// TensorFlow-style name, e.g. `layer1/weights`.
    pub name: String,
    /// Dimensions, e.g. `[784, 500]`.
    pub shape: Vec<usize>,
}

/// Errors from building a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `model.layers` must have at least an input and an output width, none zero.
    #[error("model.layers = {0:?}: expected at least two positive widths, e.g. [784, 500, 10]")]
    BadLayers(Vec<usize>),
}

/// A multi-layer perceptron: ReLU hidden layers, linear logits.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// Widths, input first, classes last.
    layers: Vec<usize>,
    /// The training step's GEMMs' number format ([`Mlp::loss_and_grads_into`]);
    /// evaluation and prediction always compute in f32.
    precision: Precision,
}

/// Reusable buffers for [`Mlp::loss_and_grads_into`]: one training step's
/// activations and backpropagated deltas, kept across steps so the hot path
/// allocates nothing. Starts empty; sized by the first step.
#[derive(Debug, Default)]
pub struct Workspace {
    /// `outs[l]`: layer l's output, `n × width[l+1]` (post-ReLU; the last
    /// holds the logits, then the output delta).
    outs: Vec<Array2<f32>>,
    /// `deltas[l]`: ∂loss/∂z of hidden layer l, `n × width[l+1]`.
    deltas: Vec<Array2<f32>>,
}

impl Workspace {
    /// Makes the buffers fit a batch of `n` rows of a model with `layers`.
    fn fit(&mut self, n: usize, layers: &[usize]) {
        let fits = self.outs.len() == layers.len() - 1
            && self
                .outs
                .iter()
                .zip(&layers[1..])
                .all(|(a, &w)| a.dim() == (n, w));
        if !fits {
            self.outs = layers[1..].iter().map(|&w| Array2::zeros((n, w))).collect();
            self.deltas = layers[1..layers.len() - 1]
                .iter()
                .map(|&w| Array2::zeros((n, w)))
                .collect();
        }
    }
}

impl Mlp {
    /// A model with the given widths, input first, classes last.
    ///
    /// Errors: [`ModelError::BadLayers`] when there are fewer than two widths
    /// or any width is zero.
    pub fn new(layers: &[usize]) -> Result<Self, ModelError> {
        if layers.len() < 2 || layers.contains(&0) {
            return Err(ModelError::BadLayers(layers.to_vec()));
        }
        Ok(Mlp {
            layers: layers.to_vec(),
            precision: Precision::Float32,
        })
    }

    /// The same model, training with `precision`'s GEMMs.
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// The training step's precision policy.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Number of inputs per example (the first width).
    pub fn inputs(&self) -> usize {
        self.layers[0]
    }

    /// Number of classes (the last width).
    pub fn classes(&self) -> usize {
        self.layers[self.layers.len() - 1]
    }

    /// The widths, input first, classes last.
    pub fn layers(&self) -> &[usize] {
        &self.layers
    }

    /// Variables in creation order: layer1/weights, layer1/biases, layer2/weights, ...
    pub fn variables(&self) -> Vec<VarSpec> {
        self.layers
            .windows(2)
            .enumerate()
            .flat_map(|(i, w)| {
                [
                    VarSpec {
                        name: format!("layer{}/weights", i + 1),
                        shape: vec![w[0], w[1]],
                    },
                    VarSpec {
                        name: format!("layer{}/biases", i + 1),
                        shape: vec![w[1]],
                    },
                ]
            })
            .collect()
    }

    /// Fresh values in `variables()` order: weights truncated normal (stddev 0.1,
    /// redrawn beyond 2σ), biases zero; deterministic in `seed`.
    ///
    /// One generator is drawn from in creation order, row-major within each
    /// matrix, so the same seed and layers always give the same values.
    pub fn init(&self, seed: u64) -> Vec<ArrayD<f32>> {
        let mut rng = StdRng::seed_from_u64(seed);
        self.variables()
            .into_iter()
            .map(|spec| {
                if spec.shape.len() == 2 {
                    ArrayD::from_shape_simple_fn(spec.shape, || {
                        truncated_normal(&mut rng) * INIT_STDDEV
                    })
                } else {
                    ArrayD::zeros(spec.shape)
                }
            })
            .collect()
    }

    /// Views `params` as (weights, biases) per layer.
    ///
    /// Panics (with the variable's name) when the count or a shape is not what
    /// [`Mlp::variables`] says: callers receive parameters that the ps or the
    /// checkpoint reader has already validated against the same specs, so a
    /// mismatch here is a bug, not bad input.
    fn layer_views<'a, S: Data<Elem = f32>>(
        &self,
        params: &'a [ArrayBase<S, IxDyn>],
    ) -> Vec<(ArrayView2<'a, f32>, ArrayView1<'a, f32>)> {
        // Checked without building `variables()`: this runs every step.
        assert_eq!(
            params.len(),
            2 * (self.layers.len() - 1),
            "expected {} parameter arrays for layers {:?}, got {}",
            2 * (self.layers.len() - 1),
            self.layers,
            params.len()
        );
        for (l, (pair, w)) in params
            .chunks_exact(2)
            .zip(self.layers.windows(2))
            .enumerate()
        {
            assert_eq!(
                pair[0].shape(),
                w,
                "layer{}/weights: expected shape {w:?}",
                l + 1
            );
            assert_eq!(
                pair[1].shape(),
                &w[1..],
                "layer{}/biases: expected shape {:?}",
                l + 1,
                &w[1..]
            );
        }
        params
            .chunks_exact(2)
            .map(|pair| {
                // Shapes were checked above, so the conversions cannot fail.
                let w = pair[0]
                    .view()
                    .into_dimensionality::<Ix2>()
                    .expect("checked rank 2");
                let b = pair[1]
                    .view()
                    .into_dimensionality::<Ix1>()
                    .expect("checked rank 1");
                (w, b)
            })
            .collect()
    }

    /// Logits of a batch, `x.nrows() × classes`.
    fn logits(layers: &[(ArrayView2<f32>, ArrayView1<f32>)], x: ArrayView2<f32>) -> Array2<f32> {
        let last = layers.len() - 1;
        let mut a: Option<Array2<f32>> = None;
        for (l, (w, b)) in layers.iter().enumerate() {
            let mut z = match &a {
                Some(prev) => prev.dot(w),
                None => x.dot(w),
            };
            z += b;
            if l != last {
                z.mapv_inplace(relu);
            }
            a = Some(z);
        }
        a.expect("at least one layer")
    }

    /// Mean sparse softmax cross-entropy of the batch plus
    /// `regularization_rate · Σ‖W‖²/2` over weight matrices, and its gradient
    /// with respect to every variable (same order and shapes as `params`).
    ///
    /// Allocates its buffers on every call; a training loop should keep a
    /// [`Workspace`] and gradient arrays and call [`Mlp::loss_and_grads_into`].
    ///
    /// `labels` must hold one class index `< classes` per row of `x`; the data
    /// set is validated when it is loaded ([`crate::data::Dataset::check_labels`]).
    ///
    /// # Panics
    ///
    /// When `params` do not match [`Mlp::variables`], `x` is not `n × inputs`,
    /// `labels.len() != n`, `n == 0`, or a label is out of range: all are
    /// programming errors once inputs are validated at their boundary.
    pub fn loss_and_grads(
        &self,
        params: &[ArrayD<f32>],
        x: ArrayView2<f32>,
        labels: &[u8],
        regularization_rate: f32,
    ) -> (f32, Vec<ArrayD<f32>>) {
        let mut grads: Vec<ArrayD<f32>> = params.iter().map(|p| ArrayD::zeros(p.shape())).collect();
        let loss = self.loss_and_grads_into(
            params,
            x,
            labels,
            regularization_rate,
            &mut Workspace::default(),
            &mut grads,
        );
        (loss, grads)
    }

    /// [`Mlp::loss_and_grads`] without allocating: activations live in `ws`
    /// (sized on first use, and again only when the batch size changes) and
    /// the gradients are written into `grads`, which must have the shapes of
    /// `params`. Returns the loss.
    ///
    /// Generic over the arrays' storage: the worker passes views over a
    /// ps's shared-memory region (values read, gradients written in place,
    /// `transport::Cluster::step`), tests and the evaluator owned arrays.
    ///
    /// The matrix products write straight into these buffers
    /// ([`kernel::gemm`]), with the bias add and the L2 term folded into the
    /// product's initial value (β = 1), so each big array is touched once
    /// per step besides the GEMM itself.
    ///
    /// # Panics
    ///
    /// As [`Mlp::loss_and_grads`], and when `grads` do not match `params`.
    pub fn loss_and_grads_into<S: Data<Elem = f32>, G: DataMut<Elem = f32>>(
        &self,
        params: &[ArrayBase<S, IxDyn>],
        x: ArrayView2<f32>,
        labels: &[u8],
        regularization_rate: f32,
        ws: &mut Workspace,
        grads: &mut [ArrayBase<G, IxDyn>],
    ) -> f32 {
        let layers = self.layer_views(params);
        let n = x.nrows();
        let classes = self.classes();
        assert!(n > 0, "loss_and_grads: empty batch");
        assert_eq!(x.ncols(), self.inputs(), "input width");
        assert_eq!(labels.len(), n, "one label per row of x");
        assert_eq!(grads.len(), params.len(), "one gradient per parameter");
        for (g, p) in grads.iter().zip(params) {
            assert_eq!(g.shape(), p.shape(), "gradient shape");
        }
        ws.fit(n, &self.layers);
        let last = layers.len() - 1;

        // Forward. outs[l] is layer l's output (post-ReLU for hidden layers;
        // the logits for the last). Each row starts as the bias, then the
        // product is accumulated onto it: z = b + a·W in one GEMM.
        for (l, (w, b)) in layers.iter().enumerate() {
            let (done, rest) = ws.outs.split_at_mut(l);
            let z = &mut rest[0];
            for mut row in z.rows_mut() {
                row.assign(b);
            }
            let input = if l == 0 { x } else { done[l - 1].view() };
            kernel::gemm(self.precision, &input, w, 1.0, &mut z.view_mut());
            if l != last {
                z.mapv_inplace(relu);
            }
        }

        // Softmax cross-entropy, in place: the logits become
        // dz = (softmax − onehot) / n. log-sum-exp with the row max
        // subtracted, so no exp overflows.
        let inv_n = 1.0 / n as f32;
        let mut ce_sum = 0.0f64;
        for (mut row, &label) in ws.outs[last].rows_mut().into_iter().zip(labels) {
            let label = usize::from(label);
            assert!(
                label < classes,
                "label {label} out of range for {classes} classes"
            );
            let max = row.fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            // Read before exponentiating: exp(z_label − max) may underflow to
            // 0 for a confidently wrong row, and its log would be −inf.
            let label_shifted = row[label] - max;
            let mut sum = 0.0f32;
            row.mapv_inplace(|v| {
                let e = (v - max).exp();
                sum += e;
                e
            });
            // −log softmax[label] = log Σ exp(z − max) − (z_label − max)
            ce_sum += f64::from(sum.ln() - label_shifted);
            let scale = inv_n / sum;
            row.mapv_inplace(|e| e * scale);
            row[label] -= inv_n;
        }
        let mut loss = ce_sum / n as f64;

        // Backward, from the last layer to the first. The delta of layer l
        // (∂loss/∂z_l) is outs[l] for the last layer (overwritten in place
        // above) and deltas[l] for hidden ones.
        for l in (0..layers.len()).rev() {
            let (w, _) = layers[l];
            let (gw, gb) = {
                let (a, b) = grads[2 * l..2 * l + 2].split_at_mut(1);
                (&mut a[0], &mut b[0])
            };
            let mut dw = gw
                .view_mut()
                .into_dimensionality::<Ix2>()
                .expect("checked shape");
            let dz = if l == last {
                &ws.outs[l]
            } else {
                &ws.deltas[l]
            };
            // dW starts as the L2 term's gradient (reg · W), and the penalty
            // is summed in the same pass; then dW += inputᵀ·dz.
            let beta = if regularization_rate != 0.0 {
                let g = dw
                    .as_slice_mut()
                    .expect("arrays built by dtf are contiguous");
                let w = w.as_slice().expect("arrays built by dtf are contiguous");
                loss += f64::from(regularization_rate)
                    * scale_and_sum_squares(g, w, regularization_rate)
                    / 2.0;
                1.0
            } else {
                0.0
            };
            let input = if l == 0 { x } else { ws.outs[l - 1].view() };
            kernel::gemm(self.precision, &input.t(), &dz.view(), beta, &mut dw);
            // db = Σ_rows dz, accumulated row by row (contiguous, vectorizes).
            let db = gb
                .as_slice_mut()
                .expect("arrays built by dtf are contiguous");
            db.fill(0.0);
            for row in dz.rows() {
                let row = row.to_slice().expect("workspace rows are contiguous");
                for (s, &v) in db.iter_mut().zip(row) {
                    *s += v;
                }
            }
            if l > 0 {
                // Gradient through the previous layer's ReLU: zero where it
                // was inactive (TF's ReluGrad uses the output > 0 as the mask).
                let (lower, upper) = ws.deltas.split_at_mut(l);
                let dz = if l == last { &ws.outs[l] } else { &upper[0] };
                let da = &mut lower[l - 1];
                kernel::gemm(self.precision, &dz.view(), &w.t(), 0.0, &mut da.view_mut());
                let da = da.as_slice_mut().expect("workspace arrays are contiguous");
                let a = ws.outs[l - 1]
                    .as_slice()
                    .expect("workspace arrays are contiguous");
                for (g, &a) in da.iter_mut().zip(a) {
                    // A select, not a branch: the loop vectorizes.
                    *g = if a > 0.0 { *g } else { 0.0 };
                }
            }
        }
        loss as f32
    }

    /// Class probabilities (softmax of the logits), `x.nrows() × classes`,
    /// computed in chunks as [`Mlp::accuracy`] is. The row's largest logit is
    /// subtracted before `exp`, so no logit overflows.
    ///
    /// # Panics
    ///
    /// Like [`Mlp::accuracy`].
    pub fn probabilities(&self, params: &[ArrayD<f32>], x: ArrayView2<f32>) -> Array2<f32> {
        let layers = self.layer_views(params);
        assert_eq!(x.ncols(), self.inputs(), "input width");
        let mut out = Array2::zeros((x.nrows(), self.classes()));
        let mut start = 0;
        while start < x.nrows() {
            let end = (start + EVAL_CHUNK).min(x.nrows());
            let logits = Self::logits(&layers, x.slice(s![start..end, ..]));
            for (mut o, z) in out
                .slice_mut(s![start..end, ..])
                .rows_mut()
                .into_iter()
                .zip(logits.rows())
            {
                let max = z.fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                o.assign(&z.mapv(|v| (v - max).exp()));
                let sum = o.sum();
                o.mapv_inplace(|v| v / sum);
            }
            start = end;
        }
        out
    }

    /// Fraction of rows whose arg-max logit equals the label (ties go to the
    /// lowest class, like `tf.argmax`). Evaluated in chunks of 1000 rows so
    /// memory stays bounded for any data set size. 0 for an empty `x`.
    ///
    /// # Panics
    ///
    /// Like [`Mlp::loss_and_grads`], on parameters or shapes that do not match
    /// the model.
    pub fn accuracy(&self, params: &[ArrayD<f32>], x: ArrayView2<f32>, labels: &[u8]) -> f32 {
        let layers = self.layer_views(params);
        assert_eq!(x.ncols(), self.inputs(), "input width");
        assert_eq!(labels.len(), x.nrows(), "one label per row of x");
        if x.nrows() == 0 {
            return 0.0;
        }
        let mut correct = 0usize;
        let mut start = 0;
        while start < x.nrows() {
            let end = (start + EVAL_CHUNK).min(x.nrows());
            let logits = Self::logits(&layers, x.slice(s![start..end, ..]));
            for (row, &label) in logits.rows().into_iter().zip(&labels[start..end]) {
                if argmax(row) == usize::from(label) {
                    correct += 1;
                }
            }
            start = end;
        }
        (correct as f64 / x.nrows() as f64) as f32
    }

    /// [`Mlp::accuracy`] and the mean softmax cross-entropy of the rows (no
    /// L2 term: the evaluator's test loss, TensorFlow's `loss` in
    /// `evaluate()`), in one pass over `x`, in chunks as `accuracy`.
    /// `(0, 0)` for an empty `x`.
    ///
    /// # Panics
    ///
    /// As [`Mlp::accuracy`].
    pub fn accuracy_and_loss(
        &self,
        params: &[ArrayD<f32>],
        x: ArrayView2<f32>,
        labels: &[u8],
    ) -> (f32, f32) {
        let layers = self.layer_views(params);
        assert_eq!(x.ncols(), self.inputs(), "input width");
        assert_eq!(labels.len(), x.nrows(), "one label per row of x");
        if x.nrows() == 0 {
            return (0.0, 0.0);
        }
        let (mut correct, mut loss) = (0usize, 0.0f64);
        let mut start = 0;
        while start < x.nrows() {
            let end = (start + EVAL_CHUNK).min(x.nrows());
            let logits = Self::logits(&layers, x.slice(s![start..end, ..]));
            for (row, &label) in logits.rows().into_iter().zip(&labels[start..end]) {
                let best = argmax(row);
                if best == usize::from(label) {
                    correct += 1;
                }
                // log Σ exp(z) − z_label, shifted by the max for stability.
                let max = row[best];
                let sum: f64 = row.iter().map(|&z| f64::from(z - max).exp()).sum();
                loss += sum.ln() - f64::from(row[usize::from(label)] - max);
            }
            start = end;
        }
        let n = x.nrows() as f64;
        ((correct as f64 / n) as f32, (loss / n) as f32)
    }
}

/// Writes `g = rate · w` and returns `Σ w²`, in one pass.
///
/// The squares go into 16 independent f32 lanes (one AVX-512 register, two
/// AVX2 ones): a single running sum is a chain of dependent adds that the
/// compiler may not reorder, and that chain took about 10% of a step. The
/// lanes are flushed into an f64 total every [`SUM_BLOCK`] elements, so no
/// f32 sum runs long enough to lose precision.
fn scale_and_sum_squares(g: &mut [f32], w: &[f32], rate: f32) -> f64 {
    const LANES: usize = 16;
    let mut total = 0.0f64;
    for (gb, wb) in g.chunks_mut(SUM_BLOCK).zip(w.chunks(SUM_BLOCK)) {
        // Two simple loops over a block that sits in L1: each vectorizes on
        // its own, where one fused loop did not.
        for (g, &v) in gb.iter_mut().zip(wb) {
            *g = rate * v;
        }
        // Fixed-size chunks: the compiler sees 16-wide arrays, no bounds checks.
        let mut acc = [0.0f32; LANES];
        let (w_chunks, w_rest) = wb.as_chunks::<LANES>();
        for wc in w_chunks {
            for i in 0..LANES {
                acc[i] += wc[i] * wc[i];
            }
        }
        for &v in w_rest {
            acc[0] += v * v;
        }
        total += acc.iter().map(|&v| f64::from(v)).sum::<f64>();
    }
    total
}

/// Elements per f32 partial sum in [`scale_and_sum_squares`] (64 per lane).
const SUM_BLOCK: usize = 1024;

fn relu(v: f32) -> f32 {
    if v > 0.0 { v } else { 0.0 }
}

/// Index of the first maximum.
pub fn argmax(row: ArrayView1<f32>) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// A standard normal sample redrawn until it lies within 2σ, as
/// `tf.truncated_normal` does.
fn truncated_normal(rng: &mut StdRng) -> f32 {
    loop {
        let z: f32 = StandardNormal.sample(rng);
        if z.abs() <= 2.0 {
            return z;
        }
    }
}

/// `base · decay^(step / decay_steps)` (continuous, TF's `exponential_decay`).
///
/// Computed in f64. `decay_steps` must be positive (the config guarantees it:
/// it is `train_examples / batch_size`).
pub fn learning_rate(base: f32, decay: f32, step: u64, decay_steps: f64) -> f32 {
    debug_assert!(decay_steps > 0.0, "decay_steps must be positive");
    (f64::from(base) * f64::from(decay).powf(step as f64 / decay_steps)) as f32
}

/// `min(moving_average_decay, (1 + step) / (10 + step))` (TF's EMA with num_updates).
pub fn ema_decay(moving_average_decay: f32, step: u64) -> f32 {
    let warmup = (1.0 + step as f64) / (10.0 + step as f64);
    f64::from(moving_average_decay).min(warmup) as f32
}

/// The EMA rule, TensorFlow's `shadow -= (1 − decay)(shadow − var)`, for one
/// value: `rate` is `1 − decay` (computed once per update by the caller).
/// The ps applies it to every shadow; this is its one definition.
#[inline(always)]
pub fn ema_step(shadow: f32, var: f32, rate: f32) -> f32 {
    shadow - rate * (shadow - var)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    fn random_params(mlp: &Mlp, rng: &mut StdRng, scale: f32) -> Vec<ArrayD<f32>> {
        mlp.variables()
            .into_iter()
            .map(|spec| {
                ArrayD::from_shape_simple_fn(spec.shape, || rng.random_range(-scale..scale))
            })
            .collect()
    }

    #[test]
    fn bad_layers_are_rejected() {
        assert!(Mlp::new(&[784]).is_err());
        assert!(Mlp::new(&[]).is_err());
        assert!(Mlp::new(&[784, 0, 10]).is_err());
        let msg = Mlp::new(&[5]).unwrap_err().to_string();
        assert!(msg.contains("[5]"), "{msg}");
    }

    #[test]
    fn variables_are_named_in_creation_order() {
        let mlp = Mlp::new(&[784, 500, 10]).unwrap();
        let vars = mlp.variables();
        let names: Vec<&str> = vars.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "layer1/weights",
                "layer1/biases",
                "layer2/weights",
                "layer2/biases"
            ]
        );
        assert_eq!(vars[0].shape, [784, 500]);
        assert_eq!(vars[1].shape, [500]);
        assert_eq!(vars[2].shape, [500, 10]);
        assert_eq!(vars[3].shape, [10]);
    }

    #[test]
    fn init_is_truncated_normal_and_deterministic() {
        let mlp = Mlp::new(&[784, 500, 10]).unwrap();
        let p = mlp.init(7);
        assert_eq!(p, mlp.init(7));
        assert_ne!(p, mlp.init(8));
        for (v, spec) in p.iter().zip(mlp.variables()) {
            assert_eq!(v.shape(), &spec.shape[..]);
        }
        let w = &p[0];
        assert!(w.iter().all(|v| v.abs() <= 2.0 * INIT_STDDEV));
        let n = w.len() as f64;
        let mean = w.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = w
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 1e-3, "mean {mean}");
        // A normal truncated at ±2σ has standard deviation ≈ 0.8796σ.
        assert!((var.sqrt() - 0.08796).abs() < 1e-3, "std {}", var.sqrt());
        assert!(p[1].iter().all(|&v| v == 0.0));
        assert!(p[3].iter().all(|&v| v == 0.0));
        assert!(p[2].iter().any(|&v| v != 0.0));
    }

    #[test]
    fn zero_params_give_log_classes_loss() {
        let mlp = Mlp::new(&[3, 4, 5]).unwrap();
        let params: Vec<ArrayD<f32>> = mlp
            .variables()
            .into_iter()
            .map(|s| ArrayD::zeros(s.shape))
            .collect();
        let x = Array2::from_elem((2, 3), 0.5f32);
        let (loss, grads) = mlp.loss_and_grads(&params, x.view(), &[1, 4], 0.5);
        assert!((loss - 5f32.ln()).abs() < 1e-6, "loss {loss}");
        // Output biases: mean of softmax − onehot = 0.2 − (fraction labelled c).
        let db: Vec<f32> = grads[3].iter().copied().collect();
        let want = [0.2, 0.2 - 0.5, 0.2, 0.2, 0.2 - 0.5];
        for (g, w) in db.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{db:?}");
        }
    }

    #[test]
    fn loss_is_stable_for_huge_logits() {
        let mlp = Mlp::new(&[1, 2]).unwrap();
        let params = vec![
            ArrayD::from_shape_vec(vec![1, 2], vec![1000.0f32, -1000.0]).unwrap(),
            ArrayD::zeros(vec![2]),
        ];
        let x = Array2::from_elem((1, 1), 1.0f32);
        let (loss, grads) = mlp.loss_and_grads(&params, x.view(), &[1], 0.0);
        assert!((loss - 2000.0).abs() < 1e-2, "loss {loss}");
        assert!(grads.iter().all(|g| g.iter().all(|v| v.is_finite())));
        let (loss, _) = mlp.loss_and_grads(&params, x.view(), &[0], 0.0);
        assert_eq!(loss, 0.0);
    }

    /// Which hidden units are active (pre-activation > 0), for every row.
    fn relu_pattern(mlp: &Mlp, params: &[ArrayD<f32>], x: ArrayView2<f32>) -> Vec<bool> {
        let layers = mlp.layer_views(params);
        let mut a = x.to_owned();
        let mut pattern = Vec::new();
        for (w, b) in &layers[..layers.len() - 1] {
            let z = a.dot(w) + b;
            pattern.extend(z.iter().map(|&v| v > 0.0));
            a = z.mapv(relu);
        }
        pattern
    }

    /// Analytic gradient of the full loss (cross-entropy + L2) against central
    /// finite differences, on several entries of every variable, for several
    /// random models. An entry whose ±eps perturbation flips a ReLU is skipped:
    /// there the loss is not differentiable and a finite difference says
    /// nothing about the gradient.
    #[test]
    fn gradients_match_finite_differences() {
        let mlp = Mlp::new(&[5, 4, 3]).unwrap();
        let labels = [0u8, 1, 2, 2, 1, 0];
        let reg = 0.1;
        let eps = 1e-2f32;
        for seed in 0..10 {
            let mut rng = StdRng::seed_from_u64(seed);
            let params = random_params(&mlp, &mut rng, 1.0);
            let x = Array2::from_shape_simple_fn((6, 5), || rng.random_range(-1.0f32..1.0));
            let (_, grads) = mlp.loss_and_grads(&params, x.view(), &labels, reg);
            let perturbed = |v: usize, i: usize, delta: f32| {
                let mut p = params.clone();
                p[v].as_slice_mut().unwrap()[i] += delta;
                p
            };
            for (v, grad) in grads.iter().enumerate() {
                assert_eq!(grad.shape(), params[v].shape());
                let mut checked = 0;
                for _ in 0..100 {
                    let i = rng.random_range(0..params[v].len());
                    let (up, down) = (perturbed(v, i, eps), perturbed(v, i, -eps));
                    if relu_pattern(&mlp, &up, x.view()) != relu_pattern(&mlp, &down, x.view()) {
                        continue;
                    }
                    let loss = |p: &[ArrayD<f32>]| {
                        f64::from(mlp.loss_and_grads(p, x.view(), &labels, reg).0)
                    };
                    let numeric = (loss(&up) - loss(&down)) / (2.0 * f64::from(eps));
                    let analytic = f64::from(grad.as_slice().unwrap()[i]);
                    let tol = 1e-2 * numeric.abs().max(analytic.abs()) + 1e-4;
                    assert!(
                        (numeric - analytic).abs() <= tol,
                        "seed {seed}, {} entry {i}: analytic {analytic}, numeric {numeric}",
                        mlp.variables()[v].name
                    );
                    checked += 1;
                    if checked == 4 {
                        break;
                    }
                }
                assert_eq!(checked, 4, "seed {seed}: too many ReLU kinks to check");
            }
        }
    }

    #[test]
    #[should_panic(expected = "layer2/weights: expected shape [4, 3]")]
    fn mismatched_params_name_the_variable() {
        let mlp = Mlp::new(&[5, 4, 3]).unwrap();
        let mut params = mlp.init(0);
        params[2] = ArrayD::zeros(vec![3, 4]);
        mlp.loss_and_grads(&params, Array2::zeros((1, 5)).view(), &[0], 0.0);
    }

    #[test]
    fn regularization_counts_weights_only() {
        let mlp = Mlp::new(&[2, 2]).unwrap();
        let params = vec![
            ArrayD::from_shape_vec(vec![2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap(),
            ArrayD::from_shape_vec(vec![2], vec![10.0f32, 10.0]).unwrap(),
        ];
        let x = Array2::zeros((1, 2));
        let (l0, _) = mlp.loss_and_grads(&params, x.view(), &[0], 0.0);
        let (l1, g1) = mlp.loss_and_grads(&params, x.view(), &[0], 0.5);
        // 0.5 · (1 + 4 + 9 + 16) / 2 = 7.5; biases do not count.
        assert!((l1 - l0 - 7.5).abs() < 1e-5, "{l0} {l1}");
        // x = 0, so the weight gradient is the regularization term alone.
        assert_eq!(
            g1[0].iter().copied().collect::<Vec<_>>(),
            [0.5, 1.0, 1.5, 2.0]
        );
    }

    #[test]
    fn learning_rate_schedule() {
        assert_eq!(learning_rate(0.01, 0.99, 0, 600.0), 0.01);
        let want = 0.01 * 0.99f64.powf(1000.0 / 600.0);
        assert!((f64::from(learning_rate(0.01, 0.99, 1000, 600.0)) - want).abs() < 1e-9);
        // Exactly one decay per decay_steps.
        assert!((learning_rate(0.1, 0.5, 600, 600.0) - 0.05).abs() < 1e-8);
        assert!((learning_rate(0.1, 0.5, 1200, 600.0) - 0.025).abs() < 1e-8);
    }

    #[test]
    fn ema_decay_warms_up_then_caps() {
        assert!((ema_decay(0.99, 0) - 0.1).abs() < 1e-7);
        assert!((ema_decay(0.99, 10) - 11.0 / 20.0).abs() < 1e-7);
        assert_eq!(ema_decay(0.99, 1000), 0.99);
        // (1+890)/(10+890) = 0.99 exactly: the crossover.
        assert!((ema_decay(0.99, 890) - 0.99).abs() < 1e-7);
        assert!(ema_decay(0.99, 889) < 0.99);
    }

    #[test]
    fn ema_step_moves_shadow_towards_var() {
        // decay 0.75: 1 − 0.25·(1 − 3) = 1.5; −1 − 0.25·(−1 − 1) = −0.5
        assert_eq!(ema_step(1.0, 3.0, 0.25), 1.5);
        assert_eq!(ema_step(-1.0, 1.0, 0.25), -0.5);
        // decay 0: the shadow becomes the variable.
        assert_eq!(ema_step(1.5, 3.0, 1.0), 3.0);
    }

    /// Two Gaussian blobs per class on a 4-d input: SGD must fit them.
    #[test]
    fn sgd_learns_a_separable_problem() {
        let mlp = Mlp::new(&[4, 8, 3]).unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        let n = 60;
        let labels: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
        let x = Array2::from_shape_fn((n, 4), |(i, j)| {
            let centre = if j == i % 3 { 1.0 } else { 0.0 };
            centre + rng.random_range(-0.2f32..0.2)
        });
        let mut params = mlp.init(3);
        let (first, _) = mlp.loss_and_grads(&params, x.view(), &labels, 1e-4);
        let mut last = first;
        for _ in 0..300 {
            let (loss, grads) = mlp.loss_and_grads(&params, x.view(), &labels, 1e-4);
            for (p, g) in params.iter_mut().zip(&grads) {
                p.scaled_add(-0.5, g);
            }
            last = loss;
        }
        assert!(last < 0.1 * first, "loss {first} -> {last}");
        assert_eq!(mlp.accuracy(&params, x.view(), &labels), 1.0);
    }

    #[test]
    fn test_loss_is_the_training_loss_without_l2() {
        let mlp = Mlp::new(&[4, 8, 3]).unwrap();
        let mut rng = StdRng::seed_from_u64(2);
        let n = 2500; // more than two chunks
        let labels: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
        let x = Array2::from_shape_fn((n, 4), |_| rng.random_range(-1.0f32..1.0));
        let params = mlp.init(5);
        let (loss, _) = mlp.loss_and_grads(&params, x.view(), &labels, 0.0);
        let (acc, test_loss) = mlp.accuracy_and_loss(&params, x.view(), &labels);
        assert!(
            (loss - test_loss).abs() < 1e-4 * loss,
            "{loss} vs {test_loss}"
        );
        assert_eq!(acc, mlp.accuracy(&params, x.view(), &labels));
    }

    #[test]
    fn accuracy_counts_argmax_matches_across_chunks() {
        // Identity logits: argmax is the column of the largest input.
        let mlp = Mlp::new(&[3, 3]).unwrap();
        let params = vec![
            ArrayD::from_shape_vec(vec![3, 3], {
                let mut v = vec![0.0f32; 9];
                v[0] = 1.0;
                v[4] = 1.0;
                v[8] = 1.0;
                v
            })
            .unwrap(),
            ArrayD::zeros(vec![3]),
        ];
        let n = 2500; // more than two chunks
        let x = Array2::from_shape_fn((n, 3), |(i, j)| if j == i % 3 { 1.0 } else { 0.0 });
        let mut labels: Vec<u8> = (0..n).map(|i| (i % 3) as u8).collect();
        assert_eq!(mlp.accuracy(&params, x.view(), &labels), 1.0);
        for l in labels.iter_mut().take(500) {
            *l = (*l + 1) % 3;
        }
        assert!((mlp.accuracy(&params, x.view(), &labels) - 0.8).abs() < 1e-6);
    }

    /// `cargo test --lib model::tests::time_loss_and_grads -- --ignored --nocapture`
    #[test]
    #[ignore = "timing, not a check"]
    fn time_loss_and_grads() {
        let mlp = Mlp::new(&[784, 500, 10]).unwrap();
        let params = mlp.init(0);
        let mut rng = StdRng::seed_from_u64(0);
        let x = Array2::from_shape_simple_fn((100, 784), || rng.random_range(0.0f32..1.0));
        let labels: Vec<u8> = (0..100).map(|i| (i % 10) as u8).collect();
        for _ in 0..5 {
            mlp.loss_and_grads(&params, x.view(), &labels, 1e-4);
        }
        // The best of several rounds: the machine may be shared, and the
        // minimum is the least disturbed estimate of the kernel's cost.
        let per = (0..10)
            .map(|_| {
                let start = std::time::Instant::now();
                for _ in 0..20 {
                    std::hint::black_box(mlp.loss_and_grads(&params, x.view(), &labels, 1e-4));
                }
                start.elapsed().as_secs_f64() / 20.0
            })
            .fold(f64::INFINITY, f64::min);
        let flops = 6.0 * 100.0 * (784.0 * 500.0 + 500.0 * 10.0);
        println!(
            "loss_and_grads [784,500,10] batch 100: {:.3} ms/call, {:.2} GFLOP/s",
            per * 1e3,
            flops / per / 1e9
        );
    }
}
