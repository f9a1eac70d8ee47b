//! Barriers (PTX ISA §9.7.13.4 `bar`/`barrier`, §9.7.13.3 `bar.warp.sync`), flags between
//! blocks of a grid (release stores and acquire loads at GPU scope, PTX ISA §8), and the
//! dependency between consecutive grids of a stream (`griddepcontrol`, sm_90).

use core::arch::asm;

/// `bar.sync 0` (PTX ISA §9.7.13.4): block-wide barrier that also orders shared and global
/// memory accesses of the block.
///
/// Emitted through LLVM's `llvm.nvvm.barrier0` intrinsic, which LLVM knows to be convergent,
/// not through `asm!`, which it does not: it tail-duplicated an `asm!` barrier into both arms of
/// a branch (`if warp != 0 { stores } sync_threads(); if warp == 0 { sums }` became one branch
/// with a `bar.sync` on each side in 36 W4 and W8A8 kernels), so that warps reached different
/// barrier instructions, which `bar.sync` (`.aligned`) does not allow (PTX ISA §9.7.13.4);
/// within a warp (the TMA probe's `if tid == 0`) that hung. Kernels are also built with
/// `-Zmir-enable-passes=-JumpThreading` so that rustc does not do the same (rust-lang/rust#137086).
///
/// # Safety
/// Every thread of the block must reach this same call (no divergent barriers), or the block
/// hangs.
#[inline(always)]
pub unsafe fn sync_threads() {
    // SAFETY: the caller upholds the convergence contract above.
    unsafe { core::arch::nvptx::_syncthreads() };
}

/// `bar.sync ID, THREADS` (PTX ISA §9.7.13.4): barrier `ID` (1 to 15; 0 is [`sync_threads`]')
/// among `THREADS` threads of the block, which also orders their shared and global memory
/// accesses: a barrier for a subset of the warps, e.g. the consumer warpgroups of a
/// warp-specialized kernel after its producer has left.
///
/// # Safety
/// Exactly `THREADS` threads (whole warps) must reach barrier `ID`, each at the same call, or
/// the block hangs; no other use of barrier `ID` may overlap it.
#[inline(always)]
pub unsafe fn sync_named<const ID: u32, const THREADS: u32>() {
    const { assert!(ID >= 1 && ID < 16 && THREADS % 32 == 0 && THREADS > 0) };
    // SAFETY: the caller upholds the participation contract above.
    unsafe { asm!("bar.sync {}, {};", const ID, const THREADS, options(nostack)) };
}

/// `bar.arrive ID, THREADS` (PTX ISA §9.7.13.4): arrives at barrier `ID` without waiting: the
/// other half of a [`sync_named`] of `THREADS` threads, for one group of warps to let another
/// go on (the consumer warpgroups' turns at the tensor cores).
///
/// # Safety
/// As [`sync_named`]: the arriving and the waiting threads together are exactly `THREADS`
/// (whole warps) per phase of barrier `ID`, and no other use of barrier `ID` overlaps.
#[inline(always)]
pub unsafe fn arrive_named<const ID: u32, const THREADS: u32>() {
    const { assert!(ID >= 1 && ID < 16 && THREADS % 32 == 0 && THREADS > 0) };
    // SAFETY: the caller upholds the participation contract above.
    unsafe { asm!("bar.arrive {}, {};", const ID, const THREADS, options(nostack)) };
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

/// `st.release.gpu.global.u32` (PTX ISA §9.7.9.10, §8.8): stores `value` after every memory
/// access this thread made before it, as seen by any thread of the GPU that reads `value` with
/// [`ld_acquire_gpu_u32`]. After a block barrier ([`sync_threads`]) that covers the block's
/// accesses too (the PTX memory model's causality order is transitive).
///
/// # Safety
/// `ptr` must be a 4-byte aligned pointer to writable global memory.
#[inline(always)]
pub unsafe fn st_release_gpu_u32(ptr: *mut u32, value: u32) {
    // SAFETY: the caller guarantees a valid, aligned global address.
    unsafe { asm!("st.release.gpu.global.u32 [{}], {};", in(reg64) ptr, in(reg32) value, options(nostack)) };
}

/// `ld.acquire.gpu.global.u32` (PTX ISA §9.7.9.8, §8.8): loads the word at `ptr`; the memory
/// accesses after it (and, after a block barrier, the block's) see everything that preceded the
/// [`st_release_gpu_u32`] whose value it read.
///
/// # Safety
/// `ptr` must be a 4-byte aligned pointer to readable global memory.
#[inline(always)]
pub unsafe fn ld_acquire_gpu_u32(ptr: *const u32) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees a valid, aligned global address. Not `pure`: each call
    // must load again.
    unsafe { asm!("ld.acquire.gpu.global.u32 {}, [{}];", out(reg32) v, in(reg64) ptr, options(nostack)) };
    v
}

/// `atom.acq_rel.gpu.global.add.u32` (PTX ISA §9.7.13.5, §8.8): atomically adds `value` to the
/// word at `ptr` and returns the word before. Release and acquire at once: after a block
/// barrier, the block's earlier accesses are seen by whoever reads the sum later with acquire
/// semantics, and this block, after another barrier, sees what the earlier adders published.
///
/// # Safety
/// `ptr` must be a 4-byte aligned pointer to writable global memory.
#[inline(always)]
pub unsafe fn atom_add_acq_rel_gpu_u32(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees a valid, aligned global address; the update is atomic.
    unsafe {
        asm!("atom.acq_rel.gpu.global.add.u32 {}, [{}], {};", out(reg32) old, in(reg64) ptr, in(reg32) value,
             options(nostack))
    };
    old
}

/// `nanosleep.u32` (PTX ISA §9.7.13.5, sm_70): suspends the thread for up to about `ns`
/// nanoseconds, so that a thread polling a flag leaves the issue slots to the others.
#[inline(always)]
pub fn nanosleep<const NS: u32>() {
    // SAFETY: no operands in memory; the thread only pauses.
    unsafe { asm!("nanosleep.u32 {};", const NS, options(nomem, nostack)) };
}

/// `griddepcontrol.launch_dependents` (PTX ISA §9.7.13, parallel synchronization, sm_90): the next grid in the stream,
/// when launched as a programmatic dependent (`Device::launch_overlapping` on the host), may
/// start its blocks now instead of after this grid completes; it still reads nothing of this
/// grid before its [`wait_for_prerequisite_grids`]. Nothing in the portable (sm_80) module,
/// which has no such launches.
#[inline(always)]
pub fn allow_dependent_launch() {
    #[cfg(dlkern_arch_specific)]
    // SAFETY: a scheduling hint; it changes no memory and no control flow of this grid.
    unsafe {
        asm!("griddepcontrol.launch_dependents;", options(nostack))
    };
}

/// `griddepcontrol.wait` (PTX ISA §9.7.13, parallel synchronization, sm_90): waits until the grids this one depends on
/// (the previous one in the stream, when launched as a programmatic dependent) have completed
/// and their memory is visible; immediate otherwise (and on every later call). Everything
/// before it must not read what those grids write. Nothing in the portable (sm_80) module: the
/// host launches programmatic dependents from the sm_90a module only
/// (`Device::launch_overlapping`).
#[inline(always)]
pub fn wait_for_prerequisite_grids() {
    #[cfg(dlkern_arch_specific)]
    // SAFETY: it only waits; as a memory clobber, no access after it moves before it.
    unsafe {
        asm!("griddepcontrol.wait;", options(nostack))
    };
}

/// `setmaxnreg.inc.sync.aligned.u32 N` (PTX ISA §9.7.19.5; sm_90a): raises this warpgroup's
/// registers per thread to `N` (a multiple of 8 in 24..=256), taking them from the pool that
/// other warpgroups gave back with [`release_registers`]; blocks until they are free.
///
/// # Safety
/// Every thread of the warpgroup executes it; the kernel's entry declares its block size
/// (`.maxntid`), and the warpgroups' totals fit the SM's register file.
#[cfg(dlkern_arch_specific)]
#[inline(always)]
pub unsafe fn claim_registers<const N: u32>() {
    const { assert!(N % 8 == 0 && N >= 24 && N <= 256) };
    // SAFETY: the caller guarantees warpgroup convergence and the register budget.
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {};", const N, options(nostack)) };
}

/// `setmaxnreg.dec.sync.aligned.u32 N` (PTX ISA §9.7.19.5; sm_90a): lowers this warpgroup's
/// registers per thread to `N`, returning the rest to the pool [`claim_registers`] draws from.
///
/// # Safety
/// As [`claim_registers`]; the code after it must fit in `N` registers.
#[cfg(dlkern_arch_specific)]
#[inline(always)]
pub unsafe fn release_registers<const N: u32>() {
    const { assert!(N % 8 == 0 && N >= 24 && N <= 256) };
    // SAFETY: the caller guarantees warpgroup convergence and the register budget.
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {};", const N, options(nostack)) };
}
