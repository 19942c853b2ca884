//! Denormal (subnormal) floats flushed to zero in every thread that
//! computes, as TensorFlow does: its executor and its Eigen thread pool
//! run their kernels under `port::ScopedFlushDenormal`, which sets the
//! x86 MXCSR bits FTZ (results that would be subnormal become ±0) and DAZ
//! (subnormal inputs read as ±0).
//!
//! Why it matters: on Intel cores every floating-point operation that
//! reads or produces a subnormal takes a microcode assist, ~100× its usual
//! cost. Adam with L2 leaves thousands of weights and first moments
//! subnormal (the always-zero pixels' weights decay toward 0 and stay
//! there), and the worker's GEMMs then spent most of their time in assists
//! (issue 41: 122 → 385 steps/s on an Intel Xeon with the bits set; AMD
//! cores pay far less). Flushing is also what TensorFlow-exact means.
//!
//! MXCSR is per thread, so the bits are set where each computing thread
//! starts: [`compute_threads`] does it for a tokio runtime's threads (its
//! workers, its blocking pool, and the thread that calls `block_on`), which
//! is where the worker's steps, the ps's updates and the evaluator run;
//! `dtf bench` and `dtf eval` call [`flush_denormals`] on their one thread.
//! `[train] flush_denormals = false` clears them instead, for anyone who
//! needs IEEE subnormals. Off x86-64 both are no-ops (AArch64's FPCR.FZ
//! would be the equivalent; dtf's fleet is x86-64).

/// MXCSR's flush-to-zero bit: a subnormal result is written as ±0.
#[cfg(target_arch = "x86_64")]
const FTZ: u32 = 1 << 15;
/// MXCSR's denormals-are-zero bit: a subnormal input is read as ±0.
#[cfg(target_arch = "x86_64")]
const DAZ: u32 = 1 << 6;

/// Sets (`on`) or clears FTZ and DAZ for the calling thread; every SSE and
/// AVX operation it runs afterwards obeys them (x87 does not, and dtf uses
/// none). A no-op off x86-64.
pub fn flush_denormals(on: bool) {
    #[cfg(target_arch = "x86_64")]
    {
        let csr = mxcsr();
        let want = if on {
            csr | FTZ | DAZ
        } else {
            csr & !(FTZ | DAZ)
        };
        if want != csr {
            set_mxcsr(want);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = on;
}

/// Whether the calling thread flushes denormals: both FTZ and DAZ set
/// (always false off x86-64). For tests and the `dtf_denormals_flushed`
/// metric.
pub fn denormals_flushed() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        mxcsr() & (FTZ | DAZ) == FTZ | DAZ
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `builder` with [`flush_denormals`]`(on)` run at the start of each of
/// its threads (workers and blocking pool: tokio calls `on_thread_start`
/// for both), and on the calling thread, which runs the future given to
/// `block_on`.
pub fn compute_threads(
    builder: &mut tokio::runtime::Builder,
    on: bool,
) -> &mut tokio::runtime::Builder {
    flush_denormals(on);
    builder.on_thread_start(move || flush_denormals(on))
}

/// The calling thread's MXCSR.
#[cfg(target_arch = "x86_64")]
fn mxcsr() -> u32 {
    let mut csr = 0u32;
    // SAFETY: STMXCSR writes the 4 bytes at the pointer, which is a local
    // u32; SSE is part of x86-64's baseline.
    unsafe {
        std::arch::asm!(
            "stmxcsr [{}]",
            in(reg) &mut csr,
            options(nostack, preserves_flags),
        );
    }
    csr
}

/// Loads `csr` into the calling thread's MXCSR.
#[cfg(target_arch = "x86_64")]
fn set_mxcsr(csr: u32) {
    // SAFETY: LDMXCSR reads 4 bytes at the pointer, a local u32. `csr` is
    // the current MXCSR with only FTZ and DAZ changed: no reserved bit is
    // set (which would fault), and DAZ exists on every x86-64 CPU.
    // Rounding and exception masks are untouched, so the compiler's
    // assumptions about the floating-point environment still hold, apart
    // from subnormals becoming zero, which is what is asked for. The
    // compiler does not know that arithmetic depends on MXCSR: without
    // `readonly`/`nomem` the asm at least orders every memory access, and
    // callers set the bits where a thread starts, before any of its work.
    unsafe {
        std::arch::asm!(
            "ldmxcsr [{}]",
            in(reg) &csr,
            options(nostack, preserves_flags),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    /// Runs `f` on a fresh thread: MXCSR changes stay there (libtest may
    /// run tests one after another on one thread).
    fn on_fresh_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
        thread::spawn(f).join().expect("test thread")
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn flushing_sets_ftz_and_daz_and_clearing_clears_them() {
        on_fresh_thread(|| {
            flush_denormals(true);
            assert_eq!(mxcsr() & (FTZ | DAZ), FTZ | DAZ);
            assert!(denormals_flushed());
            flush_denormals(false);
            assert_eq!(mxcsr() & (FTZ | DAZ), 0);
            assert!(!denormals_flushed());
        });
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_flushing_thread_reads_and_writes_subnormals_as_zero() {
        let tiny = f32::from_bits(1); // the smallest subnormal
        let (flushed, ieee) = on_fresh_thread(move || {
            // Through `black_box` both ways: the compiler does not model
            // MXCSR and would otherwise move the arithmetic across the
            // `ldmxcsr` (or fold it).
            let run = || {
                let (a, b) = (std::hint::black_box(tiny), std::hint::black_box(0.5f32));
                // DAZ: tiny reads as 0; FTZ: MIN_POSITIVE · 0.5 is written as 0.
                std::hint::black_box((a + 0.0, f32::MIN_POSITIVE * b))
            };
            flush_denormals(true);
            let flushed = run();
            flush_denormals(false);
            (flushed, run())
        });
        assert_eq!(flushed, (0.0, 0.0));
        assert_eq!(ieee, (tiny, f32::MIN_POSITIVE / 2.0));
    }

    /// Every kind of thread a dtf runtime computes on: the `block_on`
    /// thread, a worker, the blocking pool, and a worker turned blocking
    /// (`block_in_place`, where the worker's step runs).
    fn runtime_threads(on: bool) -> [bool; 4] {
        on_fresh_thread(move || {
            let rt = compute_threads(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all(),
                on,
            )
            .build()
            .expect("runtime");
            rt.block_on(async {
                let spawned = tokio::spawn(async { denormals_flushed() });
                let blocking = tokio::task::spawn_blocking(denormals_flushed);
                let in_place =
                    tokio::spawn(async { tokio::task::block_in_place(denormals_flushed) });
                [
                    denormals_flushed(),
                    spawned.await.expect("task"),
                    blocking.await.expect("task"),
                    in_place.await.expect("task"),
                ]
            })
        })
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_thread_of_a_flushing_runtime_flushes() {
        assert_eq!(runtime_threads(true), [true; 4]);
    }

    #[test]
    fn no_thread_of_a_runtime_told_not_to_flushes() {
        // Cleared even where the parent thread had them set.
        let got = on_fresh_thread(|| {
            flush_denormals(true);
            runtime_threads(false)
        });
        assert_eq!(got, [false; 4]);
    }
}
