//! PagedAttention decode: attention of a few new query tokens per sequence over a KV cache kept
//! in fixed-size blocks (ONNX Runtime `PagedAttention` layout), split across thread blocks along
//! the context and merged with a log-sum-exp reduction; and the cache write.
//!
//! Layouts (row-major, 16-byte aligned):
//! - `q`, `out`: `[batch, q_len, num_q_heads, D]`; `key_cache`, `value_cache`:
//!   `[num_blocks, block_size, num_kv_heads, D]`; `block_tables`: i32 `[batch, max_blocks]`;
//!   `context_lens`: i32 `[batch]`, counting the `q_len` new tokens, which are the last ones.
//! - Query token `t` of sequence `b` sits at position `context_len - q_len + t` and sees cache
//!   positions up to its own (causal), the last `window` of them when `window > 0`.
//! - `alibi`: f32 `[num_q_heads]` slopes or null; `softcap > 0` applies `cap * tanh(s / cap)`.
//!
//! # Launch contract: `paged_attention_{f16,bf16}_d{D}`
//! - grid `(num_partitions, num_kv_heads, batch)`, block `(128, 1, 1)`.
//! - dynamic shared memory `4 * (2 * R * D + R * partition + 2 * R)` bytes, `R = group * q_len`
//!   (the query heads sharing one KV head times the query tokens), `R <= 64`.
//! - each block covers cache positions `[part * partition, (part + 1) * partition)` for the `R`
//!   query rows of its KV head, so each K/V row is read once for all of them (GQA sharing).
//! - `num_partitions == 1`: writes `out`. Otherwise writes unnormalised partial sums to
//!   `partial` (`[batch, kv_heads, num_partitions, R, D]` f32, then `[.., R, 2]` f32 max/sum)
//!   for `paged_attention_combine_*`.
//! - a block id outside `[0, num_blocks)` or a context length outside `[q_len, max_blocks *
//!   block_size]` (or above `max_context`) is never dereferenced: the kernel
//!   ORs a bit into `*status` (1: bad block id, 2: bad context length) and writes NaN for the
//!   affected sequence.
//!
//! # Launch contract: `paged_attention_combine_{f16,bf16}_d{D}`
//! - grid `(num_q_heads, q_len, batch)`, block `(128, 1, 1)`, no dynamic shared memory; reads
//!   what the partition kernel wrote for the same arguments.
//!
//! # Launch contract: `paged_kv_write_{f16,bf16}`
//! - grid `(num_tokens, 1, 1)`, block `(128, 1, 1)`; `key`/`value` `[num_tokens, kv_heads, D]`
//!   into slot `slot_mapping[i]` (i32; `block * block_size + offset`; negative: skip). A slot
//!   beyond the cache sets bit 1 of `*status` and writes nothing.

use crate::device::memory::{ld_global_nc_v4, red_global_or_u32, st_global_v4};
use crate::device::shared::{dynamic_shared_base, ld_shared_f32, red_shared_add_f32, st_shared_f32};
use crate::device::{SharedAddr, index, math, sync, warp};
use crate::element::{Bf16, Element, F16};
use crate::unroll;

const THREADS: u32 = 128;
const WARPS: u32 = THREADS / 32;
/// Query rows accumulated per pass over V (registers: 4 rows x 8 dims per thread).
const ROWS_PER_PASS: usize = 4;
/// Tokens each group loads before using them, to keep loads in flight. The `unroll!` lists
/// below spell out `0..UNROLL`.
const UNROLL: usize = 4;
const LOG2_E: f32 = core::f32::consts::LOG2_E;

pub const STATUS_BAD_BLOCK: u32 = 1;
pub const STATUS_BAD_CONTEXT: u32 = 2;

/// `a / b` without a division-by-zero panic path (the host guarantees `b > 0`; a zero divisor
/// divides by one instead of trapping).
#[inline(always)]
fn div(a: usize, b: u32) -> usize {
    a / core::num::NonZeroUsize::new(b as usize).unwrap_or(core::num::NonZeroUsize::MIN)
}

/// `a % b`, as [`div`].
#[inline(always)]
fn rem(a: usize, b: u32) -> usize {
    a % core::num::NonZeroUsize::new(b as usize).unwrap_or(core::num::NonZeroUsize::MIN)
}

/// tanh through `ex2.approx` (relative error ~2^-22 on the exponential; `tanh.approx.f32`'s
/// 2^-11 would move soft-capped logits by up to cap * 4e-4).
#[inline(always)]
fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (math::ex2_approx(2.0 * LOG2_E * x) + 1.0)
}

/// Lanes that share one K/V row: the row's 16-byte chunks, rounded up to a power of two.
const fn group_size(d: usize) -> u32 {
    let chunks = (d / 8) as u32;
    let mut g = 1;
    while g < chunks {
        g *= 2;
    }
    g
}

/// Sum over the `size` lanes of an aligned lane group (butterfly within the group).
///
/// # Safety
/// All 32 lanes of the warp must call it with the same `size`.
#[inline(always)]
unsafe fn group_sum(mut v: f32, size: u32) -> f32 {
    let mut mask = size / 2;
    while mask > 0 {
        // SAFETY: forwarded contract.
        v += unsafe { warp::shfl_xor_f32(v, mask) };
        mask /= 2;
    }
    v
}

/// Scalar arguments shared by the partition and combine kernels.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Dims {
    pub num_blocks: u32,
    pub block_size: u32,
    pub kv_heads: u32,
    /// Query heads per KV head.
    pub group: u32,
    pub q_len: u32,
    pub max_blocks: u32,
    pub partition: u32,
    pub num_partitions: u32,
    /// Sliding window in tokens, 0 for none.
    pub window: u32,
    /// The caller's bound on context lengths; longer ones are errors.
    pub max_context: u32,
    pub scale: f32,
    /// Logit soft cap, 0 for none.
    pub softcap: f32,
}

/// The context length of sequence `b` if valid, else `None` (status already flagged).
#[inline(always)]
unsafe fn context_len(context_lens: *const i32, b: usize, p: &Dims, status: *mut u32, flag: bool) -> Option<u32> {
    // SAFETY: the launch contract sizes context_lens as [batch].
    let ctx = unsafe { context_lens.add(b).read() };
    let limit = (p.max_blocks * p.block_size).min(p.max_context);
    if ctx < p.q_len as i32 || ctx as u32 > limit {
        if flag {
            // SAFETY: status is a valid word by contract.
            unsafe { red_global_or_u32(status, STATUS_BAD_CONTEXT) };
        }
        None
    } else {
        Some(ctx as u32)
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_partition<T: Element, const D: usize>(
    q: *const T,
    key_cache: *const T,
    value_cache: *const T,
    block_tables: *const i32,
    context_lens: *const i32,
    alibi: *const f32,
    out: *mut T,
    partial: *mut f32,
    status: *mut u32,
    p: Dims,
) {
    let part = index::block_idx_x();
    let h = index::block_idx_y() as usize;
    let b = index::block_idx_z() as usize;
    let tid = index::thread_idx_x();
    let gs = group_size(D);
    let groups = THREADS / gs;
    let lane = tid % gs;
    let group_id = tid / gs;
    let chunks = (D / 8) as u32;
    let rows = (p.group * p.q_len) as usize;
    let psize = p.partition as usize;
    let hq_total = (p.kv_heads * p.group) as usize;

    // Shared memory: q (pre-scaled) [R][D] | scores [R][P] | acc [R][D] | max/sum [R][2] | spare.
    let base = dynamic_shared_base();
    let q_s = base;
    let scores = q_s.offset((rows * D * 4) as u32);
    let acc_s = scores.offset((rows * psize * 4) as u32);
    let ml_s = acc_s.offset((rows * D * 4) as u32);
    let at = |region: SharedAddr, i: usize| region.offset((i * 4) as u32);

    // SAFETY (whole body): the launch contract sizes every buffer and the shared memory; the
    // loops below keep each warp's trip counts uniform, so the shuffles and barriers are
    // reached by all lanes/threads.
    unsafe {
        let ctx = context_len(context_lens, b, &p, status, part == 0 && h == 0 && tid == 0);
        let ctx_or_zero = ctx.unwrap_or(0);
        let start = part * p.partition;
        let n = ctx_or_zero.saturating_sub(start).min(p.partition) as usize;
        if ctx.is_some() && n == 0 {
            return; // partition past the end of this sequence: the combine skips it
        }

        // Queries of the group, scaled, and the accumulator zeroed.
        let mut i = tid as usize;
        while i < rows * D {
            let (r, d) = (i / D, i % D);
            let (t, g) = (div(r, p.group), rem(r, p.group));
            let hq = h * p.group as usize + g;
            let v = q.add(((b * p.q_len as usize + t) * hq_total + hq) * D + d).read().to_f32();
            st_shared_f32(at(q_s, i), v * p.scale);
            st_shared_f32(at(acc_s, i), 0.0);
            i += THREADS as usize;
        }
        sync::sync_threads();

        // Where a partition-relative token lives in the cache, if its block id is valid.
        let slot_of = |i: usize| -> Option<usize> {
            let pos = start as usize + i;
            let entry = block_tables.add(b * p.max_blocks as usize + div(pos, p.block_size)).read();
            if entry < 0 || entry as u32 >= p.num_blocks {
                red_global_or_u32(status, STATUS_BAD_BLOCK);
                return None;
            }
            Some(((entry as usize * p.block_size as usize + rem(pos, p.block_size)) * p.kv_heads as usize + h) * D)
        };

        // Pass 1: scores. Each group of `gs` lanes takes one token, each lane one 16-byte chunk.
        let mut poisoned = false;
        let mut base_i = 0usize;
        while base_i < n {
            let mut k_chunks = [[0u32; 4]; UNROLL];
            let mut slots = [None; UNROLL];
            // All UNROLL loads are issued before any is used.
            unroll!(U in [0, 1, 2, 3] {
                let i = base_i + (U * groups as usize) + group_id as usize;
                if i < n {
                    slots[U] = slot_of(i);
                    if let Some(s) = slots[U]
                        && lane < chunks
                    {
                        k_chunks[U] = ld_global_nc_v4(key_cache.add(s + lane as usize * 8).cast());
                    }
                }
            });
            let mut k = [[0.0f32; 8]; UNROLL];
            unroll!(U in [0, 1, 2, 3] {
                T::unpack_vec(k_chunks[U], &mut k[U]);
                poisoned |= base_i + (U * groups as usize) + (group_id as usize) < n && slots[U].is_none();
            });
            for r in 0..rows {
                // This lane's 8 query values of row r, reused for all UNROLL tokens.
                let mut qv = [0.0f32; 8];
                if lane < chunks {
                    for (j, qj) in qv.iter_mut().enumerate() {
                        *qj = ld_shared_f32(at(q_s, r * D + lane as usize * 8 + j));
                    }
                }
                let t = div(r, p.group);
                let hq = h * p.group as usize + rem(r, p.group);
                let qpos = ctx_or_zero.wrapping_sub(p.q_len) + t as u32;
                unroll!(U in [0, 1, 2, 3] {
                    let i = base_i + (U * groups as usize) + group_id as usize;
                    let mut dot = 0.0f32;
                    for j in 0..8 {
                        dot = math::fma(qv[j], k[U][j], dot);
                    }
                    let dot = group_sum(dot, gs);
                    if lane == 0 && i < n {
                        let pos = start + i as u32;
                        let mut s = dot;
                        if p.softcap > 0.0 {
                            s = p.softcap * tanh(s / p.softcap);
                        }
                        if !alibi.is_null() {
                            s += alibi.add(hq).read() * (pos as f32 - qpos as f32);
                        }
                        let visible = pos <= qpos && (p.window == 0 || pos + p.window > qpos);
                        s = if slots[U].is_none() {
                            f32::NAN
                        } else if visible {
                            s * LOG2_E
                        } else {
                            f32::NEG_INFINITY
                        };
                        st_shared_f32(at(scores, r * psize + i), s);
                    }
                });
            }
            base_i += UNROLL * groups as usize;
        }
        sync::sync_threads();

        // Pass 2: softmax numerators in place, per row (one warp per row, round robin).
        let warp_id = tid / 32;
        let wl = index::lane_id() as usize;
        let mut r = warp_id as usize;
        while r < rows {
            let mut m = f32::NEG_INFINITY;
            let mut i = wl;
            while i < n {
                m = m.max(ld_shared_f32(at(scores, r * psize + i)));
                i += 32;
            }
            let m = warp::warp_max_f32(m);
            let mut l = 0.0f32;
            let mut i = wl;
            while i < n {
                let s = ld_shared_f32(at(scores, r * psize + i));
                let e = if m == f32::NEG_INFINITY { 0.0 } else { math::ex2_approx(s - m) };
                st_shared_f32(at(scores, r * psize + i), e);
                l += e;
                i += 32;
            }
            let l = warp::warp_sum_f32(l);
            if wl == 0 {
                st_shared_f32(at(ml_s, 2 * r), m);
                st_shared_f32(at(ml_s, 2 * r + 1), l);
            }
            r += WARPS as usize;
        }
        sync::sync_threads();

        // Pass 3: probabilities times V, up to ROWS_PER_PASS rows per sweep over V.
        let mut r0 = 0usize;
        while r0 < rows {
            let row_count = (rows - r0).min(ROWS_PER_PASS);
            let mut acc = [[0.0f32; 8]; ROWS_PER_PASS];
            let mut base_i = 0usize;
            while base_i < n {
                let mut v_chunks = [[0u32; 4]; UNROLL];
                unroll!(U in [0, 1, 2, 3] {
                    let i = base_i + (U * groups as usize) + group_id as usize;
                    if i < n
                        && lane < chunks
                        && let Some(s) = slot_of(i)
                    {
                        v_chunks[U] = ld_global_nc_v4(value_cache.add(s + lane as usize * 8).cast());
                    }
                });
                let mut v = [[0.0f32; 8]; UNROLL];
                unroll!(U in [0, 1, 2, 3] {
                    T::unpack_vec(v_chunks[U], &mut v[U]);
                });
                // One call per row with a constant row index keeps `acc` in registers.
                let first = base_i + group_id as usize;
                let step = groups as usize;
                if lane < chunks {
                    accumulate_row::<0>(&mut acc, &v, scores, psize, r0, row_count, first, step, n);
                    accumulate_row::<1>(&mut acc, &v, scores, psize, r0, row_count, first, step, n);
                    accumulate_row::<2>(&mut acc, &v, scores, psize, r0, row_count, first, step, n);
                    accumulate_row::<3>(&mut acc, &v, scores, psize, r0, row_count, first, step, n);
                }
                base_i += UNROLL * groups as usize;
            }
            if lane < chunks {
                for (rr, acc_row) in acc.iter().enumerate() {
                    if rr < row_count {
                        for (j, a) in acc_row.iter().enumerate() {
                            red_shared_add_f32(at(acc_s, (r0 + rr) * D + lane as usize * 8 + j), *a);
                        }
                    }
                }
            }
            r0 += ROWS_PER_PASS;
        }
        sync::sync_threads();

        // A poisoned row (bad block id) or sequence (bad length) reads as NaN downstream.
        let bad = ctx.is_none() || sync::sync_threads_or(poisoned);
        let np = p.num_partitions as usize;
        let mut i = tid as usize;
        while i < rows * D {
            let (r, d) = (i / D, i % D);
            let l = ld_shared_f32(at(ml_s, 2 * r + 1));
            let sum = ld_shared_f32(at(acc_s, i));
            if np == 1 {
                let (t, g) = (div(r, p.group), rem(r, p.group));
                let hq = h * p.group as usize + g;
                let value = if bad {
                    f32::NAN
                } else if l > 0.0 {
                    sum / l
                } else {
                    0.0
                };
                out.add(((b * p.q_len as usize + t) * hq_total + hq) * D + d).write(T::from_f32(value));
            } else {
                let slot = ((b * p.kv_heads as usize + h) * np + part as usize) * rows + r;
                partial.add(slot * D + d).write(if bad { f32::NAN } else { sum });
                if d == 0 {
                    let ml = partial.add(rows_total(&p, rows) * D + slot * 2);
                    ml.write(if bad { f32::NAN } else { ld_shared_f32(at(ml_s, 2 * r)) });
                    ml.add(1).write(l);
                }
            }
            i += THREADS as usize;
        }
    }
}

/// `acc[RR] += p[r0 + RR][token] * v[token]` for this thread's UNROLL tokens.
///
/// # Safety
/// `scores` must hold `(r0 + row_count) * psize` f32 written before the last barrier.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn accumulate_row<const RR: usize>(
    acc: &mut [[f32; 8]; ROWS_PER_PASS],
    v: &[[f32; 8]; UNROLL],
    scores: SharedAddr,
    psize: usize,
    r0: usize,
    row_count: usize,
    first: usize,
    step: usize,
    n: usize,
) {
    if RR >= row_count {
        return;
    }
    unroll!(U in [0, 1, 2, 3] {
        let i = first + U * step;
        if i < n {
            // SAFETY: the caller guarantees the scores region.
            let w = unsafe { ld_shared_f32(scores.offset((((r0 + RR) * psize + i) * 4) as u32)) };
            for j in 0..8 {
                acc[RR][j] = math::fma(w, v[U][j], acc[RR][j]);
            }
        }
    });
}

/// Rows of partial results in the whole workspace (the offset of the max/sum section).
#[inline(always)]
fn rows_total(p: &Dims, rows: usize) -> usize {
    index::grid_dim_z() as usize * p.kv_heads as usize * p.num_partitions as usize * rows
}

#[inline(always)]
unsafe fn combine<T: Element, const D: usize>(
    context_lens: *const i32,
    out: *mut T,
    partial: *const f32,
    status: *mut u32,
    p: Dims,
) {
    let hq = index::block_idx_x() as usize;
    let t = index::block_idx_y() as usize;
    let b = index::block_idx_z() as usize;
    let tid = index::thread_idx_x() as usize;
    let hq_total = (p.kv_heads * p.group) as usize;
    let rows = (p.group * p.q_len) as usize;
    let (h, g) = (div(hq, p.group), rem(hq, p.group));
    let r = t * p.group as usize + g;
    let np = p.num_partitions as usize;
    let batch = index::grid_dim_z() as usize;
    // SAFETY: the launch contract sizes every buffer; reads only partitions the partition
    // kernel wrote for this sequence.
    unsafe {
        let o = out.add(((b * p.q_len as usize + t) * hq_total + hq) * D);
        let Some(ctx) = context_len(context_lens, b, &p, status, false) else {
            let mut d = tid;
            while d < D {
                o.add(d).write(T::from_f32(f32::NAN));
                d += THREADS as usize;
            }
            return;
        };
        let parts = div(ctx as usize + p.partition as usize - 1, p.partition);
        let ml = partial.add(batch * p.kv_heads as usize * np * rows * D);
        let slot = |part: usize| ((b * p.kv_heads as usize + h) * np + part) * rows + r;
        let mut m = f32::NEG_INFINITY;
        for part in 0..parts {
            m = m.max(ml.add(slot(part) * 2).read());
        }
        let mut l = 0.0f32;
        let mut d = tid;
        let mut first = true;
        while d < D {
            let mut sum = 0.0f32;
            for part in 0..parts {
                let mp = ml.add(slot(part) * 2).read();
                let w = if mp == f32::NEG_INFINITY { 0.0 } else { math::ex2_approx(mp - m) };
                sum = math::fma(w, partial.add(slot(part) * D + d).read(), sum);
                if first {
                    l = math::fma(w, ml.add(slot(part) * 2 + 1).read(), l);
                }
            }
            first = false;
            // A poisoned partition (NaN max, sum or weight) makes the row NaN: f32::max above
            // skips NaN, but the weighted sums do not.
            let value = if l == 0.0 { 0.0 } else { sum / l };
            o.add(d).write(T::from_f32(value));
            d += THREADS as usize;
        }
    }
}

#[inline(always)]
unsafe fn kv_write<T: Element>(
    key: *const T,
    value: *const T,
    key_cache: *mut T,
    value_cache: *mut T,
    slot_mapping: *const i32,
    status: *mut u32,
    num_slots: u32,
    row_elems: u32,
) {
    let token = index::block_idx_x() as usize;
    let tid = index::thread_idx_x() as usize;
    // SAFETY: the launch contract sizes the buffers; the slot is checked before any write.
    unsafe {
        let slot = slot_mapping.add(token).read();
        if slot < 0 {
            return;
        }
        if slot as u32 >= num_slots {
            if tid == 0 {
                red_global_or_u32(status, STATUS_BAD_BLOCK);
            }
            return;
        }
        let vecs = row_elems as usize / T::PER_VEC;
        let src = token * row_elems as usize;
        let dst = slot as usize * row_elems as usize;
        let mut v = tid;
        while v < vecs {
            let o = v * T::PER_VEC;
            st_global_v4(key_cache.add(dst + o).cast(), ld_global_nc_v4(key.add(src + o).cast()));
            st_global_v4(value_cache.add(dst + o).cast(), ld_global_nc_v4(value.add(src + o).cast()));
            v += THREADS as usize;
        }
    }
}

macro_rules! attention_entries {
    ($ty:ty, $($attn:ident, $comb:ident, $d:literal);+ $(;)?) => {$(
        /// Partition kernel; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $attn(
            q: *const $ty, key_cache: *const $ty, value_cache: *const $ty, block_tables: *const i32,
            context_lens: *const i32, alibi: *const f32, out: *mut $ty, partial: *mut f32, status: *mut u32, dims: Dims,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { attention_partition::<$ty, $d>(q, key_cache, value_cache, block_tables, context_lens, alibi, out, partial, status, dims) }
        }

        /// Combine kernel; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $comb(
            context_lens: *const i32, out: *mut $ty, partial: *const f32, status: *mut u32, dims: Dims,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { combine::<$ty, $d>(context_lens, out, partial, status, dims) }
        }
    )+};
}

attention_entries!(F16,
    paged_attention_f16_d64, paged_attention_combine_f16_d64, 64;
    paged_attention_f16_d80, paged_attention_combine_f16_d80, 80;
    paged_attention_f16_d96, paged_attention_combine_f16_d96, 96;
    paged_attention_f16_d128, paged_attention_combine_f16_d128, 128;
    paged_attention_f16_d256, paged_attention_combine_f16_d256, 256;
);
attention_entries!(Bf16,
    paged_attention_bf16_d64, paged_attention_combine_bf16_d64, 64;
    paged_attention_bf16_d80, paged_attention_combine_bf16_d80, 80;
    paged_attention_bf16_d96, paged_attention_combine_bf16_d96, 96;
    paged_attention_bf16_d128, paged_attention_combine_bf16_d128, 128;
    paged_attention_bf16_d256, paged_attention_combine_bf16_d256, 256;
);

macro_rules! kv_write_entry {
    ($name:ident, $ty:ty) => {
        /// Cache write; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            key: *const $ty,
            value: *const $ty,
            key_cache: *mut $ty,
            value_cache: *mut $ty,
            slot_mapping: *const i32,
            status: *mut u32,
            num_slots: u32,
            row_elems: u32,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { kv_write::<$ty>(key, value, key_cache, value_cache, slot_mapping, status, num_slots, row_elems) }
        }
    };
}

kv_write_entry!(paged_kv_write_f16, F16);
kv_write_entry!(paged_kv_write_bf16, Bf16);
