//! The AVX512-BF16 micro-kernel: `vdpbf16ps` on a 6 × 64 block of C held
//! in 24 of the 32 ZMM registers (four B vectors and one broadcast of A
//! take five more), so each pair-row of B loaded feeds 24 instructions.

use super::bf16::NR;
use super::portable::MR;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// [`super::portable::micro`] with `vdpbf16ps`.
///
/// # Safety
///
/// The CPU must have AVX512F and AVX512-BF16 ([`super::detect::avx512bf16`]).
/// `a` holds `MR` rows of `lda ≥ kp2` pairs, `b` `kp2 · NR` pairs: checked
/// here, so the loads below stay in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn micro(a: &[u32], lda: usize, b: &[u32], kp2: usize, acc: &mut [f32; MR * NR]) {
    assert!(lda >= kp2 && a.len() >= (MR - 1) * lda + kp2 && b.len() >= kp2 * NR);
    let mut c = [[_mm512_setzero_ps(); NR / 16]; MR];
    let (a, b) = (a.as_ptr(), b.as_ptr());
    for kk in 0..kp2 {
        // No closures here: they would be compiled without this function's
        // target features, and the intrinsics would not inline into them.
        let mut bv = [zero_bh(); NR / 16];
        for (v, slot) in bv.iter_mut().enumerate() {
            // SAFETY: kk < kp2, so the row's NR pairs are inside `b`
            // (asserted); __m512i and __m512bh are both 64 bytes of lanes.
            *slot = unsafe {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    b.add(kk * NR + 16 * v).cast(),
                ))
            };
        }
        for (i, ci) in c.iter_mut().enumerate() {
            // SAFETY: i < MR and kk < kp2 ≤ lda: inside `a` (asserted).
            let p = unsafe { *a.add(i * lda + kk) };
            // SAFETY: as above, 64 bytes of lanes either way.
            let av =
                unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(p as i32)) };
            for (cv, bv) in ci.iter_mut().zip(&bv) {
                *cv = _mm512_dpbf16_ps(*cv, av, *bv);
            }
        }
    }
    for (dst, row) in acc.chunks_exact_mut(NR).zip(&c) {
        for (v, cv) in row.iter().enumerate() {
            // SAFETY: 16 f32 at 16·v < NR, inside this row of `acc`.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(16 * v), *cv) };
        }
    }
}

/// A vector of 32 bf16 zeros.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn zero_bh() -> __m512bh {
    // SAFETY: 64 bytes of lanes either way.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()) }
}
