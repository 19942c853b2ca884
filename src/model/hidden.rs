//! What a hidden layer does after its product: the activation
//! (`model.activation`, TensorFlow's `tf.nn.relu`, `tanh`, `sigmoid`, `gelu`)
//! and, in training only, dropout (`model.dropout`, as `tf.nn.dropout`: each
//! value kept with probability `1 − rate` and scaled by `1 / (1 − rate)`).
//! The last layer (the logits) has neither.
//!
//! Training keeps what the backward pass needs in [`HiddenBuffers`]: the
//! dropout masks (each value's scale: 0 or `1 / (1 − rate)`) and, for GELU,
//! whose derivative the output alone does not give, the pre-activations.

use ndarray::Array2;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// A hidden layer's activation (`model.activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// `max(z, 0)`: the reference program's.
    #[default]
    Relu,
    /// `tanh(z)`.
    Tanh,
    /// `1 / (1 + e^−z)`.
    Sigmoid,
    /// `z · Φ(z) = z/2 · (1 + erf(z/√2))`: `tf.nn.gelu` (its default, exact form).
    Gelu,
}

impl Activation {
    /// Every activation, in the order the docs list them.
    pub const ALL: [Activation; 4] = [
        Activation::Relu,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::Gelu,
    ];

    /// Its name in `dtf.toml` and in a checkpoint's metadata.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Tanh => "tanh",
            Activation::Sigmoid => "sigmoid",
            Activation::Gelu => "gelu",
        }
    }

    /// The activation called `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// `f(z)`.
    pub fn apply(self, z: f32) -> f32 {
        match self {
            Activation::Relu => {
                if z > 0.0 {
                    z
                } else {
                    0.0
                }
            }
            Activation::Tanh => z.tanh(),
            Activation::Sigmoid => sigmoid(z),
            Activation::Gelu => 0.5 * z * (1.0 + libm::erff(z * std::f32::consts::FRAC_1_SQRT_2)),
        }
    }

    /// `f′(z)`, from the output `a = f(z)` where that is enough, else from `z`.
    fn derivative(self, a: f32, z: f32) -> f32 {
        match self {
            // TF's ReluGrad: the output > 0 is the mask.
            Activation::Relu => f32::from(u8::from(a > 0.0)),
            Activation::Tanh => 1.0 - a * a,
            Activation::Sigmoid => a * (1.0 - a),
            // Φ(z) + z·φ(z).
            Activation::Gelu => {
                let cdf = 0.5 * (1.0 + libm::erff(z * std::f32::consts::FRAC_1_SQRT_2));
                let pdf = (-0.5 * z * z).exp() * 0.398_942_3; // 1/√(2π)
                cdf + z * pdf
            }
        }
    }
}

/// The logistic function, never overflowing.
pub fn sigmoid(z: f32) -> f32 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// The hidden layers' activation and dropout rate: part of a model.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Hidden {
    /// Every hidden layer's activation.
    pub activation: Activation,
    /// The probability that training drops a hidden value; 0: none.
    pub dropout: f32,
}

/// What training keeps of the hidden layers for the backward pass; sized by
/// the forward pass, kept across steps. The generator that draws the masks
/// starts at the seed given ([`HiddenBuffers::seed`]), else at 0.
#[derive(Debug, Default)]
pub struct HiddenBuffers {
    /// Hidden layer `l`'s pre-activations (GELU only).
    pre: Vec<Array2<f32>>,
    /// Hidden layer `l`'s dropout scales: 0 or `1 / (1 − rate)` (dropout only).
    masks: Vec<Array2<f32>>,
    /// Draws the masks.
    rng: Option<SmallRng>,
}

impl HiddenBuffers {
    /// Seeds the masks' generator (each worker its own: the run's seed and its index).
    pub fn seed(&mut self, seed: u64) {
        self.rng = Some(SmallRng::seed_from_u64(seed));
    }
}

impl Hidden {
    /// Hidden layer `l`'s output from its product `z`, in place. In training
    /// (`buffers` given) what the backward pass needs is kept and dropout
    /// applied; in evaluation (`None`) only the activation.
    pub(super) fn forward(
        &self,
        l: usize,
        z: &mut Array2<f32>,
        buffers: Option<&mut HiddenBuffers>,
    ) {
        let Some(b) = buffers else {
            self.activate(z);
            return;
        };
        if self.activation == Activation::Gelu {
            fit(&mut b.pre, l, z.dim()).assign(z);
        }
        self.activate(z);
        if self.dropout > 0.0 {
            let keep = 1.0 - self.dropout;
            let scale = 1.0 / keep;
            let rng = b.rng.get_or_insert_with(|| SmallRng::seed_from_u64(0));
            let mask = fit(&mut b.masks, l, z.dim());
            for (m, v) in mask.iter_mut().zip(z.iter_mut()) {
                *m = if rng.random::<f32>() < keep {
                    scale
                } else {
                    0.0
                };
                *v *= *m;
            }
        }
    }

    /// The activation over `z`, in place: one loop per kind, the match outside it, so that
    /// ReLU's (the hot path of the reference model) stays a vectorized select.
    fn activate(&self, z: &mut Array2<f32>) {
        match self.activation {
            Activation::Relu => z.mapv_inplace(|v| if v > 0.0 { v } else { 0.0 }),
            Activation::Tanh => z.mapv_inplace(f32::tanh),
            Activation::Sigmoid => z.mapv_inplace(sigmoid),
            Activation::Gelu => z.mapv_inplace(|v| Activation::Gelu.apply(v)),
        }
    }

    /// Turns `da` (∂loss/∂ hidden layer `l`'s output) into ∂loss/∂ its
    /// product, in place, given that output `a` (after dropout) and what
    /// [`Hidden::forward`] kept.
    pub(super) fn backward(&self, l: usize, da: &mut [f32], a: &[f32], buffers: &HiddenBuffers) {
        let act = self.activation;
        let pre = (act == Activation::Gelu).then(|| slice(&buffers.pre[l]));
        if self.dropout > 0.0 {
            let mask = slice(&buffers.masks[l]);
            for (i, (g, &m)) in da.iter_mut().zip(mask).enumerate() {
                // Kept values were scaled by m: the activation's output was a / m.
                *g = if m != 0.0 {
                    *g * m * act.derivative(a[i] / m, pre.map_or(0.0, |p| p[i]))
                } else {
                    0.0
                };
            }
            return;
        }
        match (act, pre) {
            // A select, not a branch: the loop vectorizes.
            (Activation::Relu, _) => {
                for (g, &a) in da.iter_mut().zip(a) {
                    *g = if a > 0.0 { *g } else { 0.0 };
                }
            }
            (_, Some(pre)) => {
                for ((g, &a), &z) in da.iter_mut().zip(a).zip(pre) {
                    *g *= act.derivative(a, z);
                }
            }
            (_, None) => {
                for (g, &a) in da.iter_mut().zip(a) {
                    *g *= act.derivative(a, 0.0);
                }
            }
        }
    }
}

/// `bufs[l]`, made `dim` (the list grown as needed).
fn fit(bufs: &mut Vec<Array2<f32>>, l: usize, dim: (usize, usize)) -> &mut Array2<f32> {
    if bufs.len() <= l {
        bufs.resize_with(l + 1, || Array2::zeros((0, 0)));
    }
    if bufs[l].dim() != dim {
        bufs[l] = Array2::zeros(dim);
    }
    &mut bufs[l]
}

/// A buffer's values, row-major.
fn slice(a: &Array2<f32>) -> &[f32] {
    a.as_slice().expect("buffers built here are contiguous")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each derivative against a central difference of its activation.
    #[test]
    fn derivatives_match_finite_differences() {
        for act in Activation::ALL {
            for z in [-3.0f32, -1.1, -0.3, 0.2, 0.9, 2.5] {
                let h = 1e-3;
                let numeric = (f64::from(act.apply(z + h)) - f64::from(act.apply(z - h)))
                    / (2.0 * f64::from(h));
                let analytic = f64::from(act.derivative(act.apply(z), z));
                assert!(
                    (numeric - analytic).abs() < 2e-3,
                    "{act:?} at {z}: {analytic} vs {numeric}"
                );
            }
            assert_eq!(Activation::from_name(act.name()), Some(act));
        }
        // tf.nn.gelu(1.0) = 0.8413447.
        assert!((Activation::Gelu.apply(1.0) - 0.841_344_7).abs() < 1e-6);
    }

    /// Dropout keeps about 1 − rate of the values, scales them by 1/(1 − rate),
    /// leaves evaluation alone, and passes gradients only through kept values.
    #[test]
    fn dropout_drops_in_training_only_and_scales_what_it_keeps() {
        let hidden = Hidden {
            activation: Activation::Tanh,
            dropout: 0.25,
        };
        let z = Array2::from_shape_fn((200, 50), |(i, j)| ((i * 50 + j) % 17) as f32 / 17.0 + 0.1);
        let mut eval = z.clone();
        hidden.forward(0, &mut eval, None);
        assert_eq!(eval, z.mapv(f32::tanh));
        let mut train = z.clone();
        let mut b = HiddenBuffers::default();
        b.seed(7);
        hidden.forward(0, &mut train, Some(&mut b));
        let kept = train.iter().filter(|&&v| v != 0.0).count() as f64 / train.len() as f64;
        assert!((kept - 0.75).abs() < 0.02, "kept {kept}");
        for (t, e) in train.iter().zip(eval.iter()) {
            assert!(*t == 0.0 || (t - e / 0.75).abs() < 1e-6);
        }
        let mut da = vec![1.0f32; train.len()];
        hidden.backward(0, &mut da, train.as_slice().unwrap(), &b);
        for ((g, t), e) in da.iter().zip(train.iter()).zip(eval.iter()) {
            let want = if *t == 0.0 { 0.0 } else { (1.0 - e * e) / 0.75 };
            assert!((g - want).abs() < 1e-5, "{g} vs {want}");
        }
    }
}
