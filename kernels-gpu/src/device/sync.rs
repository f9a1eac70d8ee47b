//! Barriers (PTX ISA §9.7.13.4 `bar`/`barrier`, §9.7.13.3 `bar.warp.sync`).

use core::arch::asm;

/// `bar.sync 0` (PTX ISA §9.7.13.4): block-wide barrier that also orders shared and global
/// memory accesses of the block.
///
/// # Safety
/// Every thread of the block must reach this same call (no divergent barriers), or the block
/// hangs. Kernels are built with `-Zmir-enable-passes=-JumpThreading` so rustc does not
/// duplicate a barrier into divergent branches (rust-lang/rust#137086).
#[inline(always)]
pub unsafe fn sync_threads() {
    // SAFETY: the caller upholds the convergence contract above.
    unsafe { asm!("bar.sync 0;", options(nostack)) };
}

/// `bar.warp.sync 0xffffffff` (PTX ISA §9.7.13.3): converges the full warp and orders its
/// memory accesses.
///
/// # Safety
/// All 32 lanes of the warp must execute this call.
#[inline(always)]
pub unsafe fn sync_warp() {
    // SAFETY: the caller guarantees all lanes participate.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) };
}

/// `bar.red.or.pred` (PTX ISA §9.7.13.4): block-wide barrier that also returns whether any
/// thread passed `true`.
///
/// # Safety
/// As [`sync_threads`].
#[inline(always)]
pub unsafe fn sync_threads_or(flag: bool) -> bool {
    let out: u32;
    // SAFETY: the caller upholds the convergence contract.
    unsafe {
        asm!(
            "{{ .reg .pred p, q; setp.ne.u32 p, {f}, 0; bar.red.or.pred q, 0, p; selp.u32 {o}, 1, 0, q; }}",
            f = in(reg32) flag as u32, o = out(reg32) out, options(nostack)
        )
    };
    out != 0
}

/// No instruction: an empty `asm` (a PTX comment) that LLVM must treat as reading and writing
/// memory, so `values` are computed before it and no memory access moves across it. It orders
/// the PTX LLVM emits, not what ptxas schedules (check the SASS when it matters).
#[inline(always)]
pub fn order_point<const N: usize>(values: &mut [u32; N]) {
    for v in values.iter_mut() {
        // SAFETY: an empty template; it only pins `v` and the memory order.
        unsafe { asm!("/* order point {0} */", inout(reg32) * v, options(nostack, preserves_flags)) };
    }
}
