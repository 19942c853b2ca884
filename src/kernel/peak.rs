//! Arithmetic peaks of one core, measured: the figure `dtf bench` compares
//! the step's rate with. A loop of independent multiply-adds with no
//! memory traffic runs at what the execution ports allow at the clock the
//! core holds under load, which a datasheet's nominal clock does not say.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Independent accumulators: more than latency × ports of any current core.
#[cfg(target_arch = "x86_64")]
const CHAINS: usize = 16;

/// Runs `iters` rounds of `vfmadd` on 16 × 16 f32 lanes; returns the flops
/// done (2 per lane) and a value that depends on every result (so the loop
/// is not removed). `None` without AVX-512.
pub fn fma_f32(iters: usize) -> Option<(f64, f32)> {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX512F is present (checked above).
        let v = unsafe { fma_loop(iters) };
        return Some(((iters * CHAINS * 16 * 2) as f64, v));
    }
    let _ = iters;
    None
}

/// Runs `iters` rounds of `vdpbf16ps` on 16 × 16 f32 lanes (two bf16
/// products each, 4 flops); `None` without AVX512-BF16.
pub fn dot_bf16(iters: usize) -> Option<(f64, f32)> {
    #[cfg(target_arch = "x86_64")]
    if super::detect::avx512bf16() {
        // SAFETY: AVX512F and AVX512-BF16 are present (checked above).
        let v = unsafe { dot_loop(iters) };
        return Some(((iters * CHAINS * 16 * 4) as f64, v));
    }
    let _ = iters;
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop(iters: usize) -> f32 {
    // acc·x + y with x just under 1 converges to y/(1 − x): no overflow,
    // no subnormals, however long it runs.
    // Opaque to the optimizer, which would otherwise fold the constants.
    let (x, y) = std::hint::black_box((_mm512_set1_ps(0.999), _mm512_set1_ps(1e-3)));
    let mut acc = std::hint::black_box([_mm512_set1_ps(1.0); CHAINS]);
    for _ in 0..iters {
        for a in &mut acc {
            *a = _mm512_fmadd_ps(*a, x, y);
        }
    }
    sum(&acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dot_loop(iters: usize) -> f32 {
    // acc + 2·(1e-3 · 1e-3): grows by 2e-6 a round, never near overflow.
    let a = std::hint::black_box(_mm512_cvtne2ps_pbh(
        _mm512_set1_ps(1e-3),
        _mm512_set1_ps(1e-3),
    ));
    let mut acc = std::hint::black_box([_mm512_set1_ps(1.0); CHAINS]);
    for _ in 0..iters {
        for c in &mut acc {
            *c = _mm512_dpbf16_ps(*c, a, a);
        }
    }
    sum(&acc)
}

/// The sum of every lane (a loop, not a closure: closures do not get this
/// function's target features).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum(acc: &[__m512]) -> f32 {
    let mut total = 0.0;
    for a in acc {
        total += _mm512_reduce_add_ps(*a);
    }
    total
}
