//! What several `matmul_nbits` kernels share: the codes of a chunk and their dequantization
//! constants, the dequantization itself, `mma.sync` over a chunk, the activations' loads and
//! halves, the output tile's store and the K splits; and the split-K reduction.
//!
//! # Launch contract: `matmul_nbits_reduce_{f16,bf16}(bias, y, workspace, dims, splits)`
//! - grid `(ceil(M * N / 256), 1, 1)`, block `(256, 1, 1)`: `y = sum over splits + bias`.
//!
//! # Launch contract: `matmul_nbits_cook_consts_{f16,bf16}(scales, zeros_u8, zeros_t, cooked, cooked_zero, dims)` (sm_90a module)
//! - grid `(ceil(N * k_blocks / COOK_THREADS), 1, 1)`, block `(COOK_THREADS, 1, 1)`: writes
//!   `cooked` (`[N, k_blocks]` u32, 4-byte aligned) and `cooked_zero` (`[N, k_blocks]` u8) in the
//!   layout of `layout::cooked_consts_bytes` from the scales and the zero points `dims.flags`
//!   names (u8 or typed; none: 8). Neither output overlaps the inputs.

use super::layout::*;
use crate::device::index;
use crate::device::memory::{ld_global_nc_u16, ld_global_nc_u32, ld_global_nc_v4};
use crate::element::{Element, TensorElement};
use crate::unroll;

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
pub(crate) unsafe fn zero_of_block(row: *const u8, blk: usize) -> u32 {
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
    dequantize_biased::<T, false>(word, T::code_bias(c.zero), c.scale2, NEG_ZERO2)
}

/// -0.0 twice, the addend that leaves a product as it is: `x * s + (-0) == x * s`.
pub(crate) const NEG_ZERO2: u32 = 0x8000_8000;

/// [`dequantize`] for integer zero points given as their [`TensorElement::code_bias`] (built
/// once per block, not per word) and the scale pair: `(code - zero) * scale + addend` per pair,
/// rounded once (`addend2`: [`NEG_ZERO2`], or the rest of a fractional zero point times the
/// scale); `PINNED`: see [`TensorElement::codes_minus_bias`].
#[inline(always)]
pub(crate) fn dequantize_biased<T: TensorElement, const PINNED: bool>(
    word: u32,
    bias: [u32; 2],
    scale2: u32,
    addend2: u32,
) -> [u32; 4] {
    T::codes_minus_bias::<PINNED>(word, bias).map(|d| T::fma2(d, scale2, addend2))
}

/// This lane's codes of one K chunk for `NT` column tiles: 16 bytes of column `n0 + 8j + g` at
/// byte `kc / 2 + 16q` of its row (zero past N or past the row).
///
/// # Safety
/// `b` holds `n` rows of `p.row_bytes` bytes.
#[inline(always)]
pub(crate) unsafe fn chunk_codes<const NT: usize>(
    b: *const u8,
    n0: usize,
    lane: usize,
    kc: usize,
    p: &Dims,
) -> [[u32; 4]; NT] {
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
pub(crate) unsafe fn chunk_consts<T: TensorElement, const NT: usize, const TYPED_ZERO: bool>(
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
pub(crate) unsafe fn mma_chunk<T: TensorElement, const MT: usize, const NT: usize, const TYPED_ZERO: bool>(
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
    // Launched in clusters, a cluster's K splits were summed into its first block, which writes y.
    #[cfg(dlkern_arch_specific)]
    let splits = if crate::device::cluster::cta_count() > 1 { 1 } else { splits };
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

/// The low and high half of a packed pair, and the pair of two halves (`lo` in the low half).
#[inline(always)]
pub(crate) fn lo_half(v: u32) -> u32 {
    v & 0xFFFF
}
#[inline(always)]
pub(crate) fn hi_half(v: u32) -> u32 {
    v >> 16
}
#[inline(always)]
pub(crate) fn pair(lo: u32, hi: u32) -> u32 {
    lo | (hi << 16)
}

/// 8 halves of A at `src` (K index `k8` of a row of `k`) as 4 packed words, zero past K: one
/// 16-byte load when `vec16` (16-byte rows) and all 8 are in the row, else one by one.
///
/// # Safety
/// `src` points at element `k8` of a row of `k` elements.
#[inline(always)]
pub(crate) unsafe fn load_a8<T>(src: *const T, k8: usize, k: usize, vec16: bool) -> [u32; 4] {
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

/// `matmul_nbits_cook_consts`: thread `i` cooks (weight row, block) `i` (row-major).
///
/// # Safety
/// The launch contract in the module docs.
#[cfg(dlkern_arch_specific)]
#[inline(always)]
pub(crate) unsafe fn cook_consts<T: TensorElement>(
    scales: *const T,
    zeros_u8: *const u8,
    zeros_t: *const T,
    cooked: *mut u32,
    cooked_zero: *mut u8,
    p: Dims,
) {
    // In 32 bits (the planner keeps N * k_blocks below 2^32): a 64-bit division is a subroutine.
    let i = index::block_idx_x() * COOK_THREADS as u32 + index::thread_idx_x();
    if i >= p.n * p.k_blocks {
        return;
    }
    // SAFETY: i < N * k_blocks: every read is of an existing (row, block), every write inside
    // the outputs (the launch contract).
    unsafe {
        let scale = ld_global_nc_u16(scales.add(i as usize).cast()) as u32;
        let (zero, addend2) = if p.flags & FLAG_ZERO_T != 0 {
            split_typed_zero::<T>(ld_global_nc_u16(zeros_t.add(i as usize).cast()) as u32, scale)
        } else if p.flags & FLAG_ZERO_U8 != 0 {
            // k_blocks > 0 here (i < N * k_blocks); NonZero keeps a division-by-zero panic path
            // out of the PTX.
            let per_row = core::num::NonZeroU32::new(p.k_blocks).unwrap_or(core::num::NonZeroU32::MIN);
            let (row, blk) = ((i / per_row) as usize, (i % per_row) as usize);
            (zero_of_block(zeros_u8.add(row * (p.k_blocks as usize).div_ceil(2)), blk), NEG_ZERO2)
        } else {
            (8, NEG_ZERO2)
        };
        cooked.add(i as usize).write(scale | (addend2 << 16));
        cooked_zero.add(i as usize).write(zero as u8);
    }
}

/// A zero point in A's type (`zero_bits`) split as [`dequantize_biased`] takes it with the
/// scale (`scale_bits`): the nearest code `zi` (0..=15), which comes off the codes exactly, and
/// the pair `-(z - zi) * scale` (twice, rounded to T), the `fma`'s addend: `(code - z) * scale =
/// (code - zi) * scale - (z - zi) * scale`.
#[cfg(dlkern_arch_specific)]
#[inline(always)]
pub(crate) fn split_typed_zero<T: TensorElement>(zero_bits: u32, scale_bits: u32) -> (u32, u32) {
    let zero = T::from_bits(zero_bits as u16).to_f32();
    // A code near the zero point (a saturating cast; any integer in 0..=15 is exact).
    let whole = ((zero + 0.5) as i32).clamp(0, 15);
    let rest = -(zero - whole as f32) * T::from_bits(scale_bits as u16).to_f32();
    (whole as u32, T::pack2(rest, rest))
}

#[inline(always)]
pub(crate) unsafe fn reduce<T: Element>(bias: *const T, y: *mut T, workspace: *const f32, p: Dims, splits: u32) {
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

/// The K loop of the `wgmma` kernels that dequantize the next chunk under the current chunk's
/// `wgmma`s: `$step!(j, current, next, consts)` for chunks `0..$chunks`, the two fragment sets
/// taking turns (chunk `j`'s in `$f0` for even `j`) and so do the constants' registers (`$odd`
/// holds an odd chunk's while an even chunk runs). A macro, not a function: `ptxas` serializes
/// `wgmma`s whose pipeline crosses a call (C7510).
#[cfg(dlkern_arch_specific)]
macro_rules! alternate_chunks {
    ($chunks:expr, $step:ident, $f0:ident, $f1:ident, $even:ident, $odd:ident) => {{
        let mut j = 0;
        while j < $chunks {
            $step!(j, $f0, $f1, $odd);
            if j + 1 < $chunks {
                $step!(j + 1, $f1, $f0, $even);
            }
            j += 2;
        }
    }};
}
#[cfg(dlkern_arch_specific)]
pub(crate) use alternate_chunks;
