//! W8A8 matmul on int8 tensor cores: `y[m][n] = (sum_k a[m][k] * w[n][k]) * a_scale[m] *
//! w_scale[n] (+ bias[n])`, int32 accumulation (exact for `K <= 131071`, checked by the host),
//! the epilogue in f32, stored as f16, bf16 or f32.
//!
//! Both operands are K-major (`a [M, K]`, `w [N, K]` row-major int8), which is exactly the
//! `mma.sync.m16n8k32.row.col` layout: tiles go from global to shared memory with `cp.async`
//! (three stages) and from shared memory into fragments with `ldmatrix`, no transposes.
//!
//! # Launch contract: `matmul_w8a8_quantize_{f16,bf16,f32}`
//! - grid `(rows, 1, 1)`, block `(256, 1, 1)`, no dynamic shared memory: row `r` of `x [rows,
//!   cols]` to int8 codes `q [rows, cols]` with `scale[r] = max|x| / 127`, codes
//!   `round_half_even(x / scale)` clamped to +-127 (0 for an all-zero row): bit for bit the
//!   host's `quant::w8::quantize_rows`. Non-finite inputs give unspecified codes.
//!
//! # Launch contract: `matmul_w8a8_{f16,bf16,f32}`
//! - grid `(ceil(N / 128), ceil(M / 128), 1)`, block `(256, 1, 1)` (8 warps, 2 x 4, each a
//!   64 x 32 tile), dynamic shared memory [`SHARED_BYTES`].
//! - `a_scale`: `[M]` f32, or `[1]` when `flags & FLAG_SCALAR_A_SCALE`; `w_scale` `[N]` f32;
//!   `bias` `[N]` f32 when `flags & FLAG_BIAS`.
//! - `flags & FLAG_VEC16`: `K % 16 == 0` and `a`, `w` 16-byte aligned (asynchronous 16-byte
//!   copies); otherwise tiles are gathered byte by byte (any K, any alignment).
//!
//! - grid `z` splits K: block `(x, y, z)` covers K tiles `[z * k_tiles_per_split, (z + 1) *
//!   k_tiles_per_split)`. `matmul_w8a8_partial` (same contract) writes each split's int32
//!   partial sums to `workspace [splits, M, N]` instead of `y`; `matmul_w8a8_reduce_*` finishes.
//!
//! # Launch contract: `matmul_w8a8_reduce_{f16,bf16,f32}`
//! - grid `(ceil(M * N / REDUCE_THREADS), 1, 1)`, block `(REDUCE_THREADS, 1, 1)`: `y[m][n] =
//!   (sum_z workspace[z][m][n]) * a_scale * w_scale[n] (+ bias[n])`.
//!
//! # Launch contract: `matmul_w8a8_small_{f16,bf16,f32}` (decoding: `M <= 16`)
//! - grid `(ceil(N / 16), 1, 1)`, block `(128, 1, 1)`, no dynamic shared memory; `M <= 16`,
//!   `K % 16 == 0`, `a` and `w` 16-byte aligned; scales, bias and flags as above.
//! - Bound by reading W once: each warp streams 16 weight rows over a quarter of K with 16-byte
//!   loads straight into `mma` B fragments (K is permuted identically in A and W, so no
//!   shuffles), and the four warps' sums meet in shared memory.
//!
//! # Launch contract: `matmul_w8a8_small_packed_{f16,bf16,f32}`
//! - As `matmul_w8a8_small_*`, but `w` is packed ([`PACKED_TILE_BYTES`]: `[ceil(N / 16)][ceil(K /
//!   64)][16][64]`, zero-padded; the host's `quant::w8::pack_for_decode`): each warp-wide load
//!   reads 512 contiguous bytes and each block one contiguous run, where `[N, K]` rows make it
//!   read 64 bytes from each of 8 rows `K` apart.

pub mod layout;
#[cfg(dlkern_arch_specific)]
pub mod wgmma;

use crate::device::async_copy::{commit_group, cp_async_16_zfill, wait_group};
use crate::device::convert::round_ties_even_i32;
use crate::device::ldmatrix::ldmatrix_x4;
use crate::device::memory::{ld_global_nc_stream_v4, ld_global_nc_v4};
use crate::device::mma::mma_m16n8k32_s8_s32;
use crate::device::reduce::{BLOCK_REDUCE_SCRATCH_BYTES, block_max_f32};
use crate::device::shared::ld_shared_v4;
use crate::device::shared::{dynamic_shared_base, st_shared_v4};
use crate::device::{SharedAddr, index, sync};
use crate::element::{Bf16, Element, F16};
use crate::{shared_array, unroll};

pub use layout::*;

/// Copies rows `[0, valid)` of a 128 x 64 tile (`src` at the tile's first row and K offset
/// `k0`, rows `k` bytes apart) into shared memory, zero-filling rows past `valid` and bytes
/// past `k`; all 256 threads.
///
/// # Safety
/// `src` must be a global address with rows `[0, valid)` readable up to byte `k`.
#[inline(always)]
unsafe fn load_tile(dst: SharedAddr, src: *const i8, valid: usize, k0: usize, k: usize, vec16: bool) {
    let tid = index::thread_idx_x() as usize;
    unroll!(U in [0, 1] {
        let c = tid + U * THREADS;
        let (r, chunk) = (c / 4, c % 4);
        let kk = k0 + 16 * chunk;
        let at = dst.offset((r * ROW + 16 * chunk) as u32);
        // SAFETY: only bytes of rows below `valid` and below `k` are read.
        unsafe {
            if vec16 {
                let ok = r < valid && kk < k; // k % 16 == 0: a chunk is all in or all out
                let from = if ok { src.add(r * k + kk) } else { src };
                cp_async_16_zfill(at, from.cast(), if ok { 16 } else { 0 });
            } else {
                let mut bytes = [0u32; 4];
                if r < valid {
                    unroll!(B in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                        if kk + B < k {
                            bytes[B / 4] |= (src.add(r * k + kk + B).read() as u8 as u32) << (8 * (B % 4));
                        }
                    });
                }
                st_shared_v4(at, bytes);
            }
        }
    });
}

/// The tiled kernel; `PARTIAL`: one K split's int32 partial sums to `workspace` instead of `y`.
///
/// # Safety
/// The launch contract in the module docs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_w8a8<T: Element, const PARTIAL: bool>(
    a: *const i8,
    w: *const i8,
    a_scale: *const f32,
    w_scale: *const f32,
    bias: *const f32,
    y: *mut T,
    workspace: *mut i32,
    p: Dims,
) {
    let tid = index::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, index::lane_id() as usize);
    let (warp_m, warp_n) = (warp / 4, warp % 4);
    let (g, qd) = (lane / 4, lane % 4);
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let m0 = index::block_idx_y() as usize * BM;
    let n0 = index::block_idx_x() as usize * BN;
    let vec16 = p.flags & FLAG_VEC16 != 0;
    let smem = dynamic_shared_base();
    let a_s = |stage: usize| smem.offset((stage * 2 * TILE_BYTES) as u32);
    let w_s = |stage: usize| smem.offset((stage * 2 * TILE_BYTES + TILE_BYTES) as u32);
    // This block's K tiles: all of them, or one split's share.
    let split = index::block_idx_z() as usize;
    let per_split = (p.k_tiles_per_split as usize).max(1);
    let kt_lo = split * per_split;
    let kt_hi = k.div_ceil(BK).min(kt_lo + per_split);
    let a_rows = m.saturating_sub(m0).min(BM);
    let w_rows = n.saturating_sub(n0).min(BN);

    let mut acc = [[[0i32; 4]; 4]; 4];
    // SAFETY (whole body): the launch contract sizes every buffer; tile loads stay inside the
    // rows and K of the operands; barriers are reached by all threads (bounds depend only on
    // the block).
    unsafe {
        let (a_blk, w_blk) = (a.add(m0 * k), w.add(n0 * k));
        let load = |kt: usize, stage: usize| {
            load_tile(a_s(stage), a_blk, a_rows, kt * BK, k, vec16);
            load_tile(w_s(stage), w_blk, w_rows, kt * BK, k, vec16);
        };
        unroll!(S in [0, 1] {
            if kt_lo + S < kt_hi {
                load(kt_lo + S, S);
            }
            commit_group();
        });
        // ldmatrix row addresses within a tile: A as the row-major operand, W as n-major.
        let a_row = (warp_m * 64 + lane % 16) * ROW + (lane / 16) * 16;
        let w_row = (warp_n * 32 + lane % 8 + 8 * (lane / 16)) * ROW + ((lane / 8) % 2) * 16;

        let mut kt = kt_lo;
        while kt < kt_hi {
            wait_group::<{ STAGES as u32 - 2 }>();
            sync::sync_threads();
            // The stage refilled here was read in the previous iteration, before the barrier.
            let next = kt + STAGES - 1;
            if next < kt_hi {
                load(next, (next - kt_lo) % STAGES);
            }
            commit_group();
            let stage = (kt - kt_lo) % STAGES;
            unroll!(KS in [0, 1] {
                let mut af = [[0u32; 4]; 4];
                unroll!(MT in [0, 1, 2, 3] {
                    af[MT] = ldmatrix_x4(a_s(stage).offset((a_row + MT * 16 * ROW + KS * 32) as u32));
                });
                unroll!(P in [0, 1] {
                    let bf = ldmatrix_x4(w_s(stage).offset((w_row + P * 16 * ROW + KS * 32) as u32));
                    unroll!(MT in [0, 1, 2, 3] {
                        acc[MT][2 * P] = mma_m16n8k32_s8_s32(acc[MT][2 * P], af[MT], [bf[0], bf[1]]);
                        acc[MT][2 * P + 1] = mma_m16n8k32_s8_s32(acc[MT][2 * P + 1], af[MT], [bf[2], bf[3]]);
                    });
                });
            });
            kt += 1;
        }
        wait_group::<0>();

        // Epilogue: rows g, g + 8 and columns 2q, 2q + 1 of each 16 x 8 tile; the split-K build
        // writes its exact int32 partial sums instead, for `matmul_w8a8_reduce_*` (a separate
        // entry: a run-time choice between the two epilogues cost 34 registers).
        let ws = workspace.wrapping_add(split * m * n);
        unroll!(MT in [0, 1, 2, 3] {
            unroll!(NT in [0, 1, 2, 3] {
                unroll!(C in [0, 1, 2, 3] {
                    let row = m0 + warp_m * 64 + MT * 16 + g + 8 * (C / 2);
                    let col = n0 + warp_n * 32 + NT * 8 + 2 * qd + C % 2;
                    if row < m && col < n {
                        if PARTIAL {
                            ws.add(row * n + col).write(acc[MT][NT][C]);
                        } else {
                            store_output(acc[MT][NT][C], row, col, a_scale, w_scale, bias, y, p);
                        }
                    }
                });
            });
        });
    }
}

/// K steps (of 64 bytes) each warp of the decode kernel keeps in flight.
const SMALL_UNROLL: usize = 4;
/// The decode kernel is written for 4 warps over 16 W rows (the partial-sum exchange below).
const SMALL_WARPS: usize = SMALL_THREADS / 32;
const _: () = assert!(SMALL_WARPS == 4 && SMALL_N_PER_BLOCK == 16 && SMALL_M_MAX == 16);

/// The epilogue shared by both kernels: `acc * a_scale[row] * w_scale[col] (+ bias[col])`.
///
/// # Safety
/// `row < M`, `col < N`, and the buffers as in the launch contract.
#[inline(always)]
pub(crate) unsafe fn store_output<T: Element>(
    acc: i32,
    row: usize,
    col: usize,
    a_scale: *const f32,
    w_scale: *const f32,
    bias: *const f32,
    y: *mut T,
    p: Dims,
) {
    // SAFETY: by the caller's contract.
    unsafe {
        let sa = a_scale.add(if p.flags & FLAG_SCALAR_A_SCALE != 0 { 0 } else { row }).read();
        let mut v = acc as f32 * sa * w_scale.add(col).read();
        if p.flags & FLAG_BIAS != 0 {
            v += bias.add(col).read();
        }
        y.add(row * p.n as usize + col).write(T::from_f32(v));
    }
}

/// The decode kernel over `[N, K]` weights (`PACKED = false`) or over the packed tiles of
/// [`PACKED_TILE_BYTES`] (`PACKED = true`).
#[inline(always)]
unsafe fn matmul_w8a8_small<T: Element, const PACKED: bool>(
    a: *const i8,
    w: *const i8,
    a_scale: *const f32,
    w_scale: *const f32,
    bias: *const f32,
    y: *mut T,
    _workspace: *mut i32,
    p: Dims,
) {
    let tid = index::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, index::lane_id() as usize);
    let (g, qd) = (lane / 4, lane % 4);
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let n0 = index::block_idx_x() as usize * SMALL_N_PER_BLOCK;
    let chunks = k / 16; // 16-byte chunks per row
    let steps = k.div_ceil(SMALL_K_STEP);
    let scratch = shared_array!(DLKERN_W8A8_SMALL_PARTIALS, 4096, 16);

    // Lane (g, q) holds bytes 16q..16q+16 of each 64-byte K step for A rows g, g + 8 and W rows
    // n0 + g, n0 + 8 + g: words 2j, 2j + 1 are the k-halves of `mma` j, the same permutation
    // of K on both sides.
    let mut acc = [[0i32; 4]; 2];
    // SAFETY (whole body): loads are guarded by M, N and K (a 16-byte chunk is all in or all
    // out since K % 16 == 0, and aligned by the contract), packed W loads by K inside the
    // block's own zero-padded tiles; the barrier is reached by all threads.
    unsafe {
        // Rows past M or N are never dereferenced (guarded below), hence the wrapping arithmetic.
        let row_ptr = |base: *const i8, row: usize| base.wrapping_add(row * k + 16 * qd);
        let (a_lo, a_hi) = (row_ptr(a, g), row_ptr(a, g + 8));
        // Packed: rows g and g + 8 of the block's tile of each step; the padding makes every
        // load of the block's tiles valid.
        let (w_lo, w_hi) = if PACKED {
            let tile = w.wrapping_add(index::block_idx_x() as usize * steps * PACKED_TILE_BYTES);
            let lo = tile.wrapping_add(g * SMALL_K_STEP + 16 * qd);
            (lo, lo.wrapping_add(8 * SMALL_K_STEP))
        } else {
            (row_ptr(w, n0 + g), row_ptr(w, n0 + 8 + g))
        };
        let (a_lo_ok, a_hi_ok) = (g < m, g + 8 < m);
        let (w_lo_ok, w_hi_ok) = (n0 + g < n, n0 + 8 + g < n);
        let mut base = warp;
        while base < steps {
            let mut av = [[[0u32; 4]; 2]; SMALL_UNROLL];
            let mut wv = [[[0u32; 4]; 2]; SMALL_UNROLL];
            // All loads of the group first, then the math: four steps of W in flight per lane.
            unroll!(U in [0, 1, 2, 3] {
                let step = base + SMALL_WARPS * U;
                let in_k = step * 4 + qd < chunks;
                let off = step * SMALL_K_STEP;
                if PACKED {
                    // The tile has all 16 rows (zero-padded); chunks past K are skipped as A's.
                    if in_k {
                        wv[U][0] = ld_global_nc_stream_v4(w_lo.wrapping_add(step * PACKED_TILE_BYTES).cast());
                        wv[U][1] = ld_global_nc_stream_v4(w_hi.wrapping_add(step * PACKED_TILE_BYTES).cast());
                    }
                } else {
                    if in_k && w_lo_ok { wv[U][0] = ld_global_nc_stream_v4(w_lo.wrapping_add(off).cast()); }
                    if in_k && w_hi_ok { wv[U][1] = ld_global_nc_stream_v4(w_hi.wrapping_add(off).cast()); }
                }
                if in_k && a_lo_ok { av[U][0] = ld_global_nc_v4(a_lo.wrapping_add(off).cast()); }
                if in_k && a_hi_ok { av[U][1] = ld_global_nc_v4(a_hi.wrapping_add(off).cast()); }
            });
            unroll!(U in [0, 1, 2, 3] {
                unroll!(J in [0, 1] {
                    let af = [av[U][0][2 * J], av[U][1][2 * J], av[U][0][2 * J + 1], av[U][1][2 * J + 1]];
                    unroll!(T2 in [0, 1] {
                        acc[T2] = mma_m16n8k32_s8_s32(acc[T2], af, [wv[U][T2][2 * J], wv[U][T2][2 * J + 1]]);
                    });
                });
            });
            base += SMALL_WARPS * SMALL_UNROLL;
        }

        // Sum the four warps' partial tiles: [warp][lane][8 words].
        let slot = |wp: usize, half: usize| scratch.offset(((wp * 32 + lane) * 32 + 16 * half) as u32);
        if warp != 0 {
            st_shared_v4(slot(warp, 0), acc[0].map(|x| x as u32));
            st_shared_v4(slot(warp, 1), acc[1].map(|x| x as u32));
        }
        sync::sync_threads();
        if warp == 0 {
            unroll!(WP in [1, 2, 3] {
                unroll!(T2 in [0, 1] {
                    let part = ld_shared_v4(slot(WP, T2));
                    unroll!(C in [0, 1, 2, 3] {
                        acc[T2][C] = acc[T2][C].wrapping_add(part[C] as i32);
                    });
                });
            });
            // Rows g, g + 8 and columns 2q, 2q + 1 of each 16 x 8 tile.
            unroll!(T2 in [0, 1] {
                unroll!(C in [0, 1, 2, 3] {
                    let row = g + 8 * (C / 2);
                    let col = n0 + 8 * T2 + 2 * qd + C % 2;
                    if row < m && col < n {
                        store_output(acc[T2][C], row, col, a_scale, w_scale, bias, y, p);
                    }
                });
            });
        }
    }
}

#[inline(always)]
unsafe fn quantize<T: Element>(x: *const T, q: *mut i8, scales: *mut f32, cols: u32) {
    let row = index::block_idx_x() as usize;
    let tid = index::thread_idx_x() as usize;
    let cols = cols as usize;
    let scratch = shared_array!(DLKERN_W8A8_QUANTIZE_MAX, 128, 16);
    const { assert!(BLOCK_REDUCE_SCRATCH_BYTES == 128) };
    // SAFETY: the launch contract sizes x, q and scales; the barriers are reached by all
    // threads of the block.
    unsafe {
        let x = x.add(row * cols);
        let mut max_abs = 0.0f32;
        let mut i = tid;
        while i < cols {
            max_abs = max_abs.max(x.add(i).read().to_f32().abs());
            i += QUANTIZE_THREADS;
        }
        let scale = block_max_f32(max_abs, scratch) / 127.0;
        if tid == 0 {
            scales.add(row).write(scale);
        }
        let mut i = tid;
        while i < cols {
            let code =
                if scale > 0.0 { round_ties_even_i32(x.add(i).read().to_f32() / scale).clamp(-127, 127) } else { 0 };
            q.add(row * cols + i).write(code as i8);
            i += QUANTIZE_THREADS;
        }
    }
}

/// `y = (sum over splits of the int32 partials) * a_scale * w_scale (+ bias)`: the split-K
/// epilogue (exact integer sums, then the same f32 arithmetic as the unsplit kernel).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn reduce<T: Element>(
    workspace: *const i32,
    a_scale: *const f32,
    w_scale: *const f32,
    bias: *const f32,
    y: *mut T,
    p: Dims,
    splits: u32,
) {
    let (m, n) = (p.m as usize, p.n as usize);
    let i = index::block_idx_x() as usize * REDUCE_THREADS + index::thread_idx_x() as usize;
    if i < m * n {
        // SAFETY: the launch contract sizes the workspace as [splits, M, N] and the rest as in
        // the tiled kernel; `i < M * N`.
        unsafe {
            let mut sum = 0i32;
            for s in 0..splits as usize {
                sum = sum.wrapping_add(workspace.add(s * m * n + i).read());
            }
            // n > 0 here (i < m * n); NonZero keeps a division-by-zero panic path out of the PTX.
            let n_nz = core::num::NonZeroUsize::new(n).unwrap_or(core::num::NonZeroUsize::MIN);
            store_output(sum, i / n_nz, i % n_nz, a_scale, w_scale, bias, y, p);
        }
    }
}

macro_rules! reduce_entry {
    ($name:ident, $ty:ty) => {
        /// Split-K reduction of the W8A8 matmul; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            workspace: *const i32,
            a_scale: *const f32,
            w_scale: *const f32,
            bias: *const f32,
            y: *mut $ty,
            dims: Dims,
            splits: u32,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { reduce::<$ty>(workspace, a_scale, w_scale, bias, y, dims, splits) }
        }
    };
}

reduce_entry!(matmul_w8a8_reduce_f16, F16);
reduce_entry!(matmul_w8a8_reduce_bf16, Bf16);
reduce_entry!(matmul_w8a8_reduce_f32, f32);

macro_rules! quantize_entry {
    ($name:ident, $ty:ty) => {
        /// Per-token int8 quantization; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(x: *const $ty, q: *mut i8, scales: *mut f32, cols: u32) {
            // SAFETY: forwarded launch contract.
            unsafe { quantize::<$ty>(x, q, scales, cols) }
        }
    };
}

quantize_entry!(matmul_w8a8_quantize_f16, F16);
quantize_entry!(matmul_w8a8_quantize_bf16, Bf16);
quantize_entry!(matmul_w8a8_quantize_f32, f32);

macro_rules! w8a8_entry {
    ($name:ident, $ty:ty, $body:expr) => {
        /// W8A8 matmul; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            a: *const i8,
            w: *const i8,
            a_scale: *const f32,
            w_scale: *const f32,
            bias: *const f32,
            y: *mut $ty,
            workspace: *mut i32,
            dims: Dims,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { $body(a, w, a_scale, w_scale, bias, y, workspace, dims) }
        }
    };
}
// The Hopper kernels' entries (`wgmma.rs`) take the same parameters.
#[cfg(dlkern_arch_specific)]
pub(crate) use w8a8_entry;

w8a8_entry!(matmul_w8a8_f16, F16, matmul_w8a8::<F16, false>);
w8a8_entry!(matmul_w8a8_bf16, Bf16, matmul_w8a8::<Bf16, false>);
w8a8_entry!(matmul_w8a8_f32, f32, matmul_w8a8::<f32, false>);
// One K split's int32 partial sums (`y` unused).
w8a8_entry!(matmul_w8a8_partial, f32, matmul_w8a8::<f32, true>);
w8a8_entry!(matmul_w8a8_small_f16, F16, matmul_w8a8_small::<F16, false>);
w8a8_entry!(matmul_w8a8_small_bf16, Bf16, matmul_w8a8_small::<Bf16, false>);
w8a8_entry!(matmul_w8a8_small_f32, f32, matmul_w8a8_small::<f32, false>);
w8a8_entry!(matmul_w8a8_small_packed_f16, F16, matmul_w8a8_small::<F16, true>);
w8a8_entry!(matmul_w8a8_small_packed_bf16, Bf16, matmul_w8a8_small::<Bf16, true>);
w8a8_entry!(matmul_w8a8_small_packed_f32, f32, matmul_w8a8_small::<f32, true>);
