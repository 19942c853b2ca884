//! The MLP and its math: forward, loss, backprop, init, learning-rate
//! schedule and EMA decay — the reference program's semantics exactly
//! (see docs/design.md "The model and its math").

use ndarray::{ArrayD, ArrayView2};

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
}

impl Mlp {
    /// Errors: [`ModelError::BadLayers`].
    pub fn new(layers: &[usize]) -> Result<Self, ModelError> {
        todo!()
    }

    pub fn layers(&self) -> &[usize] {
        &self.layers
    }

    /// Variables in creation order: layer1/weights, layer1/biases, layer2/weights, ...
    pub fn variables(&self) -> Vec<VarSpec> {
        todo!()
    }

    /// Fresh values in `variables()` order: weights truncated normal (stddev 0.1,
    /// redrawn beyond 2σ), biases zero; deterministic in `seed`.
    pub fn init(&self, seed: u64) -> Vec<ArrayD<f32>> {
        todo!()
    }

    /// Mean sparse softmax cross-entropy of the batch plus
    /// `regularization_rate · Σ‖W‖²/2` over weight matrices, and its gradient
    /// with respect to every variable (same order and shapes as `params`).
    pub fn loss_and_grads(
        &self,
        params: &[ArrayD<f32>],
        x: ArrayView2<f32>,
        labels: &[u8],
        regularization_rate: f32,
    ) -> (f32, Vec<ArrayD<f32>>) {
        todo!()
    }

    /// Fraction of rows whose arg-max logit equals the label.
    pub fn accuracy(&self, params: &[ArrayD<f32>], x: ArrayView2<f32>, labels: &[u8]) -> f32 {
        todo!()
    }
}

/// `base · decay^(step / decay_steps)` (continuous, TF's `exponential_decay`).
pub fn learning_rate(base: f32, decay: f32, step: u64, decay_steps: f64) -> f32 {
    todo!()
}

/// `min(moving_average_decay, (1 + step) / (10 + step))` (TF's EMA with num_updates).
pub fn ema_decay(moving_average_decay: f32, step: u64) -> f32 {
    todo!()
}

/// `shadow -= (1 − decay)(shadow − var)`.
pub fn ema_update(shadow: &mut ArrayD<f32>, var: &ArrayD<f32>, decay: f32) {
    todo!()
}
