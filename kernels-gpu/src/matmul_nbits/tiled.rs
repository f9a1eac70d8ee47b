//! The `mma.sync` kernels of `matmul_nbits` for larger M: `tiled` (integer zero points, blocks
//! of at least 32) over a copy of A permuted into the weights' K order (`permute`, which the
//! Hopper `wgmma` kernels read too), and `large`, which takes any zero points and alignment.
//!
//! # Launch contract: `matmul_nbits_large[_zf]_{f16,bf16}`
//! - warp tile 64 x 32, 2 x 4 warps (block tile 128 x 128), block `(256, 1, 1)`; dynamic shared
//!   memory `BM * 272` bytes (one K chunk of A at a time).
//! - `a`, `b`, `y` need no alignment beyond their element type (16-byte vector loads are used
//!   when `flags` says the rows allow them). Grid, splits and outputs as the family's docs say.
//!
//! # Launch contract: `matmul_nbits_tiled{32x128,64x128,128x128}_{f16,bf16}`
//! - `a` is the permuted copy of A (`matmul_nbits_permute_*`, rows of `ceil(K / 128) * 128`
//!   elements, 16-byte aligned); zero points none or u8; `block_size >= 32`; `b` 16-byte
//!   aligned with `row_bytes % 16 == 0` (always so for blocks of 32 or more).
//! - block tile as named, block `(256, 1, 1)`: warp tiles 16 x 32 / 64 x 32 with pairs of
//!   warps splitting each chunk's words (`32x128`, `64x128`), 64 x 32 in 2 x 4 warps
//!   (`128x128`); dynamic shared memory `tiled_shared_bytes` (67584, 102400, 172032 bytes:
//!   needs the opt-in above 48 KiB). Grid, splits and outputs as the family's docs say.
//!
//! # Launch contract: `matmul_nbits_permute_{f16,bf16}(a, a_perm, zeroed, dims, zeroed_words)`
//! - grid `(ceil(M * ceil(K / 128) * 16 / 256), 1, 1)`, block `(256, 1, 1)`: writes `a_perm [M,
//!   ceil(K / 128) * 128]` (4-byte aligned), zero past K, and zeros `zeroed [zeroed_words]`
//!   (4-byte aligned; null when `zeroed_words` is 0): the stream-K flags of the kernel after it.
//!   `a` needs 16-byte alignment only when `flags & FLAG_A_VEC16`. It may be launched as a
//!   programmatic dependent of the grid before it (the host does so on Hopper): every thread
//!   first waits for that grid (`griddepcontrol.wait`), which may still read `a_perm` or be
//!   writing `a`. Only after that wait does each block let the next grid of the stream start,
//!   if that one was launched as a programmatic dependent (the `wgmma` kernels are, and wait
//!   for this grid before they read `a_perm`).
//!
//! # Launch contract: `matmul_nbits_permute_image_{f16,bf16}(a, a_image, zeroed, dims, zeroed_words)` (sm_90a module only)
//! - as `matmul_nbits_permute_*`, over `ceil(M / 256) * 256` rows: writes
//!   `layout::prefill_image_bytes(M, K)` bytes at `a_image` (16-byte aligned), the stages of
//!   `prefill` (rows past M and K past K zero).

use super::common::{
    BlockConsts, chunk_codes, chunk_consts, dequantize, hi_half, lo_half, load_a8, mma_chunk, pair, split_chunks,
    store_tile, zero_of_block,
};
use super::layout::*;
use crate::device::async_copy::{self, cp_async_16_zfill};
use crate::device::ldmatrix::ldmatrix_x4;
use crate::device::memory::ld_global_nc_u16;
use crate::device::shared::{dynamic_shared_base, ld_shared_v2, ld_shared_v4, st_shared_u32, st_shared_v4};
use crate::device::{index, sync};
use crate::element::TensorElement;
use crate::unroll;

/// Byte offset, in a staged chunk of A rows ([`A_ROW_BYTES`] apart, in the permuted order), of
/// the row this lane gives `ldmatrix_x4` for the A fragment of 16-row tile `tile` (step 0;
/// step `s` is `32 s` bytes further).
#[inline(always)]
fn ldmatrix_a_row(tile: usize, lane: usize) -> u32 {
    ((tile * 16 + lane % 8 + 8 * ((lane / 8) % 2)) * A_ROW_BYTES + 16 * (lane / 16)) as u32
}

/// `large`: `MT x NT` tiles per warp, `WM x WN` warps; each K chunk of the block's A rows is
/// staged in shared memory in the permuted order and read with `ldmatrix`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_nbits_large<
    T: TensorElement,
    const MT: usize,
    const NT: usize,
    const WM: usize,
    const WN: usize,
    const TYPED_ZERO: bool,
>(
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
    let bm = 16 * MT * WM;
    let threads = 32 * WM * WN;
    let tid = index::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, index::lane_id() as usize);
    let (warp_m, warp_n) = (warp / WN, warp % WN);
    let (m, k) = (p.m as usize, p.k as usize);
    let m0 = index::block_idx_y() as usize * bm;
    let n0 = index::block_idx_x() as usize * 8 * NT * WN + warp_n * 8 * NT;
    let (first, last) = split_chunks(&p);
    let a_s = dynamic_shared_base();
    let row_addr = |mt: usize| a_s.offset(ldmatrix_a_row(warp_m * MT + mt, lane));

    let mut acc = [[[0.0f32; 4]; NT]; MT];
    // SAFETY (whole body): the launch contract sizes every buffer and the shared memory;
    // loads are bounds-checked against M, N and the rows of `b`; barriers and
    // warp-collective instructions are reached uniformly (loop bounds depend only on the
    // block).
    unsafe {
        // Activations of one chunk into shared memory at `tile` in the permuted order: each
        // thread takes (row, i, q) tasks of 8 consecutive K and stores the pairs the steps'
        // fragments want: (0,4), (1,5) for step 2i; (2,6), (3,7) for step 2i+1.
        let stage = |kc: usize| {
            let mut task = tid;
            while task < bm * 16 {
                let (r, iq) = (task / 16, task % 16);
                let (i, qq) = (iq / 4, iq % 4);
                let k8 = kc + 32 * qq + 8 * i;
                let mut x = [0u32; 4];
                if m0 + r < m {
                    x = load_a8(a.add((m0 + r) * k + k8), k8, k, p.flags & FLAG_A_VEC16 != 0);
                }
                let (lo, hi) = (lo_half, hi_half);
                let row = a_s.offset((r * A_ROW_BYTES) as u32);
                let at = |step: usize, kk: usize| row.offset(((step * 16 + kk) * 2) as u32);
                st_shared_u32(at(2 * i, 2 * qq), pair(lo(x[0]), lo(x[2])));
                st_shared_u32(at(2 * i, 2 * qq + 8), pair(hi(x[0]), hi(x[2])));
                st_shared_u32(at(2 * i + 1, 2 * qq), pair(lo(x[1]), lo(x[3])));
                st_shared_u32(at(2 * i + 1, 2 * qq + 8), pair(hi(x[1]), hi(x[3])));
                task += threads;
            }
        };

        let mut chunk = first;
        while chunk < last {
            let kc = chunk * CHUNK;
            let codes = chunk_codes::<NT>(b, n0, lane, kc, &p);
            let consts = chunk_consts::<T, NT, TYPED_ZERO>(scales, zeros_u8, zeros_t, n0, lane, kc, &p);
            sync::sync_threads();
            stage(kc);
            sync::sync_threads();
            mma_chunk::<T, MT, NT, TYPED_ZERO>(&mut acc, &codes, &consts, |mm, i, h| {
                ldmatrix_x4(row_addr(mm).offset(((2 * i + h) * 32) as u32))
            });
            chunk += 1;
        }

        unroll!(MM in [0, 1, 2, 3, 4, 5, 6, 7] {
            if MM < MT {
                store_tile::<T, NT>(&acc[MM], m0 + (warp_m * MT + MM) * 16, n0, lane, bias, y, workspace, &p);
            }
        });
    }
}

/// `permute`: copies A into the K order the weights' fragments produce, per 128-wide chunk
/// (the order `large` stages in shared memory): the 8 elements at K `32q + 8i` of a chunk go to
/// positions `16 (2i + h) + 2q (+ 8)` as pairs `(0,4), (1,5)` (h = 0) and `(2,6), (3,7)`
/// (h = 1), so `ldmatrix` on the copy yields the A fragment of step `2i + h`. Zero past K.
/// `IMAGE` (`permute_image`): the same order, laid out as `prefill`'s ring stages
/// ([`prefill_image_offset`]), rows from M to the tile's end zero.
///
/// # Safety
/// The launch contract (`matmul_nbits_permute_*` in the module docs).
#[inline(always)]
pub(crate) unsafe fn permute<T: TensorElement, const IMAGE: bool>(
    a: *const T,
    a_perm: *mut T,
    zeroed: *mut u32,
    p: Dims,
    zeroed_words: u32,
) {
    // Launched as a programmatic dependent of the grid before it (the previous call's main
    // kernel, which may still read the workspace this overwrites, or whatever wrote A), it
    // waits for that grid first. Only then may the kernel reading the copy (Hopper's `wgmma`
    // ones) start its prologue: it waits for this grid before it reads the copy, and what it
    // reads before (the codes) then overlaps this grid alone.
    sync::wait_for_prerequisite_grids();
    sync::allow_dependent_launch();
    let (m, k) = (p.m as usize, p.k as usize);
    let row_len = k.div_ceil(CHUNK) * CHUNK;
    // One thread per 8 consecutive elements of a padded row. K > 0, so a row has at least
    // 16 words; NonZero keeps a division-by-zero panic path out of the PTX.
    let row_words = core::num::NonZeroUsize::new(row_len / 8).unwrap_or(core::num::NonZeroUsize::MIN);
    let word = index::block_idx_x() as usize * PERMUTE_THREADS + index::thread_idx_x() as usize;
    // The stream-K flags of the kernel reading the copy, cleared here (after the wait: the
    // previous call's kernel may still spin on them) rather than by a memset before this grid,
    // which nothing could overlap. The grid has more threads than there are flags (M > 32
    // rows of 16 words at least, one flag per SM), the loop is for any grid.
    let threads = index::grid_dim_x() as usize * PERMUTE_THREADS;
    let mut flag = word;
    while flag < zeroed_words as usize {
        // SAFETY: the launch contract sizes `zeroed` for `zeroed_words` words.
        unsafe { zeroed.add(flag).write(0) };
        flag += threads;
    }
    let rows = if IMAGE { prefill_image_rows(m) } else { m };
    if word >= rows * row_words.get() {
        return;
    }
    let (row, k8) = (word / row_words, 8 * (word % row_words));
    let (chunk_start, within) = (k8 - k8 % CHUNK, k8 % CHUNK);
    let (q, i) = (within / 32, (within % 32) / 8);
    // SAFETY: load_a8 reads only rows below M and K below K; the writes stay inside the padded
    // row, or the image's tile of rows.
    unsafe {
        let x = if row < m { load_a8(a.add(row * k + k8.min(k)), k8, k, p.flags & FLAG_A_VEC16 != 0) } else { [0; 4] };
        let dst = a_perm.wrapping_add(row * row_len + chunk_start).cast::<u32>();
        let image = a_perm.cast::<u8>();
        let chunks = row_len / CHUNK;
        let at = |step: usize, kk: usize| {
            if IMAGE {
                image.add(prefill_image_offset(row, chunk_start / CHUNK, chunks, 16 * step + kk)).cast::<u32>()
            } else {
                dst.add((16 * step + kk) / 2)
            }
        };
        at(2 * i, 2 * q).write(pair(lo_half(x[0]), lo_half(x[2])));
        at(2 * i, 2 * q + 8).write(pair(hi_half(x[0]), hi_half(x[2])));
        at(2 * i + 1, 2 * q).write(pair(lo_half(x[1]), lo_half(x[3])));
        at(2 * i + 1, 2 * q + 8).write(pair(hi_half(x[1]), hi_half(x[3])));
    }
}

/// `tiled`: `MT x NT` tiles per warp, `WM x WN` warps side by side, each of them `WK` warps
/// that split every K chunk's words (`WK = 2`: words 0-1 and 2-3 of each lane's 16 bytes);
/// the permuted activations (`permute`) and the packed weights go through a ring of
/// [`TILED_STAGES`] K chunks in shared memory, filled with `cp.async` while the tensor cores work
/// on the oldest. A fragments come from `ldmatrix`; each lane takes its codes of a column with
/// one shared load and dequantizes them in registers (`(code - zero) * scale` rounded to A's
/// type, as `large`). The `WK` warps' partial tiles meet in shared memory at the end.
///
/// # Safety
/// The launch contract (`tiled` in the module docs).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_nbits_tiled<
    T: TensorElement,
    const MT: usize,
    const NT: usize,
    const WM: usize,
    const WN: usize,
    const WK: usize,
>(
    a_perm: *const T,
    b: *const u8,
    scales: *const T,
    zeros_u8: *const u8,
    bias: *const T,
    y: *mut T,
    workspace: *mut f32,
    p: Dims,
) {
    let (bm, bn, threads) = (16 * MT * WM, 8 * NT * WN, 32 * WM * WN * WK);
    // Whole pieces of 16 bytes per thread, at most 8 of each operand (the unrolled loops
    // below); WK splits the 4 words of a lane; the partial tiles fit in the ring.
    const {
        assert!((16 * MT * WM * 16) % (32 * WM * WN * WK) == 0 && 16 * MT * WM * 16 / (32 * WM * WN * WK) <= 8);
        assert!((8 * NT * WN * 4) % (32 * WM * WN * WK) == 0 && 8 * NT * WN * 4 / (32 * WM * WN * WK) <= 8);
        assert!((WK == 1 || WK == 2) && NT <= 8 && MT <= 8);
        assert!(
            (WK - 1) * WM * WN * MT * NT * 32 * 16
                <= TILED_STAGES * (16 * MT * WM * A_ROW_BYTES + 8 * NT * WN * B_CHUNK_BYTES)
        );
    };
    let (a_pieces, b_pieces) = (bm * 16 / threads, bn * 4 / threads);
    let tid = index::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, index::lane_id() as usize);
    let (kw, wmn) = (warp / (WM * WN), warp % (WM * WN));
    let (warp_m, warp_n) = (wmn / WN, wmn % WN);
    let (g, q) = (lane / 4, lane % 4);
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let row_len = k.div_ceil(CHUNK) * CHUNK;
    let row_bytes = p.row_bytes as usize;
    let m0 = index::block_idx_y() as usize * bm;
    let n_block = index::block_idx_x() as usize * bn;
    let n0 = n_block + warp_n * 8 * NT;
    let (first, last) = split_chunks(&p);
    let stage_bytes = (bm * A_ROW_BYTES + bn * B_CHUNK_BYTES) as u32;
    let smem = dynamic_shared_base();
    let a_s = |stage: u32| smem.offset(stage * stage_bytes);
    let b_s = |stage: u32| smem.offset(stage * stage_bytes + (bm * A_ROW_BYTES) as u32);
    // ldmatrix rows of tile `mt` (as `large`), and this lane's words of column tile `j`.
    let a_row = |mt: usize| ldmatrix_a_row(warp_m * MT + mt, lane);
    let b_col = |j: usize| ((warp_n * 8 * NT + 8 * j + g) * B_CHUNK_BYTES + 16 * q + 16 / WK * kw) as u32;
    let zero_u8 = p.flags & FLAG_ZERO_U8 != 0;

    let mut acc = [[[0.0f32; 4]; NT]; MT];
    // SAFETY (whole body): the launch contract sizes every buffer and the shared memory; copies
    // read only rows below M and N and bytes inside the rows (zero-filled otherwise); scale
    // and zero-point indices are clamped into their tensors; barriers and warp-collective
    // instructions are reached uniformly (loop bounds depend only on the block).
    unsafe {
        // This thread's copies, fixed but for the chunk's offset: source (at chunk 0), bytes
        // to copy (0: zero-fill from the tensor's base) and destination in a stage.
        let mut a_src = [a_perm.cast::<u8>(); 8];
        let mut a_bytes = [0u32; 8];
        let mut a_dst = [0u32; 8];
        unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
            if U < a_pieces {
                let (r, part) = ((tid + U * threads) / 16, (tid + U * threads) % 16);
                if m0 + r < m {
                    a_src[U] = a_perm.add((m0 + r) * row_len + 8 * part).cast();
                    a_bytes[U] = 16;
                }
                a_dst[U] = (r * A_ROW_BYTES + 16 * part) as u32;
            }
        });
        let mut b_src = [b; 8];
        let mut b_part = [0usize; 8];
        let mut b_col_ok = [false; 8];
        let mut b_dst = [0u32; 8];
        unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
            if U < b_pieces {
                let (c, part) = ((tid + U * threads) / 4, (tid + U * threads) % 4);
                b_col_ok[U] = n_block + c < n;
                if b_col_ok[U] {
                    b_src[U] = b.add((n_block + c) * row_bytes + 16 * part);
                }
                b_part[U] = 16 * part;
                b_dst[U] = (c * B_CHUNK_BYTES + 16 * part) as u32;
            }
        });
        let load = |chunk: usize, stage: u32| {
            unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
                if U < a_pieces {
                    let src = if a_bytes[U] != 0 { a_src[U].add(chunk * CHUNK * 2) } else { a_src[U] };
                    cp_async_16_zfill(a_s(stage).offset(a_dst[U]), src, a_bytes[U]);
                }
            });
            unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
                if U < b_pieces {
                    // Rows are multiples of 16 bytes (blocks of 32 or more): a piece is all in
                    // or all out.
                    let offset = chunk * B_CHUNK_BYTES;
                    let ok = b_col_ok[U] && offset + b_part[U] < row_bytes;
                    let src = if ok { b_src[U].add(offset) } else { b };
                    cp_async_16_zfill(b_s(stage).offset(b_dst[U]), src, 16 * ok as u32);
                }
            });
        };
        // Dequantization constants of this lane's columns: its 32 codes of a chunk lie in one
        // block. Blocks past K (only met with zero activations) read the last block.
        let scale_rows: [*const u16; NT] =
            core::array::from_fn(|j| scales.add((n0 + 8 * j + g).min(n - 1) * p.k_blocks as usize).cast());
        let zero_rows: [*const u8; NT] = core::array::from_fn(|j| {
            if zero_u8 {
                zeros_u8.add((n0 + 8 * j + g).min(n - 1) * (p.k_blocks as usize).div_ceil(2))
            } else {
                zeros_u8
            }
        });
        let consts_of = |chunk: usize| -> [BlockConsts; NT] {
            let blk = ((chunk * CHUNK + 32 * q) >> p.block_shift).min(p.k_blocks as usize - 1);
            core::array::from_fn(|j| {
                let scale = ld_global_nc_u16(scale_rows[j].add(blk)) as u32;
                let zero = if zero_u8 { zero_of_block(zero_rows[j], blk) } else { 8 };
                BlockConsts { scale2: scale | (scale << 16), zero, zero_f: 0.0, scale_f: 0.0 }
            })
        };

        unroll!(S in [0, 1, 2, 3, 4, 5, 6, 7] {
            if S + 1 < TILED_STAGES {
                if first + S < last {
                    load(first + S, S as u32);
                }
                async_copy::commit_group();
            }
        });
        // With WK = 1 a warp's chunk of math is shorter than a scale load's latency, so its
        // constants load two chunks ahead (measured 2-4% at M >= 128; one ahead where warp
        // pairs split the chunk, which the extra registers slowed by 6-8%).
        let two_ahead = WK == 1;
        let last_chunk = last.saturating_sub(1);
        let mut consts = consts_of(first.min(last_chunk));
        let mut next_consts = if two_ahead { consts_of((first + 1).min(last_chunk)) } else { consts };
        let mut chunk = first;
        let mut stage = 0u32;
        while chunk < last {
            async_copy::wait_group::<{ TILED_STAGES as u32 - 2 }>();
            sync::sync_threads();
            // The stage refilled here was read in the previous iteration, before the barrier.
            let ahead = chunk + TILED_STAGES - 1;
            let ahead_stage = if stage == 0 { TILED_STAGES as u32 - 1 } else { stage - 1 };
            if ahead < last {
                load(ahead, ahead_stage);
            }
            async_copy::commit_group();
            let ahead_consts = match (two_ahead, chunk + 1 + two_ahead as usize) {
                (_, c) if c < last => consts_of(c),
                (true, _) => next_consts,
                (false, _) => consts,
            };
            let codes: [[u32; 4]; NT] = core::array::from_fn(|j| {
                let at = b_s(stage).offset(b_col(j));
                if WK == 2 {
                    let w = ld_shared_v2(at);
                    [w[0], w[1], 0, 0]
                } else {
                    ld_shared_v4(at)
                }
            });
            let a_tile = a_s(stage);
            unroll!(I in [0, 1, 2, 3] {
                if I < 4 / WK {
                    let step0 = 2 * (kw * (4 / WK) + I);
                    let mut frag = [[0u32; 4]; NT];
                    unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if J < NT {
                            frag[J] = dequantize::<T>(codes[J][I], consts[J], false);
                        }
                    });
                    unroll!(H in [0, 1] {
                        unroll!(MM in [0, 1, 2, 3, 4, 5, 6, 7] {
                            if MM < MT {
                                let af = ldmatrix_x4(a_tile.offset(a_row(MM) + ((step0 + H) * 32) as u32));
                                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                                    if J < NT {
                                        acc[MM][J] = T::mma(acc[MM][J], af, [frag[J][2 * H], frag[J][2 * H + 1]]);
                                    }
                                });
                            }
                        });
                    });
                }
            });
            if two_ahead {
                consts = next_consts;
                next_consts = ahead_consts;
            } else {
                consts = ahead_consts;
            }
            chunk += 1;
            stage = if stage + 1 == TILED_STAGES as u32 { 0 } else { stage + 1 };
        }
        async_copy::wait_group::<0>();

        if WK > 1 {
            // The ring is free once every warp is past its last chunk.
            sync::sync_threads();
            let slot = |kk: usize, mm: usize, j: usize| {
                smem.offset((((((kk - 1) * WM * WN + wmn) * MT + mm) * NT + j) * 32 + lane) as u32 * 16)
            };
            if kw != 0 {
                unroll!(MM in [0, 1, 2, 3, 4, 5, 6, 7] {
                    unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if MM < MT && J < NT {
                            st_shared_v4(slot(kw, MM, J), acc[MM][J].map(f32::to_bits));
                        }
                    });
                });
            }
            sync::sync_threads();
            if kw == 0 {
                for kk in 1..WK {
                    unroll!(MM in [0, 1, 2, 3, 4, 5, 6, 7] {
                        unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                            if MM < MT && J < NT {
                                let part = ld_shared_v4(slot(kk, MM, J));
                                unroll!(C in [0, 1, 2, 3] {
                                    acc[MM][J][C] += f32::from_bits(part[C]);
                                });
                            }
                        });
                    });
                }
            }
        }
        if kw == 0 {
            unroll!(MM in [0, 1, 2, 3, 4, 5, 6, 7] {
                if MM < MT {
                    store_tile::<T, NT>(&acc[MM], m0 + (warp_m * MT + MM) * 16, n0, lane, bias, y, workspace, &p);
                }
            });
        }
    }
}
