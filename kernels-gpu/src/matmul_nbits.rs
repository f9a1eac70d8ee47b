//! W4A16 matmul in ONNX Runtime's `MatMulNBits` format (bits = 4): `Y = A W^T (+ bias)` with
//! `W [N, K]` stored as 4-bit codes in blocks along K, on tensor cores.
//!
//! Layouts (row-major): `a [M, K]` f16/bf16; `b` u8 `[N, k_blocks, block_size / 2]` (code `2i` in
//! the low nibble of byte `i`); `scales [N, k_blocks]` in A's type; zero points either none (8),
//! u8 `[N, ceil(k_blocks / 2)]` (block `2j` in the low nibble of byte `j`) or `[N, k_blocks]` in
//! A's type; `bias [N]` or null; `y [M, N]`.
//!
//! The weights are read once, straight from the `MatMulNBits` layout into registers (no
//! repacking): lane `(g, q)` of a warp loads 16 bytes (32 codes) of column `g` of an 8-column
//! tile at K offset `32q` of each 128-wide K chunk, and turns each 32-bit word into the B
//! fragments of two `mma.sync.m16n8k16` steps (codes `(0,4),(1,5)` then `(2,6),(3,7)`, which is
//! what the OR-into-mantissa conversion yields). The sum over K does not care about order, so
//! the activations are staged in shared memory in the matching permuted order (see the
//! staging loop) and read with `ldmatrix`. Dequantization is `(code - zero) * scale` rounded
//! to A's type (as ONNX Runtime's CUDA kernel does), accumulation in f32.
//!
//! # Launch contract: `matmul_nbits_{f16,bf16}_{small,large}[_zf]`
//! - `_zf`: zero points in A's type (fractional allowed; dequantized in f32); otherwise u8 or
//!   none, dequantized exactly in packed 16-bit arithmetic.
//! - `small`: warp tile 16 x 32, 4 warps side by side (block tile 16 x 128); `large`: warp
//!   tile 64 x 32, 2 x 4 warps (block tile 128 x 128). Block `(32 * warps, 1, 1)`.
//! - grid `(ceil(N / BN), ceil(M / BM), splits)`; split `z` covers K chunks
//!   `[z * chunks_per_split, (z + 1) * chunks_per_split)` of 128.
//! - dynamic shared memory: `large` `BM * 272` bytes (one K chunk of A at a time); `small`
//!   none (each lane loads the activations its fragments need straight from global memory).
//! - `splits == 1`: writes `y` (+ bias). Otherwise writes f32 partial sums to `workspace`
//!   `[splits, M, N]` for `matmul_nbits_reduce_*`.
//! - `a`, `b`, `y` need no alignment beyond their element type (16-byte vector loads are used
//!   when `flags` says the rows allow them).
//!
//! # Launch contract: `matmul_nbits_reduce_{f16,bf16}`
//! - grid `(ceil(M * N / 256), 1, 1)`, block `(256, 1, 1)`: `y = sum over splits + bias`.

use crate::device::ldmatrix::ldmatrix_x4;
use crate::device::memory::{ld_global_nc_u32, ld_global_nc_v4};
use crate::device::shared::{dynamic_shared_base, st_shared_u32};
use crate::device::{index, sync};
use crate::element::{Bf16, Element, F16, TensorElement};
use crate::unroll;

pub use crate::layout::matmul_nbits::*;

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
struct BlockConsts {
    scale2: u32,
    zero: u32,
    zero_f: f32,
    scale_f: f32,
}

/// # Safety
/// `col` and `blk` index valid entries of `scales` and of the zero points the flags name.
#[inline(always)]
unsafe fn block_consts<T: TensorElement>(
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
        let scale = scales.add(sb).cast::<u16>().read() as u32;
        let mut c = BlockConsts { scale2: scale | (scale << 16), zero: 8, zero_f: 0.0, scale_f: 0.0 };
        if p.flags & FLAG_ZERO_T != 0 {
            c.zero_f = zeros_t.add(sb).read().to_f32();
            c.scale_f = scales.add(sb).read().to_f32();
        } else if p.flags & FLAG_ZERO_U8 != 0 {
            let byte = zeros_u8.add(col * (p.k_blocks as usize).div_ceil(2) + blk / 2).read() as u32;
            c.zero = (byte >> (4 * (blk as u32 % 2))) & 15;
        }
        c
    }
}

/// B fragments of one word of codes: `(code - zero) * scale` as pairs `(0,4), (1,5), (2,6),
/// (3,7)`; `typed`: fractional zero points, computed in f32 and rounded once.
#[inline(always)]
fn dequantize<T: TensorElement>(word: u32, c: BlockConsts, typed: bool) -> [u32; 4] {
    if typed {
        let v = |j: u32| (((word >> (4 * j)) & 15) as f32 - c.zero_f) * c.scale_f;
        return [T::pack2(v(0), v(4)), T::pack2(v(1), v(5)), T::pack2(v(2), v(6)), T::pack2(v(3), v(7))];
    }
    let d = T::codes_minus_zero(word, c.zero);
    let neg_zero = 0x8000_8000; // -0.0 twice: x * s + (-0) == x * s
    [
        T::fma2(d[0], c.scale2, neg_zero),
        T::fma2(d[1], c.scale2, neg_zero),
        T::fma2(d[2], c.scale2, neg_zero),
        T::fma2(d[3], c.scale2, neg_zero),
    ]
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_nbits<
    T: TensorElement,
    const MT: usize,
    const NT: usize,
    const WM: usize,
    const WN: usize,
    const DIRECT: bool,
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
    let bn = 8 * NT * WN;
    let threads = 32 * WM * WN;
    let tid = index::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, index::lane_id() as usize);
    let (warp_m, warp_n) = (warp / WN, warp % WN);
    let (g, q) = (lane / 4, lane % 4);
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let m0 = index::block_idx_y() as usize * bm;
    let n0 = index::block_idx_x() as usize * bn + warp_n * 8 * NT;
    let split = index::block_idx_z() as usize;
    let row_bytes = p.row_bytes as usize;
    let chunks = k.div_ceil(CHUNK);
    let first = split * p.chunks_per_split as usize;
    let last = (first + p.chunks_per_split as usize).min(chunks);
    let a_s = dynamic_shared_base();
    let row_addr = |mt: usize| {
        let r = (warp_m * MT + mt) * 16 + lane % 8 + 8 * ((lane / 8) % 2);
        a_s.offset((r * A_ROW_BYTES + 16 * (lane / 16)) as u32)
    };

    let mut acc = [[[0.0f32; 4]; NT]; MT];
    // SAFETY (whole body): the launch contract sizes every buffer and the shared memory;
    // loads are bounds-checked against M, N and the rows of `b`; barriers and
    // warp-collective instructions are reached uniformly (loop bounds depend only on the
    // block).
    unsafe {
        // This warp's codes of one chunk: lane (g, q) takes 16 bytes of column g of each tile.
        macro_rules! load_codes_of {
            ($kc:expr) => {{
                let kc: usize = $kc;
                let mut codes = [[0u32; 4]; NT];
                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if J < NT && n0 + 8 * J + g < n {
                        let row = b.add((n0 + 8 * J + g) * row_bytes);
                        codes[J] = load_codes(row, kc / 2 + 16 * q, row_bytes, p.flags & FLAG_B_VEC16 != 0);
                    }
                });
                codes
            }};
        }
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
                    let src = a.add((m0 + r) * k + k8);
                    if p.flags & FLAG_A_VEC16 != 0 && k8 + 8 <= k {
                        x = ld_global_nc_v4(src.cast());
                    } else {
                        let mut h = [0u16; 8];
                        for (e, he) in h.iter_mut().enumerate() {
                            if k8 + e < k {
                                *he = src.add(e).cast::<u16>().read();
                            }
                        }
                        for (e, xe) in x.iter_mut().enumerate() {
                            *xe = h[2 * e] as u32 | ((h[2 * e + 1] as u32) << 16);
                        }
                    }
                }
                let lo = |v: u32| v & 0xFFFF;
                let hi = |v: u32| v >> 16;
                let pair = |a: u32, b: u32| a | (b << 16);
                let row = a_s.offset((r * A_ROW_BYTES) as u32);
                let at = |step: usize, kk: usize| row.offset(((step * 16 + kk) * 2) as u32);
                st_shared_u32(at(2 * i, 2 * qq), pair(lo(x[0]), lo(x[2])));
                st_shared_u32(at(2 * i, 2 * qq + 8), pair(hi(x[0]), hi(x[2])));
                st_shared_u32(at(2 * i + 1, 2 * qq), pair(lo(x[1]), lo(x[3])));
                st_shared_u32(at(2 * i + 1, 2 * qq + 8), pair(hi(x[1]), hi(x[3])));
                task += threads;
            }
        };
        // Per word: dequantize the NT columns' codes, then two K steps for every tile.
        // Dequantization constants of the chunk per tile: lane q's words 0-1 and 2-3 each lie
        // in one block (blocks are at least 16 wide and 16-aligned).
        macro_rules! consts_of {
            ($kc:expr) => {{
                let kc: usize = $kc;
                let mut consts = [[BlockConsts { scale2: 0, zero: 8, zero_f: 0.0, scale_f: 0.0 }; 2]; NT];
                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                    let col = n0 + 8 * J + g;
                    unroll!(HALF in [0, 1] {
                        let blk = (kc + 32 * q + 16 * HALF) >> p.block_shift;
                        if J < NT && col < n && (blk as u32) < p.k_blocks {
                            // Blocks of 32 or more: both halves share one block.
                            consts[J][HALF] = if HALF == 1 && p.block_shift >= 5 {
                                consts[J][0]
                            } else {
                                block_consts::<T>(col, blk, scales, zeros_u8, zeros_t, &p)
                            };
                        }
                    });
                });
                consts
            }};
        }
        // One chunk: per word, dequantize the NT tiles' codes, then two K steps of every tile,
        // with A fragments from `$a_frag(MM, I, H)`.
        macro_rules! compute {
            ($codes:expr, $consts:expr, $a_frag:expr) => {{
                let codes: &[[u32; 4]; NT] = $codes;
                let consts: &[[BlockConsts; 2]; NT] = $consts;
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
                                let af: [u32; 4] = $a_frag(MM, I, H);
                                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                                    if J < NT {
                                        acc[MM][J] = T::mma(acc[MM][J], af, [frag[J][2 * H], frag[J][2 * H + 1]]);
                                    }
                                });
                            }
                        });
                    });
                });
            }};
        }
        // DIRECT: this lane's activations of a chunk, rows g and g + 8 of the (single) row
        // tile, the same K as its codes: words i = 0..4 of 8 halves at K `32q + 8i`.
        macro_rules! load_a {
            ($kc:expr) => {{
                let kc: usize = $kc;
                let mut x = [[[0u32; 4]; 4]; 2];
                unroll!(R in [0, 1] {
                    let row = m0 + g + 8 * R;
                    if row < m {
                        unroll!(I in [0, 1, 2, 3] {
                            let k8 = kc + 32 * q + 8 * I;
                            let src = a.add(row * k + k8);
                            if p.flags & FLAG_A_VEC16 != 0 && k8 + 8 <= k {
                                x[R][I] = ld_global_nc_v4(src.cast());
                            } else {
                                let mut h = [0u32; 8];
                                unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                                    if k8 + E < k {
                                        h[E] = src.add(E).cast::<u16>().read() as u32;
                                    }
                                });
                                x[R][I] = [h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16];
                            }
                        });
                    }
                });
                x
            }};
        }
        // The A fragment of step 2i + h from a lane's own words: halves (2h, 2h + 4) and
        // (2h + 1, 2h + 5) of rows g and g + 8.
        let direct_frag = |x: &[[[u32; 4]; 4]; 2], i: usize, h: usize| -> [u32; 4] {
            let lo = |v: u32| v & 0xFFFF;
            let hi = |v: u32| v >> 16;
            let pair = |a: u32, b: u32| a | (b << 16);
            let (r0, r1) = (x[0][i], x[1][i]);
            [
                pair(lo(r0[h]), lo(r0[h + 2])),
                pair(lo(r1[h]), lo(r1[h + 2])),
                pair(hi(r0[h]), hi(r0[h + 2])),
                pair(hi(r1[h]), hi(r1[h + 2])),
            ]
        };

        if DIRECT {
            // Small M: no shared memory and no barriers; the other warps cover the latency.
            let mut chunk = first;
            while chunk < last {
                let kc = chunk * CHUNK;
                let codes = load_codes_of!(kc);
                let x = load_a!(kc);
                let consts = consts_of!(kc);
                compute!(&codes, &consts, |_mm: usize, i: usize, h: usize| direct_frag(&x, i, h));
                chunk += 1;
            }
        } else {
            let mut chunk = first;
            while chunk < last {
                let codes = load_codes_of!(chunk * CHUNK);
                let consts = consts_of!(chunk * CHUNK);
                sync::sync_threads();
                stage(chunk * CHUNK);
                sync::sync_threads();
                compute!(&codes, &consts, |mm: usize, i: usize, h: usize| ldmatrix_x4(
                    row_addr(mm).offset(((2 * i + h) * 32) as u32)
                ));
                chunk += 1;
            }
        }

        // Epilogue: C fragment (rows g, g + 8; columns 2q, 2q + 1 of each tile).
        let splits = index::grid_dim_z() as usize;
        unroll!(MM in [0, 1, 2, 3, 4, 5, 6, 7] {
            if MM < MT {
                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if J < NT {
                        unroll!(C in [0, 1, 2, 3] {
                            let row = m0 + (warp_m * MT + MM) * 16 + g + 8 * (C / 2);
                            let col = n0 + 8 * J + 2 * q + C % 2;
                            if row < m && col < n {
                                let v = acc[MM][J][C];
                                if splits == 1 {
                                    let bias_v = if p.flags & FLAG_BIAS != 0 { bias.add(col).read().to_f32() } else { 0.0 };
                                    y.add(row * n + col).write(T::from_f32(v + bias_v));
                                } else {
                                    workspace.add((split * m + row) * n + col).write(v);
                                }
                            }
                        });
                    }
                });
            }
        });
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

macro_rules! matmul_nbits_entries {
    ($ty:ty, $reduce:ident, $($name:ident: $tiling:ident, $direct:literal, $typed:literal);+ $(;)?) => {
        $(
        /// One variant of the W4A16 kernel; see the module docs.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            a: *const $ty, b: *const u8, scales: *const $ty, zeros_u8: *const u8, zeros_t: *const $ty,
            bias: *const $ty, y: *mut $ty, workspace: *mut f32, dims: Dims,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe {
                matmul_nbits::<$ty, { $tiling.mt }, { $tiling.nt }, { $tiling.wm }, { $tiling.wn }, $direct, $typed>(
                    a, b, scales, zeros_u8, zeros_t, bias, y, workspace, dims,
                )
            }
        }
        )+

        /// Split-K reduction; see the module docs.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $reduce(
            bias: *const $ty, y: *mut $ty, workspace: *const f32, dims: Dims, splits: u32,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { reduce::<$ty>(bias, y, workspace, dims, splits) }
        }
    };
}

matmul_nbits_entries!(F16, matmul_nbits_reduce_f16,
    matmul_nbits_f16_small: SMALL, true, false;
    matmul_nbits_f16_small_zf: SMALL, true, true;
    matmul_nbits_f16_large: LARGE, false, false;
    matmul_nbits_f16_large_zf: LARGE, false, true;
);
matmul_nbits_entries!(Bf16, matmul_nbits_reduce_bf16,
    matmul_nbits_bf16_small: SMALL, true, false;
    matmul_nbits_bf16_small_zf: SMALL, true, true;
    matmul_nbits_bf16_large: LARGE, false, false;
    matmul_nbits_bf16_large_zf: LARGE, false, true;
);
