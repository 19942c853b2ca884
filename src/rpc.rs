//! The edge between generated proto types and domain types: tensors travel as
//! raw little-endian bytes; shape, dtype and length are validated here, once.

use crate::pb;
use bytes::Bytes;
use ndarray::{ArrayD, IxDyn};

// Tensors go on the wire as the in-memory f32 bytes: only right on little-endian hosts.
#[cfg(not(target_endian = "little"))]
compile_error!("dtf's wire format assumes a little-endian host");

/// A tensor that arrived malformed.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    /// Only f32 tensors travel between tasks.
    #[error("tensor {name}: dtype {dtype}, expected DATA_TYPE_F32")]
    DType { name: String, dtype: i32 },
    /// The byte count does not match the shape.
    #[error("tensor {name}: shape {shape:?} needs {expected} bytes, got {got}")]
    Length {
        name: String,
        shape: Vec<u64>,
        expected: usize,
        got: usize,
    },
    /// A dimension too large for this host.
    #[error("tensor {name}: shape {shape:?} is too large")]
    TooLarge { name: String, shape: Vec<u64> },
}

impl From<TensorError> for tonic::Status {
    fn from(e: TensorError) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// Encodes an f32 array (one copy into the message's bytes).
pub fn encode(name: &str, array: &ArrayD<f32>) -> pb::Tensor {
    let data = match array.as_slice() {
        Some(s) => Bytes::copy_from_slice(bytemuck::cast_slice(s)),
        None => {
            let v: Vec<f32> = array.iter().copied().collect();
            Bytes::copy_from_slice(bytemuck::cast_slice(&v))
        }
    };
    pb::Tensor {
        name: name.to_owned(),
        shape: array.shape().iter().map(|&d| d as u64).collect(),
        dtype: pb::DataType::F32 as i32,
        data,
    }
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

/// Decodes a proto tensor into a new array.
///
/// Errors: [`TensorError`] as [`checked_shape`].
pub fn decode(t: &pb::Tensor) -> Result<ArrayD<f32>, TensorError> {
    let shape = checked_shape(t)?;
    let values: Vec<f32> = bytemuck::pod_collect_to_vec(&t.data);
    Ok(ArrayD::from_shape_vec(IxDyn(&shape), values).expect("length checked above"))
}

/// Decodes into an existing array of the same shape, without allocating.
///
/// Errors: [`TensorError`], or a length error when the shapes differ.
pub fn decode_into(t: &pb::Tensor, out: &mut ArrayD<f32>) -> Result<(), TensorError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn view_borrows_the_bytes() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2]), vec![1.5f32, -2.0]).unwrap();
        let t = encode("w", &a);
        let v = view(&t).unwrap();
        assert_eq!((v.name, v.shape.as_slice()), ("w", &[2usize][..]));
        assert_eq!(v.data, bytemuck::cast_slice::<f32, u8>(&[1.5, -2.0]));
    }
}
