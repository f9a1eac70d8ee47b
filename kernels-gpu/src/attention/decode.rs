//! Decode attention over a BNSH KV cache (ONNX Runtime's `GroupQueryAttention` with one new
//! token per sequence), split over the keys: each block streams one slice of one KV head's
//! cache once for all `group` query heads that share it, on CUDA cores (a decode step reads
//! every key once and does `2 * group` flops per element, far from the tensor cores' need), and
//! a second kernel merges the slices by their log-sum-exp.
//!
//! # Launch contract: `attention_decode_{f16,bf16}_d{D}`
//! - grid `(num_splits, kv_heads, batch)`, block `(DECODE_THREADS, 1, 1)`, dynamic shared
//!   memory [`decode_shared_bytes`]`(D)`.
//! - `q`: sequence `b`'s query heads at `q + b * q_batch_stride`, head `h` at `h * D`; `out`
//!   likewise with `out_batch_stride`. `k`, `v`: sequence `b`, KV head `h`, position `j` at
//!   `b * kv_batch_stride + h * kv_head_stride + j * D`. All 16-byte aligned, strides multiples
//!   of 8. Query head `h` reads KV head `h / group`; `1 <= group <= MAX_GROUP`.
//! - `seqlens_k[b] + 1` keys, clamped to `[0, capacity]`; the query sits at the last one;
//!   `window_left >= 0` keeps keys at most that far left of it.
//! - split `s` covers keys `s * split_len .. (s + 1) * split_len`. With one split the block
//!   writes `out`; otherwise it writes `partial[((b * heads + h) * num_splits + s) * D ..]` (f32,
//!   normalized) and `lse[(b * heads + h) * num_splits + s]` (log2 units, `-inf` for a slice
//!   without keys), and `attention_decode_combine_*` writes `out`.
//!
//! # Launch contract: `attention_decode_combine_{f16,bf16}`
//! - grid `(heads, batch)`, block `(DECODE_THREADS, 1, 1)`, no shared memory; the same `args`.

use crate::device::memory::ld_global_nc_v4;
use crate::device::shared::{dynamic_shared_base, ld_shared_f32, st_shared_f32};
use crate::device::{index, math, sync, warp};
use crate::element::{Bf16, Element, F16};
use crate::unroll;

pub use super::layout::{DECODE_THREADS, DecodeArgs, MAX_GROUP, decode_lanes_per_key, decode_shared_bytes};

const LOG2_E: f32 = core::f32::consts::LOG2_E;
const WARPS: usize = DECODE_THREADS as usize / 32;
/// Keys each lane group loads before it computes on them (memory-level parallelism).
const UNROLL: usize = 4;

#[inline(always)]
fn tanh(x: f32) -> f32 {
    1.0 - 2.0 * math::rcp_approx(math::ex2_approx(2.0 * LOG2_E * x) + 1.0)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn decode<T: Element, const D: usize>(
    q: *const T,
    k: *const T,
    v: *const T,
    out: *mut T,
    partial: *mut f32,
    lse: *mut f32,
    seqlens_k: *const i32,
    p: DecodeArgs,
) {
    const { assert!(D % 8 == 0 && D <= 256) };
    let lanes = decode_lanes_per_key(D);
    let keys_per_warp = 32 / lanes;
    let split = index::block_idx_x() as usize;
    let kvh = index::block_idx_y() as usize;
    let b = index::block_idx_z() as usize;
    let tid = index::thread_idx_x() as usize;
    let (warp_id, lane) = (tid / 32, tid % 32);
    let (slot, part) = (lane / lanes, lane % lanes);
    let cols = part * 8 < D;
    let group = p.group as usize;
    // SAFETY (whole body): the launch contract sizes every buffer; key indices stay below the
    // clamped length; every lane reaches the shuffles and every thread the barrier.
    unsafe {
        let total = (seqlens_k.add(b).read() as i64 + 1).clamp(0, p.capacity as i64) as usize;
        let window_lo = if p.window_left >= 0 { total.saturating_sub(1 + p.window_left as usize) } else { 0 };
        let lo = (split * p.split_len as usize).max(window_lo);
        let hi = ((split + 1) * p.split_len as usize).min(total);
        let capped = p.softcap > 0.0;
        // Scores in log2 units: the scale folds into the queries unless a soft cap needs the
        // scaled score first.
        let q_scale = if capped { p.scale } else { p.scale * LOG2_E };
        let mut qf = [[0.0f32; 8]; MAX_GROUP];
        let q_base = q.add(b * p.q_batch_stride as usize + kvh * group * D + part * 8);
        unroll!(G in [0, 1, 2, 3, 4, 5, 6, 7] {
            if G < group && cols {
                T::unpack_vec(ld_global_nc_v4(q_base.add(G * D).cast()), &mut qf[G]);
                unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] { qf[G][E] *= q_scale; });
            }
        });
        let mut m = [f32::NEG_INFINITY; MAX_GROUP];
        let mut l = [0.0f32; MAX_GROUP];
        let mut acc = [[0.0f32; 8]; MAX_GROUP];
        let kv = b * p.kv_batch_stride as usize + kvh * p.kv_head_stride as usize + part * 8;
        let (k, v) = (k.add(kv), v.add(kv));
        let step = WARPS * keys_per_warp;
        // The warp's first key: warp-uniform, so every lane runs the same iterations (shuffles).
        let mut jw = lo + warp_id * keys_per_warp;
        while jw < hi {
            let j0 = jw + slot;
            let mut kr = [[0u32; 4]; UNROLL];
            let mut vr = [[0u32; 4]; UNROLL];
            unroll!(U in [0, 1, 2, 3] {
                let j = j0 + U * step;
                if j < hi && cols {
                    kr[U] = ld_global_nc_v4(k.add(j * D).cast());
                    vr[U] = ld_global_nc_v4(v.add(j * D).cast());
                }
            });
            unroll!(U in [0, 1, 2, 3] {
                let j = j0 + U * step;
                let mut kf = [0.0f32; 8];
                T::unpack_vec(kr[U], &mut kf);
                let mut s = [0.0f32; MAX_GROUP];
                unroll!(G in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if G < group {
                        let mut dot = 0.0f32;
                        unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] { dot = math::fma(qf[G][E], kf[E], dot); });
                        let mut mask = 1;
                        while mask < lanes as u32 {
                            dot += warp::shfl_xor_f32(dot, mask);
                            mask <<= 1;
                        }
                        s[G] = if capped { p.softcap * LOG2_E * tanh(dot * math::rcp_approx(p.softcap)) } else { dot };
                    }
                });
                if j < hi {
                    let mut vf = [0.0f32; 8];
                    T::unpack_vec(vr[U], &mut vf);
                    unroll!(G in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if G < group {
                            let m_new = m[G].max(s[G]);
                            let corr = math::ex2_approx(m[G] - m_new);
                            let e = math::ex2_approx(s[G] - m_new);
                            l[G] = math::fma(l[G], corr, e);
                            unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                                acc[G][E] = math::fma(acc[G][E], corr, e * vf[E]);
                            });
                            m[G] = m_new;
                        }
                    });
                }
            });
            jw += step * UNROLL;
        }

        // Merge the block's lane groups: each writes its state, then thread t reduces columns.
        let slots = WARPS * keys_per_warp;
        let my_slot = warp_id * keys_per_warp + slot;
        let smem = dynamic_shared_base();
        let ml = |s: usize, g: usize, which: usize| smem.offset((((s * MAX_GROUP + g) * 2 + which) * 4) as u32);
        let accs = smem.offset((slots * MAX_GROUP * 2 * 4) as u32);
        let acc_at = |s: usize, g: usize, d: usize| accs.offset((((s * MAX_GROUP + g) * D + d) * 4) as u32);
        unroll!(G in [0, 1, 2, 3, 4, 5, 6, 7] {
            if G < group {
                if part == 0 {
                    st_shared_f32(ml(my_slot, G, 0), m[G]);
                    st_shared_f32(ml(my_slot, G, 1), l[G]);
                }
                if cols {
                    unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] { st_shared_f32(acc_at(my_slot, G, part * 8 + E), acc[G][E]); });
                }
            }
        });
        sync::sync_threads();
        let heads = p.heads as usize;
        let splits = p.num_splits as usize;
        let mut item = tid;
        while item < group * D {
            let (g, d) = (item / D, item % D);
            let mut mx = f32::NEG_INFINITY;
            for s in 0..slots {
                mx = mx.max(ld_shared_f32(ml(s, g, 0)));
            }
            let (mut sum, mut o) = (0.0f32, 0.0f32);
            if mx != f32::NEG_INFINITY {
                for s in 0..slots {
                    let w = math::ex2_approx(ld_shared_f32(ml(s, g, 0)) - mx);
                    sum = math::fma(ld_shared_f32(ml(s, g, 1)), w, sum);
                    o = math::fma(ld_shared_f32(acc_at(s, g, d)), w, o);
                }
            }
            let h = kvh * group + g;
            let value = if sum > 0.0 { o / sum } else { 0.0 };
            if splits == 1 {
                out.add(b * p.out_batch_stride as usize + h * D + d).write(T::from_f32(value));
            } else {
                let row = (b * heads + h) * splits + split;
                partial.add(row * D + d).write(value);
                if d == 0 {
                    lse.add(row).write(if sum > 0.0 { mx + math::lg2_approx(sum) } else { f32::NEG_INFINITY });
                }
            }
            item += DECODE_THREADS as usize;
        }
    }
}

#[inline(always)]
unsafe fn combine<T: Element>(out: *mut T, partial: *const f32, lse: *const f32, head_dim: usize, p: DecodeArgs) {
    let h = index::block_idx_x() as usize;
    let b = index::block_idx_y() as usize;
    let splits = p.num_splits as usize;
    let row0 = (b * p.heads as usize + h) * splits;
    // SAFETY: the launch contract sizes `partial`, `lse` and `out`.
    unsafe {
        let mut mx = f32::NEG_INFINITY;
        for s in 0..splits {
            mx = mx.max(lse.add(row0 + s).read());
        }
        let mut d = index::thread_idx_x() as usize;
        while d < head_dim {
            let (mut sum, mut o) = (0.0f32, 0.0f32);
            if mx != f32::NEG_INFINITY {
                for s in 0..splits {
                    let w = math::ex2_approx(lse.add(row0 + s).read() - mx);
                    sum += w;
                    o = math::fma(partial.add((row0 + s) * head_dim + d).read(), w, o);
                }
            }
            let value = if sum > 0.0 { o / sum } else { 0.0 };
            out.add(b * p.out_batch_stride as usize + h * head_dim + d).write(T::from_f32(value));
            d += DECODE_THREADS as usize;
        }
    }
}

macro_rules! decode_entries {
    ($ty:ty, $combine:ident, $($name:ident: $d:literal);+ $(;)?) => {
        $(
        /// Split-KV decode attention; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            q: *const $ty, k: *const $ty, v: *const $ty, out: *mut $ty, partial: *mut f32, lse: *mut f32,
            seqlens_k: *const i32, args: DecodeArgs,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { decode::<$ty, $d>(q, k, v, out, partial, lse, seqlens_k, args) }
        }
        )+
        /// The merge of split-KV decode slices; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $combine(
            out: *mut $ty, partial: *const f32, lse: *const f32, head_dim: u32, args: DecodeArgs,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { combine::<$ty>(out, partial, lse, head_dim as usize, args) }
        }
    };
}

decode_entries!(F16, attention_decode_combine_f16,
    attention_decode_f16_d64: 64;
    attention_decode_f16_d80: 80;
    attention_decode_f16_d96: 96;
    attention_decode_f16_d128: 128;
    attention_decode_f16_d256: 256;
);
decode_entries!(Bf16, attention_decode_combine_bf16,
    attention_decode_bf16_d64: 64;
    attention_decode_bf16_d80: 80;
    attention_decode_bf16_d96: 96;
    attention_decode_bf16_d128: 128;
    attention_decode_bf16_d256: 256;
);
