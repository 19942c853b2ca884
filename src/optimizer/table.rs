//! The optimizers of embedding rows (`[model.tables] optimizer` and
//! `linear_optimizer`): sparse rules that touch only the rows a push
//! brings, as TensorFlow's sparse kernels do — `ScatterSub` (SGD),
//! `SparseApplyAdagrad`, `SparseApplyFtrl` (FTRL-Proximal, McMahan et al.
//! 2013) and `LazyAdamOptimizer` (Adam's moments of the touched rows only;
//! dense Adam on a table would decay every row's moments every step).
//!
//! The ps's table (`ps/table`) holds each row's slots after its value and
//! EMA shadow and calls [`TableOptimizer::apply`] per element, with the
//! push's step size from [`TableOptimizer::rate`] (computed once a push).

use super::{Optimizer, adagrad, adam, adam_alpha};
use serde::{Deserialize, Serialize};

/// A table's update rule and its hyperparameters (the learning rate comes
/// with every push, from the schedule).
///
/// Serialized in a checkpoint's metadata (`table_optimizers`), e.g.
/// `{"name":"ftrl","learning_rate_power":-0.5,…}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum TableOptimizer {
    /// `w -= lr·g`; no slots.
    Sgd,
    /// `SparseApplyAdagrad`: one slot, `<table>/Adagrad`.
    Adagrad {
        /// What every accumulator starts at.
        initial_accumulator_value: f32,
    },
    /// `SparseApplyFtrl`: slots `<table>/Ftrl` (the accumulator `n`) and
    /// `<table>/Ftrl_1` (the linear term `z`).
    Ftrl {
        /// The power the accumulator is raised to (`-0.5`: `√n`).
        learning_rate_power: f32,
        /// What every accumulator starts at (TensorFlow: 0.1).
        initial_accumulator_value: f32,
        /// L1 strength: a weight whose `|z|` is at most it is exactly 0.
        l1: f32,
        /// L2 strength.
        l2: f32,
    },
    /// `LazyAdamOptimizer`: slots `<table>/Adam` (m) and `<table>/Adam_1`
    /// (v), updated for the pushed rows only.
    LazyAdam {
        /// Decay of the first moment.
        beta1: f32,
        /// Decay of the second moment.
        beta2: f32,
        /// Added to `√v`.
        epsilon: f32,
    },
}

impl TableOptimizer {
    /// The name in `dtf.toml`.
    pub fn name(&self) -> &'static str {
        match self {
            TableOptimizer::Sgd => "sgd",
            TableOptimizer::Adagrad { .. } => "adagrad",
            TableOptimizer::Ftrl { .. } => "ftrl",
            TableOptimizer::LazyAdam { .. } => "lazy_adam",
        }
    }

    /// The rule a table takes from a dense optimizer (`train.optimizer`,
    /// when `[model.tables]` names none): SGD and Adagrad have sparse
    /// forms of the same math; the others do not.
    pub fn from_dense(o: Optimizer) -> Option<Self> {
        match o {
            Optimizer::Sgd => Some(TableOptimizer::Sgd),
            Optimizer::Adagrad {
                initial_accumulator_value,
            } => Some(TableOptimizer::Adagrad {
                initial_accumulator_value,
            }),
            Optimizer::Momentum { .. } | Optimizer::Adam { .. } => None,
        }
    }

    /// Suffixes of a table's slots (`<table>/<suffix>`), TensorFlow's.
    pub fn slot_names(&self) -> &'static [&'static str] {
        match self {
            TableOptimizer::Sgd => &[],
            TableOptimizer::Adagrad { .. } => &["Adagrad"],
            TableOptimizer::Ftrl { .. } => &["Ftrl", "Ftrl_1"],
            TableOptimizer::LazyAdam { .. } => &["Adam", "Adam_1"],
        }
    }

    /// What slot `slot` of a new row starts at.
    pub fn slot_init(&self, slot: usize) -> f32 {
        match (self, slot) {
            (
                TableOptimizer::Adagrad {
                    initial_accumulator_value,
                }
                | TableOptimizer::Ftrl {
                    initial_accumulator_value,
                    ..
                },
                0,
            ) => *initial_accumulator_value,
            _ => 0.0,
        }
    }

    /// The hyperparameters as `key = value` for a log line.
    pub fn describe(&self) -> String {
        match self {
            TableOptimizer::Sgd => "sgd".into(),
            TableOptimizer::Adagrad {
                initial_accumulator_value,
            } => format!("adagrad (initial_accumulator_value = {initial_accumulator_value})"),
            TableOptimizer::Ftrl {
                learning_rate_power,
                initial_accumulator_value,
                l1,
                l2,
            } => format!(
                "ftrl (learning_rate_power = {learning_rate_power}, initial_accumulator_value = {initial_accumulator_value}, l1 = {l1}, l2 = {l2})"
            ),
            TableOptimizer::LazyAdam {
                beta1,
                beta2,
                epsilon,
            } => format!("lazy_adam (beta1 = {beta1}, beta2 = {beta2}, epsilon = {epsilon:e})"),
        }
    }

    /// The step size of a push at learning rate `lr` computed at global
    /// step `step`: `lr`, or for lazy Adam its bias-corrected
    /// `lr·√(1 − β2^t)/(1 − β1^t)` with `t = step + 1` — the powers are the
    /// step's, as Keras's Adam takes them from its iteration count, so a
    /// table keeps no non-slot scalars and every ps agrees on them.
    pub fn rate(&self, lr: f32, step: u64) -> f32 {
        match self {
            TableOptimizer::LazyAdam { beta1, beta2, .. } => {
                let t = i32::try_from(step.saturating_add(1)).unwrap_or(i32::MAX);
                adam_alpha(lr, beta1.powi(t), beta2.powi(t))
            }
            _ => lr,
        }
    }

    /// One element's update: its value `w`, gradient `g`, its slots (read
    /// and written in place) and the push's [`TableOptimizer::rate`].
    /// Returns the new value.
    #[inline(always)]
    pub fn apply(&self, w: f32, g: f32, slots: &mut [f32], rate: f32) -> f32 {
        match *self {
            TableOptimizer::Sgd => w - rate * g,
            TableOptimizer::Adagrad { .. } => {
                let (w, a) = adagrad(w, g, slots[0], rate);
                slots[0] = a;
                w
            }
            TableOptimizer::Ftrl {
                learning_rate_power,
                l1,
                l2,
                ..
            } => {
                let (w, n, z) = ftrl(w, g, slots[0], slots[1], rate, learning_rate_power, l1, l2);
                slots[0] = n;
                slots[1] = z;
                w
            }
            TableOptimizer::LazyAdam {
                beta1,
                beta2,
                epsilon,
            } => {
                let (w, m, v) = adam(w, g, slots[0], slots[1], rate, beta1, beta2, epsilon);
                slots[0] = m;
                slots[1] = v;
                w
            }
        }
    }
}

/// `ApplyFtrl` for one element (TensorFlow's `training_ops.cc`, FTRL-Proximal
/// with the accumulator `n` and the linear term `z`):
///
/// ```text
/// n' = n + g²
/// z += g − (n'^(−p) − n^(−p))/lr · w
/// w  = |z| > l1 ? (sign(z)·l1 − z) / (n'^(−p)/lr + 2·l2) : 0
/// ```
///
/// with `p = learning_rate_power` (`−0.5`: square roots, as TensorFlow
/// special-cases it). Returns the new `(w, n, z)`.
// The kernel's own inputs, one per argument as in TensorFlow's `ApplyFtrl`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn ftrl(
    w: f32,
    g: f32,
    n: f32,
    z: f32,
    lr: f32,
    power: f32,
    l1: f32,
    l2: f32,
) -> (f32, f32, f32) {
    let n_new = n + g * g;
    let (root_new, root) = if power == -0.5 {
        (n_new.sqrt(), n.sqrt())
    } else {
        (n_new.powf(-power), n.powf(-power))
    };
    let z = z + g - (root_new - root) / lr * w;
    let w = if z.abs() > l1 {
        (l1 * z.signum() - z) / (root_new / lr + 2.0 * l2)
    } else {
        0.0
    };
    (w, n_new, z)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FTRL: TableOptimizer = TableOptimizer::Ftrl {
        learning_rate_power: -0.5,
        initial_accumulator_value: 0.1,
        l1: 0.0,
        l2: 0.0,
    };

    fn close(a: f32, b: f64) {
        assert!(
            (f64::from(a) - b).abs() <= 2e-5 * b.abs().max(1e-3),
            "{a} vs {b}"
        );
    }

    #[test]
    fn ftrl_matches_the_update_computed_by_hand() {
        // w = 0.5, g = 0.2, n = 0.1, z = 0, lr = 0.1, no regularization:
        // n' = 0.14; z = 0.2 − (√0.14 − √0.1)/0.1 · 0.5 = 0.2 − 0.2899…;
        // w = −z / (√0.14/0.1).
        let (n1, r0) = (0.14f64, 0.1f64.sqrt());
        let z = 0.2 - (n1.sqrt() - r0) / 0.1 * 0.5;
        let w = -z / (n1.sqrt() / 0.1);
        let mut slots = [FTRL.slot_init(0), FTRL.slot_init(1)];
        assert_eq!(slots, [0.1, 0.0]);
        let got = FTRL.apply(0.5, 0.2, &mut slots, 0.1);
        close(got, w);
        close(slots[0], n1);
        close(slots[1], z);
        // A second step from there.
        let n2 = n1 + 0.3 * 0.3;
        let z2 = z + 0.3 - (n2.sqrt() - n1.sqrt()) / 0.1 * w;
        let w2 = -z2 / (n2.sqrt() / 0.1);
        close(FTRL.apply(got, 0.3, &mut slots, 0.1), w2);
        close(slots[1], z2);
    }

    #[test]
    fn ftrl_l1_zeroes_small_weights_and_l2_and_the_power_enter_the_denominator() {
        let opt = TableOptimizer::Ftrl {
            learning_rate_power: -0.5,
            initial_accumulator_value: 0.1,
            l1: 0.5,
            l2: 0.0,
        };
        // |z| = 0.2 ≤ l1 = 0.5 (from w = 0): the weight is exactly 0.
        let mut slots = [0.1, 0.0];
        assert_eq!(opt.apply(0.0, 0.2, &mut slots, 0.1), 0.0);
        close(slots[1], 0.2);
        // Past l1: shrunk by it. z = 0.2 + 0.6 (w = 0) = 0.8, n = 0.14 + 0.36.
        let got = opt.apply(0.0, 0.6, &mut slots, 0.1);
        close(got, (0.5 - 0.8) / (0.5f64.sqrt() / 0.1));
        // l2 and another power: w = −z / (n'^0.75/lr + 2·l2).
        let opt = TableOptimizer::Ftrl {
            learning_rate_power: -0.75,
            initial_accumulator_value: 0.1,
            l1: 0.0,
            l2: 0.3,
        };
        let mut slots = [0.1, 0.0];
        let n1 = 0.1f64 + 0.04;
        let z = 0.2 - (n1.powf(0.75) - 0.1f64.powf(0.75)) / 0.1 * 0.5;
        let w = -z / (n1.powf(0.75) / 0.1 + 0.6);
        close(opt.apply(0.5, 0.2, &mut slots, 0.1), w);
    }

    #[test]
    fn lazy_adam_is_adam_with_the_step_s_bias_correction_on_touched_rows() {
        let opt = TableOptimizer::LazyAdam {
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        };
        // At step 0 (t = 1): α = lr·√(1 − 0.999)/(1 − 0.9); m = 0.1·g,
        // v = 0.001·g²; w −= α·m/(√v + ε) ≈ lr·sign(g).
        let rate = opt.rate(0.01, 0);
        close(rate, 0.01 * (0.001f64).sqrt() / 0.1);
        let mut slots = [opt.slot_init(0), opt.slot_init(1)];
        let w = opt.apply(1.0, 0.5, &mut slots, rate);
        close(slots[0], 0.05);
        close(slots[1], 0.00025);
        let by_hand = 1.0 - f64::from(rate) * 0.05 / (0.00025f64.sqrt() + 1e-8);
        close(w, by_hand);
        assert!((w - 0.99).abs() < 1e-6, "{w}");
        // At step 9 (t = 10) the powers are the 10th.
        let t10 = 0.01 * (1.0 - 0.999f64.powi(10)).sqrt() / (1.0 - 0.9f64.powi(10));
        close(opt.rate(0.01, 9), t10);
        // Rows not pushed keep their moments: only `apply` changes them.
    }

    #[test]
    fn sgd_and_adagrad_are_the_dense_rules_on_rows() {
        let mut none: [f32; 0] = [];
        assert_eq!(TableOptimizer::Sgd.apply(1.0, 0.5, &mut none, 0.1), 0.95);
        let ada = TableOptimizer::from_dense(Optimizer::Adagrad {
            initial_accumulator_value: 0.1,
        })
        .unwrap();
        let mut slots = [ada.slot_init(0)];
        let w = ada.apply(1.0, 0.5, &mut slots, 0.1);
        assert_eq!((w, slots[0]), adagrad(1.0, 0.5, 0.1, 0.1));
        assert_eq!(
            TableOptimizer::from_dense(Optimizer::Adam {
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-8
            }),
            None
        );
    }

    #[test]
    fn the_metadata_form_round_trips() {
        let text = serde_json::to_string(&FTRL).unwrap();
        assert!(text.starts_with("{\"name\":\"ftrl\""), "{text}");
        assert_eq!(serde_json::from_str::<TableOptimizer>(&text).unwrap(), FTRL);
        let lazy: TableOptimizer = serde_json::from_str(
            r#"{"name":"lazy_adam","beta1":0.9,"beta2":0.999,"epsilon":1e-8}"#,
        )
        .unwrap();
        assert_eq!(lazy.name(), "lazy_adam");
    }
}
