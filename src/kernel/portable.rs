//! The portable bf16 micro-kernel: what `vdpbf16ps` computes, in plain
//! Rust, so mixed precision gives the same numbers (to f32 rounding) on a
//! CPU without bf16 instructions, and every other tier has a reference.
//!
//! Per pair, as Intel documents `vdpbf16ps`: the odd product is added
//! first, then the even one, each add rounded to f32. A product of two
//! bf16 is exact in f32 (8 + 8 significant bits), so no FMA is needed for
//! it to round once. The hardware also flushes subnormal products and
//! sums to zero; this path does not (see the tier tests' tolerance).

use super::bf16::NR;

/// Rows of C per call.
pub const MR: usize = 6;

/// `acc[i·NR + j] = Σ_kk A[i, kk]·B[kk, j]` for an `MR × NR` block:
/// `a` is `MR` rows of `lda` pairs, `b` one packed panel of `kp2` pair-rows.
pub fn micro(a: &[u32], lda: usize, b: &[u32], kp2: usize, acc: &mut [f32; MR * NR]) {
    let mut c = [[0.0f32; NR]; MR];
    for kk in 0..kp2 {
        let row: &[u32; NR] = b[kk * NR..(kk + 1) * NR]
            .try_into()
            .expect("a packed panel holds kp2 rows of NR pairs");
        let lo: [f32; NR] = std::array::from_fn(|j| f32::from_bits(row[j] << 16));
        let hi: [f32; NR] = std::array::from_fn(|j| f32::from_bits(row[j] & 0xffff_0000));
        for (i, ci) in c.iter_mut().enumerate() {
            let p = a[i * lda + kk];
            let (a0, a1) = (f32::from_bits(p << 16), f32::from_bits(p & 0xffff_0000));
            for j in 0..NR {
                ci[j] = (ci[j] + a1 * hi[j]) + a0 * lo[j];
            }
        }
    }
    for (dst, row) in acc.chunks_exact_mut(NR).zip(&c) {
        dst.copy_from_slice(row);
    }
}
