//! W4A16 on Hopper's warpgroup tensor cores (`wgmma`, sm_90a module only): the operation of
//! [`crate::matmul_nbits`] for larger M, from the unmodified `MatMulNBits` layout.
//!
//! Per K step of 64: the activations (`[M, K]` f16/bf16, already K-major) and the raw codes go
//! from global to shared memory with `cp.async` (a ring of [`WGMMA_STAGES`] steps); every thread
//! then dequantizes 32 codes of one weight column to `(code - zero) * scale` in A's type, in K
//! order, into a tile in the 128-byte-swizzle layout that `wgmma` reads as its B operand
//! (weights `[N, K]` are K-major too, so nothing is transposed or permuted). The dequantization
//! of step `j + 1` overlaps the tensor cores' work on step `j`: [`WGMMA_B_TILES`] weight tiles
//! rotate (one being written, one being read, one whose `wgmma` may still run, one spare).
//! Both rings have power-of-two lengths, so a slot index is a mask, not a 64-bit division.
//!
//! # Launch contract: `matmul_nbits_{f16,bf16}_wgmma`
//! - grid `(ceil(N / 128), ceil(M / 128), splits)`, block `(256, 1, 1)` (two warpgroups of 64
//!   rows), dynamic shared memory [`WGMMA_SHARED_BYTES`].
//! - zero points none or u8 (`zeros_t` unused), `block_size >= 32`; `K % 8 == 0` and `a`
//!   16-byte aligned; `b` 16-byte aligned with `row_bytes % 16 == 0`.
//! - split `z` covers K chunks (of 128) `[z * chunks_per_split, (z + 1) * chunks_per_split)`;
//!   outputs as in [`crate::matmul_nbits`] (`y` (+ bias) unsplit, else f32 partial sums to
//!   `workspace [splits, M, N]` for `matmul_nbits_reduce_*`).

use crate::device::async_copy::{commit_group, cp_async_16_zfill, wait_group};
use crate::device::bits::{high_halves, low_halves};
use crate::device::memory::ld_global_nc_u16;
use crate::device::shared::{dynamic_shared_base, ld_shared_v4, st_shared_v4};
use crate::device::wgmma::{self, SharedMatrix, fence_proxy_async_shared, pin_accumulators_f32x64};
use crate::device::{index, sync};
use crate::element::{Bf16, F16, TensorElement};
use crate::matmul_nbits::{BlockConsts, dequantize, matmul_nbits_entry, split_chunks, store_tile};
use crate::unroll;

pub use crate::layout::matmul_nbits::*;

const _: () = assert!(WGMMA_BM == 128 && WGMMA_BN == 128 && WGMMA_BK == 64 && WGMMA_THREADS == 256);
const _: () = assert!(WGMMA_STAGES.is_power_of_two() && WGMMA_B_TILES.is_power_of_two() && CHUNK == 2 * WGMMA_BK);
const _: () = assert!(WGMMA_A_STAGE_BYTES % 1024 == 0 && WGMMA_B_TILE_BYTES % 1024 == 0);
const _: () = assert!(WGMMA_CODES_STAGE_BYTES % 1024 == 0);

/// The element types `wgmma` multiplies.
pub(crate) trait WgmmaElement: TensorElement {
    /// Starts `acc += A * B^T` on a 64 x 16 tile of A and a 128 x 16 tile of B.
    ///
    /// # Safety
    /// As [`wgmma::mma_async_m64n128k16_f16`].
    unsafe fn mma_async(acc: &mut [f32; 64], a: SharedMatrix, b: SharedMatrix);
}

impl WgmmaElement for F16 {
    #[inline(always)]
    unsafe fn mma_async(acc: &mut [f32; 64], a: SharedMatrix, b: SharedMatrix) {
        // SAFETY: forwarded contract.
        unsafe { wgmma::mma_async_m64n128k16_f16(acc, a, b) }
    }
}

impl WgmmaElement for Bf16 {
    #[inline(always)]
    unsafe fn mma_async(acc: &mut [f32; 64], a: SharedMatrix, b: SharedMatrix) {
        // SAFETY: forwarded contract.
        unsafe { wgmma::mma_async_m64n128k16_bf16(acc, a, b) }
    }
}

/// A (column, block)'s scale bits and zero-point byte as loaded, and the shift of its nibble.
#[derive(Clone, Copy)]
struct RawConsts {
    scale: u32,
    zero_byte: u32,
    shift: u32,
}

impl RawConsts {
    #[inline(always)]
    fn cook(self) -> BlockConsts {
        BlockConsts {
            scale2: self.scale | (self.scale << 16),
            zero: (self.zero_byte >> self.shift) & 15,
            zero_f: 0.0,
            scale_f: 0.0,
        }
    }
}

/// # Safety
/// The launch contract in the module docs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_nbits_wgmma<T: WgmmaElement>(
    a: *const T,
    b: *const u8,
    scales: *const T,
    zeros_u8: *const u8,
    bias: *const T,
    y: *mut T,
    workspace: *mut f32,
    p: Dims,
) {
    let tid = index::thread_idx_x() as usize;
    let (group, warp_in_group, lane) = (tid / 128, (tid / 32) % 4, index::lane_id() as usize);
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let row_bytes = p.row_bytes as usize;
    let m0 = index::block_idx_y() as usize * WGMMA_BM;
    let n0 = index::block_idx_x() as usize * WGMMA_BN;
    // This split's K steps (two per chunk of 128).
    let (first_chunk, end_chunk) = split_chunks(&p);
    let (step_lo, step_hi) = (2 * first_chunk, (2 * end_chunk).min(k.div_ceil(WGMMA_BK)));
    let steps = step_hi.saturating_sub(step_lo);

    let base = SharedMatrix::atom_aligned(dynamic_shared_base());
    let a_s = |slot: usize| base.offset((slot * WGMMA_A_STAGE_BYTES) as u32);
    let codes_base = base.offset((WGMMA_STAGES * WGMMA_A_STAGE_BYTES) as u32);
    let codes_s = |slot: usize| codes_base.offset((slot * WGMMA_CODES_STAGE_BYTES) as u32);
    let b_base = codes_base.offset((WGMMA_STAGES * WGMMA_CODES_STAGE_BYTES) as u32);
    let b_s = |tile: usize| b_base.offset((tile * WGMMA_B_TILE_BYTES) as u32);

    // The column and half step (32 codes) this thread copies and dequantizes.
    let (col, half) = (tid / 2, tid % 2);
    let col_ok = n0 + col < n;

    let mut acc = [0.0f32; 64];
    // Zeroed here, once, on every path: `ptxas` serializes the `wgmma`s (C7515) when it sees
    // the zeroing on a path to the final wait, as it may without this.
    pin_accumulators_f32x64(&mut acc);
    // SAFETY (whole body): the launch contract sizes every buffer; copies stay inside rows of A
    // and B (zero-filled past M, N, K and the row end); scales are read only for existing
    // (column, block) pairs; barriers and warpgroup instructions are reached by all threads.
    unsafe {
        // Local step `j` (global `step_lo + j`) into ring slot `j % WGMMA_STAGES`.
        let load = |j: usize| {
            let (slot, k0) = (j % WGMMA_STAGES, (step_lo + j) * WGMMA_BK);
            unroll!(U in [0, 1, 2, 3] {
                const { assert!(WGMMA_BM * 8 == 4 * WGMMA_THREADS) };
                let c = tid + U * WGMMA_THREADS;
                let (row, chunk) = (c / 8, c % 8);
                let kk = k0 + 8 * chunk;
                let ok = m0 + row < m && kk < k; // K % 8 == 0: a chunk is all in or all out
                let from = if ok { a.add((m0 + row) * k + kk) } else { a };
                cp_async_16_zfill(a_s(slot).offset(SharedMatrix::swizzle128_offset(row, chunk)), from.cast(), if ok { 16 } else { 0 });
            });
            let at = k0 / 2 + 16 * half;
            let ok = col_ok && at < row_bytes; // row_bytes % 16 == 0
            let from = if ok { b.add((n0 + col) * row_bytes + at) } else { b };
            cp_async_16_zfill(codes_s(slot).offset((32 * col + 16 * half) as u32), from, if ok { 16 } else { 0 });
        };
        // This thread's constants of local step `j` (32 codes lie in one block: blocks >= 32),
        // as loaded: they are loaded two steps before their use and only then turned into
        // `BlockConsts`, so that no arithmetic waits on the load in the step that issues it.
        let raw_consts = |j: usize| {
            let blk = ((step_lo + j) * WGMMA_BK + 32 * half) >> p.block_shift;
            if j < steps && col_ok && (blk as u32) < p.k_blocks {
                let col = n0 + col;
                let scale = ld_global_nc_u16(scales.add(col * p.k_blocks as usize + blk).cast()) as u32;
                let zero_byte = if p.flags & FLAG_ZERO_U8 != 0 {
                    zeros_u8.add(col * (p.k_blocks as usize).div_ceil(2) + blk / 2).read() as u32
                } else {
                    0x88 // 8 in both nibbles: no zero points
                };
                RawConsts { scale, zero_byte, shift: 4 * (blk as u32 % 2) }
            } else {
                RawConsts { scale: 0, zero_byte: 0x88, shift: 0 }
            }
        };
        // Local step `j`'s codes of this thread to `(code - zero) * scale` in K order, into
        // weight tile `j % WGMMA_B_TILES`.
        let dequantize_step = |j: usize, c: BlockConsts| {
            let words = ld_shared_v4(codes_s(j % WGMMA_STAGES).offset((32 * col + 16 * half) as u32));
            unroll!(I in [0, 1, 2, 3] {
                // Pairs (0,4) (1,5) (2,6) (3,7) of the word's codes, reordered to (0,1) ... (6,7).
                let d = dequantize::<T>(words[I], c, false);
                let pairs = [low_halves(d[0], d[1]), low_halves(d[2], d[3]), high_halves(d[0], d[1]), high_halves(d[2], d[3])];
                st_shared_v4(b_s(j % WGMMA_B_TILES).offset(SharedMatrix::swizzle128_offset(col, 4 * half + I)), pairs);
            });
        };

        // Copies run WGMMA_STAGES - 2 steps ahead of the dequantization.
        const AHEAD: usize = WGMMA_STAGES - 2;
        unroll!(S in [0, 1, 2, 3, 4, 5] {
            const { assert!(AHEAD == 6) };
            if S < steps {
                load(S);
            }
            commit_group();
        });
        let first = raw_consts(0);
        let (mut ahead1, mut ahead2) = (raw_consts(1), raw_consts(2));
        wait_group::<{ AHEAD as u32 - 1 }>();
        sync::sync_threads();
        if steps > 0 {
            dequantize_step(0, first.cook());
        }
        fence_proxy_async_shared();

        for j in 0..steps {
            // Step j + 1's copies landed (fenced for the tensor cores); weight tile j is
            // written and fenced by every thread; every warpgroup is done with step j - 2.
            wait_group::<{ AHEAD as u32 - 2 }>();
            fence_proxy_async_shared();
            sync::sync_threads();
            let a_desc =
                SharedMatrix::k_major_swizzle128(a_s(j % WGMMA_STAGES).offset((group * 64 * WGMMA_BK * 2) as u32));
            let b_desc = SharedMatrix::k_major_swizzle128(b_s(j % WGMMA_B_TILES));
            wgmma::fence();
            unroll!(KS in [0, 1, 2, 3] {
                T::mma_async(&mut acc, a_desc.advance_k(32 * KS as u32), b_desc.advance_k(32 * KS as u32));
            });
            wgmma::commit_group();
            // While the tensor cores run: weight tile j + 1 (its last reader, step j - 2, is
            // done), then the copies of step j + AHEAD into the slot step j - 2 used.
            if j + 1 < steps {
                dequantize_step(j + 1, ahead1.cook());
            }
            (ahead1, ahead2) = (ahead2, raw_consts(j + 3));
            fence_proxy_async_shared();
            if j + AHEAD < steps {
                load(j + AHEAD);
            }
            commit_group();
            wgmma::wait_group::<1>();
        }
        wgmma::wait_group::<0>();
        pin_accumulators_f32x64(&mut acc);

        // Register 4 t + c: row 16 w + l / 4 + 8 (c / 2), column 8 t + 2 (l % 4) + c % 2, the
        // `mma.sync` C layout of 16 column tiles, which `store_tile` writes 8 at a time.
        let (mut lo, mut hi) = ([[0.0f32; 4]; 8], [[0.0f32; 4]; 8]);
        unroll!(TILE in [0, 1, 2, 3, 4, 5, 6, 7] {
            unroll!(C in [0, 1, 2, 3] {
                lo[TILE][C] = acc[4 * TILE + C];
                hi[TILE][C] = acc[32 + 4 * TILE + C];
            });
        });
        let row0 = m0 + group * 64 + warp_in_group * 16;
        store_tile::<T, 8>(&lo, row0, n0, lane, bias, y, workspace, &p);
        store_tile::<T, 8>(&hi, row0, n0 + 64, lane, bias, y, workspace, &p);
    }
}

matmul_nbits_entry!(matmul_nbits_f16_wgmma, F16, |a, b, s, z, _zt, bias, y, ws, d| {
    matmul_nbits_wgmma::<F16>(a, b, s, z, bias, y, ws, d)
});
matmul_nbits_entry!(matmul_nbits_bf16_wgmma, Bf16, |a, b, s, z, _zt, bias, y, ws, d| {
    matmul_nbits_wgmma::<Bf16>(a, b, s, z, bias, y, ws, d)
});
