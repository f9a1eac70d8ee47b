//! Thread-block clusters (Hopper; the `sm_90a` module only): the block's rank in its cluster,
//! the cluster-wide barrier and reads of another block's shared memory (distributed shared
//! memory, PTX ISA §5.1.4.1 `.shared::cluster`).
//!
//! A kernel runs in clusters when its entry carries `.reqnctapercluster` ([`crate::entry_directive`]
//! puts it there); every block of a cluster is resident while any of them runs.

use core::arch::asm;

use super::SharedAddr;

/// `%cluster_ctarank` (PTX ISA §10.21): this block's rank in its cluster.
#[inline(always)]
pub fn cta_rank() -> u32 {
    let rank: u32;
    // SAFETY: reading a special register has no preconditions.
    unsafe { asm!("mov.u32 {}, %cluster_ctarank;", out(reg32) rank, options(pure, nomem, nostack)) };
    rank
}

/// `barrier.cluster.arrive.release.aligned` then `barrier.cluster.wait.acquire.aligned` (PTX
/// ISA §9.7.13.4): every thread of every block of the cluster arrives; the shared-memory
/// writes before it are visible to every block's reads after it.
///
/// # Safety
/// Every thread of every block in the cluster must reach this same call.
#[inline(always)]
pub unsafe fn sync() {
    // SAFETY: the caller upholds the convergence contract.
    unsafe { asm!("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;", options(nostack)) };
}

/// `mapa.shared::cluster.u32` (PTX ISA §9.7.9.21): the `.shared::cluster` address of the
/// variable at `addr` in the shared memory of the cluster's block `rank`.
#[inline(always)]
pub fn map_shared(addr: SharedAddr, rank: u32) -> u32 {
    let mapped: u32;
    // SAFETY: address arithmetic only; nothing is accessed.
    unsafe {
        asm!("mapa.shared::cluster.u32 {}, {}, {};", out(reg32) mapped, in(reg32) addr.0, in(reg32) rank,
             options(pure, nomem, nostack))
    };
    mapped
}

/// `ld.shared::cluster.v4.u32` (PTX ISA §9.7.9.8): 16 bytes of a cluster block's shared memory.
///
/// # Safety
/// `addr` comes from [`map_shared`] of a 16-byte aligned address inside the dynamic shared
/// memory of a block of this cluster that is still running, written before a [`sync`] that
/// both blocks passed.
#[inline(always)]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees a valid, aligned, published address.
    unsafe {
        asm!("ld.shared::cluster.v4.u32 {{{}, {}, {}, {}}}, [{}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) addr, options(nostack))
    };
    [a, b, c, d]
}
