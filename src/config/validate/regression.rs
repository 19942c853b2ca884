//! `model.task`: what a regression model (a real-valued label) cannot be combined with, and
//! the evaluator's ranking it defaults to.

use super::super::schema::{Config, DataFormat, Metric, ModelKind, ModelTask};
use super::ConfigError;

impl Config {
    /// `model.task = "regression"`'s keys: an MLP (wide & deep is a binary model), no
    /// `data.threshold` (it makes the label 0/1), data whose label column can hold real
    /// values (CSV, npz), and an `eval.metric` the model has (RMSE, not accuracy).
    ///
    /// Errors: [`ConfigError::Key`] naming `model.task` or `eval.metric`.
    pub(super) fn validate_task(&self) -> Result<(), ConfigError> {
        let metric = self.eval.metric;
        if self.model.task == ModelTask::Classification {
            if metric.regression_only() {
                return Err(self.bad(
                    "eval.metric",
                    format!(
                        "\"{}\" is a regression model's score (model.task = \"regression\"); a \
                         classifier's are \"ema_accuracy\", \"accuracy\" and \"loss\"",
                        metric.name()
                    ),
                ));
            }
            return Ok(());
        }
        if self.model.kind == ModelKind::WideDeep {
            return Err(self.bad(
                "model.task",
                "is \"regression\", but model.kind = \"wide_deep\" is a binary model (one \
                 logit, sigmoid cross-entropy): use model.kind = \"mlp\" for a real-valued label, \
                 or model.task = \"classification\" with data.threshold"
                    .into(),
            ));
        }
        if let Some(t) = self.data.threshold {
            return Err(self.bad(
                "model.task",
                format!(
                    "is \"regression\", but data.threshold = {t} makes the label 0 or 1: unset \
                     data.threshold to predict the value itself, or use model.task = \
                     \"classification\""
                ),
            ));
        }
        if !matches!(self.data.format, DataFormat::Csv | DataFormat::Npz) {
            return Err(self.bad(
                "model.task",
                format!(
                    "is \"regression\", but data.format = \"{}\" has class labels: a real-valued \
                     label comes from a CSV label column or an npz's float y_train",
                    format!("{:?}", self.data.format).to_lowercase()
                ),
            ));
        }
        let layers = &self.model.layers;
        if self.model.hidden.is_none() && layers.last() != Some(&1) {
            return Err(self.bad(
                &format!("model.layers[{}]", layers.len().saturating_sub(1)),
                format!(
                    "is {}, but model.task = \"regression\" predicts one value: expected 1, or \
                     give only the hidden widths as model.hidden",
                    layers.last().copied().unwrap_or(0)
                ),
            ));
        }
        if !matches!(metric, Metric::Rmse | Metric::EmaRmse | Metric::Loss) {
            return Err(self.bad(
                "eval.metric",
                format!(
                    "\"{}\" is a classifier's score, but model.task = \"regression\": a \
                     regression model's are \"ema_rmse\", \"rmse\" and \"loss\" (its mean \
                     squared error)",
                    metric.name()
                ),
            ));
        }
        Ok(())
    }

    /// `model.task = "regression"`'s own default for a key nobody set: the evaluator ranks
    /// its best checkpoints by the EMA shadows' RMSE (a regression model has no accuracy).
    pub(crate) fn task_defaults(&mut self) {
        if self.model.task == ModelTask::Regression && !self.sources.is_set("eval.metric") {
            self.eval.metric = Metric::EmaRmse;
        }
    }
}
