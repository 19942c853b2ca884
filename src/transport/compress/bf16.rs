//! `bf16`: values as bfloat16, rounded by the kernels' one conversion
//! ([`crate::kernel::bf16::to_bf16`]; see the module above for why a
//! subnormal goes to a signed zero), decoded to f32 exactly.

use super::tensor;
use crate::kernel::bf16;
use crate::transport::pb;
use bytes::Bytes;

/// `values` as a bf16 tensor.
pub fn encode_bf16(name: &str, shape: &[usize], values: &[f32]) -> pb::Tensor {
    let mut data = Vec::with_capacity(2 * values.len());
    for &v in values {
        data.extend_from_slice(&bf16::to_bf16(v).to_le_bytes());
    }
    tensor(name, shape, pb::DataType::Bf16, data)
}

/// An f32 tensor as bf16 (any other left as it is).
pub(super) fn to_bf16(t: pb::Tensor) -> pb::Tensor {
    if t.dtype != pb::DataType::F32 as i32 || !t.data.len().is_multiple_of(4) {
        return t;
    }
    let mut data = Vec::with_capacity(t.data.len() / 2);
    for c in t.data.chunks_exact(4) {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        data.extend_from_slice(&bf16::to_bf16(v).to_le_bytes());
    }
    pb::Tensor {
        dtype: pb::DataType::Bf16 as i32,
        data: Bytes::from(data),
        ..t
    }
}

/// Decodes bf16 bytes `data` into `out` (length checked by the caller).
pub(super) fn decode(data: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
        *o = bf16::to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // Exact values pass unchanged.
        for v in [0.0f32, -0.0, 1.0, -2.5, 0.15625, f32::INFINITY] {
            assert_eq!(bf16::to_f32(bf16::to_bf16(v)).to_bits(), v.to_bits(), "{v}");
        }
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even (1).
        assert_eq!(bf16::to_f32(bf16::to_bf16(1.0 + 2f32.powi(-8))), 1.0);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
        assert_eq!(
            bf16::to_f32(bf16::to_bf16(1.0 + 3.0 * 2f32.powi(-8))),
            1.0 + 2f32.powi(-6)
        );
        // Just above halfway rounds up, just below down.
        let half = 1.0 + 2f32.powi(-8);
        assert_eq!(
            bf16::to_f32(bf16::to_bf16(f32::from_bits(half.to_bits() + 1))),
            1.0 + 2f32.powi(-7)
        );
        assert_eq!(
            bf16::to_f32(bf16::to_bf16(f32::from_bits(half.to_bits() - 1))),
            1.0
        );
        // Past the largest bf16: infinity; NaN stays NaN.
        assert_eq!(bf16::to_f32(bf16::to_bf16(f32::MAX)), f32::INFINITY);
        // A subnormal goes to a signed zero, as the kernels pack it.
        assert_eq!(bf16::to_bf16(f32::from_bits(1)), 0);
        assert_eq!(bf16::to_bf16(-f32::from_bits(0x7f_ffff)), 0x8000);
        assert!(bf16::to_f32(bf16::to_bf16(f32::NAN)).is_nan());
        // Relative error at most half a unit in the last place, 2^-8.
        for i in 1..10_000 {
            let v = (i as f32 * 0.7311).sin() * 10f32.powi(i % 7 - 3);
            let r = bf16::to_f32(bf16::to_bf16(v));
            assert!((r - v).abs() <= v.abs() * 2f32.powi(-8), "{v} → {r}");
        }
    }
}
