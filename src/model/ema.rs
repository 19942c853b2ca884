//! The moving average of the variables that evaluation and export use:
//! its decay, warmed up over the first steps, and its update rule.

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
}
