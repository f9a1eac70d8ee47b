//! W4A16 on Hopper's warpgroup tensor cores (`wgmma`, sm_90a module only): the operation of
//! [`super`] for larger M, from the unmodified `MatMulNBits` layout.
//!
//! The operands are swapped as in `decode`: the weights are `wgmma`'s register operand (64
//! weight rows per warpgroup), dequantized straight into the A fragments, and the activations
//! its shared-memory operand (128 rows of A per block). Each lane takes, of each 128-wide K
//! chunk, the 16 code bytes at `16 q` of weight rows `g` and `g + 8` of its warp's 16, as
//! `tiled` does; their K order is the one `permute` gives the activations, so the kernel reads
//! that permuted copy of A, whose 16-byte pieces land in the swizzled tile unchanged.
//!
//! Per chunk, a ring of [`WGMMA_STAGES`] holds the activations and the codes (`cp.async`;
//! each thread copies the codes it later reads itself); the dequantization of chunk `j + 1`
//! into the second of two fragment sets overlaps the tensor cores' work on chunk `j`. There is
//! no dequantized weight tile in shared memory and no barrier for one. Each ring slot has two
//! `mbarrier`s (its activations in; both warpgroups done reading them) instead of one block
//! barrier per chunk, so the warpgroups wait only for what they use next and do not run in
//! lockstep (docs/perf-notes/matmul_nbits.md, v30).
//!
//! # Launch contract: `matmul_nbits_wgmma_{f16,bf16}`
//! - `a` is the permuted copy of A (`matmul_nbits_permute_*`: rows of `ceil(K / 128) * 128`
//!   elements, zero past K), 16-byte aligned.
//! - grid `(ceil(N / 128), ceil(M / 128), splits)`, block `(256, 1, 1)` (two warpgroups of 64
//!   weight rows), dynamic shared memory [`WGMMA_SHARED_BYTES`].
//! - zero points none or u8 (`zeros_t` unused), `block_size >= 32`; the `_any` builds of
//!   each entry below (`matmul_nbits_wgmma[_pair|_streamk]_any_*`) take zero points in A's type
//!   (`zeros_t`, `flags & FLAG_ZERO_T`) at any block size, or blocks of 16 with any zero points,
//!   at some more arithmetic per chunk. `b` 16-byte aligned with `row_bytes % 16 == 0`.
//! - may be launched as a programmatic dependent of the `permute` grid writing `a`: every
//!   thread waits for it (`griddepcontrol.wait`) after issuing the first chunks' code copies,
//!   before it reads `a` or writes anything.
//! - split `z` covers K chunks (of 128) `[z * chunks_per_split, (z + 1) * chunks_per_split)`;
//!   outputs as in [`super`] (`y` (+ bias) unsplit, else f32 partial sums to
//!   `workspace [splits, M, N]` for `matmul_nbits_reduce_*`).
//!
//! # Launch contract: `matmul_nbits_wgmma_streamk_{f16,bf16}`
//! - as `matmul_nbits_wgmma_{f16,bf16}`, but over a stream-K partition
//!   ([`StreamKBlock`]): grid `(blocks, 1, 1)` with `blocks` at most the tiles' total chunk
//!   count and at most one resident block per SM (the shared memory allows no more), block
//!   `(256, 1, 1)`, dynamic shared memory [`WGMMA_SHARED_BYTES`]; `chunks_per_split` unused.
//! - `workspace` holds [`wgmma_streamk_workspace_bytes`]`(blocks)`, its flags zeroed before
//!   the launch; `y` (+ bias) is written.
//! - A block waits for lower blocks only; that ends as long as blocks that cannot all be
//!   resident at once start in index order (as CUDA schedules them).
//!
//! # Launch contract: `matmul_nbits_wgmma_pair_{f16,bf16}`
//! - as above with exactly two splits (grid z = 2): the entry requires clusters of `(1, 1, 2)`
//!   blocks (`.reqnctapercluster`), so a plain launch pairs the two splits of each tile, which
//!   sum through distributed shared memory; `y` (+ bias) is written, `workspace` is unused.

use super::common::{BlockConsts, NEG_ZERO2, dequantize_biased, split_chunk_range, split_typed_zero};
use crate::device::async_copy::{commit_group, cp_async_16_zfill, wait_group};
use crate::device::cluster;
use crate::device::memory::{ld_global_cg_v4, ld_global_nc_u16, ld_global_nc_u32, st_global_v4};
use crate::device::shared::{dynamic_shared_base, ld_shared_v4};
use crate::device::wgmma::{self, SharedMatrix, fence_proxy_async_shared, pin_accumulators_f32};
use crate::device::{SharedAddr, WARP_SIZE, index, mbarrier, sync};
use crate::element::{Bf16, F16, TensorElement};
use crate::unroll;

use super::common::alternate_chunks;
use super::layout::*;

const _: () = assert!(WGMMA_BM == 128 && WGMMA_BN == 128 && WGMMA_THREADS == 256 && CHUNK == 128);
const _: () = assert!(WGMMA_STAGES == 4 && WGMMA_A_HALF_BYTES % 1024 == 0 && WGMMA_CODES_STAGE_BYTES % 1024 == 0);

/// The element types `wgmma` multiplies.
pub(crate) trait WgmmaElement: TensorElement {
    /// Starts `acc += A * B^T` on a 64 x 16 tile of A in registers and a 128 x 16 tile of B.
    ///
    /// # Safety
    /// As [`wgmma::mma_async_m64n128k16_f16_register_a`].
    unsafe fn mma_async(acc: &mut [f32; 64], a: [u32; 4], b: SharedMatrix);
}

impl WgmmaElement for F16 {
    #[inline(always)]
    unsafe fn mma_async(acc: &mut [f32; 64], a: [u32; 4], b: SharedMatrix) {
        // SAFETY: forwarded contract.
        unsafe { wgmma::mma_async_m64n128k16_f16_register_a(acc, a, b) }
    }
}

impl WgmmaElement for Bf16 {
    #[inline(always)]
    unsafe fn mma_async(acc: &mut [f32; 64], a: [u32; 4], b: SharedMatrix) {
        // SAFETY: forwarded contract.
        unsafe { wgmma::mma_async_m64n128k16_bf16_register_a(acc, a, b) }
    }
}

/// A (weight row, block)'s scale bits and zero-point byte as loaded, and the shift of its
/// nibble (typed zero points, `ANY_FORMAT` only: the zero point's bits in A's type, shift 0;
/// cooked constants: the cooked word, scale and addend bits, and `zi`, shift 0).
#[derive(Clone, Copy)]
pub(super) struct RawConsts {
    scale: u32,
    zero_byte: u32,
    shift: u32,
}

impl RawConsts {
    /// The scale twice, a pair of T.
    #[inline(always)]
    fn scale2(self) -> u32 {
        self.scale | (self.scale << 16)
    }

    /// The integer zero point (its nibble of the byte).
    #[inline(always)]
    fn zero(self) -> u32 {
        (self.zero_byte >> self.shift) & 15
    }

    #[inline(always)]
    fn cook(self) -> BlockConsts {
        BlockConsts { scale2: self.scale2(), zero: self.zero(), zero_f: 0.0, scale_f: 0.0 }
    }
}

/// One chunk's A fragments of a lane: 8 K steps of 16, each `[row, row + 8, row (K + 8), row +
/// 8 (K + 8)]` as the register operand wants them.
pub(super) type Fragments = [[u32; 4]; 8];

/// A lane's constants of one K chunk, as loaded: `[row][half]` for its two weight rows and the
/// two 16-K halves of its 32 codes of each. Only the `ANY_FORMAT` builds read half 1 (blocks of
/// 16 give the halves blocks of their own); the others take one block per lane and chunk.
pub(super) type ChunkConsts = [[RawConsts; 2]; 2];

/// Where a lane's scales and zero points are: those of its two weight rows (`g` and `g + 8` of
/// its warp's 16; rows past N read the last row's, which feed only outputs never stored).
/// `COOKED` (`prefill_any`): the constants as `matmul_nbits_cook_consts` wrote them, its words
/// in place of the scales and its bytes in place of the u8 zero points.
#[derive(Clone, Copy)]
pub(super) struct LaneConsts {
    scale: [*const u16; 2],
    /// The rows' u8 zero points, or (typed) the bytes of their zero points in A's type.
    zero: [*const u8; 2],
    zero_u8: bool,
    zero_typed: bool,
    q: u32,
}

impl LaneConsts {
    /// # Safety
    /// `scales` and the zero points the flags name (`zeros_u8`, or with `ANY_FORMAT` `zeros_t`)
    /// hold `p.n` rows; `COOKED`: `scales` and `zeros_u8` the cooked words and bytes of `p.n`
    /// rows.
    #[inline(always)]
    pub(super) unsafe fn new<T, const ANY_FORMAT: bool, const COOKED: bool>(
        scales: *const T,
        zeros_u8: *const u8,
        zeros_t: *const T,
        rows: [usize; 2],
        p: &Dims,
    ) -> Self {
        let k_blocks = p.k_blocks as usize;
        let clamped = |h: usize| rows[h].min(p.n as usize - 1);
        let zero_typed = ANY_FORMAT && p.flags & FLAG_ZERO_T != 0;
        // SAFETY: rows below N (the caller's contract). A pointer to zero points the flags do
        // not name is never read, so it may wrap.
        unsafe {
            if COOKED {
                return LaneConsts {
                    scale: core::array::from_fn(|h| scales.cast::<u32>().add(clamped(h) * k_blocks).cast()),
                    zero: core::array::from_fn(|h| zeros_u8.add(clamped(h) * k_blocks)),
                    zero_u8: true,
                    zero_typed: false,
                    q: index::lane_id() % 4,
                };
            }
            LaneConsts {
                scale: core::array::from_fn(|h| scales.add(clamped(h) * k_blocks).cast()),
                zero: core::array::from_fn(|h| {
                    if zero_typed {
                        zeros_t.wrapping_add(clamped(h) * k_blocks).cast()
                    } else {
                        zeros_u8.wrapping_add(clamped(h) * k_blocks.div_ceil(2))
                    }
                }),
                zero_u8: p.flags & FLAG_ZERO_U8 != 0,
                zero_typed,
                q: index::lane_id() % 4,
            }
        }
    }

    /// Whether the zero points are in A's type (fractional).
    #[inline(always)]
    pub(super) fn typed(&self) -> bool {
        self.zero_typed
    }

    /// The constants of K chunk `chunk` for both rows, as loaded (they are cooked only at their
    /// use, so that no arithmetic waits on the loads in the chunk that issues them). Without
    /// `ANY_FORMAT` a lane's 32 codes of a chunk lie in one block (blocks >= 32, zero points
    /// none or u8) and half 1 repeats half 0; with it (typed zero points, or blocks of 16 with
    /// any zero points) each 16-K half has its own. Blocks past K, met only by zero
    /// activations, read the last one.
    ///
    /// # Safety
    /// As [`Self::new`].
    #[inline(always)]
    pub(super) unsafe fn load<const ANY_FORMAT: bool, const COOKED: bool>(&self, chunk: u32, p: &Dims) -> ChunkConsts {
        // SAFETY: blocks of rows below N, of the zero points the flags name (or cooked).
        let raw = |h: usize, blk: u32, shift: u32| unsafe {
            let blk = blk as usize;
            if COOKED {
                let word = ld_global_nc_u32(self.scale[h].cast::<u32>().add(blk));
                return RawConsts { scale: word, zero_byte: self.zero[h].add(blk).read() as u32, shift: 0 };
            }
            let scale = ld_global_nc_u16(self.scale[h].add(blk)) as u32;
            if ANY_FORMAT && self.zero_typed {
                RawConsts { scale, zero_byte: ld_global_nc_u16(self.zero[h].cast::<u16>().add(blk)) as u32, shift: 0 }
            } else {
                // 0x88: 8 in both nibbles, no zero points.
                let zero_byte = if self.zero_u8 { self.zero[h].add(blk / 2).read() as u32 } else { 0x88 };
                RawConsts { scale, zero_byte, shift }
            }
        };
        let block_of =
            |half: u32| ((chunk * CHUNK as u32 + 32 * self.q + 16 * half) >> p.block_shift).min(p.k_blocks - 1);
        if ANY_FORMAT {
            // With integer zero points these builds run blocks of 16 only: half `i`'s block is
            // `8 chunk + 2q + i`, whose zero point is in nibble `i` of its byte (a constant, not
            // a register; past K the block is clamped, and its zero point meets zero
            // activations).
            let blk = [block_of(0), block_of(1)];
            core::array::from_fn(|h| [raw(h, blk[0], 0), raw(h, blk[1], 4)])
        } else {
            let blk = block_of(0);
            core::array::from_fn(|h| {
                let c = raw(h, blk, 4 * (blk % 2));
                [c, c]
            })
        }
    }
}

/// `ANY_FORMAT`'s constants of a (row, half), as [`dequantize_biased`] takes them: the zero
/// point split into an integer part, which comes off the codes exactly as the other builds take
/// theirs, and the rest, whose product with the scale the dequantization adds: `(code - z) s =
/// (code - zi) s - (z - zi) s`, exact up to the rounding of that small product (for integer
/// zero points it is zero, and the weights are those of the other builds bit for bit).
#[derive(Clone, Copy)]
struct CookedConsts {
    bias: [u32; 2],
    scale2: u32,
    addend2: u32,
}

impl CookedConsts {
    /// From constants `matmul_nbits_cook_consts` cooked: the pairs of the word's halves.
    #[inline(always)]
    fn of_cooked<T: TensorElement>(c: RawConsts) -> Self {
        let (scale, addend) = (c.scale & 0xFFFF, c.scale >> 16);
        CookedConsts {
            bias: T::code_bias(c.zero_byte),
            scale2: scale | (scale << 16),
            addend2: addend | (addend << 16),
        }
    }

    #[inline(always)]
    fn of<T: TensorElement>(c: RawConsts, typed: bool) -> Self {
        let scale2 = c.scale2();
        if !typed {
            return CookedConsts { bias: T::code_bias(c.zero()), scale2, addend2: NEG_ZERO2 };
        }
        let (whole, addend2) = split_typed_zero::<T>(c.zero_byte, c.scale);
        CookedConsts { bias: T::code_bias(whole), scale2, addend2 }
    }
}

/// A lane's codes of one chunk (16 bytes of each of its two rows) to `(code - zero) * scale`,
/// as A fragments: word `i` of a row gives steps `2i` (pairs (0,4), (1,5)) and `2i + 1` ((2,6),
/// (3,7)). `ANY_FORMAT`: words 0-1 (K `32q..32q + 16`) take half 0's constants, words 2-3 half
/// 1's, and the zero points may be fractional (`typed`, see [`CookedConsts`]); `COOKED`: the
/// constants were cooked before the kernel (`typed` is not read).
#[inline(always)]
pub(super) fn dequantize_fragments<T: TensorElement, const ANY_FORMAT: bool, const COOKED: bool>(
    lo: [u32; 4],
    hi: [u32; 4],
    c: ChunkConsts,
    typed: bool,
    f: &mut Fragments,
) {
    if ANY_FORMAT {
        // A half's constants are cooked just before its two words: fewer of them live at once.
        unroll!(HALF in [0, 1] {
            let k = if COOKED {
                [CookedConsts::of_cooked::<T>(c[0][HALF]), CookedConsts::of_cooked::<T>(c[1][HALF])]
            } else {
                [CookedConsts::of::<T>(c[0][HALF], typed), CookedConsts::of::<T>(c[1][HALF], typed)]
            };
            unroll!(W in [0, 1] {
                let i = 2 * HALF + W;
                let d_lo = dequantize_biased::<T, true>(lo[i], k[0].bias, k[0].scale2, k[0].addend2);
                let d_hi = dequantize_biased::<T, true>(hi[i], k[1].bias, k[1].scale2, k[1].addend2);
                f[2 * i] = [d_lo[0], d_hi[0], d_lo[1], d_hi[1]];
                f[2 * i + 1] = [d_lo[2], d_hi[2], d_lo[3], d_hi[3]];
            });
        });
        return;
    }
    let (c_lo, c_hi) = (c[0][0].cook(), c[1][0].cook());
    let (bias_lo, bias_hi) = (T::code_bias(c_lo.zero), T::code_bias(c_hi.zero));
    unroll!(I in [0, 1, 2, 3] {
        let d_lo = dequantize_biased::<T, true>(lo[I], bias_lo, c_lo.scale2, NEG_ZERO2);
        let d_hi = dequantize_biased::<T, true>(hi[I], bias_hi, c_hi.scale2, NEG_ZERO2);
        f[2 * I] = [d_lo[0], d_hi[0], d_lo[1], d_hi[1]];
        f[2 * I + 1] = [d_lo[2], d_hi[2], d_lo[3], d_hi[3]];
    });
}

/// Where a block's tile lies: its first row of A and its first weight row.
#[derive(Clone, Copy)]
struct TileOrigin {
    m0: usize,
    n0: usize,
}

/// This thread's weight rows of the tile at `n0`: `g` and `g + 8` of its warp's 16.
#[inline(always)]
fn lane_rows(n0: usize) -> [usize; 2] {
    let tid = index::thread_idx_x() as usize;
    let (group, warp_in_group, g) = (tid / 128, (tid / 32) % 4, index::lane_id() as usize / 4);
    let row0 = n0 + group * 64 + warp_in_group * 16 + g;
    [row0, row0 + 8]
}

/// This thread's sums of K chunks `[first, first + chunks)` of the tile at `origin`: register
/// `4 t + c` holds weight row `lane_rows(n0)[c / 2]`, row of A `m0 + 8 t + 2 q + c % 2`.
///
/// # Safety
/// The launch contract in the module docs; every thread of the block calls it with the same
/// arguments. It returns after a block barrier that follows every thread's last `wgmma`, so
/// the ring is free for other uses (or the next call) when it returns.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_sums<T: WgmmaElement, const ANY_FORMAT: bool>(
    a_perm: *const T,
    b: *const u8,
    scales: *const T,
    zeros_u8: *const u8,
    zeros_t: *const T,
    p: &Dims,
    origin: TileOrigin,
    first: u32,
    chunks: u32,
) -> [f32; 64] {
    let tid = index::thread_idx_x() as usize;
    let q = index::lane_id() as usize % 4;
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let row_len = k.div_ceil(CHUNK) * CHUNK;
    let row_bytes = p.row_bytes as usize;
    let TileOrigin { m0, n0 } = origin;

    let base = SharedMatrix::atom_aligned(dynamic_shared_base());
    let a_s = |slot: u32| base.offset(slot * WGMMA_A_STAGE_BYTES as u32);
    let codes_base = base.offset((WGMMA_STAGES * WGMMA_A_STAGE_BYTES) as u32);
    let codes_s = |slot: u32| codes_base.offset(slot * WGMMA_CODES_STAGE_BYTES as u32);

    // This lane's weight rows: g and g + 8 of its warp's 16. Copies of rows past N (and of
    // rows of A past M) are zero-filled from the last row's address: they read nothing (had
    // they read the last row, every such piece of every block would hit the same L2 lines,
    // which made M = 64 slower than M = 128); their scales and zero points come from the last
    // row, and they only feed outputs that are never stored.
    let rows = lane_rows(n0);
    let clamped = |r: usize| r.min(n - 1);
    // Its activation pieces: 16 bytes at `16 part` of rows `tid / 16 + 16 u` of each chunk.
    let (a_row, a_part) = (tid / 16, tid % 16);
    let a_dst = ((a_part / 8) * WGMMA_A_HALF_BYTES) as u32 + SharedMatrix::swizzle128_offset(a_row, a_part % 8);
    let a_src: [*const u8; 8] = core::array::from_fn(|u| {
        // SAFETY: a row below M of the permuted copy (the launch contract sizes it).
        unsafe { a_perm.add((m0 + a_row + 16 * u).min(m - 1) * row_len + 8 * a_part).cast() }
    });
    let a_bytes: [u32; 8] = core::array::from_fn(|u| if m0 + a_row + 16 * u < m { 16 } else { 0 });
    let b_bytes: [u32; 2] = core::array::from_fn(|h| if rows[h] < n { 16 } else { 0 });
    // SAFETY: rows below N of `b`, `scales` and the zero points.
    let b_src: [*const u8; 2] = core::array::from_fn(|h| unsafe { b.add(clamped(rows[h]) * row_bytes) });
    // SAFETY: the launch contract sizes `scales` and the zero points.
    let consts = unsafe { LaneConsts::new::<T, ANY_FORMAT, false>(scales, zeros_u8, zeros_t, rows, p) };
    let typed = consts.typed();

    let mut acc = [0.0f32; 64];
    // Zeroed here, once, on every path: `ptxas` serializes the `wgmma`s (C7515) when it sees
    // the zeroing on a path to the final wait, as it may without this.
    pin_accumulators_f32(&mut acc);
    // SAFETY (whole body): the launch contract sizes every buffer; copies stay inside rows of
    // the permuted A and of B; scales and zero points are read only for existing (row, block)
    // pairs; barriers and warpgroup instructions are reached by all threads (every bound
    // depends on the block alone).
    unsafe {
        // Local chunk `j` (global `first + j`) into ring slot `j % WGMMA_STAGES`.
        let load_activations = |j: u32| {
            let (slot, chunk) = (j % WGMMA_STAGES as u32, first + j);
            const { assert!(WGMMA_BM * 16 == 8 * WGMMA_THREADS) };
            let dst = a_s(slot).offset(a_dst);
            unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
                let src = a_src[U].add(chunk as usize * CHUNK * 2);
                cp_async_16_zfill(dst.offset((16 * U * 128) as u32), src, a_bytes[U]);
            });
        };
        let load_codes = |j: u32| {
            let (slot, chunk) = (j % WGMMA_STAGES as u32, first + j);
            // The last chunk may end inside a row (blocks below 128): a piece past the row is
            // read as the row's last 16 bytes (rows hold at least 16), whose codes then meet
            // only zero activations (the permuted copy is zero past K).
            let at = (chunk * B_CHUNK_BYTES as u32 + 16 * q as u32).min(p.row_bytes - 16) as usize;
            let dst = codes_s(slot).offset((tid * 16) as u32);
            unroll!(H in [0, 1] {
                cp_async_16_zfill(dst.offset((H * WGMMA_THREADS * 16) as u32), b_src[H].add(at), b_bytes[H]);
            });
        };
        let load = |j: u32| {
            load_activations(j);
            load_codes(j);
        };
        // This lane's constants of local chunk `j`, loaded two chunks before their use.
        let raw_consts = |j: u32| consts.load::<ANY_FORMAT, false>(first + j, p);
        let dequantize_chunk = |j: u32, c: ChunkConsts, f: &mut Fragments| {
            let codes = codes_s(j % WGMMA_STAGES as u32);
            let lo = ld_shared_v4(codes.offset((tid * 16) as u32));
            let hi = ld_shared_v4(codes.offset(((WGMMA_THREADS + tid) * 16) as u32));
            dequantize_fragments::<T, ANY_FORMAT, false>(lo, hi, c, typed, f);
        };

        // Copies run two chunks ahead of the dequantization, three of the tensor cores.
        const AHEAD: u32 = WGMMA_STAGES as u32 - 1;
        // Per ring slot, `full` completes a phase when a chunk's activations are in (every
        // warp arrives once its lanes' copies landed), `empty` when both warpgroups' `wgmma`s
        // have read them (every warp arrives after its wait). They replace one block barrier
        // per chunk: a warpgroup waits only for what it is about to use, so the two no longer
        // run in lockstep. Chunk `c` uses phase `c / 4` of slot `c % 4`'s pair; no warp gets
        // a phase ahead, since refilling a slot waits for its `empty`.
        let barriers = codes_base.offset((WGMMA_STAGES * WGMMA_CODES_STAGE_BYTES) as u32);
        let full = |slot: u32| barriers.offset(8 * slot);
        let empty = |slot: u32| barriers.offset(8 * (WGMMA_STAGES as u32 + slot));
        let parity = |c: u32| (c / WGMMA_STAGES as u32) & 1;
        let warps = WGMMA_THREADS as u32 / WARP_SIZE;
        let lane0 = index::lane_id() == 0;
        // One arrival per warp, after all of its lanes' work before it.
        let warp_arrive = |bar: SharedAddr| {
            sync::sync_warp();
            if lane0 {
                mbarrier::arrive(bar);
            }
        };
        if tid == 0 {
            unroll!(S in [0, 1, 2, 3] {
                mbarrier::init(full(S as u32), warps);
                mbarrier::init(empty(S as u32), warps);
            });
        }
        // The first chunks' codes go before the wait for the grid writing the permuted copy of
        // A (`permute`, which this grid may overlap on Hopper: `launch_overlapping`); they join
        // the first copy group, so each group still holds all of its chunk.
        unroll!(S in [0, 1, 2] {
            if (S as u32) < chunks {
                load_codes(S as u32);
            }
        });
        sync::wait_for_prerequisite_grids();
        unroll!(S in [0, 1, 2] {
            const { assert!(AHEAD == 3) };
            if (S as u32) < chunks {
                load_activations(S as u32);
            }
            commit_group();
        });
        // The constants of even and odd chunks, each loaded two chunks before its use (a
        // slot per parity: nothing rotates between registers).
        let (mut even_consts, mut odd_consts) = (raw_consts(0), raw_consts(1));
        let (mut f0, mut f1): (Fragments, Fragments) = ([[0; 4]; 8], [[0; 4]; 8]);
        // The barriers are initialized.
        sync::sync_threads();
        wait_group::<{ AHEAD - 1 }>();
        fence_proxy_async_shared();
        warp_arrive(full(0));
        if chunks > 0 {
            dequantize_chunk(0, even_consts, &mut f0);
        }
        even_consts = raw_consts(2);

        // Chunk `$j`: its fragments are in `$cur`, its activations in slot `$j % 4`;
        // `$consts` holds chunk `$j + 1`'s constants. A macro, not a closure: a closure called
        // twice may stay a function, and `ptxas` serializes `wgmma`s whose pipeline crosses a
        // call (C7510).
        macro_rules! chunk_step {
            ($j:expr, $cur:ident, $next:ident, $consts:ident) => {{
                let j: u32 = $j;
                let slot = j % WGMMA_STAGES as u32;
                mbarrier::wait_parity(full(slot), parity(j));
                let tile = a_s(slot);
                wgmma::fence();
                unroll!(S in [0, 1, 2, 3, 4, 5, 6, 7] {
                    let half = SharedMatrix::k_major_swizzle128(tile.offset(((S / 4) * WGMMA_A_HALF_BYTES) as u32));
                    T::mma_async(&mut acc, $cur[S], half.advance_k(32 * (S % 4) as u32));
                });
                wgmma::commit_group();
                // Chunk j - 1's `wgmma`s are done: `$next` is free, and so is slot (j - 1) % 4
                // once the other warpgroup's are too.
                wgmma::wait_group::<1>();
                if j > 0 {
                    warp_arrive(empty((j - 1) % WGMMA_STAGES as u32));
                }
                // Chunk j + 1's copies of this thread landed.
                wait_group::<{ AHEAD - 2 }>();
                if j + 1 < chunks {
                    fence_proxy_async_shared();
                    warp_arrive(full((j + 1) % WGMMA_STAGES as u32));
                    dequantize_chunk(j + 1, $consts, &mut $next);
                }
                if j + AHEAD < chunks {
                    // Chunk j - 1 (this slot's last) read by both warpgroups.
                    if j > 0 {
                        mbarrier::wait_parity(empty((j - 1) % WGMMA_STAGES as u32), parity(j - 1));
                    }
                    load(j + AHEAD);
                }
                commit_group();
                $consts = raw_consts(j + 3);
            }};
        }
        alternate_chunks!(chunks, chunk_step, f0, f1, even_consts, odd_consts);
        wgmma::wait_group::<0>();
        pin_accumulators_f32(&mut acc);
        // Every thread is past its last wait: the barriers may be initialized again (the next
        // tile of a stream-K block).
        sync::sync_threads();
        if tid == 0 {
            unroll!(S in [0, 1, 2, 3] {
                mbarrier::invalidate(full(S as u32));
                mbarrier::invalidate(empty(S as u32));
            });
        }
    }
    acc
}

/// Writes a tile's sums: `y` (+ bias) when `partial` is `None`, else the f32 partial sums of
/// split `partial` to `workspace [splits, M, N]`.
///
/// # Safety
/// `acc` is [`tile_sums`]' of the tile at `origin`; the buffers are as the launch contract
/// sizes them.
#[inline(always)]
unsafe fn store_tile<T: WgmmaElement>(
    acc: &[f32; 64],
    origin: TileOrigin,
    bias: *const T,
    y: *mut T,
    workspace: *mut f32,
    p: &Dims,
    partial: Option<usize>,
) {
    let (m, n) = (p.m as usize, p.n as usize);
    let q = index::lane_id() as usize % 4;
    let rows = lane_rows(origin.n0);
    // SAFETY: every store is to a row below M and a column below N (checked).
    unsafe {
        unroll!(H in [0, 1] {
            let col = rows[H];
            if col < n {
                let bias_v = if partial.is_none() && p.flags & FLAG_BIAS != 0 { bias.add(col).read().to_f32() } else { 0.0 };
                unroll!(T8 in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                    unroll!(C in [0, 1] {
                        let row = origin.m0 + 8 * T8 + 2 * q + C;
                        if row < m {
                            let v = acc[4 * T8 + 2 * H + C];
                            match partial {
                                None => y.add(row * n + col).write(T::from_f32(v + bias_v)),
                                Some(split) => workspace.add((split * m + row) * n + col).write(v),
                            }
                        }
                    });
                });
            }
        });
    }
}

/// # Safety
/// The launch contract in the module docs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_nbits_wgmma<T: WgmmaElement, const PAIR: bool, const ANY_FORMAT: bool>(
    a_perm: *const T,
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
    let origin =
        TileOrigin { m0: index::block_idx_y() as usize * WGMMA_BM, n0: index::block_idx_x() as usize * WGMMA_BN };
    let (first, chunks) = split_chunk_range(&p);
    // SAFETY: forwarded launch contract; every thread calls it with the block's arguments.
    let mut acc =
        unsafe { tile_sums::<T, ANY_FORMAT>(a_perm, b, scales, zeros_u8, zeros_t, &p, origin, first, chunks) };
    let base = SharedMatrix::atom_aligned(dynamic_shared_base());
    // SAFETY: the cluster's blocks all reach the barriers (`PAIR` is the entry's); the exchange
    // stays inside block 1's ring.
    unsafe {
        // `PAIR`: the two splits of a tile are one cluster; block 1 hands its sums to block 0
        // through shared memory (the ring is free once both warpgroups waited for their
        // `wgmma`s), block 0 adds them and writes `y`. No workspace, no reduction kernel.
        if PAIR {
            let exchange = |i: usize| base.offset(((i * WGMMA_THREADS + tid) * 16) as u32);
            // SAFETY: `[f32; 64]` and `[[f32; 4]; 16]` have one layout.
            let tiles = &mut *(&mut acc as *mut [f32; 64] as *mut [[f32; 4]; 16]);
            if !cluster::sum_into_rank0(tiles, 2, exchange, true) {
                return;
            }
        }

        let splits = if PAIR { 1 } else { index::grid_dim_z() as usize };
        let partial = (splits > 1).then(|| index::block_idx_z() as usize);
        store_tile(&acc, origin, bias, y, workspace, &p, partial);
    }
}

/// # Safety
/// The launch contract of `matmul_nbits_wgmma_streamk_{f16,bf16}` in the module docs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_nbits_wgmma_streamk<T: WgmmaElement, const ANY_FORMAT: bool>(
    a_perm: *const T,
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
    let (block, blocks) = (index::block_idx_x(), index::grid_dim_x());
    let tiles_n = p.n.div_ceil(WGMMA_BN as u32);
    let chunks_per_tile = p.k.div_ceil(CHUNK as u32);
    // (The launcher keeps `tiles x chunks_per_tile` below 2^32.)
    let total = tiles_n * p.m.div_ceil(WGMMA_BM as u32) * chunks_per_tile;
    let partition = StreamKPartition::new(total, blocks);
    // Block `b`'s slot: 16 vectors of 4 sums per thread, vector `i` of the block's threads
    // side by side (each warp's store is 512 contiguous bytes).
    const SLOT_VECTORS: usize = WGMMA_STREAMK_SLOT_BYTES / 16;
    const { assert!(SLOT_VECTORS == 16 * WGMMA_THREADS) };
    let slot = |b: u32, i: usize| -> *mut [u32; 4] {
        // SAFETY: inside the workspace's `blocks` slots (the launch contract sizes it).
        unsafe { workspace.cast::<[u32; 4]>().add(b as usize * SLOT_VECTORS + i * WGMMA_THREADS + tid) }
    };
    // SAFETY: the flags follow the slots (the launch contract).
    let flag = |b: u32| unsafe {
        workspace.cast::<u8>().add(blocks as usize * WGMMA_STREAMK_SLOT_BYTES).cast::<u32>().add(b as usize)
    };
    let mine = StreamKBlock::new(partition, block, chunks_per_tile, tiles_n);
    // SAFETY (whole loop): every bound depends on the block alone, so all threads reach every
    // barrier; slots and flags are the workspace's; see `StreamKBlock` for why the waits end.
    for i in 0..mine.segments() {
        let segment = mine.segment(i);
        unsafe {
            // (`tile_sums` ends with a block barrier: the previous segment's reads of the ring
            // are over.)
            let origin = TileOrigin { m0: segment.tile_m as usize * WGMMA_BM, n0: segment.tile_n as usize * WGMMA_BN };
            let mut acc = tile_sums::<T, ANY_FORMAT>(
                a_perm,
                b,
                scales,
                zeros_u8,
                zeros_t,
                &p,
                origin,
                segment.first,
                segment.chunks,
            );
            if !segment.finalizes {
                // The lower part of a tile that the next block finishes: publish the sums.
                unroll!(I in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                    st_global_v4(slot(block, I), core::array::from_fn(|c| acc[4 * I + c].to_bits()));
                });
                sync::sync_threads();
                if tid == 0 {
                    sync::st_release_gpu_u32(flag(block), 1);
                }
                continue;
            }
            if !segment.starts {
                // Add the parts of the lower blocks that hold the tile's other chunks, down to
                // the one holding its first.
                let tile_begin = segment.tile * chunks_per_tile;
                let mut other = block;
                loop {
                    other -= 1;
                    if tid == 0 {
                        while sync::ld_acquire_gpu_u32(flag(other)) == 0 {
                            sync::nanosleep::<128>();
                        }
                    }
                    sync::sync_threads();
                    unroll!(I in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                        let part = ld_global_cg_v4(slot(other, I));
                        unroll!(C in [0, 1, 2, 3] {
                            acc[4 * I + C] += f32::from_bits(part[C]);
                        });
                    });
                    if partition.begin(other) <= tile_begin {
                        break;
                    }
                }
            }
            store_tile(&acc, origin, bias, y, workspace, &p, None);
        }
    }
}
