//! Thread, block and grid coordinates (PTX ISA §10 "Special Registers").
//!
//! These read special registers and are always safe to call from device code.

use core::arch::asm;
use core::arch::nvptx;

/// `%tid.x` (PTX ISA §10.1).
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

/// `%tid.y` (PTX ISA §10.1).
#[inline(always)]
pub fn thread_idx_y() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_y() as u32 }
}

/// `%ntid.x` (PTX ISA §10.2).
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_dim_x() as u32 }
}

/// `%ntid.y` (PTX ISA §10.2).
#[inline(always)]
pub fn block_dim_y() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_dim_y() as u32 }
}

/// `%ctaid.x` (PTX ISA §10.6).
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_x() as u32 }
}

/// `%ctaid.y` (PTX ISA §10.6).
#[inline(always)]
pub fn block_idx_y() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_y() as u32 }
}

/// `%ctaid.z` (PTX ISA §10.6).
#[inline(always)]
pub fn block_idx_z() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_z() as u32 }
}

/// `%nctaid.x` (PTX ISA §10.7).
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// `%nctaid.y` (PTX ISA §10.7).
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_y() as u32 }
}

/// `%laneid` (PTX ISA §10.3): this thread's lane within its warp, 0..32.
#[inline(always)]
pub fn lane_id() -> u32 {
    let lane: u32;
    // SAFETY: reading a special register has no preconditions.
    unsafe { asm!("mov.u32 {}, %laneid;", out(reg32) lane, options(pure, nomem, nostack)) };
    lane
}

/// Index of this thread's warp within a one-dimensional block.
#[inline(always)]
pub fn warp_idx_x() -> u32 {
    thread_idx_x() / super::WARP_SIZE
}

/// `%nctaid.z` (PTX ISA §10.7).
#[inline(always)]
pub fn grid_dim_z() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_z() as u32 }
}
