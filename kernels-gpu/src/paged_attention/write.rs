//! The `PagedAttention` op's prologue: per packed query token, find its sequence, apply rotary to
//! its query and key, write its key and value into the cache slot its block table names, and
//! record the sequence and context length the attention kernel then reads per token.
//!
//! # Launch contract: `paged_kv_write_rotary_{f16,bf16}`
//! - grid `(tokens, 1, 1)`, block `(128, 1, 1)`, no dynamic shared memory; one block per token.
//! - `query` rows of `q_stride` elements (`num_heads * D` used), `key`/`value` rows of `kv_stride`
//!   elements (`kv_heads * D` used; for packed QKV they point into the query rows); every row
//!   start 16-byte aligned (`D`, strides and the packed offsets are multiples of 8 elements).
//! - `key_cache`/`value_cache` `[num_blocks, block_size, kv_heads, D]`, 16-byte aligned;
//!   `cu_seqlens` i32 `[batch + 1]`, `past_seqlens` i32 `[batch]`, `block_table` i32
//!   `[batch, max_blocks]`; `cos`/`sin` `[cos_rows, rotary_dim / 2]` or null (`rotary_dim = 0`).
//! - writes `q_out` `[tokens, num_heads, D]` (rotated), `token_seq[t]` (the token's sequence, 0
//!   when unknown) and `token_ctx[t]` (its position + 1, the keys it sees; -1 when invalid).
//! - everything read from device memory is checked before use: `cu_seqlens` must start at 0, never
//!   decrease and end at `tokens` (else every token is invalid, status bit 2); `past_seqlens[b]`
//!   must be >= 0 with `past + new tokens <= max_blocks * block_size` (else bit 2); a position
//!   at or past `cos_rows` with rotary sets bit 4; a block id outside `[0, num_blocks)` sets bit 1
//!   and the token's K/V are not written. Nothing outside the given buffers is written.

use super::layout::{STATUS_BAD_BLOCK, STATUS_BAD_CONTEXT, STATUS_BAD_POSITION, THREADS, WriteDims};
use super::{div, rem};
use crate::device::memory::{ld_global_nc_v4, red_global_or_u32, st_global_v4};
use crate::device::{index, sync};
use crate::element::{Bf16, Element, F16};
use crate::rotary::rotary_pair;

/// `heads` rows of `d` elements from `src` to `dst`, the first `rd` of each head rotated by one
/// position's `cos`/`sin` rows (`rd / 2` each), in f32; the rest copied.
///
/// # Safety
/// `src` and `dst` valid for `heads * d` elements, `cos`/`sin` for `rd / 2` when `rd > 0`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rotate_heads<T: Element>(
    src: *const T,
    dst: *mut T,
    heads: usize,
    d: usize,
    rd: usize,
    interleaved: bool,
    cos: *const T,
    sin: *const T,
    tid: usize,
) {
    let pairs = rd / 2;
    // SAFETY: indices stay below `heads * d` (pairs within `rd <= d`, the tail within `d`).
    unsafe {
        let mut i = tid;
        while i < heads * pairs {
            let (h, pp) = (div(i, pairs as u32), rem(i, pairs as u32));
            let (a, b) = rotary_pair(pp, rd, interleaved);
            let (x, y) = (src.add(h * d + a).read().to_f32(), src.add(h * d + b).read().to_f32());
            let (c, s) = (cos.add(pp).read().to_f32(), sin.add(pp).read().to_f32());
            dst.add(h * d + a).write(T::from_f32(x * c - y * s));
            dst.add(h * d + b).write(T::from_f32(y * c + x * s));
            i += THREADS as usize;
        }
        let tail = d - rd;
        let mut i = tid;
        while i < heads * tail {
            let e = h_elem(i, tail, rd, d);
            dst.add(e).write(src.add(e).read());
            i += THREADS as usize;
        }
    }
}

/// Element index of tail item `i` (head `i / tail`, element `rd + i % tail`).
#[inline(always)]
fn h_elem(i: usize, tail: usize, rd: usize, d: usize) -> usize {
    div(i, tail as u32) * d + rd + rem(i, tail as u32)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn write_rotary<T: Element>(
    query: *const T,
    key: *const T,
    value: *const T,
    key_cache: *mut T,
    value_cache: *mut T,
    cu_seqlens: *const i32,
    past_seqlens: *const i32,
    block_table: *const i32,
    cos: *const T,
    sin: *const T,
    q_out: *mut T,
    token_seq: *mut i32,
    token_ctx: *mut i32,
    status: *mut u32,
    p: WriteDims,
) {
    let t = index::block_idx_x() as usize;
    let tid = index::thread_idx_x() as usize;
    let batch = p.batch as usize;
    let flag = |bit: u32| {
        if tid == 0 {
            // SAFETY: status is a valid word by contract.
            unsafe { red_global_or_u32(status, bit) };
        }
    };
    // SAFETY (whole body): the launch contract sizes every buffer; each index read from device
    // memory is range-checked before it addresses anything. The one barrier is reached by every
    // thread (no return before it).
    unsafe {
        // The cumulative lengths, checked by the whole block at once (a binary search over an
        // unchecked array could run past it).
        let mut bad = false;
        let mut i = tid;
        while i < batch {
            bad |= cu_seqlens.add(i).read() > cu_seqlens.add(i + 1).read();
            i += THREADS as usize;
        }
        if tid == 0 {
            bad |= cu_seqlens.read() != 0 || cu_seqlens.add(batch).read() != p.tokens as i32;
        }
        let bad_cu = sync::sync_threads_or(bad);

        let (mut seq, mut ctx, mut pos, mut slot) = (0usize, -1i32, 0usize, None);
        if bad_cu || batch == 0 {
            flag(STATUS_BAD_CONTEXT);
        } else {
            // The last sequence starting at or before t: cu is non-decreasing from 0 to
            // tokens > t, so it exists and ends after t (empty sequences are skipped over).
            let (mut lo, mut hi) = (0usize, batch - 1);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if cu_seqlens.add(mid).read() as usize <= t {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            seq = lo;
            let first = cu_seqlens.add(seq).read();
            let new = cu_seqlens.add(seq + 1).read() as i64 - first as i64;
            let past = past_seqlens.add(seq).read();
            let capacity = p.max_blocks as i64 * p.block_size as i64;
            if past < 0 || past as i64 + new > capacity {
                flag(STATUS_BAD_CONTEXT);
            } else {
                pos = past as usize + (t - first as usize);
                if p.rotary_dim > 0 && pos >= p.cos_rows as usize {
                    flag(STATUS_BAD_POSITION);
                } else {
                    ctx = pos as i32 + 1;
                    let (blk, off) = (div(pos, p.block_size), rem(pos, p.block_size));
                    let entry = block_table.add(seq * p.max_blocks as usize + blk).read();
                    if entry < 0 || entry as u32 >= p.num_blocks {
                        flag(STATUS_BAD_BLOCK);
                    } else {
                        slot = Some(entry as usize * p.block_size as usize + off);
                    }
                }
            }
        }
        if tid == 0 {
            token_seq.add(t).write(seq as i32);
            token_ctx.add(t).write(ctx);
        }

        let (nh, kvh, d) = (p.num_heads as usize, p.kv_heads as usize, p.head_size as usize);
        // A token whose position is unknown is copied unrotated: its output is NaN anyway.
        let rd = if ctx > 0 { p.rotary_dim as usize } else { 0 };
        let half = p.rotary_dim as usize / 2;
        let (cos_row, sin_row) = if rd > 0 { (cos.add(pos * half), sin.add(pos * half)) } else { (cos, sin) };
        let interleaved = p.interleaved != 0;
        let q_src = query.add(t * p.q_stride as usize);
        rotate_heads(q_src, q_out.add(t * nh * d), nh, d, rd, interleaved, cos_row, sin_row, tid);
        if let Some(slot) = slot {
            let row = kvh * d;
            let k_src = key.add(t * p.kv_stride as usize);
            rotate_heads(k_src, key_cache.add(slot * row), kvh, d, rd, interleaved, cos_row, sin_row, tid);
            let v_src = value.add(t * p.kv_stride as usize);
            let dst = value_cache.add(slot * row);
            let mut v = tid;
            while v < row / T::PER_VEC {
                let o = v * T::PER_VEC;
                st_global_v4(dst.add(o).cast(), ld_global_nc_v4(v_src.add(o).cast()));
                v += THREADS as usize;
            }
        }
    }
}

macro_rules! write_rotary_entry {
    ($name:ident, $ty:ty) => {
        /// The op's prologue; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            query: *const $ty,
            key: *const $ty,
            value: *const $ty,
            key_cache: *mut $ty,
            value_cache: *mut $ty,
            cu_seqlens: *const i32,
            past_seqlens: *const i32,
            block_table: *const i32,
            cos: *const $ty,
            sin: *const $ty,
            q_out: *mut $ty,
            token_seq: *mut i32,
            token_ctx: *mut i32,
            status: *mut u32,
            dims: WriteDims,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe {
                write_rotary::<$ty>(
                    query,
                    key,
                    value,
                    key_cache,
                    value_cache,
                    cu_seqlens,
                    past_seqlens,
                    block_table,
                    cos,
                    sin,
                    q_out,
                    token_seq,
                    token_ctx,
                    status,
                    dims,
                )
            }
        }
    };
}

write_rotary_entry!(paged_kv_write_rotary_f16, F16);
write_rotary_entry!(paged_kv_write_rotary_bf16, Bf16);
