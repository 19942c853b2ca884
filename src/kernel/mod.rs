//! The compute kernels behind one entry, [`gemm`]: the matrix products of
//! a training step, in the precision policy's number format, on the best
//! tier this CPU and kernel allow.
//!
//! - `float32`: matrixmultiply's f32 GEMM (AVX-512 on this fleet), the
//!   reference every other tier is tested against.
//! - `mixed_bfloat16`: inputs rounded to bf16 (nearest even), products
//!   accumulated in f32, on the first tier available of
//!   [`Tier::Amx`] (`tdpbf16ps`), [`Tier::Avx512Bf16`] (`vdpbf16ps`),
//!   [`Tier::Portable`] (the same arithmetic in plain Rust).
//!
//! The tier is chosen once per process ([`tier`]), logged once, and shown
//! by `/metrics` and `dtf bench`; `DTF_KERNEL=amx|avx512bf16|portable|f32`
//! forces a lower one (tests and benchmarks). The math above (`Mlp`) calls
//! [`gemm`] and never tests CPU features itself; the L2 penalty's pass
//! ([`scale_and_sum_squares`]) is here too, hand-shaped for vectorizing.
//!
//! Every computing thread flushes denormals to zero, as TensorFlow's do
//! ([`denormals`]: MXCSR's FTZ and DAZ, set where each thread starts;
//! `[train] flush_denormals = false` turns it off).
//!
//! Operands are packed per call ([`bf16`]): each weight matrix is converted
//! once per GEMM that reads it, which in a step is once per pull (layer 1's
//! weights feed one GEMM; the output layer's feed two, in two orientations).

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod bf16;
mod denormals;
mod detect;
mod l2;
pub mod peak;
mod portable;

pub use denormals::{compute_threads, denormals_flushed, flush_denormals};
pub use l2::scale_and_sum_squares;

use bf16::{NR, Strided};
use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::sync::OnceLock;

/// The training step's number format: Keras's policy names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Everything in f32 (TensorFlow's default).
    #[default]
    Float32,
    /// The GEMMs take bf16 inputs and accumulate in f32; everything else
    /// (bias, ReLU, softmax, loss, L2, the gradients sent) stays f32.
    MixedBfloat16,
}

impl Precision {
    /// The config's and the metadata's name.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Float32 => "float32",
            Precision::MixedBfloat16 => "mixed_bfloat16",
        }
    }
}

/// Where a bf16 GEMM runs, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// Intel AMX tiles, `tdpbf16ps`.
    Amx,
    /// AVX-512 BF16, `vdpbf16ps`.
    Avx512Bf16,
    /// Plain Rust, any CPU.
    Portable,
    /// bf16 off: mixed precision's GEMMs run in f32 (matrixmultiply).
    F32,
}

/// Every tier, best first.
pub const TIERS: [Tier; 4] = [Tier::Amx, Tier::Avx512Bf16, Tier::Portable, Tier::F32];

impl Tier {
    /// `DTF_KERNEL`'s name for it, also in logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Amx => "amx",
            Tier::Avx512Bf16 => "avx512bf16",
            Tier::Portable => "portable",
            Tier::F32 => "f32",
        }
    }

    /// Whether this CPU and kernel can run it (asks the kernel for the AMX
    /// tile state, once per process, the first time AMX is asked about).
    pub fn available(self) -> bool {
        static AMX: OnceLock<bool> = OnceLock::new();
        match self {
            Tier::Amx => *AMX.get_or_init(detect::amx),
            Tier::Avx512Bf16 => detect::avx512bf16(),
            Tier::Portable | Tier::F32 => true,
        }
    }

    /// The best tier available.
    pub fn best() -> Tier {
        TIERS
            .into_iter()
            .find(|t| t.available())
            .unwrap_or(Tier::F32)
    }
}

/// A `DTF_KERNEL` that names no tier.
#[derive(Debug, thiserror::Error)]
#[error("DTF_KERNEL={0:?}: expected one of amx, avx512bf16, portable, f32")]
pub struct UnknownTier(String);

/// The tier `DTF_KERNEL` asks for, or the best one when it is unset: a
/// tier the CPU cannot run gives way to the best one below it.
///
/// Errors: [`UnknownTier`] for a name that is no tier.
pub fn select(env: Option<&str>) -> Result<Tier, UnknownTier> {
    let best = Tier::best();
    let Some(name) = env else {
        return Ok(best);
    };
    let wanted = TIERS
        .into_iter()
        .find(|t| t.name() == name)
        .ok_or_else(|| UnknownTier(name.to_owned()))?;
    Ok(wanted.max(best))
}

/// This process's tier: chosen on first use from `DTF_KERNEL` and the CPU,
/// and logged then. An unknown `DTF_KERNEL` is logged and ignored.
pub fn tier() -> Tier {
    static TIER: OnceLock<Tier> = OnceLock::new();
    *TIER.get_or_init(|| {
        let env = std::env::var("DTF_KERNEL").ok();
        let tier = select(env.as_deref()).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "Ignoring DTF_KERNEL.");
            Tier::best()
        });
        tracing::info!(
            kernel = tier.name(),
            best = Tier::best().name(),
            "Kernel tier chosen."
        );
        tier
    })
}

/// `c = a·b + beta·c` in `precision` on this process's [`tier`]; with
/// `beta == 0`, `c` is not read.
///
/// # Panics
///
/// When the shapes do not chain (`a: m × k`, `b: k × n`, `c: m × n`).
pub fn gemm(
    precision: Precision,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) {
    let tier = match precision {
        Precision::Float32 => Tier::F32,
        Precision::MixedBfloat16 => tier(),
    };
    gemm_on(tier, a, b, beta, c);
}

/// Whether [`simd`] runs its closure compiled for AVX-512.
pub fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Runs `f` compiled for AVX-512 when the CPU has it, else as built
/// (baseline x86-64: SSE2): the ps's optimizer passes are element-wise
/// loops the compiler vectorizes to whatever width the function it is
/// inlined into allows, and the binary targets baseline x86-64. `f`'s
/// loops must be `#[inline(always)]` down to the loop for this to reach
/// them, **`f` itself included**: a closure is a function of its own,
/// and one that is not inlined into the AVX-512 wrapper is compiled for
/// baseline SSE (the ps's optimizer pass ran 4 lanes wide for that until
/// issue 41's profile showed it): pass `#[inline(always)] || …`.
/// Element-wise IEEE operations give the same bits at any width.
#[inline(always)]
pub fn simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: the CPU has AVX512F (checked just above).
        return unsafe { with_avx512(f) };
    }
    f()
}

/// `f()`, with AVX-512 enabled in what is inlined here.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn with_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

thread_local! {
    /// The packed operands, reused across calls: a step allocates nothing.
    static PACKED: RefCell<(Vec<u32>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// [`gemm`] on a given tier (tests and benchmarks compare tiers).
///
/// # Panics
///
/// As [`gemm`], and when `tier` is not [`Tier::available`].
pub fn gemm_on(
    tier: Tier,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) {
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    assert!(
        k == k2 && c.dim() == (m, n),
        "gemm: shapes {:?}·{:?} → {:?}",
        a.dim(),
        b.dim(),
        c.dim()
    );
    assert!(
        tier.available(),
        "kernel tier {} not available",
        tier.name()
    );
    if tier == Tier::F32 || m == 0 || k == 0 || n == 0 {
        // An empty product is `beta·c`, whatever the tier.
        general_mat_mul(1.0, a, b, beta, c);
        return;
    }
    // AMX tiles read 16 rows × 32 k at a time; the vector kernels one pair.
    let (mr, k_align) = match tier {
        #[cfg(target_arch = "x86_64")]
        Tier::Amx => (amx::MR, 32),
        _ => (portable::MR, 2),
    };
    let (mp, kp) = (m.div_ceil(mr) * mr, k.div_ceil(k_align) * k_align);
    let (lda, kp2) = (kp / 2, kp / 2);
    PACKED.with_borrow_mut(|(pa, pb)| {
        bf16::pack_a(Strided::of(a), mp, kp, pa);
        bf16::pack_b(Strided::of(b), kp, pb);
        let panels = pb.chunks_exact(kp2 * NR);
        match tier {
            #[cfg(target_arch = "x86_64")]
            Tier::Amx => {
                let mut acc = [0.0f32; amx::MR * NR];
                // SAFETY: `tier.available()` was asserted: AMX detected and
                // the tile state granted.
                let tiles = unsafe { amx::Tiles::configure() };
                for (p, panel) in panels.enumerate() {
                    for i0 in (0..m).step_by(mr) {
                        tiles.micro(&pa[i0 * lda..], lda, panel, kp2, &mut acc);
                        store(&acc[..], c, i0, p * NR, beta);
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Tier::Avx512Bf16 => {
                let mut acc = [0.0f32; portable::MR * NR];
                for (p, panel) in panels.enumerate() {
                    for i0 in (0..m).step_by(mr) {
                        // SAFETY: `tier.available()`: the CPU has AVX512F
                        // and AVX512-BF16; slice bounds are checked inside.
                        unsafe { avx512::micro(&pa[i0 * lda..], lda, panel, kp2, &mut acc) };
                        store(&acc, c, i0, p * NR, beta);
                    }
                }
            }
            _ => {
                let mut acc = [0.0f32; portable::MR * NR];
                for (p, panel) in panels.enumerate() {
                    for i0 in (0..m).step_by(mr) {
                        portable::micro(&pa[i0 * lda..], lda, panel, kp2, &mut acc);
                        store(&acc, c, i0, p * NR, beta);
                    }
                }
            }
        }
    });
}

/// `c[i0.., j0..] = acc + beta·c` for the part of an `rows × NR` block
/// (row stride `NR`) that lies inside `c`.
///
/// A row-major `c` (every GEMM of a training step writes one) is written
/// through plain slices: slicing an ndarray view per row of every block
/// cost a third of a bf16 GEMM's time (`perf`, issue 41).
fn store(acc: &[f32], c: &mut ArrayViewMut2<f32>, i0: usize, j0: usize, beta: f32) {
    let (m, n) = c.dim();
    let cols = NR.min(n - j0);
    let rows = acc.chunks_exact(NR).take(m.saturating_sub(i0));
    let put = |d: &mut f32, s: f32| *d = if beta == 0.0 { s } else { s + beta * *d };
    if let Some(c) = c.as_slice_mut() {
        for (src, row) in rows.zip(c[i0 * n..].chunks_exact_mut(n)) {
            let (src, dst) = (&src[..cols], &mut row[j0..j0 + cols]);
            if beta == 0.0 {
                dst.copy_from_slice(src);
            } else if beta == 1.0 {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d += s;
                }
            } else {
                for (d, &s) in dst.iter_mut().zip(src) {
                    put(d, s);
                }
            }
        }
    } else {
        for (i, src) in rows.enumerate() {
            for (j, &s) in src[..cols].iter().enumerate() {
                put(&mut c[[i0 + i, j0 + j]], s);
            }
        }
    }
}

#[cfg(test)]
mod tests;
