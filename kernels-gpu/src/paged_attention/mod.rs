//! PagedAttention decode: attention of a few new query tokens per sequence over a KV cache kept
//! in fixed-size blocks (ONNX Runtime `PagedAttention` layout), split across thread blocks along
//! the context and merged with a log-sum-exp reduction; and the cache write.
//!
//! Layouts (row-major, 16-byte aligned):
//! - `q`: `[batch, q_len, num_q_heads, D]` with `q_token_stride` elements between tokens (the
//!   leading heads of a packed QKV row allowed); `out`: `[batch, q_len, num_q_heads, D]`;
//!   `key_cache`, `value_cache`:
//!   `[num_blocks, block_size, num_kv_heads, D]`; `block_tables`: i32 `[batch, max_blocks]`;
//!   `context_lens`: i32 `[batch]`, counting the `q_len` new tokens, which are the last ones.
//! - Query token `t` of sequence `b` sits at position `context_len - q_len + t` and sees cache
//!   positions up to its own (causal), the last `window` of them when `window > 0`.
//! - `alibi`: f32 `[num_q_heads]` slopes or null; `softcap > 0` applies `cap * tanh(s / cap)`.
//! - `seq_map`: null, or i32 `[batch]` naming the block-table row of each "sequence" `b`
//!   (`PagedAttention`'s per-token launch: every packed query token is its own sequence of
//!   `q_len = 1` whose context ends at its own position, so causal masking among a prompt's new
//!   tokens falls out of the context lengths); a row outside `[0, table_rows)` is treated as a bad
//!   context length and none of its blocks is read.
//!
//! # Launch contract: `paged_attention_{f16,bf16}_d{D}`
//! - grid `(num_partitions, num_kv_heads * m_tiles * split(D), batch)`, block `(128, 1, 1)`,
//!   dynamic shared memory [`shared_bytes`]`(D)`; `m_tiles = ceil(R / 16)`, `R = group * q_len` (the query heads
//!   sharing one KV head times the query tokens), `R <= 64`.
//! - each block covers cache positions `[part * partition, (part + 1) * partition)` for 16
//!   query rows of its KV head, so each K/V row is read once for all of them (GQA sharing).
//!   Its four warps take 16-token steps in turn: scores `Q K^T` and `P V` on tensor cores
//!   (`mma.sync` m16n8k16, f32 accumulation, P rounded to the input type), online softmax in
//!   registers, K and V loaded from global memory straight into `mma` fragments.
//! - `num_partitions == 1`: writes `out`. Otherwise writes unnormalised partial sums to
//!   `partial` (`[batch, kv_heads, num_partitions, R, D]` f32, then `[.., R, 2]` f32 max/sum,
//!   the max in log2 units) for `paged_attention_combine_*`; or, where `arrivals` is not null
//!   (u32 `[batch, kv_heads, m_tiles]`, zero when the grid starts), the last block to finish
//!   each (sequence, KV head, row tile) merges its partitions into `out` itself, and no combine
//!   kernel follows. The counters are zero again when the kernel ends.
//! - `fresh` ([`NewToken`], GroupQueryAttention's decode step; `q_len` 1, a BNSH cache): with a
//!   non-null `fresh.key` the queries are rotated as they are read, and the token at position
//!   `context_len - 1` is the step's new one: the blocks whose partition holds it rotate its key
//!   from `fresh.key` and take its value from `fresh.value`, and the block of row tile 0 and
//!   column half 0 writes both into the caches, which no block of the launch reads at that
//!   position (so the caches stay read-only to every other load). The inputs must be
//!   16-byte aligned at every head and the rotated part split into 8-element units.
//! - a block id outside `[0, num_blocks)` or a context length outside `[q_len, max_blocks *
//!   block_size]` (or above `max_context`) is never dereferenced: the kernel
//!   ORs a bit into `*status` (1: bad block id, 2: bad context length) and writes NaN for the
//!   affected sequence.
//!
//! # Launch contract: `paged_attention_combine_{f16,bf16}_d{D}`
//! - grid `(num_q_heads, q_len, batch)`, block `(128, 1, 1)`, no dynamic shared memory (4 KB
//!   static); reads
//!   what the partition kernel wrote for the same arguments.
//!
//! # Programmatic dependent launches (both kernels above)
//! - every thread waits for the grid before it in the stream (`griddepcontrol.wait`) before it
//!   reads or writes anything, then lets the next grid start (`griddepcontrol.launch_dependents`):
//!   either may be launched as a programmatic dependent (Hopper's module), so the partition
//!   kernel's blocks are resident when the rotary and append kernel before it ends, and the
//!   combine kernel's (and the next op's prologue, such as the output projection's first
//!   weights) when the partition kernel's last blocks run.
//!
//! # Launch contract: `paged_kv_write_{f16,bf16}`
//! - grid `(num_tokens, 1, 1)`, block `(128, 1, 1)`; `key`/`value` `[num_tokens, kv_heads, D]`
//!   into slot `slot_mapping[i]` (i32; `block * block_size + offset`; negative: skip). A slot
//!   beyond the cache sets bit 1 of `*status` and writes nothing.

pub mod layout;
pub mod write;

use crate::attention::rotary::Turn;
use crate::device::ldmatrix::ldmatrix_x4;
use crate::device::memory::{ld_global_cg_v2, ld_global_cg_v4, ld_global_nc_v4, red_global_or_u32, st_global_v4};
use crate::device::shared::{
    dynamic_shared_base, ld_shared_f32, ld_shared_v4, st_shared_f32, st_shared_u32, st_shared_v4,
};
use crate::device::{SharedAddr, index, math, sync, warp};
use crate::element::{Bf16, Element, F16, TensorElement};
use crate::{shared_array, unroll};

pub use layout::*;

/// Tokens per warp step: the K (reduction) size of the P x V `mma`, two N tiles of Q x K^T.
const TOKENS: usize = 16;
const LOG2_E: f32 = core::f32::consts::LOG2_E;

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

/// `(n / d, n % d)` for `n < 2^31` by multiply-high with the host's `magic`/`shift` for `d`
/// (round-up method; a hardware division per token would cost more than the token's math).
#[inline(always)]
fn divmod(n: u32, d: u32, magic: u32, shift: u32) -> (u32, u32) {
    let hi = ((n as u64 * magic as u64) >> 32) as u32;
    let q = (hi + n).wrapping_shr(shift);
    (q, n - q * d)
}

/// tanh through `ex2.approx` (relative error ~2^-22 on the exponential; `tanh.approx.f32`'s
/// 2^-11 would move soft-capped logits by up to cap * 4e-4).
#[inline(always)]
fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (math::ex2_approx(2.0 * LOG2_E * x) + 1.0)
}

/// The high halves of two words as one pair (`x` low), and the low halves.
#[inline(always)]
fn pair_hi(x: u32, y: u32) -> u32 {
    (x >> 16) | (y & 0xFFFF_0000)
}
#[inline(always)]
fn pair_lo(x: u32, y: u32) -> u32 {
    (x & 0xFFFF) | (y << 16)
}

/// The context length of sequence `b` if valid, else `None` (status already flagged).
#[inline(always)]
unsafe fn context_len(context_lens: *const i32, b: usize, p: &Dims, status: *mut u32, flag: bool) -> Option<u32> {
    // SAFETY: the launch contract sizes context_lens as [batch].
    let ctx = unsafe { context_lens.add(b).read() }.saturating_add(p.context_bias as i32);
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

/// The head-dimension position of query column `kk` of `mma` step `step`.
///
/// K rows are loaded as 16-byte chunks straight into `mma` B fragments: lane `(g, q)` holds
/// chunk `4 * (step / 2) + q` of its token, whose words `2 * (step % 2)` and `+1` are its B
/// registers. The dot product does not care about order, so the queries are stored in the
/// matching (permuted) order instead of shuffling K.
#[inline(always)]
const fn q_column(step: usize, kk: usize) -> usize {
    let (j, h) = (step / 2, step % 2);
    let (q, e) = if kk < 8 { (kk / 2, 4 * h + kk % 2) } else { ((kk - 8) / 2, 4 * h + 2 + kk % 2) };
    8 * (4 * j + q) + e
}

/// Where column pair `col` (even) of a query row sits in the permuted row: `16 * step + kk`
/// with `q_column(step, kk) == col` (checked below for every head size).
#[inline(always)]
const fn q_slot(col: usize) -> usize {
    let (chunk, e) = (col / 8, col % 8);
    let (j, q, h) = (chunk / 4, chunk % 4, e / 4);
    let kk = if e % 4 < 2 { 2 * q + e % 2 } else { 8 + 2 * q + e % 2 };
    16 * (2 * j + h) + kk
}

const _: () = {
    let mut col = 0;
    while col < 256 {
        let slot = q_slot(col);
        assert!(q_column(slot / 16, slot % 16) == col);
        col += 2;
    }
};

/// The partition kernel: `KJ = ceil(D / 32)` K chunks and `VJ = ceil(D / 64)` V chunks per
/// lane and token; `EARLY_V` issues the V loads with the K loads (registers allowing).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_partition<
    T: TensorElement,
    const D: usize,
    const SPLIT: usize,
    const KJ: usize,
    const VJ: usize,
    const EARLY_V: bool,
>(
    q: *const T,
    key_cache: *const T,
    value_cache: *const T,
    block_tables: *const i32,
    context_lens: *const i32,
    seq_map: *const i32,
    alibi: *const f32,
    out: *mut T,
    partial: *mut f32,
    arrivals: *mut u32,
    status: *mut u32,
    p: Dims,
    fresh: NewToken,
) {
    let part = index::block_idx_x();
    let y = index::block_idx_y() as usize;
    let (y, split) = (y / SPLIT, y % SPLIT);
    let (h, mt) = (div(y, p.m_tiles), rem(y, p.m_tiles));
    // This block's output columns: all of them, or one half at head size 256.
    let d_out = D / SPLIT;
    let d_base = split * d_out;
    let out_chunks = d_out / 8;
    let b = index::block_idx_z() as usize;
    let tid = index::thread_idx_x();
    let warp_id = (tid / 32) as usize;
    let lane = index::lane_id() as usize;
    let (g, qd) = (lane / 4, lane % 4);
    let chunks = D / 8; // K chunks per token
    let rows = (p.group * p.q_len) as usize;
    let row0 = mt * M_TILE;
    let rows_here = rows.saturating_sub(row0).min(M_TILE);
    let hq_total = (p.kv_heads * p.group) as usize;
    let kv_row = p.kv_token_stride as usize;

    let base = dynamic_shared_base();
    let q_s = base;
    let ml_s = q_s.offset((M_TILE * q_row_bytes(D)) as u32);
    let acc_s = ml_s.offset(WARPS * (M_TILE * 2 * 4) as u32);
    // The new token's key row, then its value row (a `NewToken` launch).
    let new_s = acc_s.offset((WARPS as usize * 32 * VJ * 32 * 4) as u32);
    let at = |region: SharedAddr, i: usize| region.offset((i * 4) as u32);

    // SAFETY (whole body): the launch contract sizes every buffer and the shared memory; loop
    // trip counts are uniform per warp (tiles) or per block (barrier phases), so `mma`,
    // `ldmatrix`, shuffles and barriers are reached by all lanes/threads.
    unsafe {
        let flag = part == 0 && index::block_idx_y() == 0 && tid == 0;
        // The block-table row of this sequence: itself, or (per-token launches) the row its
        // token maps to; an unmapped row is a bad length, so no block of it is ever read.
        let row = if seq_map.is_null() {
            Some(b)
        } else {
            let r = seq_map.add(b).read();
            (r >= 0 && (r as u32) < p.table_rows).then_some(r as usize)
        };
        let ctx = match row {
            Some(_) => context_len(context_lens, b, &p, status, flag),
            None => {
                if flag {
                    red_global_or_u32(status, STATUS_BAD_CONTEXT);
                }
                None
            }
        };
        let row = row.unwrap_or(0);
        let ctx_or_zero = ctx.unwrap_or(0);
        let start = part * p.partition;
        let n = ctx_or_zero.saturating_sub(start).min(p.partition);
        if ctx.is_some() && n == 0 {
            return; // partition past the end of this sequence: the combine skips it
        }
        let end = start + n;

        // GroupQueryAttention's one-launch decode (`fresh`): the sequence's last position is the
        // step's new token, taken from the inputs; the cache holds it only after this launch.
        let fused = fresh.key != 0;
        let new_pos = ctx_or_zero.wrapping_sub(1);
        let holds_new = fused && ctx.is_some() && end == ctx_or_zero;
        // Cache rows are loaded up to here; the new token's come from shared memory.
        let load_end = if holds_new { new_pos } else { end };
        let turn = |rotary_dim: u32| {
            Turn::<T>::new(
                fresh.cos as *const T,
                fresh.sin as *const T,
                rotary_dim,
                fresh.interleaved != 0,
                fresh.max_position,
                new_pos,
            )
        };

        // Cache offset of token `pos` for this KV head, if its block id is valid.
        let slot_of = |pos: u32| -> Option<usize> {
            let (blk, off) = divmod(pos, p.block_size, p.block_magic, p.block_shift);
            // No table: sequence `row` is block `row` (a BNSH cache).
            let entry = if block_tables.is_null() {
                row as i32
            } else {
                block_tables.add(row * p.max_blocks as usize + blk as usize).read()
            };
            if entry < 0 || entry as u32 >= p.num_blocks {
                red_global_or_u32(status, STATUS_BAD_BLOCK);
                return None;
            }
            Some(entry as usize * p.kv_block_stride as usize + off as usize * kv_row + h * p.kv_head_stride as usize)
        };

        // Queries of this row tile in the permuted order of `q_column`, zero past `rows`, a
        // 16-byte unit (four column pairs) per thread at a time; rotated in a `fresh` launch.
        let units = 4 * KJ;
        let q_turn = turn(if fused { fresh.rotary_dim } else { 0 });
        let mut i = tid as usize;
        while i < M_TILE * units {
            let (r, u) = (i / units, i % units);
            let mut w = [0u32; 4];
            if r < rows_here && 8 * u < D {
                let rg = row0 + r;
                let hq = h * p.group as usize + rem(rg, p.group);
                let head = q.add((b * p.q_len as usize + div(rg, p.group)) * p.q_token_stride as usize + hq * D);
                w = q_turn.unit(head, 8 * u);
            }
            unroll!(E in [0, 1, 2, 3] {
                st_shared_u32(q_s.offset((r * q_row_bytes(D) + q_slot(8 * u + 2 * E) * 2) as u32), w[E]);
            });
            i += THREADS as usize;
        }
        // The new token's key (rotated) and value, for the blocks whose partition holds it; the
        // block of row tile 0 and column half 0 appends them to the cache.
        if holds_new && (tid as usize) < 2 * (D / 8) {
            let (which, u) = (tid as usize / (D / 8), tid as usize % (D / 8));
            let (src, cache) = if which == 0 { (fresh.key, key_cache) } else { (fresh.value, value_cache) };
            let head = (src as *const T).add(b * fresh.kv_batch_stride as usize + h * D);
            let w = turn(if which == 0 { fresh.rotary_dim } else { 0 }).unit(head, 8 * u);
            st_shared_v4(new_s.offset(((which * D + 8 * u) * 2) as u32), w);
            if mt == 0
                && split == 0
                && let Some(slot) = slot_of(new_pos)
            {
                st_global_v4(cache.cast_mut().add(slot + 8 * u).cast(), w);
            }
        }
        sync::sync_threads();

        // Per-lane row constants: rows `g` and `g + 8` of the tile.
        let mut qpos = [0i64; 2];
        let mut slope = [0.0f32; 2];
        for (rh, (qp, sl)) in qpos.iter_mut().zip(slope.iter_mut()).enumerate() {
            let rg = row0 + g + 8 * rh;
            *qp = ctx_or_zero as i64 - p.q_len as i64 + div(rg, p.group) as i64;
            if !alibi.is_null() && rg < rows {
                *sl = alibi.add(h * p.group as usize + rem(rg, p.group)).read();
            }
        }
        let row_addr = q_s.offset(((lane % 8 + 8 * ((lane / 8) % 2)) * q_row_bytes(D) + 16 * (lane / 16)) as u32);

        // With block sizes a multiple of 16 every step lies in one block: one table lookup per
        // step (`tile_slot`, the slot of its first token) instead of one per token.
        let one_block = p.block_size.is_multiple_of(TOKENS as u32) && start.is_multiple_of(TOKENS as u32);
        let token_slot = |tile_slot: Option<usize>, pos0: u32, c: usize| -> Option<usize> {
            if pos0 + c as u32 >= load_end {
                None
            } else if one_block {
                tile_slot.map(|s| s + c * kv_row)
            } else {
                slot_of(pos0 + c as u32)
            }
        };
        // V chunks `8 * J + g` with `J` in `from..to` of this lane's four tokens of the step:
        // 2q, 2q+1, 2q+8, 2q+9 (the P fragment's columns).
        let load_v =
            |v: &mut [[[u32; 4]; VJ]; 4], tile_slot, pos0: u32, from: usize, to: usize, poisoned: &mut bool| {
                unroll!(I in [0, 1, 2, 3] {
                    let c = 2 * qd + (I % 2) + 8 * (I / 2);
                    let slot = token_slot(tile_slot, pos0, c);
                    *poisoned |= pos0 + (c as u32) < load_end && slot.is_none();
                    unroll!(J in [0, 1, 2, 3] {
                        if J < VJ && J >= from && J < to && 8 * J + g < out_chunks
                            && let Some(s) = slot
                        {
                            v[I][J] = ld_global_nc_v4(value_cache.add(s + d_base + 8 * (8 * J + g)).cast());
                        }
                    });
                });
            };
        // K chunks `4 * J + q` of this lane's two tokens g and g + 8 (B fragments as loaded).
        let load_k = |k: &mut [[[u32; 4]; KJ]; 2], tile_slot, pos0: u32, poisoned: &mut bool| {
            unroll!(NT in [0, 1] {
                let c = 8 * NT + g;
                let slot = token_slot(tile_slot, pos0, c);
                *poisoned |= pos0 + (c as u32) < load_end && slot.is_none();
                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if J < KJ && 4 * J + qd < chunks
                        && let Some(s) = slot
                    {
                        k[NT][J] = ld_global_nc_v4(key_cache.add(s + 8 * (4 * J + qd)).cast());
                    }
                });
            });
        };
        // The new token (step token `c`) from shared memory: its K chunks into the B fragments of
        // the lanes of token `c`, its V chunks `from..to` into the lanes whose P columns hold it.
        let new_k = |k: &mut [[[u32; 4]; KJ]; 2], c: usize| {
            unroll!(NT in [0, 1] {
                if 8 * NT + g == c {
                    unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                        if J < KJ && 4 * J + qd < chunks {
                            k[NT][J] = ld_shared_v4(new_s.offset(((4 * J + qd) * 16) as u32));
                        }
                    });
                }
            });
        };
        let new_v = |v: &mut [[[u32; 4]; VJ]; 4], c: usize, from: usize, to: usize| {
            unroll!(I in [0, 1, 2, 3] {
                if 2 * qd + (I % 2) + 8 * (I / 2) == c {
                    unroll!(J in [0, 1, 2, 3] {
                        if J < VJ && J >= from && J < to && 8 * J + g < out_chunks {
                            v[I][J] = ld_shared_v4(new_s.offset(((D + d_base + 8 * (8 * J + g)) * 2) as u32));
                        }
                    });
                }
            });
        };
        // Up to head size 128, V is loaded with K; at 256 V comes in halves after the scores,
        // so it fits beside the accumulators.
        let v_parts = if EARLY_V { 1 } else { 2 };
        // Steps that need no per-element masking: no cap, no ALiBi, every token before `end`
        // and visible to every query row (the earliest row sits at `ctx - q_len`).
        let plain = p.softcap == 0.0 && alibi.is_null();
        let scale_log2 = p.scale * LOG2_E;
        let first_qpos = ctx_or_zero as i64 - p.q_len as i64;

        let mut acc = [[[0.0f32; 4]; 8]; VJ];
        let mut m = [f32::NEG_INFINITY; 2];
        let mut l = [0.0f32; 2];
        let mut poisoned = false;
        let tiles = if ctx.is_some() { n.div_ceil(TOKENS as u32) } else { 0 };
        let mut tile = warp_id as u32;
        while tile < tiles {
            let pos0 = start + tile * TOKENS as u32;
            let tile_slot = if one_block { slot_of(pos0) } else { None };
            let mut k = [[[0u32; 4]; KJ]; 2];
            let mut v = [[[0u32; 4]; VJ]; 4];
            load_k(&mut k, tile_slot, pos0, &mut poisoned);
            if EARLY_V {
                load_v(&mut v, tile_slot, pos0, 0, VJ, &mut poisoned);
            }
            let new_c = new_pos.wrapping_sub(pos0) as usize;
            let has_new = holds_new && new_c < TOKENS;
            if has_new {
                new_k(&mut k, new_c);
                if EARLY_V {
                    new_v(&mut v, new_c, 0, VJ);
                }
            }

            // Scores: Q (16 x D) x K^T (D x 8) for each half of the step.
            let mut s = [[0.0f32; 4]; 2];
            unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                if J < KJ {
                    unroll!(HH in [0, 1] {
                        let a = ldmatrix_x4(row_addr.offset(((2 * J + HH) * 32) as u32));
                        unroll!(NT in [0, 1] {
                            s[NT] = T::mma(s[NT], a, [k[NT][J][2 * HH], k[NT][J][2 * HH + 1]]);
                        });
                    });
                }
            });

            // Scale, cap, bias and mask (log2 units).
            let last = pos0 as i64 + TOKENS as i64 - 1;
            let visible_all = pos0 + TOKENS as u32 <= end
                && last <= first_qpos
                && (p.window == 0 || (pos0 as i64) + (p.window as i64) > ctx_or_zero as i64 - 1);
            if plain && visible_all {
                unroll!(NT in [0, 1] {
                    unroll!(C in [0, 1, 2, 3] {
                        s[NT][C] *= scale_log2;
                    });
                });
            } else {
                unroll!(NT in [0, 1] {
                    unroll!(C in [0, 1, 2, 3] {
                        let rh = C / 2;
                        let pos = pos0 + (8 * NT + 2 * qd + C % 2) as u32;
                        let mut y = s[NT][C] * p.scale;
                        if p.softcap > 0.0 {
                            y = p.softcap * tanh(y / p.softcap);
                        }
                        y += slope[rh] * (pos as i64 - qpos[rh]) as f32;
                        let visible = pos < end
                            && pos as i64 <= qpos[rh]
                            && (p.window == 0 || pos as i64 + p.window as i64 > qpos[rh]);
                        s[NT][C] = if visible { y * LOG2_E } else { f32::NEG_INFINITY };
                    });
                });
            }

            // Online softmax per row (rows g, g + 8; the four lanes of a row reduce with two
            // shuffles). The accumulators are rescaled only when some row's max moved.
            let mut pr = [[0.0f32; 4]; 2];
            let mut corr = [1.0f32; 2];
            unroll!(RH in [0, 1] {
                let mut mx = s[0][2 * RH].max(s[0][2 * RH + 1]).max(s[1][2 * RH]).max(s[1][2 * RH + 1]);
                mx = mx.max(warp::shfl_xor_f32(mx, 1));
                mx = mx.max(warp::shfl_xor_f32(mx, 2));
                let m_new = m[RH].max(mx);
                let m_use = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
                corr[RH] = math::ex2_approx(m[RH] - m_use);
                let mut sum = 0.0f32;
                unroll!(NT in [0, 1] {
                    unroll!(C in [0, 1] {
                        let e = math::ex2_approx(s[NT][2 * RH + C] - m_use);
                        pr[NT][2 * RH + C] = e;
                        sum += e;
                    });
                });
                l[RH] = math::fma(l[RH], corr[RH], sum);
                m[RH] = m_new;
            });
            if warp::any(corr[0] != 1.0 || corr[1] != 1.0) {
                unroll!(J in [0, 1, 2, 3] {
                    if J < VJ {
                        unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                            unroll!(C in [0, 1, 2, 3] {
                                acc[J][E][C] *= corr[C / 2];
                            });
                        });
                    }
                });
            }

            // P (16 x 16 tokens) x V (16 tokens x D): the score C fragments are the P A
            // fragment; V chunks are paired per column into B fragments.
            let a = [
                T::pack2(pr[0][0], pr[0][1]),
                T::pack2(pr[0][2], pr[0][3]),
                T::pack2(pr[1][0], pr[1][1]),
                T::pack2(pr[1][2], pr[1][3]),
            ];
            unroll!(VP in [0, 1] {
                if VP < v_parts {
                    let (from, to) = (VP * VJ / v_parts, (VP + 1) * VJ / v_parts);
                    if !EARLY_V {
                        load_v(&mut v, tile_slot, pos0, from, to, &mut poisoned);
                        if has_new {
                            new_v(&mut v, new_c, from, to);
                        }
                    }
                    unroll!(J in [0, 1, 2, 3] {
                        if J < VJ && J >= from && J < to {
                            unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                                let w = E / 2;
                                let bfrag = if E % 2 == 0 {
                                    [pair_lo(v[0][J][w], v[1][J][w]), pair_lo(v[2][J][w], v[3][J][w])]
                                } else {
                                    [pair_hi(v[0][J][w], v[1][J][w]), pair_hi(v[2][J][w], v[3][J][w])]
                                };
                                acc[J][E] = T::mma(acc[J][E], a, bfrag);
                            });
                        }
                    });
                }
            });
            tile += WARPS;
        }

        // Merge the four warps: max/sum per row and warp, accumulators in fragment order
        // (`[warp][register][lane]`, conflict-free), then each output element once.
        for rh in 0..2 {
            l[rh] += warp::shfl_xor_f32(l[rh], 1);
            l[rh] += warp::shfl_xor_f32(l[rh], 2);
            if qd == 0 {
                let r = g + 8 * rh;
                st_shared_f32(at(ml_s, (warp_id * M_TILE + r) * 2), m[rh]);
                st_shared_f32(at(ml_s, (warp_id * M_TILE + r) * 2 + 1), l[rh]);
            }
        }
        let regs = VJ * 32;
        unroll!(J in [0, 1, 2, 3] {
            if J < VJ {
                unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                    unroll!(C in [0, 1, 2, 3] {
                        let reg = (J * 8 + E) * 4 + C;
                        st_shared_f32(at(acc_s, (warp_id * regs + reg) * 32 + lane), acc[J][E][C]);
                    });
                });
            }
        });
        // The barrier must run on every path: it also orders the stores above before the
        // merge reads them (short-circuiting it on a bad length was a race).
        let any_poisoned = sync::sync_threads_or(poisoned);
        let bad = ctx.is_none() || any_poisoned;

        let np = p.num_partitions as usize;
        let mut i = tid as usize;
        while i < rows_here * d_out {
            let (r, dl) = (i / d_out, i % d_out);
            let d = d_base + dl;
            let mut mx = f32::NEG_INFINITY;
            for w in 0..WARPS as usize {
                mx = mx.max(ld_shared_f32(at(ml_s, (w * M_TILE + r) * 2)));
            }
            let m_use = if mx == f32::NEG_INFINITY { 0.0 } else { mx };
            // Where element (r, d) sits in the fragments: n tile (d / 64, d % 8), column
            // (d % 64) / 8 = 2 * lane % 4 + register bit 0; row r % 8 = lane / 4, r / 8 =
            // register bit 1.
            let (j, col, e) = (dl / 64, (dl % 64) / 8, dl % 8);
            let reg = (j * 8 + e) * 4 + (r / 8) * 2 + col % 2;
            let src_lane = 4 * (r % 8) + col / 2;
            let (mut sum, mut total) = (0.0f32, 0.0f32);
            for w in 0..WARPS as usize {
                let f = math::ex2_approx(ld_shared_f32(at(ml_s, (w * M_TILE + r) * 2)) - m_use);
                total = math::fma(f, ld_shared_f32(at(ml_s, (w * M_TILE + r) * 2 + 1)), total);
                sum = math::fma(f, ld_shared_f32(at(acc_s, (w * regs + reg) * 32 + src_lane)), sum);
            }
            let rg = row0 + r;
            if np == 1 {
                let (t, hq) = (div(rg, p.group), h * p.group as usize + rem(rg, p.group));
                let value = if bad {
                    f32::NAN
                } else if total > 0.0 {
                    sum / total
                } else {
                    0.0
                };
                out.add(((b * p.q_len as usize + t) * hq_total + hq) * D + d).write(T::from_f32(value));
            } else {
                let slot = ((b * p.kv_heads as usize + h) * np + part as usize) * rows + rg;
                partial.add(slot * D + d).write(if bad { f32::NAN } else { sum });
                if d == 0 {
                    let ml = partial.add(rows_total(&p, rows) * D + slot * 2);
                    ml.write(if bad { f32::NAN } else { mx });
                    ml.add(1).write(total);
                }
            }
            i += THREADS as usize;
        }

        // The last block to finish a (sequence, KV head, row tile) merges its partitions, where
        // the caller cleared `arrivals` (else the combine kernel follows). Its partials were
        // published by each block's barrier and the release of its arrival.
        if np > 1 && !arrivals.is_null() {
            // The partitions that run for this sequence: those before its end, or all of them
            // for a bad length (each writes NaN).
            let parts = match ctx {
                Some(c) => div(c as usize + p.partition as usize - 1, p.partition),
                None => np,
            };
            sync::sync_threads();
            let mut last = false;
            if tid == 0 {
                let word = arrivals.add((b * p.kv_heads as usize + h) * p.m_tiles as usize + mt);
                last = sync::atom_add_acq_rel_gpu_u32(word, 1) as usize + 1 == parts * SPLIT;
                if last {
                    // Every other block of the tile has arrived: back to zero for the next
                    // launch on the same counters.
                    word.write(0);
                }
            }
            if sync::sync_threads_or(last) {
                merge_partitions::<T, D>(out, partial, &p, b, h, row0, rows_here, parts, ctx.is_none());
            }
        }
    }
}

/// The combine of the rows `row0..row0 + rows_here` of (sequence `b`, KV head `h`) over their
/// `parts` partitions, all columns, by one block: each thread one 4-column group of a row at a
/// time, in one pass over the partitions, eight at a time so that their loads overlap (the
/// running maximum rescales the sums, as the partition kernel's softmax does). Partials are
/// read through L2: other blocks wrote them during this kernel.
///
/// # Safety
/// Every partition's partials written and published (see the caller); buffers as the launch
/// contract sizes them.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn merge_partitions<T: Element, const D: usize>(
    out: *mut T,
    partial: *const f32,
    p: &Dims,
    b: usize,
    h: usize,
    row0: usize,
    rows_here: usize,
    parts: usize,
    bad: bool,
) {
    const AT_ONCE: usize = 8;
    let rows = (p.group * p.q_len) as usize;
    let np = p.num_partitions as usize;
    let hq_total = (p.kv_heads * p.group) as usize;
    let groups = D / 4;
    let mut i = index::thread_idx_x() as usize;
    // SAFETY: as the function's contract; slots below `parts <= np` of this (b, h).
    unsafe {
        let ml = partial.add(rows_total(p, rows) * D);
        while i < rows_here * groups {
            let (r, d0) = (i / groups, 4 * (i % groups));
            let rg = row0 + r;
            let slot = |part: usize| ((b * p.kv_heads as usize + h) * np + part) * rows + rg;
            let (mut m, mut total, mut acc) = (f32::NEG_INFINITY, 0.0f32, [0.0f32; 4]);
            let mut part = 0;
            while part < parts {
                let mut stats = [[0u32; 2]; AT_ONCE];
                let mut chunk = [[0u32; 4]; AT_ONCE];
                unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if part + U < parts {
                        stats[U] = ld_global_cg_v2(ml.add(slot(part + U) * 2).cast());
                        chunk[U] = ld_global_cg_v4(partial.add(slot(part + U) * D + d0).cast());
                    } else {
                        stats[U][0] = f32::NEG_INFINITY.to_bits();
                    }
                });
                // f32::max skips a poisoned NaN maximum; its weight, and so the sums, do not
                // (even where every maximum is NaN or empty: the weights then use 0).
                let mut m_new = m;
                unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
                    m_new = m_new.max(f32::from_bits(stats[U][0]));
                });
                let m_use = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
                let rescale = math::ex2_approx(m - m_use);
                total *= rescale;
                unroll!(E in [0, 1, 2, 3] {
                    acc[E] *= rescale;
                });
                unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
                    let mp = f32::from_bits(stats[U][0]);
                    let w = if mp == f32::NEG_INFINITY { 0.0 } else { math::ex2_approx(mp - m_use) };
                    total = math::fma(w, f32::from_bits(stats[U][1]), total);
                    unroll!(E in [0, 1, 2, 3] {
                        acc[E] = math::fma(w, f32::from_bits(chunk[U][E]), acc[E]);
                    });
                });
                m = m_new;
                part += AT_ONCE;
            }
            let (t, hq) = (div(rg, p.group), h * p.group as usize + rem(rg, p.group));
            let o = out.add(((b * p.q_len as usize + t) * hq_total + hq) * D + d0);
            unroll!(E in [0, 1, 2, 3] {
                let value = if bad {
                    f32::NAN
                } else if total == 0.0 {
                    0.0
                } else {
                    acc[E] / total
                };
                o.add(E).write(T::from_f32(value));
            });
            i += THREADS as usize;
        }
    }
}

/// Rows of partial results in the whole workspace (the offset of the max/sum section).
#[inline(always)]
fn rows_total(p: &Dims, rows: usize) -> usize {
    index::grid_dim_z() as usize * p.kv_heads as usize * p.num_partitions as usize * rows
}

/// The combine: the rows' partitions are spread over the four warps (each lane four columns,
/// partitions four at a time so their loads overlap), then the warps' sums are added in shared
/// memory. A long context has hundreds of partitions over few rows, so a loop over them per
/// thread would be a chain of dependent load latencies.
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
    let (warp_id, lane) = (tid / 32, index::lane_id() as usize);
    let hq_total = (p.kv_heads * p.group) as usize;
    let rows = (p.group * p.q_len) as usize;
    let (h, g) = (div(hq, p.group), rem(hq, p.group));
    let r = t * p.group as usize + g;
    let np = p.num_partitions as usize;
    let batch = index::grid_dim_z() as usize;
    // [warp][256] column sums, then [warp] weight sums and [warp] maxima.
    let scratch = shared_array!(DLKERN_PAGED_ATTENTION_COMBINE, 4128, 16);
    let sums = |w: usize, d: usize| scratch.offset(((w * 256 + d) * 4) as u32);
    let totals = |w: usize| scratch.offset(((4 * 256 + w) * 4) as u32);
    let maxima = |w: usize| scratch.offset(((4 * 256 + 4 + w) * 4) as u32);
    // SAFETY: the launch contract sizes every buffer; reads only partitions the partition
    // kernel wrote for this sequence. The early return is uniform over the block, and the
    // loops' barriers are reached by every thread.
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

        // The rows' maximum over partitions (f32::max skips a poisoned NaN; the sums do not).
        let mut m = f32::NEG_INFINITY;
        let mut part = tid;
        while part < parts {
            m = m.max(ml.add(slot(part) * 2).read());
            part += THREADS as usize;
        }
        let m = warp::warp_max_f32(m);
        if lane == 0 {
            st_shared_f32(maxima(warp_id), m);
        }
        sync::sync_threads();
        let mut m = ld_shared_f32(maxima(0));
        for w in 1..WARPS as usize {
            m = m.max(ld_shared_f32(maxima(w)));
        }
        let weight = |part: usize| {
            let mp = ml.add(slot(part) * 2).read();
            if mp == f32::NEG_INFINITY { 0.0 } else { math::ex2_approx(mp - m) }
        };

        // Column group `c`: lanes cover 128 columns, four each.
        let mut total = 0.0f32;
        unroll!(C in [0, 1] {
            let d0 = C * 128 + 4 * lane;
            if C * 128 < D {
                let mut acc = [0.0f32; 4];
                let mut part = warp_id;
                while part < parts {
                    let mut chunk = [[0u32; 4]; 4];
                    let mut w = [0.0f32; 4];
                    unroll!(U in [0, 1, 2, 3] {
                        let pu = part + U * WARPS as usize;
                        if pu < parts {
                            w[U] = weight(pu);
                            if d0 < D {
                                chunk[U] = ld_global_nc_v4(partial.add(slot(pu) * D + d0).cast());
                            }
                            if C == 0 {
                                total = math::fma(w[U], ml.add(slot(pu) * 2 + 1).read(), total);
                            }
                        }
                    });
                    unroll!(U in [0, 1, 2, 3] {
                        unroll!(E in [0, 1, 2, 3] {
                            acc[E] = math::fma(w[U], f32::from_bits(chunk[U][E]), acc[E]);
                        });
                    });
                    part += 4 * WARPS as usize;
                }
                if d0 < D {
                    unroll!(E in [0, 1, 2, 3] {
                        st_shared_f32(sums(warp_id, d0 + E), acc[E]);
                    });
                }
            }
        });
        // Every lane of a warp summed the same weights.
        if lane == 0 {
            st_shared_f32(totals(warp_id), total);
        }
        sync::sync_threads();
        let mut l = 0.0f32;
        for w in 0..WARPS as usize {
            l += ld_shared_f32(totals(w));
        }
        let mut d = tid;
        while d < D {
            let mut sum = 0.0f32;
            for w in 0..WARPS as usize {
                sum += ld_shared_f32(sums(w, d));
            }
            // A poisoned partition (NaN max, sum or weight) makes the row NaN.
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
            context_lens: *const i32, seq_map: *const i32, alibi: *const f32, out: *mut $ty, partial: *mut f32,
            arrivals: *mut u32, status: *mut u32, dims: Dims, fresh: NewToken,
        ) {
            sync::wait_for_prerequisite_grids();
            sync::allow_dependent_launch();
            // SAFETY: forwarded launch contract.
            unsafe { attention_partition::<$ty, $d, { split($d) }, { ($d as usize).div_ceil(32) }, { ($d as usize / split($d)).div_ceil(64) }, { $d <= 128 }>(q, key_cache, value_cache, block_tables, context_lens, seq_map, alibi, out, partial, arrivals, status, dims, fresh) }
        }

        /// Combine kernel; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $comb(
            context_lens: *const i32, out: *mut $ty, partial: *const f32, status: *mut u32, dims: Dims,
        ) {
            sync::wait_for_prerequisite_grids();
            sync::allow_dependent_launch();
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
