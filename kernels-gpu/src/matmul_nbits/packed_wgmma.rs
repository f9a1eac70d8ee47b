//! W4A16 for small M on Hopper's warpgroup tensor cores (`wgmma`, sm_90a module only): the
//! operation of [`super`] for M <= 16 over B repacked by
//! `MatMulNBitsWeights::pack_for_decode` (the records `decode*_packed` read).
//!
//! The `mma.sync` decode kernels give each warp its own K chunks, so each warp loads its own
//! copy of every chunk's activations into registers (as many bytes per lane as the weights at
//! M = 16), and the first use of them waits on a scoreboard that all of a warp's activation
//! loads share. Here the block's two warpgroups work on the same chunks, 128 weight columns
//! side by side, so a chunk's activations are loaded once per block, permuted into `wgmma`'s
//! B layout in shared memory, and read by the tensor cores from there: no activation
//! registers, loads or shuffles per lane and `mma`. The weights are `wgmma`'s register operand
//! (64 rows per warpgroup), dequantized exactly to `code - zero` straight into the A
//! fragments; each chunk's f32 sums (`scale-d = 0` starts them) are scaled once. A chunk's
//! `wgmma`s run while the warpgroup waits at the next chunk's barrier and issues its copies;
//! they are waited for before its fragments are rewritten (one set of fragments, so that two
//! blocks fit an SM).
//!
//! Measured on the H200 (docs/perf-notes/matmul_nbits.md, v19): faster than the `mma.sync`
//! decode kernels where M > 8 and N alone fills the GPU (M = 16, N = 28672: 55.0 against 69.6
//! us), slower where the grid needs K splits or M <= 8, which is where the planner keeps those.
//! So only the 16-token build without K splits is shipped (`G` = 2 of the body's `G` = 1 or 2,
//! `m64n16k16`); the 8-token build and the K splits as clusters of 2 or 4 blocks were removed
//! (last measured in benches/pruned.md; the code is at 20fc28c).
//!
//! Per chunk, with one block-wide barrier: the block's 4 records (codes and constants) go by
//! `cp.async` into a ring of [`PACKED_WGMMA_STAGES`]; each thread loads one 16-byte piece of
//! one token's activations two chunks ahead into registers and stores it, permuted, one chunk
//! ahead into a ring of [`PACKED_WGMMA_ACT_STAGES`] swizzled tiles. An activation stage is
//! rewritten three chunks after its last `wgmma` was issued, and every thread has by then
//! passed a barrier after both warpgroups waited for that `wgmma`.
//!
//! # Launch contract: `matmul_nbits_packed_wgmma16_{f16,bf16}`
//! - M <= 16 (`m64n16k16`; the planner runs it for M > 8).
//! - `b` holds the records of `MatMulNBitsWeights::pack_for_decode` (`PACKED_RECORD_BYTES` per 32-column
//!   tile and K chunk, tile-major), 16-byte aligned; `scales`, `zeros_u8`, `zeros_t` and
//!   `workspace` are not read. `a` 16-byte aligned with `K % 8 == 0`; `block_size >= 128` (the coarse records: the fine ones
//!   have a scale per 32 K, which this kernel's once-per-chunk scaling cannot apply).
//! - grid `(ceil(N / 128), 1, 1)`, block `(256, 1, 1)`, dynamic shared memory
//!   [`PACKED_WGMMA_SHARED_BYTES`]. Writes `y` (+ bias).

use super::common::split_chunk_range;
use super::decode::{after_weight_copies, before_weight_copies};
use crate::device::async_copy::{commit_group, cp_async_16, wait_group};
use crate::device::memory::ld_global_nc_v4;
use crate::device::shared::{dynamic_shared_base, ld_shared_v4, st_shared_u32};
use crate::device::wgmma::{self, SharedMatrix, fence_proxy_async_shared, pin_accumulators_f32x4};
use crate::device::{index, sync};
use crate::element::{Bf16, F16, TensorElement};
use crate::unroll;

use super::layout::*;

const _: () = assert!(PACKED_WGMMA_THREADS == 256 && PACKED_WGMMA_TILES == 4 && CHUNK == 128);
const _: () = assert!(PACKED_WGMMA_STAGES == 4 && PACKED_WGMMA_ACT_STAGES == 4);
const _: () = assert!(PACKED_WGMMA_ACT_HALF_BYTES % 1024 == 0 && PACKED_RECORD_BYTES % 128 == 0);
// The records' pieces: 2 per thread, 3 for the first 32 threads.
const RECORD_PIECES: usize = PACKED_RECORD_BYTES / 16;
const _: () = assert!(PACKED_WGMMA_TILES * RECORD_PIECES == 2 * 256 + 32);

/// The element types `wgmma` multiplies, at the decode shapes.
pub(crate) trait DecodeWgmmaElement: TensorElement {
    /// Starts `acc = A * B^T (+ acc when ACCUMULATE)` on a 64 x 16 tile of A in registers and a
    /// `8 G` x 16 tile of B (`G` = 1 or 2), `acc` in the accumulator layout of `m64n8k16`
    /// repeated `G` times.
    ///
    /// # Safety
    /// As [`wgmma::mma_async_m64n8k16_f16_register_a`].
    unsafe fn mma_async<const G: usize, const ACCUMULATE: bool>(acc: &mut [[f32; 4]; G], a: [u32; 4], b: SharedMatrix);
}

macro_rules! decode_wgmma_element {
    ($t:ty, $n8:ident, $n16:ident) => {
        impl DecodeWgmmaElement for $t {
            #[inline(always)]
            unsafe fn mma_async<const G: usize, const ACCUMULATE: bool>(
                acc: &mut [[f32; 4]; G],
                a: [u32; 4],
                b: SharedMatrix,
            ) {
                const { assert!(G == 1 || G == 2) };
                // SAFETY: forwarded contract; `[[f32; 4]; G]` is `4 G` contiguous f32.
                unsafe {
                    if G == 1 {
                        wgmma::$n8::<ACCUMULATE>(&mut *acc.as_mut_ptr(), a, b)
                    } else {
                        wgmma::$n16::<ACCUMULATE>(&mut *(acc.as_mut_ptr() as *mut [f32; 8]), a, b)
                    }
                }
            }
        }
    };
}
decode_wgmma_element!(F16, mma_async_m64n8k16_f16_register_a, mma_async_m64n16k16_f16_register_a);
decode_wgmma_element!(Bf16, mma_async_m64n8k16_bf16_register_a, mma_async_m64n16k16_bf16_register_a);

/// One chunk's A fragments of a lane: 8 K steps of 16.
type Fragments = [[u32; 4]; 8];

/// # Safety
/// The launch contract in the module docs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_nbits_packed_wgmma<T: DecodeWgmmaElement, const G: usize>(
    a: *const T,
    b: *const u8,
    _scales: *const T,
    _zeros_u8: *const u8,
    _zeros_t: *const T,
    bias: *const T,
    y: *mut T,
    _workspace: *mut f32,
    p: Dims,
) {
    const STAGES: u32 = PACKED_WGMMA_STAGES as u32;
    const ACT_STAGES: u32 = PACKED_WGMMA_ACT_STAGES as u32;
    const RECORD: usize = PACKED_RECORD_BYTES;
    let tokens = 8 * G as u32;
    let tid = index::thread_idx_x();
    let (group, warp_in_group, lane) = (tid / 128, (tid / 32) % 4, index::lane_id());
    let (g, q) = (lane / 4, lane % 4);
    let (m, n, k) = (p.m, p.n, p.k);
    let chunks_total = k.div_ceil(CHUNK as u32) as usize;
    let tiles_total = n.div_ceil(DECODE_COLUMNS as u32);
    let tile0 = index::block_idx_x() * PACKED_WGMMA_TILES as u32;
    let (first, count) = split_chunk_range(&p);

    let base = SharedMatrix::atom_aligned(dynamic_shared_base());
    let act_s = |slot: u32| base.offset(slot * PACKED_WGMMA_ACT_STAGE_BYTES as u32);
    let ring = base.offset((PACKED_WGMMA_ACT_STAGES * PACKED_WGMMA_ACT_STAGE_BYTES) as u32);
    let records_s = |slot: u32| ring.offset(slot * PACKED_WGMMA_CODES_STAGE_BYTES as u32);

    // The records' 16-byte pieces this thread copies: piece `tid + 256 u` of the block's 4
    // records of a chunk (stored as they are in memory). Tiles past N read the last tile: they
    // feed only weight columns that are never stored.
    let piece_src: [*const u8; 3] = core::array::from_fn(|u| {
        let piece = tid as usize + 256 * u;
        let tile = (tile0 + (piece / RECORD_PIECES) as u32).min(tiles_total - 1) as usize;
        b.wrapping_add(tile * chunks_total * RECORD + 16 * (piece % RECORD_PIECES))
    });
    // This lane's weight rows: `g` and `g + 8` of its warp's 16, columns `16 (w % 2) + g (+ 8)`
    // of the block's record `2 group + w / 2`.
    let record_local = (2 * group + warp_in_group / 2) as usize;
    let odd_half = warp_in_group % 2 == 1;
    let codes_at = (record_local * RECORD + (16 * (warp_in_group as usize % 2) + g as usize) * B_CHUNK_BYTES) as u32;
    let codes_at = codes_at + 16 * q;
    let consts_at = (record_local * RECORD + DECODE_STAGE_BYTES) as u32 + 16 * g;
    // This thread's activation piece: 8 halves at K `8 piece` of token `tid / 16` of a chunk,
    // which match word `piece / 4` of the codes of lanes `q = piece % 4` (lane % 4) in the
    // records, and so go as its 4 words (pairs of consecutive K, as the records' nibble order
    // pairs the codes) to 4 consecutive 16-byte chunks of one half (at `4 (piece % 4)` bytes
    // into each).
    let (token, piece) = (tid / 16, tid % 16);
    let (quad, word) = (piece % 4, piece / 4);
    let stages_token = token < tokens;
    let loads_token = stages_token && token < m;
    // SAFETY: a row below M of `a` (the launch contract sizes it); unused otherwise.
    let a_row = if loads_token { unsafe { a.add((token * k + 8 * piece) as usize) } } else { a };
    let act_dst: [u32; 4] = core::array::from_fn(|e| {
        (word / 2) * PACKED_WGMMA_ACT_HALF_BYTES as u32
            + SharedMatrix::swizzle128_offset(token as usize, 4 * (word as usize % 2) + e)
            + 4 * quad
    });

    let mut acc = [[0.0f32; 4]; G];
    let mut part = [[0.0f32; 4]; G];
    // `scale-d = 0` starts each chunk's sums: their zeroing here must not reach the `wgmma`s
    // as a definition inside their pipeline (ptxas would serialize them).
    pin_accumulators_f32x4(&mut part);
    // SAFETY (whole body): the launch contract sizes every buffer; copies stay inside the
    // records (tiles clamped to the last one, chunks below the total); activations are read
    // only below M and K; barriers, cluster barriers and warpgroup instructions are reached by
    // all threads of the block (every bound depends on the block alone).
    unsafe {
        let copy = |j: u32| {
            let (stage, at) = (records_s(j % STAGES), (first + j) as usize * RECORD);
            unroll!(U in [0, 1, 2] {
                if U < 2 || tid < 32 {
                    cp_async_16(stage.offset(16 * (tid + 256 * U as u32)), piece_src[U].add(at));
                }
            });
        };
        let load_act = |j: u32| -> [u32; 4] {
            let chunk = (first + j) * CHUNK as u32;
            // K % 8 == 0: a piece is all inside K or all outside.
            if loads_token && chunk + 8 * piece < k {
                ld_global_nc_v4(a_row.add(chunk as usize).cast())
            } else {
                [0; 4]
            }
        };
        // Tokens past M store zeros: their sums are never stored, but stay finite.
        let store_act = |j: u32, x: [u32; 4]| {
            if stages_token {
                let stage = act_s(j % ACT_STAGES);
                unroll!(E in [0, 1, 2, 3] {
                    st_shared_u32(stage.offset(act_dst[E]), x[E]);
                });
            }
        };
        // This lane's rows' scales (f32) and code biases from a stage's constants (per lane
        // group: scale bits of columns g, g + 8, g + 16, g + 24, then their zero points).
        let consts = |stage: crate::device::SharedAddr| -> ([f32; 2], [[u32; 2]; 2]) {
            let w = ld_shared_v4(stage.offset(consts_at));
            let (scales, zeros) = if odd_half { (w[1], w[2] >> 16) } else { (w[0], w[2]) };
            let s = [T::from_bits(scales as u16).to_f32(), T::from_bits((scales >> 16) as u16).to_f32()];
            (s, [T::code_bias(zeros & 0xff), T::code_bias((zeros >> 8) & 0xff)])
        };
        // Word `i` of a row's 16 bytes gives steps `2i` (codes (0,1), (2,3) in the records'
        // nibble order) and `2i + 1` ((4,5), (6,7)), exactly `code - zero`.
        let dequantize = |stage: crate::device::SharedAddr, code_bias: [[u32; 2]; 2], f: &mut Fragments| {
            let lo = ld_shared_v4(stage.offset(codes_at));
            let hi = ld_shared_v4(stage.offset(codes_at + 8 * B_CHUNK_BYTES as u32));
            unroll!(I in [0, 1, 2, 3] {
                let d_lo = T::codes_minus_bias::<true>(lo[I], code_bias[0]);
                let d_hi = T::codes_minus_bias::<true>(hi[I], code_bias[1]);
                f[2 * I] = [d_lo[0], d_hi[0], d_lo[1], d_hi[1]];
                f[2 * I + 1] = [d_lo[2], d_hi[2], d_lo[3], d_hi[3]];
            });
        };
        // Register `c` of a tile: row g + 8 (c / 2) of the warp's 16.
        let add_scaled = |acc: &mut [[f32; 4]; G], s: [f32; 2], part: &[[f32; 4]; G]| {
            unroll!(J in [0, 1] {
                if J < G {
                    unroll!(C in [0, 1, 2, 3] {
                        acc[J][C] = crate::device::math::fma(s[C / 2], part[J][C], acc[J][C]);
                    });
                }
            });
        };

        // The first records, copied before the wait for the previous grid where the host says
        // that grid did not write them.
        before_weight_copies(p.flags);
        unroll!(S in [0, 1, 2] {
            const { assert!(STAGES == 4) };
            if (S as u32) < count {
                copy(S as u32);
            }
            commit_group();
        });
        after_weight_copies(p.flags);
        let mut act = [0u32; 4];
        if count > 0 {
            store_act(0, load_act(0));
        }
        if count > 1 {
            act = load_act(1);
        }
        let mut f: Fragments = [[0; 4]; 8];
        let mut scale_prev = [0.0f32; 2];
        let mut j = 0;
        while j < count {
            // This thread's copies of chunk j landed; the barrier publishes everyone's, and the
            // activations of chunks j (stored in the previous step) and j + 1.
            wait_group::<{ STAGES - 2 }>();
            if j + 1 < count {
                store_act(j + 1, act);
            }
            fence_proxy_async_shared();
            sync::sync_threads();
            // Stage (j - 1) % 4 was last read in the previous step, before the barrier.
            if j + STAGES - 1 < count {
                copy(j + STAGES - 1);
            }
            commit_group();
            if j + 2 < count {
                act = load_act(j + 2);
            }
            let stage = records_s(j % STAGES);
            let (scale, code_bias) = consts(stage);
            // Chunk j - 1's `wgmma`s are done: its sums can be scaled, and the fragments
            // rewritten. One set of fragments and of sums (read only after `wait_group 0`: ptxas
            // serializes `wgmma`s whose accumulators other instructions read while any group
            // runs, C7514) keeps the registers for more blocks per SM, which hide the wait.
            wgmma::wait_group::<0>();
            pin_accumulators_f32x4(&mut part);
            if j > 0 {
                add_scaled(&mut acc, scale_prev, &part);
            }
            dequantize(stage, code_bias, &mut f);
            let tile = act_s(j % ACT_STAGES);
            wgmma::fence();
            unroll!(S in [0, 1, 2, 3, 4, 5, 6, 7] {
                let half = SharedMatrix::k_major_swizzle128(tile.offset(((S / 4) * PACKED_WGMMA_ACT_HALF_BYTES) as u32));
                T::mma_async::<G, { S != 0 }>(&mut part, f[S], half.advance_k(32 * (S % 4) as u32));
            });
            wgmma::commit_group();
            scale_prev = scale;
            j += 1;
        }
        wgmma::wait_group::<0>();
        pin_accumulators_f32x4(&mut part);
        if count > 0 {
            add_scaled(&mut acc, scale_prev, &part);
        }

        // Register `c` of tile `t`: weight column `row + 8 (c / 2)`, token `8 t + 2 q + c % 2`.
        let row = index::block_idx_x() * PACKED_WGMMA_COLUMNS as u32 + 64 * group + 16 * warp_in_group + g;
        unroll!(H in [0, 1] {
            let col = row + 8 * H as u32;
            if col < n {
                let bias_v = if p.flags & FLAG_BIAS != 0 { bias.add(col as usize).read().to_f32() } else { 0.0 };
                unroll!(J in [0, 1] {
                    unroll!(C in [0, 1] {
                        let t = 8 * J as u32 + 2 * q + C as u32;
                        if J < G && t < m {
                            y.add((t * n + col) as usize).write(T::from_f32(acc[J][2 * H + C] + bias_v));
                        }
                    });
                });
            }
        });
    }
}
