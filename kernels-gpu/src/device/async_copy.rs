//! Asynchronous global-to-shared copies (PTX ISA §9.7.9.25 `cp.async`, sm_80+).

use core::arch::asm;

use super::SharedAddr;

/// `cp.async.cg.shared.global [dst], [src], 16` (PTX ISA §9.7.9.25.3): starts a 16-byte copy
/// that bypasses L1. Complete it with [`commit_group`] and [`wait_group`].
///
/// # Safety
/// `dst` and `src` must be 16-byte aligned; `src` must point to 16 readable bytes of global
/// memory; nothing may read `dst` before the copy's group is waited for.
#[inline(always)]
pub unsafe fn cp_async_16(dst: SharedAddr, src: *const u8) {
    // SAFETY: the caller guarantees valid, aligned addresses.
    unsafe { asm!("cp.async.cg.shared.global [{}], [{}], 16;", in(reg32) dst.0, in(reg64) src, options(nostack)) };
}

/// `cp.async.cg.shared.global [dst], [src], 16, src_bytes` (PTX ISA §9.7.9.25.3): copies the
/// first `src_bytes` (0..=16) bytes and zero-fills the rest, so a tile edge can be loaded
/// without reading past the end of a tensor.
///
/// # Safety
/// As [`cp_async_16`], except that only `src_bytes` bytes at `src` need be readable (none when
/// `src_bytes` is 0, though `src` must still be a global address).
#[inline(always)]
pub unsafe fn cp_async_16_zfill(dst: SharedAddr, src: *const u8, src_bytes: u32) {
    // SAFETY: the caller guarantees valid, aligned addresses and a readable prefix.
    unsafe {
        asm!("cp.async.cg.shared.global [{}], [{}], 16, {};",
             in(reg32) dst.0, in(reg64) src, in(reg32) src_bytes, options(nostack))
    };
}

/// `cp.async.commit_group` (PTX ISA §9.7.9.25.4): closes the group of copies issued so far by
/// this thread.
#[inline(always)]
pub fn commit_group() {
    // SAFETY: committing an (even empty) group has no preconditions.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// `cp.async.wait_group N` (PTX ISA §9.7.9.25.5): waits until at most `PENDING` of this
/// thread's committed groups are still in flight. Other threads' copies need a barrier too.
#[inline(always)]
pub fn wait_group<const PENDING: u32>() {
    // SAFETY: waiting has no preconditions.
    unsafe { asm!("cp.async.wait_group {};", const PENDING, options(nostack)) };
}

/// `cp.async.mbarrier.arrive.noinc.shared::cta.b64 [bar]` (PTX ISA §9.7.9.25.3.3): makes `bar`
/// track this thread's earlier `cp.async`s: once they have all landed, one arrival on its
/// current phase. `.noinc`: the arrival counts against the barrier's expected count (which must
/// include it). The waiting thread then sees the copied data (an acquire on the phase).
///
/// # Safety
/// `bar` is an initialized `mbarrier` in shared memory whose current phase expects this
/// arrival.
#[inline(always)]
pub unsafe fn arrive_when_landed(bar: SharedAddr) {
    // SAFETY: the caller guarantees an initialized barrier expecting this arrival.
    unsafe { asm!("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [{}];", in(reg32) bar.0, options(nostack)) };
}
