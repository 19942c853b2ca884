//! bf16 conversion and the packed operand layouts every bf16 tier reads.
//!
//! A GEMM `C = A·B` in bf16 pairs its inner dimension `k`: the hardware
//! instructions (`vdpbf16ps`, `tdpbf16ps`) multiply two adjacent `k`
//! elements of A by the same two of B and add both products to one f32.
//! So both operands are packed as **pairs along k**, one `u32` holding
//! `(x[2kk], x[2kk+1])` as two bf16 (the even one in the low half):
//!
//! - A (`m × k`) row-major: row `i` is `kp/2` pairs, rows padded with zeros
//!   to a multiple of the tier's row block (AMX's tiles read 16 rows of 32
//!   `k`, so there `k` is padded to 32).
//! - B (`k × n`) in panels of [`NR`] columns: panel `p` is `kp/2` rows of
//!   `NR` pairs, `(B[2kk, j], B[2kk+1, j])` for the panel's columns `j`
//!   ("VNNI" layout), the last panel padded with zero columns.
//!
//! Conversion rounds to nearest even and flushes subnormal inputs to a
//! signed zero, as `vcvtne2ps2bf16` does, so every tier packs the same
//! bits; NaN stays NaN (quieted). It is written on `u32` lanes with
//! selects, no branches, so the packing loops vectorize on any x86-64.

/// Columns per packed B panel: four 16-lane vectors in the AVX-512 kernel,
/// two AMX tiles' width twice over.
pub const NR: usize = 64;

/// `x` rounded to bf16 (nearest even, subnormals to ±0), as the f32 bit
/// pattern whose low 16 bits are zero: the bf16 is the high half.
#[inline(always)]
pub fn round_bits(x: u32) -> u32 {
    let abs = x & 0x7fff_ffff;
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1));
    let out = if abs > 0x7f80_0000 {
        // NaN: keep sign and payload's top bits, set the quiet bit.
        x | 0x0040_0000
    } else if abs < 0x0080_0000 {
        // Zero or subnormal: the hardware treats a subnormal input as zero.
        x & 0x8000_0000
    } else {
        rounded
    };
    out & 0xffff_0000
}

/// `x` rounded to bf16 (see [`round_bits`]).
#[inline]
pub fn to_bf16(x: f32) -> u16 {
    (round_bits(x.to_bits()) >> 16) as u16
}

/// The f32 a bf16 stands for (exact).
#[inline]
pub fn to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `x` through bf16 and back: what a bf16 kernel multiplies.
#[inline]
pub fn round(x: f32) -> f32 {
    f32::from_bits(round_bits(x.to_bits()))
}

/// Two f32 as one bf16 pair: `lo` in the low half (the even `k`).
#[inline(always)]
fn pair(lo: u32, hi: u32) -> u32 {
    (round_bits(lo) >> 16) | round_bits(hi)
}

/// A strided f32 matrix, read-only: what the packers read. Built from an
/// ndarray view so transposed operands (`Xᵀ`, `Wᵀ`) pack without a copy.
#[derive(Clone, Copy)]
pub struct Strided<'a> {
    /// The element `[0, 0]`.
    pub ptr: *const f32,
    /// Rows and columns.
    pub dim: (usize, usize),
    /// Element strides of a row step and a column step.
    pub strides: (isize, isize),
    /// Ties the pointer to the view it came from.
    pub _view: std::marker::PhantomData<&'a f32>,
}

impl<'a> Strided<'a> {
    /// The view's pointer, shape and strides.
    pub fn of(v: &ndarray::ArrayView2<'a, f32>) -> Self {
        let s = v.strides();
        Strided {
            ptr: v.as_ptr(),
            dim: v.dim(),
            strides: (s[0], s[1]),
            _view: std::marker::PhantomData,
        }
    }

    /// The element `[r, c]` as bits; 0 outside the matrix (padding).
    #[inline(always)]
    fn bits(&self, r: usize, c: usize) -> u32 {
        if r < self.dim.0 && c < self.dim.1 {
            // SAFETY: in bounds of the view this was built from, which
            // outlives 'a.
            unsafe {
                (*self
                    .ptr
                    .offset(r as isize * self.strides.0 + c as isize * self.strides.1))
                .to_bits()
            }
        } else {
            0
        }
    }

    /// Row `r` as bits, when a row's elements are contiguous (column
    /// stride 1); `None` past the last row.
    #[inline(always)]
    fn row(&self, r: usize) -> Option<&'a [u32]> {
        assert_eq!(
            self.strides.1, 1,
            "rows of a column-major matrix are not contiguous"
        );
        // SAFETY: row r < rows holds `cols` contiguous f32 of the view this
        // was built from, which outlives 'a.
        (r < self.dim.0).then(|| unsafe {
            std::slice::from_raw_parts(
                self.ptr.offset(r as isize * self.strides.0) as *const u32,
                self.dim.1,
            )
        })
    }

    /// Column `c` as bits, when a column's elements are contiguous (row
    /// stride 1); `None` past the last column.
    #[inline(always)]
    fn col(&self, c: usize) -> Option<&'a [u32]> {
        assert_eq!(
            self.strides.0, 1,
            "columns of a row-major matrix are not contiguous"
        );
        // SAFETY: as `row`, with the axes swapped.
        (c < self.dim.1).then(|| unsafe {
            std::slice::from_raw_parts(
                self.ptr.offset(c as isize * self.strides.1) as *const u32,
                self.dim.0,
            )
        })
    }
}

/// Packs A (`m × k`) as rows of bf16 pairs: `out[i·(kp/2) + kk]`, rows
/// `m..mp` and pairs beyond `k` zero. `kp` is even, `mp ≥ m`.
pub fn pack_a(a: Strided, mp: usize, kp: usize, out: &mut Vec<u32>) {
    let (m, k) = a.dim;
    let kp2 = kp / 2;
    out.clear();
    out.resize(mp * kp2, 0);
    if m == 0 || k == 0 {
        return;
    }
    if a.strides.1 == 1 {
        // Row-major A (X, the activations): each row's pairs are adjacent
        // in memory, read as u64 and written in order.
        let full = k / 2;
        for i in 0..m {
            let row = a.row(i).expect("i < m");
            let dst = &mut out[i * kp2..i * kp2 + full];
            for (d, p) in dst.iter_mut().zip(row.chunks_exact(2)) {
                *d = pair(p[0], p[1]);
            }
            if k % 2 == 1 {
                out[i * kp2 + full] = pair(row[k - 1], 0);
            }
        }
    } else if a.strides.0 == 1 {
        // A transposed (Xᵀ, Aᵀ for dW): two of A's columns are two rows of
        // the source, read along the rows; the pairs scatter to their rows.
        for kk in 0..k.div_ceil(2) {
            let (c0, c1) = (a.col(2 * kk).expect("2kk < k"), a.col(2 * kk + 1));
            for i in 0..m {
                out[i * kp2 + kk] = pair(c0[i], c1.map_or(0, |c1| c1[i]));
            }
        }
    } else {
        for kk in 0..k.div_ceil(2) {
            for i in 0..m {
                out[i * kp2 + kk] = pair(a.bits(i, 2 * kk), a.bits(i, 2 * kk + 1));
            }
        }
    }
}

/// Packs B (`k × n`) in panels of [`NR`] columns, `kp/2` pair-rows each:
/// `out[p·(kp/2)·NR + kk·NR + j]`. `kp` is even.
pub fn pack_b(b: Strided, kp: usize, out: &mut Vec<u32>) {
    let (k, n) = b.dim;
    let kp2 = kp / 2;
    let panels = n.div_ceil(NR);
    out.clear();
    out.resize(panels * kp2 * NR, 0);
    if k == 0 || n == 0 {
        return;
    }
    if b.strides.1 == 1 {
        // Row-major B (W, dZ): two source rows make one pair-row, both read
        // along j: the loop vectorizes.
        for kk in 0..k.div_ceil(2) {
            let (r0, r1) = (b.row(2 * kk).expect("2kk < k"), b.row(2 * kk + 1));
            for p in 0..panels {
                let (j0, j1) = (p * NR, ((p + 1) * NR).min(n));
                let dst = &mut out[(p * kp2 + kk) * NR..][..j1 - j0];
                match r1 {
                    Some(r1) => {
                        for ((d, &lo), &hi) in dst.iter_mut().zip(&r0[j0..j1]).zip(&r1[j0..j1]) {
                            *d = pair(lo, hi);
                        }
                    }
                    None => {
                        for (d, &lo) in dst.iter_mut().zip(&r0[j0..j1]) {
                            *d = pair(lo, 0);
                        }
                    }
                }
            }
        }
    } else {
        for kk in 0..k.div_ceil(2) {
            for j in 0..n {
                let (p, jj) = (j / NR, j % NR);
                out[(p * kp2 + kk) * NR + jj] = pair(b.bits(2 * kk, j), b.bits(2 * kk + 1, j));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(round(1.0 + 2f32.powi(-8)), 1.0);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to even (1 + 2^-6).
        assert_eq!(round(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        // Just above the half rounds up.
        assert_eq!(
            round(1.0 + 2f32.powi(-8) + 2f32.powi(-20)),
            1.0 + 2f32.powi(-7)
        );
        assert_eq!(round(-1.0 - 2f32.powi(-8)), -1.0);
        assert_eq!(to_bf16(1.0), 0x3f80);
        assert_eq!(to_f32(0x3f80), 1.0);
        // The largest finite f32 rounds to infinity, as in the hardware.
        assert_eq!(round(f32::MAX), f32::INFINITY);
        assert_eq!(round(f32::INFINITY), f32::INFINITY);
        assert!(round(f32::NAN).is_nan());
        // A NaN whose payload lives only in the low half stays a NaN.
        assert!(round(f32::from_bits(0x7f80_0001)).is_nan());
        // Subnormals flush to a signed zero.
        assert_eq!(round(1e-40).to_bits(), 0);
        assert_eq!(round(-1e-40).to_bits(), 0x8000_0000);
        assert_eq!(round(f32::MIN_POSITIVE), f32::MIN_POSITIVE);
    }

    #[test]
    fn packs_pairs_along_k() {
        // A 3 × 3, row-major and as a transposed view: the same pairs.
        let a = ndarray::Array2::from_shape_fn((3, 3), |(i, j)| (i * 3 + j) as f32);
        let at = a.t().to_owned();
        let (mut p1, mut p2) = (Vec::new(), Vec::new());
        pack_a(Strided::of(&a.view()), 4, 4, &mut p1);
        pack_a(Strided::of(&at.t()), 4, 4, &mut p2);
        assert_eq!(p1, p2);
        assert_eq!(p1.len(), 8);
        assert_eq!(
            p1[2],
            u32::from(to_bf16(3.0)) | u32::from(to_bf16(4.0)) << 16
        );
        assert_eq!(p1[3], u32::from(to_bf16(5.0)));
        assert!(p1[6..].iter().all(|&v| v == 0));
        // B 3 × 70: two panels; pair-row 1 holds row 2 and zeros.
        let b = ndarray::Array2::from_shape_fn((3, 70), |(i, j)| (i * 70 + j) as f32);
        let bt = b.t().to_owned();
        let (mut q1, mut q2) = (Vec::new(), Vec::new());
        pack_b(Strided::of(&b.view()), 4, &mut q1);
        pack_b(Strided::of(&bt.t()), 4, &mut q2);
        assert_eq!(q1, q2);
        assert_eq!(q1.len(), 2 * 2 * NR);
        let at = |p: usize, kk: usize, j: usize| q1[(p * 2 + kk) * NR + j];
        assert_eq!(
            at(0, 0, 5),
            u32::from(to_bf16(5.0)) | u32::from(to_bf16(75.0)) << 16
        );
        assert_eq!(at(1, 1, 1), u32::from(to_bf16(140.0 + 65.0)));
        assert_eq!(at(1, 0, 6), 0);
    }
}
