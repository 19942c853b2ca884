//! The training step: the batch's loss and its gradient with respect to
//! every variable, written into buffers kept across steps ([`Workspace`]).

use super::{HiddenBuffers, Mlp, Targets};
use crate::kernel;
use ndarray::{Array2, ArrayBase, ArrayD, ArrayView2, Data, DataMut, IxDyn};

/// Reusable buffers for [`Mlp::loss_and_grads_into`]: one training step's
/// activations and backpropagated deltas, kept across steps so the hot path
/// allocates nothing. Starts empty; sized by the first step.
#[derive(Debug, Default)]
pub struct Workspace {
    /// `outs[l]`: layer l's output, `n × width[l+1]` (post-activation; the last
    /// holds the logits, then the output delta).
    outs: Vec<Array2<f32>>,
    /// `deltas[l]`: ∂loss/∂z of hidden layer l, `n × width[l+1]`.
    deltas: Vec<Array2<f32>>,
    /// What the hidden layers keep for the backward pass (dropout's masks, GELU's inputs).
    hidden: HiddenBuffers,
}

impl Workspace {
    /// A workspace whose dropout masks come from `seed` (a worker's: the run's seed and its
    /// index, so workers drop different values).
    pub fn seeded(seed: u64) -> Self {
        let mut ws = Self::default();
        ws.hidden.seed(seed);
        ws
    }

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
    /// Mean sparse softmax cross-entropy of the batch (with [`Targets::Values`]: the mean
    /// squared error of the one output, `tf.losses.mean_squared_error`) plus
    /// `regularization_rate · Σ‖W‖²/2` over weight matrices, and its gradient
    /// with respect to every variable (same order and shapes as `params`).
    ///
    /// Allocates its buffers on every call; a training loop should keep a
    /// [`Workspace`] and gradient arrays and call [`Mlp::loss_and_grads_into`].
    ///
    /// `labels` must hold one class index `< classes` per row of `x` (the data
    /// set is validated when it is loaded: [`crate::data::Dataset::check_labels`]), or one
    /// finite value per row for a model of one output.
    ///
    /// # Panics
    ///
    /// When `params` do not match [`Mlp::variables`], `x` is not `n × inputs`,
    /// `labels.len() != n`, `n == 0`, a label is out of range, or values label a model of
    /// more than one output: all are programming errors once inputs are validated at their
    /// boundary.
    pub fn loss_and_grads<'a>(
        &self,
        params: &[ArrayD<f32>],
        x: ArrayView2<f32>,
        labels: impl Into<Targets<'a>>,
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
    pub fn loss_and_grads_into<'a, S: Data<Elem = f32>, G: DataMut<Elem = f32>>(
        &self,
        params: &[ArrayBase<S, IxDyn>],
        x: ArrayView2<f32>,
        labels: impl Into<Targets<'a>>,
        regularization_rate: f32,
        ws: &mut Workspace,
        grads: &mut [ArrayBase<G, IxDyn>],
    ) -> f32 {
        let labels = labels.into();
        let layers = self.layer_views(params);
        let n = x.nrows();
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
        // the logits for the last).
        super::dense_forward(
            self.precision,
            &self.hidden,
            Some(&mut ws.hidden),
            x,
            &layers,
            &mut ws.outs,
        );

        let mut loss = match labels {
            Targets::Classes(labels) => self.softmax_cross_entropy(&mut ws.outs[last], labels),
            Targets::Values(values) => squared_error(&mut ws.outs[last], values),
        };

        // Backward, from the last layer to the first. The delta of layer l
        // (∂loss/∂z_l) is outs[l] for the last layer (overwritten in place
        // above) and deltas[l] for hidden ones.
        for l in (0..layers.len()).rev() {
            let (w, _) = layers[l];
            let (mut dw, db) = super::layer_grads(grads, l);
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
                    * kernel::scale_and_sum_squares(g, w, regularization_rate)
                    / 2.0;
                1.0
            } else {
                0.0
            };
            let input = if l == 0 { x } else { ws.outs[l - 1].view() };
            kernel::gemm(self.precision, &input.t(), &dz.view(), beta, &mut dw);
            // db = Σ_rows dz, accumulated row by row (contiguous, vectorizes).
            db.fill(0.0);
            for row in dz.rows() {
                let row = row.to_slice().expect("workspace rows are contiguous");
                for (s, &v) in db.iter_mut().zip(row) {
                    *s += v;
                }
            }
            if l > 0 {
                // Gradient through the previous layer's activation and dropout.
                let (lower, upper) = ws.deltas.split_at_mut(l);
                let dz = if l == last { &ws.outs[l] } else { &upper[0] };
                let da = &mut lower[l - 1];
                kernel::gemm(self.precision, &dz.view(), &w.t(), 0.0, &mut da.view_mut());
                let da = da.as_slice_mut().expect("workspace arrays are contiguous");
                let a = ws.outs[l - 1]
                    .as_slice()
                    .expect("workspace arrays are contiguous");
                self.hidden.backward(l - 1, da, a, &ws.hidden);
            }
        }
        loss as f32
    }
}

impl Mlp {
    /// Mean softmax cross-entropy of the logits `z` against `labels`, with `z` made
    /// ∂loss/∂z in place.
    ///
    /// # Panics
    ///
    /// When a label is not below the model's classes.
    fn softmax_cross_entropy(&self, z: &mut Array2<f32>, labels: &[u8]) -> f64 {
        let classes = self.classes();
        let n = z.nrows();
        // Softmax cross-entropy, in place: the logits become
        // dz = (softmax − onehot) / n. log-sum-exp with the row max
        // subtracted, so no exp overflows.
        let inv_n = 1.0 / n as f32;
        let mut ce_sum = 0.0f64;
        for (mut row, &label) in z.rows_mut().into_iter().zip(labels) {
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
        ce_sum / n as f64
    }
}

/// `tf.losses.mean_squared_error`: the mean over the rows of `(y − ŷ)²`, ŷ the one output
/// in `z`, which becomes ∂loss/∂ŷ = 2(ŷ − y)/n in place.
///
/// # Panics
///
/// When the model has more than one output.
fn squared_error(z: &mut Array2<f32>, values: &[f32]) -> f64 {
    assert_eq!(z.ncols(), 1, "a regression model has one output");
    let n = z.nrows();
    let scale = 2.0 / n as f32;
    let mut sum = 0.0f64;
    for (p, &y) in z.iter_mut().zip(values) {
        let d = *p - y;
        sum += f64::from(d) * f64::from(d);
        *p = scale * d;
    }
    sum / n as f64
}

/// An array's values, row-major: the step's arrays are contiguous (built by dtf, or views
/// of a ps's shared region).
pub fn values_mut<G: DataMut<Elem = f32>>(a: &mut ArrayBase<G, IxDyn>) -> &mut [f32] {
    a.as_slice_mut()
        .expect("arrays built by dtf are contiguous")
}

/// `tf.clip_by_global_norm`: when the global norm of `grads` (the L2 norm of all their
/// values together) exceeds `clip_norm`, scales every gradient by `clip_norm / norm`;
/// `clip_norm` 0 clips nothing. Returns the norm before clipping (0 when not computed).
pub fn clip_by_global_norm(grads: &mut [&mut [f32]], clip_norm: f32) -> f64 {
    if clip_norm <= 0.0 {
        return 0.0;
    }
    let norm = grads
        .iter()
        .map(|g| g.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>())
        .sum::<f64>()
        .sqrt();
    if norm > f64::from(clip_norm) {
        // TF: t * clip_norm / max(global_norm, clip_norm).
        let scale = (f64::from(clip_norm) / norm) as f32;
        for g in grads.iter_mut() {
            g.iter_mut().for_each(|v| *v *= scale);
        }
    }
    norm
}

#[cfg(test)]
mod clip_tests {
    use super::clip_by_global_norm;

    #[test]
    fn gradients_over_the_norm_are_scaled_to_it_together() {
        let (mut a, mut b) = (vec![3.0f32, 0.0], vec![4.0f32]);
        let norm = clip_by_global_norm(&mut [&mut a, &mut b], 1.0);
        assert_eq!(norm, 5.0);
        assert_eq!((a, b), (vec![0.6, 0.0], vec![0.8]));
        let (mut a, mut b) = (vec![3.0f32, 0.0], vec![4.0f32]);
        clip_by_global_norm(&mut [&mut a, &mut b], 10.0);
        assert_eq!(
            (&a, &b),
            (&vec![3.0, 0.0], &vec![4.0]),
            "under the norm: unchanged"
        );
        clip_by_global_norm(&mut [&mut a, &mut b], 0.0);
        assert_eq!((a, b), (vec![3.0, 0.0], vec![4.0]), "0: no clipping");
    }
}
