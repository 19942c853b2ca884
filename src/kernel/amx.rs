//! The AMX micro-kernel: `tdpbf16ps` on a 32 × 64 block of C, as two
//! 32 × 32 halves of four 16 × 16 f32 tiles (tmm0–3) fed by two A tiles
//! (tmm4–5: 16 rows × 32 bf16) and two B tiles (tmm6–7: 16 pair-rows × 16
//! columns) per 32 of k. The AMX intrinsics are nightly-only
//! (rust-lang/rust#126622), so the instructions are written in `asm!`.
//!
//! Operands are the tier-independent layouts of [`super::bf16`]: A rows of
//! pairs (k padded to 32, rows to 32), B panels of `NR` columns with
//! 256-byte pair-rows, which a B tile reads with that stride.

use super::bf16::NR;

/// Rows of C per call.
pub const MR: usize = 32;

/// The 64-byte tile configuration `ldtilecfg` reads (palette 1).
#[repr(C, align(64))]
struct TileConfig {
    /// Palette 1: 8 tiles of up to 16 rows × 64 bytes.
    palette: u8,
    /// Row to restart an interrupted load or store at: 0.
    start_row: u8,
    /// Must be zero.
    reserved: [u8; 14],
    /// Bytes per row of each tile.
    colsb: [u16; 16],
    /// Rows of each tile.
    rows: [u8; 16],
}

/// Holds the tile configuration for one GEMM: tiles configured on
/// creation, released on drop, so no tile state outlives the GEMM.
pub struct Tiles(());

impl Tiles {
    /// Configures tmm0–7 as 16 rows × 64 bytes.
    ///
    /// # Safety
    ///
    /// [`super::detect::amx`] must have returned true in this process.
    pub unsafe fn configure() -> Tiles {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        cfg.colsb[..8].fill(64);
        cfg.rows[..8].fill(16);
        // SAFETY: the CPU has AMX and the tile data permission (caller);
        // the configuration is a valid palette-1 one, read from memory we own.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly, preserves_flags));
        }
        Tiles(())
    }

    /// `acc[i·NR + j] = Σ A[i, kk]·B[kk, j]` for a `MR × NR` block: `a` is
    /// `MR` rows of `lda` pairs, `b` one panel of `kp2` pair-rows; `kp2`
    /// and `lda` are multiples of 16.
    pub fn micro(&self, a: &[u32], lda: usize, b: &[u32], kp2: usize, acc: &mut [f32; MR * NR]) {
        assert!(kp2.is_multiple_of(16) && lda.is_multiple_of(16) && lda >= kp2);
        assert!(a.len() >= (MR - 1) * lda + kp2 && b.len() >= kp2 * NR);
        if kp2 == 0 {
            acc.fill(0.0);
            return;
        }
        for half in 0..2 {
            let col = half * 32;
            // SAFETY: the tiles are configured (`self` exists), so each
            // tile is 16 rows × 64 bytes. Every load stays inside `a` and
            // `b` (asserted above): A tiles read rows i..i+16 of 64 bytes
            // at 64-byte steps up to kp2 pairs ≤ lda; B tiles read 16
            // pair-rows of 16 columns from column `col` or `col + 16` of a
            // panel whose rows are NR·4 = 256 bytes, up to kp2 rows. The
            // stores write 16 rows of 64 bytes at a 256-byte stride inside
            // `acc` (32 rows × 256 bytes).
            unsafe {
                std::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    "2:",
                    "tileloadd tmm4, [{a0} + {lda}*1]",
                    "tileloadd tmm5, [{a1} + {lda}*1]",
                    "tileloadd tmm6, [{b} + {ldb}*1]",
                    "tileloadd tmm7, [{b} + {ldb}*1 + 64]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "add {a0}, 64",
                    "add {a1}, 64",
                    "add {b}, {bstep}",
                    "dec {n}",
                    "jnz 2b",
                    "tilestored [{c} + {ldb}*1], tmm0",
                    "tilestored [{c} + {ldb}*1 + 64], tmm1",
                    "tilestored [{c} + {ldb}*1 + 4096], tmm2",
                    "tilestored [{c} + {ldb}*1 + 4160], tmm3",
                    a0 = inout(reg) a.as_ptr() => _,
                    a1 = inout(reg) a.as_ptr().add(16 * lda) => _,
                    b = inout(reg) b.as_ptr().add(col) => _,
                    c = in(reg) acc.as_mut_ptr().add(col),
                    lda = in(reg) lda * 4,
                    ldb = in(reg) NR * 4,
                    bstep = in(reg) 16 * NR * 4,
                    n = inout(reg) kp2 / 16 => _,
                    options(nostack),
                );
            }
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: tiles were configured by `configure`, so AMX is usable.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    }
}
