//! What a checkpoint says about its model besides the tensors, so that
//! `dtf eval`, `dtf predict` and `dtf export` need no configuration: the
//! layers, the activation, the preprocessing, the class count and the
//! training hyperparameters, as string metadata of the model file.
//!
//! | key | value |
//! | --- | --- |
//! | `layers` | JSON widths, input first: `[784,500,10]` |
//! | `activation` | `relu`, `tanh`, `sigmoid` or `gelu` (hidden layers; the output is `softmax`) |
//! | `dropout` | the rate training dropped hidden values at (`model.dropout`), when not 0; inference drops nothing |
//! | `classes` | the class count, the last width (1 for regression) |
//! | `task` | `regression` for a model of a real-valued label (`model.task`: one output, the prediction itself, no softmax); absent: `classification` |
//! | `preprocessing` | JSON: `{"kind":"scale","divisor":255.0}` or `{"kind":"standardize","mean":[…],"std":[…]}` |
//! | `label` | the CSV label column, when the data was CSV |
//! | `class_names` | JSON list of the classes' names in class order, when the labels were names (a CSV label column of `setosa`, `versicolor`, …): `predict` prints them, `eval` reads test labels through them; absent for class indices |
//! | `features` | JSON list of the feature columns' names, when the data has names (CSV): `predict` and `eval` match columns by them |
//! | `hyperparameters` | JSON: the `[train]` table the checkpoint was written under |
//! | `training_data` | JSON: the `[data]` table it was trained on (format, paths, label): `dtf eval`'s default test data |
//! | `wide_deep` | JSON, a wide & deep model only: `{"fields":["user_id",…],"embedding_dim":16}` — its categorical fields in input order and the embedding width; `layers` are then its deep part's (input: fields × embedding_dim + the dense features; output: one logit) and `classes` is 2 |
//!
//! A checkpoint written before these keys existed has none of them: it is
//! today's MLP, read back as layers from its weights, ReLU, pixels / 255.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;

use serde::Serialize;

use super::{Checkpoint, CheckpointError, MAX_HEADER_BYTES};
use crate::data::Preprocessing;

/// Metadata key of the training run's `[data]` table.
pub const TRAINING_DATA: &str = "training_data";

/// A checkpoint's model, as its metadata (or, for an older checkpoint, its
/// weights) describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelMeta {
    /// Widths, input first, classes last.
    pub layers: Vec<usize>,
    /// The hidden layers' activation (`model.activation`; absent in older files: ReLU).
    pub activation: crate::model::Activation,
    /// The dropout rate training used (`model.dropout`); inference ignores it.
    pub dropout: f32,
    /// The number of classes (the last width).
    pub classes: usize,
    /// What the output is (`model.task`): class scores, or the predicted value itself
    /// (absent in older files: classification).
    pub task: crate::config::ModelTask,
    /// How raw features become the model's input.
    pub preprocessing: Preprocessing,
    /// The CSV column that held the labels, when the data was CSV.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The `[train]` table at the time of writing; `None` for an older checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperparameters: Option<serde_json::Value>,
    /// The `[data]` table of the training run (format, files, label): where
    /// its test split is, for `dtf eval` without `--data`. `None` for an older
    /// checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub training_data: Option<crate::config::DataConfig>,
    /// The feature columns' names, in the model's input order, when the
    /// data had names (a CSV header); `None` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
    /// The classes' names in class order, when the training labels were
    /// names; `None` for class indices (and older checkpoints).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_names: Option<Vec<String>>,
    /// A wide & deep model's categorical side; `None` for the MLP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wide_deep: Option<WideDeepMeta>,
}

/// What a wide & deep checkpoint says of its categorical inputs.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WideDeepMeta {
    /// The categorical fields, in the model's input order.
    pub fields: Vec<String>,
    /// Values per embedding row.
    pub embedding_dim: usize,
}

impl ModelMeta {
    /// Dense features per example: the first width, less the embeddings a
    /// wide & deep model puts before them.
    pub fn dense_inputs(&self) -> usize {
        let embedded = self
            .wide_deep
            .as_ref()
            .map_or(0, |w| w.fields.len() * w.embedding_dim);
        self.layers[0].saturating_sub(embedded)
    }

    /// The metadata entries of this description.
    pub fn to_metadata(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::from([
            ("layers".to_owned(), json(&self.layers)),
            ("activation".to_owned(), self.activation.name().to_owned()),
            ("classes".to_owned(), self.classes.to_string()),
            ("preprocessing".to_owned(), json(&self.preprocessing)),
        ]);
        if self.dropout > 0.0 {
            out.insert("dropout".to_owned(), self.dropout.to_string());
        }
        if self.task != crate::config::ModelTask::Classification {
            out.insert("task".to_owned(), self.task.name().to_owned());
        }
        if let Some(label) = &self.label {
            out.insert("label".to_owned(), label.clone());
        }
        if let Some(h) = &self.hyperparameters {
            out.insert("hyperparameters".to_owned(), h.to_string());
        }
        if let Some(d) = &self.training_data {
            out.insert(TRAINING_DATA.to_owned(), json(d));
        }
        if let Some(f) = &self.features {
            out.insert("features".to_owned(), json(f));
        }
        if let Some(c) = &self.class_names {
            out.insert("class_names".to_owned(), json(c));
        }
        if let Some(w) = &self.wide_deep {
            out.insert("wide_deep".to_owned(), json(w));
        }
        out
    }

    /// The model described by `meta` (a model file's metadata), checked
    /// against `weights` (the widths its weight matrices chain to); without
    /// the keys, the MLP dtf always trained: those widths, ReLU, pixels / 255.
    ///
    /// Errors: a sentence saying which key is malformed or disagrees with
    /// the weights.
    pub fn from_metadata(
        meta: &HashMap<String, String>,
        weights: &[usize],
    ) -> Result<Self, String> {
        let get = |k: &str| meta.get(k).map(String::as_str);
        let layers: Vec<usize> = match get("layers") {
            None => weights.to_vec(),
            Some(text) => serde_json::from_str(text)
                .map_err(|e| format!("metadata layers {text:?} is not a list of widths: {e}"))?,
        };
        if layers != weights {
            return Err(format!(
                "metadata layers {layers:?} disagree with the weights' widths {weights:?}"
            ));
        }
        let activation = match get("activation") {
            None => crate::model::Activation::Relu,
            Some(name) => crate::model::Activation::from_name(name).ok_or_else(|| {
                format!(
                    "metadata activation {name:?}: expected one of {}",
                    crate::model::Activation::ALL.map(|a| a.name()).join(", ")
                )
            })?,
        };
        let wide_deep: Option<WideDeepMeta> = get("wide_deep")
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| format!("metadata wide_deep is malformed: {e}"))?;
        let last = *layers.last().ok_or("no layers")?;
        // A binary model's one logit scores two classes.
        let outputs = if wide_deep.is_some() { 2 } else { last };
        let classes = match get("classes") {
            None => outputs,
            Some(c) => c
                .parse()
                .map_err(|_| format!("metadata classes {c:?} is not a count"))?,
        };
        if classes != outputs || wide_deep.is_some() && last != 1 {
            return Err(format!(
                "metadata classes {classes} disagree with the output width {last}"
            ));
        }
        let dense = match &wide_deep {
            None => layers[0],
            Some(w) => {
                let embedded = w.fields.len().saturating_mul(w.embedding_dim);
                if w.fields.is_empty() || w.embedding_dim == 0 || embedded > layers[0] {
                    return Err(format!(
                        "metadata wide_deep has {} fields of {} values, the first width is {}",
                        w.fields.len(),
                        w.embedding_dim,
                        layers[0]
                    ));
                }
                layers[0] - embedded
            }
        };
        let preprocessing = match get("preprocessing") {
            None => Preprocessing::legacy(),
            Some(text) => serde_json::from_str(text)
                .map_err(|e| format!("metadata preprocessing is malformed: {e}"))?,
        };
        if let Preprocessing::Standardize { mean, std } = &preprocessing
            && (mean.len() != dense || std.len() != dense)
        {
            return Err(format!(
                "metadata preprocessing standardizes {} features, the model takes {dense}",
                mean.len(),
            ));
        }
        preprocessing.check()?;
        let hyperparameters = get("hyperparameters")
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| format!("metadata hyperparameters are malformed: {e}"))?;
        let training_data = get(TRAINING_DATA)
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| format!("metadata {TRAINING_DATA} is malformed: {e}"))?;
        let features: Option<Vec<String>> =
            get("features")
                .map(serde_json::from_str)
                .transpose()
                .map_err(|e| format!("metadata features are not a list of names: {e}"))?;
        if let Some(f) = &features
            && f.len() != dense
        {
            return Err(format!(
                "metadata features name {} columns, the model takes {dense}",
                f.len(),
            ));
        }
        let class_names: Option<Vec<String>> = get("class_names")
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| format!("metadata class_names are not a list of names: {e}"))?;
        if let Some(c) = &class_names {
            let sorted = c.windows(2).all(|w| w[0] < w[1]);
            if c.is_empty() || c.len() > classes || !sorted {
                return Err(format!(
                    "metadata class_names are {} names{}, the model scores {classes} classes: \
                     expected at most that many, distinct and sorted",
                    c.len(),
                    if sorted { "" } else { " not sorted" },
                ));
            }
        }
        let dropout = match get("dropout") {
            None => 0.0,
            Some(d) => d
                .parse::<f32>()
                .ok()
                .filter(|d| (0.0..1.0).contains(d))
                .ok_or_else(|| format!("metadata dropout {d:?} is not a rate in [0, 1)"))?,
        };
        let task = match get("task") {
            None | Some("classification") => crate::config::ModelTask::Classification,
            Some("regression") if classes == 1 && wide_deep.is_none() && class_names.is_none() => {
                crate::config::ModelTask::Regression
            }
            Some("regression") => {
                return Err(format!(
                    "metadata task \"regression\" with {classes} outputs{}: a regression \
                     model is an MLP of one output",
                    if wide_deep.is_some() {
                        " (wide & deep)"
                    } else {
                        ""
                    }
                ));
            }
            Some(t) => {
                return Err(format!(
                    "metadata task {t:?}: expected \"classification\" or \"regression\""
                ));
            }
        };
        Ok(ModelMeta {
            layers,
            activation,
            dropout,
            classes,
            task,
            preprocessing,
            label: get("label").map(str::to_owned),
            hyperparameters,
            training_data,
            features,
            class_names,
            wide_deep,
        })
    }
}

/// A metadata value as JSON. Plain data (numbers, strings, lists):
/// serializing cannot fail.
fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// The widths implied by the checkpoint's `layerN/weights` shapes, in order.
///
/// Errors: a sentence when a weight is not a matrix, the widths do not chain,
/// or there are none.
pub fn widths(ckpt: &Checkpoint) -> Result<Vec<usize>, String> {
    let mut layers: Vec<usize> = Vec::new();
    for (name, a) in &ckpt.variables {
        if name.ends_with("/weights") {
            if a.ndim() != 2 {
                return Err(format!(
                    "{name} has shape {:?}, expected a matrix",
                    a.shape()
                ));
            }
            if layers.is_empty() {
                layers.push(a.shape()[0]);
            }
            layers.push(a.shape()[1]);
        }
    }
    if layers.len() < 2 {
        return Err("the checkpoint holds no layer weights".into());
    }
    Ok(layers)
}

/// The string metadata of the safetensors file at `path`, reading only its
/// header (bounded by [`MAX_HEADER_BYTES`]).
///
/// Errors: [`CheckpointError::Io`] when it cannot be read,
/// [`CheckpointError::HeaderTooLarge`], [`CheckpointError::Invalid`] when
/// the header is not JSON.
/// Errors unless the checkpoint at `path` was trained with `activation` (absent from its
/// metadata: ReLU): a resume, or a run started from it, must not switch the function its
/// weights were trained in.
pub fn check_activation(
    path: &Path,
    activation: crate::model::Activation,
) -> Result<(), CheckpointError> {
    let meta = read_metadata(path)?;
    let theirs = meta.get("activation").map_or("relu", String::as_str);
    if theirs == activation.name() {
        return Ok(());
    }
    Err(CheckpointError::invalid(
        path,
        format!(
            "trained with activation {theirs:?}, but this run's model.activation is {:?}: \
             give --activation {theirs} (model.activation) to go on with it",
            activation.name()
        ),
    ))
}

pub fn read_metadata(path: &Path) -> Result<HashMap<String, String>, CheckpointError> {
    let io = |source| CheckpointError::io(path, "read", source);
    let (mut file, _) = crate::files::open_regular(path).map_err(|e| match e {
        crate::files::OpenError::Io(e) => io(e),
        crate::files::OpenError::Special(what) => CheckpointError::NotRegular {
            path: path.to_path_buf(),
            what,
        },
    })?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io)?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES {
        return Err(CheckpointError::HeaderTooLarge {
            path: path.to_path_buf(),
            bytes: n,
        });
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).map_err(io)?;
    let value: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| CheckpointError::invalid(path, format!("header is not JSON: {e}")))?;
    Ok(value
        .get("__metadata__")
        .and_then(|m| m.as_object())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyperparameters_read_as_they_were_written() {
        let train = crate::config::TrainConfig::default();
        let text = crate::config::json_value(&train).unwrap().to_string();
        assert!(
            text.contains(r#""learning_rate":0.01"#) && text.contains(r#""beta1":0.9"#),
            "{text}"
        );
    }

    #[test]
    fn round_trips_and_defaults_for_old_checkpoints() {
        let m = ModelMeta {
            layers: vec![3, 4, 2],
            activation: crate::model::Activation::Relu,
            task: crate::config::ModelTask::Classification,
            dropout: 0.0,
            classes: 2,
            preprocessing: Preprocessing::Standardize {
                mean: vec![0.5, 1.0, -2.0],
                std: vec![1.0, 2.0, 0.25],
            },
            label: Some("y".into()),
            hyperparameters: Some(serde_json::json!({"learning_rate": 0.01})),
            training_data: Some(crate::config::DataConfig {
                format: crate::config::DataFormat::Csv,
                train: Some("/d/x_train.csv".into()),
                test: Some("/d/x_test.csv".into()),
                label: "y".into(),
                ..Default::default()
            }),
            features: Some(vec!["a".into(), "b".into(), "c".into()]),
            class_names: Some(vec!["cat".into(), "dog".into()]),
            wide_deep: None,
        };
        let meta: HashMap<String, String> = m.to_metadata().into_iter().collect();
        assert_eq!(ModelMeta::from_metadata(&meta, &[3, 4, 2]).unwrap(), m);
        assert_eq!(meta["class_names"], r#"["cat","dog"]"#);
        // Class indices: no key, as before.
        let numeric = ModelMeta {
            class_names: None,
            ..m.clone()
        };
        assert!(!numeric.to_metadata().contains_key("class_names"));
        // Names the model cannot score, or out of order, are refused.
        for bad in [r#"["dog","cat"]"#, r#"["a","b","c"]"#, "[]", "cat"] {
            let mut meta = meta.clone();
            meta.insert("class_names".to_owned(), bad.to_owned());
            let err = ModelMeta::from_metadata(&meta, &[3, 4, 2]).unwrap_err();
            assert!(err.contains("class_names"), "{bad}: {err}");
        }
        // Wide & deep: 2 fields of 4 before the 3 dense features, one logit.
        let wd = ModelMeta {
            layers: vec![11, 4, 1],
            wide_deep: Some(WideDeepMeta {
                fields: vec!["user".into(), "item".into()],
                embedding_dim: 4,
            }),
            ..m.clone()
        };
        assert_eq!(wd.dense_inputs(), 3);
        let meta: HashMap<String, String> = wd.to_metadata().into_iter().collect();
        assert_eq!(ModelMeta::from_metadata(&meta, &[11, 4, 1]).unwrap(), wd);
        let narrow = ModelMeta {
            layers: vec![7, 4, 1],
            ..wd.clone()
        };
        let meta: HashMap<String, String> = narrow.to_metadata().into_iter().collect();
        let err = ModelMeta::from_metadata(&meta, &[7, 4, 1]).unwrap_err();
        assert!(err.contains("wide_deep has 2 fields of 4"), "{err}");
        // Keys absent: the MLP dtf always trained.
        let old = ModelMeta::from_metadata(&HashMap::new(), &[784, 500, 10]).unwrap();
        assert_eq!(old.preprocessing, Preprocessing::Scale { divisor: 255.0 });
        assert_eq!((old.classes, old.hyperparameters), (10, None));
        assert_eq!(old.training_data, None);
        assert_eq!(old.class_names, None);
        // Disagreement with the weights is named.
        let err = ModelMeta::from_metadata(&meta, &[3, 5, 2]).unwrap_err();
        assert!(err.contains("disagree"), "{err}");
    }

    /// `model.task`: `task=regression` for a regression model, no key for a classifier, so
    /// an older checkpoint (no key) reads as the classifier it is.
    #[test]
    fn the_task_round_trips_and_is_classification_when_absent() {
        use crate::config::ModelTask;
        let m = ModelMeta {
            layers: vec![3, 4, 1],
            activation: crate::model::Activation::Relu,
            dropout: 0.0,
            classes: 1,
            task: ModelTask::Regression,
            preprocessing: Preprocessing::Scale { divisor: 1.0 },
            label: Some("price".into()),
            hyperparameters: None,
            training_data: None,
            features: None,
            class_names: None,
            wide_deep: None,
        };
        let meta: HashMap<String, String> = m.to_metadata().into_iter().collect();
        assert_eq!(meta["task"], "regression");
        assert_eq!(ModelMeta::from_metadata(&meta, &[3, 4, 1]).unwrap(), m);
        let classifier = ModelMeta {
            task: ModelTask::Classification,
            ..m.clone()
        };
        assert!(!classifier.to_metadata().contains_key("task"));
        let old = ModelMeta::from_metadata(&HashMap::new(), &[3, 4, 1]).unwrap();
        assert_eq!(old.task, ModelTask::Classification);
        // A regression model has one output; an unknown task is named.
        let mut wide = meta.clone();
        wide.insert("layers".into(), "[3,4,2]".into());
        wide.insert("classes".into(), "2".into());
        let err = ModelMeta::from_metadata(&wide, &[3, 4, 2]).unwrap_err();
        assert!(err.contains("task \"regression\" with 2 outputs"), "{err}");
        let mut odd = meta.clone();
        odd.insert("task".into(), "ranking".into());
        let err = ModelMeta::from_metadata(&odd, &[3, 4, 1]).unwrap_err();
        assert!(err.contains("metadata task \"ranking\""), "{err}");
    }

    /// Issue 25: `divisor: 0.0` (or negative, or an all-zero std) was
    /// accepted by `predict`, `eval` and `export`: every row one class.
    #[test]
    fn preprocessing_that_cannot_map_rows_is_refused() {
        let with = |p: &str| {
            let meta = HashMap::from([("preprocessing".to_owned(), p.to_owned())]);
            ModelMeta::from_metadata(&meta, &[2, 3, 2])
        };
        for bad in [
            r#"{"kind":"scale","divisor":0.0}"#,
            r#"{"kind":"scale","divisor":-255.0}"#,
            r#"{"kind":"standardize","mean":[0.0,0.0],"std":[0.0,0.0]}"#,
            r#"{"kind":"standardize","mean":[0.0,0.0],"std":[1.0,-1.0]}"#,
        ] {
            let err = with(bad).unwrap_err();
            assert!(
                err.contains("expected a finite number above 0"),
                "{bad}: {err}"
            );
        }
        assert!(with(r#"{"kind":"scale","divisor":255.0}"#).is_ok());
    }
}
