//! [`Preprocessing`]: how a row of raw features becomes the model's input
//! (scaled, or standardized with the training split's mean and std), and
//! how it is fitted to a training split.

use super::{Dataset, Features};
use ndarray::Array2;
use serde::{Deserialize, Serialize};

/// How a row of raw features becomes the model's input. Recorded in every
/// checkpoint (metadata `preprocessing`) and built into an exported model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Preprocessing {
    /// `x / divisor`: 255 for byte data (pixels to [0, 1]), 1 for float data.
    Scale {
        /// What every feature is divided by.
        divisor: f32,
    },
    /// `(x − mean) / std` per feature, with the training split's mean and
    /// standard deviation (`data.standardize = true`); a constant feature's
    /// std is taken as 1, so it becomes 0 rather than NaN.
    Standardize {
        /// Per-feature mean of the training split.
        mean: Vec<f32>,
        /// Per-feature standard deviation of the training split (never 0).
        std: Vec<f32>,
    },
}

impl Preprocessing {
    /// Checks that it maps every finite input to a finite one: a finite,
    /// positive divisor; finite means; finite, positive stds. A divisor of
    /// 0 (or a negative one, or an all-zero std) once made every row one
    /// class without a word.
    ///
    /// Errors: a sentence naming the bad value and what would be right.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Preprocessing::Scale { divisor } if !(divisor.is_finite() && *divisor > 0.0) => {
                Err(format!(
                    "metadata preprocessing divides by {divisor}: expected a finite number above 0 \
                     (255 for pixels, 1 for float data)"
                ))
            }
            Preprocessing::Scale { .. } => Ok(()),
            Preprocessing::Standardize { mean, std } => {
                if let Some(i) = mean.iter().position(|m| !m.is_finite()) {
                    return Err(format!(
                        "metadata preprocessing has mean {} for feature {i}: expected a finite number",
                        mean[i]
                    ));
                }
                if let Some(i) = std.iter().position(|s| !(s.is_finite() && *s > 0.0)) {
                    return Err(format!(
                        "metadata preprocessing has std {} for feature {i}: expected a finite \
                         number above 0 (a constant feature's std is recorded as 1)",
                        std[i]
                    ));
                }
                Ok(())
            }
        }
    }

    /// What a checkpoint without the metadata was trained with: IDX pixels / 255.
    pub fn legacy() -> Self {
        Preprocessing::Scale { divisor: 255.0 }
    }

    /// The features this preprocessing is for, if it says (standardization does).
    pub fn features(&self) -> Option<usize> {
        match self {
            Preprocessing::Scale { .. } => None,
            Preprocessing::Standardize { mean, .. } => Some(mean.len()),
        }
    }

    /// Fills `out` with the preprocessed `row`.
    pub(super) fn apply<T: Copy + Into<f32>>(&self, row: &[T], out: &mut [f32]) {
        match self {
            Preprocessing::Scale { divisor } => out
                .iter_mut()
                .zip(row)
                .for_each(|(o, &v)| *o = v.into() / divisor),
            Preprocessing::Standardize { mean, std } => {
                for (j, (o, &v)) in out.iter_mut().zip(row).enumerate() {
                    *o = (v.into() - mean[j]) / std[j];
                }
            }
        }
    }

    /// Preprocesses rows of f32 (any number, `features` wide) in place.
    ///
    /// Panics when `x`'s width is not the standardization's.
    pub fn apply_rows(&self, x: &mut Array2<f32>) {
        for mut row in x.rows_mut() {
            let raw: Vec<f32> = row.to_vec();
            self.apply(
                &raw,
                row.as_slice_mut().expect("rows of a standard-layout array"),
            );
        }
    }
}

impl Dataset {
    /// The preprocessing this split implies as training data: its own mean
    /// and std when `standardize` or when it has categorical features, else
    /// bytes / 255 and floats as they are.
    ///
    /// Dense features beside categorical ones are standardized always: a raw
    /// timestamp (RecBole) or log count (Criteo) beside embeddings of scale
    /// 0.01 would swamp them.
    pub fn fitted_preprocessing(&self, standardize: bool) -> Preprocessing {
        if !standardize && self.categorical().is_none() {
            return self.preprocessing.clone();
        }
        let f = self.features;
        let mut sum = vec![0f64; f];
        let mut sq = vec![0f64; f];
        let mut add = |j: usize, v: f64| {
            sum[j] += v;
            sq[j] += v * v;
        };
        match &self.values {
            Features::Bytes(v) => v
                .iter()
                .enumerate()
                .for_each(|(i, &x)| add(i % f, f64::from(x))),
            Features::Floats(v) => v
                .iter()
                .enumerate()
                .for_each(|(i, &x)| add(i % f, f64::from(x))),
        }
        let n = self.len() as f64;
        let mean: Vec<f32> = sum.iter().map(|s| (s / n) as f32).collect();
        let std = sum
            .iter()
            .zip(&sq)
            .map(|(s, q)| {
                let m = s / n;
                let var = (q / n - m * m).max(0.0);
                let sd = var.sqrt() as f32;
                // A constant feature carries no information: 0 after
                // centring, never a division by zero.
                if sd > 0.0 && sd.is_finite() { sd } else { 1.0 }
            })
            .collect();
        Preprocessing::Standardize { mean, std }
    }
}
