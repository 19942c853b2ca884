//! Checkpoints: safetensors files of the variables and their EMA shadows,
//! an index, atomic writes, retention, and restore of the newest valid one.

// Interface stub; replaced by the real module.
use crate::model::VarSpec;
use ndarray::ArrayD;
use std::path::{Path, PathBuf};

/// A checkpoint in memory.
pub struct Checkpoint {
    pub global_step: u64,
    pub variables: Vec<(String, ArrayD<f32>)>,
    pub shadows: Vec<(String, ArrayD<f32>)>,
}
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("x")]
    X,
}
pub struct Saver {}
impl Saver {
    pub fn new(dir: &Path, max_to_keep: usize) -> Result<Self, CheckpointError> {
        todo!()
    }
    pub fn set_max_to_keep(&mut self, n: usize) {}
    pub fn save(&self, ckpt: &Checkpoint) -> Result<PathBuf, CheckpointError> {
        todo!()
    }
}
pub fn load(path: &Path, expected: Option<&[VarSpec]>) -> Result<Checkpoint, CheckpointError> {
    todo!()
}
pub fn restore_latest(dir: &Path, expected: &[VarSpec]) -> Result<Option<(PathBuf, Checkpoint)>, CheckpointError> {
    todo!()
}
pub fn resolve(path: &Path) -> Result<PathBuf, CheckpointError> {
    todo!()
}
pub fn inspect(path: &Path) -> Result<String, CheckpointError> {
    todo!()
}
