//! Accuracy of a checkpoint on the test set, raw and EMA (`dtf eval`);
//! `binary`: a wide & deep checkpoint's AUC and log loss.

pub mod binary;

use crate::config::{DataConfig, ModelTask};
use crate::data::{self, Split};
use crate::model::{Mlp, Targets};
use crate::predict::{PredictError, Trained};
use crate::regression_metrics::regression_metrics;
use ndarray::{ArrayD, ArrayView2};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Errors evaluating a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Model(#[from] PredictError),
    /// The test data does not fit the model.
    #[error(
        "{model}: the model takes {inputs} inputs, the rows of {data} have {features} features"
    )]
    Width {
        /// The checkpoint's model file.
        model: PathBuf,
        /// The model's input width.
        inputs: usize,
        /// The test data's file.
        data: PathBuf,
        /// The rows' width.
        features: usize,
    },
}

/// What `dtf eval --json` prints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Evaluation {
    /// The checkpoint file evaluated.
    pub checkpoint: PathBuf,
    /// Its step.
    pub global_step: u64,
    /// Test accuracy of the raw variables (none for a regression model: not written).
    #[serde(skip_serializing_if = "is_nan")]
    pub accuracy: f32,
    /// Test accuracy of the EMA shadows (as `accuracy`).
    #[serde(skip_serializing_if = "is_nan")]
    pub ema_accuracy: f32,
    /// Test cross-entropy of the raw variables (no L2 term; a binary
    /// model's: its log loss; a regression model's: its mean squared error).
    pub loss: f32,
    /// Test examples.
    pub examples: usize,
    /// A binary model's (wide & deep's) AUC and log loss, raw and EMA.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub binary: Option<BinaryEvaluation>,
    /// A regression model's RMSE and MAE, raw and EMA.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub regression: Option<RegressionEvaluation>,
}

/// A regression model's scores instead of accuracy (`dtf eval --json`'s `rmse`, `ema_rmse`,
/// `mae`, `ema_mae`; the `dtf local` summary's `test_rmse`, …).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct RegressionEvaluation {
    /// Root-mean-square error of the raw variables.
    pub rmse: f32,
    /// Root-mean-square error of the EMA shadows.
    pub ema_rmse: f32,
    /// Mean absolute error of the raw variables.
    pub mae: f32,
    /// Mean absolute error of the EMA shadows.
    pub ema_mae: f32,
}

/// A binary model's scores beside accuracy (`dtf eval --json`'s
/// `test_auc`, … keys; the `dtf local` summary's too).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct BinaryEvaluation {
    /// AUC of the raw variables.
    pub auc: f32,
    /// AUC of the EMA shadows.
    pub ema_auc: f32,
    /// Log loss of the raw variables.
    pub log_loss: f32,
    /// Log loss of the EMA shadows.
    pub ema_log_loss: f32,
}

/// The scores of one checkpoint on a test set: what `dtf eval` prints and
/// what the evaluator writes to TensorBoard.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct Scores {
    /// Test accuracy of the raw variables.
    #[serde(deserialize_with = "nan_if_null")]
    pub accuracy: f32,
    /// Test accuracy of the EMA shadows.
    #[serde(deserialize_with = "nan_if_null")]
    pub ema_accuracy: f32,
    /// Test cross-entropy of the raw variables (a binary model's: its log loss).
    #[serde(deserialize_with = "nan_if_null")]
    pub loss: f32,
    /// Test AUC of the raw variables: a binary model's (wide & deep); NaN
    /// for the MLP, not written then, and NaN when read from a line that
    /// lacks it (a ledger of before AUCs).
    #[serde(
        default = "nan",
        deserialize_with = "nan_if_null",
        skip_serializing_if = "is_nan"
    )]
    pub auc: f32,
    /// Test AUC of the EMA shadows, as `auc`.
    #[serde(
        default = "nan",
        deserialize_with = "nan_if_null",
        skip_serializing_if = "is_nan"
    )]
    pub ema_auc: f32,
    /// Test root-mean-square error of the raw variables: a regression model's
    /// (`model.task = "regression"`); NaN for a classifier, not written then.
    #[serde(
        default = "nan",
        deserialize_with = "nan_if_null",
        skip_serializing_if = "is_nan"
    )]
    pub rmse: f32,
    /// Test RMSE of the EMA shadows, as `rmse`.
    #[serde(
        default = "nan",
        deserialize_with = "nan_if_null",
        skip_serializing_if = "is_nan"
    )]
    pub ema_rmse: f32,
    /// Test mean absolute error of the raw variables, as `rmse`.
    #[serde(
        default = "nan",
        deserialize_with = "nan_if_null",
        skip_serializing_if = "is_nan"
    )]
    pub mae: f32,
    /// Test mean absolute error of the EMA shadows, as `rmse`.
    #[serde(
        default = "nan",
        deserialize_with = "nan_if_null",
        skip_serializing_if = "is_nan"
    )]
    pub ema_mae: f32,
}

/// A score that is absent: NaN, as `null` reads.
pub(crate) fn nan() -> f32 {
    f32::NAN
}

/// Whether a score is absent (NaN): not written at all.
pub(crate) fn is_nan(v: &f32) -> bool {
    v.is_nan()
}

/// A score as JSON holds it: JSON has no NaN, and serde writes one as
/// `null`, so `null` reads back as NaN (a ledger line of a diverged
/// checkpoint is a record, not a line to skip and score again).
///
/// Errors: the deserializer's, for anything but a number or `null`.
pub(crate) fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    Ok(<Option<f32> as serde::Deserialize>::deserialize(d)?.unwrap_or(f32::NAN))
}

/// NaN equals NaN here: an absent score (the MLP's AUC) is the same
/// absent score, so an index of MLP entries reads back equal to itself.
impl PartialEq for Scores {
    fn eq(&self, other: &Self) -> bool {
        let same = |a: f32, b: f32| a == b || (a.is_nan() && b.is_nan());
        same(self.accuracy, other.accuracy)
            && same(self.ema_accuracy, other.ema_accuracy)
            && same(self.loss, other.loss)
            && same(self.auc, other.auc)
            && same(self.ema_auc, other.ema_auc)
            && same(self.rmse, other.rmse)
            && same(self.ema_rmse, other.ema_rmse)
            && same(self.mae, other.mae)
            && same(self.ema_mae, other.ema_mae)
    }
}

impl Scores {
    /// No score at all (every one NaN): what a model fills in the scores it has.
    pub fn none() -> Self {
        Scores {
            accuracy: f32::NAN,
            ema_accuracy: f32::NAN,
            loss: f32::NAN,
            auc: f32::NAN,
            ema_auc: f32::NAN,
            rmse: f32::NAN,
            ema_rmse: f32::NAN,
            mae: f32::NAN,
            ema_mae: f32::NAN,
        }
    }

    /// Whether every score the model has is a finite number: only then can
    /// it rank. The loss always counts; each raw/EMA pair counts unless both
    /// are NaN (the model has no such score: the MLP no AUC, a regression
    /// model no accuracy; a model that diverged scores NaN everywhere, its
    /// loss too).
    pub fn finite(&self) -> bool {
        let pairs = [
            (self.accuracy, self.ema_accuracy),
            (self.auc, self.ema_auc),
            (self.rmse, self.ema_rmse),
            (self.mae, self.ema_mae),
        ];
        self.loss.is_finite()
            && pairs
                .iter()
                .all(|&(a, b)| (a.is_nan() && b.is_nan()) || (a.is_finite() && b.is_finite()))
    }

    /// The scores the model has besides its loss, by their TensorBoard tags: each raw/EMA
    /// pair unless both are NaN (the MLP's AUC, a regression model's accuracy), so no
    /// curve of NaN is written.
    pub fn present(&self) -> Vec<(&'static str, f32)> {
        let mut out = Vec::new();
        for ((a, va), (b, vb)) in [
            (
                ("accuracy", self.accuracy),
                ("ema_accuracy", self.ema_accuracy),
            ),
            (("auc", self.auc), ("ema_auc", self.ema_auc)),
            (("rmse", self.rmse), ("ema_rmse", self.ema_rmse)),
            (("mae", self.mae), ("ema_mae", self.ema_mae)),
        ] {
            if !(va.is_nan() && vb.is_nan()) {
                out.extend([(a, va), (b, vb)]);
            }
        }
        out
    }

    /// The value of `metric`.
    pub fn get(&self, metric: crate::config::Metric) -> f32 {
        match metric {
            crate::config::Metric::Accuracy => self.accuracy,
            crate::config::Metric::EmaAccuracy => self.ema_accuracy,
            crate::config::Metric::Loss => self.loss,
            crate::config::Metric::Auc => self.auc,
            crate::config::Metric::EmaAuc => self.ema_auc,
            crate::config::Metric::Rmse => self.rmse,
            crate::config::Metric::EmaRmse => self.ema_rmse,
        }
    }
}

/// Scores the variables `values` and their EMA `shadows`, already verified
/// against `mlp`'s variables, on `x`/`y`: accuracy and cross-entropy for class
/// labels; RMSE, MAE and the mean squared error (the loss) for values
/// ([`crate::regression_metrics`]), accuracy NaN then.
///
/// # Panics
///
/// When the tensors or `x` do not fit `mlp`: check them first, as
/// [`evaluate_on`] and the evaluator do.
pub fn score(
    mlp: &Mlp,
    values: &[ArrayD<f32>],
    shadows: &[ArrayD<f32>],
    x: ArrayView2<f32>,
    y: Targets,
) -> Scores {
    match y {
        Targets::Classes(y) => {
            let (accuracy, loss) = mlp.accuracy_and_loss(values, x, y);
            Scores {
                accuracy,
                ema_accuracy: mlp.accuracy(shadows, x, y),
                loss,
                ..Scores::none()
            }
        }
        Targets::Values(y) => {
            let raw = regression_metrics(&mlp.predictions(values, x), y);
            let ema = regression_metrics(&mlp.predictions(shadows, x), y);
            Scores {
                loss: raw.mse,
                rmse: raw.rmse,
                ema_rmse: ema.rmse,
                mae: raw.mae,
                ema_mae: ema.mae,
                ..Scores::none()
            }
        }
    }
}

/// Evaluates the checkpoint at `path` (a file, or a directory: its newest) on
/// the test split of the IDX files in `data_dir` ([`evaluate_on`]).
///
/// Errors: as [`evaluate_on`].
pub fn evaluate(path: &Path, data_dir: &Path) -> Result<Evaluation, EvalError> {
    let data = DataConfig {
        dir: data_dir.to_path_buf(),
        ..DataConfig::default()
    };
    evaluate_on(path, &data)
}

/// Evaluates the checkpoint at `path` (a file, or a directory: its newest) on
/// the test split of the data set `data` describes. The model's shape and
/// its preprocessing are read from the checkpoint; a CSV test file's label
/// column is `data.label`.
///
/// Errors: [`EvalError`] for a missing or damaged checkpoint or data set, or
/// test data of another width or with more classes than the model's.
pub fn evaluate_on(path: &Path, data: &DataConfig) -> Result<Evaluation, EvalError> {
    let model = Trained::load(path)?;
    // CSV columns are matched by name to those the checkpoint recorded, and
    // labels that are names read through the checkpoint's class names (the
    // training file's, whichever file this is).
    let mut test = match (&data.format, &data.test, model.meta.features.as_deref()) {
        (crate::config::DataFormat::Csv, Some(file), Some(names)) => {
            // `data.delimiter`, else the one training used.
            let delimiter = data.delimiter_byte().or_else(|| {
                model
                    .meta
                    .training_data
                    .as_ref()
                    .and_then(|d| d.delimiter_byte())
            });
            let labels = match model.meta.task {
                ModelTask::Regression => data::csv::LabelNames::Values,
                ModelTask::Classification => {
                    data::csv::LabelNames::of(model.meta.class_names.as_deref())
                }
            };
            data::csv::load_named(file, &data.label, Some(names), labels, delimiter)?
        }
        _ => data::load_task(data, model.meta.task, Split::Test)?,
    };
    let file = &model.file;
    if test.features() != model.meta.dense_inputs() {
        return Err(EvalError::Width {
            model: file.clone(),
            inputs: model.meta.dense_inputs(),
            data: test.path().to_path_buf(),
            features: test.features(),
        });
    }
    test.check_labels(model.meta.classes)?;
    test.set_preprocessing(model.meta.preprocessing.clone())?;
    if model.meta.wide_deep.is_some() {
        return evaluate_wide_deep(&model, &test);
    }
    let (x, _) = test.all();
    let scores = score(
        &model.mlp,
        model.params(false),
        model.params(true),
        x.view(),
        test.targets(),
    );
    Ok(Evaluation {
        checkpoint: file.clone(),
        global_step: model.global_step,
        accuracy: scores.accuracy,
        ema_accuracy: scores.ema_accuracy,
        loss: scores.loss,
        examples: test.len(),
        binary: None,
        regression: test.is_regression().then_some(RegressionEvaluation {
            rmse: scores.rmse,
            ema_rmse: scores.ema_rmse,
            mae: scores.mae,
            ema_mae: scores.ema_mae,
        }),
    })
}

/// [`evaluate_on`] for a wide & deep checkpoint: AUC, log loss and accuracy
/// at ½ of its raw and EMA weights ([`binary::score`]).
///
/// Errors: [`EvalError::Model`] when the test split's categorical fields
/// are not the checkpoint's, or its labels cannot be scored (one class).
fn evaluate_wide_deep(model: &Trained, test: &data::Dataset) -> Result<Evaluation, EvalError> {
    let problem = |problem: String| {
        EvalError::Model(PredictError::Model {
            path: model.file.clone(),
            problem,
        })
    };
    let wd = model.wide_deep(test)?;
    let tables = binary::tables(&wd, &model.tables);
    let score = |ema: bool| {
        binary::score(&wd, model.params(ema), &tables, ema, test)
            .map_err(|e| problem(format!("the test split cannot be scored: {e}")))
    };
    let (raw, ema) = (score(false)?, score(true)?);
    Ok(Evaluation {
        checkpoint: model.file.clone(),
        global_step: model.global_step,
        accuracy: raw.accuracy,
        ema_accuracy: ema.accuracy,
        loss: raw.log_loss,
        examples: test.len(),
        binary: Some(BinaryEvaluation {
            auc: raw.auc,
            ema_auc: ema.auc,
            log_loss: raw.log_loss,
            ema_log_loss: ema.log_loss,
        }),
        regression: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint;
    use ndarray::ArrayD;

    /// A regression model's scores: RMSE and MAE raw and EMA, the MSE as its loss, no
    /// accuracy (NaN: neither written to TensorBoard nor counted by `finite`).
    #[test]
    fn values_score_rmse_mae_and_mse_and_no_accuracy() {
        let mlp = Mlp::new(&[1, 1]).unwrap();
        // ŷ = 2x + 1 (raw) and ŷ = x (EMA) on x = 0, 1, 2 against y = 1, 3, 4.
        let p = |w: f32, b: f32| {
            vec![
                ArrayD::from_elem(vec![1, 1], w),
                ArrayD::from_elem(vec![1], b),
            ]
        };
        let x = ndarray::array![[0.0f32], [1.0], [2.0]];
        let y = [1.0f32, 3.0, 4.0];
        let s = score(
            &mlp,
            &p(2.0, 1.0),
            &p(1.0, 0.0),
            x.view(),
            Targets::Values(&y),
        );
        // Raw errors 0, 0, 1; EMA errors 1, 2, 2.
        assert_eq!((s.loss, s.mae), (1.0 / 3.0, 1.0 / 3.0));
        assert_eq!(s.rmse, (1.0f64 / 3.0).sqrt() as f32);
        assert_eq!((s.ema_rmse, s.ema_mae), (3.0f64.sqrt() as f32, 5.0 / 3.0));
        assert!(s.accuracy.is_nan() && s.ema_accuracy.is_nan() && s.finite());
        let tags: Vec<&str> = s.present().iter().map(|(t, _)| *t).collect();
        assert_eq!(tags, ["rmse", "ema_rmse", "mae", "ema_mae"]);
        assert_eq!(s.get(crate::config::Metric::EmaRmse), s.ema_rmse);
        // A diverged model scores NaN: it cannot rank.
        let nan = score(
            &mlp,
            &p(f32::NAN, 0.0),
            &p(1.0, 0.0),
            x.view(),
            Targets::Values(&y),
        );
        assert!(!nan.finite());
        // Class labels keep accuracy and no RMSE.
        let mlp = Mlp::new(&[1, 2]).unwrap();
        let c = mlp.init(1);
        let s = score(&mlp, &c, &c, x.view(), Targets::Classes(&[0, 1, 1]));
        assert!(s.rmse.is_nan() && !s.accuracy.is_nan());
        let tags: Vec<&str> = s.present().iter().map(|(t, _)| *t).collect();
        assert_eq!(tags, ["accuracy", "ema_accuracy"]);
    }

    #[test]
    fn a_checkpoint_whose_shapes_do_not_chain_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let t = |n: &str, shape: &[usize]| (n.to_owned(), ArrayD::zeros(shape));
        // The widths come from the weights: 4 → 3 → 2, but layer2 takes 5 inputs.
        let variables = vec![
            t("layer1/weights", &[4, 3]),
            t("layer1/biases", &[3]),
            t("layer2/weights", &[5, 2]),
            t("layer2/biases", &[2]),
        ];
        let ckpt = checkpoint::Checkpoint {
            global_step: 1,
            shadows: variables.clone(),
            variables,
            slots: Default::default(),
            run: 0,
            shard_steps: Vec::new(),
            table_optimizers: Vec::new(),
            increment: None,
            tables: Vec::new(),
        };
        checkpoint::Saver::new(dir.path(), 1)
            .unwrap()
            .save(&ckpt)
            .unwrap();
        // Test data that fits the first layer: 2×2 images, 2 classes.
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        crate::data::write_idx_images(&data.join("t10k-images-idx3-ubyte"), &[7; 12], 2, 2)
            .unwrap();
        crate::data::write_idx_labels(&data.join("t10k-labels-idx1-ubyte"), &[0, 1, 1]).unwrap();
        let err = evaluate(dir.path(), &data).unwrap_err();
        assert!(err.to_string().contains("are not an MLP's"), "{err}");
    }
}
