//! Metrics of a regression model (`model.task = "regression"`): the mean squared error (its
//! test loss), the root-mean-square error and the mean absolute error of its predictions,
//! in one place for `dtf local`, `dtf eval`, the chief's final evaluation and the evaluator
//! (as [`crate::binary_metrics`] is for AUC and log loss).

/// A regression model's scores on labelled rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegressionMetrics {
    /// Mean of `(y − ŷ)²` (`tf.losses.mean_squared_error`): the test loss.
    pub mse: f32,
    /// `√mse`, in the label's own unit.
    pub rmse: f32,
    /// Mean of `|y − ŷ|`.
    pub mae: f32,
}

/// The metrics of `predictions` against `labels`, summed in f64; NaN for no rows, and NaN
/// where a prediction is (a model that diverged).
///
/// # Panics
///
/// When the two differ in length: one prediction per labelled row is the caller's to give.
pub fn regression_metrics(predictions: &[f32], labels: &[f32]) -> RegressionMetrics {
    assert_eq!(
        predictions.len(),
        labels.len(),
        "one prediction per labelled row"
    );
    let (mut squares, mut absolute) = (0.0f64, 0.0f64);
    for (&p, &y) in predictions.iter().zip(labels) {
        let d = f64::from(p) - f64::from(y);
        squares += d * d;
        absolute += d.abs();
    }
    let n = labels.len() as f64;
    let mse = squares / n;
    RegressionMetrics {
        mse: mse as f32,
        rmse: mse.sqrt() as f32,
        mae: (absolute / n) as f32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmse_and_mae_are_those_of_the_errors() {
        // Errors 1, −2, 0, 3: squares 1, 4, 0, 9; |·| 1, 2, 0, 3.
        let m = regression_metrics(&[2.0, 0.0, 5.0, 7.5], &[1.0, 2.0, 5.0, 4.5]);
        assert_eq!(m.mse, 3.5);
        assert_eq!(m.rmse, 3.5f64.sqrt() as f32);
        assert_eq!(m.mae, 1.5);
    }

    #[test]
    fn exact_predictions_score_zero_and_no_rows_or_a_nan_score_nan() {
        let m = regression_metrics(&[1.5, -2.0], &[1.5, -2.0]);
        assert_eq!((m.mse, m.rmse, m.mae), (0.0, 0.0, 0.0));
        assert!(regression_metrics(&[], &[]).rmse.is_nan());
        let m = regression_metrics(&[f32::NAN, 1.0], &[0.0, 1.0]);
        assert!(m.rmse.is_nan() && m.mae.is_nan());
    }
}
