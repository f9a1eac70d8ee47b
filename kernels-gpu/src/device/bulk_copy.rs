//! Bulk copies from global to shared memory by the copy engine of Hopper's SMs (PTX ISA
//! §9.7.9.25.4 `cp.async.bulk`, sm_90): one instruction moves a contiguous run of bytes, and
//! the destination's `mbarrier` counts the bytes as they land (`complete_tx`), so the waiting
//! threads need no arrival per copy ([`super::mbarrier::arrive_expect_tx`] announces the bytes).
//! The copies run in the async proxy: `wgmma` may read what they wrote once the barrier's phase
//! completes, with no proxy fence.

use core::arch::asm;

use super::SharedAddr;

/// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [bar]`
/// (PTX ISA §9.7.9.25.4.1): copies `bytes` from `src` to this block's shared memory at `dst`;
/// as they land, `bar` (this block's) counts them against its current phase's transactions.
///
/// # Safety
/// `dst` and `src` 16-byte aligned, `bytes` a multiple of 16; `src` points to `bytes` readable
/// bytes of global memory that no grid writes meanwhile; nothing reads or writes `dst` until
/// `bar`'s phase completes; `bar` is initialized and its phase expects the bytes.
#[inline(always)]
pub unsafe fn global_to_shared(dst: SharedAddr, src: *const u8, bytes: u32, bar: SharedAddr) {
    // SAFETY: the caller guarantees the addresses, the size and the barrier's expectation.
    unsafe {
        asm!(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{}], [{}], {}, [{}];",
            in(reg32) dst.0, in(reg64) src, in(reg32) bytes, in(reg32) bar.0, options(nostack)
        )
    };
}
