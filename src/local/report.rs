//! What `dtf local` reports of a trained run: its summary and `--json`.

use serde::Serialize;
use std::path::PathBuf;

/// What a trained run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The final checkpoint's step.
    pub global_step: u64,
    /// Test accuracy of the raw variables (NaN, not written, for a regression model).
    #[serde(skip_serializing_if = "crate::eval::is_nan")]
    pub test_accuracy: f32,
    /// Test accuracy of the EMA shadows (as `test_accuracy`).
    #[serde(skip_serializing_if = "crate::eval::is_nan")]
    pub ema_test_accuracy: f32,
    /// A binary model's (wide & deep's) test AUC and log loss, raw and
    /// EMA: `test_auc`, `ema_test_auc`, `test_logloss`, `ema_test_logloss`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub binary: Option<BinaryReport>,
    /// A regression model's test RMSE and MAE, raw and EMA: `test_rmse`, `ema_test_rmse`,
    /// `test_mae`, `ema_test_mae`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub regression: Option<RegressionReport>,
    /// Global steps per second while training, from the steps seen made
    /// and when; `None` when this run made none (it was already complete).
    pub steps_per_sec: Option<f64>,
    /// Training examples per second: `steps_per_sec × train.batch_size`.
    pub examples_per_sec: Option<f64>,
    /// The checkpoint directory already held a checkpoint at the last step:
    /// nothing was trained, the newest checkpoint was evaluated.
    pub already_complete: bool,
    /// `train.optimizer`.
    pub optimizer: crate::config::OptimizerKind,
    /// `model.layers`: the widths trained.
    pub layers: Vec<usize>,
    /// `train.precision`: the workers' GEMMs' number format.
    pub precision: crate::kernel::Precision,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// Where the checkpoints are.
    pub checkpoint_dir: PathBuf,
    /// Where the configuration and the tasks' logs are; `None` once removed (a finished
    /// run whose checkpoints went to `--checkpoint-dir`, without `--keep-run-dir`).
    pub run_dir: Option<PathBuf>,
    /// With `--evaluator`: the best checkpoint it kept, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best: Option<Best>,
}

/// A binary model's scores in the summary.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BinaryReport {
    /// Test AUC of the raw variables.
    pub test_auc: f32,
    /// Test AUC of the EMA shadows.
    pub ema_test_auc: f32,
    /// Test log loss of the raw variables.
    pub test_logloss: f32,
    /// Test log loss of the EMA shadows.
    pub ema_test_logloss: f32,
}

/// A regression model's scores in the summary.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RegressionReport {
    /// Test root-mean-square error of the raw variables.
    pub test_rmse: f32,
    /// Test root-mean-square error of the EMA shadows.
    pub ema_test_rmse: f32,
    /// Test mean absolute error of the raw variables.
    pub test_mae: f32,
    /// Test mean absolute error of the EMA shadows.
    pub ema_test_mae: f32,
}

/// The evaluator's best checkpoint, for the summary.
#[derive(Debug, Clone, Serialize)]
pub struct Best {
    /// Its model file in `checkpoint.dir/best/`.
    pub checkpoint: PathBuf,
    /// Its step.
    pub global_step: u64,
    /// `[eval] metric`.
    pub metric: String,
    /// Its score by that metric.
    pub score: f32,
    /// How many checkpoints the evaluator scored.
    pub scored: usize,
}
