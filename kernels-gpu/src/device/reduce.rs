//! Block-wide reductions built on the warp reductions and a shared scratch array.

use super::shared::{ld_shared_f32, st_shared_f32};
use super::{SharedAddr, WARP_SIZE, index, sync, warp};

/// Bytes of shared scratch [`block_sum_f32`] needs: one f32 per warp of a 1024-thread block.
pub const BLOCK_REDUCE_SCRATCH_BYTES: u32 = 32 * 4;

/// Sum of `value` over a one-dimensional block; every thread receives the result.
///
/// # Safety
/// Every thread of the block must call it (it contains barriers); the block size must be a
/// multiple of 32 and at most 1024; `scratch` must be [`BLOCK_REDUCE_SCRATCH_BYTES`] of
/// 4-byte aligned shared memory that nothing else uses during the call. It ends with a
/// barrier, so `scratch` may be reused right after.
#[inline(always)]
pub unsafe fn block_sum_f32(value: f32, scratch: SharedAddr) -> f32 {
    // SAFETY: forwarded contract; the warp sum is reached by whole warps.
    unsafe { block_reduce_f32(value, scratch, 0.0, |v| warp::warp_sum_f32(v)) }
}

/// Maximum of `value` over a one-dimensional block (`f32::max`: NaN only where every value
/// is NaN); every thread receives the result.
///
/// # Safety
/// As [`block_sum_f32`].
#[inline(always)]
pub unsafe fn block_max_f32(value: f32, scratch: SharedAddr) -> f32 {
    // SAFETY: forwarded contract; the warp maximum is reached by whole warps.
    unsafe { block_reduce_f32(value, scratch, f32::NEG_INFINITY, |v| warp::warp_max_f32(v)) }
}

/// Per-warp `warp_reduce`, the partials through `scratch`, then `warp_reduce` over them
/// (`identity` for the lanes past the block's warps).
///
/// # Safety
/// As [`block_sum_f32`]; `warp_reduce` must be safe to call from every lane of a whole warp.
#[inline(always)]
unsafe fn block_reduce_f32(value: f32, scratch: SharedAddr, identity: f32, warp_reduce: impl Fn(f32) -> f32) -> f32 {
    let lane = index::lane_id();
    let warp = index::warp_idx_x();
    let warps = index::block_dim_x() / WARP_SIZE;
    // SAFETY: the caller guarantees that all threads participate and scratch is valid.
    unsafe {
        let partial = warp_reduce(value);
        if lane == 0 {
            st_shared_f32(scratch.offset(warp * 4), partial);
        }
        sync::sync_threads();
        let mine = if lane < warps { ld_shared_f32(scratch.offset(lane * 4)) } else { identity };
        let total = warp_reduce(mine);
        sync::sync_threads();
        total
    }
}
