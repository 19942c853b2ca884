//! Every tier against the f32 reference, on shapes that exercise the
//! padding (odd k, partial panels and row blocks) and transposed operands.

use super::*;
use ndarray::{Array2, ShapeBuilder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// (m, k, n): the step's shapes at batch 100 ([784, 500, 10]), scaled
/// down, plus edge cases.
const SHAPES: [(usize, usize, usize); 8] = [
    (1, 1, 1),
    (7, 3, 5),
    (6, 64, 64),
    (13, 33, 65),
    (33, 70, 130),
    (100, 78, 50), // forward, layer 1 (k = 784 / 10)
    (50, 100, 10), // dW of the output layer: k = batch
    (100, 10, 50), // the hidden layer's dX: k = classes
];

fn random(rng: &mut StdRng, shape: (usize, usize), transposed: bool) -> Array2<f32> {
    Array2::from_shape_simple_fn(shape.set_f(transposed), || rng.random_range(-2.0f32..2.0))
}

/// `Σ_k |a_ik|·|b_kj|` and the exact product of the bf16-rounded inputs, in f64.
fn references(a: &Array2<f32>, b: &Array2<f32>) -> (Array2<f64>, Array2<f64>) {
    let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
    let mut abs = Array2::zeros((m, n));
    let mut exact = Array2::zeros((m, n));
    for i in 0..m {
        for j in 0..n {
            for l in 0..k {
                let (x, y) = (bf16::round(a[[i, l]]), bf16::round(b[[l, j]]));
                abs[[i, j]] += f64::from(a[[i, l]].abs()) * f64::from(b[[l, j]].abs());
                exact[[i, j]] += f64::from(x) * f64::from(y);
            }
        }
    }
    (abs, exact)
}

/// Checks `tier` on every shape, both operand layouts, three betas and
/// both layouts of C:
///
/// - against the exact product of the bf16-rounded inputs, within f32
///   accumulation error (`(k + 2)·2⁻²⁴·Σ|a||b|`): any packing or indexing
///   mistake is far outside it;
/// - against the f32 reference (matrixmultiply on the unrounded inputs),
///   within bf16's input rounding (each input within 2⁻⁹ relative, so a
///   product within 2⁻⁸ + 2⁻¹⁸: `2⁻⁷·Σ|a||b|` bounds it with room).
///
/// No input is subnormal, and |products| ≥ 2⁻¹⁴⁰ cannot be either, so the
/// hardware's flush-to-zero never applies and tiers agree within rounding.
fn check_tier(tier: Tier) {
    let mut rng = StdRng::seed_from_u64(28);
    for (m, k, n) in SHAPES {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let a = random(&mut rng, (m, k), ta);
            let b = random(&mut rng, (k, n), tb);
            let (abs, exact) = references(&a, &b);
            // C column-major too (the store's strided path).
            for (beta, tc) in [(0.0f32, false), (1.0, false), (0.5, false), (0.5, true)] {
                let c0 = random(&mut rng, (m, n), tc);
                let mut c = c0.clone();
                gemm_on(tier, &a.view(), &b.view(), beta, &mut c.view_mut());
                let mut want = c0.clone();
                general_mat_mul(1.0, &a.view(), &b.view(), beta, &mut want.view_mut());
                for ((i, j), &got) in c.indexed_iter() {
                    let base = if beta == 0.0 {
                        0.0
                    } else {
                        f64::from(beta) * f64::from(c0[[i, j]])
                    };
                    let scale = abs[[i, j]] + base.abs();
                    let exact = exact[[i, j]] + base;
                    let tol = (k as f64 + 2.0) * 2f64.powi(-24) * scale + 1e-30;
                    let err = (f64::from(got) - exact).abs();
                    assert!(
                        err <= tol,
                        "{} {m}×{k}×{n} (transposed {ta}, {tb}, C {tc}) beta {beta} [{i},{j}]: {got} vs exact {exact} (err {err:e} > {tol:e})",
                        tier.name()
                    );
                    if tier != Tier::F32 {
                        let err = (f64::from(got) - f64::from(want[[i, j]])).abs();
                        let tol = 2f64.powi(-7) * scale + 1e-6;
                        assert!(
                            err <= tol,
                            "{} {m}×{k}×{n} [{i},{j}]: {got} vs f32 {} (err {err:e} > {tol:e})",
                            tier.name(),
                            want[[i, j]]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn portable_matches_the_f32_reference() {
    check_tier(Tier::Portable);
}

#[test]
fn avx512bf16_matches_the_f32_reference() {
    if !Tier::Avx512Bf16.available() {
        eprintln!("avx512bf16 not available on this CPU: not tested here");
        return;
    }
    check_tier(Tier::Avx512Bf16);
}

#[test]
fn amx_matches_the_f32_reference() {
    if !Tier::Amx.available() {
        eprintln!("AMX not available on this CPU or kernel: not tested here");
        return;
    }
    check_tier(Tier::Amx);
}

/// The f32 tier is matrixmultiply itself; checked against the f64 product
/// of the (here unrounded) inputs by the same bound, with the inputs
/// rounded to bf16 first so `references` applies.
#[test]
fn f32_tier_is_the_reference() {
    let mut rng = StdRng::seed_from_u64(1);
    let a = random(&mut rng, (9, 17), false).mapv(bf16::round);
    let b = random(&mut rng, (17, 11), true).mapv(bf16::round);
    let mut c = Array2::zeros((9, 11));
    gemm_on(Tier::F32, &a.view(), &b.view(), 0.0, &mut c.view_mut());
    assert_eq!(c, a.dot(&b));
    gemm(
        Precision::Float32,
        &a.view(),
        &b.view(),
        0.0,
        &mut c.view_mut(),
    );
    assert_eq!(c, a.dot(&b));
}

/// Tiers that run the same arithmetic give the same bits where the
/// summation order is the same: the portable kernel is what `vdpbf16ps`
/// computes (odd product, then even, each add rounded).
#[test]
fn avx512bf16_equals_portable_bit_for_bit() {
    if !Tier::Avx512Bf16.available() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(2);
    let a = random(&mut rng, (37, 91), false);
    let b = random(&mut rng, (91, 70), false);
    let (mut c1, mut c2) = (Array2::zeros((37, 70)), Array2::zeros((37, 70)));
    gemm_on(
        Tier::Portable,
        &a.view(),
        &b.view(),
        0.0,
        &mut c1.view_mut(),
    );
    gemm_on(
        Tier::Avx512Bf16,
        &a.view(),
        &b.view(),
        0.0,
        &mut c2.view_mut(),
    );
    let differ = c1.iter().zip(&c2).filter(|(x, y)| x != y).count();
    assert_eq!(differ, 0, "{differ} of {} entries differ", c1.len());
}

#[test]
fn dtf_kernel_forces_a_lower_tier() {
    let best = Tier::best();
    assert_eq!(select(None).unwrap(), best);
    assert_eq!(select(Some("portable")).unwrap(), Tier::Portable);
    assert_eq!(select(Some("f32")).unwrap(), Tier::F32);
    // A tier above what the CPU has gives way to the best there is.
    assert_eq!(select(Some("amx")).unwrap(), best);
    let err = select(Some("avx512")).unwrap_err().to_string();
    assert!(err.contains("avx512bf16, portable, f32"), "{err}");
    assert!(Tier::Portable.available() && Tier::F32.available());
}

/// A GEMM on a flushing thread: subnormal inputs read as 0 (DAZ) and
/// subnormal products are written as 0 (FTZ), on every tier — TensorFlow's
/// result; without flushing, f32 keeps both.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_gemm_over_denormals_gives_the_flushed_result() {
    let tiny = f32::MIN_POSITIVE / 8.0; // subnormal
    // Row 0 reads a subnormal (× 1); row 1 multiplies two normals into a
    // subnormal (1e-20 · 1e-20 = 1e-40); row 2 is normal and must stay.
    let a = Array2::from_shape_vec((3, 2), vec![tiny, 0.0, 1e-20, 0.0, 2.0, 0.0]).unwrap();
    let b = Array2::from_shape_vec((2, 2), vec![1.0, 1e-20, 0.0, 0.0]).unwrap();
    let run = move |tier: Tier| {
        let mut c = Array2::from_elem((3, 2), f32::NAN);
        gemm_on(tier, &a.view(), &b.view(), 0.0, &mut c.view_mut());
        c
    };
    let (flushed, ieee) = std::thread::spawn(move || {
        flush_denormals(true);
        let flushed: Vec<_> = TIERS
            .into_iter()
            .filter(|t| t.available())
            .map(|t| (t, run(t)))
            .collect();
        flush_denormals(false);
        (flushed, run(Tier::F32))
    })
    .join()
    .unwrap();
    for (tier, c) in flushed {
        // The bf16 tiers multiply the inputs rounded to bf16.
        let r = |x: f32| if tier == Tier::F32 { x } else { bf16::round(x) };
        assert_eq!(c.row(0).to_vec(), [0.0, 0.0], "{}: DAZ", tier.name());
        assert_eq!(c.row(1).to_vec(), [r(1e-20), 0.0], "{}: FTZ", tier.name());
        assert_eq!(c.row(2).to_vec(), [2.0, 2.0 * r(1e-20)], "{}", tier.name());
    }
    assert_eq!(
        ieee[[0, 0]],
        tiny,
        "f32 without flushing keeps a subnormal input"
    );
    assert!(
        ieee[[1, 1]] > 0.0 && ieee[[1, 1]] < f32::MIN_POSITIVE,
        "{ieee}"
    );
}
