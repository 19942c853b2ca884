//! What the CPU and the kernel allow, asked once: CPUID, XCR0 and, for
//! AMX, Linux's permission to use the tile data state.
//!
//! `is_x86_feature_detected!` covers AVX-512 (it checks XCR0's ZMM bits
//! too); it does not compile for `amx-tile` on stable Rust
//! (rust-lang/rust#126622), so AMX is asked by hand, as sonos/tract does.

/// Whether the AVX512-BF16 kernel may run: `vdpbf16ps` and the AVX-512
/// foundation it is encoded in, with the OS saving ZMM state.
pub fn avx512bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the AMX kernel may run: CPUID says AMX-TILE and AMX-BF16, the
/// OS enabled the tile state in XCR0, and Linux granted this process the
/// tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`;
/// without it the first tile instruction kills the process with SIGILL).
/// The request is process-wide and inherited by threads; the caller asks once.
pub fn amx() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        use std::arch::x86_64::__cpuid_count;
        // Leaf 7 exists? (leaf 0's EAX is the highest leaf.)
        if __cpuid_count(0, 0).eax < 7 {
            return false;
        }
        let leaf7 = __cpuid_count(7, 0);
        const AMX_BF16: u32 = 1 << 22;
        const AMX_TILE: u32 = 1 << 24;
        if leaf7.edx & (AMX_BF16 | AMX_TILE) != AMX_BF16 | AMX_TILE {
            return false;
        }
        // XGETBV needs OSXSAVE (CPUID.1:ECX bit 27): the OS manages XCR0.
        if __cpuid_count(1, 0).ecx & (1 << 27) == 0 {
            return false;
        }
        // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves tiles.
        const XTILE: u64 = (1 << 17) | (1 << 18);
        if xcr0() & XTILE != XTILE {
            return false;
        }
        request_tile_data()
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// XCR0, the OS-enabled state components.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn xcr0() -> u64 {
    let (eax, edx): (u32, u32);
    // SAFETY: XGETBV with ECX = 0 reads XCR0; the caller checked OSXSAVE,
    // without which it would fault. It touches no memory.
    unsafe {
        std::arch::asm!(
            "xgetbv",
            in("ecx") 0u32,
            out("eax") eax,
            out("edx") edx,
            options(nomem, nostack, preserves_flags),
        );
    }
    (u64::from(edx) << 32) | u64::from(eax)
}

/// Asks Linux for the AMX tile data state; true when granted (or already held).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes a feature number
    // and reads no memory; an old kernel answers EINVAL.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    rc == 0
}
