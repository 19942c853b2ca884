//! Checkpoints: safetensors files of the variables and their EMA shadows,
//! an index, atomic writes, retention, and restore of the newest valid one.
//!
//! A checkpoint at step `N` is two files in the checkpoint directory:
//!
//! - `model.ckpt-N.safetensors`: every variable as F32 plus `global_step` as
//!   an I64 scalar (TensorFlow keeps the step as a variable too), and the
//!   optimizer's slots under TensorFlow's names (`layer1/weights/Adam`,
//!   `layer1/weights/Adam_1`, `…/Momentum`, `…/Adagrad`, and the F32 scalars
//!   `beta1_power`, `beta2_power`);
//! - `model.ckpt-N.ema.safetensors`: the shadows, `<var>/ExponentialMovingAverage`.
//!
//! An embedding table `NAME` (wide & deep's `deep/embeddings`, `wide/weights`)
//! is saved whole, whatever the ps count: `NAME/ids` (I64, the ids' 64 bits,
//! strictly ascending), `NAME/values` and one `NAME/<slot>` per optimizer
//! slot (F32, rows × dim) in the model file, listed in its `tables` metadata
//! (JSON, in order), and `NAME/ExponentialMovingAverage` (rows × dim, the
//! rows of `NAME/ids`) in the EMA file.
//!
//! Both carry string metadata: `format = "dtf-1"`, `global_step`, `kind`
//! (`variables` or `ema`), `crc32:<tensor>` (CRC-32 of the tensor's bytes, so
//! that bit rot inside the data is caught, not only in the header), and in the
//! model file `variables`, a JSON list of the variable names in model order
//! (safetensors itself keeps no order), `optimizer`, the optimizer and its
//! hyperparameters as JSON (`{"name":"adam","beta1":0.9,…}`), and `slots`, a
//! JSON list of its slot tensors. A file without `optimizer` (written before
//! dtf had optimizers) is plain SGD without slots. Any safetensors reader (Python
//! `safetensors.numpy.load_file`, PyTorch) loads them as they are.
//!
//! Incremental checkpoints (docs/design.md, "Incremental checkpoints"): a
//! chain is a whole checkpoint, its base, then deltas that hold the dense
//! state whole and of each table only the rows created or updated since the
//! base and `NAME/removed`, the ids dropped since; every file of a chain has
//! `chain` (16 hex digits) in its metadata, a delta's files `format =
//! "dtf-1-delta"` and `base` (the base's step). [`load`] resolves a delta
//! onto its base `model.ckpt-<base>.safetensors` beside it, so every reader
//! gets whole tables; a delta whose base is gone does not verify. Retention
//! keeps the base of every delta it keeps.
//!
//! The evaluator's best checkpoints are copies of such pairs in
//! `best/` beside them, ranked by `best/index.json` ([`best`]); the
//! chief's retention never looks into that directory.
//!
//! The `checkpoint.dtf` index names the newest and all kept checkpoints, in
//! the format of TensorFlow's `checkpoint` file but not under its name:
//! `tf.train.latest_checkpoint` would return a `.safetensors` file that
//! TensorFlow cannot load (a directory from before the rename has a
//! `checkpoint` index: it is read where `checkpoint.dtf` is missing, and the
//! next save removes it). It is a convenience for people and a hint, never
//! an override: [`restore_latest`] and [`resolve`] both scan the directory
//! and take the highest step that verifies, because a crash can leave the
//! index stale (and anyone can edit it).
//!
//! [`tensorflow`] converts both ways with TensorFlow's own V2 checkpoints
//! (`dtf export --tf-checkpoint`, `dtf local --init-from`).

pub mod best;
pub(crate) mod container;
mod format;
mod inspect;
mod layout;
mod meta;
mod restore;
mod save;
pub mod tensorflow;

use std::io;
use std::path::{Path, PathBuf};

use crate::optimizer::Optimizer;
use ndarray::ArrayD;
use safetensors::SafeTensorError;

use container::CRC_PREFIX;
pub use container::MAX_HEADER_BYTES;
pub use format::from_bytes;
pub use inspect::{ChainEntry, InspectedFile, Inspection, TableEntry, TensorEntry, inspect};
pub use meta::{ModelMeta, WideDeepMeta, check_activation, read_metadata, widths};
pub use restore::{Verbatim, load, load_verbatim, resolve, restore_latest};
pub use save::Saver;

/// Value of the `format` metadata key this module writes and accepts.
pub const FORMAT: &str = "dtf-1";
/// Value of the `format` metadata key of both files of a delta (an
/// incremental checkpoint, [`Increment`]): not [`FORMAT`], so that a reader
/// that cannot resolve a delta onto its base (an older dtf, a script
/// checking `format`) refuses it instead of taking its tables, which hold
/// only the rows changed since the base, for whole ones.
pub const DELTA_FORMAT: &str = "dtf-1-delta";
/// Name of the text index in a checkpoint directory. Not `checkpoint`:
/// that name is TensorFlow's (`tf.train.latest_checkpoint` reads it), and
/// its entries must be checkpoints TensorFlow can load, which a
/// `.safetensors` file is not (issue 43).
pub const INDEX_FILE: &str = "checkpoint.dtf";
/// The index's name before dtf 0.43: still read where [`INDEX_FILE`] is
/// missing, and removed by the next save when it names a `.safetensors`
/// file (so that TensorFlow is no longer pointed at one).
pub const LEGACY_INDEX_FILE: &str = "checkpoint";
/// Name of the step tensor in the model file.
pub const GLOBAL_STEP: &str = "global_step";
/// Suffix of a shadow's tensor name in the EMA file (TensorFlow's naming).
pub const EMA_SUFFIX: &str = "/ExponentialMovingAverage";

const PREFIX: &str = "model.ckpt-";
const MODEL_EXT: &str = ".safetensors";
const EMA_EXT: &str = ".ema.safetensors";
/// The largest checkpoint file read when the model is not known (`dtf eval`,
/// `dtf inspect`): a bound on memory, far above any model dtf trains on one
/// machine. With the model known, the bound is its exact size (see
/// [`restore_latest`]).
pub const MAX_FILE_BYTES: u64 = 8 << 30;

/// Stand-ins for file names when [`from_bytes`] parses buffers that came from nowhere.
const MODEL_BYTES: &str = "<model bytes>";
const EMA_BYTES: &str = "<ema bytes>";

/// One training state: the step, every variable and every EMA shadow.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The step the variables were read at.
    pub global_step: u64,
    /// Every variable, in model order, f32.
    pub variables: Vec<(String, ArrayD<f32>)>,
    /// EMA shadows keyed by the *variable's* name (on disk:
    /// `<var>/ExponentialMovingAverage`), in the same order as `variables`.
    pub shadows: Vec<(String, ArrayD<f32>)>,
    /// The optimizer of the run and its slots.
    pub slots: Slots,
    /// The run the state belongs to: the chief's run id, which the ps
    /// tasks write in their snapshots too (a snapshot of another run is not
    /// taken). 0: unknown (a checkpoint written before run ids).
    pub run: u64,
    /// Each ps task's own update count when the variables were read (ps 0's
    /// is `global_step`). In async mode a shard that once lost steps to a
    /// restore counts behind ps 0 for good, so "is a shard's snapshot newer
    /// than this checkpoint" compares the snapshot's step with that shard's
    /// entry here, never with `global_step` ([`Checkpoint::shard_step`]).
    /// Empty: unknown (a checkpoint written before shard steps were kept).
    pub shard_steps: Vec<u64>,
    /// Every embedding table, whole (the rows of every ps merged, sorted by
    /// id), in the model's order; each row's EMA shadow and its slots of
    /// `slots.optimizer` with it. Empty for the MLP. On disk: `NAME/ids`
    /// (I64), `NAME/values` and `NAME/<slot>` (F32, rows × dim) in the model
    /// file, `NAME/ExponentialMovingAverage` in the EMA file (docs/design.md,
    /// "Sparse variables").
    pub tables: Vec<(String, crate::model::table::Rows)>,
    /// The update rule of each table whose rule is its own
    /// (`[model.tables] optimizer`), which names its slots; a table not
    /// listed (every table of a checkpoint from before table optimizers)
    /// follows `slots.optimizer` ([`Checkpoint::table_optimizer`]). On disk:
    /// the metadata's `table_optimizers`, absent when empty.
    pub table_optimizers: Vec<(String, crate::optimizer::TableOptimizer)>,
    /// The chain this checkpoint belongs to (`checkpoint.full_every` > 1:
    /// a whole checkpoint, then deltas holding only the table rows changed
    /// since it); `None`: a checkpoint on its own.
    pub increment: Option<Increment>,
}

/// A checkpoint's place in a chain of incremental checkpoints
/// (docs/design.md, "Incremental checkpoints"): the chain's whole
/// checkpoint, its base, then deltas, each holding the dense state whole
/// and of every table only the rows changed since the base — the base and
/// any one delta make the state. On disk: the metadata's `chain` (16 hex
/// digits) on every file of the chain; a delta's `format` is
/// `dtf-1-delta`, its `base` the base's step, and `NAME/removed` (I64)
/// beside each table's rows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Increment {
    /// The chain's id, random: a delta applies only to the base with its id.
    pub chain: u64,
    /// `None`: this is the chain's base, whole. `Some(step)`: a delta on
    /// the base at `step`; its `tables` hold the rows created or updated
    /// since the base, and `removed` the ids dropped since.
    pub base: Option<u64>,
    /// A delta's ids dropped since the base, per table in `tables`' order
    /// (sorted, none of them among that table's rows); empty for a base,
    /// and once a delta is resolved onto its base ([`load`]).
    ///
    /// So a delta as [`from_bytes`] returns it (unresolved: `removed` has
    /// one list per table) and one [`load`] resolved (`removed` empty,
    /// `tables` whole) differ here; only the former may be saved as a delta.
    pub removed: Vec<Vec<u64>>,
}

impl Increment {
    /// A delta's base step when this is a delta not yet resolved onto its
    /// base (its tables hold only the rows changed since it).
    pub fn unresolved_base(&self) -> Option<u64> {
        self.base.filter(|_| !self.removed.is_empty())
    }
}

/// Table `name`'s rule among `own`, else `optimizer`'s sparse form.
pub(crate) fn table_rule(
    own: &[(String, crate::optimizer::TableOptimizer)],
    optimizer: Optimizer,
    name: &str,
) -> Option<crate::optimizer::TableOptimizer> {
    match own.iter().find(|(n, _)| n == name) {
        Some((_, o)) => Some(*o),
        None => crate::optimizer::TableOptimizer::from_dense(optimizer),
    }
}

impl Checkpoint {
    /// Table `name`'s update rule as saved: its own, else the sparse form of
    /// the run's optimizer; `None` when neither names one (no slots).
    pub fn table_optimizer(&self, name: &str) -> Option<crate::optimizer::TableOptimizer> {
        table_rule(&self.table_optimizers, self.slots.optimizer, name)
    }

    /// Ps task `task`'s own update count in this checkpoint, for a cluster
    /// of `ps_tasks`: its recorded count when the checkpoint was written by
    /// a cluster of that many ps tasks, else `global_step` (an older
    /// checkpoint, or another placement, where only that is known).
    pub fn shard_step(&self, task: usize, ps_tasks: usize) -> u64 {
        match self.shard_steps.get(task) {
            Some(&step) if self.shard_steps.len() == ps_tasks => step,
            _ => self.global_step,
        }
    }
}

/// The optimizer state a checkpoint carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Slots {
    /// The optimizer, with the hyperparameters of the run that saved it.
    pub optimizer: Optimizer,
    /// Its slots and non-slot scalars under TensorFlow's names, in
    /// [`Optimizer::slot_specs`] order for `variables`.
    pub tensors: Vec<(String, ArrayD<f32>)>,
}

impl Default for Slots {
    /// Plain SGD: no slots.
    fn default() -> Self {
        Slots {
            optimizer: Optimizer::Sgd,
            tensors: Vec::new(),
        }
    }
}

/// What went wrong with a checkpoint; every variant names the file or directory.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file system operation failed (missing file, ENOSPC, EACCES, ...).
    #[error("checkpoint {path}: cannot {action}: {source}")]
    Io {
        /// The file or directory acted on.
        path: PathBuf,
        /// What was being done, e.g. "write", "rename into place".
        action: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// The bytes are not a safetensors file (truncated, garbage header, bad offsets).
    #[error(
        "checkpoint {path}: not a readable safetensors file ({source}); \
         expected a complete file written by dtf (truncated or corrupted?)"
    )]
    Safetensors {
        /// The file that failed to parse.
        path: PathBuf,
        /// The parser's complaint.
        source: SafeTensorError,
    },
    /// The file is a safetensors file, but not a valid dtf checkpoint or not
    /// one of this model; `problem` says what was found and what was expected.
    #[error("checkpoint {path}: {problem}")]
    Invalid {
        /// The offending file.
        path: PathBuf,
        /// What is wrong and what would be right.
        problem: String,
    },
    /// A checkpoint path is something other than a regular file: reading a
    /// FIFO blocks forever, and a device (`/dev/zero`) never ends.
    #[error(
        "checkpoint {path}: is {what}, not a regular file; only regular files \
         are read as checkpoints (move it out of the checkpoint directory)"
    )]
    NotRegular {
        /// The path, as given or found in the directory.
        path: PathBuf,
        /// What it is instead, e.g. "a FIFO".
        what: &'static str,
    },
    /// A file is larger than a checkpoint file can be here.
    #[error("checkpoint {path}: is {size} bytes, more than the {limit} bytes {allowed}")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The most it may be.
        limit: u64,
        /// What may be that large, and why, for the message.
        allowed: &'static str,
    },
    /// A file's safetensors header is larger than dtf ever writes; refused
    /// before parsing, which would cost seconds and gigabytes.
    #[error(
        "checkpoint {path}: its header claims {bytes} bytes, more than the \
         {MAX_HEADER_BYTES} a dtf checkpoint's header may have (not a dtf \
         checkpoint, or corrupted)"
    )]
    HeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// The header length its first 8 bytes claim.
        bytes: u64,
    },
    /// A path that should name a model checkpoint file does not.
    #[error(
        "checkpoint {path}: not a checkpoint file name; expected \
         `model.ckpt-<step>.safetensors` (its EMA sibling is found from it)"
    )]
    BadFileName {
        /// The path given.
        path: PathBuf,
    },
    /// A directory holds no checkpoint at all.
    #[error("checkpoint directory {path}: no `model.ckpt-<step>.safetensors` file in it")]
    NotFound {
        /// The directory searched.
        path: PathBuf,
    },
    /// A directory holds checkpoints but none of them verifies.
    #[error(
        "checkpoint directory {path}: none of its {count} checkpoints verifies \
         (newest: {newest}); fix the configuration to match them, or move them \
         away to start afresh"
    )]
    NoneValid {
        /// The directory searched.
        path: PathBuf,
        /// How many candidates were tried.
        count: usize,
        /// Why the newest was rejected.
        newest: Box<CheckpointError>,
    },
}

impl CheckpointError {
    pub(crate) fn io(path: &Path, action: &'static str, source: io::Error) -> Self {
        CheckpointError::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    }

    pub(crate) fn invalid(path: &Path, problem: impl Into<String>) -> Self {
        CheckpointError::Invalid {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}

impl From<crate::files::WriteError> for CheckpointError {
    fn from(e: crate::files::WriteError) -> Self {
        CheckpointError::Io {
            path: e.path,
            action: e.action,
            source: e.source,
        }
    }
}

/// The EMA file beside the model file `path` (`<x>.safetensors` →
/// `<x>.ema.safetensors`); `path` itself if it is not named like a model file.
pub(crate) fn ema_path(path: &Path) -> PathBuf {
    restore::ema_sibling(path).map_or_else(|_| path.to_path_buf(), |(ema, _)| ema)
}

/// The highest step a model file in `dir` is named with, reading no file:
/// a cheap look before [`restore_latest`] loads one. `None` when `dir`
/// holds none or cannot be listed.
pub fn newest_named_step(dir: &Path) -> Option<u64> {
    layout::scan_steps(dir).ok()?.model.into_iter().max()
}

pub(crate) fn model_file_name(step: u64) -> String {
    format!("{PREFIX}{step}{MODEL_EXT}")
}

pub(crate) fn ema_file_name(step: u64) -> String {
    format!("{PREFIX}{step}{EMA_EXT}")
}

/// The step in a canonical `model.ckpt-<step>.safetensors` name (no sign, no
/// leading zeros, so one step has one name); `None` for anything else,
/// including EMA files and temp files.
pub fn parse_model_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(MODEL_EXT)?;
    parse_step(digits)
}

pub(crate) fn parse_ema_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(EMA_EXT)?;
    parse_step(digits)
}

pub(crate) fn parse_step(digits: &str) -> Option<u64> {
    let n: u64 = digits.parse().ok()?;
    (digits.bytes().all(|b| b.is_ascii_digit()) && n.to_string() == digits).then_some(n)
}

#[cfg(test)]
mod fixtures {
    //! What the tests of every part of the checkpoint module share: sample
    //! checkpoints whose values depend on where they sit, and ways to damage one.
    use super::format::encode;
    use super::*;
    use crate::model::VarSpec;
    use ndarray::IxDyn;
    use std::fs;

    /// The variables of an MLP with these widths, built by hand (model.rs's
    /// own `variables()` is not under test here).
    pub(super) fn specs(layers: &[usize]) -> Vec<VarSpec> {
        let mut out = Vec::new();
        for (i, w) in layers.windows(2).enumerate() {
            out.push(VarSpec {
                name: format!("layer{}/weights", i + 1),
                shape: vec![w[0], w[1]],
            });
            out.push(VarSpec {
                name: format!("layer{}/biases", i + 1),
                shape: vec![w[1]],
            });
        }
        out
    }

    pub(super) const SMALL: [usize; 3] = [4, 3, 2];

    /// A checkpoint whose every value depends on the step, the variable and
    /// the position, so a mix-up of any of them shows.
    pub(super) fn sample(step: u64, layers: &[usize]) -> Checkpoint {
        let make = |k: usize, s: &VarSpec, offset: f32| {
            let n: usize = s.shape.iter().product();
            let v = (0..n)
                .map(|i| step as f32 + k as f32 * 0.25 + i as f32 * 1e-3 + offset)
                .collect();
            ArrayD::from_shape_vec(IxDyn(&s.shape), v).unwrap()
        };
        let specs = specs(layers);
        Checkpoint {
            global_step: step,
            variables: specs
                .iter()
                .enumerate()
                .map(|(k, s)| (s.name.clone(), make(k, s, 0.0)))
                .collect(),
            shadows: specs
                .iter()
                .enumerate()
                .map(|(k, s)| (s.name.clone(), make(k, s, -0.5)))
                .collect(),
            slots: Slots::default(),
            run: 0,
            shard_steps: Vec::new(),
            table_optimizers: Vec::new(),
            increment: None,
            tables: Vec::new(),
        }
    }

    pub(super) const ADAM: crate::optimizer::Optimizer = crate::optimizer::Optimizer::Adam {
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
    };

    /// [`sample`] with Adam's slots, each value telling where it sits.
    pub(super) fn sample_with_adam(step: u64, layers: &[usize]) -> Checkpoint {
        let mut c = sample(step, layers);
        let slots = ADAM.slot_specs(&specs(layers));
        c.slots = Slots {
            optimizer: ADAM,
            tensors: slots
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let n: usize = s.shape.iter().product();
                    let v = (0..n)
                        .map(|i| 0.5 / (k + 2) as f32 + i as f32 * 1e-4)
                        .collect();
                    (
                        s.name.clone(),
                        ArrayD::from_shape_vec(IxDyn(&s.shape), v).unwrap(),
                    )
                })
                .collect(),
        };
        c
    }

    pub(super) const ADAGRAD: crate::optimizer::Optimizer = crate::optimizer::Optimizer::Adagrad {
        initial_accumulator_value: 0.1,
    };

    /// [`sample`] trained with Adagrad (its tables then have one slot).
    pub(super) fn sample_with_adagrad(step: u64) -> Checkpoint {
        let mut c = sample(step, &SMALL);
        let specs = ADAGRAD.slot_specs(&small_specs());
        c.slots = Slots {
            optimizer: ADAGRAD,
            tensors: specs
                .iter()
                .map(|s| (s.name.clone(), ArrayD::from_elem(IxDyn(&s.shape), 0.25)))
                .collect(),
        };
        c
    }

    /// A table's rows of `dim` with Adagrad's slot, each row's values
    /// telling its id and its `version` (a row updated since has another).
    pub(super) fn rows_of(rows: &[(u64, u32)], dim: usize) -> crate::model::table::Rows {
        let mut out = crate::model::table::Rows {
            slots: vec![Vec::new()],
            ..Default::default()
        };
        for &(id, version) in rows {
            let v: Vec<f32> = (0..dim)
                .map(|k| id as f32 + version as f32 * 0.5 + k as f32 * 0.01)
                .collect();
            out.ids.push(id);
            out.shadows.extend(v.iter().map(|x| x * 0.9));
            out.slots[0].extend(v.iter().map(|x| 0.1 + x * x));
            out.values.extend(v);
        }
        out
    }

    /// The chain of the incremental checkpoints' tests.
    pub(super) const CHAIN: u64 = 0x5eed_0000_0000_00c4;

    /// A chain's base at `step`: two tables, `deep/embeddings` (3 wide) and
    /// `wide/weights` (1 wide).
    pub(super) fn chain_base(step: u64) -> Checkpoint {
        let mut c = tabled(
            step,
            &[(1, 0), (2, 0), (3, 0), (5, 0), (8, 0)],
            &[(1, 0), (4, 0)],
        );
        c.increment = Some(Increment {
            chain: CHAIN,
            base: None,
            removed: Vec::new(),
        });
        c
    }

    /// The whole state at `step`, later than [`chain_base`]'s: of
    /// `deep/embeddings` id 2 removed, 3 updated, 7 new, 5 removed and
    /// created again (other values), 1 and 8 as they were; of
    /// `wide/weights` 4 removed and 9 new.
    pub(super) fn chain_full(step: u64) -> Checkpoint {
        tabled(
            step,
            &[(1, 0), (3, 1), (5, 2), (7, 1), (8, 0)],
            &[(1, 0), (9, 1)],
        )
    }

    fn tabled(step: u64, deep: &[(u64, u32)], wide: &[(u64, u32)]) -> Checkpoint {
        let mut c = sample_with_adagrad(step);
        c.tables = vec![
            ("deep/embeddings".into(), rows_of(deep, 3)),
            ("wide/weights".into(), rows_of(wide, 1)),
        ];
        c
    }

    /// The delta of `full` on `base` (both whole): `full`'s dense state,
    /// of each table the rows of `full` that `base` lacks or holds
    /// otherwise, and the ids of `base` gone from `full`.
    pub(super) fn delta_of(base: &Checkpoint, full: &Checkpoint) -> Checkpoint {
        let chain = base.increment.as_ref().map_or(0, |i| i.chain);
        let mut removed = Vec::new();
        let mut tables = Vec::new();
        for ((name, old), (_, new)) in base.tables.iter().zip(&full.tables) {
            let mut changed = crate::model::table::Rows {
                slots: vec![Vec::new(); new.slots.len()],
                ..Default::default()
            };
            for (i, id) in new.ids.iter().enumerate() {
                let row = new.slice(i..i + 1);
                let was = old
                    .ids
                    .iter()
                    .position(|o| o == id)
                    .map(|j| old.slice(j..j + 1));
                if was.as_ref() != Some(&row) {
                    changed.append(row).unwrap();
                }
            }
            tables.push((name.clone(), changed));
            removed.push(
                old.ids
                    .iter()
                    .copied()
                    .filter(|id| !new.ids.contains(id))
                    .collect(),
            );
        }
        Checkpoint {
            tables,
            increment: Some(Increment {
                chain,
                base: Some(base.global_step),
                removed,
            }),
            ..full.clone()
        }
    }

    /// What [`load`] makes of `delta_of(base, full)`: `full`, in its chain.
    pub(super) fn resolved_full(full: &Checkpoint, base: u64) -> Checkpoint {
        Checkpoint {
            increment: Some(Increment {
                chain: CHAIN,
                base: Some(base),
                removed: Vec::new(),
            }),
            ..full.clone()
        }
    }

    /// Writes `ckpt`'s two files into `dir` as they are, unchecked (no
    /// saver: a damaged chain).
    pub(super) fn write_unchecked(dir: &Path, ckpt: &Checkpoint) {
        let (m, e) = encode(ckpt).unwrap();
        fs::write(dir.join(model_file_name(ckpt.global_step)), m).unwrap();
        fs::write(dir.join(ema_file_name(ckpt.global_step)), e).unwrap();
    }

    pub(super) fn small_specs() -> Vec<VarSpec> {
        specs(&SMALL)
    }

    /// A saver keeping 5 in `dir`, after it saved the [`sample`] of each of `steps`.
    pub(super) fn saved(dir: &Path, steps: &[u64]) -> Saver {
        let s = saver(dir, 5);
        for &step in steps {
            s.save(&sample(step, &SMALL)).unwrap();
        }
        s
    }

    pub(super) fn saver(dir: &Path, keep: usize) -> Saver {
        Saver::new(dir, keep).unwrap()
    }

    pub(super) fn names_in(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    /// Ways to damage the step-200 checkpoint of a directory that also holds a
    /// good step-100 one.
    #[derive(Debug, Clone, Copy)]
    pub(super) enum Damage {
        Truncated,
        GarbageHeader,
        WrongShape,
        MissingEma,
        NonFinite,
        BitFlipInData,
        EmaOfOtherStep,
    }

    pub(super) fn damage(dir: &Path, how: Damage) {
        let model = dir.join("model.ckpt-200.safetensors");
        let ema = dir.join("model.ckpt-200.ema.safetensors");
        match how {
            Damage::Truncated => {
                let bytes = fs::read(&model).unwrap();
                fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
            }
            Damage::GarbageHeader => {
                let mut bytes = fs::read(&model).unwrap();
                bytes[8..40].fill(b'#');
                fs::write(&model, bytes).unwrap();
            }
            Damage::WrongShape => {
                let (m, e) = encode(&sample(200, &[4, 5, 2])).unwrap();
                fs::write(&model, m).unwrap();
                fs::write(&ema, e).unwrap();
            }
            Damage::MissingEma => fs::remove_file(&ema).unwrap(),
            Damage::NonFinite => {
                let mut c = sample(200, &SMALL);
                c.variables[1].1[[2]] = f32::NAN;
                let (m, e) = encode(&c).unwrap();
                fs::write(&model, m).unwrap();
                fs::write(&ema, e).unwrap();
            }
            Damage::BitFlipInData => {
                let mut bytes = fs::read(&ema).unwrap();
                let at = bytes.len() - 3;
                bytes[at] ^= 0x10;
                fs::write(&ema, bytes).unwrap();
            }
            Damage::EmaOfOtherStep => {
                let (_, e) = encode(&sample(100, &SMALL)).unwrap();
                fs::write(&ema, e).unwrap();
            }
        }
    }
}
