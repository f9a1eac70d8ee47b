//! W4A16 matmul in ONNX Runtime's `MatMulNBits` format (bits = 4): `Y = A W^T (+ bias)` with
//! `W [N, K]` stored as 4-bit codes in blocks along K, on tensor cores.
//!
//! Layouts (row-major): `a [M, K]` f16/bf16; `b` u8 `[N, k_blocks, block_size / 2]` (code `2i` in
//! the low nibble of byte `i`); `scales [N, k_blocks]` in A's type; zero points either none (8),
//! u8 `[N, ceil(k_blocks / 2)]` (block `2j` in the low nibble of byte `j`) or `[N, k_blocks]` in
//! A's type; `bias [N]` or null; `y [M, N]`.
//!
//! The weights are read once, straight from the `MatMulNBits` layout (no repacking): lane
//! `(g, q)` of a warp takes 16 bytes (32 codes) of column `g` of an 8-column tile at K offset
//! `32q` of each 128-wide K chunk, and turns each 32-bit word into the weight fragments of two
//! `mma.sync.m16n8k16` steps (codes `(0,4),(1,5)` then `(2,6),(3,7)`, which is what the
//! OR-into-mantissa conversion yields); `decode` takes columns `g` and `g + 8` of 16-column
//! tiles, the weights being its A operand. (`decode*_packed` read B repacked so that word `i` of
//! lane `q`'s 16 bytes holds K `32i + 8q` instead of `32q + 8i`, its even codes in nibbles 0-3:
//! the pairs are then `(0,1),(2,3)` and `(4,5),(6,7)`, consecutive K.) The sum over K does not
//! care about order, so the activations are permuted to match: `large` stages them in shared
//! memory in that order (see its staging loop) and reads them with `ldmatrix`, `tiled` reads a
//! permuted copy of A (`permute`) through a `cp.async` ring; `small` and `decode` build each
//! lane's fragments from its own global loads (`decode*_packed`: the loaded words as they are).
//! `small`, `large` and `tiled` dequantize to `(code - zero) * scale` rounded to A's type (as
//! ONNX Runtime's CUDA kernel does); `decode` scales each block's f32 sums instead (no rounding
//! of the weights): `decode16*` feed the exact `code - zero` to the tensor cores, `decode8*` the
//! codes plus fixed offsets, and take what the offsets and the zero point added off each chunk's
//! f32 sums. Accumulation in f32.
//!
//! # Launch contract: `matmul_nbits_{f16,bf16}_{decode8,decode8_ahead3,decode16,small,large}[_zf]`
//! - `_zf`: zero points in A's type (fractional allowed; dequantized in f32); otherwise u8 or
//!   none, dequantized exactly in packed 16-bit arithmetic.
//! - `small`: warp tile 16 x 32, 4 warps splitting the block's K chunks (block tile 16 x 32),
//!   block `(128, 1, 1)`, 6144 bytes of static shared memory for the warps' partial sums.
//!   `decode8` / `decode8_ahead3` / `decode16`: the same block tile (`BM` = 8 or 16 rows of A,
//!   32 columns) with swapped operands (the weights are the 16-row `mma` operand), block
//!   `(128, 1, 1)` (`DECODE_WARPS` = 4), 32768 bytes (`DECODE_SHARED_BYTES`) of dynamic shared
//!   memory. `large`: warp tile 64 x 32, 2 x 4 warps (block tile 128 x 128), block `(256, 1, 1)`.
//! - `decode*` only: zero points none or u8, `block_size >= 128`, `K % 8 == 0`, `a` and `b`
//!   16-byte aligned and `row_bytes % 16 == 0`.
//! - grid `(ceil(N / BN), ceil(M / BM), splits)`; split `z` covers K chunks
//!   `[z * chunks_per_split, (z + 1) * chunks_per_split)` of 128.
//! - dynamic shared memory: `large` `BM * 272` bytes (one K chunk of A at a time), `decode*` as
//!   above; `small` none.
//! - `splits == 1`: writes `y` (+ bias). Otherwise writes f32 partial sums to `workspace`
//!   `[splits, M, N]` for `matmul_nbits_reduce_*`.
//! - `small`, `large`: `a`, `b`, `y` need no alignment beyond their element type (16-byte
//!   vector loads are used when `flags` says the rows allow them).
//! - `decode8_packed` / `decode16_packed`: as `decode8_ahead3` / `decode16`, but `b` holds the
//!   records of `W4Weights::pack_for_decode` (`PACKED_RECORD_BYTES` per 32-column tile and K
//!   chunk, tile-major; the scales and zero points are read from them), and the dynamic shared
//!   memory is `DECODE_PACKED_SHARED_BYTES`.
//! - `decode8_packed_wide`: `decode8_packed` with `DECODE_WIDE_WARPS` = 8 warps splitting K,
//!   block `(256, 1, 1)`, `DECODE_WIDE_PACKED_SHARED_BYTES` of dynamic shared memory;
//!   `decode16_packed_wide`: `decode16_packed` with `DECODE16_WIDE_WARPS` = 6, block
//!   `(192, 1, 1)`, `DECODE16_WIDE_PACKED_SHARED_BYTES`.
//! - `decode*` (and `packed_wgmma*`) may be launched as programmatic dependents of the previous
//!   grid in the stream (sm_90a module): they wait for it before reading A or writing anything,
//!   and before reading B, scales and zero points unless `flags & FLAG_WEIGHTS_READY`; with
//!   `flags & FLAG_EARLY_DEPENDENTS` each block lets the next grid start once past that wait.
//! - Larger M on Hopper: `matmul_nbits_{f16,bf16}_wgmma`, in `matmul_nbits_wgmma.rs`
//!   (sm_90a module only).
//!
//! # Launch contract: `matmul_nbits_{f16,bf16}_tiled{32x128,64x128,128x128}`
//! - `a` is the permuted copy of A (`matmul_nbits_permute_*`, rows of `ceil(K / 128) * 128`
//!   elements, 16-byte aligned); zero points none or u8; `block_size >= 32`; `b` 16-byte
//!   aligned with `row_bytes % 16 == 0` (always so for blocks of 32 or more).
//! - block tile as named, block `(256, 1, 1)`: warp tiles 16 x 32 / 64 x 32 with pairs of
//!   warps splitting each chunk's words (`32x128`, `64x128`), 64 x 32 in 2 x 4 warps
//!   (`128x128`); dynamic shared memory `tiled_shared_bytes` (67584, 102400, 172032 bytes:
//!   needs the opt-in above 48 KiB). Grid, splits and outputs as above.
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
//! # Launch contract: `matmul_nbits_reduce_{f16,bf16}`
//! - grid `(ceil(M * N / 256), 1, 1)`, block `(256, 1, 1)`: `y = sum over splits + bias`.
//!
//! # Launch contract: `matmul_nbits_pack_decode(b, scales, zeros_u8, packed, dims)`
//! - Writes the records `decode*_packed` read (`PACKED_RECORD_BYTES` per 32-column tile and K
//!   chunk, tile-major; the layout's docs) from B in `MatMulNBits` layout: the device twin of
//!   `W4Weights::pack_for_decode`. Any element type: the scales are copied as 16-bit words.
//! - grid `(ceil(N / 32) * ceil(K / 128), 1, 1)`, block `(PACK_THREADS, 1, 1)`, no shared memory.
//! - `dims`: `n`, `k`, `block_shift` (`block_size >= 128`), `row_bytes` (a multiple of 16),
//!   `k_blocks` and `flags & FLAG_ZERO_U8` (zero points u8 `[N, ceil(k_blocks / 2)]`;
//!   otherwise `zeros_u8` is not read and every zero point is 8); the rest is ignored.
//! - `b` and `packed` 16-byte aligned; `packed` holds the grid's records and does not overlap
//!   the inputs.

use crate::device::async_copy::{cp_async_16, cp_async_16_zfill};
use crate::device::bits::{high_halves, low_halves};
use crate::device::ldmatrix::ldmatrix_x4;
use crate::device::math::fma;
use crate::device::memory::{ld_global_nc_u16, ld_global_nc_u32, ld_global_nc_v4, st_global_v4};
use crate::device::shared::{dynamic_shared_base, ld_shared_v2, ld_shared_v4, st_shared_u32, st_shared_v4};
use crate::device::{async_copy, index, sync};
use crate::element::{Bf16, Element, F16, TensorElement};
use crate::{shared_array, unroll};

pub use super::layout::*;

/// The 16 bytes of codes lane `q` needs from one row of `b`, zero past the row's end.
///
/// # Safety
/// `row` must point at a row of `row_bytes` bytes.
#[inline(always)]
unsafe fn load_codes(row: *const u8, offset: usize, row_bytes: usize, vec16: bool) -> [u32; 4] {
    // SAFETY: every load is inside the row (checked per 4-byte word; row_bytes is a multiple
    // of 8) and aligned (16 bytes when `vec16`, else 4).
    unsafe {
        if vec16 && offset + 16 <= row_bytes {
            return ld_global_nc_v4(row.add(offset).cast());
        }
        let mut w = [0u32; 4];
        unroll!(I in [0, 1, 2, 3] {
            if offset + 4 * I + 4 <= row_bytes {
                w[I] = ld_global_nc_u32(row.add(offset + 4 * I).cast());
            }
        });
        w
    }
}

/// The dequantization constants of one (column, block): the scale as a pair, the integer
/// zero point, and both as f32 for fractional zero points.
#[derive(Clone, Copy)]
pub(crate) struct BlockConsts {
    pub(crate) scale2: u32,
    pub(crate) zero: u32,
    pub(crate) zero_f: f32,
    pub(crate) scale_f: f32,
}

/// # Safety
/// `col` and `blk` index valid entries of `scales` and of the zero points the flags name.
#[inline(always)]
pub(crate) unsafe fn block_consts<T: TensorElement, const TYPED_ZERO: bool>(
    col: usize,
    blk: usize,
    scales: *const T,
    zeros_u8: *const u8,
    zeros_t: *const T,
    p: &Dims,
) -> BlockConsts {
    let sb = col * p.k_blocks as usize + blk;
    // SAFETY: the caller's contract.
    unsafe {
        let scale = ld_global_nc_u16(scales.add(sb).cast()) as u32;
        let mut c = BlockConsts { scale2: scale | (scale << 16), zero: 8, zero_f: 0.0, scale_f: 0.0 };
        if TYPED_ZERO {
            c.zero_f = zeros_t.add(sb).read().to_f32();
            c.scale_f = scales.add(sb).read().to_f32();
        } else if p.flags & FLAG_ZERO_U8 != 0 {
            c.zero = zero_of_block(zeros_u8.add(col * (p.k_blocks as usize).div_ceil(2)), blk);
        }
        c
    }
}

/// The zero point of block `blk` from a column's packed u8 zero points (block `2j` in the low
/// nibble of byte `j`).
///
/// # Safety
/// `row` holds at least `blk / 2 + 1` bytes.
#[inline(always)]
unsafe fn zero_of_block(row: *const u8, blk: usize) -> u32 {
    // SAFETY: the caller's contract.
    let byte = unsafe { row.add(blk / 2).read() } as u32;
    (byte >> (4 * (blk as u32 % 2))) & 15
}

/// B fragments of one word of codes: `(code - zero) * scale` as pairs `(0,4), (1,5), (2,6),
/// (3,7)`; `typed`: fractional zero points, computed in f32 and rounded once.
#[inline(always)]
pub(crate) fn dequantize<T: TensorElement>(word: u32, c: BlockConsts, typed: bool) -> [u32; 4] {
    if typed {
        let v = |j: u32| (((word >> (4 * j)) & 15) as f32 - c.zero_f) * c.scale_f;
        return [T::pack2(v(0), v(4)), T::pack2(v(1), v(5)), T::pack2(v(2), v(6)), T::pack2(v(3), v(7))];
    }
    dequantize_biased::<T, false>(word, T::code_bias(c.zero), c.scale2)
}

/// [`dequantize`] for integer zero points given as their [`TensorElement::code_bias`] (built
/// once per block, not per word) and the scale pair; `PINNED`: see
/// [`TensorElement::codes_minus_bias`].
#[inline(always)]
pub(crate) fn dequantize_biased<T: TensorElement, const PINNED: bool>(
    word: u32,
    bias: [u32; 2],
    scale2: u32,
) -> [u32; 4] {
    let neg_zero = 0x8000_8000; // -0.0 twice: x * s + (-0) == x * s
    T::codes_minus_bias::<PINNED>(word, bias).map(|d| T::fma2(d, scale2, neg_zero))
}

/// This lane's codes of one K chunk for `NT` column tiles: 16 bytes of column `n0 + 8j + g` at
/// byte `kc / 2 + 16q` of its row (zero past N or past the row).
///
/// # Safety
/// `b` holds `n` rows of `p.row_bytes` bytes.
#[inline(always)]
unsafe fn chunk_codes<const NT: usize>(b: *const u8, n0: usize, lane: usize, kc: usize, p: &Dims) -> [[u32; 4]; NT] {
    let (g, q) = (lane / 4, lane % 4);
    let row_bytes = p.row_bytes as usize;
    let mut codes = [[0u32; 4]; NT];
    unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
        if J < NT && n0 + 8 * J + g < p.n as usize {
            // SAFETY: the row exists (checked); load_codes stays inside it.
            codes[J] = unsafe {
                load_codes(b.add((n0 + 8 * J + g) * row_bytes), kc / 2 + 16 * q, row_bytes, p.flags & FLAG_B_VEC16 != 0)
            };
        }
    });
    codes
}

/// Dequantization constants of one K chunk per tile: lane `q`'s words 0-1 and 2-3 each lie in
/// one block (blocks are at least 16 wide and 16-aligned).
///
/// # Safety
/// `scales` and the zero points the flags name hold `n` columns of `p.k_blocks` blocks.
#[inline(always)]
unsafe fn chunk_consts<T: TensorElement, const NT: usize, const TYPED_ZERO: bool>(
    scales: *const T,
    zeros_u8: *const u8,
    zeros_t: *const T,
    n0: usize,
    lane: usize,
    kc: usize,
    p: &Dims,
) -> [[BlockConsts; 2]; NT] {
    let (g, q) = (lane / 4, lane % 4);
    let mut consts = [[BlockConsts { scale2: 0, zero: 8, zero_f: 0.0, scale_f: 0.0 }; 2]; NT];
    unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
        let col = n0 + 8 * J + g;
        unroll!(HALF in [0, 1] {
            let blk = (kc + 32 * q + 16 * HALF) >> p.block_shift;
            if J < NT && col < p.n as usize && (blk as u32) < p.k_blocks {
                // Blocks of 32 or more: both halves share one block.
                consts[J][HALF] = if HALF == 1 && p.block_shift >= 5 {
                    consts[J][0]
                } else {
                    // SAFETY: col < N and blk < k_blocks (checked).
                    unsafe { block_consts::<T, TYPED_ZERO>(col, blk, scales, zeros_u8, zeros_t, p) }
                };
            }
        });
    });
    consts
}

/// One K chunk of `MT x NT` tiles: per word, dequantize the tiles' codes, then two K steps of
/// every tile with A fragments from `a_frag(mt, word, half)`.
///
/// # Safety
/// `a_frag` must be safe to call for every `(mt < MT, word < 4, half < 2)`.
#[inline(always)]
unsafe fn mma_chunk<T: TensorElement, const MT: usize, const NT: usize, const TYPED_ZERO: bool>(
    acc: &mut [[[f32; 4]; NT]; MT],
    codes: &[[u32; 4]; NT],
    consts: &[[BlockConsts; 2]; NT],
    a_frag: impl Fn(usize, usize, usize) -> [u32; 4],
) {
    unroll!(I in [0, 1, 2, 3] {
        let mut frag = [[0u32; 4]; NT];
        unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
            if J < NT {
                frag[J] = dequantize::<T>(codes[J][I], consts[J][I / 2], TYPED_ZERO);
            }
        });
        unroll!(H in [0, 1] {
            unroll!(MM in [0, 1, 2, 3, 4, 5, 6, 7] {
                if MM < MT {
                    let af = a_frag(MM, I, H);
                    unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if J < NT {
                            // SAFETY: mma.sync is warp-collective; the caller reaches it uniformly.
                            acc[MM][J] = unsafe { T::mma(acc[MM][J], af, [frag[J][2 * H], frag[J][2 * H + 1]]) };
                        }
                    });
                }
            });
        });
    });
}

/// Writes this lane's part of a `16 x 8 NT` output tile at rows `m0 + g (+ 8)`, columns
/// `n0 + 8j + 2q (+ 1)`: to `y` (+ bias) when K is not split, else to split `z` of `workspace`.
///
/// # Safety
/// The launch contract sizes `y`, `bias` and `workspace`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn store_tile<T: TensorElement, const NT: usize>(
    acc: &[[f32; 4]; NT],
    m0: usize,
    n0: usize,
    lane: usize,
    bias: *const T,
    y: *mut T,
    workspace: *mut f32,
    p: &Dims,
) {
    let (g, q) = (lane / 4, lane % 4);
    let (m, n) = (p.m as usize, p.n as usize);
    let (split, splits) = (index::block_idx_z() as usize, index::grid_dim_z() as usize);
    unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
        if J < NT {
            unroll!(R in [0, 1] {
                // Columns col and col + 1 of row `row`: one 4-byte (8-byte) store when both
                // exist and the address allows, else one by one.
                let (row, col) = (m0 + g + 8 * R, n0 + 8 * J + 2 * q);
                let (v0, v1) = (acc[J][2 * R], acc[J][2 * R + 1]);
                if row < m && col < n {
                    let both = col + 1 < n;
                    // SAFETY: row < M and col (+ 1 when `both`) < N (checked); the caller's
                    // contract sizes the buffers.
                    unsafe {
                        if splits == 1 {
                            let bias_at =
                                |c: usize| if p.flags & FLAG_BIAS != 0 { bias.add(c).read().to_f32() } else { 0.0 };
                            let dst = y.add(row * n + col);
                            if both && (dst as usize).is_multiple_of(4) {
                                dst.cast::<u32>().write(T::pack2(v0 + bias_at(col), v1 + bias_at(col + 1)));
                            } else {
                                dst.write(T::from_f32(v0 + bias_at(col)));
                                if both {
                                    dst.add(1).write(T::from_f32(v1 + bias_at(col + 1)));
                                }
                            }
                        } else {
                            let dst = workspace.add((split * m + row) * n + col);
                            if both && (dst as usize).is_multiple_of(8) {
                                dst.cast::<[f32; 2]>().write([v0, v1]);
                            } else {
                                dst.write(v0);
                                if both {
                                    dst.add(1).write(v1);
                                }
                            }
                        }
                    }
                }
            });
        }
    });
}

/// First and one-past-last K chunk of this block's split.
#[inline(always)]
pub(crate) fn split_chunks(p: &Dims) -> (usize, usize) {
    let chunks = (p.k as usize).div_ceil(CHUNK);
    let first = index::block_idx_z() as usize * p.chunks_per_split as usize;
    (first, (first + p.chunks_per_split as usize).min(chunks))
}

/// [`split_chunks`] as the first chunk and the count (0 for a split past K), in 32 bits: 64-bit
/// compares and shifts cost twice the instructions in a loop (K < 2^31, so chunks < 2^24).
#[cfg(dlkern_arch_specific)]
#[inline(always)]
pub(crate) fn split_chunk_range(p: &Dims) -> (u32, u32) {
    let (first, last) = split_chunks(p);
    (first as u32, last.saturating_sub(first) as u32)
}

/// `small`: 16 rows of A per block, `NT` column tiles, `WK` warps splitting the
/// block's K chunks (warp `w` takes chunks `first + w`, `+ WK`, ...), two chunks in flight per
/// warp; the warps' partial tiles are summed through shared memory at the end. Each lane
/// loads the activations its fragments need straight from global memory (they stay in L1).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_nbits_small<T: TensorElement, const NT: usize, const WK: usize, const TYPED_ZERO: bool>(
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
/// `[warp - 1][tile][lane]` x 16 bytes: conflict-free), and warp 0 stores the result.
///
/// # Safety
/// Reached by every thread of the block; the launch contract sizes the outputs.
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
    const { assert!((WK - 1) * NT * 32 * 16 <= 6144) };
    let (warp, lane) = (index::thread_idx_x() as usize / 32, index::lane_id() as usize);
    let slot = |wp: usize, j: usize| partials.offset((((wp - 1) * NT + j) * 32 + lane) as u32 * 16);
    // SAFETY: slots are inside the array (asserted above); the barrier separates the writes
    // from the reads and is reached by all threads.
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
            store_tile::<T, NT>(acc, m0, n0, lane, bias, y, workspace, p);
        }
    }
}

/// The dequantization constants of one K chunk of one lane of `decode`: those of weight
/// columns `16t + g` and `16t + g + 8` of tile `t` (the rows of its accumulator tiles).
#[derive(Clone, Copy)]
struct DecodeConsts {
    scales: [[u16; 2]; DECODE_TILES],
    zeros: [[u32; 2]; DECODE_TILES],
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
/// at the end.
///
/// # Safety
/// The launch contract (`decode*` in the module docs).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_nbits_decode<
    T: TensorElement,
    const R: usize,
    const A_AHEAD: usize,
    const PACKED: bool,
    const WARPS: usize,
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
    let stage_bytes = if PACKED { DECODE_PACKED_STAGE_BYTES } else { DECODE_STAGE_BYTES } as u32;
    let ring = dynamic_shared_base().offset(warp * DECODE_STAGES as u32 * stage_bytes);
    // This lane's 16 bytes of column `u` in a stage: conflict-free for both the copy and the
    // read (a quarter warp covers 128 contiguous bytes).
    let piece = |stage: u32, u: usize| {
        ring.offset(stage * stage_bytes + ((g as usize + 8 * u) * B_CHUNK_BYTES) as u32 + 16 * q)
    };
    // `PACKED`: lane group `g`'s 16 bytes of constants in a stage (the record's own), which lane
    // `4g` copies and the group reads after a warp barrier. (Every lane copying its group's 16
    // bytes into a place of its own took 8 times the shared-memory wavefronts of distinct
    // pieces: docs/perf-notes/matmul_nbits.md v25.)
    let consts_piece = |stage: u32| ring.offset(stage * stage_bytes + DECODE_STAGE_BYTES as u32 + 16 * g);
    // `PACKED`: this block's first record; a chunk's record is `PACKED_RECORD_BYTES` further.
    let chunks_total = k.div_ceil(CHUNK as u32) as usize;
    let block_records = b.wrapping_add(index::block_idx_x() as usize * chunks_total * PACKED_RECORD_BYTES);
    let chunk_stride = if PACKED { PACKED_RECORD_BYTES } else { B_CHUNK_BYTES };

    // SAFETY (whole body): every pointer formed below stays inside its tensor (columns
    // clamped to N - 1, rows to M - 1, K offsets checked against K; every chunk lies in the
    // rows of `b` because they hold whole blocks of at least 128 codes, and its block is below
    // k_blocks); `mma` and the barrier are reached uniformly (loop bounds depend only on the
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
                let record = block_records.add(chunk as usize * PACKED_RECORD_BYTES);
                if q == 0 {
                    cp_async_16(consts_piece(stage), record.add(DECODE_STAGE_BYTES + 16 * g as usize));
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
        // `PACKED`: the constants from the stage (scale bits in words 0-1, zero points in 2).
        let packed_consts = |stage: u32| -> DecodeConsts {
            let w = ld_shared_v4(consts_piece(stage));
            let mut c = DecodeConsts { scales: [[0; 2]; TILES], zeros: [[8; 2]; TILES] };
            unroll!(U in [0, 1, 2, 3] {
                c.scales[U / 2][U % 2] = (w[U / 2] >> (16 * (U % 2))) as u16;
                c.zeros[U / 2][U % 2] = (w[2] >> (8 * U)) & 0xff;
            });
            c
        };
        let consts = |chunk: u32| -> DecodeConsts {
            let blk = ((chunk * CHUNK as u32) >> p.block_shift) as usize;
            let mut c = DecodeConsts { scales: [[0; 2]; TILES], zeros: [[8; 2]; TILES] };
            unroll!(U in [0, 1, 2, 3] {
                c.scales[U / 2][U % 2] = ld_global_nc_u16(scale_rows[U].add(blk).cast());
                if zero_u8 {
                    c.zeros[U / 2][U % 2] = zero_of_block(zero_rows[U], blk);
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
        // Those sums of a chunk (`R` = 1; none at `R` = 2): rows 0-7 the offsets' sums of tokens
        // 2q and 2q + 1, rows 8-15 their plain sums.
        let offset_sums = |a: &[[[[u32; 2]; 2]; 4]; R]| -> [f32; 4] {
            let mut sums = [0.0f32; 4];
            if R == 1 {
                unroll!(I in [0, 1, 2, 3] {
                    unroll!(H in [0, 1] {
                        sums = T::mma(sums, T::OFFSET_SUMS, a[0][I][H]);
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
                       sums: &[f32; 4],
                       from: usize,
                       to: usize,
                       acc: &mut [[[f32; 4]; R]; TILES]| {
            unroll!(TT in [0, 1] {
                if TT >= from && TT < to {
                    let codes = [ld_shared_v4(piece(stage, 2 * TT)), ld_shared_v4(piece(stage, 2 * TT + 1))];
                    let mut part = [[0.0f32; 4]; R];
                    unroll!(I in [0, 1, 2, 3] {
                        let (d0, d1) = if R == 1 {
                            (T::codes_plus_offset(codes[0][I]), T::codes_plus_offset(codes[1][I]))
                        } else {
                            let bias = [T::code_bias(c.zeros[TT][0]), T::code_bias(c.zeros[TT][1])];
                            (
                                T::codes_minus_bias::<true>(codes[0][I], bias[0]),
                                T::codes_minus_bias::<true>(codes[1][I], bias[1]),
                            )
                        };
                        unroll!(H in [0, 1] {
                            let af = [d0[2 * H], d1[2 * H], d0[2 * H + 1], d1[2 * H + 1]];
                            unroll!(RR in [0, 1] {
                                if RR < R {
                                    part[RR] = T::mma(part[RR], af, a[RR][I][H]);
                                }
                            });
                        });
                    });
                    // Rows g (c0, c1) and g + 8 (c2, c3) of the tile are weight columns 16t + g and
                    // 16t + g + 8; c0 and c2 are token 2q, c1 and c3 token 2q + 1.
                    let s = [T::from_bits(c.scales[TT][0]).to_f32(), T::from_bits(c.scales[TT][1]).to_f32()];
                    let neg_zero = [-(c.zeros[TT][0] as f32), -(c.zeros[TT][1] as f32)];
                    unroll!(RR in [0, 1] {
                        if RR < R {
                            unroll!(C in [0, 1, 2, 3] {
                                let exact = if R == 1 {
                                    fma(neg_zero[C / 2], sums[2 + C % 2], part[RR][C] - sums[C % 2])
                                } else {
                                    part[RR][C]
                                };
                                acc[TT][RR][C] = fma(s[C / 2], exact, acc[TT][RR][C]);
                            });
                        }
                    });
                }
            });
        };

        // The scales and zero points come from DRAM like the codes, so they load as far ahead,
        // into a register ring beside the shared one: the loop is unrolled by the ring's
        // length so that every slot has a fixed register.
        let mut ring_consts = [DecodeConsts { scales: [[0; 2]; TILES], zeros: [[8; 2]; TILES] }; DECODE_STAGES];
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
                        // (before the next loads in the PTX, which ptxas keeps).
                        let mut from = 0;
                        if PACKED {
                            if R == 2 {
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
                                let mut bits = sums.map(f32::to_bits);
                                sync::order_point(&mut bits);
                                sums = bits.map(f32::from_bits);
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
            // Accumulator element C of tile t, row set r: weight column 16t + g + 8 (C / 2),
            // token 8r + 2q + C % 2.
            let (split, splits) = (index::block_idx_z() as usize, index::grid_dim_z() as usize);
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

/// The low and high half of a packed pair, and the pair of two halves (`lo` in the low half).
#[inline(always)]
fn lo_half(v: u32) -> u32 {
    v & 0xFFFF
}
#[inline(always)]
fn hi_half(v: u32) -> u32 {
    v >> 16
}
#[inline(always)]
fn pair(lo: u32, hi: u32) -> u32 {
    lo | (hi << 16)
}

/// 8 halves of A at `src` (K index `k8` of a row of `k`) as 4 packed words, zero past K: one
/// 16-byte load when `vec16` (16-byte rows) and all 8 are in the row, else one by one.
///
/// # Safety
/// `src` points at element `k8` of a row of `k` elements.
#[inline(always)]
unsafe fn load_a8<T>(src: *const T, k8: usize, k: usize, vec16: bool) -> [u32; 4] {
    // SAFETY: the caller's contract; every element read is below K.
    unsafe {
        if vec16 && k8 + 8 <= k {
            return ld_global_nc_v4(src.cast());
        }
        let mut h = [0u32; 8];
        unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
            if k8 + E < k {
                h[E] = src.add(E).cast::<u16>().read() as u32;
            }
        });
        [pair(h[0], h[1]), pair(h[2], h[3]), pair(h[4], h[5]), pair(h[6], h[7])]
    }
}

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
unsafe fn matmul_nbits_large<
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
///
/// # Safety
/// The launch contract (`matmul_nbits_permute_*` in the module docs).
#[inline(always)]
unsafe fn permute<T: TensorElement>(a: *const T, a_perm: *mut T, zeroed: *mut u32, p: Dims, zeroed_words: u32) {
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
    if word >= m * row_words.get() {
        return;
    }
    let (row, k8) = (word / row_words, 8 * (word % row_words));
    let (chunk_start, within) = (k8 - k8 % CHUNK, k8 % CHUNK);
    let (q, i) = (within / 32, (within % 32) / 8);
    // SAFETY: row < M and load_a8 reads only below K; the writes stay inside the padded row.
    unsafe {
        let x = load_a8(a.add(row * k + k8.min(k)), k8, k, p.flags & FLAG_A_VEC16 != 0);
        let dst = a_perm.add(row * row_len + chunk_start).cast::<u32>();
        let at = |step: usize, kk: usize| dst.add((16 * step + kk) / 2);
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
unsafe fn matmul_nbits_tiled<
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

#[inline(always)]
unsafe fn reduce<T: Element>(bias: *const T, y: *mut T, workspace: *const f32, p: Dims, splits: u32) {
    let i = (index::block_idx_x() * REDUCE_THREADS as u32 + index::thread_idx_x()) as usize;
    let (m, n) = (p.m as usize, p.n as usize);
    if i >= m * n {
        return;
    }
    // SAFETY: the launch contract sizes the buffers; i < M * N.
    unsafe {
        // n > 0 here (i < m * n); NonZero keeps a division-by-zero panic path out of the PTX.
        let col = i % core::num::NonZeroUsize::new(n).unwrap_or(core::num::NonZeroUsize::MIN);
        let mut sum = if p.flags & FLAG_BIAS != 0 { bias.add(col).read().to_f32() } else { 0.0 };
        for z in 0..splits as usize {
            sum += workspace.add(z * m * n + i).read();
        }
        y.add(i).write(T::from_f32(sum));
    }
}

/// `matmul_nbits_pack_decode`: one block per record; thread `t` writes piece `t % 4` of column
/// `t / 4`'s chunk, threads 0-7 also lane group `t`'s constants.
///
/// # Safety
/// The launch contract (`matmul_nbits_pack_decode` in the module docs).
#[inline(always)]
unsafe fn pack_decode(b: *const u8, scales: *const u16, zeros_u8: *const u8, packed: *mut u8, p: Dims) {
    // K > 0, so there is at least one chunk; NonZero keeps a division-by-zero panic path out
    // of the PTX.
    let chunks = core::num::NonZeroUsize::new((p.k as usize).div_ceil(CHUNK)).unwrap_or(core::num::NonZeroUsize::MIN);
    let record = index::block_idx_x() as usize;
    let (tile, chunk) = (record / chunks, record % chunks);
    let t = index::thread_idx_x() as usize;
    let (n, row_bytes, k_blocks) = (p.n as usize, p.row_bytes as usize, p.k_blocks as usize);
    // Columns past N repeat column N - 1 (never stored: the kernels mask them).
    let column = |local: usize| (tile * DECODE_COLUMNS + local).min(n - 1);
    // SAFETY: the launch contract: the record lies in `packed`; a row holds
    // `k_blocks * block_size / 2 >= chunks * B_CHUNK_BYTES` bytes, so the piece is inside it.
    unsafe {
        let dst = packed.add(record * PACKED_RECORD_BYTES);
        // Word `i` of piece `q` is word `4 i + q` of the column's chunk, its codes in the
        // records' nibble order (the layout's docs).
        let (local, q) = (t / 4, t % 4);
        let src = b.add(column(local) * row_bytes + chunk * B_CHUNK_BYTES + 4 * q);
        let words: [u32; 4] = core::array::from_fn(|i| packed_code_word(ld_global_nc_u32(src.add(16 * i).cast())));
        st_global_v4(dst.add(16 * t).cast(), words);
        if t < 8 {
            let blk = (chunk * CHUNK) >> p.block_shift;
            let mut words = [0u32; 4];
            unroll!(U in [0, 1, 2, 3] {
                let n = column(t + 8 * U);
                words[U / 2] |= (ld_global_nc_u16(scales.add(n * k_blocks + blk)) as u32) << (16 * (U % 2));
                let zero = if p.flags & FLAG_ZERO_U8 != 0 {
                    zero_of_block(zeros_u8.add(n * k_blocks.div_ceil(2)), blk)
                } else {
                    8
                };
                words[2] |= zero << (8 * U);
            });
            st_global_v4(dst.add(DECODE_STAGE_BYTES + 16 * t).cast(), words);
        }
    }
}

/// B repacked for `decode*_packed`; see the module docs.
///
/// # Safety
/// The launch contract in the module docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_nbits_pack_decode(
    b: *const u8,
    scales: *const u16,
    zeros_u8: *const u8,
    packed: *mut u8,
    dims: Dims,
) {
    // SAFETY: forwarded launch contract.
    unsafe { pack_decode(b, scales, zeros_u8, packed, dims) }
}

macro_rules! matmul_nbits_entry {
    ($name:ident, $ty:ty, $call:expr) => {
        /// One variant of the W4A16 kernel; see the module docs.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            a: *const $ty,
            b: *const u8,
            scales: *const $ty,
            zeros_u8: *const u8,
            zeros_t: *const $ty,
            bias: *const $ty,
            y: *mut $ty,
            workspace: *mut f32,
            dims: Dims,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { $call(a, b, scales, zeros_u8, zeros_t, bias, y, workspace, dims) }
        }
    };
}
// The Hopper kernels' entries (`matmul_nbits_wgmma.rs`) take the same parameters.
#[cfg(dlkern_arch_specific)]
pub(crate) use matmul_nbits_entry;

macro_rules! matmul_nbits_tiled_entry {
    ($name:ident, $ty:ty, $tiling:ident) => {
        matmul_nbits_entry!($name, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            matmul_nbits_tiled::<$ty, { $tiling.mt }, { $tiling.nt }, { $tiling.wm }, { $tiling.wn }, { $tiling.wk }>(
                a, b, s, z, bias, y, ws, d,
            )
        });
    };
}

macro_rules! matmul_nbits_entries {
    (
        $ty:ty, $decode8:ident, $decode8_ahead3:ident, $decode16:ident, $decode8_packed:ident, $decode8_packed_wide:ident, $decode16_packed:ident, $decode16_packed_wide:ident, $small:ident, $small_zf:ident, $large:ident, $large_zf:ident,
        $tiled32x128:ident, $tiled64x128:ident, $tiled128x128:ident, $permute:ident,
        $reduce:ident
    ) => {
        matmul_nbits_entry!($decode8, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            matmul_nbits_decode::<$ty, 1, 1, false, DECODE_WARPS>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode8_ahead3, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            matmul_nbits_decode::<$ty, 1, 3, false, DECODE_WARPS>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode16, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            matmul_nbits_decode::<$ty, 2, 1, false, DECODE_WARPS>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode8_packed, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            matmul_nbits_decode::<$ty, 1, 3, true, DECODE_WARPS>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode8_packed_wide, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            matmul_nbits_decode::<$ty, 1, 3, true, DECODE_WIDE_WARPS>(a, b, s, z, bias, y, ws, d)
        });
        // 2 blocks of 256 threads per SM for the wide build, 4 of 128 for the other: both
        // spill-free under ptxas 13.5 since the records' nibble order (`decode8_packed` takes 132
        // registers uncapped; tests/ptx.rs). The cap measured 1-4.5% faster at N = 28672 (896 blocks),
        // where the uncapped build, at 3 blocks per SM, lost 8% (docs/perf-notes/matmul_nbits.md
        // v28).
        crate::entry_directive!($decode8_packed_wide, ".maxnreg 128");
        crate::entry_directive!($decode8_packed, ".maxnreg 128");
        matmul_nbits_entry!($decode16_packed, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            matmul_nbits_decode::<$ty, 2, 1, true, DECODE_WARPS>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode16_packed_wide, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            matmul_nbits_decode::<$ty, 2, 1, true, DECODE16_WIDE_WARPS>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($small, $ty, matmul_nbits_small::<$ty, { SMALL.nt }, { SMALL.wk }, false>);
        matmul_nbits_entry!($small_zf, $ty, matmul_nbits_small::<$ty, { SMALL.nt }, { SMALL.wk }, true>);
        matmul_nbits_entry!(
            $large,
            $ty,
            matmul_nbits_large::<$ty, { LARGE.mt }, { LARGE.nt }, { LARGE.wm }, { LARGE.wn }, false>
        );
        matmul_nbits_entry!(
            $large_zf,
            $ty,
            matmul_nbits_large::<$ty, { LARGE.mt }, { LARGE.nt }, { LARGE.wm }, { LARGE.wn }, true>
        );

        matmul_nbits_tiled_entry!($tiled32x128, $ty, TILED32X128);
        matmul_nbits_tiled_entry!($tiled64x128, $ty, TILED64X128);
        matmul_nbits_tiled_entry!($tiled128x128, $ty, TILED128X128);
        /// Activation permutation for `tiled`; see the module docs.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $permute(
            a: *const $ty,
            a_perm: *mut $ty,
            zeroed: *mut u32,
            dims: Dims,
            zeroed_words: u32,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { permute::<$ty>(a, a_perm, zeroed, dims, zeroed_words) }
        }

        /// Split-K reduction; see the module docs.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $reduce(
            bias: *const $ty,
            y: *mut $ty,
            workspace: *const f32,
            dims: Dims,
            splits: u32,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { reduce::<$ty>(bias, y, workspace, dims, splits) }
        }
    };
}

matmul_nbits_entries!(
    F16,
    matmul_nbits_f16_decode8,
    matmul_nbits_f16_decode8_ahead3,
    matmul_nbits_f16_decode16,
    matmul_nbits_f16_decode8_packed,
    matmul_nbits_f16_decode8_packed_wide,
    matmul_nbits_f16_decode16_packed,
    matmul_nbits_f16_decode16_packed_wide,
    matmul_nbits_f16_small,
    matmul_nbits_f16_small_zf,
    matmul_nbits_f16_large,
    matmul_nbits_f16_large_zf,
    matmul_nbits_f16_tiled32x128,
    matmul_nbits_f16_tiled64x128,
    matmul_nbits_f16_tiled128x128,
    matmul_nbits_permute_f16,
    matmul_nbits_reduce_f16
);
matmul_nbits_entries!(
    Bf16,
    matmul_nbits_bf16_decode8,
    matmul_nbits_bf16_decode8_ahead3,
    matmul_nbits_bf16_decode16,
    matmul_nbits_bf16_decode8_packed,
    matmul_nbits_bf16_decode8_packed_wide,
    matmul_nbits_bf16_decode16_packed,
    matmul_nbits_bf16_decode16_packed_wide,
    matmul_nbits_bf16_small,
    matmul_nbits_bf16_small_zf,
    matmul_nbits_bf16_large,
    matmul_nbits_bf16_large_zf,
    matmul_nbits_bf16_tiled32x128,
    matmul_nbits_bf16_tiled64x128,
    matmul_nbits_bf16_tiled128x128,
    matmul_nbits_permute_bf16,
    matmul_nbits_reduce_bf16
);
