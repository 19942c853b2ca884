//! What the ps's calls carry, in dtf's own types. The ps's two adapters
//! (`ps/grpc.rs`, `ps/shm.rs`) turn each request into these once, hand them
//! to `PsService`, and turn its answer back; the service never sees the
//! wire's types. Tensors travel beside these as [`TensorView`]s (borrowed
//! from the request or the shared region) or [`Tensor`]s (copied out of
//! the shard under its lock, put on the wire after it is released).

use super::pb;
use super::proto::{TensorError, TensorView, view};
use bytes::Bytes;
use ndarray::ArrayD;

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

impl From<&pb::PushRequest> for Push {
    fn from(r: &pb::PushRequest) -> Self {
        Self {
            worker: r.worker,
            worker_incarnation: r.worker_incarnation,
            incarnation: r.incarnation,
            step: r.step,
            learning_rate: r.learning_rate,
            loss: r.loss,
            pull: r.pull,
        }
    }
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

impl Pushed {
    /// The wire's answer, with `variables` and (onebit) the `replica`
    /// version they update.
    pub fn into_pb(self, variables: Vec<pb::Tensor>, replica: u64) -> pb::PushResponse {
        pb::PushResponse {
            variables,
            global_step: self.global_step,
            incarnation: self.incarnation,
            complete: self.complete,
            stale: self.stale,
            replica,
            membership_epoch: self.membership_epoch,
        }
    }
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

impl Pulled {
    /// The wire's answer with its (variables, shadows, slots).
    pub fn into_pb(
        self,
        (variables, shadows, slots): (Vec<pb::Tensor>, Vec<pb::Tensor>, Vec<pb::Tensor>),
    ) -> pb::PullResponse {
        pb::PullResponse {
            variables,
            shadows,
            slots,
            global_step: self.global_step,
            incarnation: self.incarnation,
            complete: self.complete,
            membership_epoch: self.membership_epoch,
            run: self.run,
        }
    }
}

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
}

impl<'a> TryFrom<&'a pb::InitializeRequest> for Initialize<'a> {
    type Error = TensorError;

    fn try_from(r: &'a pb::InitializeRequest) -> Result<Self, TensorError> {
        let views = |ts: &'a [pb::Tensor]| ts.iter().map(view).collect::<Result<Vec<_>, _>>();
        Ok(Self {
            variables: views(&r.variables)?,
            shadows: views(&r.shadows)?,
            slots: views(&r.slots)?,
            global_step: r.global_step,
            force: r.force,
            run: r.run,
            adopt: r.adopt,
            snapshot_step: r.snapshot_step,
        })
    }
}

/// What `Initialize` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Initialized {
    /// The shard took the values (false: it was initialized already).
    pub applied: bool,
    /// This ps process.
    pub incarnation: u64,
}

impl From<Initialized> for pb::InitializeResponse {
    fn from(i: Initialized) -> Self {
        Self {
            applied: i.applied,
            incarnation: i.incarnation,
        }
    }
}

/// The chief's `Complete`: the run is complete, or (`reshard`) its
/// re-shard checkpoint is written.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Complete {
    /// The step the chief saw last.
    pub global_step: u64,
    /// The re-shard checkpoint is written (not the end of the run).
    pub reshard: bool,
}

impl From<&pb::CompleteRequest> for Complete {
    fn from(r: &pb::CompleteRequest) -> Self {
        Self {
            global_step: r.global_step,
            reshard: r.reshard,
        }
    }
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
    pub fn copy(name: &str, array: &ArrayD<f32>) -> Self {
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

impl From<Tensor> for pb::Tensor {
    fn from(t: Tensor) -> Self {
        pb::Tensor {
            name: t.name,
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            dtype: pb::DataType::F32 as i32,
            data: t.data,
        }
    }
}

/// Each of `tensors` for the wire (moves; no copy of the values).
pub fn to_pb(tensors: Vec<Tensor>) -> Vec<pb::Tensor> {
    tensors.into_iter().map(pb::Tensor::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copied_tensor_is_its_array_in_logical_order_as_the_wire_has_it() {
        let a =
            ArrayD::from_shape_vec(vec![2, 3], (0..6).map(|x| x as f32 * 0.5).collect()).unwrap();
        let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let t = pb::Tensor::from(Tensor::copy("w", &a));
        assert_eq!((t.name.as_str(), t.shape.as_slice()), ("w", &[2u64, 3][..]));
        assert_eq!(t.dtype, pb::DataType::F32 as i32);
        assert_eq!(t.data.as_ref(), le(&[0.0, 0.5, 1.0, 1.5, 2.0, 2.5]));
        // Not in standard layout (transposed): copied in logical order.
        let t = Tensor::copy("t", &a.reversed_axes());
        assert_eq!(t.shape, [3, 2]);
        assert_eq!(t.data.as_ref(), le(&[0.0, 1.5, 0.5, 2.0, 1.0, 2.5]));
    }

    #[test]
    fn an_initialize_with_a_bad_tensor_is_refused_whole() {
        let mut r = pb::InitializeRequest {
            variables: vec![Tensor::copy("w", &ArrayD::zeros(vec![2])).into()],
            global_step: 5,
            ..Default::default()
        };
        assert_eq!(Initialize::try_from(&r).unwrap().variables.len(), 1);
        r.variables[0].data.truncate(3);
        assert!(Initialize::try_from(&r).is_err());
    }
}
