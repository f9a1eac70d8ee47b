//! Vectorized and read-only global memory accesses (PTX ISA §9.7.9.8 `ld`, §9.7.9.10 `st`).

use core::arch::asm;

/// `ld.global.v4.u32` (PTX ISA §9.7.9.8): one coherent 16-byte load.
///
/// # Safety
/// `ptr` must be a 16-byte aligned pointer to 16 readable bytes of global memory.
#[inline(always)]
pub unsafe fn ld_global_v4(ptr: *const [u32; 4]) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees a valid, aligned global address.
    unsafe {
        asm!("ld.global.v4.u32 {{{}, {}, {}, {}}}, [{}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) ptr,
             options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `ld.global.cg.v4.u32` (PTX ISA §9.7.9.8): one 16-byte load cached in L2 only, never in this
/// SM's L1 (which is not coherent with other SMs' writes): for data another block of the grid
/// wrote while the kernel runs, after an acquire ([`crate::device::sync::ld_acquire_gpu_u32`])
/// that orders it.
///
/// # Safety
/// As [`ld_global_v4`].
#[inline(always)]
pub unsafe fn ld_global_cg_v4(ptr: *const [u32; 4]) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees a valid, aligned global address.
    unsafe {
        asm!("ld.global.cg.v4.u32 {{{}, {}, {}, {}}}, [{}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) ptr,
             options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `ld.global.cg.v2.u32`: [`ld_global_cg_v4`] for 8 bytes.
///
/// # Safety
/// `ptr` must be an 8-byte aligned pointer to readable global memory.
#[inline(always)]
pub unsafe fn ld_global_cg_v2(ptr: *const [u32; 2]) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees a valid, aligned global address.
    unsafe {
        asm!("ld.global.cg.v2.u32 {{{}, {}}}, [{}];", out(reg32) a, out(reg32) b, in(reg64) ptr,
             options(nostack, readonly))
    };
    [a, b]
}

/// `ld.global.nc.v4.u32` (PTX ISA §9.7.9.9): 16 bytes through the read-only data cache.
///
/// # Safety
/// As [`ld_global_v4`], and no thread of the grid may write these bytes while the kernel
/// runs (the non-coherent path would return stale data).
#[inline(always)]
pub unsafe fn ld_global_nc_v4(ptr: *const [u32; 4]) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees a valid, aligned, read-only global address.
    unsafe {
        asm!("ld.global.nc.v4.u32 {{{}, {}, {}, {}}}, [{}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) ptr,
             options(pure, nostack, readonly))
    };
    [a, b, c, d]
}

/// `ld.global.nc.v2.u32`: [`ld_global_nc_v4`] for 8 bytes.
///
/// # Safety
/// As [`ld_global_nc_v4`], with 8-byte alignment.
#[inline(always)]
pub unsafe fn ld_global_nc_v2(ptr: *const [u32; 2]) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees a valid, aligned, read-only global address.
    unsafe {
        asm!("ld.global.nc.v2.u32 {{{}, {}}}, [{}];", out(reg32) a, out(reg32) b, in(reg64) ptr,
             options(pure, nostack, readonly))
    };
    [a, b]
}

/// `ld.global.nc.L1::no_allocate.L2::128B.v4.u32` (PTX ISA §9.7.9.9, PTX 7.4): as
/// [`ld_global_nc_v4`], for data streamed once: the line is not kept in L1 (where it would
/// evict data read many times), and L2 fetches the whole 128-byte line from DRAM at the first
/// miss (the next 64-byte piece of a row is the next step's load). The sm_80 module is PTX 7.0,
/// which lacks both qualifiers: there it is a plain [`ld_global_nc_v4`].
///
/// # Safety
/// As [`ld_global_nc_v4`].
#[inline(always)]
pub unsafe fn ld_global_nc_stream_v4(ptr: *const [u32; 4]) -> [u32; 4] {
    if !cfg!(target_feature = "sm_90") {
        // SAFETY: the caller's contract is that of `ld_global_nc_v4`.
        return unsafe { ld_global_nc_v4(ptr) };
    }
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees a valid, aligned, read-only global address.
    unsafe {
        asm!("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {{{}, {}, {}, {}}}, [{}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg64) ptr,
             options(pure, nostack, readonly))
    };
    [a, b, c, d]
}

/// `ld.global.nc.b16` (PTX ISA §9.7.9.9): one 16-bit value through the read-only data cache.
///
/// # Safety
/// `ptr` must be a 2-byte aligned pointer to readable global memory that no thread of the
/// grid writes while the kernel runs.
#[inline(always)]
pub unsafe fn ld_global_nc_u16(ptr: *const u16) -> u16 {
    let v: u16;
    // SAFETY: the caller guarantees a valid, aligned, read-only global address.
    unsafe { asm!("ld.global.nc.b16 {}, [{}];", out(reg16) v, in(reg64) ptr, options(pure, nostack, readonly)) };
    v
}

/// `ld.global.nc.b32` (PTX ISA §9.7.9.9): one 32-bit value through the read-only data cache.
///
/// # Safety
/// As [`ld_global_nc_u16`], with 4-byte alignment.
#[inline(always)]
pub unsafe fn ld_global_nc_u32(ptr: *const u32) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees a valid, aligned, read-only global address.
    unsafe { asm!("ld.global.nc.b32 {}, [{}];", out(reg32) v, in(reg64) ptr, options(pure, nostack, readonly)) };
    v
}

/// `st.global.v4.u32` (PTX ISA §9.7.9.10): one 16-byte store.
///
/// # Safety
/// `ptr` must be a 16-byte aligned pointer to 16 writable bytes of global memory that no other
/// thread accesses concurrently.
#[inline(always)]
pub unsafe fn st_global_v4(ptr: *mut [u32; 4], v: [u32; 4]) {
    // SAFETY: the caller guarantees a valid, aligned, exclusive global address.
    unsafe {
        asm!("st.global.v4.u32 [{}], {{{}, {}, {}, {}}};",
             in(reg64) ptr, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
             options(nostack))
    };
}

/// `red.global.or.b32` (PTX ISA §9.7.13.6): atomically ORs `bits` into the word at `ptr`.
///
/// # Safety
/// `ptr` must be a 4-byte aligned pointer to writable global memory.
#[inline(always)]
pub unsafe fn red_global_or_u32(ptr: *mut u32, bits: u32) {
    // SAFETY: the caller guarantees a valid, aligned global address; the update is atomic.
    unsafe { asm!("red.global.or.b32 [{}], {};", in(reg64) ptr, in(reg32) bits, options(nostack)) };
}
