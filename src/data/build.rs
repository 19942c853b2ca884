//! How a [`Dataset`] is built from what a reader parsed: the checks that
//! its features, labels and categorical fields agree.

use super::{Categorical, DataError, Dataset, Features, Preprocessing, format_error};
use std::path::Path;

impl Dataset {
    /// From features and labels read from `path` (the labels' file, for
    /// error messages), checking that they agree and that no label exceeds
    /// [`MAX_CLASSES`]. The preprocessing is bytes / 255, floats as they are.
    pub(crate) fn new(
        values: Features,
        labels: Vec<u8>,
        features: usize,
        path: &Path,
    ) -> Result<Self, DataError> {
        if labels.is_empty() {
            return Err(format_error(path, "holds no examples"));
        }
        if features == 0 {
            return Err(format_error(path, "rows have no features"));
        }
        if Some(values.len()) != labels.len().checked_mul(features) {
            return Err(format_error(
                path,
                format!(
                    "holds {} values for {} labels of {features} features",
                    values.len(),
                    labels.len()
                ),
            ));
        }
        let preprocessing = match values {
            Features::Bytes(_) => Preprocessing::Scale { divisor: 255.0 },
            Features::Floats(_) => Preprocessing::Scale { divisor: 1.0 },
        };
        Ok(Dataset {
            values,
            labels,
            features,
            labels_path: path.to_path_buf(),
            preprocessing,
            names: None,
            categorical: None,
            class_names: None,
            targets: None,
        })
    }

    /// [`Dataset::with_categorical`] whose dense features are the float
    /// columns `names` (row-major in `values`), which the data set keeps.
    ///
    /// Errors: as [`Dataset::with_categorical`].
    pub(crate) fn with_named_columns(
        values: Vec<f32>,
        labels: Vec<u8>,
        names: Vec<String>,
        categorical: Categorical,
        path: &Path,
    ) -> Result<Self, DataError> {
        let features = names.len();
        let mut ds = Self::with_categorical(
            Features::Floats(values),
            labels,
            features,
            categorical,
            path,
        )?;
        ds.set_names(names);
        Ok(ds)
    }

    /// [`Dataset::new`] with categorical features, one example each per
    /// label; the dense features may then be 0 wide.
    ///
    /// Errors: [`DataError::Format`] when the counts disagree, as `new`.
    pub(crate) fn with_categorical(
        values: Features,
        labels: Vec<u8>,
        features: usize,
        categorical: Categorical,
        path: &Path,
    ) -> Result<Self, DataError> {
        if categorical.width() == 0 || labels.is_empty() {
            return Dataset::new(values, labels, features, path);
        }
        if categorical.len() != labels.len() {
            return Err(format_error(
                path,
                format!(
                    "holds categorical features for {} examples and {} labels",
                    categorical.len(),
                    labels.len()
                ),
            ));
        }
        if features == 0 {
            // Only categorical features: `new` would refuse the empty rows.
            if !values.is_empty() {
                return Err(format_error(
                    path,
                    "holds dense values for rows of 0 features",
                ));
            }
            let preprocessing = Preprocessing::Scale { divisor: 1.0 };
            return Ok(Dataset {
                values: Features::Floats(Vec::new()),
                labels,
                features: 0,
                labels_path: path.to_path_buf(),
                preprocessing,
                names: Some(Vec::new()),
                categorical: Some(categorical),
                class_names: None,
                targets: None,
            });
        }
        let mut ds = Dataset::new(values, labels, features, path)?;
        ds.categorical = Some(categorical);
        Ok(ds)
    }

    /// Makes this a regression data set (`model.task = "regression"`): `values`, one finite
    /// value per row, are its labels; its class labels are then 0 for every row, the
    /// model's one output.
    ///
    /// Errors: [`DataError::Format`] when the count is not the rows'.
    pub(crate) fn set_targets(&mut self, values: Vec<f32>) -> Result<(), DataError> {
        if values.len() != self.labels.len() {
            return Err(format_error(
                &self.labels_path,
                format!(
                    "holds {} label values for {} rows",
                    values.len(),
                    self.labels.len()
                ),
            ));
        }
        self.labels.fill(0);
        self.targets = Some(values);
        Ok(())
    }
}
