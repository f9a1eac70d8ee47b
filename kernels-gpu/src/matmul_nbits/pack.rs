//! `matmul_nbits_pack_decode`: B, its scales and zero points repacked on the device into the
//! records `decode*_packed` and `packed_wgmma16` read.
//!
//! # Launch contract: `matmul_nbits_pack_decode(b, scales, zeros_u8, packed, dims)`
//! - Writes the records `decode*_packed` read (`packed_record_bytes(block_size)` per 32-column
//!   tile and K chunk, tile-major: the fine records for blocks of 32 and 64, the fine16 records
//!   for blocks of 16; the layout's docs) from
//!   B in `MatMulNBits` layout: the device twin of `MatMulNBitsWeights::pack_for_decode`. Any
//!   element type: the scales are copied as 16-bit words.
//! - grid `(ceil(N / 32) * ceil(K / 128), 1, 1)`, block `(PACK_THREADS, 1, 1)`, no shared memory.
//! - `dims`: `n`, `k`, `block_shift` (`block_size >= 16`), `row_bytes` (a multiple of 8),
//!   `k_blocks` and `flags & FLAG_ZERO_U8` (zero points u8 `[N, ceil(k_blocks / 2)]`;
//!   otherwise `zeros_u8` is not read and every zero point is 8); the rest is ignored.
//! - `b` and `packed` 16-byte aligned; `packed` holds the grid's records and does not overlap
//!   the inputs.

use super::common::zero_of_block;
use super::layout::*;
use crate::device::index;
use crate::device::memory::{ld_global_nc_u16, ld_global_nc_u32, st_global_v4};
use crate::unroll;

/// `matmul_nbits_pack_decode`: one block per record; thread `t` writes piece `t % 4` of column
/// `t / 4`'s chunk, threads 0-7 also lane group `t`'s constants (fine records: threads 0-23
/// piece `t % 3` of group `t / 3`'s; fine16 records: threads 0-39 piece `t % 5` of group
/// `t / 5`'s).
///
/// # Safety
/// The launch contract (`matmul_nbits_pack_decode` in the module docs).
#[inline(always)]
pub(crate) unsafe fn pack_decode(b: *const u8, scales: *const u16, zeros_u8: *const u8, packed: *mut u8, p: Dims) {
    // K > 0, so there is at least one chunk; NonZero keeps a division-by-zero panic path out
    // of the PTX.
    let chunks = core::num::NonZeroUsize::new((p.k as usize).div_ceil(CHUNK)).unwrap_or(core::num::NonZeroUsize::MIN);
    let record = index::block_idx_x() as usize;
    let (tile, chunk) = (record / chunks, record % chunks);
    let t = index::thread_idx_x() as usize;
    let (n, row_bytes, k_blocks) = (p.n as usize, p.row_bytes as usize, p.k_blocks as usize);
    // Columns past N repeat column N - 1 (never stored: the kernels mask them).
    let column = |local: usize| (tile * DECODE_COLUMNS + local).min(n - 1);
    // `layout::packed_step` on the shift (no shift of 1 in the kernel).
    let step = if p.block_shift as usize >= CHUNK.trailing_zeros() as usize {
        CHUNK
    } else if p.block_shift as usize >= FINE_STEP.trailing_zeros() as usize {
        FINE_STEP
    } else {
        FINE16_STEP
    };
    let zero_of = |n: usize, blk: usize| {
        if p.flags & FLAG_ZERO_U8 != 0 {
            // SAFETY: n < N and blk < k_blocks: the zero points' row holds the block.
            unsafe { zero_of_block(zeros_u8.add(n * k_blocks.div_ceil(2)), blk) }
        } else {
            8
        }
    };
    // SAFETY: the launch contract: the record lies in `packed`; a word is read only where it
    // lies in its row (a row of blocks smaller than a chunk may end inside the last chunk; its
    // missing words, past K, are written as zero-point codes, which meet zero activations).
    unsafe {
        let dst = packed.add(record * record_bytes(step));
        // Word `i` of piece `q` is word `4 i + q` of the column's chunk, its codes in the
        // records' nibble order (the layout's docs).
        let (local, q) = (t / 4, t % 4);
        let at = chunk * B_CHUNK_BYTES + 4 * q;
        let src = b.add(column(local) * row_bytes + at);
        let words: [u32; 4] = core::array::from_fn(|i| {
            if at + 16 * i < row_bytes {
                packed_code_word(ld_global_nc_u32(src.add(16 * i).cast()))
            } else {
                0x8888_8888
            }
        });
        st_global_v4(dst.add(16 * t).cast(), words);
        if step == FINE_STEP && t < 3 * 8 {
            let (group, piece) = (t / 3, t % 3);
            // Step `s`'s block, the last one where the step lies past K.
            let blk = |s: usize| ((chunk * CHUNK + s * FINE_STEP) >> p.block_shift).min(k_blocks - 1);
            let mut words = [0u32; 4];
            unroll!(S in [0, 1, 2, 3] {
                unroll!(U in [0, 1, 2, 3] {
                    let n = column(group + 8 * U);
                    if piece < 2 && S / 2 == piece {
                        let bits = ld_global_nc_u16(scales.add(n * k_blocks + blk(S))) as u32;
                        words[2 * (S % 2) + U / 2] |= bits << (16 * (U % 2));
                    } else if piece == 2 {
                        words[S] |= zero_of(n, blk(S)) << (8 * U);
                    }
                });
            });
            st_global_v4(dst.add(DECODE_STAGE_BYTES + FINE_GROUP_CONSTS_BYTES * group + 16 * piece).cast(), words);
        } else if step == FINE16_STEP && t < 5 * 8 {
            let (group, piece) = (t / 5, t % 5);
            // The block of word `i` of the lanes of parity `h` (K `32 i + 16 h` of the chunk),
            // the row's last one past K.
            let blk = |i: usize, h: usize| ((chunk * CHUNK + 32 * i + 16 * h) >> p.block_shift).min(k_blocks - 1);
            let mut words = [0u32; 4];
            unroll!(I in [0, 1, 2, 3] {
                unroll!(U in [0, 1, 2, 3] {
                    let n = column(group + 8 * U);
                    // Pieces 0-3: parity `piece / 2`'s scales of words `2 (piece % 2)` and
                    // `2 (piece % 2) + 1`; piece 4: both parities' zero points.
                    if piece < 4 && I / 2 == piece % 2 {
                        let bits = ld_global_nc_u16(scales.add(n * k_blocks + blk(I, piece / 2))) as u32;
                        words[2 * (I % 2) + U / 2] |= bits << (16 * (U % 2));
                    } else if piece == 4 {
                        unroll!(H in [0, 1] {
                            let nibble = 4 * I + U;
                            words[2 * H + nibble / 8] |= zero_of(n, blk(I, H)) << (4 * (nibble % 8));
                        });
                    }
                });
            });
            st_global_v4(dst.add(DECODE_STAGE_BYTES + FINE16_GROUP_CONSTS_BYTES * group + 16 * piece).cast(), words);
        } else if step == CHUNK && t < 8 {
            let blk = (chunk * CHUNK) >> p.block_shift;
            let mut words = [0u32; 4];
            unroll!(U in [0, 1, 2, 3] {
                let n = column(t + 8 * U);
                words[U / 2] |= (ld_global_nc_u16(scales.add(n * k_blocks + blk)) as u32) << (16 * (U % 2));
                words[2] |= zero_of(n, blk) << (8 * U);
            });
            st_global_v4(dst.add(DECODE_STAGE_BYTES + 16 * t).cast(), words);
        }
    }
}
