//! The learning-rate schedule (`train.lr_schedule`): TensorFlow's
//! `exponential_decay` (the reference program's), `piecewise_constant` and
//! `cosine_decay`, with their names and semantics, after an optional linear
//! warmup (`train.warmup_steps`, as Keras's `CosineDecay` with
//! `warmup_target`: up to the schedule's first rate — `1/warmup_steps` of it
//! at step 0, all of it at step `warmup_steps − 1`, never 0, which a ps
//! refuses — the schedule then starting at its own step 0).

use crate::config::{LrSchedule, TrainConfig};

/// The rate at global step `step`; `epoch_steps` is `train_examples / batch_size`,
/// `exponential_decay`'s `decay_steps` unless `learning_rate_decay_steps` is set.
///
/// Computed in f64. The config guarantees what the formulas need
/// (`config::validate`): positive rates, increasing boundaries, one more value.
pub fn learning_rate(t: &TrainConfig, step: u64, epoch_steps: f64) -> f32 {
    let warmup = t.warmup_steps;
    if step < warmup {
        // Never 0 (a ps refuses a step of rate 0): the first step takes 1/warmup of it.
        let lr = scheduled(t, 0, epoch_steps) * (step + 1) as f64 / warmup as f64;
        return (lr as f32).max(f32::MIN_POSITIVE);
    }
    // cosine_decay ends at 0 with cosine_alpha = 0, as TF's: the step still counts and
    // moves nothing, at the smallest rate a ps takes (it refuses 0 as a worker's bug).
    (scheduled(t, step - warmup, epoch_steps) as f32).max(f32::MIN_POSITIVE)
}

/// The schedule alone at `step` steps after the warmup.
fn scheduled(t: &TrainConfig, step: u64, epoch_steps: f64) -> f64 {
    let base = f64::from(t.learning_rate);
    let decay_steps = |default: f64| match t.learning_rate_decay_steps {
        0 => default.max(1.0),
        n => n as f64,
    };
    match t.lr_schedule {
        LrSchedule::ExponentialDecay => {
            let mut p = step as f64 / decay_steps(epoch_steps);
            if t.staircase {
                p = p.floor();
            }
            base * f64::from(t.learning_rate_decay).powf(p)
        }
        LrSchedule::PiecewiseConstant => {
            // TF: values[0] while step ≤ boundaries[0], values[i] while
            // boundaries[i−1] < step ≤ boundaries[i], the last one after.
            let i = t.lr_boundaries.partition_point(|&b| b < step);
            f64::from(t.lr_values.get(i).copied().unwrap_or(t.learning_rate))
        }
        LrSchedule::CosineDecay => {
            let d = decay_steps(t.last_step.saturating_sub(t.warmup_steps) as f64);
            let s = (step as f64).min(d);
            let cosine = 0.5 * (1.0 + (std::f64::consts::PI * s / d).cos());
            let alpha = f64::from(t.cosine_alpha);
            base * ((1.0 - alpha) * cosine + alpha)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train() -> TrainConfig {
        TrainConfig {
            learning_rate: 0.01,
            learning_rate_decay: 0.99,
            ..TrainConfig::default()
        }
    }

    #[test]
    fn exponential_decay_is_continuous_per_epoch_or_staircase() {
        let t = train();
        assert_eq!(learning_rate(&t, 0, 600.0), 0.01);
        let want = 0.01 * 0.99f64.powf(1000.0 / 600.0);
        assert!((f64::from(learning_rate(&t, 1000, 600.0)) - want).abs() < 1e-9);
        let half = TrainConfig {
            learning_rate: 0.1,
            learning_rate_decay: 0.5,
            ..train()
        };
        // Exactly one decay per decay_steps.
        assert!((learning_rate(&half, 600, 600.0) - 0.05).abs() < 1e-8);
        assert!((learning_rate(&half, 1200, 600.0) - 0.025).abs() < 1e-8);
        // tf.train.exponential_decay(0.1, step, 100, 0.5, staircase=True).
        let stairs = TrainConfig {
            learning_rate_decay_steps: 100,
            staircase: true,
            ..half
        };
        assert_eq!(learning_rate(&stairs, 99, 600.0), 0.1);
        assert_eq!(learning_rate(&stairs, 100, 600.0), 0.05);
        assert_eq!(learning_rate(&stairs, 250, 600.0), 0.025);
    }

    #[test]
    fn piecewise_constant_changes_after_each_boundary() {
        // tf.train.piecewise_constant(step, [100, 200], [1.0, 0.5, 0.1]).
        let t = TrainConfig {
            lr_schedule: LrSchedule::PiecewiseConstant,
            lr_boundaries: vec![100, 200],
            lr_values: vec![1.0, 0.5, 0.1],
            ..train()
        };
        let at = |s| learning_rate(&t, s, 600.0);
        assert_eq!(
            [at(0), at(100), at(101), at(200), at(201), at(10_000)],
            [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]
        );
    }

    #[test]
    fn cosine_decay_falls_to_alpha_after_a_linear_warmup() {
        // tf.train.cosine_decay(0.1, step, 1000, alpha=0.1), 100 warmup steps first.
        let t = TrainConfig {
            learning_rate: 0.1,
            lr_schedule: LrSchedule::CosineDecay,
            learning_rate_decay_steps: 1000,
            cosine_alpha: 0.1,
            warmup_steps: 100,
            ..train()
        };
        let at = |s| f64::from(learning_rate(&t, s, 600.0));
        assert!((at(0) - 0.001).abs() < 1e-9);
        assert!((at(49) - 0.05).abs() < 1e-7);
        assert!((at(99) - 0.1).abs() < 1e-7);
        assert!((at(100) - 0.1).abs() < 1e-7);
        // Half way: cos(π/2) = 0, so (1 − α)/2 + α.
        assert!((at(600) - 0.1 * (0.45 + 0.1)).abs() < 1e-7);
        assert!((at(1100) - 0.01).abs() < 1e-7);
        assert!((at(5000) - 0.01).abs() < 1e-7);
        // With alpha 0 it ends at the smallest positive rate, not at 0.
        let to_zero = TrainConfig {
            cosine_alpha: 0.0,
            ..t.clone()
        };
        assert_eq!(learning_rate(&to_zero, 1100, 600.0), f32::MIN_POSITIVE);
        assert!(learning_rate(&to_zero, 1099, 600.0) > f32::MIN_POSITIVE);
        // A rate too small for f32 during a huge warmup is still a rate a ps takes.
        let tiny = TrainConfig {
            learning_rate: 1e-30,
            warmup_steps: 9_000_000_000_000_000_000,
            ..train()
        };
        assert_eq!(learning_rate(&tiny, 0, 600.0), f32::MIN_POSITIVE);
        // Without decay_steps it ends at last_step.
        let to_end = TrainConfig {
            learning_rate_decay_steps: 0,
            last_step: 1100,
            ..t
        };
        assert!((f64::from(learning_rate(&to_end, 1100, 600.0)) - 0.01).abs() < 1e-7);
    }
}
