//! MNIST-format (IDX) data sets: reading `.gz` or raw files, batching.

use ndarray::Array2;
use std::path::{Path, PathBuf};

/// Which half of the data set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`
    Train,
    /// `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`
    Test,
}

/// Errors reading a data set; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {what}")]
    Format { path: PathBuf, what: String },
}

/// Images kept as bytes (converted to f32 per batch) and their labels.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// `len · features` pixels, row-major.
    images: Vec<u8>,
    /// One class index per image.
    labels: Vec<u8>,
    /// Pixels per image (rows · cols).
    features: usize,
}

impl Dataset {
    /// Loads `split` from `dir`, taking `<name>.gz` or `<name>`, whichever exists.
    pub fn load(dir: &Path, split: Split) -> Result<Self, DataError> {
        todo!()
    }

    /// From an idx3 image file and an idx1 label file (gzip or raw, by magic).
    pub fn from_files(images: &Path, labels: &Path) -> Result<Self, DataError> {
        todo!()
    }

    /// From raw parts (tests, synthetic data). `images.len()` must be `labels.len() · features`.
    pub fn from_parts(images: Vec<u8>, labels: Vec<u8>, features: usize) -> Self {
        todo!()
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn features(&self) -> usize {
        self.features
    }

    /// Fills `x` (indices.len() × features, pixel/255) and `y` for the given rows.
    pub fn batch(&self, indices: &[usize], x: &mut Array2<f32>, y: &mut Vec<u8>) {
        todo!()
    }

    /// Every example, as (x, labels): for evaluation.
    pub fn all(&self) -> (Array2<f32>, Vec<u8>) {
        todo!()
    }
}

/// An endless stream of shuffled mini-batch indices: a new permutation each epoch.
pub struct Batches {
    /// Current permutation of 0..len.
    order: Vec<usize>,
    /// Next position in `order`.
    pos: usize,
    /// Examples per batch.
    batch_size: usize,
    /// Seeded per worker.
    rng: rand::rngs::StdRng,
}

impl Batches {
    pub fn new(len: usize, batch_size: usize, seed: u64) -> Self {
        todo!()
    }

    /// The next `batch_size` indices (wrapping into a fresh permutation).
    pub fn next_indices(&mut self) -> &[usize] {
        todo!()
    }
}

/// Writes an idx3 image file (raw, or gzip when `path` ends in `.gz`): for tests and tools.
pub fn write_idx_images(path: &Path, images: &[u8], rows: usize, cols: usize) -> std::io::Result<()> {
    todo!()
}

/// Writes an idx1 label file (raw, or gzip when `path` ends in `.gz`).
pub fn write_idx_labels(path: &Path, labels: &[u8]) -> std::io::Result<()> {
    todo!()
}
