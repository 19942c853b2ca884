//! The training keys beyond the run's shape: the optimizers' hyperparameters and the
//! learning-rate schedule (with the gradients' clip norm).

use super::super::schema::{Config, LrSchedule};
use super::{ConfigError, MAX_LEARNING_RATE, TOML_MAX, invalid};

impl Config {
    /// The optimizers' hyperparameters, every one of them whichever optimizer
    /// is chosen: a bad value is a mistake even where it is not used yet.
    pub(super) fn validate_optimizer(&self) -> Result<(), ConfigError> {
        let t = &self.train;
        // A decay of 1 or more never forgets (Adam's bias correction then
        // divides by zero); below 0 it oscillates.
        for (key, value) in [
            ("train.momentum", t.momentum),
            ("train.beta1", t.beta1),
            ("train.beta2", t.beta2),
        ] {
            if !(0.0..1.0).contains(&value) {
                return Err(self.bad(key, invalid(value, "a number in [0, 1)")));
            }
        }
        // Adam divides by `√v + epsilon` with `v` starting at 0, Adagrad by
        // `√accum`: either at 0 divides zero by zero on a zero gradient.
        for (key, value) in [
            ("train.epsilon", t.epsilon),
            (
                "train.initial_accumulator_value",
                t.initial_accumulator_value,
            ),
        ] {
            if !(value > 0.0 && value.is_finite()) {
                return Err(self.bad(key, invalid(value, "a finite number above 0")));
            }
        }
        self.validate_tables()
    }

    /// `[model]`: at least two widths, none zero; `hidden` only without `layers`.
    /// The learning-rate schedule's keys, each checked whichever schedule is chosen (a bad
    /// value is a mistake even where it is not used yet), and the gradients' clip norm.
    pub(super) fn validate_schedule(&self) -> Result<(), ConfigError> {
        let t = &self.train;
        if let Some(i) = t.lr_boundaries.windows(2).position(|w| w[0] >= w[1]) {
            return Err(self.bad(
                &format!("train.lr_boundaries[{}]", i + 1),
                invalid(t.lr_boundaries[i + 1], "steps in increasing order"),
            ));
        }
        if let Some(i) = t
            .lr_values
            .iter()
            .position(|&v| !(v > 0.0 && v <= MAX_LEARNING_RATE))
        {
            return Err(self.bad(
                &format!("train.lr_values[{i}]"),
                invalid(
                    t.lr_values[i],
                    &format!("a number in (0, {MAX_LEARNING_RATE}]"),
                ),
            ));
        }
        let piecewise = t.lr_schedule == LrSchedule::PiecewiseConstant;
        if (piecewise || !t.lr_values.is_empty()) && t.lr_values.len() != t.lr_boundaries.len() + 1
        {
            return Err(self.bad(
                "train.lr_values",
                format!(
                    "has {} rates for {} train.lr_boundaries: piecewise_constant needs one \
                     rate more than boundaries, e.g. lr_boundaries = [1000, 2000], \
                     lr_values = [0.1, 0.01, 0.001]",
                    t.lr_values.len(),
                    t.lr_boundaries.len()
                ),
            ));
        }
        if !(0.0..=1.0).contains(&t.cosine_alpha) {
            return Err(self.bad(
                "train.cosine_alpha",
                invalid(t.cosine_alpha, "a number in [0, 1]"),
            ));
        }
        if !(t.clip_norm >= 0.0 && t.clip_norm.is_finite()) {
            return Err(self.bad(
                "train.clip_norm",
                invalid(t.clip_norm, "a finite number >= 0 (0: no clipping)"),
            ));
        }
        for (key, value) in [
            (
                "train.learning_rate_decay_steps",
                t.learning_rate_decay_steps,
            ),
            ("train.warmup_steps", t.warmup_steps),
        ] {
            if value > TOML_MAX {
                return Err(self.bad(key, invalid(value, "an integer of at most 2^63 - 1")));
            }
        }
        Ok(())
    }

    /// `[model.tables]`, whatever the model (a bad value is a mistake even
    /// where no table uses it): `min_count` within the admission sketch's
    /// one-byte counters, `steps_to_live` within a row's `u32` stamp,
    /// `max_rows` within a table's `u32` row index.
    pub(super) fn validate_table_policy(&self) -> Result<(), ConfigError> {
        let t = &self.model.tables;
        if !(1..=255).contains(&t.min_count) {
            return Err(self.bad(
                "model.tables.min_count",
                invalid(
                    t.min_count,
                    "1 to 255 (pushes of an id before its row is created; 1: at once)",
                ),
            ));
        }
        if t.steps_to_live > u64::from(u32::MAX) {
            return Err(self.bad(
                "model.tables.steps_to_live",
                invalid(
                    t.steps_to_live,
                    &format!("0 (never) to {} global steps", u32::MAX),
                ),
            ));
        }
        if t.max_rows > u64::from(u32::MAX) {
            return Err(self.bad(
                "model.tables.max_rows",
                invalid(
                    t.max_rows,
                    &format!("0 (unbounded) to {} rows per table per ps", u32::MAX),
                ),
            ));
        }
        for (key, value) in [
            ("model.tables.learning_rate", t.learning_rate),
            ("model.tables.linear_learning_rate", t.linear_learning_rate),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(self.bad(key, invalid(value, "a rate ≥ 0 (0: train.learning_rate's)")));
            }
        }
        // TensorFlow's FtrlOptimizer refuses the same.
        let ftrl = [
            (
                "model.tables.ftrl_l1",
                t.ftrl_l1,
                t.ftrl_l1 >= 0.0,
                "a number ≥ 0",
            ),
            (
                "model.tables.ftrl_l2",
                t.ftrl_l2,
                t.ftrl_l2 >= 0.0,
                "a number ≥ 0",
            ),
            (
                "model.tables.ftrl_learning_rate_power",
                t.ftrl_learning_rate_power,
                t.ftrl_learning_rate_power <= 0.0,
                "a number ≤ 0 (-0.5: the accumulator's square root)",
            ),
            (
                "model.tables.ftrl_initial_accumulator_value",
                t.ftrl_initial_accumulator_value,
                t.ftrl_initial_accumulator_value > 0.0,
                "a positive number, e.g. 0.1",
            ),
        ];
        for (key, value, ok, expected) in ftrl {
            if !(value.is_finite() && ok) {
                return Err(self.bad(key, invalid(value, expected)));
            }
        }
        Ok(())
    }
}
