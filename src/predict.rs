//! A trained model from its checkpoint alone, and `dtf predict`: the class
//! and the class probabilities of every row of a `.npy`, `.npz` (array `x`)
//! or CSV file, with the EMA weights by default, as TensorFlow serves the
//! moving averages.

use crate::checkpoint::{self, ModelMeta};
use crate::data::{self, DataError, Dataset, Features, npz};
use crate::model::wide_deep::WideDeep;
use crate::model::{Mlp, argmax};
use ndarray::{Array2, ArrayD};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Errors loading a trained model or predicting with it.
#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error(transparent)]
    Data(#[from] DataError),
    /// The checkpoint's tensors or metadata are not a model dtf can run.
    #[error("{path}: {problem}")]
    Model {
        /// The checkpoint's model file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The input's rows are not as wide as the model's.
    #[error("{path}: rows have {found} features, the model takes {expected}")]
    Width {
        /// The input file.
        path: PathBuf,
        /// Features per input row.
        found: usize,
        /// The model's input width.
        expected: usize,
    },
    /// The input is not a file `dtf predict` reads.
    #[error("{path}: {problem}")]
    Input {
        /// The input file.
        path: PathBuf,
        /// What is wrong, and what would be right.
        problem: String,
    },
    /// Writing the output failed (a closed pipe, a full disk).
    #[error("writing the predictions: {0}")]
    Output(#[from] std::io::Error),
}

/// A checkpoint ready to run: its model, preprocessing and both sets of weights.
#[derive(Debug, Clone)]
pub struct Trained {
    /// The model file it came from.
    pub file: PathBuf,
    /// Its step.
    pub global_step: u64,
    /// What its metadata says (or, for an older checkpoint, its weights).
    pub meta: ModelMeta,
    /// The network.
    pub mlp: Mlp,
    /// The trained variables, in model order.
    pub raw: Vec<ArrayD<f32>>,
    /// Their EMA shadows, in model order.
    pub ema: Vec<ArrayD<f32>>,
    /// Wide & deep's tables, each whole (empty for the MLP).
    pub tables: Vec<(String, crate::model::table::Rows)>,
}

impl Trained {
    /// Loads the checkpoint at `path` (a file, or a directory: its newest)
    /// with its model description; nothing else is needed.
    ///
    /// Errors: [`PredictError::Checkpoint`] for a missing or damaged
    /// checkpoint; [`PredictError::Model`] when its tensors are not an MLP's
    /// or its metadata disagrees with them.
    pub fn load(path: &Path) -> Result<Self, PredictError> {
        let file = checkpoint::resolve(path)?;
        let ckpt = checkpoint::load(&file, None)?;
        let model_error = |problem: String| PredictError::Model {
            path: file.clone(),
            problem,
        };
        let widths = checkpoint::widths(&ckpt).map_err(model_error)?;
        let metadata = checkpoint::read_metadata(&file)?;
        let meta = ModelMeta::from_metadata(&metadata, &widths).map_err(model_error)?;
        let mlp = Mlp::new(&meta.layers)
            .map_err(|e| model_error(e.to_string()))?
            .with_hidden(crate::model::Hidden {
                activation: meta.activation,
                dropout: 0.0,
            });
        let expected = mlp.variables();
        // Names and shapes, of the shadows too: the widths above come from
        // the weights alone, and a mismatch would otherwise reach the matrix code.
        let fits = |tensors: &[(String, ArrayD<f32>)]| {
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
            return Err(model_error(format!("variables {found:?} are not an MLP's")));
        }
        Ok(Trained {
            file: file.clone(),
            global_step: ckpt.global_step,
            meta,
            mlp,
            raw: ckpt.variables.into_iter().map(|(_, a)| a).collect(),
            ema: ckpt.shadows.into_iter().map(|(_, a)| a).collect(),
            tables: ckpt.tables,
        })
    }

    /// Errors: [`PredictError::Model`] with `what_instead` when this is a
    /// wide & deep model (what reads dense rows cannot run it).
    pub fn refuse_wide_deep(&self, what_instead: &str) -> Result<(), PredictError> {
        match &self.meta.wide_deep {
            None => Ok(()),
            Some(_) => Err(PredictError::Model {
                path: self.file.clone(),
                problem: format!("a wide & deep model: {what_instead}"),
            }),
        }
    }

    /// The wide & deep network of this checkpoint, for `data`.
    ///
    /// Errors: [`PredictError::Model`] when this is not a wide & deep
    /// model, or `data`'s categorical fields or dense width are not the
    /// model's.
    pub fn wide_deep(&self, data: &Dataset) -> Result<WideDeep, PredictError> {
        let problem = |problem: String| PredictError::Model {
            path: self.file.clone(),
            problem,
        };
        let Some(meta) = &self.meta.wide_deep else {
            return Err(problem("not a wide & deep model".into()));
        };
        let fields = data
            .categorical()
            .map(|c| c.fields.as_slice())
            .unwrap_or(&[]);
        if fields != meta.fields.as_slice() {
            let inter = data.path().extension().is_some_and(|e| e == "inter");
            return Err(problem(format!(
                "the model embeds the fields {:?}, the data {} has {fields:?}{}",
                meta.fields,
                data.path().display(),
                if inter {
                    " (a NAME.inter file is joined with the NAME.user and NAME.item files \
                     beside it, where they exist)"
                } else {
                    ""
                }
            )));
        }
        if data.features() != self.meta.dense_inputs() {
            return Err(PredictError::Width {
                path: data.path().to_path_buf(),
                found: data.features(),
                expected: self.meta.dense_inputs(),
            });
        }
        let hidden = &self.meta.layers[1..self.meta.layers.len() - 1];
        WideDeep::new(fields.len(), data.features(), meta.embedding_dim, hidden)
            .map(|m| {
                m.with_hidden(crate::model::Hidden {
                    activation: self.meta.activation,
                    dropout: 0.0,
                })
            })
            .map_err(|e| problem(e.to_string()))
    }

    /// The EMA shadows (`ema`) or the trained variables.
    pub fn params(&self, ema: bool) -> &[ArrayD<f32>] {
        if ema { &self.ema } else { &self.raw }
    }

    /// Class probabilities of rows of raw features (the data's own units):
    /// the checkpoint's preprocessing, then the network, then softmax.
    ///
    /// Errors: [`PredictError::Width`] naming `source` when the rows are not
    /// as wide as the model's input.
    pub fn probabilities(
        &self,
        x: Array2<f32>,
        ema: bool,
        source: &Path,
    ) -> Result<Array2<f32>, PredictError> {
        let x = self.prepared(x, source)?;
        Ok(self.mlp.probabilities(self.params(ema), x.view()))
    }

    /// A regression model's prediction for each row of raw features: the checkpoint's
    /// preprocessing, then the network; its one output is the value (no softmax).
    ///
    /// Errors: as [`Trained::probabilities`].
    pub fn values(
        &self,
        x: Array2<f32>,
        ema: bool,
        source: &Path,
    ) -> Result<Vec<f32>, PredictError> {
        let x = self.prepared(x, source)?;
        Ok(self.mlp.predictions(self.params(ema), x.view()))
    }

    /// Rows of raw features preprocessed as training saw them.
    ///
    /// Errors: [`PredictError::Width`] naming `source` when the rows are not
    /// as wide as the model's input.
    fn prepared(&self, mut x: Array2<f32>, source: &Path) -> Result<Array2<f32>, PredictError> {
        if x.ncols() != self.mlp.inputs() {
            return Err(PredictError::Width {
                path: source.to_path_buf(),
                found: x.ncols(),
                expected: self.mlp.inputs(),
            });
        }
        self.meta.preprocessing.apply_rows(&mut x);
        Ok(x)
    }
}

/// Rows of raw features from `path`: a `.npy` array `[N, …]`, a `.npz`'s
/// array `x` (or `x_test`, when there is no `x`), or a CSV file with a header
/// (its `label` column, if present, is left out; with `names`, the names a
/// checkpoint recorded, its columns are matched to them by header name;
/// split at `delimiter`, or at the header line's comma, tab or semicolon).
///
/// Errors: [`PredictError::Data`] for an unreadable or malformed file,
/// [`PredictError::Input`] for another kind of file or an array of labels.
pub fn read_input(
    path: &Path,
    label: &str,
    names: Option<&[String]>,
    delimiter: Option<u8>,
) -> Result<Array2<f32>, PredictError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let input_error = |problem: String| PredictError::Input {
        path: path.to_path_buf(),
        problem,
    };
    let (shape, values): (Vec<u64>, Features) = match ext.as_deref() {
        Some("csv") => {
            // The labels, if there, are left out: class names, indices or values alike.
            let rows = data::csv::read_with(
                path,
                &data::csv::Options {
                    label: Some(label),
                    require_label: false,
                    names,
                    categorical: data::csv::CategoricalColumns::Refused,
                    threshold: None,
                    label_names: data::csv::LabelNames::Skipped,
                    delimiter,
                },
            )?;
            let n = rows.values.len() / rows.features;
            (vec![n as u64, rows.features as u64], rows.values)
        }
        Some("npy") | Some("npz") => {
            let array = if ext.as_deref() == Some("npy") {
                npz::load_npy(path)?
            } else {
                match npz::load_array(path, "x") {
                    Ok(a) => a,
                    Err(DataError::Format { what, .. }) if what.contains("no array") => {
                        npz::load_array(path, "x_test")?
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            match array {
                npz::Array::U8(s, v) => (s, Features::Bytes(v)),
                npz::Array::F32(s, v) => (s, Features::Floats(v)),
                npz::Array::I64(..) => {
                    return Err(input_error(
                        "holds integers other than uint8: expected uint8 or float features".into(),
                    ));
                }
            }
        }
        _ => {
            return Err(input_error(
                "expected a .npy, .npz (array x) or .csv file".into(),
            ));
        }
    };
    let n = shape.first().copied().unwrap_or(0) as usize;
    let width: usize = shape.iter().skip(1).product::<u64>() as usize;
    let floats: Vec<f32> = match values {
        Features::Bytes(v) => v.into_iter().map(f32::from).collect(),
        Features::Floats(v) => v,
    };
    Array2::from_shape_vec((n, width.max(1)), floats)
        .map_err(|e| input_error(format!("shape {shape:?}: {e}")))
}

/// The examples of a wide & deep model (`model`) in `path`, preprocessed
/// as its checkpoint says: a CSV file with a header (its columns matched by
/// name, the categorical ones those the model embeds; the `label` column
/// may be absent), RecBole atomic files (a `.inter` file or a directory, as
/// [`data::recbole::read_all`]) or Criteo's layout (`.txt`, `.tsv`).
/// Labels absent read as 0.
///
/// Errors: [`PredictError::Data`] for an unreadable or malformed file,
/// [`PredictError::Input`] for another kind of file.
pub fn read_examples(path: &Path, model: &Trained, label: &str) -> Result<Dataset, PredictError> {
    let fields = model
        .meta
        .wide_deep
        .as_ref()
        .map(|w| w.fields.as_slice())
        .unwrap_or(&[]);
    let mut cfg = model.meta.training_data.clone().unwrap_or_default();
    cfg.label = label.to_owned();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let mut examples = match ext.as_deref() {
        Some("csv") => {
            let rows = data::csv::read_with(
                path,
                &data::csv::Options {
                    label: Some(label),
                    require_label: false,
                    names: model.meta.features.as_deref(),
                    categorical: data::csv::CategoricalColumns::Exactly(fields),
                    threshold: cfg.threshold,
                    label_names: data::csv::LabelNames::Refused,
                    delimiter: cfg.delimiter_byte(),
                },
            )?;
            let categorical = rows
                .categorical
                .unwrap_or_else(|| crate::data::Categorical::new(Vec::new()));
            let n = rows
                .values
                .len()
                .checked_div(rows.features)
                .unwrap_or(categorical.len());
            let labels = rows.labels.unwrap_or_else(|| vec![0; n]);
            Dataset::with_categorical(rows.values, labels, rows.features, categorical, path)?
        }
        Some("txt" | "tsv") => data::criteo::read(path)?,
        _ if path.is_dir() || ext.as_deref() == Some("inter") => {
            data::recbole::read_all(path, &cfg)?
        }
        _ => {
            return Err(PredictError::Input {
                path: path.to_path_buf(),
                problem: "a wide & deep model reads a .csv file, RecBole atomic files \
                          (a .inter file or their directory) or Criteo's layout (.txt, .tsv)"
                    .into(),
            });
        }
    };
    examples.set_preprocessing(model.meta.preprocessing.clone())?;
    Ok(examples)
}

/// One row's prediction, for `--json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// The most probable class (the lowest on a tie, as `tf.argmax`).
    pub class: usize,
    /// Its name, when the model was trained on class names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    /// Every class's probability.
    pub probabilities: Vec<f32>,
}

/// Each row's class, its name (from `names`, the checkpoint's class names,
/// when it has them) and probabilities.
pub fn predictions(probabilities: &Array2<f32>, names: Option<&[String]>) -> Vec<Prediction> {
    probabilities
        .rows()
        .into_iter()
        .map(|row| {
            let class = argmax(row);
            Prediction {
                class,
                class_name: names.and_then(|n| n.get(class)).cloned(),
                probabilities: row.to_vec(),
            }
        })
        .collect()
}

/// Writes `class,p0,p1,…` with a header, one line per row (`class,
/// class_name,p0,…` for a model trained on class names); probabilities as
/// the shortest decimal that reads back to the same f32.
///
/// Errors: the writer's.
pub fn write_csv(out: &mut dyn Write, predictions: &[Prediction]) -> std::io::Result<()> {
    let classes = predictions.first().map_or(0, |p| p.probabilities.len());
    let named = predictions.iter().any(|p| p.class_name.is_some());
    let header: Vec<String> = std::iter::once("class".to_owned())
        .chain(named.then(|| "class_name".to_owned()))
        .chain((0..classes).map(|c| format!("p{c}")))
        .collect();
    writeln!(out, "{}", header.join(","))?;
    for p in predictions {
        write!(out, "{}", p.class)?;
        if named {
            write!(out, ",{}", csv_cell(p.class_name.as_deref().unwrap_or("")))?;
        }
        for v in &p.probabilities {
            // The shortest decimal that reads back to the same f32: `0.025468696`,
            // as a spreadsheet or pandas shows it, never `2.546869591e-2`.
            write!(out, ",{v}")?;
        }
        writeln!(out)?;
    }
    out.flush()
}

/// A regression model's prediction of one row (`dtf predict --json`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ValuePrediction {
    /// The predicted value.
    pub prediction: f32,
}

/// Writes a regression model's predictions as CSV: the header `prediction`, then one
/// value per row, as the shortest decimal that reads back to the same f32.
///
/// Errors: the writer's.
pub fn write_values_csv(out: &mut dyn Write, values: &[f32]) -> std::io::Result<()> {
    writeln!(out, "prediction")?;
    for v in values {
        writeln!(out, "{v}")?;
    }
    out.flush()
}

/// `text` as one CSV cell: quoted when it holds a comma, a quote or a
/// line break (a class name is the user's own text).
fn csv_cell(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\"")).into()
    } else {
        text.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_output_has_a_header_and_one_line_per_row() {
        let probs = ndarray::array![[0.25f32, 0.75], [0.5, 0.5]];
        let p = predictions(&probs, None);
        assert_eq!(p[0].class, 1);
        assert_eq!(p[1].class, 0, "ties go to the lowest class");
        let mut out = Vec::new();
        write_csv(&mut out, &p).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "class,p0,p1");
        assert_eq!(lines.len(), 3);
        let back: Vec<f32> = lines[1]
            .split(',')
            .skip(1)
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(back, [0.25, 0.75]);
        assert_eq!(lines[1], "1,0.25,0.75", "plain decimals, no exponent");
    }

    #[test]
    fn a_model_trained_on_class_names_prints_them_after_the_index() {
        let probs = ndarray::array![[0.25f32, 0.75], [0.5, 0.5]];
        let names = ["cat".to_owned(), "dog, big".to_owned()];
        let p = predictions(&probs, Some(&names));
        assert_eq!(p[0].class_name.as_deref(), Some("dog, big"));
        let mut out = Vec::new();
        write_csv(&mut out, &p).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "class,class_name,p0,p1\n1,\"dog, big\",0.25,0.75\n0,cat,0.5,0.5\n"
        );
        let json = serde_json::to_string(&p[1]).unwrap();
        assert_eq!(
            json,
            r#"{"class":0,"class_name":"cat","probabilities":[0.5,0.5]}"#
        );
        // Without names, the fields are today's.
        let json = serde_json::to_string(&predictions(&probs, None)[1]).unwrap();
        assert_eq!(json, r#"{"class":0,"probabilities":[0.5,0.5]}"#);
    }

    #[test]
    fn inputs_of_each_kind_are_read_in_original_units() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("x.csv");
        std::fs::write(&csv, "label,a,b\n1,0,255\n0,3,4\n").unwrap();
        let x = read_input(&csv, "label", None, None).unwrap();
        assert_eq!(x, ndarray::array![[0.0f32, 255.0], [3.0, 4.0]]);
        let npy = dir.path().join("x.npy");
        std::fs::write(
            &npy,
            npz::npy_bytes(&npz::Array::F32(vec![1, 2, 1], vec![0.5, -1.0])),
        )
        .unwrap();
        assert_eq!(
            read_input(&npy, "label", None, None).unwrap(),
            ndarray::array![[0.5f32, -1.0]]
        );
        let z = dir.path().join("x.npz");
        npz::write_npz(&z, &[("x", npz::Array::U8(vec![1, 2], vec![9, 8]))]).unwrap();
        assert_eq!(
            read_input(&z, "label", None, None).unwrap(),
            ndarray::array![[9.0f32, 8.0]]
        );
        let err = read_input(&dir.path().join("x.txt"), "label", None, None).unwrap_err();
        assert!(err.to_string().contains("expected a .npy"), "{err}");
    }
}
