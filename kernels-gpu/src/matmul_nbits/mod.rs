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
//! f32 sums (`decode*_packed_fine16`, blocks of 16, whose `mma` K steps span two blocks, round
//! the weights as `small` does). Accumulation in f32.
//!
//! Every kernel takes `(a, b, scales, zeros_u8, zeros_t, bias, y, workspace, dims)` (the
//! repacker and the helper kernels their own lists) and, unless its module says otherwise:
//! - grid `(ceil(N / BN), ceil(M / BM), splits)` for a block tile of `BM` rows of A and `BN`
//!   columns; split `z` covers K chunks `[z * chunks_per_split, (z + 1) * chunks_per_split)` of
//!   128.
//! - `splits == 1`: writes `y` (+ bias). Otherwise writes f32 partial sums to `workspace`
//!   `[splits, M, N]` for `matmul_nbits_reduce_*` ([`common`]), except where `small`, `decode*`
//!   and `decode*_packed*` run in clusters `(1, 1, splits)` (sm_90a module, 2 to 8 splits): the
//!   splits then sum through distributed shared memory and the cluster's first block writes `y`.
//! - `_zf` builds: zero points in A's type (fractional allowed; dequantized in f32); otherwise
//!   u8 or none, dequantized exactly in packed 16-bit arithmetic.
//!
//! The files, by kernel kind (each with the launch contracts of its kernels):
//! - [`decode`]: small M (M <= 16): `decode8`, `decode8_ahead3`, `decode16` and their
//!   `*_packed` / `*_packed_wide` builds over B repacked once (`_fine`, `_fine16`: over the
//!   records of blocks below 128), and `small`.
//! - [`tiled`]: larger M on `mma.sync`: `tiled32x128`, `tiled64x128`, `tiled128x128` over a
//!   permuted copy of A (`permute`), and `large`, which takes any zero points and alignment.
//! - [`wgmma`] (sm_90a module only): larger M on Hopper's warpgroup tensor cores: `wgmma`,
//!   `wgmma_pair` (two K splits as a cluster), `wgmma_streamk`, and their `_any` builds (blocks
//!   of 16, typed zero points).
//! - [`packed_wgmma`] (sm_90a module only): 8 < M <= 16 over the repacked B on `wgmma`.
//! - [`prefill`] (sm_90a module only): large M on `wgmma`, warp-specialized, 256-row tiles
//!   (`prefill_any`: any format, as `wgmma_any`).
//! - [`pack`]: `matmul_nbits_pack_decode`, the device's repacking of B.
//! - [`common`]: what several of them share (codes, dequantization, activations, stores, K
//!   splits), the split-K reduction `reduce` and `cook_consts` (sm_90a module only), which
//!   cooks `prefill_any`'s constants.
//! - [`layout`]: tile shapes, flags and the scalar-argument struct, compiled into the host
//!   launcher too.
//!
//! The entry points are all instantiated here, below: `matmul_nbits_<variant>_{f16,bf16}` and
//! `matmul_nbits_pack_decode`, the names of [`layout::ENTRIES`] and, in the sm_90a module,
//! [`layout::HOPPER_ENTRIES`] (whose [`layout::Entry`] the host launchers name them by). Rust
//! cannot make a symbol from a string, so they are spelled here again; tests check that the
//! PTX has exactly the table's entries.

mod common;
mod decode;
pub mod layout;
mod pack;
#[cfg(dlkern_arch_specific)]
mod packed_wgmma;
#[cfg(dlkern_arch_specific)]
mod prefill;
mod tiled;
#[cfg(dlkern_arch_specific)]
mod wgmma;

use crate::element::{Bf16, F16};
use layout::*;

/// B repacked for `decode*_packed`.
///
/// # Safety
/// The launch contract in [`pack`]'s docs.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn matmul_nbits_pack_decode(
    b: *const u8,
    scales: *const u16,
    zeros_u8: *const u8,
    packed: *mut u8,
    dims: Dims,
) {
    // SAFETY: forwarded launch contract.
    unsafe { pack::pack_decode(b, scales, zeros_u8, packed, dims) }
}

macro_rules! matmul_nbits_entry {
    ($name:ident, $ty:ty, $call:expr) => {
        /// One variant of the W4A16 kernel.
        ///
        /// # Safety
        /// The launch contract of its kernel's module (see the family's docs).
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
macro_rules! matmul_nbits_tiled_entry {
    ($name:ident, $ty:ty, $tiling:ident) => {
        matmul_nbits_entry!($name, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            tiled::matmul_nbits_tiled::<
                $ty,
                { $tiling.mt },
                { $tiling.nt },
                { $tiling.wm },
                { $tiling.wn },
                { $tiling.wk },
            >(a, b, s, z, bias, y, ws, d)
        });
    };
}

macro_rules! matmul_nbits_entries {
    (
        $ty:ty, $decode8:ident, $decode8_ahead3:ident, $decode16:ident, $decode8_packed:ident, $decode8_packed_wide:ident, $decode16_packed:ident, $decode16_packed_wide:ident,
        $decode8_packed_fine:ident, $decode8_packed_wide_fine:ident, $decode16_packed_fine:ident,
        $decode16_packed_wide_fine:ident, $decode8_packed_fine16:ident, $decode8_packed_wide_fine16:ident,
        $decode16_packed_fine16:ident, $decode16_packed_wide_fine16:ident, $small:ident, $small_zf:ident, $large:ident, $large_zf:ident,
        $tiled32x128:ident, $tiled64x128:ident, $tiled128x128:ident, $permute:ident,
        $reduce:ident
    ) => {
        matmul_nbits_entry!($decode8, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 1, 1, false, DECODE_WARPS, CHUNK>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode8_ahead3, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 1, 3, false, DECODE_WARPS, CHUNK>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode16, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 2, 1, false, DECODE_WARPS, CHUNK>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode8_packed, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 1, 3, true, DECODE_WARPS, CHUNK>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode8_packed_wide, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 1, 3, true, DECODE_WIDE_WARPS, CHUNK>(a, b, s, z, bias, y, ws, d)
        });
        // 2 blocks of 256 threads per SM for the wide build, 4 of 128 for the other: both
        // spill-free under ptxas 13.5 since the records' nibble order (`decode8_packed` takes 132
        // registers uncapped; tests/ptx.rs). The cap measured 1-4.5% faster at N = 28672 (896 blocks),
        // where the uncapped build, at 3 blocks per SM, lost 8% (docs/perf-notes/matmul_nbits.md
        // v28).
        crate::entry_directive!($decode8_packed_wide, ".maxnreg 128");
        crate::entry_directive!($decode8_packed, ".maxnreg 128");
        matmul_nbits_entry!($decode16_packed, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 2, 1, true, DECODE_WARPS, CHUNK>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode16_packed_wide, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 2, 1, true, DECODE16_WIDE_WARPS, CHUNK>(a, b, s, z, bias, y, ws, d)
        });
        // The fine builds at M <= 8 load the activations 1 chunk ahead, not 3: the per-step
        // constants and sums take the registers the deeper ring used (3 ahead spilled 80-156
        // bytes under the 128-register cap, ptxas 13.5).
        matmul_nbits_entry!($decode8_packed_fine, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 1, 1, true, DECODE_WARPS, FINE_STEP>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode8_packed_wide_fine, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 1, 1, true, DECODE_WIDE_WARPS, FINE_STEP>(a, b, s, z, bias, y, ws, d)
        });
        // The same caps as the coarse builds, for the same occupancy.
        crate::entry_directive!($decode8_packed_wide_fine, ".maxnreg 128");
        crate::entry_directive!($decode8_packed_fine, ".maxnreg 128");
        matmul_nbits_entry!($decode16_packed_fine, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 2, 1, true, DECODE_WARPS, FINE_STEP>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode16_packed_wide_fine, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 2, 1, true, DECODE16_WIDE_WARPS, FINE_STEP>(a, b, s, z, bias, y, ws, d)
        });
        // Uncapped they take 173-178 registers: one block of the wide build per SM, two of the
        // other. At 168 the coarse builds' occupancy holds (2 of 192 threads, 3 of 128).
        crate::entry_directive!($decode16_packed_wide_fine, ".maxnreg 168");
        crate::entry_directive!($decode16_packed_fine, ".maxnreg 168");
        // Blocks of 16: the weights rounded to T before each `mma` (no per-step sums to keep);
        // the same caps, for the same occupancy.
        matmul_nbits_entry!($decode8_packed_fine16, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 1, 1, true, DECODE_WARPS, FINE16_STEP>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode8_packed_wide_fine16, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 1, 1, true, DECODE_WIDE_WARPS, FINE16_STEP>(a, b, s, z, bias, y, ws, d)
        });
        crate::entry_directive!($decode8_packed_wide_fine16, ".maxnreg 128");
        crate::entry_directive!($decode8_packed_fine16, ".maxnreg 128");
        matmul_nbits_entry!($decode16_packed_fine16, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 2, 1, true, DECODE_WARPS, FINE16_STEP>(a, b, s, z, bias, y, ws, d)
        });
        matmul_nbits_entry!($decode16_packed_wide_fine16, $ty, |a, b, s, z, _zt, bias, y, ws, d| {
            decode::matmul_nbits_decode::<$ty, 2, 1, true, DECODE16_WIDE_WARPS, FINE16_STEP>(a, b, s, z, bias, y, ws, d)
        });
        crate::entry_directive!($decode16_packed_wide_fine16, ".maxnreg 168");
        crate::entry_directive!($decode16_packed_fine16, ".maxnreg 168");
        matmul_nbits_entry!($small, $ty, decode::matmul_nbits_small::<$ty, { SMALL.nt }, { SMALL.wk }, false>);
        matmul_nbits_entry!($small_zf, $ty, decode::matmul_nbits_small::<$ty, { SMALL.nt }, { SMALL.wk }, true>);
        matmul_nbits_entry!(
            $large,
            $ty,
            tiled::matmul_nbits_large::<$ty, { LARGE.mt }, { LARGE.nt }, { LARGE.wm }, { LARGE.wn }, false>
        );
        matmul_nbits_entry!(
            $large_zf,
            $ty,
            tiled::matmul_nbits_large::<$ty, { LARGE.mt }, { LARGE.nt }, { LARGE.wm }, { LARGE.wn }, true>
        );

        matmul_nbits_tiled_entry!($tiled32x128, $ty, TILED32X128);
        matmul_nbits_tiled_entry!($tiled64x128, $ty, TILED64X128);
        matmul_nbits_tiled_entry!($tiled128x128, $ty, TILED128X128);
        /// Activation permutation for `tiled` and `wgmma`.
        ///
        /// # Safety
        /// The launch contract in [`tiled`]'s docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $permute(
            a: *const $ty,
            a_perm: *mut $ty,
            zeroed: *mut u32,
            dims: Dims,
            zeroed_words: u32,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { tiled::permute::<$ty, false>(a, a_perm, zeroed, dims, zeroed_words) }
        }

        /// Split-K reduction.
        ///
        /// # Safety
        /// The launch contract in [`common`]'s docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $reduce(
            bias: *const $ty,
            y: *mut $ty,
            workspace: *const f32,
            dims: Dims,
            splits: u32,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { common::reduce::<$ty>(bias, y, workspace, dims, splits) }
        }
    };
}

matmul_nbits_entries!(
    F16,
    matmul_nbits_decode8_f16,
    matmul_nbits_decode8_ahead3_f16,
    matmul_nbits_decode16_f16,
    matmul_nbits_decode8_packed_f16,
    matmul_nbits_decode8_packed_wide_f16,
    matmul_nbits_decode16_packed_f16,
    matmul_nbits_decode16_packed_wide_f16,
    matmul_nbits_decode8_packed_fine_f16,
    matmul_nbits_decode8_packed_wide_fine_f16,
    matmul_nbits_decode16_packed_fine_f16,
    matmul_nbits_decode16_packed_wide_fine_f16,
    matmul_nbits_decode8_packed_fine16_f16,
    matmul_nbits_decode8_packed_wide_fine16_f16,
    matmul_nbits_decode16_packed_fine16_f16,
    matmul_nbits_decode16_packed_wide_fine16_f16,
    matmul_nbits_small_f16,
    matmul_nbits_small_zf_f16,
    matmul_nbits_large_f16,
    matmul_nbits_large_zf_f16,
    matmul_nbits_tiled32x128_f16,
    matmul_nbits_tiled64x128_f16,
    matmul_nbits_tiled128x128_f16,
    matmul_nbits_permute_f16,
    matmul_nbits_reduce_f16
);
matmul_nbits_entries!(
    Bf16,
    matmul_nbits_decode8_bf16,
    matmul_nbits_decode8_ahead3_bf16,
    matmul_nbits_decode16_bf16,
    matmul_nbits_decode8_packed_bf16,
    matmul_nbits_decode8_packed_wide_bf16,
    matmul_nbits_decode16_packed_bf16,
    matmul_nbits_decode16_packed_wide_bf16,
    matmul_nbits_decode8_packed_fine_bf16,
    matmul_nbits_decode8_packed_wide_fine_bf16,
    matmul_nbits_decode16_packed_fine_bf16,
    matmul_nbits_decode16_packed_wide_fine_bf16,
    matmul_nbits_decode8_packed_fine16_bf16,
    matmul_nbits_decode8_packed_wide_fine16_bf16,
    matmul_nbits_decode16_packed_fine16_bf16,
    matmul_nbits_decode16_packed_wide_fine16_bf16,
    matmul_nbits_small_bf16,
    matmul_nbits_small_zf_bf16,
    matmul_nbits_large_bf16,
    matmul_nbits_large_zf_bf16,
    matmul_nbits_tiled32x128_bf16,
    matmul_nbits_tiled64x128_bf16,
    matmul_nbits_tiled128x128_bf16,
    matmul_nbits_permute_bf16,
    matmul_nbits_reduce_bf16
);

/// The sm_90a module's entries: the `wgmma` kernels.
#[cfg(dlkern_arch_specific)]
mod hopper {
    use super::*;

    // The entries name the generic function itself (always inlined), not a closure around it: a
    // closure may stay a call, which costs a stack frame.
    matmul_nbits_entry!(matmul_nbits_wgmma_f16, F16, wgmma::matmul_nbits_wgmma::<F16, false, false>);
    matmul_nbits_entry!(matmul_nbits_wgmma_bf16, Bf16, wgmma::matmul_nbits_wgmma::<Bf16, false, false>);
    matmul_nbits_entry!(matmul_nbits_wgmma_pair_f16, F16, wgmma::matmul_nbits_wgmma::<F16, true, false>);
    matmul_nbits_entry!(matmul_nbits_wgmma_pair_bf16, Bf16, wgmma::matmul_nbits_wgmma::<Bf16, true, false>);
    // The pair entries run as clusters of the two splits of a tile (grid z = 2).
    crate::entry_directive!(matmul_nbits_wgmma_pair_f16, ".reqnctapercluster 1, 1, 2");
    crate::entry_directive!(matmul_nbits_wgmma_pair_bf16, ".reqnctapercluster 1, 1, 2");
    matmul_nbits_entry!(matmul_nbits_wgmma_streamk_f16, F16, wgmma::matmul_nbits_wgmma_streamk::<F16, false>);
    matmul_nbits_entry!(matmul_nbits_wgmma_streamk_bf16, Bf16, wgmma::matmul_nbits_wgmma_streamk::<Bf16, false>);
    // The same for the formats the builds above do not take: blocks of 16, typed zero points.
    matmul_nbits_entry!(matmul_nbits_wgmma_any_f16, F16, wgmma::matmul_nbits_wgmma::<F16, false, true>);
    matmul_nbits_entry!(matmul_nbits_wgmma_any_bf16, Bf16, wgmma::matmul_nbits_wgmma::<Bf16, false, true>);
    matmul_nbits_entry!(matmul_nbits_wgmma_pair_any_f16, F16, wgmma::matmul_nbits_wgmma::<F16, true, true>);
    matmul_nbits_entry!(matmul_nbits_wgmma_pair_any_bf16, Bf16, wgmma::matmul_nbits_wgmma::<Bf16, true, true>);
    crate::entry_directive!(matmul_nbits_wgmma_pair_any_f16, ".reqnctapercluster 1, 1, 2");
    crate::entry_directive!(matmul_nbits_wgmma_pair_any_bf16, ".reqnctapercluster 1, 1, 2");
    matmul_nbits_entry!(matmul_nbits_wgmma_streamk_any_f16, F16, wgmma::matmul_nbits_wgmma_streamk::<F16, true>);
    matmul_nbits_entry!(matmul_nbits_wgmma_streamk_any_bf16, Bf16, wgmma::matmul_nbits_wgmma_streamk::<Bf16, true>);

    // The 16-token build without K splits: what the planner runs (`Packed` where M > 8 and N alone
    // fills the GPU). The 8-token build and the K splits as clusters of 2 or 4 blocks were never
    // its choice and were removed (benches/pruned.md; the code is at 20fc28c).
    matmul_nbits_entry!(matmul_nbits_packed_wgmma16_f16, F16, packed_wgmma::matmul_nbits_packed_wgmma::<F16, 2>);
    matmul_nbits_entry!(matmul_nbits_packed_wgmma16_bf16, Bf16, packed_wgmma::matmul_nbits_packed_wgmma::<Bf16, 2>);

    // A producer and two consumer warpgroups, whose registers `setmaxnreg` moves between them.
    matmul_nbits_entry!(matmul_nbits_prefill_f16, F16, prefill::matmul_nbits_prefill::<F16, false, false>);
    matmul_nbits_entry!(matmul_nbits_prefill_bf16, Bf16, prefill::matmul_nbits_prefill::<Bf16, true, false>);
    crate::entry_directive!(matmul_nbits_prefill_f16, ".maxntid 384, 1, 1");
    crate::entry_directive!(matmul_nbits_prefill_bf16, ".maxntid 384, 1, 1");
    matmul_nbits_entry!(matmul_nbits_prefill_any_f16, F16, prefill::matmul_nbits_prefill::<F16, false, true>);
    matmul_nbits_entry!(matmul_nbits_prefill_any_bf16, Bf16, prefill::matmul_nbits_prefill::<Bf16, true, true>);
    crate::entry_directive!(matmul_nbits_prefill_any_f16, ".maxntid 384, 1, 1");
    crate::entry_directive!(matmul_nbits_prefill_any_bf16, ".maxntid 384, 1, 1");

    macro_rules! permute_image_entry {
        ($name:ident, $ty:ty) => {
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(
                a: *const $ty,
                a_image: *mut $ty,
                zeroed: *mut u32,
                dims: Dims,
                zeroed_words: u32,
            ) {
                // SAFETY: forwarded launch contract.
                unsafe { tiled::permute::<$ty, true>(a, a_image, zeroed, dims, zeroed_words) }
            }
        };
    }
    permute_image_entry!(matmul_nbits_permute_image_f16, F16);
    permute_image_entry!(matmul_nbits_permute_image_bf16, Bf16);

    macro_rules! cook_consts_entry {
        ($name:ident, $ty:ty) => {
            /// The dequantization constants `prefill_any` reads, cooked.
            ///
            /// # Safety
            /// The launch contract in [`common`]'s docs.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(
                scales: *const $ty,
                zeros_u8: *const u8,
                zeros_t: *const $ty,
                cooked: *mut u32,
                cooked_zero: *mut u8,
                dims: Dims,
            ) {
                // SAFETY: forwarded launch contract.
                unsafe { common::cook_consts::<$ty>(scales, zeros_u8, zeros_t, cooked, cooked_zero, dims) }
            }
        };
    }
    cook_consts_entry!(matmul_nbits_cook_consts_f16, F16);
    cook_consts_entry!(matmul_nbits_cook_consts_bf16, Bf16);
}
