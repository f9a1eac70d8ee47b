//! Thread-block clusters (Hopper; the `sm_90a` module only): the block's rank in its cluster,
//! the cluster-wide barrier and reads of another block's shared memory (distributed shared
//! memory, PTX ISA §5.1.4.1 `.shared::cluster`).
//!
//! A kernel runs in clusters when its entry carries `.reqnctapercluster` ([`crate::entry_directive`]
//! puts it there); every block of a cluster is resident while any of them runs.

use core::arch::asm;

use super::SharedAddr;
use super::shared::st_shared_v4;
use super::sync::sync_threads;

/// `%cluster_ctarank` (PTX ISA §10.21): this block's rank in its cluster.
#[inline(always)]
pub fn cta_rank() -> u32 {
    let rank: u32;
    // SAFETY: reading a special register has no preconditions.
    unsafe { asm!("mov.u32 {}, %cluster_ctarank;", out(reg32) rank, options(pure, nomem, nostack)) };
    rank
}

/// `%cluster_nctarank` (PTX ISA §10.25): the number of blocks in this block's cluster (1 when
/// the grid was launched without clusters).
#[inline(always)]
pub fn cta_count() -> u32 {
    let count: u32;
    // SAFETY: reading a special register has no preconditions.
    unsafe { asm!("mov.u32 {}, %cluster_nctarank;", out(reg32) count, options(pure, nomem, nostack)) };
    count
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
/// `addr` comes from [`map_shared`] of a 16-byte aligned address inside the shared memory of a
/// block of this cluster that is still running, written before a [`sync`] that both blocks
/// passed.
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

/// Adds `acc` of every block of a cluster of `cluster_size` into block 0's (PTX ISA §5.1.4.1),
/// for the threads that `hold` a part of the sum (the same threads in every block): those of the
/// other blocks store theirs at `slot(i)` of their own shared memory, block 0's read them there; the
/// second cluster barrier keeps the other blocks' shared memory alive until then. Returns
/// whether this block is block 0, the one that holds the sums.
///
/// # Safety
/// Every thread of every block of the cluster must call it with the same `cluster_size` (the
/// cluster's size). `slot(i)` must be a 16-byte aligned address in the block's shared memory,
/// distinct per holding thread and `i < acc.len()` (at most 16), that no copy or `wgmma` still in flight
/// touches.
#[inline(always)]
pub unsafe fn sum_into_rank0(
    acc: &mut [[f32; 4]],
    cluster_size: u32,
    slot: impl Fn(usize) -> SharedAddr,
    holds: bool,
) -> bool {
    // (Inlined, `acc`'s length is a constant: the unrolled loops below keep no check of it, and
    // this bound, which the array form checked at compile time, folds away.)
    let (v, rank) = (acc.len(), cta_rank());
    assert!(v <= 16);
    // SAFETY: the caller's contract: uniform calls, valid slots; the barriers order the stores
    // before block 0's reads and those before the other blocks exit.
    unsafe {
        sync_threads();
        if holds && rank != 0 {
            crate::unroll!(I in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                if I < v {
                    st_shared_v4(slot(I), acc[I].map(f32::to_bits));
                }
            });
        }
        sync();
        if holds && rank == 0 {
            for other in 1..cluster_size {
                crate::unroll!(I in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                    if I < v {
                        let part = ld_shared_v4(map_shared(slot(I), other));
                        crate::unroll!(C in [0, 1, 2, 3] {
                            acc[I][C] += f32::from_bits(part[C]);
                        });
                    }
                });
            }
        }
        sync();
    }
    rank == 0
}
