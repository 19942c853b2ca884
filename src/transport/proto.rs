//! The edge between generated proto types and domain types: tensors travel as
//! raw little-endian bytes; shape, dtype and length are validated here, once.

mod rows;

pub use rows::RowsError;

use super::call::{Complete, Initialize, Initialized, Pulled, Push, Pushed, Tensor, TensorView};
use crate::transport::pb;
use bytes::{BufMut, Bytes};
use ndarray::{ArrayBase, Data, DataMut, IxDyn};
use std::fmt;
use std::marker::PhantomData;
use tonic::codec::{BufferSettings, DecodeBuf, Decoder, EncodeBuf, Encoder};

// Tensors go on the wire as the in-memory f32 bytes: only right on little-endian hosts.
#[cfg(not(target_endian = "little"))]
compile_error!("dtf's wire format assumes a little-endian host");

/// A tensor that arrived malformed.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    /// Only f32 tensors travel between tasks.
    #[error("tensor {}: dtype {dtype}, expected DATA_TYPE_F32", Short(name))]
    DType { name: String, dtype: i32 },
    /// The byte count does not match the shape.
    #[error(
        "tensor {}: shape {} needs {expected} bytes, got {got}",
        Short(name),
        Dims(shape)
    )]
    Length {
        name: String,
        shape: Vec<u64>,
        expected: usize,
        got: usize,
    },
    /// A dimension too large for this host.
    #[error("tensor {}: shape {} is too large", Short(name), Dims(shape))]
    TooLarge { name: String, shape: Vec<u64> },
    /// A table's rows (`Initialize`'s tables).
    #[error(transparent)]
    Rows(#[from] rows::RowsError),
}

impl From<TensorError> for tonic::Status {
    fn from(e: TensorError) -> Self {
        status(tonic::Code::InvalidArgument, e)
    }
}

/// Longest status message a task sends. A status travels in an HTTP/2
/// header: one echoing a 100,000-dimension shape or a megabyte name would
/// exceed the peer's header limit and reach it as a broken response instead.
pub const MAX_STATUS_MESSAGE: usize = 1024;

/// Dimensions shown of a shape in a message; the rest are counted.
const SHOWN_DIMS: usize = 8;

/// Characters shown of a name in a message.
const SHOWN_NAME: usize = 128;

/// A status as one line for people: the code in words, the message, then
/// whatever its causes add (a connection error's reason sits in the
/// transport error's chain, e.g. "Connection refused"), never the struct
/// dump that `Status`'s own `Display` gives.
pub fn explain(status: &tonic::Status) -> String {
    let mut code = String::new();
    for (i, c) in format!("{:?}", status.code()).chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            code.push(' ');
        }
        code.extend(c.to_lowercase());
    }
    let mut line = code;
    if !status.message().is_empty() {
        line.push_str(": ");
        line.push_str(status.message());
    }
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        let text = e.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = e.source();
    }
    line
}

/// The one place the ps makes a status: `message` cut to
/// [`MAX_STATUS_MESSAGE`] bytes (at a character boundary, saying so).
pub fn status(code: tonic::Code, message: impl fmt::Display) -> tonic::Status {
    let mut message = message.to_string();
    if message.len() > MAX_STATUS_MESSAGE {
        let tail = format!("… (cut from {} bytes)", message.len());
        let mut end = MAX_STATUS_MESSAGE - tail.len();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(&tail);
    }
    tonic::Status::new(code, message)
}

/// A shape for a message: `[784, 10]`, or `[1, 1, …, 100000 dims]` when long.
pub struct Dims<'a, T>(pub &'a [T]);

impl<T: fmt::Display> fmt::Display for Dims<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().take(SHOWN_DIMS).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        if self.0.len() > SHOWN_DIMS {
            write!(f, ", … {} dims", self.0.len())?;
        }
        f.write_str("]")
    }
}

/// A name for a message, cut (and then quoted) past [`SHOWN_NAME`] characters.
pub struct Short<'a>(pub &'a str);

impl fmt::Display for Short<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(SHOWN_NAME) {
            None => f.write_str(self.0),
            Some((end, _)) => write!(f, "{:?}… ({} bytes)", &self.0[..end], self.0.len()),
        }
    }
}

/// The gRPC codec of dtf's services: prost, except that a message that
/// does not parse is `INVALID_ARGUMENT` (the sender's fault; a worker treats
/// it as fatal) rather than prost's `INTERNAL`, and that a message is not
/// copied more often than tonic needs (see [`ExactEncoder`] and
/// [`CheckedDecoder`]). Named in `build.rs`.
pub struct Codec<T, U>(PhantomData<fn(T) -> U>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ExactEncoder<T>;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ExactEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder(tonic_prost::ProstDecoder::new(BufferSettings::new(
            0,
            YIELD_THRESHOLD,
        )))
    }
}

/// tonic's default yield threshold (it only batches streamed messages).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// prost's encoding into a buffer reserved for the whole message first.
/// tonic starts every call's buffer at 8 KiB and prost writes a tensor's
/// bytes into it in one piece: a 1.6 MB message grew the buffer by doubling,
/// copying what was written each time (docs/benchmarks.md, "Transports").
pub struct ExactEncoder<T>(PhantomData<fn(T)>);

impl<T: prost::Message> Encoder for ExactEncoder<T> {
    type Item = T;
    type Error = tonic::Status;

    fn encode(&mut self, item: T, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.reserve(item.encoded_len());
        item.encode(dst)
            .map_err(|e| status(tonic::Code::Internal, format_args!("encoding: {e}")))
    }
}

/// prost's decoder, with parse errors as `INVALID_ARGUMENT`, and a decode
/// buffer that starts empty: tonic then takes the first HTTP/2 DATA frame's
/// bytes as its buffer instead of copying them into one (`BytesMut::put`
/// into an empty buffer reuses the source's allocation when nothing else
/// holds it). With frames as large as a message (`tcp::frame`) a
/// push or pull arrives in one frame, and prost's `bytes` fields are slices
/// of the buffer (`copy_to_bytes` on a `BytesMut` does not copy). One copy
/// is left: tonic reserves a second message's room once the first is in the
/// buffer, and the reallocation moves it.
pub struct CheckedDecoder<U>(tonic_prost::ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, tonic::Status> {
        self.0.decode(buf).map_err(|e| {
            status(
                tonic::Code::InvalidArgument,
                format_args!("malformed protobuf message: {}", e.message()),
            )
        })
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.0.buffer_settings()
    }
}

/// A message with repeated tensor fields that [`chunked`] sends without
/// copying the tensors' bytes.
pub trait WithTensors: prost::Message + Sized {
    /// Takes the tensor fields out, each with its field number.
    fn take_tensors(&mut self) -> Vec<(u32, Vec<pb::Tensor>)>;
}

impl WithTensors for pb::PushRequest {
    fn take_tensors(&mut self) -> Vec<(u32, Vec<pb::Tensor>)> {
        vec![(1, std::mem::take(&mut self.gradients))]
    }
}

impl WithTensors for pb::PullRequest {
    fn take_tensors(&mut self) -> Vec<(u32, Vec<pb::Tensor>)> {
        Vec::new()
    }
}

impl WithTensors for pb::PushResponse {
    fn take_tensors(&mut self) -> Vec<(u32, Vec<pb::Tensor>)> {
        vec![(1, std::mem::take(&mut self.variables))]
    }
}

impl WithTensors for pb::PullResponse {
    fn take_tensors(&mut self) -> Vec<(u32, Vec<pb::Tensor>)> {
        vec![
            (1, std::mem::take(&mut self.variables)),
            (2, std::mem::take(&mut self.shadows)),
            (6, std::mem::take(&mut self.slots)),
        ]
    }
}

/// `msg` as a gRPC body's data: the 5-byte length prefix and every field
/// but the tensors' bytes encoded into small buffers, each tensor's bytes
/// its own chunk, sent as it is. tonic's encoder would copy every byte of
/// the message into one buffer first; this way the ps's snapshot is the
/// last copy before the kernel's (HTTP/2 writes the chunks with `writev`).
/// Returns the chunks and the message's length.
pub fn chunked<M: WithTensors>(mut msg: M) -> (Vec<Bytes>, usize) {
    use prost::Message;
    use prost::encoding::{WireType, encode_key, encode_varint};
    let len = msg.encoded_len();
    let mut chunks = Vec::new();
    let mut head = bytes::BytesMut::with_capacity(1024);
    head.put_u8(0);
    head.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    let tensors = msg.take_tensors();
    msg.encode_raw(&mut head);
    for (field, list) in tensors {
        for mut t in list {
            let data = std::mem::take(&mut t.data);
            let data_len = if data.is_empty() {
                0
            } else {
                prost::encoding::key_len(4)
                    + prost::encoding::encoded_len_varint(data.len() as u64)
                    + data.len()
            };
            encode_key(field, WireType::LengthDelimited, &mut head);
            encode_varint((t.encoded_len() + data_len) as u64, &mut head);
            t.encode_raw(&mut head);
            if !data.is_empty() {
                encode_key(4, WireType::LengthDelimited, &mut head);
                encode_varint(data.len() as u64, &mut head);
                chunks.push(head.split().freeze());
                chunks.push(data);
            }
        }
    }
    if !head.is_empty() {
        chunks.push(head.freeze());
    }
    (chunks, len)
}

/// Encodes an f32 array (one copy into the message's bytes).
pub fn encode<S: Data<Elem = f32>>(name: &str, array: &ArrayBase<S, IxDyn>) -> pb::Tensor {
    Tensor::copy(name, array).into()
}

/// The shape of a proto tensor, checked against its byte length and dtype.
///
/// Errors: [`TensorError`] when the dtype is not f32 or the length disagrees.
pub fn checked_shape(t: &pb::Tensor) -> Result<Vec<usize>, TensorError> {
    if t.dtype != pb::DataType::F32 as i32 {
        return Err(TensorError::DType {
            name: t.name.clone(),
            dtype: t.dtype,
        });
    }
    let too_large = || TensorError::TooLarge {
        name: t.name.clone(),
        shape: t.shape.clone(),
    };
    let shape: Vec<usize> = t
        .shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| too_large()))
        .collect::<Result<_, _>>()?;
    let expected = shape
        .iter()
        .try_fold(4usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(too_large)?;
    if expected != t.data.len() {
        return Err(TensorError::Length {
            name: t.name.clone(),
            shape: t.shape.clone(),
            expected,
            got: t.data.len(),
        });
    }
    Ok(shape)
}

/// Checks a proto tensor's dtype and length and views its bytes.
///
/// Errors: [`TensorError`] as [`checked_shape`].
pub fn view(t: &pb::Tensor) -> Result<TensorView<'_>, TensorError> {
    Ok(TensorView {
        name: &t.name,
        shape: checked_shape(t)?,
        data: &t.data,
    })
}

/// Makes glibc keep freed message-sized buffers instead of returning them
/// to the kernel after every RPC. Each push and pull allocates a few buffers
/// of the model's size (1.6 MB for the reference model); by default glibc
/// serves those with mmap or trims them off a thread arena's heap on free,
/// so every step page-faulted them in again: a third of the ps's CPU time
/// (docs/benchmarks.md). The cost is that freed buffers stay resident, a
/// few times the model's size. Called once by the ps and the worker; a no-op
/// elsewhere than glibc.
pub fn keep_freed_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // 32 MiB is glibc's largest mmap threshold on 64-bit hosts.
            // SAFETY: mallopt only sets allocator parameters; it is safe
            // to call at any time from any thread.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
                libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
            }
        });
    }
}

/// Decodes a proto tensor into a new array (the tests' reference for
/// [`decode_into`], which the ps and workers use).
#[cfg(test)]
fn decode(t: &pb::Tensor) -> Result<ndarray::ArrayD<f32>, TensorError> {
    let shape = checked_shape(t)?;
    let values: Vec<f32> = bytemuck::pod_collect_to_vec(&t.data);
    Ok(
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&shape), values)
            .expect("length checked above"),
    )
}

/// Decodes into an existing array of the same shape, without allocating.
///
/// Errors: [`TensorError`], or a length error when the shapes differ.
pub fn decode_into<S: DataMut<Elem = f32>>(
    t: &pb::Tensor,
    out: &mut ArrayBase<S, IxDyn>,
) -> Result<(), TensorError> {
    let shape = checked_shape(t)?;
    if shape != out.shape() {
        return Err(TensorError::Length {
            name: t.name.clone(),
            shape: t.shape.clone(),
            expected: out.len() * 4,
            got: t.data.len(),
        });
    }
    let dst = out
        .as_slice_mut()
        .expect("arrays built by dtf are contiguous");
    bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(&t.data);
    Ok(())
}

// What the ps's calls carry (`super::call`), to and from the wire.

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
            staged: r.staged,
            // Checked by the ps against its model.hidden and memory.
            layers: r
                .layers
                .iter()
                .map(|&w| usize::try_from(w).unwrap_or(usize::MAX))
                .collect(),
        })
    }
}

impl From<Initialized> for pb::InitializeResponse {
    fn from(i: Initialized) -> Self {
        Self {
            applied: i.applied,
            incarnation: i.incarnation,
        }
    }
}

impl From<&pb::CompleteRequest> for Complete {
    fn from(r: &pb::CompleteRequest) -> Self {
        Self {
            global_step: r.global_step,
            reshard: r.reshard,
            checkpointed: r.checkpointed,
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
    use ndarray::ArrayD;
    use prost::Message;

    #[test]
    fn explain_is_one_line_in_words() {
        let s = tonic::Status::new(tonic::Code::FailedPrecondition, "pull again");
        assert_eq!(explain(&s), "failed precondition: pull again");
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let s = tonic::Status::from_error(Box::new(io));
        let line = explain(&s);
        assert!(
            line.contains("Connection refused") && !line.contains("metadata"),
            "{line}"
        );
        assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
    }
    use ndarray::IxDyn;

    #[test]
    fn round_trip() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1., 2., 3., 4., 5., -6.]).unwrap();
        let t = encode("w", &a);
        assert_eq!(t.data.len(), 24);
        assert_eq!(decode(&t).unwrap(), a);
        let mut b = ArrayD::zeros(IxDyn(&[2, 3]));
        decode_into(&t, &mut b).unwrap();
        assert_eq!(b, a);
    }

    #[test]
    fn rejects_bad_length_and_dtype() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2]), vec![1., 2.]).unwrap();
        let mut t = encode("w", &a);
        t.shape = vec![3];
        assert!(matches!(decode(&t), Err(TensorError::Length { .. })));
        t.shape = vec![u64::MAX, 2];
        assert!(decode(&t).is_err());
        let mut t = encode("w", &a);
        t.dtype = pb::DataType::I64 as i32;
        assert!(matches!(decode(&t), Err(TensorError::DType { .. })));
        let mut b = ArrayD::zeros(IxDyn(&[3]));
        assert!(decode_into(&encode("w", &a), &mut b).is_err());
        let mut t = encode("w", &a);
        t.shape = vec![3];
        assert!(matches!(view(&t), Err(TensorError::Length { .. })));
    }

    #[test]
    fn status_messages_are_bounded() {
        let dims = vec![1u64; 100_000];
        let e = TensorError::Length {
            name: "w".repeat(100_000),
            shape: dims,
            expected: 4,
            got: 0,
        };
        let s = tonic::Status::from(e);
        assert!(
            s.message().len() <= MAX_STATUS_MESSAGE,
            "{}",
            s.message().len()
        );
        assert!(s.message().contains("100000 dims"), "{}", s.message());
        let s = status(tonic::Code::Internal, "é".repeat(5000));
        assert!(s.message().len() <= MAX_STATUS_MESSAGE);
        assert!(
            s.message().ends_with("(cut from 10000 bytes)"),
            "{}",
            s.message()
        );
        assert_eq!(Dims(&[784u64, 10]).to_string(), "[784, 10]");
    }

    #[test]
    fn chunked_is_the_same_message_with_the_tensors_in_place() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1., 2., 3., 4., 5., -6.]).unwrap();
        let b = ArrayD::from_shape_vec(IxDyn(&[0]), vec![]).unwrap();
        let msg = pb::PullResponse {
            variables: vec![encode("w", &a), encode("empty", &b)],
            shadows: vec![encode("w", &a)],
            global_step: 7,
            incarnation: 9,
            complete: true,
            slots: vec![encode("w/Momentum", &a)],
            membership_epoch: 2,
            run: 5,
        };
        let (chunks, len) = chunked(msg.clone());
        let wire: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        assert_eq!(wire[0], 0);
        assert_eq!(
            u32::from_be_bytes(wire[1..5].try_into().unwrap()) as usize,
            len
        );
        assert_eq!(wire.len(), 5 + len);
        assert_eq!(pb::PullResponse::decode(&wire[5..]).unwrap(), msg);
        // The tensors' bytes are sent from where they were, not copied.
        let data = &msg.variables[0].data;
        assert!(chunks.iter().any(|c| c.as_ptr() == data.as_ptr()));
        let push = pb::PushResponse {
            variables: vec![encode("w", &a)],
            global_step: 3,
            incarnation: 1,
            complete: false,
            stale: true,
            replica: 0,
            membership_epoch: 2,
        };
        let (chunks, len) = chunked(push.clone());
        let wire: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        assert_eq!(pb::PushResponse::decode(&wire[5..]).unwrap(), push);
        assert_eq!(wire.len(), 5 + len);
    }

    #[test]
    fn view_borrows_the_bytes() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.5f32, -2.0]).unwrap();
        let t = encode("w", &a);
        let v = view(&t).unwrap();
        assert_eq!((v.name, v.shape.as_slice()), ("w", &[2usize][..]));
        assert_eq!(v.data, bytemuck::cast_slice::<f32, u8>(&[1.5, -2.0]));
    }
}

#[cfg(test)]
mod call_tests {
    use super::*;
    use ndarray::ArrayD;

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
