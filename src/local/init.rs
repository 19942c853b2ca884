//! `dtf local --init-from`: a run that starts from another checkpoint — a
//! TensorFlow V2 checkpoint (a prefix `DIR/model.ckpt-N`, or a directory
//! whose `checkpoint` file names one) or a dtf one — instead of a fresh
//! initialization.
//!
//! The checkpoint is read and checked against the model before anything is
//! created ([`Seed::load`]: every variable present, float32, with the model's
//! shape), then written as a dtf checkpoint into the run's empty checkpoint
//! directory ([`Seed::plant`]), where the chief restores it as it restores
//! any checkpoint: no second restore path.
//!
//! What carries over is what `tf.train.Saver.restore` restores: the
//! variables, `global_step` (the run resumes at that step, the learning
//! rate schedule with it; 0 when the checkpoint has none), each EMA shadow
//! that is there (a missing one starts at its variable's value, as
//! `ExponentialMovingAverage.apply` initializes it) and the optimizer's
//! slots when every slot of `train.optimizer` is there (else fresh ones, as
//! after a change of optimizer). Not `tf.train.init_from_checkpoint`'s warm
//! start at step 0: a checkpoint exported from a dtf run continues that run.

use std::path::{Path, PathBuf};

use super::LocalError;
use crate::checkpoint::{self, Checkpoint, Saver, tensorflow};
use crate::config::{Config, ModelKind};
use crate::model::Mlp;

/// A checkpoint to start from, read and checked against the model.
#[derive(Debug, Clone)]
pub struct Seed {
    /// What was named: the TensorFlow prefix or the dtf model file read.
    pub source: PathBuf,
    /// Whether it is TensorFlow's (else dtf's).
    pub tensorflow: bool,
    /// The state, as the chief will restore it.
    pub checkpoint: Checkpoint,
    /// Variables whose EMA shadow was there.
    pub shadows: usize,
    /// Whether the optimizer's slots were there.
    pub slots: bool,
}

impl Seed {
    /// Reads `path` and checks it against `cfg`'s model, and that the run's
    /// checkpoint directory `dir` (when one is named) holds no checkpoint.
    /// Creates nothing.
    ///
    /// Errors: [`LocalError::InitFrom`] saying what is wrong: not a
    /// checkpoint, a damaged one (naming the file), a variable missing or
    /// of another shape (naming it and both shapes), a step at or past
    /// `train.last_step`, a model with embedding tables, or checkpoints
    /// already in `dir`.
    pub fn load(path: &Path, cfg: &Config, dir: Option<&Path>) -> Result<Seed, LocalError> {
        let fail = |problem: String| LocalError::InitFrom {
            path: path.to_path_buf(),
            problem,
        };
        if cfg.model.kind == ModelKind::WideDeep {
            return Err(fail(
                "starts the MLP only; a wide & deep model's embedding tables are not \
                 restored from another checkpoint"
                    .into(),
            ));
        }
        if let Some(dir) = dir {
            refuse_checkpoints_in(dir).map_err(&fail)?;
        }
        let specs = Mlp::new(&cfg.model.layers)?.variables();
        let (source, tf) = find(path).map_err(&fail)?;
        let chk = |e: checkpoint::CheckpointError| fail(e.to_string());
        let (mut ckpt, shadows, slots) = if tf {
            let tensors = tensorflow::read(&source).map_err(chk)?;
            let (ckpt, taken) =
                tensorflow::to_checkpoint(&tensors, &specs, cfg.train.optimizer(), &source)
                    .map_err(chk)?;
            (ckpt, taken.shadows, taken.slots)
        } else {
            let ckpt = checkpoint::load(&source, Some(specs.as_slice())).map_err(chk)?;
            checkpoint::check_activation(&source, cfg.model.activation).map_err(chk)?;
            let slots = !ckpt.slots.tensors.is_empty();
            (ckpt, specs.len(), slots)
        };
        // A new run: its ps tasks have no snapshot of this state, and their
        // count may differ.
        ckpt.run = 0;
        ckpt.shard_steps.clear();
        if ckpt.global_step >= cfg.train.last_step {
            return Err(fail(format!(
                "holds global_step {}, at or past the last step {}: nothing would be trained \
                 (the step carries over, as tf.train.Saver.restore resumes it); raise --steps",
                ckpt.global_step, cfg.train.last_step
            )));
        }
        Ok(Seed {
            source,
            tensorflow: tf,
            checkpoint: ckpt,
            shadows,
            slots,
        })
    }

    /// Writes the seed as a dtf checkpoint into `dir`, the run's checkpoint
    /// directory, which must hold none; returns its model file.
    ///
    /// Errors: [`LocalError::InitFrom`] when `dir` has checkpoints or the
    /// write fails.
    pub fn plant(&self, dir: &Path) -> Result<PathBuf, LocalError> {
        let fail = |problem: String| LocalError::InitFrom {
            path: self.source.clone(),
            problem,
        };
        refuse_checkpoints_in(dir).map_err(&fail)?;
        Saver::new(dir, 0)
            .and_then(|s| s.save(&self.checkpoint))
            .map_err(|e| fail(format!("cannot write it into the run's checkpoints: {e}")))
    }

    /// The console line: what was taken, and that the step carries over.
    pub fn describe(&self) -> String {
        let vars = self.checkpoint.variables.len();
        let shadows = if self.shadows == vars {
            "their EMA shadows".to_string()
        } else {
            format!(
                "EMA shadows of {} ({} start at the variable's value)",
                self.shadows,
                vars - self.shadows
            )
        };
        format!(
            "dtf local: initialized from {} checkpoint {}: {vars} variables, {shadows}, \
             optimizer slots {}; global_step {} carries over (as tf.train.Saver.restore)",
            if self.tensorflow { "TensorFlow" } else { "dtf" },
            self.source.display(),
            if self.slots {
                "restored"
            } else {
                "start fresh"
            },
            self.checkpoint.global_step,
        )
    }
}

/// An error when `dir` holds a dtf checkpoint.
fn refuse_checkpoints_in(dir: &Path) -> Result<(), String> {
    match checkpoint::newest_named_step(dir) {
        Some(step) => Err(format!(
            "the checkpoint directory {} already holds checkpoints (newest: step {step}); \
             --init-from starts a new run: name an empty --checkpoint-dir, or leave out \
             --init-from to resume those",
            dir.display()
        )),
        None => Ok(()),
    }
}

/// The checkpoint `path` names: (a TensorFlow prefix, true) or (a dtf
/// model file, false).
fn find(path: &Path) -> Result<(PathBuf, bool), String> {
    let what = "expected a TensorFlow checkpoint prefix (DIR/model.ckpt-N, beside \
                DIR/model.ckpt-N.index), a directory with a TensorFlow `checkpoint` file, a \
                dtf model.ckpt-N.safetensors or a dtf checkpoint directory";
    let meta = std::fs::metadata(path).ok();
    if meta.as_ref().is_some_and(|m| m.is_dir()) {
        let named = tensorflow::latest(path).map_err(|e| e.to_string())?;
        if let Some(prefix) = named.filter(|p| !p.to_string_lossy().ends_with(".safetensors")) {
            if tensorflow::is_prefix(&prefix) {
                return Ok((prefix, true));
            }
            return Err(format!(
                "its `checkpoint` file names {}, but {} is missing",
                prefix.display(),
                tensorflow::index_path(&prefix).display()
            ));
        }
        if checkpoint::newest_named_step(path).is_some() {
            let file = checkpoint::resolve(path).map_err(|e| e.to_string())?;
            return Ok((file, false));
        }
        return Err(format!("a directory with no checkpoint in it; {what}"));
    }
    let text = path.to_string_lossy();
    if text.ends_with(".safetensors") && meta.is_some() {
        return Ok((path.to_path_buf(), false));
    }
    // The index or data file given for the prefix.
    let prefix = [tensorflow::INDEX_SUFFIX, tensorflow::DATA_SUFFIX]
        .iter()
        .find_map(|s| text.strip_suffix(s))
        .map_or_else(|| path.to_path_buf(), PathBuf::from);
    if tensorflow::is_prefix(&prefix) {
        return Ok((prefix, true));
    }
    Err(format!("not found; {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_takes_a_prefix_its_files_a_directory_and_a_dtf_file() {
        let tmp = tempfile::tempdir().unwrap();
        let t = [tensorflow::Tensor::f32("x", &[1], [1.0].into_iter())];
        let prefix = tensorflow::write(tmp.path(), 5, &t).unwrap();
        assert_eq!(find(&prefix).unwrap(), (prefix.clone(), true));
        assert_eq!(
            find(&tensorflow::index_path(&prefix)).unwrap(),
            (prefix.clone(), true)
        );
        assert_eq!(find(tmp.path()).unwrap(), (prefix.clone(), true));
        let err = find(&tmp.path().join("model.ckpt-6")).unwrap_err();
        assert!(err.contains("not found"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        assert!(find(empty.path()).unwrap_err().contains("no checkpoint"));
    }
}
