//! What the ps's calls carry, in dtf's own types. The ps's two adapters
//! (`ps/grpc.rs`, `ps/shm.rs`) turn each request into these once (the
//! conversions live with the wire's, in `transport/proto.rs`), hand them to
//! `PsService`, and turn its answer back; the service never sees the wire's
//! types. Tensors travel beside these as [`TensorView`]s (borrowed from the
//! request or the shared region) or [`Tensor`]s (copied out of the shard
//! under its lock, put on the wire after it is released).

use bytes::Bytes;
use ndarray::{ArrayBase, Data, IxDyn};

/// A worker's push, apart from its gradients.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Push {
    /// The pushing worker's task index.
    pub worker: u32,
    /// Random per worker process: the membership fences an older one.
    pub worker_incarnation: u64,
    /// The ps incarnation the worker last heard (0: none yet); another
    /// one means the ps restarted since.
    pub incarnation: u64,
    /// The step the gradients were computed at.
    pub step: u64,
    /// The learning rate the worker's schedule gives for `step`.
    pub learning_rate: f32,
    /// The batch's loss, for `State`.
    pub loss: f32,
    /// Answer with the values after the update.
    pub pull: bool,
}

/// What a push answers, apart from the values it may carry.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pushed {
    /// The shard's step after the push.
    pub global_step: u64,
    /// This ps process.
    pub incarnation: u64,
    /// The run is complete.
    pub complete: bool,
    /// Sync: the gradient was for an older step, and dropped.
    pub stale: bool,
    /// The membership's epoch.
    pub membership_epoch: u64,
}

/// What a pull answers, apart from its tensors.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pulled {
    /// The shard's step the values are of.
    pub global_step: u64,
    /// This ps process.
    pub incarnation: u64,
    /// The run is complete.
    pub complete: bool,
    /// The membership's epoch.
    pub membership_epoch: u64,
    /// The run the shard belongs to (0: not initialized).
    pub run: u64,
}

/// A pull's tensors as the shard held them at one moment.
pub type Pulls = (Vec<Tensor>, Vec<Tensor>, Vec<Tensor>);

/// The chief's `Initialize`: values for the shard, or (`adopt`) its word
/// that the snapshot the ps holds aside is of its run.
#[derive(Debug, Clone, Default)]
pub struct Initialize<'a> {
    /// The shard's variables (checked: dtype, shape against length).
    pub variables: Vec<TensorView<'a>>,
    /// Their EMA shadows (empty: the values themselves).
    pub shadows: Vec<TensorView<'a>>,
    /// The optimizer's slots (empty: fresh ones).
    pub slots: Vec<TensorView<'a>>,
    /// The step the shard counts on from.
    pub global_step: u64,
    /// Replace a shard already initialized.
    pub force: bool,
    /// The run the values belong to.
    pub run: u64,
    /// Take the snapshot held aside instead of tensors.
    pub adopt: bool,
    /// With `adopt`: the step of that snapshot (0: `global_step`).
    pub snapshot_step: u64,
    /// The rows of every table this ps owns are those staged under this
    /// token ([`crate::ps::PsService::stage_rows`]); a table not staged
    /// starts empty. 0: none staged, every table empty (ignored with
    /// `adopt`: the snapshot has its own).
    pub staged: u64,
    /// The model's dense widths, input first, sent alone to a ps that
    /// waits for them ([`crate::transport::PsState::needs_widths`]); empty
    /// otherwise.
    pub layers: Vec<usize>,
}

/// What `Initialize` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Initialized {
    /// The shard took the values (false: it was initialized already).
    pub applied: bool,
    /// This ps process.
    pub incarnation: u64,
}

/// The chief's `Complete`: the run is complete, or (`reshard`) its
/// re-shard checkpoint is written.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Complete {
    /// The step the chief saw last.
    pub global_step: u64,
    /// The re-shard checkpoint is written (not the end of the run).
    pub reshard: bool,
    /// With `reshard`: that checkpoint holds this ps's state (read after it
    /// stopped taking pushes, and written).
    pub checkpointed: bool,
}

/// A named f32 tensor copied out of the shard: little-endian bytes, so
/// that the wire takes them without another copy.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// The variable's (or slot's) name.
    pub name: String,
    /// Its dimensions.
    pub shape: Vec<usize>,
    /// `4 · Π shape` bytes of little-endian f32.
    pub data: Bytes,
}

impl Tensor {
    /// Copies `array` (the one copy, made under the shard's lock).
    pub fn copy<S: Data<Elem = f32>>(name: &str, array: &ArrayBase<S, IxDyn>) -> Self {
        let data = match array.as_slice() {
            Some(s) => Bytes::copy_from_slice(bytemuck::cast_slice(s)),
            None => {
                let v: Vec<f32> = array.iter().copied().collect();
                Bytes::copy_from_slice(bytemuck::cast_slice(&v))
            }
        };
        Self {
            name: name.to_owned(),
            shape: array.shape().to_vec(),
            data,
        }
    }
}

/// A wire tensor checked but not copied: its values stay in the message's
/// bytes (little-endian f32, possibly unaligned). The ps applies gradients
/// straight from these, so a push materializes no array.
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    /// The variable's name.
    pub name: &'a str,
    /// Dimensions, checked against the byte length.
    pub shape: Vec<usize>,
    /// `4 · Π shape` bytes of little-endian f32.
    pub data: &'a [u8],
}

/// Rows of one embedding table as a pull or push carries them: `ids`, and
/// per id `dim` values (a pull's answer, a push's gradients) or none (a
/// pull's request).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableRows {
    /// The table's name.
    pub table: String,
    /// Row ids.
    pub ids: Vec<u64>,
    /// `ids.len() × dim` values, row-major.
    pub values: Vec<f32>,
}

/// A worker's push of rows, apart from them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PushRows {
    /// The pushing worker's task index.
    pub worker: u32,
    /// The step the gradients were computed at.
    pub step: u64,
    /// The learning rate the worker's schedule gives for `step`.
    pub learning_rate: f32,
}

/// What a push of rows answers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowsPushed {
    /// Sync: some table had passed the step; its rows were dropped.
    pub stale: bool,
    /// This ps process.
    pub incarnation: u64,
    /// The run is complete.
    pub complete: bool,
}

/// A whole table's rows on one ps, with shadows and slots: what snapshots
/// and checkpoints carry and `Initialize` restores.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableState {
    /// The table's name.
    pub table: String,
    /// Its rows.
    pub rows: crate::model::table::Rows,
}

/// A page of one table's rows on one ps ([`crate::ps::PsService::read_rows`]):
/// rows `start..` in the order the ps created them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowsPage {
    /// The rows, with shadows and slots.
    pub state: TableState,
    /// Rows the table holds now: the reader goes on until it has read them.
    pub total: u64,
    /// Which rows the row numbers refer to (changes when a restore replaces them).
    pub generation: u64,
    /// The ps process.
    pub incarnation: u64,
    /// Pages of a delta ([`Cut::Delta`]): whether this ps had one (false:
    /// no rows, the checkpoint must be whole).
    pub delta: bool,
    /// A delta's first page: the ids dropped since the chain's base, ascending.
    pub removed: Vec<u64>,
}

/// One table as the chief read it from every ps ([`Cut`]): its rows,
/// sorted by id, and for a delta the ids dropped since the chain's base
/// (sorted, none among the rows).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableRead {
    pub table: String,
    pub rows: crate::model::table::Rows,
    pub removed: Vec<u64>,
}

/// How `ReadRows` reads a table: plainly, as the base of the chief's chain
/// of incremental checkpoints, or as a delta of that chain
/// (`checkpoint.full_every`, docs/design.md "Incremental checkpoints").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Every row, nothing counted.
    Plain,
    /// Every row, the table's changes counted from the first page for chain `.0`.
    Base(u64),
    /// The rows changed since chain `.0`'s base, and the ids dropped since.
    Delta(u64),
}

impl Cut {
    /// From the wire's `chain` and `base`.
    pub fn of(chain: u64, base: bool) -> Self {
        match (chain, base) {
            (0, _) => Cut::Plain,
            (c, true) => Cut::Base(c),
            (c, false) => Cut::Delta(c),
        }
    }

    /// To the wire's `chain` and `base`.
    pub fn wire(self) -> (u64, bool) {
        match self {
            Cut::Plain => (0, false),
            Cut::Base(c) => (c, true),
            Cut::Delta(c) => (c, false),
        }
    }
}
