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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_util::error_for;

    /// A regression model's keys: an MLP of one output on CSV (or npz) data.
    const REGRESSION: &str = "[model]\ntask = \"regression\"\nhidden = [8]\n[data]\nformat = \
                              \"csv\"\ntrain = \"t.csv\"\ntest = \"s.csv\"\n";

    #[test]
    fn the_task_is_classification_unless_set_and_regression_ranks_by_ema_rmse() {
        let c = Config::from_toml_str("", "f").unwrap();
        assert_eq!(c.model.task, ModelTask::Classification);
        let c = Config::from_toml_str(REGRESSION, "f").unwrap();
        assert_eq!(c.model.task, ModelTask::Regression);
        assert_eq!(c.eval.metric, Metric::EmaRmse);
        for (metric, want) in [("rmse", Metric::Rmse), ("loss", Metric::Loss)] {
            let text = format!("{REGRESSION}[eval]\nmetric = \"{metric}\"\n");
            assert_eq!(Config::from_toml_str(&text, "f").unwrap().eval.metric, want);
        }
        // Lower is better.
        assert!(Metric::EmaRmse.better(0.5, 0.7) && !Metric::Rmse.better(0.7, 0.5));
        let err = error_for("[model]\ntask = \"price\"\n", "model.task");
        assert!(err.contains("regression"), "{err}");
    }

    #[test]
    fn what_regression_cannot_be_combined_with_is_refused_naming_model_task() {
        let cases = [
            (
                "[model]\nkind = \"wide_deep\"\n",
                "model.task",
                "binary model",
            ),
            ("[data]\nthreshold = 4.0\n", "model.task", "data.threshold"),
            (
                "[data]\nformat = \"idx\"\n",
                "model.task",
                "data.format = \"idx\"",
            ),
            (
                "[eval]\nmetric = \"ema_accuracy\"\n",
                "eval.metric",
                "\"ema_rmse\"",
            ),
        ];
        for (extra, key, says) in cases {
            // A later table of the same name is a TOML error: merge by hand.
            let text = merged(REGRESSION, extra);
            let err = error_for(&text, key);
            assert!(err.contains(says), "{extra}: {err}");
        }
        // The layers given whole must end in one output.
        let err = error_for(
            "[model]\ntask = \"regression\"\nlayers = [4, 8, 3]\n[data]\nformat = \"csv\"\n\
             train = \"t.csv\"\n",
            "model.layers[2]",
        );
        assert!(err.contains("predicts one value"), "{err}");
        // A classifier has no RMSE.
        let err = error_for("[eval]\nmetric = \"ema_rmse\"\n", "eval.metric");
        assert!(err.contains("model.task = \"regression\""), "{err}");
    }

    /// `base` with the keys of `extra`'s tables added to its own tables of those names.
    fn merged(base: &str, extra: &str) -> String {
        let mut doc: toml::Table = base.parse().unwrap();
        let more: toml::Table = extra.parse().unwrap();
        for (table, keys) in more {
            let t = doc
                .entry(table)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            for (k, v) in keys.as_table().unwrap() {
                t.as_table_mut().unwrap().insert(k.clone(), v.clone());
            }
        }
        toml::to_string(&doc).unwrap()
    }
}
