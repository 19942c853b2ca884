//! Data sets: reading them in one of three formats, preprocessing, batching.
//!
//! - `idx` — MNIST-format IDX files in a directory (`data.dir`), see [`idx`];
//! - `npz` — one NumPy `.npz` with `x_train`, `y_train`, `x_test`, `y_test`
//!   (Keras's layout), see [`npz`];
//! - `csv` — a training and a test CSV file with a header and a label
//!   column, see [`csv`].
//!
//! `load` reads a data set's splits as the configuration says (the labels as
//! `model.task` reads them: classes, or a regression's values); `preprocessing` holds
//! [`Preprocessing`] and its fitting to a training split; `batches` the shuffled
//! batches a worker trains on.
//!
//! A data set is held in memory as the file had it: byte features stay one
//! byte each (60000 × 784 Fashion-MNIST images are 47 MB), float features
//! four. Every row becomes f32 only when it is batched, through the
//! [`Preprocessing`] that the checkpoint records so that `dtf eval`,
//! `dtf predict` and an exported ONNX model see inputs the way training did.
//! Nothing trains on half-read data: a bad row, cell, label or array is an
//! error naming its line or name before the first step.

mod batches;
mod build;
mod categorical;
pub mod criteo;
pub mod csv;
mod detect;
mod ids;
pub mod idx;
mod load;
pub mod npz;
mod preprocessing;
pub mod recbole;
pub mod synthetic;

use crate::config::{DataConfig, DataFormat};
use crate::model::Targets;
use ndarray::Array2;
use std::path::{Path, PathBuf};

pub use batches::Batches;
pub use categorical::{Batch, Categorical, SPLIT_SEED, split_rows};
pub use detect::{config_for_path, test_config_for_path};
pub use ids::id;
pub use idx::{images_shape, write_idx_images, write_idx_labels};
pub use load::{load, load_both, load_both_for, load_both_task, load_for, load_task};
pub use preprocessing::Preprocessing;

/// Labels are class indices held in one byte: at most this many classes.
pub const MAX_CLASSES: usize = 256;

/// Which half of the data set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`; `x_train`; `data.train`.
    Train,
    /// `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`; `x_test`; `data.test`.
    Test,
}

impl Split {
    /// File names (without `.gz`) of the images and the labels.
    pub fn file_names(self) -> (&'static str, &'static str) {
        match self {
            Split::Train => ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
            Split::Test => ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
        }
    }
}

/// Errors reading a data set; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read (or its gzip stream is corrupt).
    #[error("{path}: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// What the OS or the gzip decoder reported.
        source: std::io::Error,
    },
    /// The file's contents are not what a file of its format must hold.
    #[error("{path}: {what}")]
    Format {
        /// The offending file.
        path: PathBuf,
        /// What is wrong (with its line, column or array), the expected and
        /// the found values.
        what: String,
    },
    /// Neither `<name>.gz` nor `<name>` exists in the data directory.
    #[error("{path}: no such file (nor {alt}); {advice}")]
    Missing {
        /// The gzipped name, tried first.
        path: PathBuf,
        /// The raw name, tried second.
        alt: PathBuf,
        /// What to do: install the reference data set when the directory
        /// is empty or absent; name the formats dtf reads when it holds
        /// the user's own files ([`idx::missing_advice`]).
        advice: String,
    },
    /// A file is larger than this machine could hold in memory.
    #[error(
        "{path}: is {size} bytes, more than the {limit} bytes of this machine's memory \
         (data sets are held in memory)"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// What it holds (or claims to), in bytes.
        size: u64,
        /// The most it may hold.
        limit: u64,
    },
    /// The configuration does not say where the data is.
    #[error("{key} is not set: data.format = \"{format}\" needs it")]
    Unset {
        /// The missing key, e.g. `data.path`.
        key: &'static str,
        /// The format that needs it.
        format: &'static str,
    },
    /// A path given with `--data` that is not there (or cannot be looked at).
    #[error("{path}: {error}; {FORMATS}")]
    NotThere {
        /// The path as given.
        path: PathBuf,
        /// Why (said in the message, so not a source: a chain would say it twice).
        error: std::io::Error,
    },
    /// A path whose format cannot be told from its name (`dtf local --data`).
    #[error("{path}: cannot tell the data format; {FORMATS}")]
    UnknownFormat {
        /// The path as given.
        path: PathBuf,
    },
    /// The training and the test split disagree on the number of features.
    #[error(
        "the training data has {train} features per row, the test data ({path}) {test}: \
         they must agree"
    )]
    SplitWidths {
        /// The test file.
        path: PathBuf,
        /// Features per training row.
        train: usize,
        /// Features per test row.
        test: usize,
    },
}

/// The feature values, as the file had them.
#[derive(Debug, Clone, PartialEq)]
pub enum Features {
    /// One byte per value (IDX, uint8 arrays, CSV of integers 0–255).
    Bytes(Vec<u8>),
    /// f32 values (float arrays, other CSV).
    Floats(Vec<f32>),
}

impl Features {
    /// The number of values.
    pub fn len(&self) -> usize {
        match self {
            Features::Bytes(v) => v.len(),
            Features::Floats(v) => v.len(),
        }
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Features and labels of one split, held as the file had them.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// `len · features` values, row-major.
    values: Features,
    /// One class index per row.
    labels: Vec<u8>,
    /// Values per row.
    features: usize,
    /// Where the labels came from, for error messages (empty for `from_parts`).
    labels_path: PathBuf,
    /// How a row becomes the model's input.
    preprocessing: Preprocessing,
    /// The features' names, where the data has them (a CSV header).
    names: Option<Vec<String>>,
    /// The categorical features, where the data has them (RecBole, Criteo,
    /// CSV with non-numeric columns): one cell per example and field.
    categorical: Option<Categorical>,
    /// The classes' names in class order, when the labels were names (a
    /// CSV label column of `setosa`, `versicolor`, …); `None`: indices.
    class_names: Option<Vec<String>>,
    /// Each row's label as a real value, in a regression data set (`model.task =
    /// "regression"`); `labels` is then 0 for every row: one output, as one class.
    targets: Option<Vec<f32>>,
}

/// Width and class count of a data set, read off the data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Features per row: the model's input width.
    pub features: usize,
    /// 1 + the largest label in either split: the model's output width (1 for regression).
    pub classes: usize,
    /// Rows in the training split: the largest batch it can give.
    pub examples: usize,
    /// The classes' names, when the training split's labels were names.
    pub class_names: Option<Vec<String>>,
}

/// The features' names of the training split `cfg` describes, where the
/// data has names (the header of a CSV file, read alone); `None` otherwise
/// or when it cannot be read (loading the data says why).
pub fn feature_names(cfg: &DataConfig) -> Option<Vec<String>> {
    match (&cfg.format, &cfg.train) {
        (DataFormat::Csv, Some(path)) => {
            csv::header_names(path, &cfg.label, cfg.delimiter_byte()).ok()
        }
        _ => None,
    }
}

/// The data set's shape: its width and 1 + the largest label of either split.
pub fn shape(train: &Dataset, test: &Dataset) -> Shape {
    // A regression set's labels are all 0: one output.
    let max = |d: &Dataset| d.labels.iter().copied().max().map_or(0, usize::from);
    Shape {
        features: train.features(),
        classes: max(train).max(max(test)) + 1,
        examples: train.len(),
        class_names: train.class_names.clone(),
    }
}

/// Whether the data set `cfg` describes is on this host (its training file
/// or directory exists); whether it reads is for [`load`] to say.
pub fn is_present(cfg: &DataConfig) -> bool {
    let path = match cfg.format {
        DataFormat::Idx => Some(cfg.dir.as_path()),
        DataFormat::Npz => cfg.path.as_deref(),
        DataFormat::Csv => cfg.train.as_deref(),
        DataFormat::Recbole => Some(cfg.dir.as_path()),
        DataFormat::Criteo => cfg.path.as_deref(),
    };
    path.is_some_and(Path::exists)
}

/// Errors putting the data's shape into the model ([`resolve_model`]).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// What `--data` takes, for the messages of a path dtf cannot read as data.
pub const FORMATS: &str = "dtf reads a directory of IDX files (train-images-idx3-ubyte[.gz], \
     …) or of RecBole atomic files (NAME.inter), or one file given with --data: a CSV with a \
     header (its test file with --test, its label column with --label), a .npz (x_train, \
     y_train, x_test, y_test), or a Criteo .txt/.tsv (40 tab-separated fields: the label, \
     I1–I13, C1–C26)";

/// Where `cfg` says the data is, in words, for messages.
pub fn describe(cfg: &DataConfig) -> String {
    let show = |p: &Option<PathBuf>| p.as_deref().unwrap_or(Path::new("")).display().to_string();
    match cfg.format {
        DataFormat::Idx => cfg.dir.display().to_string(),
        DataFormat::Npz => show(&cfg.path),
        DataFormat::Csv if cfg.test.is_none() => format!(
            "{} (its seeded {} % test split)",
            show(&cfg.train),
            100.0 * cfg.test_fraction
        ),
        DataFormat::Csv => format!("{} and {}", show(&cfg.train), show(&cfg.test)),
        DataFormat::Recbole => cfg.dir.display().to_string(),
        DataFormat::Criteo => show(&cfg.path),
    }
}

/// Reads the data set `cfg.data` names and puts its shape into `cfg.model`
/// ([`crate::config::Config::resolve_layers`]): with `model.hidden` the
/// widths come from the data; otherwise they are checked against it. For
/// `wide_deep` the deep part's input is `fields · embedding_dim + dense
/// features` and its output one logit.
///
/// Errors: [`ResolveError::Data`] for unreadable data,
/// [`ResolveError::Config`] naming the `model.layers` width that does not fit,
/// `model.kind` for categorical data and the MLP (or none and wide & deep),
/// `data.threshold` for wide & deep on labels that are not binary.
pub fn resolve_model(cfg: &mut crate::config::Config) -> Result<Shape, ResolveError> {
    use crate::config::ModelKind;
    let (train, test) = load_both_for(cfg)?;
    let s = shape(&train, &test);
    let data = describe(&cfg.data);
    match (cfg.model.kind, train.categorical()) {
        // The MLP would train on the dense columns alone and drop every
        // categorical one without a word.
        (ModelKind::Mlp, Some(c)) => {
            let mut shown: Vec<&str> = c.fields.iter().take(5).map(String::as_str).collect();
            if c.fields.len() > 5 {
                shown.push("…");
            }
            Err(cfg
                .bad(
                    "model.kind",
                    format!(
                        "is \"mlp\", but {data} has {} categorical fields ({}): the MLP reads \
                         dense features only; use model.kind = \"wide_deep\", which embeds them",
                        c.fields.len(),
                        shown.join(", ")
                    ),
                )
                .into())
        }
        (ModelKind::WideDeep, None) => Err(cfg
            .bad(
                "model.kind",
                format!(
                    "is \"wide_deep\", which embeds categorical fields, but {data} has none: \
                     use model.kind = \"mlp\" (or name its categorical columns in data.categorical)"
                ),
            )
            .into()),
        (ModelKind::WideDeep, Some(c)) => {
            if s.classes > 2 {
                return Err(cfg
                    .bad(
                        "data.threshold",
                        format!(
                            "is not set, and the labels of {data} go up to {}: wide & deep is a \
                             binary model; set data.threshold (a label at least it is 1), e.g. \
                             --threshold 4 for ratings of 1 to 5",
                            s.classes - 1
                        ),
                    )
                    .into());
            }
            let inputs = c.width() * cfg.model.embedding_dim + s.features;
            cfg.resolve_layers(inputs, 1, &data)?;
            Ok(s)
        }
        (ModelKind::Mlp, None) => {
            cfg.resolve_layers(s.features, s.classes, &data)?;
            Ok(s)
        }
    }
}

/// Whether the data set `cfg` names has categorical fields: RecBole and
/// Criteo data always, a CSV when a column is not numeric or is named in
/// `data.categorical` (the training file is read to tell).
///
/// Errors: [`DataError`] for a CSV that cannot be read.
pub fn has_categorical(config: &crate::config::Config) -> Result<bool, DataError> {
    Ok(match config.data.format {
        DataFormat::Recbole | DataFormat::Criteo => true,
        DataFormat::Idx | DataFormat::Npz => false,
        DataFormat::Csv => load_for(config, Split::Train)?.categorical().is_some(),
    })
}

/// The most bytes a data file may hold (or decompress to): this machine's
/// memory, since it is all held in memory.
pub(crate) fn max_bytes() -> u64 {
    crate::config::memory_bytes()
}

/// Opens `path` for reading if it is a regular file no larger than
/// [`max_bytes`]: a FIFO would block (the open itself does not: see
/// [`crate::files::open_regular`]), a device never end.
///
/// Errors: [`DataError::Io`], [`DataError::Format`] for a special file,
/// [`DataError::TooLarge`].
pub(crate) fn open_file(path: &Path) -> Result<std::fs::File, DataError> {
    let (file, meta) = crate::files::open_regular(path).map_err(|e| match e {
        crate::files::OpenError::Io(source) => DataError::Io {
            path: path.to_path_buf(),
            source,
        },
        crate::files::OpenError::Special(kind) => format_error(
            path,
            format!("is {kind}, not a regular file: expected a data file"),
        ),
    })?;
    let limit = max_bytes();
    if meta.len() > limit {
        return Err(DataError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
            limit,
        });
    }
    Ok(file)
}

/// The whole of `path`, as [`open_file`] allows it.
///
/// Errors: as [`open_file`].
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, DataError> {
    use std::io::Read;
    let mut file = open_file(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(bytes)
}

impl Dataset {
    /// The features' names, where the data has them (a CSV header).
    pub fn names(&self) -> Option<&[String]> {
        self.names.as_deref()
    }

    /// Records the features' names.
    pub fn set_names(&mut self, names: Vec<String>) {
        self.names = Some(names);
    }

    /// The classes' names in class order, when the labels were names.
    pub fn class_names(&self) -> Option<&[String]> {
        self.class_names.as_deref()
    }

    /// Records the classes' names (`None`: the labels are class indices).
    pub fn set_class_names(&mut self, names: Option<Vec<String>>) {
        self.class_names = names;
    }

    /// The categorical features, where the data has them.
    pub fn categorical(&self) -> Option<&Categorical> {
        self.categorical.as_ref()
    }

    /// The examples `rows`, in that order, as a data set of their own (a
    /// split of a file that holds both), with this one's preprocessing.
    ///
    /// # Panics
    ///
    /// When a row is `>= len()`.
    pub fn select(&self, rows: &[usize]) -> Dataset {
        let f = self.features;
        let values = match &self.values {
            Features::Bytes(v) => Features::Bytes(
                rows.iter()
                    .flat_map(|&i| &v[i * f..(i + 1) * f])
                    .copied()
                    .collect(),
            ),
            Features::Floats(v) => Features::Floats(
                rows.iter()
                    .flat_map(|&i| &v[i * f..(i + 1) * f])
                    .copied()
                    .collect(),
            ),
        };
        Dataset {
            values,
            labels: rows.iter().map(|&i| self.labels[i]).collect(),
            features: f,
            labels_path: self.labels_path.clone(),
            preprocessing: self.preprocessing.clone(),
            names: self.names.clone(),
            categorical: self.categorical.as_ref().map(|c| c.select(rows)),
            class_names: self.class_names.clone(),
            targets: self
                .targets
                .as_ref()
                .map(|t| rows.iter().map(|&i| t[i]).collect()),
        }
    }

    /// From raw parts, for the tests below. `images.len()` must be
    /// `labels.len() · features`.
    #[cfg(test)]
    fn from_parts(images: Vec<u8>, labels: Vec<u8>, features: usize) -> Self {
        Dataset::new(Features::Bytes(images), labels, features, Path::new(""))
            .expect("consistent parts")
    }

    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Values per example (784 for MNIST).
    pub fn features(&self) -> usize {
        self.features
    }

    /// The labels, one class index per example (0 for every one of a regression set's).
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// The labels as the loss reads them: the values of a regression set, else the class
    /// indices.
    pub fn targets(&self) -> Targets<'_> {
        match &self.targets {
            Some(v) => Targets::Values(v),
            None => Targets::Classes(&self.labels),
        }
    }

    /// Whether the labels are real values (`model.task = "regression"`).
    pub fn is_regression(&self) -> bool {
        self.targets.is_some()
    }

    /// The labels of the rows `indices` as the loss reads them: `y` holds their class
    /// indices already ([`Dataset::batch`]); a regression set's values are copied into
    /// `values`, the caller's buffer reused across steps.
    ///
    /// # Panics
    ///
    /// As [`Dataset::batch`].
    pub fn batch_targets<'a>(
        &self,
        indices: &[usize],
        y: &'a [u8],
        values: &'a mut Vec<f32>,
    ) -> Targets<'a> {
        match &self.targets {
            Some(t) => {
                values.clear();
                values.extend(indices.iter().map(|&i| t[i]));
                Targets::Values(values)
            }
            None => Targets::Classes(y),
        }
    }

    /// The file the labels came from.
    pub fn path(&self) -> &Path {
        &self.labels_path
    }

    /// How rows become the model's input.
    pub fn preprocessing(&self) -> &Preprocessing {
        &self.preprocessing
    }

    /// Uses `p` from now on (a checkpoint's, or the training split's).
    ///
    /// Errors: [`DataError::Format`] when `p` standardizes another width.
    pub fn set_preprocessing(&mut self, p: Preprocessing) -> Result<(), DataError> {
        if let Some(n) = p.features().filter(|&n| n != self.features) {
            return Err(format_error(
                &self.labels_path,
                format!(
                    "rows have {} features, the model's standardization {n}",
                    self.features
                ),
            ));
        }
        self.preprocessing = p;
        Ok(())
    }

    /// Checks that every label is a class index below `classes` (the model's
    /// output width), so the math never sees an out-of-range label.
    ///
    /// Errors: [`DataError::Format`] naming the first bad label and its index.
    pub fn check_labels(&self, classes: usize) -> Result<(), DataError> {
        match self
            .labels
            .iter()
            .enumerate()
            .find(|&(_, &l)| usize::from(l) >= classes)
        {
            None => Ok(()),
            Some((i, &l)) => Err(format_error(
                &self.labels_path,
                format!("label {i} is {l}: expected a class index below {classes}"),
            )),
        }
    }

    /// Fills `x` (indices.len() × features, preprocessed) and `y` for the given rows.
    ///
    /// `x` and `y` are the caller's buffers, reused across calls: `x` is only
    /// reallocated when its shape is not already `indices.len() × features`.
    ///
    /// # Panics
    ///
    /// When an index is `>= len()` (indices come from [`Batches`]).
    pub fn batch(&self, indices: &[usize], x: &mut Array2<f32>, y: &mut Vec<u8>) {
        let f = self.features;
        if x.dim() != (indices.len(), f) {
            *x = Array2::zeros((indices.len(), f));
        }
        for (mut row, &i) in x.rows_mut().into_iter().zip(indices) {
            let out = row
                .as_slice_mut()
                .expect("rows of a standard-layout array are contiguous");
            match &self.values {
                Features::Bytes(v) => self.preprocessing.apply(&v[i * f..(i + 1) * f], out),
                Features::Floats(v) => self.preprocessing.apply(&v[i * f..(i + 1) * f], out),
            }
        }
        y.clear();
        y.extend(indices.iter().map(|&i| self.labels[i]));
    }

    /// Every example, as (x, labels): for evaluation.
    pub fn all(&self) -> (Array2<f32>, Vec<u8>) {
        let mut x = Array2::zeros((0, 0));
        let mut y = Vec::new();
        let indices: Vec<usize> = (0..self.len()).collect();
        self.batch(&indices, &mut x, &mut y);
        (x, y)
    }
}

pub(crate) fn format_error(path: &Path, what: impl Into<String>) -> DataError {
    DataError::Format {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

#[cfg(test)]
mod tests;
