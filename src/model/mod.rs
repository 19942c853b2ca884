//! The MLP and its math: forward, loss, backprop, init, learning-rate
//! schedule and EMA decay — the reference program's semantics exactly
//! (see docs/design.md "The model and its math").
//!
//! Its rooms:
//!
//! - `mod.rs` — [`Mlp`]: its shape, its variables ([`VarSpec`]) and their
//!   initial values; [`Targets`]: a batch's labels, class indices or (regression,
//!   `model.task`) real values.
//! - `gradient` — the training step: loss and gradients
//!   ([`Mlp::loss_and_grads_into`]) in a reusable [`Workspace`].
//! - `inference` — evaluation and prediction: logits, probabilities, a regression
//!   model's predictions, accuracy and test loss, in bounded chunks.
//! - `schedule` — the learning-rate schedule ([`learning_rate`]).
//! - `ema` — the moving average's decay and update rule ([`ema_decay`],
//!   [`ema_step`]).
//! - `wide_deep` — [`WideDeep`]: categorical ids through embedding tables
//!   (rows pulled per batch, deduplicated) into an MLP with one logit, plus
//!   a wide part of one weight per id; sigmoid cross-entropy.
//! - `table` — embedding tables ([`TableSpec`]): their names, widths and
//!   how a new row starts.
//!
//! Parameters are passed around as `ArrayD<f32>` because that is how they
//! travel (wire, checkpoints); the math views them as 2-D/1-D arrays without
//! copying. The training step's matrix products, where nearly all of its
//! time is spent, go through [`crate::kernel::gemm`] in the model's
//! [`Precision`] (f32: matrixmultiply; `mixed_bfloat16`: bf16 inputs, f32
//! sums); evaluation's go through ndarray's `.dot()` in f32.

mod ema;
mod gradient;
mod hidden;
mod inference;
mod schedule;
pub mod table;

/// The dense layers' forward pass into `outs` (one array per layer, shaped
/// `rows × width` already): each row starts as the bias, then the product
/// is accumulated onto it, `z = b + input·W` in one GEMM; `hidden`'s
/// activation (and in training, with `buffers`, its dropout) on every layer
/// but the last (the logits).
fn dense_forward(
    precision: Precision,
    hidden: &Hidden,
    mut buffers: Option<&mut HiddenBuffers>,
    x: ArrayView2<f32>,
    layers: &[(ArrayView2<f32>, ArrayView1<f32>)],
    outs: &mut [ndarray::Array2<f32>],
) {
    let last = layers.len() - 1;
    for (l, (w, b)) in layers.iter().enumerate() {
        let (done, rest) = outs.split_at_mut(l);
        let z = &mut rest[0];
        for mut row in z.rows_mut() {
            row.assign(b);
        }
        let input = if l == 0 { x } else { done[l - 1].view() };
        crate::kernel::gemm(precision, &input, w, 1.0, &mut z.view_mut());
        if l != last {
            hidden.forward(l, z, buffers.as_deref_mut());
        }
    }
}

/// Layer `l`'s gradients in `grads` (weights and biases, layer by layer):
/// dW as a matrix and db as a slice, both to be written.
fn layer_grads<G: ndarray::DataMut<Elem = f32>>(
    grads: &mut [ArrayBase<G, IxDyn>],
    l: usize,
) -> (ndarray::ArrayViewMut2<'_, f32>, &mut [f32]) {
    let (a, b) = grads[2 * l..2 * l + 2].split_at_mut(1);
    let dw = a[0]
        .view_mut()
        .into_dimensionality::<Ix2>()
        .expect("weights are rank 2");
    let db = b[0]
        .as_slice_mut()
        .expect("arrays built by dtf are contiguous");
    (dw, db)
}

/// Views `params` as (weights, biases) per layer of widths `layers` (input
/// first): the MLP's layers, or wide & deep's deep part.
///
/// Panics (with the variable's name) when the count or a shape is not what
/// the model's `variables()` says: callers receive parameters that the ps or
/// the checkpoint reader has already validated against the same specs, so a
/// mismatch here is a bug, not bad input.
fn layer_views<'a, S: Data<Elem = f32>>(
    layers: &[usize],
    params: &'a [ArrayBase<S, IxDyn>],
) -> Vec<(ArrayView2<'a, f32>, ArrayView1<'a, f32>)> {
    // Checked without building `variables()`: this runs every step.
    assert_eq!(
        params.len(),
        2 * (layers.len() - 1),
        "expected {} parameter arrays for layers {:?}, got {}",
        2 * (layers.len() - 1),
        layers,
        params.len()
    );
    for (l, (pair, w)) in params.chunks_exact(2).zip(layers.windows(2)).enumerate() {
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

#[cfg(test)]
mod tests;
pub mod wide_deep;

pub use ema::{ema_decay, ema_step};
pub use gradient::{Workspace, clip_by_global_norm, values_mut};
pub use hidden::{Activation, Hidden, HiddenBuffers};
pub use schedule::learning_rate;
pub use table::TableSpec;
pub use wide_deep::WideDeep;

use crate::kernel::Precision;
use ndarray::{ArrayBase, ArrayD, ArrayView1, ArrayView2, Data, Ix1, Ix2, IxDyn};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, StandardNormal};

/// A batch's labels as the loss and the metrics read them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Targets<'a> {
    /// A class index per row (`model.task = "classification"`): softmax cross-entropy.
    Classes(&'a [u8]),
    /// A real value per row (`model.task = "regression"`, a model of one output): mean
    /// squared error.
    Values(&'a [f32]),
}

impl Targets<'_> {
    /// The number of rows labelled.
    pub fn len(&self) -> usize {
        match self {
            Targets::Classes(l) => l.len(),
            Targets::Values(v) => v.len(),
        }
    }

    /// True when no row is labelled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> From<&'a [u8]> for Targets<'a> {
    fn from(labels: &'a [u8]) -> Self {
        Targets::Classes(labels)
    }
}

impl<'a> From<&'a Vec<u8>> for Targets<'a> {
    fn from(labels: &'a Vec<u8>) -> Self {
        Targets::Classes(labels)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for Targets<'a> {
    fn from(labels: &'a [u8; N]) -> Self {
        Targets::Classes(labels)
    }
}

impl<'a> From<&'a [f32]> for Targets<'a> {
    fn from(values: &'a [f32]) -> Self {
        Targets::Values(values)
    }
}

impl<'a> From<&'a Vec<f32>> for Targets<'a> {
    fn from(values: &'a Vec<f32>) -> Self {
        Targets::Values(values)
    }
}

/// Standard deviation of the truncated-normal weight initializer.
pub const INIT_STDDEV: f32 = 0.1;

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

/// The model a run trains (`model.kind`): what the worker steps, the chief
/// seeds and saves, and evaluation scores.
#[derive(Debug, Clone)]
pub enum Model {
    /// The dense MLP.
    Mlp(Mlp),
    /// Wide & deep over embedding tables on the ps.
    WideDeep(WideDeep),
}

impl Model {
    /// The model `model.kind` and `model.layers` (resolved from the data)
    /// describe, over `fields` categorical fields (wide & deep; 0 for the
    /// MLP), training in `precision`.
    ///
    /// Errors: [`ModelError::BadLayers`] for widths that are not a model of
    /// that kind (for wide & deep: an input narrower than `fields ·
    /// embedding_dim`, or an output other than one logit).
    pub fn new(
        cfg: &crate::config::ModelConfig,
        fields: usize,
        precision: Precision,
    ) -> Result<Self, ModelError> {
        let layers = &cfg.layers;
        let hidden = Hidden {
            activation: cfg.activation,
            dropout: cfg.dropout,
        };
        match cfg.kind {
            crate::config::ModelKind::Mlp => Ok(Model::Mlp(
                Mlp::new(layers)?
                    .with_precision(precision)
                    .with_hidden(hidden),
            )),
            crate::config::ModelKind::WideDeep => {
                let embedded = fields * cfg.embedding_dim;
                let bad = || ModelError::BadLayers(layers.to_vec());
                if layers.len() < 2 || layers[0] < embedded || layers[layers.len() - 1] != 1 {
                    return Err(bad());
                }
                let widths = &layers[1..layers.len() - 1];
                WideDeep::new(fields, layers[0] - embedded, cfg.embedding_dim, widths)
                    .map(|m| Model::WideDeep(m.with_precision(precision).with_hidden(hidden)))
                    .map_err(|_| bad())
            }
        }
    }

    /// The dense variables, in creation order (the same names for both
    /// kinds: `layerN/weights`, `layerN/biases`).
    pub fn variables(&self) -> Vec<VarSpec> {
        match self {
            Model::Mlp(m) => m.variables(),
            Model::WideDeep(m) => m.variables(),
        }
    }

    /// Fresh dense values, deterministic in `seed`.
    pub fn init(&self, seed: u64) -> Vec<ArrayD<f32>> {
        match self {
            Model::Mlp(m) => m.init(seed),
            Model::WideDeep(m) => m.init(seed),
        }
    }

    /// The dense widths, input first (wide & deep: its deep part).
    pub fn layers(&self) -> &[usize] {
        match self {
            Model::Mlp(m) => m.layers(),
            Model::WideDeep(m) => m.layers(),
        }
    }

    /// The classes the labels index: the MLP's outputs, 2 for wide & deep
    /// (one logit, a binary label).
    pub fn classes(&self) -> usize {
        match self {
            Model::Mlp(m) => m.classes(),
            Model::WideDeep(_) => 2,
        }
    }

    /// Dense features per example.
    pub fn dense_inputs(&self) -> usize {
        match self {
            Model::Mlp(m) => m.inputs(),
            Model::WideDeep(m) => m.dense(),
        }
    }
}

/// A multi-layer perceptron: hidden layers (ReLU unless `model.activation`
/// says otherwise), linear logits.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// Widths, input first, classes last.
    layers: Vec<usize>,
    /// The hidden layers' activation and dropout.
    hidden: Hidden,
    /// The training step's GEMMs' number format ([`Mlp::loss_and_grads_into`]);
    /// evaluation and prediction always compute in f32.
    precision: Precision,
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
            hidden: Hidden::default(),
            precision: Precision::Float32,
        })
    }

    /// The same model with `hidden`'s activation and dropout.
    pub fn with_hidden(mut self, hidden: Hidden) -> Self {
        self.hidden = hidden;
        self
    }

    /// The hidden layers' activation and dropout.
    pub fn hidden(&self) -> Hidden {
        self.hidden
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
        layer_variables(&self.layers)
    }

    /// Fresh values in `variables()` order: weights truncated normal (stddev 0.1,
    /// redrawn beyond 2σ), biases zero; deterministic in `seed`.
    ///
    /// One generator is drawn from in creation order, row-major within each
    /// matrix, so the same seed and layers always give the same values.
    pub fn init(&self, seed: u64) -> Vec<ArrayD<f32>> {
        init_values(self.variables(), WeightInit::TruncatedNormal, seed)
    }

    /// Views `params` as (weights, biases) per layer ([`layer_views`]).
    fn layer_views<'a, S: Data<Elem = f32>>(
        &self,
        params: &'a [ArrayBase<S, IxDyn>],
    ) -> Vec<(ArrayView2<'a, f32>, ArrayView1<'a, f32>)> {
        layer_views(&self.layers, params)
    }
}

/// `layerN/weights` [w_in, w_out] and `layerN/biases` [w_out] for each pair
/// of consecutive widths, in creation order (the MLP's and wide & deep's
/// deep part's variables).
fn layer_variables(layers: &[usize]) -> Vec<VarSpec> {
    layers
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

/// How a dense layer's weights start.
#[derive(Debug, Clone, Copy)]
enum WeightInit {
    /// Truncated normal ([`INIT_STDDEV`]): the MLP's reference program.
    TruncatedNormal,
    /// Glorot (Xavier) uniform — each value uniform in
    /// ±√(6 / (fan_in + fan_out)) — TensorFlow's default for
    /// `tf.compat.v1.layers.dense` and Keras's `Dense`.
    GlorotUniform,
}

/// Fresh values for `specs`: matrices as `init` says, vectors zero, from one
/// generator seeded with `seed`, drawn in order.
fn init_values(specs: Vec<VarSpec>, init: WeightInit, seed: u64) -> Vec<ArrayD<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    specs
        .into_iter()
        .map(|spec| match (init, &spec.shape[..]) {
            (WeightInit::TruncatedNormal, [_, _]) => {
                ArrayD::from_shape_simple_fn(spec.shape, || {
                    truncated_normal(&mut rng) * INIT_STDDEV
                })
            }
            (WeightInit::GlorotUniform, &[fan_in, fan_out]) => {
                let limit = (6.0 / (fan_in + fan_out) as f32).sqrt();
                let uniform = rand_distr::Uniform::new_inclusive(-limit, limit)
                    .expect("a finite limit above 0");
                ArrayD::from_shape_simple_fn(spec.shape, || uniform.sample(&mut rng))
            }
            _ => ArrayD::zeros(spec.shape),
        })
        .collect()
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
fn truncated_normal<R: rand::Rng + ?Sized>(rng: &mut R) -> f32 {
    loop {
        let z: f32 = StandardNormal.sample(rng);
        if z.abs() <= 2.0 {
            return z;
        }
    }
}
