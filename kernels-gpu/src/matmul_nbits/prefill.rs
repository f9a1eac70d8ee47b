//! W4A16 for large M on Hopper (`wgmma`, sm_90a module only), warp-specialized: the operation
//! of [`super`] from the unmodified `MatMulNBits` layout and the permuted copy of A, as
//! [`super::wgmma`] computes it (the same operands, K order, dequantization and sums), on a
//! block tile twice as wide and with the copies taken off the threads that multiply.
//!
//! A block is three warpgroups, as FlashAttention-3 divides the work. Warpgroup 0, the
//! producer, gives up registers (`setmaxnreg`) and one of its threads fills a ring of
//! [`PREFILL_STAGES`] K chunks of 128 with the chunk's [`PREFILL_BM`] rows of permuted
//! activations, which `permute_image` laid out in global memory as the stage's image (two 64-K
//! halves in the 128-byte swizzle `wgmma` reads): one bulk copy per stage, which the stage's
//! `mbarrier` counts in bytes. Warpgroups 1 and 2, the consumers, own 64 weight rows each: per
//! chunk, `m64n256k16` on all of the block's rows of A with the weights as the register
//! operand, while they dequantize the next chunk's codes into a second set of fragments (as
//! `wgmma` does), then release the chunk before last's stage to the producer. With 256 rows of
//! A per `wgmma` instead of 128, each dequantized weight feeds twice the multiply-adds; no
//! consumer waits at a block barrier.
//!
//! Each consumer thread copies its own codes (its 16 bytes of each of its two weight rows per
//! chunk, `cp.async`, [`PREFILL_CODE_SLOTS`] chunks ahead of use in a ring of its own): the
//! thread that reads a code slot is the one that refills it, so reusing a slot needs no
//! barrier, and the stages' barriers order only bulk copies against `wgmma` reads.
//!
//! (A cluster of two column tiles sharing each stage's activations by multicast ran 11-14% slower
//! than this kernel on an H100, 2026-12-06; it was removed.)
//!
//! # Launch contract: `matmul_nbits_prefill_{f16,bf16}`
//! - `a` is the image of the permuted A (`matmul_nbits_permute_image_*`), 16-byte aligned.
//! - grid `(ceil(N / 128), ceil(M / 256), 1)`; block `(384, 1, 1)` (`.maxntid`), dynamic
//!   shared memory [`PREFILL_SHARED_BYTES`] (over 48 KiB: the launcher raises the function's
//!   limit).
//! - zero points none or u8 (`zeros_t` unused), `block_size >= 32`; `matmul_nbits_prefill_any_*`:
//!   zero points in A's type at any block size, or blocks of 16 with any zero points (the `_any`
//!   dequantization of [`super::wgmma`]), their constants cooked by `matmul_nbits_cook_consts`
//!   (`layout::cooked_consts_bytes`): its words as `scales` (4-byte aligned), its bytes as
//!   `zeros_u8`, `zeros_t` unused. `b` 16-byte aligned with
//!   `row_bytes % 16 == 0`. K is not split (`chunks_per_split` unused); writes `y` (+ bias),
//!   `workspace` unused.
//! - may be launched as a programmatic dependent of the `permute_image` grid writing `a`:
//!   every thread waits for it (`griddepcontrol.wait`) before it reads `a` or writes anything
//!   (the consumers copy the first chunks' codes before).

use super::common::alternate_chunks;
use super::layout::*;
use super::wgmma::{ChunkConsts, Fragments, LaneConsts, dequantize_fragments};
use crate::device::async_copy::{commit_group, cp_async_16_zfill, wait_group};
use crate::device::bulk_copy;
use crate::device::memory::st_global_v4;
use crate::device::shared::{dynamic_shared_base, ld_shared_v4, st_shared_u16};
use crate::device::wgmma::{self, SharedMatrix, mma_async_k16_register_a, pin_accumulators_f32};
use crate::device::{index, mbarrier, sync};
use crate::element::TensorElement;
use crate::unroll;

const _: () = assert!(PREFILL_BM == 256 && PREFILL_BN == 128 && PREFILL_THREADS == 384 && CHUNK == 128);
const _: () = assert!(PREFILL_A_HALF_BYTES % 1024 == 0 && PREFILL_CODES_STAGE_BYTES % 1024 == 0);
// A consumer refills the code slot of chunk `j - 1` with chunk `j + 3` (see `chunk_step`).
const _: () = assert!(PREFILL_CODE_SLOTS == 4);

/// Threads of the producer warpgroup, and of each consumer.
const GROUP_THREADS: usize = 128;
/// The consumers' threads: those that read codes.
const CONSUMER_THREADS: usize = 2 * GROUP_THREADS;

/// Registers per thread after the hand-over: the producer's and the consumers'
/// (128 x 40 + 256 x 232 <= 65536).
const PRODUCER_REGISTERS: u32 = 40;
const CONSUMER_REGISTERS: u32 = 232;

/// Consumer warps, each of which releases a stage with one arrival.
const CONSUMER_WARPS: u32 = (CONSUMER_THREADS / 32) as u32;
/// Bytes per row of the output tile staged in shared memory: 128 columns and 16 bytes of
/// padding (the ring's first 68 KiB hold the 256 rows).
const STAGED_ROW_BYTES: usize = 2 * PREFILL_BN + 16;
const _: () = assert!(PREFILL_BM * STAGED_ROW_BYTES <= PREFILL_STAGES * PREFILL_A_STAGE_BYTES);

/// # Safety
/// The launch contract in the module docs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_nbits_prefill<T: TensorElement, const BF16: bool, const ANY_FORMAT: bool>(
    a_image: *const T,
    b: *const u8,
    scales: *const T,
    zeros_u8: *const u8,
    zeros_t: *const T,
    bias: *const T,
    y: *mut T,
    _workspace: *mut f32,
    p: Dims,
) {
    const STAGES: u32 = PREFILL_STAGES as u32;
    const CODE_SLOTS: u32 = PREFILL_CODE_SLOTS as u32;
    let tid = index::thread_idx_x() as usize;
    let warpgroup = tid / GROUP_THREADS;
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let chunks = k.div_ceil(CHUNK) as u32;
    let (m0, n0) = (index::block_idx_y() as usize * PREFILL_BM, index::block_idx_x() as usize * PREFILL_BN);

    let base = SharedMatrix::atom_aligned(dynamic_shared_base());
    let a_s = |slot: u32| base.offset(slot * PREFILL_A_STAGE_BYTES as u32);
    let codes_base = base.offset((PREFILL_STAGES * PREFILL_A_STAGE_BYTES) as u32);
    let codes_s = |slot: u32| codes_base.offset(slot * PREFILL_CODES_STAGE_BYTES as u32);
    // Per stage: `full` completes a phase when a chunk's activations have landed (the
    // producer announces their bytes), `empty` when every consumer warp is done with the chunk
    // (its `wgmma`s complete). Chunk `c` uses phase `c / STAGES` of stage `c % STAGES`.
    let barriers = codes_base.offset((PREFILL_CODE_SLOTS * PREFILL_CODES_STAGE_BYTES) as u32);
    let full = |slot: u32| barriers.offset(8 * slot);
    let empty = |slot: u32| barriers.offset(8 * (STAGES + slot));
    let parity = |c: u32| (c / STAGES) & 1;
    // This tile's stage images: `PREFILL_A_STAGE_BYTES` per chunk.
    let image =
        a_image.cast::<u8>().wrapping_add(index::block_idx_y() as usize * chunks as usize * PREFILL_A_STAGE_BYTES);

    // SAFETY (whole body): the launch contract sizes every buffer; copies stay inside the
    // image's tile and rows of B (rows past N copy 0 bytes from a row that exists); scales and
    // zero points are read only for existing (row, block) pairs; the block barrier and the
    // warpgroup instructions are reached by all threads they name (every bound depends on the
    // block alone).
    unsafe {
        if tid == 0 {
            for slot in 0..STAGES {
                mbarrier::init(full(slot), 1);
                mbarrier::init(empty(slot), CONSUMER_WARPS);
            }
            // The bulk copies complete their bytes on `full` through the async proxy.
            wgmma::fence_proxy_async_shared();
        }
        sync::sync_threads();

        if warpgroup == 0 {
            sync::release_registers::<PRODUCER_REGISTERS>();
            if tid != 0 {
                return;
            }
            sync::wait_for_prerequisite_grids();
            for j in 0..chunks {
                let slot = j % STAGES;
                if j >= STAGES {
                    // Chunk j - STAGES, this stage's last, released by every consumer warp.
                    mbarrier::wait_parity(empty(slot), parity(j - STAGES));
                }
                mbarrier::arrive_expect_tx(full(slot), PREFILL_A_STAGE_BYTES as u32);
                let from = image.add(j as usize * PREFILL_A_STAGE_BYTES);
                bulk_copy::global_to_shared(a_s(slot), from, PREFILL_A_STAGE_BYTES as u32, full(slot));
            }
            // The consumers wait for every chunk: no copy outlives the block.
            return;
        }

        sync::claim_registers::<CONSUMER_REGISTERS>();
        let ctid = tid - GROUP_THREADS;
        // This lane's weight rows: `g` and `g + 8` of its warp's 16. Its code slot holds the
        // 16 bytes of each at `16 (lane % 4)` of the chunk's 64, at pieces `ctid` and
        // `ctid + 256`.
        let row0 = n0 + (ctid / 32) * 16 + index::lane_id() as usize / 4;
        let rows = [row0, row0 + 8];
        let code_src: [(*const u8, u32); 2] = core::array::from_fn(|h| {
            let bytes = if rows[h] < n { 16 } else { 0 };
            (b.add(rows[h].min(n - 1) * p.row_bytes as usize), bytes)
        });
        let code_offset = 16 * (ctid % 4) as u32;
        // One `cp.async` group per chunk, empty past the last, so that a chunk's group is
        // always the third from the newest when it is waited for.
        let copy_codes = |j: u32| {
            if j < chunks {
                let slot = codes_s(j % CODE_SLOTS);
                unroll!(H in [0, 1] {
                    let (row, bytes) = code_src[H];
                    // The last chunk may end inside a row (blocks below 128): a piece past the
                    // row is read as the row's last 16 bytes (rows hold at least 16), whose
                    // codes then meet only zero activations.
                    let at = (j * B_CHUNK_BYTES as u32 + code_offset).min(p.row_bytes - 16);
                    cp_async_16_zfill(slot.offset(((ctid + CONSUMER_THREADS * H) * 16) as u32), row.add(at as usize), bytes);
                });
            }
            commit_group();
        };
        // The first chunks' codes go before the wait for the grid writing the image.
        copy_codes(0);
        copy_codes(1);
        copy_codes(2);
        sync::wait_for_prerequisite_grids();
        let consts = LaneConsts::new::<T, ANY_FORMAT, ANY_FORMAT>(scales, zeros_u8, zeros_t, rows, &p);
        let typed = consts.typed();
        let dequantize_chunk = |j: u32, c: ChunkConsts, f: &mut Fragments| {
            let codes = codes_s(j % CODE_SLOTS);
            let lo = ld_shared_v4(codes.offset((ctid * 16) as u32));
            let hi = ld_shared_v4(codes.offset(((CONSUMER_THREADS + ctid) * 16) as u32));
            dequantize_fragments::<T, ANY_FORMAT, ANY_FORMAT>(lo, hi, c, typed, f);
        };

        // One arrival per consumer warp on the stage's `empty` barrier.
        let lane0 = index::lane_id() == 0;
        let release = |slot: u32| {
            sync::sync_warp();
            if lane0 {
                mbarrier::arrive(empty(slot));
            }
        };

        let mut acc = wgmma::zeroed_accumulators_f32::<128>();
        // Zeroed once, on every path: `ptxas` serializes the `wgmma`s (C7515) when it sees the
        // zeroing on a path to the final wait.
        pin_accumulators_f32(&mut acc);
        // The constants of even and odd chunks, each loaded two chunks before its use.
        let (mut even_consts, mut odd_consts) =
            (consts.load::<ANY_FORMAT, ANY_FORMAT>(0, &p), consts.load::<ANY_FORMAT, ANY_FORMAT>(1, &p));
        let (mut f0, mut f1): (Fragments, Fragments) = ([[0; 4]; 8], [[0; 4]; 8]);
        mbarrier::wait_parity(full(0), 0);
        wait_group::<2>();
        dequantize_chunk(0, even_consts, &mut f0);
        even_consts = consts.load::<ANY_FORMAT, ANY_FORMAT>(2, &p);

        // Chunk `$j`: its fragments are in `$cur` (its copies have landed); `$consts` holds
        // chunk `$j + 1`'s constants. A macro, not a closure: `ptxas` serializes `wgmma`s whose
        // pipeline crosses a call (C7510).
        macro_rules! chunk_step {
            ($j:expr, $cur:ident, $next:ident, $consts:ident) => {{
                let j: u32 = $j;
                let tile = a_s(j % STAGES);
                // (The bulk copies wrote the activations in the async proxy, which `wgmma`
                // reads: no proxy fence.)
                wgmma::fence();
                unroll!(S in [0, 1, 2, 3, 4, 5, 6, 7] {
                    let half = SharedMatrix::k_major_swizzle128(tile.offset(((S / 4) * PREFILL_A_HALF_BYTES) as u32));
                    mma_async_k16_register_a::<BF16, 128>(&mut acc, $cur[S], half.advance_k(32 * (S % 4) as u32));
                });
                wgmma::commit_group();
                // Chunk j - 1's `wgmma`s are done: `$next` is free, and so are that chunk's
                // stage and this thread's code slot, which takes chunk j + 3 (whose group
                // follows chunk j + 1's and j + 2's).
                wgmma::wait_group::<1>();
                if j > 0 {
                    release((j - 1) % STAGES);
                }
                copy_codes(j + 3);
                if j + 1 < chunks {
                    mbarrier::wait_parity(full((j + 1) % STAGES), parity(j + 1));
                    wait_group::<2>();
                    dequantize_chunk(j + 1, $consts, &mut $next);
                }
                $consts = consts.load::<ANY_FORMAT, ANY_FORMAT>(j + 3, &p);
            }};
        }
        alternate_chunks!(chunks, chunk_step, f0, f1, even_consts, odd_consts);
        wgmma::wait_group::<0>();
        pin_accumulators_f32(&mut acc);

        // The tile goes out through shared memory, so that each row of Y is written in
        // 16-byte pieces: the ring is free once both consumers are past their last wait (the
        // producer's copies have all landed: every chunk was waited for).
        sync::sync_named::<1, { CONSUMER_THREADS as u32 }>();
        // Register `4 t + 2 h + c` holds weight row `rows[h]`, row of A `m0 + 8 t + 2 q + c`;
        // it goes to row `8 t + 2 q + c`, column `rows[h] - n0` of the staged tile (rows of
        // `STAGED_ROW_BYTES`: the four rows a store instruction writes fall on different banks).
        let q = index::lane_id() as usize % 4;
        unroll!(H in [0, 1] {
            let col = rows[H];
            let bias_v = if p.flags & FLAG_BIAS != 0 && col < n { bias.add(col).read().to_f32() } else { 0.0 };
            let at = base.offset((2 * (col - n0)) as u32);
            unroll!(T8 in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                unroll!(C in [0, 1] {
                    let v = T::pack2(acc[4 * T8 + 2 * H + C] + bias_v, 0.0) as u16;
                    st_shared_u16(at.offset(((8 * T8 + 2 * q + C) * STAGED_ROW_BYTES) as u32), v);
                });
            });
        });
        sync::sync_named::<1, { CONSUMER_THREADS as u32 }>();
        // Piece `ctid + 256 i`: 8 columns at `8 (piece % 16)` of row `piece / 16`.
        let whole_rows = n.is_multiple_of(8) && (y as usize).is_multiple_of(16);
        unroll!(I in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            let piece = ctid + CONSUMER_THREADS * I;
            let (row, col) = (m0 + piece / 16, n0 + 8 * (piece % 16));
            if row < m && col < n {
                let v = ld_shared_v4(base.offset(((piece / 16) * STAGED_ROW_BYTES + 16 * (piece % 16)) as u32));
                let dst = y.add(row * n + col);
                if whole_rows {
                    st_global_v4(dst.cast(), v);
                } else {
                    // A row's end, or rows not 16-byte aligned: element by element.
                    unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if col + E < n {
                            dst.add(E).write(T::from_bits((v[E / 2] >> (16 * (E % 2))) as u16));
                        }
                    });
                }
            }
        });
    }
}
