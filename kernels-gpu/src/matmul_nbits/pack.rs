//! `matmul_nbits_pack_decode`: B, its scales and zero points repacked on the device into the
//! records `decode*_packed` and `packed_wgmma16` read.
//!
//! # Launch contract: `matmul_nbits_pack_decode(b, scales, zeros_u8, packed, dims)`
//! - Writes the records `decode*_packed` read (`packed_record_bytes(block_size)` per 32-column
//!   tile and K chunk, tile-major: the fine records below blocks of 128; the layout's docs) from
//!   B in `MatMulNBits` layout: the device twin of `MatMulNBitsWeights::pack_for_decode`. Any
//!   element type: the scales are copied as 16-bit words.
//! - grid `(ceil(N / 32) * ceil(K / 128), 1, 1)`, block `(PACK_THREADS, 1, 1)`, no shared memory.
//! - `dims`: `n`, `k`, `block_shift` (`block_size >= 32`), `row_bytes` (a multiple of 16),
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
/// piece `t % 3` of group `t / 3`'s).
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
    // `layout::packed_fine` on the shift (no shift of 1 in the kernel).
    let fine = (p.block_shift as usize) < CHUNK.trailing_zeros() as usize;
    // SAFETY: the launch contract: the record lies in `packed`; a word is read only where it
    // lies in its row (a row of blocks smaller than a chunk may end inside the last chunk; its
    // missing words, past K, are written as zero-point codes, which meet zero activations).
    unsafe {
        let dst = packed.add(record * record_bytes(fine));
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
        if fine && t < 3 * 8 {
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
                        let zero = if p.flags & FLAG_ZERO_U8 != 0 {
                            zero_of_block(zeros_u8.add(n * k_blocks.div_ceil(2)), blk(S))
                        } else {
                            8
                        };
                        words[S] |= zero << (8 * U);
                    }
                });
            });
            st_global_v4(dst.add(DECODE_STAGE_BYTES + FINE_GROUP_CONSTS_BYTES * group + 16 * piece).cast(), words);
        } else if !fine && t < 8 {
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
