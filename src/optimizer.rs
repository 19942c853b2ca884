//! The optimizers, as TensorFlow 1.x computes them: `GradientDescent`,
//! `Momentum` (with Nesterov), `Adam` and `Adagrad`, their slot variables and
//! TensorFlow's names for them; `table`: the sparse rules of embedding rows
//! (SGD, Adagrad, FTRL-Proximal, lazy Adam).
//!
//! The ps owns the slots (docs/design.md, "Optimizers and their slots"): each
//! shard keeps the slots of its variables beside them and updates both under
//! one lock, so no slot crosses the wire on a training step. This module is
//! the math and the naming; the ps's shard (`ps/shard.rs`) holds the state,
//! and imports this module, never the other way.
//!
//! The per-element rules are TensorFlow's kernels (`training_ops.cc`:
//! `ApplyMomentum`, `ApplyAdam`, `ApplyAdagrad`) written out in the same
//! order of f32 operations, so a step agrees with TensorFlow to rounding.

use crate::model::VarSpec;
use ndarray::{ArrayD, IxDyn};
use serde::{Deserialize, Serialize};

pub mod table;
pub use table::TableOptimizer;

/// The most slots an optimizer keeps per variable (Adam's `m` and `v`): what
/// message and file bounds allow for.
pub const MAX_SLOTS: usize = 2;

/// An optimizer and its hyperparameters (the learning rate is not one: it
/// comes with every push, from the schedule).
///
/// Serialized as checkpoint metadata, e.g.
/// `{"name":"adam","beta1":0.9,"beta2":0.999,"epsilon":1e-8}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "lowercase")]
pub enum Optimizer {
    /// `GradientDescentOptimizer`: `w -= lr·g`; no slots.
    Sgd,
    /// `MomentumOptimizer`: one slot, `<var>/Momentum`.
    Momentum {
        /// The accumulator's decay.
        momentum: f32,
        /// Nesterov's variant.
        use_nesterov: bool,
    },
    /// `AdamOptimizer`: slots `<var>/Adam` (m) and `<var>/Adam_1` (v), and
    /// the non-slot scalars `beta1_power`, `beta2_power`.
    Adam {
        /// Decay of the first moment.
        beta1: f32,
        /// Decay of the second moment.
        beta2: f32,
        /// TensorFlow's "epsilon hat", added to `√v`.
        epsilon: f32,
    },
    /// `AdagradOptimizer`: one slot, `<var>/Adagrad`.
    Adagrad {
        /// What every accumulator starts at (TensorFlow requires it positive).
        initial_accumulator_value: f32,
    },
}

/// One slot or non-slot tensor of an optimizer for a list of variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotSpec {
    /// TensorFlow's name: `layer1/weights/Adam`, or `beta1_power`.
    pub name: String,
    /// The variable's shape; `[]` for a non-slot scalar.
    pub shape: Vec<usize>,
    /// Index of the variable (in the list given) this slot belongs to;
    /// `None` for a non-slot scalar, which every shard keeps a copy of.
    pub var: Option<usize>,
    /// Index into [`Optimizer::slot_names`] (or [`Optimizer::non_slot_names`]).
    pub index: usize,
}

impl Optimizer {
    /// The config's and the metadata's name: `sgd`, `momentum`, `adam`, `adagrad`.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Momentum { .. } => "momentum",
            Optimizer::Adam { .. } => "adam",
            Optimizer::Adagrad { .. } => "adagrad",
        }
    }

    /// Suffixes of the slots of each variable (`<var>/<suffix>`), TensorFlow's.
    pub fn slot_names(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd => &[],
            Optimizer::Momentum { .. } => &["Momentum"],
            Optimizer::Adam { .. } => &["Adam", "Adam_1"],
            Optimizer::Adagrad { .. } => &["Adagrad"],
        }
    }

    /// Names of the non-slot scalars (Adam's bias-correction powers).
    pub fn non_slot_names(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Adam { .. } => &["beta1_power", "beta2_power"],
            _ => &[],
        }
    }

    /// What a fresh slot holds: TensorFlow's zeros, or Adagrad's initial accumulator.
    pub fn slot_init(&self) -> f32 {
        match self {
            Optimizer::Adagrad {
                initial_accumulator_value,
            } => *initial_accumulator_value,
            _ => 0.0,
        }
    }

    /// What the non-slot scalars start at: TensorFlow initializes
    /// `beta1_power` to `beta1` (the power of the first step), likewise `beta2`.
    pub fn non_slot_init(&self) -> Vec<f32> {
        match self {
            Optimizer::Adam { beta1, beta2, .. } => vec![*beta1, *beta2],
            _ => Vec::new(),
        }
    }

    /// Every slot of `vars` (variable by variable, in the order of
    /// [`Optimizer::slot_names`]), then the non-slot scalars: the one order
    /// slots have on the wire, in checkpoints and in memory.
    pub fn slot_specs(&self, vars: &[VarSpec]) -> Vec<SlotSpec> {
        let slots = vars.iter().enumerate().flat_map(|(i, v)| {
            self.slot_names()
                .iter()
                .enumerate()
                .map(move |(k, s)| SlotSpec {
                    name: format!("{}/{s}", v.name),
                    shape: v.shape.clone(),
                    var: Some(i),
                    index: k,
                })
        });
        let non_slots = self
            .non_slot_names()
            .iter()
            .enumerate()
            .map(|(k, n)| SlotSpec {
                name: (*n).to_owned(),
                shape: Vec::new(),
                var: None,
                index: k,
            });
        slots.chain(non_slots).collect()
    }

    /// Fresh slots for `vars`, in [`Optimizer::slot_specs`] order.
    pub fn initial_slots(&self, vars: &[VarSpec]) -> Vec<ArrayD<f32>> {
        let powers = self.non_slot_init();
        self.slot_specs(vars)
            .into_iter()
            .map(|s| match s.var {
                Some(_) => ArrayD::from_elem(IxDyn(&s.shape), self.slot_init()),
                None => ArrayD::from_elem(IxDyn(&[]), powers[s.index]),
            })
            .collect()
    }

    /// The hyperparameters as `key = value` for a log line.
    pub fn describe(&self) -> String {
        match self {
            Optimizer::Sgd => "sgd".into(),
            Optimizer::Momentum {
                momentum,
                use_nesterov,
            } => format!("momentum (momentum = {momentum}, use_nesterov = {use_nesterov})"),
            Optimizer::Adam {
                beta1,
                beta2,
                epsilon,
            } => format!("adam (beta1 = {beta1}, beta2 = {beta2}, epsilon = {epsilon:e})"),
            Optimizer::Adagrad {
                initial_accumulator_value,
            } => format!("adagrad (initial_accumulator_value = {initial_accumulator_value})"),
        }
    }
}

/// Which variable's shard keeps the non-slot scalars that a checkpoint
/// saves: TensorFlow colocates them with the variable whose name sorts first
/// (`min(var_list, key=name)`). Every shard keeps and advances its own copy,
/// so applying an update never waits on another ps; the copies agree as long
/// as every shard applies every step (see docs/design.md).
pub fn non_slot_owner(vars: &[VarSpec]) -> Option<usize> {
    (0..vars.len()).min_by(|&a, &b| vars[a].name.cmp(&vars[b].name))
}

/// A non-slot scalar (Adam's `beta1_power`) outside what the rule can use.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{name} = {value}: expected a number in [0, 1) (a power of beta1 or beta2)")]
pub struct NonSlotError {
    /// The scalar's name (`beta1_power`).
    pub name: String,
    /// Its value.
    pub value: f32,
}

/// Checks a non-slot scalar: Adam divides by `1 − beta1_power`.
///
/// Errors: [`NonSlotError`] for a value outside `[0, 1)`.
pub fn check_non_slot(name: &str, value: f32) -> Result<(), NonSlotError> {
    if (0.0..1.0).contains(&value) {
        Ok(())
    } else {
        Err(NonSlotError {
            name: name.to_owned(),
            value,
        })
    }
}

/// `ApplyMomentum` for one element: `accum = accum·momentum + g`, then
/// `w −= accum·lr`, or with Nesterov `w −= g·lr + accum·momentum·lr`.
/// Returns the new `(w, accum)`.
#[inline(always)]
pub fn momentum(w: f32, g: f32, accum: f32, lr: f32, momentum: f32, nesterov: bool) -> (f32, f32) {
    let accum = accum * momentum + g;
    let w = if nesterov {
        w - (g * lr + accum * momentum * lr)
    } else {
        w - accum * lr
    };
    (w, accum)
}

/// Adam's step size for this update, `lr·√(1 − beta2_power)/(1 − beta1_power)`
/// (TensorFlow computes it once per apply, in the variable's dtype).
#[inline]
pub fn adam_alpha(lr: f32, beta1_power: f32, beta2_power: f32) -> f32 {
    lr * (1.0 - beta2_power).sqrt() / (1.0 - beta1_power)
}

/// `ApplyAdam` for one element, given [`adam_alpha`]:
/// `m += (g − m)(1 − β1)`, `v += (g² − v)(1 − β2)`, `w −= m·α/(√v + ε)`.
/// Returns the new `(w, m, v)`.
// The kernel's own inputs, one per argument as in TensorFlow's `ApplyAdam`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn adam(
    w: f32,
    g: f32,
    m: f32,
    v: f32,
    alpha: f32,
    beta1: f32,
    beta2: f32,
    epsilon: f32,
) -> (f32, f32, f32) {
    let m = m + (g - m) * (1.0 - beta1);
    let v = v + (g * g - v) * (1.0 - beta2);
    (w - (m * alpha) / (v.sqrt() + epsilon), m, v)
}

/// `ApplyAdagrad` for one element: `accum += g²`, `w −= g·lr/√accum`.
/// Returns the new `(w, accum)`.
#[inline(always)]
pub fn adagrad(w: f32, g: f32, accum: f32, lr: f32) -> (f32, f32) {
    let accum = accum + g * g;
    (w - g * lr * (1.0 / accum.sqrt()), accum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f64) {
        assert!(
            (f64::from(a) - b).abs() <= 1e-6 * b.abs().max(1e-3),
            "{a} vs {b}"
        );
    }

    // The references below are worked by hand (in f64) from TensorFlow's
    // kernels; f32 agrees to a few ulps.

    #[test]
    fn momentum_and_nesterov_match_tensorflow() {
        // w = 1, accum = 0, lr = 0.1, momentum = 0.9; g = 0.5, then g = -1.
        // Momentum: accum = 0.5, w = 1 − 0.05 = 0.95; then
        //   accum = 0.45 − 1 = −0.55, w = 0.95 + 0.055 = 1.005.
        // Nesterov: accum = 0.5, w = 1 − (0.05 + 0.5·0.9·0.1) = 0.905; then
        //   accum = −0.55, w = 0.905 − (−0.1 + (−0.55)(0.9)(0.1)) = 1.0545.
        for (nesterov, w1, w2) in [(false, 0.95, 1.005), (true, 0.905, 1.0545)] {
            let (w, a) = momentum(1.0, 0.5, 0.0, 0.1, 0.9, nesterov);
            close(a, 0.5);
            close(w, w1);
            let (w, a) = momentum(w, -1.0, a, 0.1, 0.9, nesterov);
            close(a, -0.55);
            close(w, w2);
        }
    }

    /// β1 and β2 as TensorFlow holds them: f32 (0.999 is not exact in f32,
    /// and `1 − β2` shows it in the sixth digit).
    const B1: f64 = 0.9f32 as f64;
    const B2: f64 = 0.999f32 as f64;

    #[test]
    fn adam_matches_tensorflow_including_bias_correction() {
        let (b1, b2, eps, lr) = (0.9f32, 0.999f32, 1e-8f32, 0.001f32);
        // Step 1: the powers start at β1, β2: α = lr·√(1 − β2)/(1 − β1).
        let alpha = adam_alpha(lr, b1, b2);
        let a1 = 0.001 * (1.0 - B2).sqrt() / (1.0 - B1);
        close(alpha, a1);
        // g = 0.5: m = 0.5·(1 − β1) = 0.05, v = 0.25·(1 − β2) ≈ 0.00025,
        // w = 1 − m·α/(√v + ε).
        let (w, m, v) = adam(1.0, 0.5, 0.0, 0.0, alpha, b1, b2, eps);
        let (m1, v1) = (0.5 * (1.0 - B1), 0.25 * (1.0 - B2));
        close(m, m1);
        close(v, v1);
        close(w, 1.0 - m1 * a1 / (v1.sqrt() + 1e-8));
        // The bias correction makes the first step lr·sign(g).
        assert!((1.0 - f64::from(w) - 0.001).abs() < 1e-6, "{w}");
        // Step 2: powers β1², β2²; g = −1.
        let alpha2 = adam_alpha(lr, b1 * b1, b2 * b2);
        let (w2, m2, v2) = adam(w, -1.0, m, v, alpha2, b1, b2, eps);
        let m2_want = m1 + (-1.0 - m1) * (1.0 - B1);
        let v2_want = v1 + (1.0 - v1) * (1.0 - B2);
        close(m2, m2_want);
        close(v2, v2_want);
        let a2 = 0.001 * (1.0 - B2 * B2).sqrt() / (1.0 - B1 * B1);
        close(w2, f64::from(w) - (m2_want * a2) / (v2_want.sqrt() + 1e-8));
    }

    #[test]
    fn adagrad_matches_tensorflow() {
        // accum starts at 0.1; lr = 0.1; g = 0.5 then g = 1.
        let (w, a) = adagrad(1.0, 0.5, 0.1, 0.1);
        // accum = 0.35; w = 1 − 0.05/√0.35 = 1 − 0.0845154255
        close(a, 0.35);
        close(w, 1.0 - 0.05 / 0.35f64.sqrt());
        let (w2, a2) = adagrad(w, 1.0, a, 0.1);
        close(a2, 1.35);
        close(w2, f64::from(w) - 0.1 / 1.35f64.sqrt());
    }

    #[test]
    fn slots_are_named_as_tensorflow_names_them() {
        let vars = vec![
            VarSpec {
                name: "layer1/weights".into(),
                shape: vec![2, 3],
            },
            VarSpec {
                name: "layer1/biases".into(),
                shape: vec![3],
            },
        ];
        let adam = Optimizer::Adam {
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        };
        let names: Vec<String> = adam.slot_specs(&vars).into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "layer1/weights/Adam",
                "layer1/weights/Adam_1",
                "layer1/biases/Adam",
                "layer1/biases/Adam_1",
                "beta1_power",
                "beta2_power"
            ]
        );
        let init = adam.initial_slots(&vars);
        assert_eq!(init[0].shape(), &[2, 3]);
        assert_eq!(init[4].shape(), &[] as &[usize]);
        assert_eq!(init[4].first(), Some(&0.9));
        let adagrad = Optimizer::Adagrad {
            initial_accumulator_value: 0.1,
        };
        assert!(adagrad.initial_slots(&vars)[1].iter().all(|&x| x == 0.1));
        assert_eq!(
            Optimizer::Momentum {
                momentum: 0.9,
                use_nesterov: false
            }
            .slot_specs(&vars)[1]
                .name,
            "layer1/biases/Momentum"
        );
        assert!(Optimizer::Sgd.slot_specs(&vars).is_empty());
        // TensorFlow colocates the powers with the variable whose name sorts first.
        assert_eq!(non_slot_owner(&vars), Some(1));
    }

    #[test]
    fn metadata_round_trips() {
        for o in [
            Optimizer::Sgd,
            Optimizer::Adam {
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8,
            },
            Optimizer::Momentum {
                momentum: 0.5,
                use_nesterov: true,
            },
        ] {
            let json = serde_json::to_string(&o).unwrap();
            assert!(
                json.contains(&format!("\"name\":\"{}\"", o.name())),
                "{json}"
            );
            assert_eq!(serde_json::from_str::<Optimizer>(&json).unwrap(), o);
        }
        assert!(check_non_slot("beta1_power", 1.0).is_err());
        assert!(check_non_slot("beta1_power", 0.5).is_ok());
    }
}
