//! `onebit`: one bit per value plus two f32 scales per block of [`BLOCK`]
//! values, the block's mean of its non-negative values and of its negative
//! ones (1-bit SGD). The loops are written for the compiler to vectorize
//! and run under [`crate::kernel::simd`]; the tests hold them to the plain
//! loops they replaced.

use super::tensor;
use crate::transport::pb;

/// Values per onebit block (one pair of scales each).
pub const BLOCK: usize = 256;

/// Bytes of a onebit tensor of `n` values.
pub fn onebit_len(n: usize) -> usize {
    8 * n.div_ceil(BLOCK) + n.div_ceil(8)
}

/// Quantizes `x` to onebit bytes.
pub(super) fn quantize(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; onebit_len(x.len())];
    crate::kernel::simd(
        #[inline(always)]
        || quantize_into(x, &mut out),
    );
    out
}

/// [`quantize`]'s loop, written for the compiler to vectorize: lanes of
/// sums, one per bit of the bytes in hand, reduced once per block in a
/// fixed order, and no branch per value.
#[inline(always)]
fn quantize_into(x: &[f32], out: &mut [u8]) {
    const LANES: usize = 16;
    let blocks = x.len().div_ceil(BLOCK);
    let (scales, bits) = out.split_at_mut(8 * blocks);
    for ((chunk, scale), bytes) in x
        .chunks(BLOCK)
        .zip(scales.chunks_exact_mut(8))
        .zip(bits.chunks_mut(BLOCK / 8))
    {
        let (mut pos, mut npos, mut neg) = ([0f32; LANES], [0u32; LANES], [0f32; LANES]);
        let whole = chunk.chunks_exact(LANES);
        let tail = whole.remainder();
        for (values, two) in whole.zip(bytes.chunks_exact_mut(LANES / 8)) {
            let mut b = 0u16;
            for k in 0..LANES {
                let v = values[k];
                let set = v >= 0.0;
                b |= u16::from(set) << k;
                npos[k] += u32::from(set);
                pos[k] += if set { v } else { 0.0 };
                neg[k] += if set { 0.0 } else { v };
            }
            two.copy_from_slice(&b.to_le_bytes());
        }
        // The last block's last values (fewer than a lane's worth).
        let start = chunk.len() - tail.len();
        for (j, &v) in tail.iter().enumerate() {
            let set = v >= 0.0;
            let i = start + j;
            bytes[i / 8] |= u8::from(set) << (i % 8);
            npos[j] += u32::from(set);
            pos[j] += if set { v } else { 0.0 };
            neg[j] += if set { 0.0 } else { v };
        }
        let npos: u32 = npos.iter().sum();
        let (pos, neg): (f32, f32) = (pos.iter().sum(), neg.iter().sum());
        let nneg = chunk.len() as u32 - npos;
        let p = if npos > 0 { pos / npos as f32 } else { 0.0 };
        let m = if nneg > 0 { neg / nneg as f32 } else { 0.0 };
        scale[..4].copy_from_slice(&p.to_le_bytes());
        scale[4..].copy_from_slice(&m.to_le_bytes());
    }
}

/// Applies `op(out[i], value)` for every value of onebit bytes `data` of
/// `out.len()` values (length checked by the caller): a select per value,
/// no branch, vectorized.
#[inline(always)]
pub(super) fn dequantize(data: &[u8], out: &mut [f32], op: impl Fn(&mut f32, f32) + Copy) {
    crate::kernel::simd(
        #[inline(always)]
        || {
            let blocks = out.len().div_ceil(BLOCK);
            let (scales, bits) = data.split_at(8 * blocks);
            for ((block, s), bytes) in out
                .chunks_mut(BLOCK)
                .zip(scales.chunks_exact(8))
                .zip(bits.chunks(BLOCK / 8))
            {
                let p = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                let m = f32::from_le_bytes([s[4], s[5], s[6], s[7]]);
                let group = |values: &mut [f32], byte: u8| {
                    for (k, o) in values.iter_mut().enumerate() {
                        op(o, if (byte >> k) & 1 != 0 { p } else { m });
                    }
                };
                let mut whole = block.chunks_exact_mut(8);
                for (values, &byte) in whole.by_ref().zip(bytes) {
                    group(values, byte);
                }
                let tail = whole.into_remainder();
                if !tail.is_empty() {
                    group(tail, bytes[bytes.len() - 1]);
                }
            }
        },
    )
}

/// `x` as a onebit tensor; `x` is left holding what quantization lost
/// (`x − decoded`): the error fed back into the next one.
pub fn encode_onebit(name: &str, shape: &[usize], x: &mut [f32]) -> pb::Tensor {
    let data = quantize(x);
    dequantize(&data, x, |o, q| *o -= q);
    tensor(name, shape, pb::DataType::Onebit, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain loops the vectorized ones replaced.
    fn reference_quantize(x: &[f32]) -> Vec<u8> {
        let blocks = x.len().div_ceil(BLOCK);
        let mut out = vec![0u8; onebit_len(x.len())];
        let (scales, bits) = out.split_at_mut(8 * blocks);
        for (b, chunk) in x.chunks(BLOCK).enumerate() {
            let (mut pos, mut npos, mut neg) = (0f32, 0u32, 0f32);
            for (j, &v) in chunk.iter().enumerate() {
                if v >= 0.0 {
                    pos += v;
                    npos += 1;
                    let i = b * BLOCK + j;
                    bits[i / 8] |= 1 << (i % 8);
                } else {
                    neg += v;
                }
            }
            let nneg = chunk.len() as u32 - npos;
            let p = if npos > 0 { pos / npos as f32 } else { 0.0 };
            let m = if nneg > 0 { neg / nneg as f32 } else { 0.0 };
            scales[8 * b..8 * b + 4].copy_from_slice(&p.to_le_bytes());
            scales[8 * b + 4..8 * b + 8].copy_from_slice(&m.to_le_bytes());
        }
        out
    }
    fn reference_dequantize(data: &[u8], n: usize, mut each: impl FnMut(usize, f32)) {
        let blocks = n.div_ceil(BLOCK);
        let (scales, bits) = data.split_at(8 * blocks);
        for b in 0..blocks {
            let s = &scales[8 * b..8 * b + 8];
            let p = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            let m = f32::from_le_bytes([s[4], s[5], s[6], s[7]]);
            for i in b * BLOCK..n.min((b + 1) * BLOCK) {
                let set = bits[i / 8] & (1 << (i % 8)) != 0;
                each(i, if set { p } else { m });
            }
        }
    }

    /// The vectorized loops give what the plain ones give: the same bits,
    /// the same scales up to the order of summation, and the same decoded
    /// values, for lengths with and without a partial block and byte.
    #[test]
    fn onebit_loops_match_the_plain_ones() {
        let x: Vec<f32> = (0..5000)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
            .collect();
        for n in [5000, 4096, 1000, 264, 256, 17, 16, 13, 8, 1] {
            let x = &x[..n];
            let (o, q) = (reference_quantize(x), quantize(x));
            let sb = 8 * n.div_ceil(BLOCK);
            assert_eq!(o[sb..], q[sb..], "the bits of {n} values");
            for (a, b) in o[..sb].chunks(4).zip(q[..sb].chunks(4)) {
                let a = f32::from_le_bytes(a.try_into().unwrap());
                let b = f32::from_le_bytes(b.try_into().unwrap());
                assert!(
                    (a - b).abs() <= 1e-5 * a.abs(),
                    "scale {a} vs {b} ({n} values)"
                );
            }
            let (mut a, mut b) = (x.to_vec(), x.to_vec());
            reference_dequantize(&q, n, |i, v| a[i] += v);
            dequantize(&q, &mut b, |o, v| *o += v);
            assert_eq!(a, b, "{n} values decoded");
        }
    }
}
