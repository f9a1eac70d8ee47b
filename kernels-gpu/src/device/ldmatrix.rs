//! Warp-collective 8x8 matrix loads from shared memory (PTX ISA §9.7.14.5.15 `ldmatrix`).
//!
//! Each 8x8 matrix has 8 rows of 16 bytes (8 x b16). Lane `l` supplies the row address of
//! row `l % 8` of matrix `l / 8`; lane `t` receives, for each matrix, the 32-bit pair at
//! row `t / 4`, columns `2 * (t % 4)..+2` (or the transpose with `.trans`). These are exactly
//! the `mma.sync` A/B fragment layouts.

use core::arch::asm;

use super::SharedAddr;

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16` (PTX ISA §9.7.14.5.15): four 8x8 matrices.
///
/// # Safety
/// All 32 lanes must execute it; each lane's `row` must be a 16-byte aligned address of 16
/// readable bytes in shared memory, written before the last barrier.
#[inline(always)]
pub unsafe fn ldmatrix_x4(row: SharedAddr) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees warp convergence and valid row addresses.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{}, {}, {}, {}}}, [{}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) row.0,
             options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `ldmatrix.sync.aligned.m8n8.x2.shared.b16` (PTX ISA §9.7.14.5.15): two 8x8 matrices; lanes
/// 0..16 supply the row addresses.
///
/// # Safety
/// As [`ldmatrix_x4`] (lanes 16..32 must still pass an aligned shared address).
#[inline(always)]
pub unsafe fn ldmatrix_x2(row: SharedAddr) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees warp convergence and valid row addresses.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{{}, {}}}, [{}];",
             out(reg32) a, out(reg32) b, in(reg32) row.0, options(nostack, readonly))
    };
    [a, b]
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16` (PTX ISA §9.7.14.5.15): four transposed
/// 8x8 matrices (a k-major B operand, e.g. V in attention).
///
/// # Safety
/// As [`ldmatrix_x4`].
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(row: SharedAddr) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees warp convergence and valid row addresses.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{}, {}, {}, {}}}, [{}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) row.0,
             options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16` (PTX ISA §9.7.14.5.15): two transposed
/// 8x8 matrices.
///
/// # Safety
/// As [`ldmatrix_x2`].
#[inline(always)]
pub unsafe fn ldmatrix_x2_trans(row: SharedAddr) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees warp convergence and valid row addresses.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{{}, {}}}, [{}];",
             out(reg32) a, out(reg32) b, in(reg32) row.0, options(nostack, readonly))
    };
    [a, b]
}
