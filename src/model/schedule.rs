//! The learning-rate schedule: TensorFlow's `exponential_decay`.

/// `base · decay^(step / decay_steps)` (continuous, TF's `exponential_decay`).
///
/// Computed in f64. `decay_steps` must be positive (the config guarantees it:
/// it is `train_examples / batch_size`).
pub fn learning_rate(base: f32, decay: f32, step: u64, decay_steps: f64) -> f32 {
    debug_assert!(decay_steps > 0.0, "decay_steps must be positive");
    (f64::from(base) * f64::from(decay).powf(step as f64 / decay_steps)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learning_rate_schedule() {
        assert_eq!(learning_rate(0.01, 0.99, 0, 600.0), 0.01);
        let want = 0.01 * 0.99f64.powf(1000.0 / 600.0);
        assert!((f64::from(learning_rate(0.01, 0.99, 1000, 600.0)) - want).abs() < 1e-9);
        // Exactly one decay per decay_steps.
        assert!((learning_rate(0.1, 0.5, 600, 600.0) - 0.05).abs() < 1e-8);
        assert!((learning_rate(0.1, 0.5, 1200, 600.0) - 0.025).abs() < 1e-8);
    }
}
