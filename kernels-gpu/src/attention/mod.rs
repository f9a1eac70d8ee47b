//! Attention (prefill) forward on tensor cores, FlashAttention-2 style: each block owns
//! [`block_m`] query rows of one head (32 per warp, 16 at head size 256) and streams the keys
//! in tiles through shared memory, with an online softmax in registers, so memory stays O(S)
//! (no S x S buffer).
//!
//! Layouts: `q`, `out` rows of `q_row_stride` elements per token (`H * D` when dense), head `h`
//! at offset `h * D`; `k`, `v` likewise with `k_row_stride` and KV head `h / (H / Hkv)`.
//! Sequence `b` owns query rows `cu_q[b]..cu_q[b + 1]` and key rows `cu_k[b]..cu_k[b + 1]`
//! (packed batches), or `b * seqlen_q ..` and `b * seqlen_k ..` when `cu_q` / `cu_k` are null
//! (padded batches). Query `i` of a sequence with `sq` queries and `sk` keys sits at key
//! position `i + sk - sq` (bottom-right alignment): causal keeps keys `j <= i + sk - sq`, a left
//! window `w >= 0` keeps `j >= i + sk - sq - w`.
//!
//! # Launch contract: `attention_fwd_{f16,bf16}_d{D}`
//! - grid `(ceil(max_seqlen_q / block_m(D)), H, batch)`, block `(128, 1, 1)`, dynamic shared memory
//!   [`shared_bytes`]`(D)`; `q`, `k`, `v`, `out` 16-byte aligned, row strides multiples of 8.
//! - writes `out` (and, when `lse` is not null, the natural-log log-sum-exp of each row at
//!   `lse[h * lse_head_stride + row_base + i]`, `row_base = b * lse_batch_stride` (padded) or
//!   `cu_q[b]` (packed); `-inf` and a zero output for a row that sees no key).
//! - `cu_q`, `cu_k` (when given) are clamped to `[0, total]` and made non-decreasing, so no
//!   value can send an access outside the tensors; a sequence longer than the grid's
//!   `block_m(D) * gridDim.x` queries leaves its later rows unwritten.
//! - `out` rows are `out_row_stride` elements apart; KV head `h` starts `h * kv_head_stride`
//!   elements into a sequence's keys.
//! - KV-cache mode (the `attention_fwd_cache_*` entries, ONNX Runtime's `GroupQueryAttention`): `k`, `v` are
//!   BNSH caches (sequence `b`, KV head `h` at `b * kv_batch_stride + h * kv_head_stride`,
//!   positions `k_row_stride` apart), `cu_k` is `seqlens_k` (`[batch]`, clamped so that
//!   `T = seqlens_k[b] + 1` lies in `[0, cache_capacity]`), `cu_q` is unused, and sequence `b`'s
//!   queries are rows `b * seqlen_q ..` of which the first `min(seqlen_q, T)` are written:
//!   query `i` sits at key position `T - min(seqlen_q, T) + i` (bottom-right alignment).

#[cfg(dlkern_arch_specific)]
pub mod hopper;
pub mod layout;
pub mod rotary;

use crate::device::async_copy::{commit_group, cp_async_16_zfill, wait_group};
use crate::device::ldmatrix::{ldmatrix_x4, ldmatrix_x4_trans};
use crate::device::shared::dynamic_shared_base;
use crate::device::{SharedAddr, index, math, sync, warp};
use crate::element::{Bf16, F16, TensorElement};
use crate::unroll;

pub use layout::{Dims, WARPS, block_m, block_n, m_tiles, row_bytes, shared_bytes, sub_n};

const THREADS: usize = WARPS * 32;
const LOG2_E: f32 = core::f32::consts::LOG2_E;
const LN_2: f32 = core::f32::consts::LN_2;

/// Where in a tile the next tile's copy is issued. Any point after the barrier is safe (every
/// warp is done with the stage it refills); the point only moves the copy addresses' live
/// range, which decides ptxas's spills at 255 registers.
const COPY_AT_TOP: usize = 0;
const COPY_AFTER_SCORES: usize = 1;
const COPY_BEFORE_PV: usize = 2;

/// The copy point with the fewest spills per head size (ptxas 13.0, sm_90).
pub const fn copy_at(d: usize) -> usize {
    match d {
        96 => COPY_BEFORE_PV,
        128 => COPY_AFTER_SCORES,
        _ => COPY_AT_TOP,
    }
}

/// tanh through `ex2.approx` and `rcp.approx` (as in paged attention).
#[inline(always)]
fn tanh(x: f32) -> f32 {
    1.0 - 2.0 * math::rcp_approx(math::ex2_approx(2.0 * LOG2_E * x) + 1.0)
}

/// Query rows `q0..q1` and key rows `k0..k1` of sequence `b` (the launch contract's batch
/// modes), clamped so that no value of `cu_q` / `cu_k` / `seqlens_k` can send an access
/// outside the tensors.
///
/// # Safety
/// `cu_k` (KV-cache mode) or `cu_q` and `cu_k` (packed, when not null) hold entries for `b`.
#[inline(always)]
unsafe fn sequence_rows<const CACHE: bool>(b: usize, cu_q: *const i32, cu_k: *const i32, p: &Dims) -> [u32; 4] {
    // SAFETY: the caller guarantees the lengths' extents.
    unsafe {
        if CACHE {
            let total = (cu_k.add(b).read() as i64 + 1).clamp(0, p.cache_capacity as i64) as u32;
            let q0 = b as u32 * p.seqlen_q;
            [q0, q0 + p.seqlen_q.min(total), 0, total]
        } else if cu_q.is_null() {
            let (sq, sk, b) = (p.seqlen_q, p.seqlen_k, b as u32);
            [b * sq, (b + 1) * sq, b * sk, (b + 1) * sk]
        } else {
            let clamp = |cu: *const i32, total: u32| {
                let lo = (cu.add(b).read().max(0) as u32).min(total);
                let hi = (cu.add(b + 1).read().max(0) as u32).clamp(lo, total);
                (lo, hi)
            };
            let ((q0, q1), (k0, k1)) = (clamp(cu_q, p.total_q), clamp(cu_k, p.total_k));
            [q0, q1, k0, k1]
        }
    }
}

/// Elements from the start of `k` (and `v`) to key row `k0` of sequence `b`'s KV head `kvh`:
/// in a BNSH cache (`CACHE`), or in token-major rows.
#[inline(always)]
fn kv_offset<const CACHE: bool, const D: usize>(b: usize, kvh: usize, k0: u32, p: &Dims) -> u32 {
    if CACHE {
        b as u32 * p.kv_batch_stride + kvh as u32 * p.kv_head_stride + k0 * p.k_row_stride
    } else {
        k0 * p.k_row_stride + (kvh * D) as u32
    }
}

/// How raw scores `q.k` become base-2 logits: scaled in the exponent's FMA (`units`), or, with
/// a soft cap or a scale <= 0 (which would turn the row max into a min), up front on the
/// masking path (`units` 1).
#[derive(Clone, Copy)]
struct Logits {
    capped: bool,
    prescaled: bool,
    units: f32,
    inv_cap: f32,
}

impl Logits {
    #[inline(always)]
    fn of(p: &Dims) -> Self {
        let capped = p.softcap > 0.0;
        let prescaled = capped || !(p.scale > 0.0);
        let units = if prescaled { 1.0 } else { p.scale * LOG2_E };
        let inv_cap = if capped { math::rcp_approx(p.softcap) } else { 0.0 };
        Logits { capped, prescaled, units, inv_cap }
    }

    /// Score `x` of key `j` for the query at key position `diag`: capped or prescaled as the
    /// call asks, `-inf` where the key is masked.
    #[inline(always)]
    fn masked(&self, x: f32, j: i64, diag: i64, sk: u32, p: &Dims) -> f32 {
        let visible =
            j < sk as i64 && (p.causal == 0 || j <= diag) && (p.window_left < 0 || j >= diag - p.window_left as i64);
        let x = if self.capped {
            p.softcap * LOG2_E * tanh(x * p.scale * self.inv_cap)
        } else if self.prescaled {
            x * (p.scale * LOG2_E)
        } else {
            x
        };
        if visible { x } else { f32::NEG_INFINITY }
    }

    /// Score `x` capped or prescaled as the call asks: [`Logits::masked`] without the mask, for
    /// the Hopper kernel's masking by column range. (`masked` keeps its own copy of these lines:
    /// written as a call of this, LLVM schedules the mma.sync kernels differently, and those
    /// were measured and tested as they are.)
    #[inline(always)]
    #[cfg_attr(not(dlkern_arch_specific), allow(dead_code))] // the Hopper kernel's
    fn scaled(&self, x: f32, p: &Dims) -> f32 {
        if self.capped {
            p.softcap * LOG2_E * tanh(x * p.scale * self.inv_cap)
        } else if self.prescaled {
            x * (p.scale * LOG2_E)
        } else {
            x
        }
    }

    /// The keys `first + lo..first + hi` (`0 <= lo, hi <= n`; none where `lo >= hi`) of keys
    /// `first..first + n` that the query at key position `diag` sees: [`Logits::masked`]'s
    /// bounds, computed once per row and tile so that each score needs one 32-bit compare per
    /// bound.
    #[inline(always)]
    #[cfg_attr(not(dlkern_arch_specific), allow(dead_code))] // the Hopper kernel's
    fn visible_range(first: u32, n: u32, diag: i64, sk: u32, p: &Dims) -> (i32, i32) {
        let mut hi = sk as i64;
        if p.causal != 0 {
            hi = hi.min(diag + 1);
        }
        let lo = if p.window_left >= 0 { diag - p.window_left as i64 } else { 0 };
        let rel = |k: i64| (k - first as i64).clamp(0, n as i64) as i32;
        (rel(lo), rel(hi))
    }

    /// The new running maximum of a row (from `m` and this tile's maximum `tile_max`), the
    /// exponent offset for this tile's scores, and the factor that rescales the old sums.
    #[inline(always)]
    fn rescale(&self, m: f32, tile_max: f32) -> (f32, f32, f32) {
        let m_new = m.max(tile_max);
        // A row that has seen no key yet: keep exponents finite (all e = 0).
        let m_scaled = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new * self.units };
        (m_new, m_scaled, math::ex2_approx(math::fma(m, self.units, -m_scaled)))
    }

    /// A row's natural-log log-sum-exp from its maximum and sum, `-inf` for a row that saw no key.
    #[inline(always)]
    fn lse(&self, m: f32, sum: f32) -> f32 {
        if sum > 0.0 { (m * self.units + math::lg2_approx(sum)) * LN_2 } else { f32::NEG_INFINITY }
    }
}

/// Where a block writes: `out` and `lse` of query head `h` of sequence `b` (query rows from
/// `q0`), with the call's strides.
#[derive(Clone, Copy)]
struct RowSink<T> {
    out: *mut T,
    lse: *mut f32,
    /// `out` row of query 0 of the sequence, at head `h`; rows `out_row_stride` apart.
    out_base: u32,
    out_row_stride: u32,
    /// `lse` index of query 0 of the sequence at head `h`.
    lse_base: u32,
}

impl<T: TensorElement> RowSink<T> {
    #[inline(always)]
    fn of<const CACHE: bool, const D: usize>(
        out: *mut T,
        lse: *mut f32,
        packed: bool,
        b: usize,
        h: usize,
        q0: u32,
        p: &Dims,
    ) -> Self {
        let out_row_stride = if CACHE { p.out_row_stride } else { p.q_row_stride };
        let base = if packed { q0 } else { b as u32 * p.lse_batch_stride };
        RowSink {
            out,
            lse,
            out_base: q0 * out_row_stride + (h * D) as u32,
            out_row_stride,
            lse_base: h as u32 * p.lse_head_stride + base,
        }
    }

    /// Row `i`'s sum of probabilities from this lane's quarter of it (four lanes per row, the
    /// mma fragments' layout).
    ///
    /// # Safety
    /// All lanes of the warp call it.
    #[inline(always)]
    unsafe fn row_total(l: f32) -> f32 {
        let mut sum = l;
        // SAFETY: every lane of the warp is here (the caller's contract).
        unsafe {
            sum += warp::shfl_xor_f32(sum, 1);
            sum += warp::shfl_xor_f32(sum, 2);
        }
        sum
    }

    /// The first element of query row `i`'s output.
    ///
    /// # Safety
    /// Row `i` lies inside `out`.
    #[inline(always)]
    unsafe fn row(&self, i: u32) -> *mut T {
        // SAFETY: the caller's contract.
        unsafe { self.out.add((self.out_base + i * self.out_row_stride) as usize) }
    }

    /// Writes row `i`'s log-sum-exp where the call asks for it.
    ///
    /// # Safety
    /// Row `i` lies inside `lse` when `lse` is not null.
    #[inline(always)]
    unsafe fn write_lse(&self, i: u32, m: f32, sum: f32, logits: &Logits) {
        if !self.lse.is_null() {
            // SAFETY: the caller's contract.
            unsafe { self.lse.add((self.lse_base + i) as usize).write(logits.lse(m, sum)) };
        }
    }

    /// Finishes query row `i` of the sequence from this lane's quarter of it (four lanes per
    /// row, `qd` its place): the row's partial sums are combined across the four lanes, the
    /// output normalized (columns `8 u + 2 qd`, `+ 1` from `pair(u)`), and the log-sum-exp
    /// written when asked for; rows at or past `sq` are skipped (after the shuffles).
    ///
    /// # Safety
    /// All lanes of the warp call it; row `i < sq` lies inside `out` (and `lse`).
    #[inline(always)]
    unsafe fn finish_row<const D: usize>(
        &self,
        i: u32,
        sq: u32,
        qd: usize,
        l: f32,
        m: f32,
        logits: &Logits,
        pair: impl Fn(usize) -> (f32, f32),
    ) {
        // SAFETY: every lane of the warp is here (the caller's contract).
        let sum = unsafe { Self::row_total(l) };
        if i < sq {
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            // SAFETY: the caller guarantees the row is inside the tensors.
            unsafe {
                let row = self.row(i);
                unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                    if U < D / 8 {
                        let (lo, hi) = pair(U);
                        row.add(8 * U + 2 * qd).cast::<u32>().write(T::pack2(lo * inv, hi * inv));
                    }
                });
                if qd == 0 {
                    self.write_lse(i, m, sum, logits);
                }
            }
        }
    }
}

/// Copies `ROWS` rows (of `D` halves) starting at `src`, `stride` elements apart, into shared
/// `dst` (one row per `row_bytes`), zero-filling rows at or past `valid`; all 128 threads.
///
/// # Safety
/// Rows below `valid` must be readable; `src` must be a global address and 16-byte aligned
/// with `stride` a multiple of 8.
#[inline(always)]
// The unrolled walk advances `from` after its last copy too (dead, removed by the optimizer).
#[allow(unused_assignments)]
unsafe fn load_tile<T, const D: usize, const ROWS: usize>(dst: SharedAddr, src: *const T, stride: u32, valid: u32) {
    let chunks = D / 8;
    let tid = index::thread_idx_x() as usize;
    if THREADS % chunks == 0 {
        // Each thread keeps one column and walks down the rows with one pointer, so the
        // unrolled copies need two registers of addresses, not one pair per copy.
        let rows_per_pass = THREADS / chunks;
        let (r0, c) = (tid / chunks, tid % chunks);
        let dst = dst.offset((r0 * row_bytes(D) + c * 16) as u32);
        let step = (rows_per_pass as u32 * stride) as usize;
        // SAFETY: offsets fit in 32 bits (the host bounds every tensor by i32::MAX elements).
        let mut from = unsafe { src.add((r0 as u32 * stride + (c * 8) as u32) as usize) };
        unroll!(IT in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            if IT * rows_per_pass < ROWS {
                let ok = ((r0 + IT * rows_per_pass) as u32) < valid;
                // SAFETY: rows below `valid` are readable; others copy 0 bytes from the base.
                unsafe {
                    cp_async_16_zfill(dst.offset((IT * rows_per_pass * row_bytes(D)) as u32), if ok { from } else { src }.cast(), if ok { 16 } else { 0 });
                    from = from.wrapping_add(step);
                }
            }
        });
    } else {
        // A constant trip count, so the loop unrolls and the bounds checks fold away.
        unroll!(IT in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            let i = tid + IT * THREADS;
            if IT * THREADS < ROWS * chunks && i < ROWS * chunks {
                let (r, c) = (i / chunks, i % chunks);
                let ok = (r as u32) < valid;
                // SAFETY: rows below `valid` are readable; others copy 0 bytes from the base.
                // Offsets fit in 32 bits: the host bounds every tensor by i32::MAX elements.
                unsafe {
                    let from = if ok { src.add((r as u32 * stride + (c * 8) as u32) as usize) } else { src };
                    cp_async_16_zfill(dst.offset((r * row_bytes(D) + c * 16) as u32), from.cast(), if ok { 16 } else { 0 });
                }
            }
        });
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_fwd<
    T: TensorElement,
    const D: usize,
    const BM: usize,
    const BN: usize,
    const SUB: usize,
    const MT: usize,
    const Q_REGS: bool,
    const COPY_AT: usize,
    const CACHE: bool,
>(
    q: *const T,
    k: *const T,
    v: *const T,
    out: *mut T,
    lse: *mut f32,
    cu_q: *const i32,
    cu_k: *const i32,
    p: Dims,
) {
    let block_m = BM;
    let mb = index::block_idx_x() as usize;
    let h = index::block_idx_y() as usize;
    let b = index::block_idx_z() as usize;
    let tid = index::thread_idx_x() as usize;
    let (warp_id, lane) = (tid / 32, index::lane_id() as usize);
    let (g, qd) = (lane / 4, lane % 4);
    let group = (p.heads / p.kv_heads.max(1)).max(1) as usize;
    let kvh = h / group;
    let ksteps = D / 16;

    // SAFETY (whole body): the launch contract sizes every buffer; loads past a sequence are
    // zero-filled, never read; barriers and warp-collective instructions are reached by all
    // threads (loop bounds depend only on the block).
    unsafe {
        // Row indices and element offsets are u32 (the host bounds every tensor by i32::MAX
        // elements): half the registers of usize, which the main loop needs.
        let [q0, q1, k0, k1] = sequence_rows::<CACHE>(b, cu_q, cu_k, &p);
        let (sq, sk) = (q1.saturating_sub(q0), k1.saturating_sub(k0));
        let m0 = (mb * block_m) as u32;
        if m0 >= sq {
            return;
        }
        // Key position of query 0, and the key tiles this block can see: inline here, not through
        // `hopper::VisibleKeys` (with it ptxas spilled 40-64 bytes at d80 and d96, 2026-12-06).
        let shift = sk as i64 - sq as i64;
        let last_row = (m0 + block_m as u32 - 1).min(sq - 1) as i64;
        let hi = if p.causal != 0 { (last_row + shift + 1).max(0).min(sk as i64) as u32 } else { sk };
        let lo = if p.window_left >= 0 { (m0 as i64 + shift - p.window_left as i64).max(0) as u32 } else { 0 };
        let (tile_lo, tile_hi) = ((lo / BN as u32) as usize, hi.div_ceil(BN as u32) as usize);

        let smem = dynamic_shared_base();
        let q_s = smem;
        let k_s = |stage: usize| smem.offset(((block_m + stage * BN) * row_bytes(D)) as u32);
        let v_s = |stage: usize| smem.offset(((block_m + 2 * BN + stage * BN) * row_bytes(D)) as u32);
        let q_ptr = q.add((q0 * p.q_row_stride + (h * D) as u32) as usize);
        // The KV-cache entries are instantiations of their own, so the token-major ones keep
        // their register allocation (compile-time strides there).
        let kv_base = kv_offset::<CACHE, D>(b, kvh, k0, &p);
        let k_ptr = k.add(kv_base as usize);
        let v_ptr = v.add(kv_base as usize);
        let load_kv = |tile: usize, stage: usize| {
            let first = (tile * BN) as u32;
            let valid = sk.saturating_sub(first).min(BN as u32);
            let off = (first * p.k_row_stride) as usize;
            load_tile::<T, D, BN>(k_s(stage), k_ptr.add(off), p.k_row_stride, valid);
            load_tile::<T, D, BN>(v_s(stage), v_ptr.add(off), p.k_row_stride, valid);
        };

        load_tile::<T, D, BM>(q_s, q_ptr.add((m0 * p.q_row_stride) as usize), p.q_row_stride, sq - m0);
        if tile_lo < tile_hi {
            load_kv(tile_lo, 0);
        }
        commit_group();

        // Warp `w`'s query tile `t` holds block rows `t * 64 + w * 16 ..+ 16`.
        // ldmatrix row addresses: Q (A operand), K (n-major B), V (k-major B, transposed).
        let q_row = |t: usize| {
            q_s.offset(((t * WARPS * 16 + warp_id * 16 + lane % 16) * row_bytes(D) + (lane / 16) * 16) as u32)
        };
        let k_row = (lane % 8 + 8 * (lane / 16)) * row_bytes(D) + ((lane / 8) % 2) * 16;
        let v_row = (lane % 16) * row_bytes(D) + (lane / 16) * 16;

        // Scores stay raw q.k (log2 units = s * `units`) so the scaling folds into the exponent's FMA.
        let logits = Logits::of(&p);
        let units = logits.units;
        let mut qf = [[[0u32; 4]; 8]; 2];
        let mut o = [[[0.0f32; 4]; 32]; 2];
        let mut m = [[f32::NEG_INFINITY; 2]; 2];
        let mut l = [[0.0f32; 2]; 2];

        let mut tile = tile_lo;
        while tile < tile_hi {
            let stage = (tile - tile_lo) % 2;
            // One barrier per tile: after it, tile `tile` is visible to every warp and every
            // warp is done with the previous tile, whose stage the next copy then refills (it
            // lands while this tile is computed).
            wait_group::<0>();
            sync::sync_threads();
            if COPY_AT == COPY_AT_TOP && tile + 1 < tile_hi {
                load_kv(tile + 1, stage ^ 1);
                commit_group();
            }
            if Q_REGS && tile == tile_lo {
                unroll!(MI in [0, 1] {
                    if MI < MT {
                        unroll!(S in [0, 1, 2, 3, 4, 5, 6, 7] {
                            if S < ksteps {
                                qf[MI][S] = ldmatrix_x4(q_row(MI).offset((S * 32) as u32));
                            }
                        });
                    }
                });
            }

            // The tile is computed in sub-tiles of SUB keys: the score registers of SUB keys,
            // the barrier and copy granularity of BN.
            unroll!(HF in [0, 1, 2, 3] {
            if HF * SUB < BN {
                // Scores: this warp's MT x 16 rows x SUB keys. Each K fragment feeds every query tile.
                let mut s = [[[0.0f32; 4]; 8]; 2];
                unroll!(S in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                    if S < ksteps {
                        let mut a = [[0u32; 4]; 2];
                        unroll!(MI in [0, 1] {
                            if MI < MT {
                                a[MI] = if Q_REGS { qf[MI][S % 8] } else { ldmatrix_x4(q_row(MI).offset((S * 32) as u32)) };
                            }
                        });
                        unroll!(P in [0, 1, 2, 3] {
                            if P < SUB / 16 {
                                let bf = ldmatrix_x4(k_s(stage).offset((k_row + (HF * SUB + P * 16) * row_bytes(D) + S * 32) as u32));
                                unroll!(MI in [0, 1] {
                                    if MI < MT {
                                        s[MI][2 * P] = T::mma(s[MI][2 * P], a[MI], [bf[0], bf[1]]);
                                        s[MI][2 * P + 1] = T::mma(s[MI][2 * P + 1], a[MI], [bf[2], bf[3]]);
                                    }
                                });
                            }
                        });
                    }
                });

                if COPY_AT == COPY_AFTER_SCORES && HF == 0 && tile + 1 < tile_hi {
                    load_kv(tile + 1, stage ^ 1);
                    commit_group();
                }

                // Mask (and cap) where the tile is not fully visible to the whole block.
                let first_key = (tile * BN + HF * SUB) as u32;
                let full = first_key + SUB as u32 <= sk
                    && (p.causal == 0 || (first_key + SUB as u32 - 1) as i64 <= m0 as i64 + shift)
                    && (p.window_left < 0 || first_key as i64 >= last_row + shift - p.window_left as i64)
                    && !logits.prescaled;
                if !full {
                    unroll!(MI in [0, 1] {
                        if MI < MT {
                            let row0 = m0 as i64 + (MI * WARPS * 16 + warp_id * 16 + g) as i64;
                            unroll!(NT in [0, 1, 2, 3, 4, 5, 6, 7] {
                                if NT < SUB / 8 {
                                    unroll!(C in [0, 1, 2, 3] {
                                        let j = first_key as i64 + (8 * NT + 2 * qd + C % 2) as i64;
                                        let diag = row0 + 8 * (C / 2) as i64 + shift;
                                        s[MI][NT][C] = logits.masked(s[MI][NT][C], j, diag, sk, &p);
                                    });
                                }
                            });
                        }
                    });
                }

                // Online softmax per row (g and g + 8 of each tile; four lanes per row).
                let mut corr = [[1.0f32; 2]; 2];
                unroll!(MI in [0, 1] {
                    if MI < MT {
                        unroll!(RH in [0, 1] {
                            let mut mx = f32::NEG_INFINITY;
                            unroll!(NT in [0, 1, 2, 3, 4, 5, 6, 7] {
                                if NT < SUB / 8 {
                                    mx = mx.max(s[MI][NT][2 * RH]).max(s[MI][NT][2 * RH + 1]);
                                }
                            });
                            mx = mx.max(warp::shfl_xor_f32(mx, 1));
                            mx = mx.max(warp::shfl_xor_f32(mx, 2));
                            let (m_new, m_scaled, c) = logits.rescale(m[MI][RH], mx);
                            corr[MI][RH] = c;
                            let mut sum = 0.0f32;
                            unroll!(NT in [0, 1, 2, 3, 4, 5, 6, 7] {
                                if NT < SUB / 8 {
                                    unroll!(C in [0, 1] {
                                        let e = math::ex2_approx(math::fma(s[MI][NT][2 * RH + C], units, -m_scaled));
                                        s[MI][NT][2 * RH + C] = e;
                                        sum += e;
                                    });
                                }
                            });
                            l[MI][RH] = math::fma(l[MI][RH], corr[MI][RH], sum);
                            m[MI][RH] = m_new;
                        });
                    }
                });
                let moved =
                    (corr[0][0] != 1.0 || corr[0][1] != 1.0) || (MT > 1 && (corr[1][0] != 1.0 || corr[1][1] != 1.0));
                if warp::any(moved) {
                    unroll!(MI in [0, 1] {
                        if MI < MT {
                            unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                                if U < D / 8 {
                                    unroll!(C in [0, 1, 2, 3] {
                                        o[MI][U][C] *= corr[MI][C / 2];
                                    });
                                }
                            });
                        }
                    });
                }

                if COPY_AT == COPY_BEFORE_PV && HF == 0 && tile + 1 < tile_hi {
                    load_kv(tile + 1, stage ^ 1);
                    commit_group();
                }

                // O += P V: the score fragments of key tiles 2t, 2t + 1 are the A fragment of step t;
                // each V fragment feeds every query tile.
                unroll!(TT in [0, 1, 2, 3] {
                    if TT < SUB / 16 {
                        let mut a = [[0u32; 4]; 2];
                        unroll!(MI in [0, 1] {
                            if MI < MT {
                                a[MI] = [
                                    T::pack2(s[MI][2 * TT][0], s[MI][2 * TT][1]),
                                    T::pack2(s[MI][2 * TT][2], s[MI][2 * TT][3]),
                                    T::pack2(s[MI][2 * TT + 1][0], s[MI][2 * TT + 1][1]),
                                    T::pack2(s[MI][2 * TT + 1][2], s[MI][2 * TT + 1][3]),
                                ];
                            }
                        });
                        unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                            if U < D / 16 {
                                let bf = ldmatrix_x4_trans(v_s(stage).offset((v_row + (HF * SUB + TT * 16) * row_bytes(D) + U * 32) as u32));
                                unroll!(MI in [0, 1] {
                                    if MI < MT {
                                        o[MI][2 * U] = T::mma(o[MI][2 * U], a[MI], [bf[0], bf[1]]);
                                        o[MI][2 * U + 1] = T::mma(o[MI][2 * U + 1], a[MI], [bf[2], bf[3]]);
                                    }
                                });
                            }
                        });
                    }
                });
            }
            });
            tile += 1;
        }
        wait_group::<0>(); // no copy outlives the block (Q when no key tile is visible)

        // Normalize and write: rows g and g + 8, columns 2q, 2q + 1 of each 8-column tile.
        let sink = RowSink::of::<CACHE, D>(out, lse, !cu_q.is_null(), b, h, q0, &p);
        unroll!(MI in [0, 1] {
            if MI < MT {
                unroll!(RH in [0, 1] {
                    let i = m0 + (MI * WARPS * 16 + warp_id * 16 + g + 8 * RH) as u32;
                    sink.finish_row::<D>(i, sq, qd, l[MI][RH], m[MI][RH], &logits, |u| (o[MI][u][2 * RH], o[MI][u][2 * RH + 1]));
                });
            }
        });
    }
}

macro_rules! attention_entries {
    ($ty:ty, $cache:literal, $($name:ident: $d:literal);+ $(;)?) => {$(
        /// Attention forward; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            q: *const $ty, k: *const $ty, v: *const $ty, out: *mut $ty, lse: *mut f32,
            cu_q: *const i32, cu_k: *const i32, dims: Dims,
        ) {
            // SAFETY: forwarded launch contract.
            unsafe { attention_fwd::<$ty, $d, { block_m($d) }, { block_n($d) }, { sub_n($d) }, { m_tiles($d) }, { $d == 64 }, { copy_at($d) }, $cache>(q, k, v, out, lse, cu_q, cu_k, dims) }
        }
    )+};
}

attention_entries!(F16, false,
    attention_fwd_f16_d64: 64;
    attention_fwd_f16_d80: 80;
    attention_fwd_f16_d96: 96;
    attention_fwd_f16_d128: 128;
    attention_fwd_f16_d256: 256;
);
attention_entries!(Bf16, false,
    attention_fwd_bf16_d64: 64;
    attention_fwd_bf16_d80: 80;
    attention_fwd_bf16_d96: 96;
    attention_fwd_bf16_d128: 128;
    attention_fwd_bf16_d256: 256;
);
attention_entries!(F16, true,
    attention_fwd_cache_f16_d64: 64;
    attention_fwd_cache_f16_d80: 80;
    attention_fwd_cache_f16_d96: 96;
    attention_fwd_cache_f16_d128: 128;
    attention_fwd_cache_f16_d256: 256;
);
attention_entries!(Bf16, true,
    attention_fwd_cache_bf16_d64: 64;
    attention_fwd_cache_bf16_d80: 80;
    attention_fwd_cache_bf16_d96: 96;
    attention_fwd_cache_bf16_d128: 128;
    attention_fwd_cache_bf16_d256: 256;
);
