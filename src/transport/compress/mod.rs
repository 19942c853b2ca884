//! `cluster.compression`: how tensors cross a TCP link. Shared memory is
//! always exact; nothing outside [`crate::transport`] sees which was used.
//!
//! - `none`: f32, exact.
//! - `bf16`: gradients and values as bfloat16 both ways, rounded by the
//!   kernels' one conversion ([`crate::kernel::bf16::to_bf16`]: nearest even,
//!   a subnormal to a signed zero as the hardware's `vcvtne2ps2bf16` and
//!   TensorFlow's flush-to-zero threads make it: a value under 2^-126 moves
//!   no weight a visible amount); the ps decodes to f32 and its state stays f32.
//! - `onebit`: one bit per value plus two f32 scales per block of
//!   [`BLOCK`] values (the block's mean of its non-negative values and of its
//!   negative ones, as 1-bit SGD quantizes): 25.6× fewer bytes than f32.
//!   Error feedback both ways: the worker adds to each gradient what the
//!   previous ones lost to quantization (its residual, [`ClientWire`]); the
//!   ps keeps, per worker, the values that worker holds ([`PsWire`]) and
//!   answers a push with the change from them to its own values, quantized,
//!   so what a quantization leaves out is in the next change. The two copies
//!   agree because each answer names them (`replica`): a worker that lost an
//!   answer, pulled, or reached a restarted ps gets exact f32 values again.
//!
//! Both ends agree per call: a TCP client sends [`HEADER`] with its setting;
//! a ps with another refuses with `INVALID_ARGUMENT` naming the key. Not
//! reloadable: both ends of every link must change together, so it takes a
//! restart of every task, like `cluster.transport`.

mod bf16;
mod onebit;

pub use bf16::encode_bf16;
pub use onebit::{BLOCK, encode_onebit, onebit_len};

use crate::config::Compression;
use crate::transport::pb;
use bytes::Bytes;
use ndarray::{ArrayBase, Data, DataMut, IxDyn};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use tonic::Status;
use tonic::metadata::MetadataMap;

/// The request header that carries the caller's `cluster.compression`
/// (absent: `none`, as every client before it).
pub const HEADER: &str = "dtf-compression";

/// The key's value, as the config file spells it.
pub fn name(c: Compression) -> &'static str {
    match c {
        Compression::None => "none",
        Compression::Bf16 => "bf16",
        Compression::Onebit => "onebit",
    }
}

/// A wire tensor of dtype `dtype` holding `data`.
fn tensor(name: &str, shape: &[usize], dtype: pb::DataType, data: Vec<u8>) -> pb::Tensor {
    pb::Tensor {
        name: name.to_owned(),
        shape: shape.iter().map(|&d| d as u64).collect(),
        dtype: dtype as i32,
        data: Bytes::from(data),
    }
}

/// A tensor's dtype and length, checked against its shape: the number of values.
///
/// Errors: `INVALID_ARGUMENT` for an unknown dtype or a length its shape does not give.
fn checked_len(t: &pb::Tensor) -> Result<usize, Status> {
    let bad = |why: String| {
        super::proto::status(
            tonic::Code::InvalidArgument,
            format_args!("tensor {}: {why}", super::proto::Short(&t.name)),
        )
    };
    let n = t
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| {
            usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
        })
        .filter(|&n| n <= usize::MAX / 4)
        .ok_or_else(|| bad("shape too large".into()))?;
    let want = match pb::DataType::try_from(t.dtype) {
        Ok(pb::DataType::F32) => 4 * n,
        Ok(pb::DataType::Bf16) => 2 * n,
        Ok(pb::DataType::Onebit) => onebit_len(n),
        _ => {
            return Err(bad(format!(
                "dtype {} is not a compression dtf sends",
                t.dtype
            )));
        }
    };
    if t.data.len() != want {
        return Err(bad(format!(
            "{} values need {want} bytes as {:?}, got {}",
            n,
            t.dtype(),
            t.data.len()
        )));
    }
    Ok(n)
}

/// The dtype a tensor of `compression` travels as.
fn dtype_of(c: Compression) -> pb::DataType {
    match c {
        Compression::None => pb::DataType::F32,
        Compression::Bf16 => pb::DataType::Bf16,
        Compression::Onebit => pb::DataType::Onebit,
    }
}

/// The status for a peer whose setting differs from this task's.
fn mismatch(here: Compression, there: &str, who: &str) -> Status {
    Status::invalid_argument(format!(
        "cluster.compression differs: {who} uses {:?}, the other end {there:?}; set the same cluster.compression on every task and restart them",
        name(here)
    ))
}

/// The ps's end of its TCP links: the setting, and (onebit) the values
/// each worker holds.
#[derive(Debug)]
pub struct PsWire {
    /// This ps's `cluster.compression`.
    compression: Compression,
    /// onebit: per worker, the values it holds ([`Replica`]).
    replicas: Mutex<HashMap<u32, Replica>>,
    /// At most this many workers' copies are kept (each one shard's size);
    /// a worker past it gets exact values, as after a restart.
    capacity: usize,
    /// The next replica's name: random start, so a restarted ps never
    /// takes an answer of its predecessor's for one of its own.
    next: AtomicU64,
}

/// What one worker holds of the shard (onebit): the name of the answer
/// that gave it, and the values (shard order), exactly as the worker has them.
#[derive(Debug)]
struct Replica {
    /// The `PushResponse.replica` that made these the worker's values.
    name: u64,
    /// Per variable, the worker's values.
    values: Vec<Vec<f32>>,
}

impl PsWire {
    /// The ps's end for `compression`, keeping at most `2 · workers + 8` copies.
    pub fn new(compression: Compression, workers: usize) -> Self {
        Self {
            compression,
            replicas: Mutex::new(HashMap::new()),
            capacity: 2 * workers + 8,
            next: AtomicU64::new(rand::random::<u64>() >> 2 | 1),
        }
    }

    /// The setting, for `State` and metrics.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Checks the caller's [`HEADER`] against this ps's setting.
    ///
    /// Errors: `INVALID_ARGUMENT` naming `cluster.compression`.
    pub fn agree(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let there = metadata
            .get(HEADER)
            .map_or(Ok("none"), |v| v.to_str())
            .unwrap_or("(not text)");
        if there == name(self.compression) {
            Ok(())
        } else {
            Err(mismatch(self.compression, there, "this ps"))
        }
    }

    /// A push's gradients as f32, decoded (`None`: they are f32 already,
    /// to be read where they are).
    ///
    /// Errors: `INVALID_ARGUMENT` for a tensor in another compression or of a bad length.
    pub fn gradients(&self, tensors: &[pb::Tensor]) -> Result<Option<Vec<Vec<f32>>>, Status> {
        if self.compression == Compression::None {
            return Ok(None);
        }
        let want = dtype_of(self.compression);
        tensors
            .iter()
            .map(|t| {
                let n = checked_len(t)?;
                if t.dtype != want as i32 {
                    return Err(mismatch(
                        self.compression,
                        t.dtype().as_str_name(),
                        "this ps",
                    ));
                }
                let mut out = vec![0f32; n];
                decode(t, n, &mut out, false);
                Ok(out)
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A plain pull's values as they go back (bf16 under `bf16`; exact
    /// otherwise, as a onebit worker's base, and for snapshots: `exact`).
    pub fn pulled(&self, values: Vec<pb::Tensor>, exact: bool) -> Vec<pb::Tensor> {
        if exact || self.compression != Compression::Bf16 {
            return values;
        }
        values.into_iter().map(bf16::to_bf16).collect()
    }

    /// A push's answer to `worker`, who holds the values of answer
    /// `replica`: bf16 values, onebit changes from the worker's values
    /// (or exact values when this ps does not know them), or `values` as
    /// they are. Returns the tensors and the name of what the worker will
    /// hold (0: nothing to name).
    pub fn answer(
        &self,
        worker: u32,
        replica: u64,
        values: Vec<pb::Tensor>,
    ) -> (Vec<pb::Tensor>, u64) {
        match self.compression {
            Compression::None => (values, 0),
            Compression::Bf16 => (values.into_iter().map(bf16::to_bf16).collect(), 0),
            Compression::Onebit => self.onebit_answer(worker, replica, values),
        }
    }

    fn onebit_answer(
        &self,
        worker: u32,
        replica: u64,
        values: Vec<pb::Tensor>,
    ) -> (Vec<pb::Tensor>, u64) {
        let held = self.lock().remove(&worker);
        let name = self.next.fetch_add(1, Ordering::Relaxed);
        let (out, kept) = match held {
            Some(mut r) if replica != 0 && r.name == replica && r.values.len() == values.len() => {
                let mut out = Vec::with_capacity(values.len());
                for (t, base) in values.iter().zip(&mut r.values) {
                    if t.data.len() != 4 * base.len() {
                        // The shard never changes shape; be exact if it did.
                        return self.exact(worker, values, name);
                    }
                    // The change, quantized; the worker adds what it decodes
                    // to its values, and so does this copy of them, in the
                    // same f32 operations: both stay equal bit for bit.
                    let d: Vec<f32> = t
                        .data
                        .chunks_exact(4)
                        .zip(base.iter())
                        .map(|(c, b)| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) - b)
                        .collect();
                    let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
                    let q = tensor(&t.name, &shape, pb::DataType::Onebit, onebit::quantize(&d));
                    onebit::dequantize(&q.data, base, |o, v| *o += v);
                    out.push(q);
                }
                (out, r.values)
            }
            _ => return self.exact(worker, values, name),
        };
        self.keep(worker, Replica { name, values: kept });
        (out, name)
    }

    /// Exact values: what the worker will hold, remembered as they are.
    fn exact(&self, worker: u32, values: Vec<pb::Tensor>, name: u64) -> (Vec<pb::Tensor>, u64) {
        let kept = values
            .iter()
            .map(|t| bytemuck::pod_collect_to_vec(&t.data[..]))
            .collect();
        self.keep(worker, Replica { name, values: kept });
        (values, name)
    }

    fn keep(&self, worker: u32, r: Replica) {
        let mut map = self.lock();
        if map.len() >= self.capacity
            && let Some(&any) = map.keys().next()
        {
            map.remove(&any);
        }
        map.insert(worker, r);
    }

    /// Forgets what every worker holds: the shard was re-seeded, so the
    /// next answers carry exact values.
    pub fn forget(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Replica>> {
        self.replicas.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Decodes `n` values of a checked tensor into `out`: set, or (onebit with
/// `add`) added.
fn decode(t: &pb::Tensor, n: usize, out: &mut [f32], add: bool) {
    match pb::DataType::try_from(t.dtype) {
        Ok(pb::DataType::Bf16) => bf16::decode(&t.data, out),
        Ok(pb::DataType::Onebit) if add => {
            onebit::dequantize(&t.data, &mut out[..n], |o, q| *o += q)
        }
        Ok(pb::DataType::Onebit) => onebit::dequantize(&t.data, &mut out[..n], |o, q| *o = q),
        _ => bytemuck::cast_slice_mut::<f32, u8>(out).copy_from_slice(&t.data),
    }
}

/// A worker's (any client's) end of its TCP links: the setting, the
/// residual of its pushes per ps, and what it holds of each shard.
#[derive(Debug)]
pub struct ClientWire {
    /// This task's `cluster.compression`.
    compression: Compression,
    /// onebit: per ps, per variable of its shard, what the gradients
    /// pushed so far lost to quantization.
    residuals: Vec<Mutex<Vec<Vec<f32>>>>,
    /// onebit: per ps, the answer whose values the caller's arrays hold (0: unknown).
    replicas: Vec<AtomicU64>,
}

impl ClientWire {
    /// The client's end for `compression`, for `shards` (each ps's variable sizes).
    pub fn new(compression: Compression, shards: &[Vec<usize>]) -> Self {
        let onebit = compression == Compression::Onebit;
        Self {
            compression,
            residuals: shards
                .iter()
                .map(|sizes| {
                    Mutex::new(if onebit {
                        sizes.iter().map(|&n| vec![0.0; n]).collect()
                    } else {
                        Vec::new()
                    })
                })
                .collect(),
            replicas: shards.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The setting.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The [`HEADER`] value every TCP call carries.
    pub fn header(&self) -> &'static str {
        name(self.compression)
    }

    /// ps `ps`'s gradients (its shard's, in order: `(name, array)`) as they go on the wire.
    pub fn gradients<'a, S: Data<Elem = f32> + 'a>(
        &self,
        ps: usize,
        grads: impl Iterator<Item = (&'a str, &'a ArrayBase<S, IxDyn>)>,
    ) -> Vec<pb::Tensor> {
        match self.compression {
            Compression::None => grads.map(|(n, g)| super::proto::encode(n, g)).collect(),
            Compression::Bf16 => grads
                .map(|(n, g)| {
                    let v = g.as_slice().expect("arrays built by dtf are contiguous");
                    encode_bf16(n, g.shape(), v)
                })
                .collect(),
            Compression::Onebit => {
                let mut res = self.residuals[ps].lock().unwrap_or_else(|e| e.into_inner());
                grads
                    .zip(res.iter_mut())
                    .map(|((n, g), r)| {
                        let v = g.as_slice().expect("arrays built by dtf are contiguous");
                        // Error feedback: this gradient plus what earlier ones lost.
                        for (r, g) in r.iter_mut().zip(v) {
                            *r += g;
                        }
                        encode_onebit(n, g.shape(), r)
                    })
                    .collect()
            }
        }
    }

    /// Takes the name of what the caller holds of `ps`'s shard for a push
    /// (none until that push's answer is stored: an answer lost halfway
    /// leaves nothing named).
    pub fn take_replica(&self, ps: usize) -> u64 {
        self.replicas[ps].swap(0, Ordering::Relaxed)
    }

    /// The caller's arrays hold the values of answer `name` of `ps`.
    pub fn set_replica(&self, ps: usize, name: u64) {
        self.replicas[ps].store(name, Ordering::Relaxed);
    }

    /// Stores a tensor of an answer into `out`: f32 or bf16 values, or (only
    /// with `changes`, a push's answer) onebit changes added to it.
    ///
    /// Errors: `INTERNAL` for a tensor this client did not ask for or of a
    /// bad length (the ps's fault).
    pub fn store<S: DataMut<Elem = f32>>(
        &self,
        t: &pb::Tensor,
        out: &mut ArrayBase<S, IxDyn>,
        changes: bool,
    ) -> Result<(), Status> {
        let n = checked_len(t).map_err(|s| Status::internal(s.message().to_owned()))?;
        let dtype = t.dtype();
        let fits = match dtype {
            pb::DataType::F32 => true,
            pb::DataType::Bf16 => self.compression == Compression::Bf16,
            pb::DataType::Onebit => changes && self.compression == Compression::Onebit,
            _ => false,
        };
        let shape_ok = t.shape.len() == out.ndim()
            && t.shape
                .iter()
                .zip(out.shape())
                .all(|(&a, &b)| a as usize == b);
        if !fits || !shape_ok {
            return Err(Status::internal(format!(
                "tensor {}: the ps sent {} as {:?} for an array of shape {:?} (cluster.compression here: {:?})",
                super::proto::Short(&t.name),
                super::proto::Dims(&t.shape),
                dtype,
                out.shape(),
                name(self.compression)
            )));
        }
        let out = out
            .as_slice_mut()
            .expect("arrays built by dtf are contiguous");
        decode(t, n, out, changes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayD;

    #[test]
    fn onebit_is_at_least_16_times_smaller_and_keeps_block_means() {
        let n = 784 * 500;
        assert!(4 * n / onebit_len(n) >= 16, "{}", 4 * n / onebit_len(n));
        let mut x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let orig = x.clone();
        let t = encode_onebit("w", &[1000], &mut x);
        assert_eq!(t.data.len(), onebit_len(1000));
        let mut dec = ArrayD::zeros(ndarray::IxDyn(&[1000]));
        let wire = ClientWire::new(Compression::Onebit, &[vec![1000]]);
        wire.store(&t, &mut dec, true).unwrap();
        // What is sent plus what is kept is exactly the input, and per block
        // the sum of what is sent equals the input's sum (means keep it).
        for b in 0..orig.len().div_ceil(BLOCK) {
            let r = b * BLOCK..orig.len().min((b + 1) * BLOCK);
            let sent: f32 = dec.as_slice().unwrap()[r.clone()].iter().sum();
            let want: f32 = orig[r.clone()].iter().sum();
            assert!((sent - want).abs() < 1e-3, "block {b}: {sent} vs {want}");
        }
        for (i, ((d, x), o)) in dec.iter().zip(&x).zip(&orig).enumerate() {
            assert!((d + x - o).abs() < 1e-6);
            assert_eq!(*d >= 0.0, *o >= 0.0, "sign of {i}");
        }
    }

    /// Error feedback: over many pushes the sum of what the ps decodes
    /// tracks the sum of the true gradients within one quantization error.
    #[test]
    fn onebit_error_feedback_tracks_the_sum_of_gradients() {
        let n = 600;
        let wire = ClientWire::new(Compression::Onebit, &[vec![n]]);
        let ps = PsWire::new(Compression::Onebit, 1);
        let mut truth = vec![0f64; n];
        let mut got = vec![0f64; n];
        for step in 0..300 {
            let g = ArrayD::from_shape_fn(ndarray::IxDyn(&[n]), |i| {
                ((i[0] * 7 + step * 13) as f32 * 0.01).cos() * 0.01 + 0.001 * (i[0] % 3) as f32
            });
            for (t, v) in truth.iter_mut().zip(g.iter()) {
                *t += *v as f64;
            }
            let sent = wire.gradients(0, std::iter::once(("w", &g)));
            let dec = ps.gradients(&sent).unwrap().unwrap();
            for (s, v) in got.iter_mut().zip(&dec[0]) {
                *s += *v as f64;
            }
        }
        // Without feedback the per-element error would grow with the steps.
        let worst = truth
            .iter()
            .zip(&got)
            .map(|(t, g)| (t - g).abs())
            .fold(0.0, f64::max);
        assert!(worst < 0.05, "worst drift {worst}");
    }

    /// The ps's answers: exact values first, then changes the worker adds;
    /// worker and ps agree bit for bit on what the worker holds, and the
    /// worker's values track the ps's.
    #[test]
    fn onebit_answers_keep_worker_and_ps_in_step() {
        let n = 700;
        let ps = PsWire::new(Compression::Onebit, 1);
        let wire = ClientWire::new(Compression::Onebit, &[vec![n]]);
        let mut held = ArrayD::zeros(ndarray::IxDyn(&[n]));
        let values = |step: usize| {
            ArrayD::from_shape_fn(ndarray::IxDyn(&[n]), |i| {
                (i[0] as f32 * 0.01).sin() + step as f32 * 0.001 * ((i[0] % 5) as f32 - 2.0)
            })
        };
        for step in 0..200 {
            let v = values(step);
            let replica = wire.take_replica(0);
            let (tensors, name) = ps.answer(3, replica, vec![super::super::proto::encode("w", &v)]);
            let exact = tensors[0].dtype == pb::DataType::F32 as i32;
            assert_eq!(exact, step == 0, "step {step}: exact only first");
            wire.store(&tensors[0], &mut held, !exact).unwrap();
            wire.set_replica(0, name);
            let kept = &ps.lock()[&3].values[0];
            assert_eq!(kept.as_slice(), held.as_slice().unwrap(), "step {step}");
            if step > 20 {
                let err = held
                    .iter()
                    .zip(v.iter())
                    .map(|(h, v)| (h - v).abs())
                    .fold(0.0, f32::max);
                assert!(err < 0.05, "step {step}: worker is {err} off");
            }
        }
        // A lost answer (the worker names an older one): exact values again.
        let (t, _) = ps.answer(3, 12345, vec![super::super::proto::encode("w", &values(0))]);
        assert_eq!(t[0].dtype, pb::DataType::F32 as i32);
    }

    #[test]
    fn mismatches_name_the_key() {
        let ps = PsWire::new(Compression::Bf16, 2);
        let mut md = MetadataMap::new();
        let e = ps.agree(&md).unwrap_err();
        assert!(
            e.message().contains("cluster.compression"),
            "{}",
            e.message()
        );
        md.insert(HEADER, "bf16".parse().unwrap());
        ps.agree(&md).unwrap();
        let g = ArrayD::from_elem(ndarray::IxDyn(&[3]), 1.0f32);
        let f32s = vec![super::super::proto::encode("w", &g)];
        let e = ps.gradients(&f32s).unwrap_err();
        assert!(
            e.message().contains("cluster.compression"),
            "{}",
            e.message()
        );
        // A bad length is refused before anything is decoded.
        let mut t = encode_bf16("w", &[3], &[1.0, 2.0, 3.0]);
        t.data = t.data.slice(..4);
        assert!(ps.gradients(&[t]).is_err());
        // A worker never takes onebit values outside a push's answer.
        let wire = ClientWire::new(Compression::Onebit, &[vec![3]]);
        let mut x = vec![1.0, -1.0, 2.0];
        let t = encode_onebit("w", &[3], &mut x);
        let mut out = ArrayD::zeros(ndarray::IxDyn(&[3]));
        assert!(wire.store(&t, &mut out, false).is_err());
        assert!(wire.store(&t, &mut out, true).is_ok());
    }
}
