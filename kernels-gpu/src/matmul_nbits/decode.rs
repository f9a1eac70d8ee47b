//! The small-M kernels of `matmul_nbits` (M <= 16): `decode*`, over the `MatMulNBits` layout
//! or B repacked once (`*_packed`), and `small`, which takes any zero points and blocks.
//!
//! # Launch contract: `matmul_nbits_{decode8,decode8_ahead3,decode16,small}[_zf]_{f16,bf16}`
//! - `small`: warp tile 16 x 32, 4 warps splitting the block's K chunks (block tile 16 x 32),
//!   block `(128, 1, 1)`, 6144 bytes of static shared memory for the warps' partial sums, no
//!   dynamic shared memory. `a`, `b`, `y` need no alignment beyond their element type (16-byte
//!   vector loads are used when `flags` says the rows allow them).
//!   `decode8` / `decode8_ahead3` / `decode16`: the same block tile (`BM` = 8 or 16 rows of A,
//!   32 columns) with swapped operands (the weights are the 16-row `mma` operand), block
//!   `(128, 1, 1)` (`DECODE_WARPS` = 4), 32768 bytes (`DECODE_SHARED_BYTES`) of dynamic shared
//!   memory.
//! - `decode*` only: zero points none or u8, `block_size >= 128`, `K % 8 == 0`, `a` and `b`
//!   16-byte aligned and `row_bytes % 16 == 0`.
//! - `decode8_packed` / `decode16_packed`: as `decode8_ahead3` / `decode16`, but `b` holds the
//!   records of `MatMulNBitsWeights::pack_for_decode` (`PACKED_RECORD_BYTES` per 32-column tile and K
//!   chunk, tile-major; the scales and zero points are read from them), and the dynamic shared
//!   memory is `DECODE_PACKED_SHARED_BYTES`.
//! - `decode*_packed*_fine`: the same over the fine records (`PACKED_FINE_RECORD_BYTES` per tile
//!   and chunk: blocks of 32 or 64) and `decode_packed_shared_bytes(warps, FINE_STEP)` of
//!   dynamic shared memory; `decode*_packed*_fine16` over the fine16 records
//!   (`PACKED_FINE16_RECORD_BYTES`: blocks of 16) and `decode_packed_shared_bytes(warps,
//!   FINE16_STEP)`.
//! - `decode8_packed_wide`: `decode8_packed` with `DECODE_WIDE_WARPS` = 8 warps splitting K,
//!   block `(256, 1, 1)`, `DECODE_WIDE_PACKED_SHARED_BYTES` of dynamic shared memory;
//!   `decode16_packed_wide`: `decode16_packed` with `DECODE16_WIDE_WARPS` = 6, block
//!   `(192, 1, 1)`, `DECODE16_WIDE_PACKED_SHARED_BYTES`.
//! - `decode*` (and `packed_wgmma16`) may be launched as programmatic dependents of the
//!   previous grid in the stream (sm_90a module): they wait for it before reading A or writing
//!   anything, and before reading B, scales and zero points unless `flags & FLAG_WEIGHTS_READY`;
//!   with `flags & FLAG_EARLY_DEPENDENTS` each block lets the next grid start once past that
//!   wait.
//! - Grid, splits and outputs as the family's docs say.

use super::common::{
    NEG_ZERO2, chunk_codes, chunk_consts, dequantize_biased, load_a8, mma_chunk, split_chunks, store_tile,
    zero_of_block,
};
use super::layout::*;
use crate::device::async_copy::{self, cp_async_16};
use crate::device::bits::{high_halves, low_halves};
use crate::device::math::fma;
use crate::device::memory::{ld_global_nc_u16, ld_global_nc_v4};
use crate::device::shared::{dynamic_shared_base, ld_shared_v2, ld_shared_v4, st_shared_v4};
use crate::device::{index, sync};
use crate::element::TensorElement;
use crate::{shared_array, unroll};

/// `small`: 16 rows of A per block, `NT` column tiles, `WK` warps splitting the
/// block's K chunks (warp `w` takes chunks `first + w`, `+ WK`, ...), two chunks in flight per
/// warp; the warps' partial tiles are summed through shared memory at the end. Each lane
/// loads the activations its fragments need straight from global memory (they stay in L1).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_nbits_small<T: TensorElement, const NT: usize, const WK: usize, const TYPED_ZERO: bool>(
    a: *const T,
    b: *const u8,
    scales: *const T,
    zeros_u8: *const u8,
    zeros_t: *const T,
    bias: *const T,
    y: *mut T,
    workspace: *mut f32,
    p: Dims,
) {
    let tid = index::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, index::lane_id() as usize);
    let (g, q) = (lane / 4, lane % 4);
    let (m, k) = (p.m as usize, p.k as usize);
    let m0 = index::block_idx_y() as usize * 16;
    let n0 = index::block_idx_x() as usize * 8 * NT;
    let (first, last) = split_chunks(&p);
    let a_vec16 = p.flags & FLAG_A_VEC16 != 0;

    // This lane's activations of chunk `kc`: rows g (and g + 8), words i = 0..4 of 8 halves at
    // K `kc + 32q + 8i`, the same K as its codes; zero past M or K.
    let load_a = |kc: usize| {
        let mut x = [[[0u32; 4]; 4]; 2];
        unroll!(R in [0, 1] {
            let row = m0 + g + 8 * R;
            if row < m {
                unroll!(I in [0, 1, 2, 3] {
                    let k8 = kc + 32 * q + 8 * I;
                    // SAFETY: row < M, so the row exists.
                    x[R][I] = unsafe { load_a8(a.add(row * k + k8), k8, k, a_vec16) };
                });
            }
        });
        x
    };

    let mut acc = [[[0.0f32; 4]; NT]; 1];
    // SAFETY (whole body): the launch contract sizes every buffer; loads are bounds-checked
    // against M, N, K and the rows of `b`; `mma` and the barrier are reached uniformly (loop
    // bounds depend only on the block and the warp index).
    unsafe {
        let mut chunk = first + warp;
        while chunk < last {
            // Both chunks' loads first, then the math: 2 NT weight loads in flight per lane.
            let (kc0, kc1) = (chunk * CHUNK, (chunk + WK) * CHUNK);
            let has1 = chunk + WK < last;
            let codes0 = chunk_codes::<NT>(b, n0, lane, kc0, &p);
            let codes1 = if has1 { chunk_codes::<NT>(b, n0, lane, kc1, &p) } else { [[0; 4]; NT] };
            let x0 = load_a(kc0);
            let x1 = if has1 { load_a(kc1) } else { [[[0; 4]; 4]; 2] };
            let consts0 = chunk_consts::<T, NT, TYPED_ZERO>(scales, zeros_u8, zeros_t, n0, lane, kc0, &p);
            let consts1 = if has1 {
                chunk_consts::<T, NT, TYPED_ZERO>(scales, zeros_u8, zeros_t, n0, lane, kc1, &p)
            } else {
                consts0
            };
            mma_chunk::<T, 1, NT, TYPED_ZERO>(&mut acc, &codes0, &consts0, |_, i, h| {
                direct_frag(x0[0][i], x0[1][i], h)
            });
            if has1 {
                mma_chunk::<T, 1, NT, TYPED_ZERO>(&mut acc, &codes1, &consts1, |_, i, h| {
                    direct_frag(x1[0][i], x1[1][i], h)
                });
            }
            chunk += 2 * WK;
        }

        reduce_warps_and_store::<T, NT, WK>(&mut acc[0], m0, n0, bias, y, workspace, &p);
    }
}

/// Sums the partial tiles of the `WK` warps that split a block's K (through shared memory,
/// `[warp - 1][tile][lane]` x 16 bytes: conflict-free), then, launched in clusters, the blocks
/// of a cluster (its K splits) into the first; warp 0 (of the first block) stores the result.
///
/// # Safety
/// Reached by every thread of the block (of every block of the cluster); the launch contract
/// sizes the outputs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn reduce_warps_and_store<T: TensorElement, const NT: usize, const WK: usize>(
    acc: &mut [[f32; 4]; NT],
    m0: usize,
    n0: usize,
    bias: *const T,
    y: *mut T,
    workspace: *mut f32,
    p: &Dims,
) {
    let partials = shared_array!(DLKERN_NBITS_WARP_PARTIALS, 6144, 16);
    const { assert!(WK >= 2 && (WK - 1) * NT * 32 * 16 <= 6144) };
    let (warp, lane) = (index::thread_idx_x() as usize / 32, index::lane_id() as usize);
    let slot = |wp: usize, j: usize| partials.offset((((wp - 1) * NT + j) * 32 + lane) as u32 * 16);
    // SAFETY: slots are inside the array (asserted above); the barriers separate the writes
    // from the reads and are reached by all threads (of every block of the cluster).
    unsafe {
        if warp != 0 {
            unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                if J < NT {
                    st_shared_v4(slot(warp, J), acc[J].map(f32::to_bits));
                }
            });
        }
        sync::sync_threads();
        if warp == 0 {
            for wp in 1..WK {
                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if J < NT {
                        let part = ld_shared_v4(slot(wp, J));
                        unroll!(C in [0, 1, 2, 3] {
                            acc[J][C] += f32::from_bits(part[C]);
                        });
                    }
                });
            }
        }
        // Launched in clusters (sm_90a module), the K splits of a tile are one cluster: warp 0 of
        // every block but the first leaves its sum in warp 1's slots (which only warp 0 has read,
        // each lane its own), and the first adds them in split order and stores y.
        #[cfg(dlkern_arch_specific)]
        let stores = {
            use crate::device::cluster;
            // (Every thread of the cluster reaches the barriers; `count` is the same in all.)
            let count = cluster::cta_count();
            let first = count == 1 || cluster::sum_into_rank0(acc, count, |j| slot(1, j), warp == 0);
            warp == 0 && first
        };
        #[cfg(not(dlkern_arch_specific))]
        let stores = warp == 0;
        if stores {
            store_tile::<T, NT>(acc, m0, n0, lane, bias, y, workspace, p);
        }
    }
}

/// The dequantization constants of one K chunk of one lane of `decode`: those of weight
/// columns `16t + g` and `16t + g + 8` of tile `t` (the rows of its accumulator tiles), per
/// [`FINE_STEP`] of the chunk in the fine records, per word of the lane in the fine16 records
/// (word `i`'s block of 16), else in step 0 only (the others are never read, so they cost no
/// registers).
#[derive(Clone, Copy)]
struct DecodeConsts {
    scales: [[[u16; 2]; DECODE_TILES]; FINE_STEPS],
    zeros: [[[u32; 2]; DECODE_TILES]; FINE_STEPS],
}

impl DecodeConsts {
    const EMPTY: Self =
        DecodeConsts { scales: [[[0; 2]; DECODE_TILES]; FINE_STEPS], zeros: [[[8; 2]; DECODE_TILES]; FINE_STEPS] };
}

/// `decode` (M <= 16, the common case: integer zero points, blocks of at least 128 so one block
/// per K chunk, A and B rows of 16-byte vectors). The operands are swapped: the weights are
/// the 16-row A operand of `mma.m16n8k16` (two tiles of 16 columns per warp) and up to 8 tokens
/// per `R` are its 8-column B operand, so no `mma` row is wasted on absent tokens. The `WARPS`
/// warps split the block's K chunks; each streams its codes through a private ring of
/// [`DECODE_STAGES`] chunks filled with `cp.async` (lane `(g, q)` copies exactly the 16 bytes
/// per column it later reads, so no block barrier guards the ring; `PACKED`: a warp barrier
/// for the record's constants, which one lane per group copies), so the bytes in flight cost
/// no registers. The scales and zero points load as far ahead (in the ring when `PACKED`,
/// else into registers), the activations
/// (cached: every block reads them) `A_AHEAD` chunks ahead (1, or 3 at `R` = 1). ptxas tracks
/// a warp's outstanding register loads on a few shared scoreboards (the activations' all on
/// one), so the first use of a chunk's activations waits for every activation load in flight:
/// each step therefore turns its chunk's activations into `mma` fragments first and only then
/// loads the next ones, which so get a whole step before the next wait (measured 4-10% faster
/// than loading them just before that first use). 3 ahead measured 8-10% faster than 1 at
/// M = 1 where the grid fits in one wave (it costs one block per SM). At `R` = 2 the zero
/// point comes off exactly in packed 16-bit arithmetic; at `R` = 1 the codes go in plus fixed
/// offsets, and the offsets' and zero point's share comes off the f32 sums (see `compute`).
/// The scale multiplies each chunk's f32 sums. The warps' partial tiles meet in shared memory
/// at the end. `STEP` is the records' K span per scale (`layout::packed_step`; `CHUNK` without
/// `PACKED`). `FINE_STEP` (the fine records, blocks of 32 or 64): each 32-K step of a chunk
/// has its own constants, so the sums (and at `R` = 1 the offsets' sums) are kept and scaled
/// per step, four times the f32 work of a chunk for the same `mma`s. `FINE16_STEP` (blocks of
/// 16): each `mma` takes K from two blocks, so the weights are dequantized to T before it
/// (exact `code - zero`, then one rounding by the scale, as `small`), at either `R`, and the
/// `mma`s sum straight into the accumulators.
///
/// # Safety
/// The launch contract (`decode*` in the module docs).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_nbits_decode<
    T: TensorElement,
    const R: usize,
    const A_AHEAD: usize,
    const PACKED: bool,
    const WARPS: usize,
    const STEP: usize,
>(
    a: *const T,
    b: *const u8,
    scales: *const T,
    zeros_u8: *const u8,
    bias: *const T,
    y: *mut T,
    workspace: *mut f32,
    p: Dims,
) {
    const TILES: usize = DECODE_TILES;
    let wk = WARPS as u32;
    const STAGES: u32 = DECODE_STAGES as u32;
    // The unrolled loops below cover 2 tiles of 2 columns per lane, and the partial tiles fit
    // in a warp's ring.
    const {
        assert!((R == 1 || R == 2) && TILES == 2 && DECODE_STAGES.is_multiple_of(4) && DECODE_STAGES <= 8);
        // Activations 1 chunk ahead (2 slots), or 3 (4 slots: 64 more registers at R = 2).
        assert!(A_AHEAD == 1 || (A_AHEAD == 3 && R == 1));
        assert!(TILES * R * 32 * 16 <= DECODE_RING_BYTES);
        assert!(STEP == CHUNK || (PACKED && (STEP == FINE_STEP || STEP == FINE16_STEP)));
    };
    let tid = index::thread_idx_x();
    let (warp, lane) = (tid / 32, index::lane_id());
    let (g, q) = (lane / 4, lane % 4);
    let (m, n, k) = (p.m, p.n, p.k);
    let m0 = index::block_idx_y() * 8 * R as u32;
    let n0 = index::block_idx_x() * DECODE_COLUMNS as u32;
    let (first, last) = split_chunks(&p);
    let (first, last) = (first as u32, last as u32);
    // This warp's chunks: first + warp, + wk, ...
    let count = if first + warp < last { (last - first - warp).div_ceil(wk) } else { 0 };
    let chunk_of = |j: u32| first + warp + j * wk;
    let zero_u8 = p.flags & FLAG_ZERO_U8 != 0;
    let zero_row_bytes = p.k_blocks.div_ceil(2);
    // Column `u` of this lane is `g + 8u` of the block: tile `u / 2`, row `g + 8 (u % 2)` of
    // its `mma`. Columns past N read column N - 1 (never stored): no predicates in the loop.
    let col = |u: usize| (n0 + g + 8 * u as u32).min(n - 1) as usize;
    // A stage of the packed kernels is a record as it is in memory.
    let record_bytes = record_bytes(STEP);
    let stage_bytes = if PACKED { record_bytes } else { DECODE_STAGE_BYTES } as u32;
    let ring = dynamic_shared_base().offset(warp * DECODE_STAGES as u32 * stage_bytes);
    // This lane's 16 bytes of column `u` in a stage: conflict-free for both the copy and the
    // read (a quarter warp covers 128 contiguous bytes).
    let piece = |stage: u32, u: usize| {
        ring.offset(stage * stage_bytes + ((g as usize + 8 * u) * B_CHUNK_BYTES) as u32 + 16 * q)
    };
    // `PACKED`: lane group `g`'s 16 bytes of constants in a stage (the record's own), which lane
    // `4g` copies and the group reads after a warp barrier (fine records: its 48 bytes, piece
    // `q` of which lane `4g + q` copies for `q < 3`; fine16: its 80 bytes, pieces `q` and, by
    // lane `4g`, 4). (Every lane copying its group's 16 bytes into a place of its own took 8
    // times the shared-memory wavefronts of distinct pieces: docs/perf-notes/matmul_nbits.md
    // v25.)
    let group_consts_bytes = match STEP {
        FINE_STEP => FINE_GROUP_CONSTS_BYTES,
        FINE16_STEP => FINE16_GROUP_CONSTS_BYTES,
        _ => 16,
    } as u32;
    let consts_piece = |stage: u32, piece: u32| {
        ring.offset(stage * stage_bytes + DECODE_STAGE_BYTES as u32 + group_consts_bytes * g + 16 * piece)
    };
    // `PACKED`: this block's first record; a chunk's record is `record_bytes` further.
    let chunks_total = k.div_ceil(CHUNK as u32) as usize;
    let block_records = b.wrapping_add(index::block_idx_x() as usize * chunks_total * record_bytes);
    let chunk_stride = if PACKED { record_bytes } else { B_CHUNK_BYTES };

    // SAFETY (whole body): every pointer formed below stays inside its tensor (columns
    // clamped to N - 1, rows to M - 1, K offsets checked against K; every chunk lies in the
    // rows of `b` because they hold whole blocks of at least 128 codes, and its block is below
    // k_blocks; `PACKED`: in the records, which hold every chunk of every tile); `mma` and the barrier are reached uniformly (loop bounds depend only on the
    // block and the warp index); each lane reads only ring bytes its own copies wrote, after
    // waiting for them, and (`PACKED`) its group's constants, after a warp barrier that follows
    // the copying lane's wait; a stage is refilled only after a warp barrier that follows
    // every lane's reads of it.
    unsafe {
        let w_rows: [*const u8; 2 * TILES] = core::array::from_fn(|u| {
            if PACKED {
                block_records.add((g as usize + 8 * u) * B_CHUNK_BYTES + 16 * q as usize)
            } else {
                b.add(col(u) * p.row_bytes as usize + 16 * q as usize)
            }
        });
        let scale_rows: [*const T; 2 * TILES] = core::array::from_fn(|u| scales.add(col(u) * p.k_blocks as usize));
        let zero_rows: [*const u8; 2 * TILES] =
            core::array::from_fn(|u| if zero_u8 { zeros_u8.add(col(u) * zero_row_bytes as usize) } else { zeros_u8 });
        // Word `i` of lane `q`'s codes holds K `32 q + 8 i` of the chunk in `b`'s layout and
        // `8 q + 32 i` in the records (whose pieces make the quarter warp's activation loads
        // one contiguous 64 bytes per token).
        let (lane_k, word_k) = if PACKED { (8 * q, 32) } else { (32 * q, 8) };
        // Tokens past M read row M - 1: they only reach accumulator columns that are never
        // stored, and the loads need no predicate.
        let a_rows: [*const T; R] =
            core::array::from_fn(|r| a.add(((m0 + g + 8 * r as u32).min(m - 1) * k + lane_k) as usize));

        let copy = |chunk: u32, stage: u32| {
            unroll!(U in [0, 1, 2, 3] {
                cp_async_16(piece(stage, U), w_rows[U].add(chunk as usize * chunk_stride));
            });
            if PACKED {
                let record = block_records.add(chunk as usize * record_bytes + DECODE_STAGE_BYTES);
                let group = record.add(group_consts_bytes as usize * g as usize);
                if STEP == FINE16_STEP {
                    cp_async_16(consts_piece(stage, q), group.add(16 * q as usize));
                    if q == 0 {
                        cp_async_16(consts_piece(stage, 4), group.add(64));
                    }
                } else if STEP == FINE_STEP {
                    if q < 3 {
                        cp_async_16(consts_piece(stage, q), group.add(16 * q as usize));
                    }
                } else if q == 0 {
                    cp_async_16(consts_piece(stage, 0), group);
                }
            }
        };
        // Activations of rows `8r + g`: the 4 words of 8 halves that match this lane's codes.
        // `whole`: K is a multiple of the chunk, so no word needs a bound check (nor the zeros a
        // checked load must start from, one instruction per register).
        let activations = |chunk: u32, whole: bool| -> [[[u32; 4]; 4]; R] {
            let kc = chunk * CHUNK as u32;
            let mut x = [[[0; 4]; 4]; R];
            unroll!(RR in [0, 1] {
                if RR < R {
                    unroll!(I in [0, 1, 2, 3] {
                        // K % 8 == 0: a word of 8 halves is all in or all out (zero past K,
                        // where the codes are padding).
                        if whole || kc + lane_k + word_k * (I as u32) < k {
                            x[RR][I] = ld_global_nc_v4(a_rows[RR].add((kc + word_k * I as u32) as usize).cast());
                        }
                    });
                }
            });
            x
        };
        // `PACKED`: the constants from the stage (scale bits in words 0-1, zero points in 2;
        // fine: step `s`'s scale bits in words `2 (s % 2)` and `2 (s % 2) + 1` of piece `s / 2`,
        // its zero points in word `s` of piece 2; fine16: this lane's parity `h = q / 2`, word
        // `i`'s scale bits in word `2 (i % 2) + u / 2` of piece `2 h + i / 2`, its zero points in
        // nibbles `4 i + u` of the 8 bytes at 64 + 8 h).
        let packed_consts = |stage: u32| -> DecodeConsts {
            let mut c = DecodeConsts::EMPTY;
            if STEP == FINE16_STEP {
                let h = q / 2;
                let w = [ld_shared_v4(consts_piece(stage, 2 * h)), ld_shared_v4(consts_piece(stage, 2 * h + 1))];
                let zeros = ld_shared_v2(consts_piece(stage, 4).offset(8 * h));
                unroll!(I in [0, 1, 2, 3] {
                    unroll!(U in [0, 1, 2, 3] {
                        c.scales[I][U / 2][U % 2] = (w[I / 2][2 * (I % 2) + U / 2] >> (16 * (U % 2))) as u16;
                        c.zeros[I][U / 2][U % 2] = (zeros[I / 2] >> (4 * (4 * (I % 2) + U))) & 15;
                    });
                });
            } else if STEP == FINE_STEP {
                let w = [ld_shared_v4(consts_piece(stage, 0)), ld_shared_v4(consts_piece(stage, 1))];
                let zeros = ld_shared_v4(consts_piece(stage, 2));
                unroll!(S in [0, 1, 2, 3] {
                    unroll!(U in [0, 1, 2, 3] {
                        c.scales[S][U / 2][U % 2] = (w[S / 2][2 * (S % 2) + U / 2] >> (16 * (U % 2))) as u16;
                        c.zeros[S][U / 2][U % 2] = (zeros[S] >> (8 * U)) & 0xff;
                    });
                });
            } else {
                let w = ld_shared_v4(consts_piece(stage, 0));
                unroll!(U in [0, 1, 2, 3] {
                    c.scales[0][U / 2][U % 2] = (w[U / 2] >> (16 * (U % 2))) as u16;
                    c.zeros[0][U / 2][U % 2] = (w[2] >> (8 * U)) & 0xff;
                });
            }
            c
        };
        let consts = |chunk: u32| -> DecodeConsts {
            let blk = ((chunk * CHUNK as u32) >> p.block_shift) as usize;
            let mut c = DecodeConsts::EMPTY;
            unroll!(U in [0, 1, 2, 3] {
                c.scales[0][U / 2][U % 2] = ld_global_nc_u16(scale_rows[U].add(blk).cast());
                if zero_u8 {
                    c.zeros[0][U / 2][U % 2] = zero_of_block(zero_rows[U], blk);
                }
            });
            c
        };
        let mut acc = [[[0.0f32; 4]; R]; TILES];
        // The `mma` B fragments of a chunk's activations: built first thing in a step, so that
        // the next activations can load into the slot they came from (see the loop).
        // `PACKED`: the records' nibble order makes each pair of codes two consecutive K, so
        // the loaded words are the fragments as they are.
        let fragments = |a: &[[[u32; 4]; 4]; R]| -> [[[[u32; 2]; 2]; 4]; R] {
            core::array::from_fn(|rr| {
                core::array::from_fn(|i| {
                    if PACKED {
                        [[a[rr][i][0], a[rr][i][1]], [a[rr][i][2], a[rr][i][3]]]
                    } else {
                        [frag_pairs(a[rr][i], 0), frag_pairs(a[rr][i], 1)]
                    }
                })
            })
        };
        // `R` = 1: the codes go to the tensor cores plus fixed offsets (one `lop3` per pair),
        // and what the offsets and the zero point add comes off each chunk's f32 sums: per
        // token, the offsets' sum of its activations and their plain sum times the zero point,
        // both from one more `mma` per K step against constant rows. `R` = 2 would need two
        // more per K step, which cost more than they save (docs/perf-notes/matmul_nbits.md
        // v27): there the zero point comes off exactly in packed 16-bit arithmetic. The offsets
        // (at most 1024 times an activation) cost the f32 sums about 10 of their 24 bits, far
        // less than an f16 output keeps. (`R == 1` is spelled out below, not captured in a
        // local: a captured flag is no constant in the closure's body, and the dead path then
        // kept its arrays on the stack.)
        // Those sums of a chunk (`R` = 1 but fine16; none at `R` = 2): rows 0-7 the offsets' sums
        // of tokens 2q and 2q + 1, rows 8-15 their plain sums; fine: of each step (word `I`),
        // else all in step 0.
        let offset_sums = |a: &[[[[u32; 2]; 2]; 4]; R]| -> [[f32; 4]; FINE_STEPS] {
            let mut sums = [[0.0f32; 4]; FINE_STEPS];
            if R == 1 && STEP != FINE16_STEP {
                unroll!(I in [0, 1, 2, 3] {
                    unroll!(H in [0, 1] {
                        let s = if STEP == FINE_STEP { I } else { 0 };
                        sums[s] = T::mma(sums[s], T::OFFSET_SUMS, a[0][I][H]);
                    });
                });
            }
            sums
        };
        // Tiles `from..to` of a chunk.
        #[allow(clippy::too_many_arguments)]
        let compute = |stage: u32,
                       a: &[[[[u32; 2]; 2]; 4]; R],
                       c: &DecodeConsts,
                       sums: &[[f32; 4]; FINE_STEPS],
                       from: usize,
                       to: usize,
                       acc: &mut [[[f32; 4]; R]; TILES]| {
            unroll!(TT in [0, 1] {
                if TT >= from && TT < to {
                    let codes = [ld_shared_v4(piece(stage, 2 * TT)), ld_shared_v4(piece(stage, 2 * TT + 1))];
                    let mut part = [[0.0f32; 4]; R];
                    unroll!(I in [0, 1, 2, 3] {
                        // The constants' step: word `I`'s (fine, fine16), else the chunk's.
                        let st = if STEP < CHUNK { I } else { 0 };
                        let (d0, d1) = if STEP == FINE16_STEP {
                            // The weights themselves, each rounded once.
                            let weights = |r: usize| {
                                let bias = T::code_bias(c.zeros[st][TT][r]);
                                let scale2 = c.scales[st][TT][r] as u32 * 0x1_0001;
                                dequantize_biased::<T, true>(codes[r][I], bias, scale2, NEG_ZERO2)
                            };
                            (weights(0), weights(1))
                        } else if R == 1 {
                            (T::codes_plus_offset(codes[0][I]), T::codes_plus_offset(codes[1][I]))
                        } else {
                            let bias = [T::code_bias(c.zeros[st][TT][0]), T::code_bias(c.zeros[st][TT][1])];
                            (
                                T::codes_minus_bias::<true>(codes[0][I], bias[0]),
                                T::codes_minus_bias::<true>(codes[1][I], bias[1]),
                            )
                        };
                        unroll!(H in [0, 1] {
                            let af = [d0[2 * H], d1[2 * H], d0[2 * H + 1], d1[2 * H + 1]];
                            unroll!(RR in [0, 1] {
                                if RR < R && STEP == FINE16_STEP {
                                    acc[TT][RR] = T::mma(acc[TT][RR], af, a[RR][I][H]);
                                } else if RR < R {
                                    part[RR] = T::mma(part[RR], af, a[RR][I][H]);
                                }
                            });
                        });
                        // The step's sums scaled into the accumulators: after each word
                        // (fine), else after the chunk's last (fine16: already in them).
                        if STEP != FINE16_STEP && (STEP == FINE_STEP || I == 3) {
                            // Rows g (c0, c1) and g + 8 (c2, c3) of the tile are weight columns
                            // 16t + g and 16t + g + 8; c0 and c2 are token 2q, c1 and c3 token
                            // 2q + 1.
                            let s = [T::from_bits(c.scales[st][TT][0]).to_f32(), T::from_bits(c.scales[st][TT][1]).to_f32()];
                            let neg_zero = [-(c.zeros[st][TT][0] as f32), -(c.zeros[st][TT][1] as f32)];
                            unroll!(RR in [0, 1] {
                                if RR < R {
                                    unroll!(C in [0, 1, 2, 3] {
                                        let exact = if R == 1 {
                                            fma(neg_zero[C / 2], sums[st][2 + C % 2], part[RR][C] - sums[st][C % 2])
                                        } else {
                                            part[RR][C]
                                        };
                                        acc[TT][RR][C] = fma(s[C / 2], exact, acc[TT][RR][C]);
                                    });
                                    part[RR] = [0.0; 4];
                                }
                            });
                        }
                    });
                }
            });
        };

        // The scales and zero points come from DRAM like the codes, so they load as far ahead,
        // into a register ring beside the shared one: the loop is unrolled by the ring's
        // length so that every slot has a fixed register.
        let mut ring_consts = [DecodeConsts::EMPTY; DECODE_STAGES];
        before_weight_copies(p.flags);
        unroll!(S in [0, 1, 2, 3, 4, 5, 6, 7] {
            if S + 1 < DECODE_STAGES {
                if (S as u32) < count {
                    copy(chunk_of(S as u32), S as u32);
                    if !PACKED {
                        ring_consts[S] = consts(chunk_of(S as u32));
                    }
                }
                async_copy::commit_group();
            }
        });
        after_weight_copies(p.flags);
        // Activations of chunk j + S in a_ring[S % (A_AHEAD + 1)] (STAGES is a multiple of
        // 4), loaded A_AHEAD chunks ahead.
        let mut a_ring = [[[[0; 4]; 4]; R]; 4];
        unroll!(S in [0, 1, 2] {
            if S < A_AHEAD && (S as u32) < count {
                a_ring[S] = activations(chunk_of(S as u32), false);
            }
        });
        // The loop twice, for K a multiple of the chunk (no bound checks) and for any K.
        let mut main_loop = #[inline(always)]
        |whole: bool| {
            let mut j = 0u32;
            while j < count {
                unroll!(S in [0, 1, 2, 3, 4, 5, 6, 7] {
                    // Chunk j + S sits in stage S.
                    if S < DECODE_STAGES && j + (S as u32) < count {
                        // The stage refilled here was read by this lane in the previous step, whose
                        // math consumed those reads before this copy was issued; `PACKED`: its
                        // constants were read by the whole lane group, hence the warp barrier.
                        let ahead = j + S as u32 + STAGES - 1;
                        let ahead_stage = (S + DECODE_STAGES - 1) % DECODE_STAGES;
                        if PACKED {
                            sync::sync_warp();
                        }
                        if ahead < count {
                            copy(chunk_of(ahead), ahead_stage as u32);
                            if !PACKED {
                                ring_consts[ahead_stage] = consts(chunk_of(ahead));
                            }
                        }
                        async_copy::commit_group();
                        async_copy::wait_group::<{ DECODE_STAGES as u32 - 1 }>();
                        // `PACKED`: lane `4g`'s copy of the group's constants is complete once that
                        // lane has waited; the barrier makes it visible to the group.
                        if PACKED {
                            sync::sync_warp();
                        }
                        // ptxas tracks all of a warp's activation loads on one scoreboard, so the
                        // first use of chunk j's waits for every activation load in flight: the
                        // next chunk's loads go out only after that use, a whole step before the
                        // next wait, not just before this one.
                        let mut frags = fragments(&a_ring[S % (A_AHEAD + 1)]);
                        // LLVM would otherwise sink the fragments to their `mma`s and hoist the
                        // loads above them.
                        unroll!(RR in [0, 1] {
                            if RR < R {
                                unroll!(I in [0, 1, 2, 3] {
                                    unroll!(H in [0, 1] {
                                        sync::order_point(&mut frags[RR][I][H]);
                                    });
                                });
                            }
                        });
                        let c = if PACKED { packed_consts(S as u32) } else { ring_consts[S] };
                        let mut sums = offset_sums(&frags);
                        // `PACKED`: the fragments are the loaded words, so the first use of them
                        // has to be work: the offsets' sums at `R` = 1, the first tile at `R` = 2
                        // and in the fine16 builds (before the next loads in the PTX, which
                        // ptxas keeps).
                        let mut from = 0;
                        if PACKED {
                            if R == 2 || STEP == FINE16_STEP {
                                compute(S as u32, &frags, &c, &sums, 0, 1, &mut acc);
                                from = 1;
                                unroll!(RR in [0, 1] {
                                    if RR < R {
                                        let mut bits = acc[0][RR].map(f32::to_bits);
                                        sync::order_point(&mut bits);
                                        acc[0][RR] = bits.map(f32::from_bits);
                                    }
                                });
                            } else {
                                unroll!(ST in [0, 1, 2, 3] {
                                    if STEP == FINE_STEP || ST == 0 {
                                        let mut bits = sums[ST].map(f32::to_bits);
                                        sync::order_point(&mut bits);
                                        sums[ST] = bits.map(f32::from_bits);
                                    }
                                });
                            }
                        }
                        if j + ((S + A_AHEAD) as u32) < count {
                            a_ring[(S + A_AHEAD) % (A_AHEAD + 1)] =
                                activations(chunk_of(j + (S + A_AHEAD) as u32), whole);
                        }
                        compute(S as u32, &frags, &c, &sums, from, TILES, &mut acc);
                    }
                });
                j += STAGES;
            }
        };
        if k.is_multiple_of(CHUNK as u32) {
            main_loop(true);
        } else {
            main_loop(false);
        }
        async_copy::wait_group::<0>();

        // Warps 1.. leave their partial tiles in their own (now idle) rings; warp 0 sums them.
        let slot = |w: u32, tt: usize, rr: usize| {
            dynamic_shared_base()
                .offset(w * DECODE_STAGES as u32 * stage_bytes + (((tt * R + rr) * 32) as u32 + lane) * 16)
        };
        // Launched in clusters (sm_90a module), the K splits of a tile are one cluster: each warp
        // of split 0 first adds the same warp's tiles of the other splits, and split 0 alone
        // stores y. (Told by the cluster's size, a special register, not a flag, which would
        // stay live through the main loop.)
        #[cfg(dlkern_arch_specific)]
        let in_clusters_not_first = {
            use crate::device::cluster;
            // (Every thread of the cluster reaches the barriers; `count` is the same in all.)
            let count = cluster::cta_count();
            // Every warp holds a part: tile `tt`'s row block `rr` is the `tt * R + rr`th.
            count > 1 && !cluster::sum_into_rank0(acc.as_flattened_mut(), count, |i| slot(warp, i / R, i % R), true)
        };
        #[cfg(not(dlkern_arch_specific))]
        let in_clusters_not_first = false;
        if warp != 0 {
            unroll!(TT in [0, 1] {
                unroll!(RR in [0, 1] {
                    if RR < R {
                        st_shared_v4(slot(warp, TT, RR), acc[TT][RR].map(f32::to_bits));
                    }
                });
            });
        }
        sync::sync_threads();
        if warp == 0 {
            for w in 1..wk {
                unroll!(TT in [0, 1] {
                    unroll!(RR in [0, 1] {
                        if RR < R {
                            let part = ld_shared_v4(slot(w, TT, RR));
                            unroll!(C in [0, 1, 2, 3] {
                                acc[TT][RR][C] += f32::from_bits(part[C]);
                            });
                        }
                    });
                });
            }
        }
        let stores = warp == 0 && !in_clusters_not_first;
        if stores {
            // Accumulator element C of tile t, row set r: weight column 16t + g + 8 (C / 2),
            // token 8r + 2q + C % 2.
            let (split, splits) = (index::block_idx_z() as usize, index::grid_dim_z() as usize);
            #[cfg(dlkern_arch_specific)]
            let splits = if crate::device::cluster::cta_count() > 1 { 1 } else { splits };
            unroll!(TT in [0, 1] {
                unroll!(RR in [0, 1] {
                    unroll!(C in [0, 1, 2, 3] {
                        let column = (n0 + 16 * TT as u32 + g + 8 * (C as u32 / 2)) as usize;
                        let token = (m0 + 8 * RR as u32 + 2 * q + C as u32 % 2) as usize;
                        if RR < R && column < n as usize && token < m as usize {
                            let v = acc[TT][RR][C];
                            if splits == 1 {
                                let with_bias = if p.flags & FLAG_BIAS != 0 { v + bias.add(column).read().to_f32() } else { v };
                                y.add(token * n as usize + column).write(T::from_f32(with_bias));
                            } else {
                                workspace.add((split * m as usize + token) * n as usize + column).write(v);
                            }
                        }
                    });
                });
            });
        }
    }
}

/// The prologue of the `decode` kernels and `packed_wgmma`, launched as programmatic dependents
/// (the host's `launch_overlapping`): such a grid may start while the previous one in the
/// stream finishes. Its first chunks of constant weights are copied between this and
/// [`after_weight_copies`]: meanwhile when `flags & FLAG_WEIGHTS_READY`, else after the wait
/// for that grid here.
#[inline(always)]
pub(crate) fn before_weight_copies(flags: u32) {
    if flags & FLAG_WEIGHTS_READY == 0 {
        sync::wait_for_prerequisite_grids();
    }
}

/// The end of that prologue: everything after it waits for the previous grid. With
/// `flags & FLAG_EARLY_DEPENDENTS` the next grid may start once every block is past the wait
/// (else as they exit), so what it copies early overlaps this grid only, never an earlier one.
#[inline(always)]
pub(crate) fn after_weight_copies(flags: u32) {
    sync::wait_for_prerequisite_grids();
    if flags & FLAG_EARLY_DEPENDENTS != 0 {
        sync::allow_dependent_launch();
    }
}

/// The A fragment of one `mma` step from a lane's own word `i` of rows g (`r0`) and g + 8
/// (`r1`), step `2i + h`: see [`frag_pairs`].
#[inline(always)]
fn direct_frag(r0: [u32; 4], r1: [u32; 4], h: usize) -> [u32; 4] {
    let (f0, f1) = (frag_pairs(r0, h), frag_pairs(r1, h));
    [f0[0], f1[0], f0[1], f1[1]]
}

/// The two fragment registers of step `2i + h` from word `i` of 8 activations (one row of an
/// A fragment, or the column of a B fragment): halves `(2h, 2h + 4)` and `(2h + 1, 2h + 5)`,
/// the K order the weights' OR-into-mantissa conversion produces.
#[inline(always)]
fn frag_pairs(x: [u32; 4], h: usize) -> [u32; 2] {
    [low_halves(x[h], x[h + 2]), high_halves(x[h], x[h + 2])]
}
