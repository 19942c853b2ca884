//! Evaluation and prediction: logits, class probabilities, accuracy and
//! the test loss, computed in f32 in chunks of [`EVAL_CHUNK`] rows so
//! memory stays bounded whatever the data set's size.

use super::{Hidden, Mlp, argmax};
use ndarray::{Array2, ArrayD, ArrayView1, ArrayView2, s};

/// Rows per forward pass in [`Mlp::accuracy`]: bounds the activations' memory
/// (1000 × 500 f32 = 2 MB for the default model) whatever the data set size.
const EVAL_CHUNK: usize = 1000;

impl Mlp {
    /// Logits of a batch, `x.nrows() × classes`.
    fn logits(
        hidden: &Hidden,
        layers: &[(ArrayView2<f32>, ArrayView1<f32>)],
        x: ArrayView2<f32>,
    ) -> Array2<f32> {
        let last = layers.len() - 1;
        let mut a: Option<Array2<f32>> = None;
        for (l, (w, b)) in layers.iter().enumerate() {
            let mut z = match &a {
                Some(prev) => prev.dot(w),
                None => x.dot(w),
            };
            z += b;
            if l != last {
                // No dropout: evaluation and prediction use every value.
                hidden.forward(l, &mut z, None);
            }
            a = Some(z);
        }
        a.expect("at least one layer")
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
            let logits = Self::logits(&self.hidden, &layers, x.slice(s![start..end, ..]));
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

    /// The one output of a regression model for every row of `x` (no softmax: the output
    /// is the prediction), computed in chunks as [`Mlp::accuracy`] is.
    ///
    /// # Panics
    ///
    /// Like [`Mlp::accuracy`], and when the model has more than one output.
    pub fn predictions(&self, params: &[ArrayD<f32>], x: ArrayView2<f32>) -> Vec<f32> {
        let layers = self.layer_views(params);
        assert_eq!(x.ncols(), self.inputs(), "input width");
        assert_eq!(self.classes(), 1, "a regression model has one output");
        let mut out = Vec::with_capacity(x.nrows());
        let mut start = 0;
        while start < x.nrows() {
            let end = (start + EVAL_CHUNK).min(x.nrows());
            let z = Self::logits(&self.hidden, &layers, x.slice(s![start..end, ..]));
            out.extend(z.column(0));
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
            let logits = Self::logits(&self.hidden, &layers, x.slice(s![start..end, ..]));
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
            let logits = Self::logits(&self.hidden, &layers, x.slice(s![start..end, ..]));
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
