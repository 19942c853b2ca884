//! Accuracy of a checkpoint on the test set, raw and EMA (`dtf eval`).

use crate::checkpoint;
use crate::data::{Dataset, Split};
use crate::model::Mlp;
use ndarray::ArrayView2;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Errors evaluating a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error("{0}")]
    Model(String),
}

/// What `dtf eval --json` prints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Evaluation {
    /// The checkpoint file evaluated.
    pub checkpoint: PathBuf,
    /// Its step.
    pub global_step: u64,
    /// Test accuracy of the raw variables.
    pub accuracy: f32,
    /// Test accuracy of the EMA shadows.
    pub ema_accuracy: f32,
    /// Test cross-entropy of the raw variables (no L2 term).
    pub loss: f32,
    /// Test examples.
    pub examples: usize,
}

/// The scores of one checkpoint on a test set: what `dtf eval` prints and
/// what the evaluator writes to TensorBoard.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
pub struct Scores {
    /// Test accuracy of the raw variables.
    pub accuracy: f32,
    /// Test accuracy of the EMA shadows.
    pub ema_accuracy: f32,
    /// Test cross-entropy of the raw variables.
    pub loss: f32,
}

impl Scores {
    /// The value of `metric`.
    pub fn get(&self, metric: crate::config::Metric) -> f32 {
        match metric {
            crate::config::Metric::Accuracy => self.accuracy,
            crate::config::Metric::EmaAccuracy => self.ema_accuracy,
            crate::config::Metric::Loss => self.loss,
        }
    }
}

/// Scores `ckpt`, already verified against `mlp`'s variables (as
/// [`checkpoint::load`] does with `Some(&mlp.variables())`), on `x`/`y`.
///
/// # Panics
///
/// When `ckpt` or `x` do not fit `mlp`: check them first, as [`evaluate`]
/// and the evaluator do.
pub fn score(mlp: &Mlp, ckpt: &checkpoint::Checkpoint, x: ArrayView2<f32>, y: &[u8]) -> Scores {
    let values: Vec<_> = ckpt.variables.iter().map(|(_, a)| a.clone()).collect();
    let shadows: Vec<_> = ckpt.shadows.iter().map(|(_, a)| a.clone()).collect();
    let (accuracy, loss) = mlp.accuracy_and_loss(&values, x, y);
    Scores {
        accuracy,
        ema_accuracy: mlp.accuracy(&shadows, x, y),
        loss,
    }
}

/// Evaluates the checkpoint at `path` (a file, or a directory: its newest) on
/// the test split of `data_dir`. The model's shape is read from the checkpoint.
///
/// Errors: [`EvalError`] for a missing or damaged checkpoint or data set.
pub fn evaluate(path: &Path, data_dir: &Path) -> Result<Evaluation, EvalError> {
    let file = checkpoint::resolve(path)?;
    let ckpt = checkpoint::load(&file, None)?;
    let layers = layers_of(&ckpt)?;
    let mlp = Mlp::new(&layers).map_err(|e| EvalError::Model(e.to_string()))?;
    let expected = mlp.variables();
    // Names and shapes, of the shadows too: the widths above come from the
    // weights alone, and a mismatch would otherwise reach the matrix code.
    let fits = |tensors: &[(String, ndarray::ArrayD<f32>)]| {
        tensors.len() == expected.len()
            && tensors
                .iter()
                .zip(&expected)
                .all(|((n, a), v)| *n == v.name && a.shape() == v.shape.as_slice())
    };
    if !fits(&ckpt.variables) || !fits(&ckpt.shadows) {
        let found: Vec<_> = ckpt
            .variables
            .iter()
            .map(|(n, a)| format!("{n} {:?}", a.shape()))
            .collect();
        return Err(EvalError::Model(format!(
            "{}: variables {found:?} are not an MLP's",
            file.display()
        )));
    }
    let test = Dataset::load(data_dir, Split::Test)?;
    test.check_labels(mlp.classes())?;
    if test.features() != layers[0] {
        return Err(EvalError::Model(format!(
            "{}: the model takes {} inputs, the images in {} have {} pixels",
            file.display(),
            layers[0],
            data_dir.display(),
            test.features()
        )));
    }
    let (x, y) = test.all();
    let scores = score(&mlp, &ckpt, x.view(), &y);
    Ok(Evaluation {
        checkpoint: file,
        global_step: ckpt.global_step,
        accuracy: scores.accuracy,
        ema_accuracy: scores.ema_accuracy,
        loss: scores.loss,
        examples: test.len(),
    })
}

/// The layer widths implied by `layerN/weights` shapes.
fn layers_of(ckpt: &checkpoint::Checkpoint) -> Result<Vec<usize>, EvalError> {
    let mut layers = Vec::new();
    for (name, a) in &ckpt.variables {
        if name.ends_with("/weights") {
            if a.ndim() != 2 {
                return Err(EvalError::Model(format!(
                    "{name} has shape {:?}, expected a matrix",
                    a.shape()
                )));
            }
            if layers.is_empty() {
                layers.push(a.shape()[0]);
            }
            layers.push(a.shape()[1]);
        }
    }
    if layers.len() < 2 {
        return Err(EvalError::Model(
            "the checkpoint holds no layer weights".into(),
        ));
    }
    Ok(layers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayD;

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
