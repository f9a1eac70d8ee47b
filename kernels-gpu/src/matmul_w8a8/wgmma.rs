//! W8A8 matmul on Hopper's warpgroup tensor cores (`wgmma`, sm_90a module only): the same
//! operation and epilogue as [`crate::matmul_w8a8`]'s tiled kernel, for large M.
//!
//! Both operands are K-major int8, which is the only layout `wgmma` takes for integers: tiles go
//! from global to shared memory with `cp.async` into the 128-byte-swizzle layout (each 128-byte
//! row of K holds its 16-byte chunks in the order `chunk ^ (row % 8)`, so neither the copies
//! nor the tensor cores' reads conflict on banks), and `wgmma` reads them from there through
//! descriptors. Each warpgroup keeps 64 x 256 int32 accumulators in registers.
//!
//! # Launch contract: `matmul_w8a8_wgmma_{f16,bf16,f32,partial}`
//! - grid `(ceil(M / 128) * ceil(N / 256), 1, 1)` (the block order is grouped, see
//!   [`WGMMA_GROUP_M`]), block `(256, 1, 1)` (two warpgroups), dynamic shared memory
//!   [`WGMMA_SHARED_BYTES`].
//! - `K % 16 == 0`, `a` and `w` 16-byte aligned (`flags & FLAG_VEC16` set).
//! - `a_scale`, `w_scale`, `bias` and the other flags as in [`crate::matmul_w8a8`].
//! - grid `z` splits K: block `(x, 0, z)` covers K steps of [`WGMMA_BK`] bytes `[z *
//!   k_tiles_per_split, (z + 1) * k_tiles_per_split)` (note: in units of `WGMMA_BK`, not
//!   `BK`). `matmul_w8a8_wgmma_partial` (same contract) writes each split's int32 sums to
//!   `workspace [splits, M, N]` instead of `y`, for `matmul_w8a8_reduce_*`.

use super::{store_output, w8a8_entry};
use crate::device::async_copy::{commit_group, cp_async_16_zfill, wait_group};
use crate::device::shared::dynamic_shared_base;
use crate::device::wgmma::{self, SharedMatrix, fence_proxy_async_shared, mma_async_m64n256k32_s8, pin_accumulators};
use crate::device::{SharedAddr, index, sync};
use crate::element::{Bf16, Element, F16};
use crate::unroll;

pub use super::layout::*;

/// 16-byte chunks per 128-byte row of a stage.
const ROW_CHUNKS: usize = WGMMA_BK / 16;
/// `wgmma` K steps (32 bytes each) per stage.
const K_STEPS: usize = WGMMA_BK / 32;
const _: () = assert!(WGMMA_BK == 128 && WGMMA_THREADS == 256 && WGMMA_BM == 128 && WGMMA_BN == 256);
const _: () = assert!(WGMMA_STAGES >= 3);
const _: () = assert!(WGMMA_A_STAGE_BYTES % 1024 == 0 && WGMMA_B_STAGE_BYTES % 1024 == 0);

/// Copies rows `[0, valid)` of a `ROWS` x 128-byte K slice (`src` at the tile's first row and K
/// offset `k0`, rows `k` bytes apart) into the swizzled layout at `dst`, zero-filling rows past
/// `valid` and bytes past `k`; all 256 threads. Eight consecutive threads copy one row.
///
/// # Safety
/// `src` must be a global address with rows `[0, valid)` readable up to byte `k`, `k % 16 == 0`
/// and 16-byte aligned rows.
#[inline(always)]
unsafe fn load_swizzled<const ROWS: usize>(dst: SharedAddr, src: *const i8, valid: usize, k0: usize, k: usize) {
    let tid = index::thread_idx_x() as usize;
    let mut c = tid;
    while c < ROWS * ROW_CHUNKS {
        let (row, chunk) = (c / ROW_CHUNKS, c % ROW_CHUNKS);
        let kk = k0 + 16 * chunk;
        let ok = row < valid && kk < k; // k % 16 == 0: a chunk is all in or all out
        let at = dst.offset(SharedMatrix::swizzle128_offset(row, chunk));
        // SAFETY: only rows below `valid` and bytes below `k` are read; a zero-byte copy reads
        // nothing.
        unsafe {
            let from = if ok { src.add(row * k + kk) } else { src };
            cp_async_16_zfill(at, from.cast(), if ok { 16 } else { 0 });
        }
        c += WGMMA_THREADS;
    }
}

/// The block's output tile `(tile_m, tile_n)`: blocks in runs of [`WGMMA_GROUP_M`] row tiles,
/// column tiles outer within a run.
#[inline(always)]
fn tile_of_block(block: usize, tiles_m: usize, tiles_n: usize) -> (usize, usize) {
    use core::num::NonZeroUsize;
    // Both at least 1 for a block that exists; NonZero keeps division-by-zero panic paths out.
    let nonzero = |x: usize| NonZeroUsize::new(x).unwrap_or(NonZeroUsize::MIN);
    let per_group = nonzero(WGMMA_GROUP_M * tiles_n);
    let first_m = block / per_group * WGMMA_GROUP_M;
    let group_m = nonzero(tiles_m.saturating_sub(first_m).min(WGMMA_GROUP_M));
    let within = block % per_group;
    (first_m + within % group_m, within / group_m)
}

/// # Safety
/// The launch contract in the module docs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_w8a8_wgmma<T: Element, const PARTIAL: bool>(
    a: *const i8,
    w: *const i8,
    a_scale: *const f32,
    w_scale: *const f32,
    bias: *const f32,
    y: *mut T,
    workspace: *mut i32,
    p: Dims,
) {
    let tid = index::thread_idx_x() as usize;
    let (group, warp_in_group, lane) = (tid / 128, (tid / 32) % 4, index::lane_id() as usize);
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let (tiles_m, tiles_n) = (m.div_ceil(WGMMA_BM), n.div_ceil(WGMMA_BN));
    let (tile_m, tile_n) = tile_of_block(index::block_idx_x() as usize, tiles_m, tiles_n);
    let (m0, n0) = (tile_m * WGMMA_BM, tile_n * WGMMA_BN);
    let (a_rows, w_rows) = (m.saturating_sub(m0).min(WGMMA_BM), n.saturating_sub(n0).min(WGMMA_BN));
    let ring = SharedMatrix::atom_aligned(dynamic_shared_base());
    let stage_bytes = WGMMA_A_STAGE_BYTES + WGMMA_B_STAGE_BYTES;
    let a_s = |stage: usize| ring.offset((stage * stage_bytes) as u32);
    let w_s = |stage: usize| ring.offset((stage * stage_bytes + WGMMA_A_STAGE_BYTES) as u32);
    // This block's K steps: all of them, or one split's share (possibly none: it then writes
    // zeros, which the reduction adds).
    let split = index::block_idx_z() as usize;
    let per_split = (p.k_tiles_per_split as usize).max(1);
    let kt_lo = split * per_split;
    let kt_hi = k.div_ceil(WGMMA_BK).min(kt_lo + per_split);
    let k_tiles = kt_hi.saturating_sub(kt_lo);

    let mut acc = [0i32; 128];
    // SAFETY (whole body): the launch contract sizes every buffer; copies stay inside the rows
    // and K of the operands; barriers and warpgroup instructions are reached by all threads
    // (every bound depends only on the block).
    unsafe {
        let (a_blk, w_blk) = (a.add(m0 * k), w.add(n0 * k));
        // Local K step `j` of this block (global `kt_lo + j`) into ring stage `j % WGMMA_STAGES`.
        let load = |j: usize| {
            let (stage, k0) = (j % WGMMA_STAGES, (kt_lo + j) * WGMMA_BK);
            load_swizzled::<WGMMA_BM>(a_s(stage), a_blk, a_rows, k0, k);
            load_swizzled::<WGMMA_BN>(w_s(stage), w_blk, w_rows, k0, k);
        };
        // Stages in flight ahead of the one being multiplied: the ring holds those, the
        // current one, and the previous one (its `wgmma` may still be reading it).
        const AHEAD: usize = WGMMA_STAGES - 2;
        unroll!(S in [0, 1] {
            const { assert!(AHEAD == 2) };
            if S < k_tiles {
                load(S);
            }
            commit_group();
        });
        for j in 0..k_tiles {
            // Step j landed (only the newest group may still be in flight), is visible to the
            // tensor cores, and every warpgroup is done with step j - 2 (each waited for all
            // but its newest `wgmma` group before this barrier).
            wait_group::<{ AHEAD as u32 - 1 }>();
            fence_proxy_async_shared();
            sync::sync_threads();
            let stage = j % WGMMA_STAGES;
            let a_desc = SharedMatrix::k_major_swizzle128(a_s(stage).offset((group * 64 * WGMMA_BK) as u32));
            let w_desc = SharedMatrix::k_major_swizzle128(w_s(stage));
            wgmma::fence();
            unroll!(KS in [0, 1, 2, 3] {
                const { assert!(K_STEPS == 4) };
                mma_async_m64n256k32_s8(&mut acc, a_desc.advance_k(32 * KS as u32), w_desc.advance_k(32 * KS as u32), true);
            });
            wgmma::commit_group();
            if j + AHEAD < k_tiles {
                load(j + AHEAD);
            }
            commit_group();
            wgmma::wait_group::<1>();
        }
        wgmma::wait_group::<0>();
        pin_accumulators(&mut acc);

        // Epilogue: register 4 j + c holds row 16 w + l / 4 + 8 (c / 2), column 8 j + 2 (l % 4) +
        // c % 2. The split-K build writes its exact int32 sums instead.
        let ws = workspace.wrapping_add(split * m * n);
        let row0 = m0 + group * 64 + warp_in_group * 16 + lane / 4;
        let col0 = n0 + 2 * (lane % 4);
        // Constant indices only: a run-time index would move `acc` to local memory.
        unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
            const { assert!(WGMMA_BN / 8 == 32) };
            unroll!(C in [0, 1, 2, 3] {
                let (row, col) = (row0 + 8 * (C / 2), col0 + 8 * J + C % 2);
                if row < m && col < n {
                    if PARTIAL {
                        ws.add(row * n + col).write(acc[4 * J + C]);
                    } else {
                        store_output(acc[4 * J + C], row, col, a_scale, w_scale, bias, y, p);
                    }
                }
            });
        });
    }
}

w8a8_entry!(matmul_w8a8_wgmma_f16, F16, matmul_w8a8_wgmma::<F16, false>);
w8a8_entry!(matmul_w8a8_wgmma_bf16, Bf16, matmul_w8a8_wgmma::<Bf16, false>);
w8a8_entry!(matmul_w8a8_wgmma_f32, f32, matmul_w8a8_wgmma::<f32, false>);
// One K split's int32 partial sums (`y` unused).
w8a8_entry!(matmul_w8a8_wgmma_partial, f32, matmul_w8a8_wgmma::<f32, true>);
