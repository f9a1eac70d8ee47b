//! Attention forward on Hopper's warpgroup tensor cores (`wgmma`; the sm_90a module only), the
//! same computation, layouts and launch contract as the mma.sync kernel in `mod.rs` for head
//! sizes 64, 128 and 256.
//!
//! A block is three warpgroups, FlashAttention-3's division of labour: warpgroup 0 copies, 1
//! and 2 compute, warpgroup `w` owning query rows `64 (w - 1)..64 w` of the block's
//! [`HOPPER_BLOCK_M`]. The producer gives up registers (`setmaxnreg`) to the consumers.
//! - The producer copies Q, then each key tile's K and V into a ring of [`hopper_stages`] stages
//!   in the 128-byte-swizzle layout `wgmma` reads, in blocks of 64 columns: tensor copies (TMA,
//!   one thread issues them through the maps the host encoded), except a sequence's partial last
//!   key tile, which all 128 threads copy with `cp.async`, zero-filling the rows past the
//!   sequence. A stage's K and V each have an `mbarrier` that completes when their copies have
//!   landed (the tensor copies' bytes, or `cp.async.mbarrier.arrive`), and the producer waits for
//!   the consumers to release a stage's K (after its scores) or V (after its `P V`) before
//!   refilling it.
//! - Each consumer, per key tile: `S = Q K^T` with both operands in shared memory (64 f32
//!   registers per thread), issued together with `O += P V` of the previous tile (P, that
//!   tile's probabilities, in registers as the A operand; V read MN-major, transposed by the
//!   instruction); the masking and online softmax of this tile run under that `P V`; then the
//!   previous tile's stage is released, O rescaled and P packed.
//! - The output, normalized, goes through shared memory (each warp's rows of the Q tile, which
//!   its last scores no longer need) so that the stores are whole 16-byte pieces of rows.
//!
//! The consumers never meet at a block barrier; they take turns issuing their GEMMs (two named
//! barriers, FlashAttention-3's ping-pong), so one's softmax overlaps the other's GEMMs.
//!
//! # Launch contract: `attention_fwd{,_cache}_wgmma_{f16,bf16}_d{64,128,256}`
//! As `attention_fwd{,_cache}_*` (module docs of `mod.rs`), with the tensor maps of Q, K and V
//! first (by value, 64-byte aligned; the host's `hopper_maps`: 128-byte swizzle, boxes of 64
//! columns by 128 query rows or [`hopper_block_n`] key rows of one head; Q and token-major K/V
//! as `[rows, heads, D]`, a cache's K/V as `[batch, kv_heads, capacity, D]`), then the
//! pointers and `Dims`, whose `q` the kernel no longer reads; grid
//! `(ceil(max_seqlen_q / 128), H, batch)`, block `(384, 1, 1)` (`.maxntid`), dynamic shared memory
//! [`hopper_shared_bytes`](super::layout::hopper_shared_bytes)`(D)` (over 48 KiB: the launcher raises the function's limit); a
//! Hopper GPU running the sm_90a module. Causal launches visit the row blocks from the last
//! (the longest) to the first.

use super::layout::{HOPPER_BLOCK_M, hopper_block_n, hopper_stages};
use super::{Dims, Logits, RowSink, kv_offset, sequence_rows};
use crate::device::async_copy::{arrive_when_landed, commit_group, cp_async_16_zfill, wait_group};
use crate::device::memory::st_global_v4;
use crate::device::shared::{dynamic_shared_base, ld_shared_v4, st_shared_u32};
use crate::device::tma::{self, TensorMapParam};
use crate::device::wgmma::{
    self, SharedMatrix, fence_proxy_async_shared, mma_async_k16_register_a_mn_b, mma_async_k16_shared,
    pin_accumulators_f32,
};
use crate::device::{SharedAddr, index, math, mbarrier, sync, warp};
use crate::element::{Bf16, F16, TensorElement};
use crate::unroll;

/// Bytes of one swizzled row: 64 halves.
const SWIZZLE_ROW: usize = 128;

/// Threads of the producer warpgroup, and of each consumer.
const PRODUCER_THREADS: usize = 128;

/// Registers per thread after the hand-over: the producer's and the consumers'
/// (128 x 24 + 256 x 240 <= 65536).
const PRODUCER_REGISTERS: u32 = 24;
const CONSUMER_REGISTERS: u32 = 240;

/// The keys a block of query rows `m0..m0 + rows` (of `sq`, with `sk` keys) can see.
#[derive(Clone, Copy)]
struct VisibleKeys {
    /// Key position of query 0 (bottom-right alignment).
    shift: i64,
    /// The block's last query row.
    last_row: i64,
    /// Keys `lo..hi`.
    lo: u32,
    hi: u32,
}

impl VisibleKeys {
    #[inline(always)]
    fn of(m0: u32, rows: u32, sq: u32, sk: u32, p: &Dims) -> Self {
        let shift = sk as i64 - sq as i64;
        let last_row = (m0 + rows - 1).min(sq - 1) as i64;
        let hi = if p.causal != 0 { (last_row + shift + 1).max(0).min(sk as i64) as u32 } else { sk };
        let lo = if p.window_left >= 0 { (m0 as i64 + shift - p.window_left as i64).max(0) as u32 } else { 0 };
        VisibleKeys { shift, last_row, lo, hi }
    }

    /// Whether keys `first..first + n` are visible to every row of the block `m0..`.
    #[inline(always)]
    fn all_visible(&self, first: u32, n: u32, m0: u32, sk: u32, p: &Dims) -> bool {
        first + n <= sk
            && (p.causal == 0 || (first + n - 1) as i64 <= m0 as i64 + self.shift)
            && (p.window_left < 0 || first as i64 >= self.last_row + self.shift - p.window_left as i64)
    }
}

/// Copies `ROWS` rows of `D` halves from `src` (rows `stride` elements apart) into the swizzled
/// tile at `dst` (`D / 64` blocks of `[ROWS][128 bytes]`), zero-filling rows at or past `valid`;
/// the producer's 128 threads, each one 16-byte column chunk walking down the rows. A pass
/// covers at most 16 chunks of a row, so that it moves down by a multiple of the swizzle
/// period (8 rows: each thread's swizzled column stays the same); at head size 256 two sweeps
/// cover the two halves of the row.
///
/// # Safety
/// Rows below `valid` must be readable; `src` a 16-byte aligned global address, `stride` a
/// multiple of 8; `dst` 1024-byte aligned.
#[inline(always)]
// The unrolled walk advances `from` after its last copy too (dead, removed by the optimizer).
#[allow(unused_assignments)]
unsafe fn load_swizzled<T, const D: usize, const ROWS: usize>(dst: SharedAddr, src: *const T, stride: u32, valid: u32) {
    let chunks = D / 8;
    let per_pass = if chunks > 16 { 16 } else { chunks };
    let rows_per_pass = PRODUCER_THREADS / per_pass; // 16 or 8: a multiple of the swizzle period
    const { assert!(D / 8 <= 32 && ROWS <= 16 * 8) };
    let tid = index::thread_idx_x() as usize % PRODUCER_THREADS;
    let (r0, c0) = (tid / per_pass, tid % per_pass);
    let step = (rows_per_pass as u32 * stride) as usize;
    unroll!(SWEEP in [0, 1] {
        if SWEEP * per_pass < chunks {
            let c = c0 + SWEEP * per_pass;
            let dst = dst.offset(((c / 8) * ROWS * SWIZZLE_ROW) as u32 + SharedMatrix::swizzle128_offset(r0, c % 8));
            // SAFETY: offsets fit in 32 bits (the host bounds every tensor by i32::MAX elements).
            let mut from = unsafe { src.add((r0 as u32 * stride + (c * 8) as u32) as usize) };
            unroll!(IT in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                if IT * rows_per_pass < ROWS {
                    let ok = ((r0 + IT * rows_per_pass) as u32) < valid;
                    // SAFETY: rows below `valid` are readable; others copy 0 bytes from the base.
                    unsafe {
                        cp_async_16_zfill(dst.offset((IT * rows_per_pass * SWIZZLE_ROW) as u32), if ok { from } else { src }.cast(), if ok { 16 } else { 0 });
                        from = from.wrapping_add(step);
                    }
                }
            });
        }
    });
}

/// The kernel. `S` = score registers per thread (`BN / 2`), `O` = output registers (`D / 2`),
/// `PK` = K steps of `P V` (`BN / 16`), `STAGES` = stages of the K/V ring.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_fwd_wgmma<
    T: TensorElement,
    const BF16: bool,
    const D: usize,
    const BN: usize,
    const S: usize,
    const O: usize,
    const PK: usize,
    const STAGES: usize,
    const CACHE: bool,
>(
    maps: TileMaps,
    k: *const T,
    v: *const T,
    out: *mut T,
    lse: *mut f32,
    cu_q: *const i32,
    cu_k: *const i32,
    p: Dims,
) {
    const { assert!(S == BN / 2 && O == D / 2 && PK == BN / 16 && D % 64 == 0 && (STAGES == 2 || STAGES == 3)) };
    let bm = HOPPER_BLOCK_M;
    let row_blocks = index::grid_dim_x() as usize;
    let mb = if p.causal != 0 { row_blocks - 1 - index::block_idx_x() as usize } else { index::block_idx_x() as usize };
    let h = index::block_idx_y() as usize;
    let b = index::block_idx_z() as usize;
    let tid = index::thread_idx_x() as usize;
    // Warpgroup 0 copies; consumer `group` (0 or 1) is warpgroup `group + 1`.
    let (warpgroup, warp_in_group, lane) = (tid / 128, (tid / 32) % 4, index::lane_id() as usize);
    let group = warpgroup.wrapping_sub(1);
    let (g, qd) = (lane / 4, lane % 4);
    let kvh = h / (p.heads / p.kv_heads.max(1)).max(1) as usize;

    // SAFETY (whole body): the launch contract sizes every buffer; copies past a sequence are
    // zero-filled, never read; barriers and warpgroup-collective instructions are reached by
    // all threads (loop bounds depend only on the block).
    unsafe {
        let [q0, q1, k0, k1] = sequence_rows::<CACHE>(b, cu_q, cu_k, &p);
        let (sq, sk) = (q1.saturating_sub(q0), k1.saturating_sub(k0));
        let m0 = (mb * bm) as u32;
        if m0 >= sq {
            return;
        }
        let keys = VisibleKeys::of(m0, bm as u32, sq, sk, &p);
        let (tile_lo, tile_hi) = ((keys.lo / BN as u32) as usize, keys.hi.div_ceil(BN as u32) as usize);

        let tile_bytes = |rows: usize| (rows * D * 2) as u32;
        let q_s = SharedMatrix::atom_aligned(dynamic_shared_base());
        let k_s = |stage: usize| q_s.offset(tile_bytes(bm + 2 * stage * BN));
        let v_s = |stage: usize| q_s.offset(tile_bytes(bm + (2 * stage + 1) * BN));
        // The mbarriers, after the tiles: Q landed; then per stage K landed, V landed, K
        // released and V released (K and V apart: a stage's next K may land while its V is
        // still read).
        let bars = q_s.offset(tile_bytes(bm + 2 * STAGES * BN));
        let q_landed = bars;
        let barrier = |kind: usize, stage: usize| bars.offset((8 + 8 * (kind * STAGES + stage)) as u32);
        let k_landed = |stage: usize| barrier(0, stage);
        let v_landed = |stage: usize| barrier(1, stage);
        let k_released = |stage: usize| barrier(2, stage);
        let v_released = |stage: usize| barrier(3, stage);
        if tid == 0 {
            mbarrier::init(q_landed, PRODUCER_THREADS as u32);
            unroll!(ST in [0, 1, 2] {
                if ST < STAGES {
                    mbarrier::init(k_landed(ST), PRODUCER_THREADS as u32);
                    mbarrier::init(v_landed(ST), PRODUCER_THREADS as u32);
                    mbarrier::init(k_released(ST), 2 * PRODUCER_THREADS as u32);
                    mbarrier::init(v_released(ST), 2 * PRODUCER_THREADS as u32);
                }
            });
        }
        sync::sync_threads();

        if warpgroup == 0 {
            // The producer: Q, then each tile's K and V into stage `i % STAGES`, each once the
            // consumers have released that stage's previous K or V (tile `i - STAGES`). Thread
            // 0 issues the tensor copies (TMA), announcing their bytes on the stage's barrier,
            // and the other 127 arrive; a sequence's last tile, if it is partial, is copied by
            // all 128 with `cp.async`, zero-filling the rows past the sequence (a tensor copy
            // would bring whatever lies there: the next sequence, or a cache's unwritten rows,
            // which may hold NaNs that a zero probability does not cancel).
            sync::release_registers::<PRODUCER_REGISTERS>();
            let leader = tid == 0;
            if leader {
                tma::prefetch(maps.q);
                tma::prefetch(maps.k);
                tma::prefetch(maps.v);
            }
            // Box `J` (64 columns) of a tile of `rows` rows at `dst`.
            let column_block = |dst: SharedAddr, rows: usize, j: usize| dst.offset((j * rows * SWIZZLE_ROW) as u32);
            if leader {
                mbarrier::arrive_expect_tx(q_landed, tile_bytes(bm));
                unroll!(J in [0, 1, 2, 3] {
                    if J < D / 64 {
                        // Rows past the sequence are other rows' (or, past the tensor, zeros):
                        // each output row depends on its own query row alone, and rows past the
                        // sequence are never written.
                        tma::load_3d(column_block(q_s, bm, J), maps.q, 64 * J as i32, h as i32, (q0 + m0) as i32, q_landed);
                    }
                });
            } else {
                mbarrier::arrive(q_landed);
            }
            let kv_base = kv_offset::<CACHE, D>(b, kvh, k0, &p);
            let (k_ptr, v_ptr) = (k.add(kv_base as usize), v.add(kv_base as usize));
            // Copies tile `first..first + BN` of `map` (or from `src`, zero-filled past `valid`
            // rows) into `dst` and arrives on `bar`.
            let copy_tile = |dst: SharedAddr, map: u64, src: *const T, first: u32, valid: u32, bar: SharedAddr| {
                if valid < BN as u32 {
                    load_swizzled::<T, D, BN>(dst, src.add((first * p.k_row_stride) as usize), p.k_row_stride, valid);
                    arrive_when_landed(bar);
                } else if leader {
                    mbarrier::arrive_expect_tx(bar, tile_bytes(BN));
                    unroll!(J in [0, 1, 2, 3] {
                        if J < D / 64 {
                            let col = 64 * J as i32;
                            if CACHE {
                                tma::load_4d(column_block(dst, BN, J), map, col, first as i32, kvh as i32, b as i32, bar);
                            } else {
                                tma::load_3d(column_block(dst, BN, J), map, col, kvh as i32, (k0 + first) as i32, bar);
                            }
                        }
                    });
                } else {
                    mbarrier::arrive(bar);
                }
            };
            for tile in tile_lo..tile_hi {
                let i = tile - tile_lo;
                let stage = i % STAGES;
                let reuse = ((i / STAGES).wrapping_sub(1) & 1) as u32;
                let first = (tile * BN) as u32;
                let valid = sk.saturating_sub(first).min(BN as u32);
                if i >= STAGES {
                    mbarrier::wait_parity(k_released(stage), reuse);
                }
                copy_tile(k_s(stage), maps.k, k_ptr, first, valid, k_landed(stage));
                if i >= STAGES {
                    mbarrier::wait_parity(v_released(stage), reuse);
                }
                copy_tile(v_s(stage), maps.v, v_ptr, first, valid, v_landed(stage));
            }
            // No `cp.async` outlives the block (the tensor copies land before the consumers'
            // last waits, which the block outlives).
            commit_group();
            wait_group::<0>();
            return;
        }
        sync::claim_registers::<CONSUMER_REGISTERS>();
        // Always: the epilogue reuses the Q tile, which must have landed first.
        mbarrier::wait_parity(q_landed, 0);

        // K step `ks` (16 columns of D) of this warpgroup's Q rows and of a K tile: block
        // `ks / 4` of 64 columns, then 32 bytes per step within the swizzle row. (Descriptors
        // are rebuilt from 32-bit addresses at each use: their high words are constants, so
        // each costs one register for one instruction, not a hoisted register pair.)
        let q_w = q_s.offset((group * 64 * SWIZZLE_ROW) as u32);
        let q_step = |ks: usize| ((ks / 4) * bm * SWIZZLE_ROW + 32 * (ks % 4)) as u32;
        let k_step = |ks: usize| ((ks / 4) * BN * SWIZZLE_ROW + 32 * (ks % 4)) as u32;
        // K step `kk` (16 keys) of a V tile, read MN-major: column blocks BN rows apart.
        let v_step = |kk: usize| (kk * 16 * SWIZZLE_ROW) as u32;
        let logits = Logits::of(&p);
        let units = logits.units;
        // This thread's rows (block-relative): g and g + 8 of its warp's 16.
        let row_base = group * 64 + warp_in_group * 16 + g;

        let mut s = [0.0f32; S];
        let mut o = wgmma::zeroed_accumulators_f32::<O>();
        let mut pf = [[0u32; 4]; PK];
        let mut m = [f32::NEG_INFINITY; 2];
        let mut l = [0.0f32; 2];

        // Waits until tile `tile`'s K (or V) has landed in its stage; the caller then orders the
        // copies' (generic-proxy) writes before its `wgmma` reads.
        macro_rules! landed {
            ($barrier:ident, $tile:expr) => {{
                let i: usize = $tile - tile_lo;
                mbarrier::wait_parity($barrier(i % STAGES), ((i / STAGES) & 1) as u32);
            }};
        }
        // Tile `tile`'s K (or V) is done with: its stage's next K (V) may be copied.
        macro_rules! release {
            ($barrier:ident, $tile:expr) => {{
                let tile: usize = $tile;
                mbarrier::arrive($barrier((tile - tile_lo) % STAGES));
            }};
        }
        // Issues S = Q K^T of tile `tile` (one wgmma group; the caller commits).
        macro_rules! issue_scores { ($tile:expr) => {{
            let tile: usize = $tile;
            let k_tile = k_s((tile - tile_lo) % STAGES);
            unroll!(KS in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                if KS < D / 16 {
                    if KS == 0 {
                        mma_async_k16_shared::<BF16, S, false>(&mut s, SharedMatrix::k_major_swizzle128(q_w.offset(q_step(KS))), SharedMatrix::k_major_swizzle128(k_tile.offset(k_step(KS))));
                    } else {
                        mma_async_k16_shared::<BF16, S, true>(&mut s, SharedMatrix::k_major_swizzle128(q_w.offset(q_step(KS))), SharedMatrix::k_major_swizzle128(k_tile.offset(k_step(KS))));
                    }
                }
            });
        }}; }
        // Issues O += P V of tile `tile`.
        macro_rules! issue_pv { ($tile:expr) => {{
            let tile: usize = $tile;
            let v_tile = v_s((tile - tile_lo) % STAGES);
            unroll!(KK in [0, 1, 2, 3, 4, 5, 6, 7] {
                if KK < PK {
                    mma_async_k16_register_a_mn_b::<BF16, O>(&mut o, pf[KK], SharedMatrix::mn_major_swizzle128(v_tile.offset(v_step(KK)), (BN * SWIZZLE_ROW) as u32));
                }
            });
        }}; }
        // Masks (and caps) tile `tile`'s scores where the tile is not visible to the whole block,
        // then the online softmax per row (four lanes per row), in place: S becomes the tile's
        // unnormalized probabilities. Returns the factors that rescale O.
        macro_rules! softmax { ($tile:expr) => {{
            let tile: usize = $tile;
            let first_key = (tile * BN) as u32;
            if !(keys.all_visible(first_key, BN as u32, m0, sk, &p) && !logits.prescaled) {
                unroll!(RH in [0, 1] {
                    let diag = m0 as i64 + (row_base + 8 * RH) as i64 + keys.shift;
                    if D <= 128 {
                        // Column 8 J + 2 qd + C of the tile is visible iff lo <= it < hi: compared
                        // as 8 J + C (a constant) against bounds less this lane's 2 qd (half the
                        // instructions of the per-key test; at head size 256 its two extra live
                        // bounds made ptxas spill more, so that size keeps the per-key test).
                        let (lo, hi) = Logits::visible_range(first_key, BN as u32, diag, sk, &p);
                        let (lo, hi) = (lo - 2 * qd as i32, hi - 2 * qd as i32);
                        unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                            if J < BN / 8 {
                                unroll!(C in [0, 1] {
                                    let c = (8 * J + C) as i32;
                                    let x = logits.scaled(s[4 * J + 2 * RH + C], &p);
                                    s[4 * J + 2 * RH + C] = if c >= lo && c < hi { x } else { f32::NEG_INFINITY };
                                });
                            }
                        });
                    } else {
                        unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                            if J < BN / 8 {
                                unroll!(C in [0, 1] {
                                    let j = first_key as i64 + (8 * J + 2 * qd + C) as i64;
                                    s[4 * J + 2 * RH + C] = logits.masked(s[4 * J + 2 * RH + C], j, diag, sk, &p);
                                });
                            }
                        });
                    }
                });
            }
            let mut corr = [1.0f32; 2];
            unroll!(RH in [0, 1] {
                let mut mx = f32::NEG_INFINITY;
                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                    if J < BN / 8 {
                        mx = mx.max(s[4 * J + 2 * RH]).max(s[4 * J + 2 * RH + 1]);
                    }
                });
                mx = mx.max(warp::shfl_xor_f32(mx, 1));
                mx = mx.max(warp::shfl_xor_f32(mx, 2));
                let (m_new, m_scaled, c) = logits.rescale(m[RH], mx);
                corr[RH] = c;
                let mut sum = 0.0f32;
                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                    if J < BN / 8 {
                        unroll!(C in [0, 1] {
                            let e = math::ex2_approx(math::fma(s[4 * J + 2 * RH + C], units, -m_scaled));
                            s[4 * J + 2 * RH + C] = e;
                            sum += e;
                        });
                    }
                });
                l[RH] = math::fma(l[RH], corr[RH], sum);
                m[RH] = m_new;
            });
            corr
        }}; }
        // The probabilities as `P V`'s A fragments: K step `kk` is score tiles 2 kk, 2 kk + 1.
        macro_rules! pack { () => {{
            unroll!(KK in [0, 1, 2, 3, 4, 5, 6, 7] {
                if KK < PK {
                    pf[KK] = [
                        T::pack2(s[8 * KK], s[8 * KK + 1]),
                        T::pack2(s[8 * KK + 2], s[8 * KK + 3]),
                        T::pack2(s[8 * KK + 4], s[8 * KK + 5]),
                        T::pack2(s[8 * KK + 6], s[8 * KK + 7]),
                    ];
                }
            });
        }}; }

        // Ping-pong (FlashAttention-3): the consumers take turns issuing their GEMMs, each
        // waiting at its own named barrier for the other to have issued, so that one's softmax
        // runs while the other's GEMMs hold the tensor cores. Both issue the same number of
        // times (the block's tiles plus one); consumer 0 goes first.
        let take_turn = || {
            if group == 0 {
                sync::sync_named::<1, { 2 * PRODUCER_THREADS as u32 }>()
            } else {
                sync::sync_named::<2, { 2 * PRODUCER_THREADS as u32 }>()
            }
        };
        let pass_turn = || {
            if group == 0 {
                sync::arrive_named::<2, { 2 * PRODUCER_THREADS as u32 }>()
            } else {
                sync::arrive_named::<1, { 2 * PRODUCER_THREADS as u32 }>()
            }
        };
        if tile_lo < tile_hi {
            if group == 1 {
                sync::arrive_named::<1, { 2 * PRODUCER_THREADS as u32 }>();
            }
            // The first tile: scores alone (O is still zero).
            landed!(k_landed, tile_lo);
            fence_proxy_async_shared();
            take_turn();
            wgmma::fence();
            issue_scores!(tile_lo);
            wgmma::commit_group();
            pass_turn();
            wgmma::wait_group::<0>();
            pin_accumulators_f32(&mut s);
            release!(k_released, tile_lo);
            softmax!(tile_lo);
            pack!();

            // Then per tile: its scores and the previous tile's `P V` in flight together; the
            // softmax of its scores runs under that `P V`.
            for tile in tile_lo + 1..tile_hi {
                landed!(k_landed, tile);
                landed!(v_landed, tile - 1);
                fence_proxy_async_shared();
                take_turn();
                wgmma::fence();
                issue_scores!(tile);
                wgmma::commit_group();
                issue_pv!(tile - 1);
                wgmma::commit_group();
                pass_turn();
                wgmma::wait_group::<1>();
                pin_accumulators_f32(&mut s);
                release!(k_released, tile);
                let corr = softmax!(tile);
                wgmma::wait_group::<0>();
                pin_accumulators_f32(&mut o);
                release!(v_released, tile - 1);
                if warp::any(corr[0] != 1.0 || corr[1] != 1.0) {
                    unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                        if U < D / 8 {
                            unroll!(C in [0, 1, 2, 3] {
                                o[4 * U + C] *= corr[C / 2];
                            });
                        }
                    });
                }
                pack!();
            }

            landed!(v_landed, tile_hi - 1);
            fence_proxy_async_shared();
            take_turn();
            wgmma::fence();
            issue_pv!(tile_hi - 1);
            wgmma::commit_group();
            pass_turn();
            wgmma::wait_group::<0>();
            pin_accumulators_f32(&mut o);
        }

        // Normalize, then write through shared memory: each warp stages its 16 rows in its own
        // rows of the Q tile (free once the warpgroup's last scores are done; a 128-byte row of
        // each 64-column block, 16-byte chunks XOR-swizzled by the row so that neither the
        // fragment writes nor the row reads conflict), then stores whole rows in 16-byte
        // pieces: a warp's store covers 512 contiguous bytes where the fragments' covered 8
        // rows x 16 bytes, and there are a quarter as many stores to drain before the block
        // can exit (ncu, H200, B16 H16 S2048 d128: 11% of a consumer warp's time went to the
        // fragment-wise epilogue, 4.7% of it waiting at exit for the stores to drain).
        let sink = RowSink::of::<CACHE, D>(out, lse, !cu_q.is_null(), b, h, q0, &p);
        let warp_rows = group * 64 + warp_in_group * 16; // the warp's first row in the block
        let staged = |kb: usize, r: usize, chunk: usize| {
            q_s.offset(((kb * bm + warp_rows + r) * SWIZZLE_ROW + 16 * (chunk ^ (r % 8))) as u32)
        };
        unroll!(RH in [0, 1] {
            let r = g + 8 * RH; // the row within the warp's 16
            let sum = RowSink::<T>::row_total(l[RH]);
            let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
            let i = m0 + (warp_rows + r) as u32;
            if qd == 0 && i < sq {
                sink.write_lse(i, m[RH], sum, &logits);
            }
            unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31] {
                if U < D / 8 {
                    let packed = T::pack2(o[4 * U + 2 * RH] * inv, o[4 * U + 2 * RH + 1] * inv);
                    st_shared_u32(staged(U / 8, r, U % 8).offset(4 * qd as u32), packed);
                }
            });
        });
        sync::sync_warp();
        // 16 rows of D / 8 chunks: D / 16 passes of the warp's 32 lanes.
        unroll!(IT in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            if IT < D / 16 {
                let at = IT * 32 + lane;
                let (r, c) = (at / (D / 8), at % (D / 8));
                let i = m0 + (warp_rows + r) as u32;
                let chunk = ld_shared_v4(staged(c / 8, r, c % 8));
                if i < sq {
                    st_global_v4(sink.row(i).add(8 * c).cast(), chunk);
                }
            }
        });
    }
}

/// The generic addresses of an entry's tensor maps (its first three parameters).
#[derive(Clone, Copy)]
struct TileMaps {
    q: u64,
    k: u64,
    v: u64,
}

macro_rules! hopper_entries {
    ($ty:ty, $bf16:literal, $cache:literal, $($name:ident: $d:literal);+ $(;)?) => {$(
        crate::entry_directive!($name, ".maxntid 384, 1, 1");
        crate::tensor_map_param!($name, 0);
        crate::tensor_map_param!($name, 1);
        crate::tensor_map_param!($name, 2);
        /// Attention forward on `wgmma`; see the module docs for the launch contract.
        ///
        /// # Safety
        /// The launch contract in the module docs.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            _q_map: TensorMapParam, _k_map: TensorMapParam, _v_map: TensorMapParam,
            _q: *const $ty, k: *const $ty, v: *const $ty, out: *mut $ty, lse: *mut f32,
            cu_q: *const i32, cu_k: *const i32, dims: Dims,
        ) {
            const BN: usize = hopper_block_n($d);
            let maps = TileMaps {
                q: crate::kernel_param_address!(concat!(stringify!($name), "_param_0")),
                k: crate::kernel_param_address!(concat!(stringify!($name), "_param_1")),
                v: crate::kernel_param_address!(concat!(stringify!($name), "_param_2")),
            };
            // SAFETY: forwarded launch contract.
            unsafe {
                attention_fwd_wgmma::<$ty, $bf16, $d, BN, { BN / 2 }, { $d / 2 }, { BN / 16 }, { hopper_stages($d) }, $cache>(
                    maps, k, v, out, lse, cu_q, cu_k, dims,
                )
            }
        }
    )+};
}

hopper_entries!(F16, false, false,
    attention_fwd_wgmma_f16_d64: 64;
    attention_fwd_wgmma_f16_d128: 128;
    attention_fwd_wgmma_f16_d256: 256;
);
hopper_entries!(Bf16, true, false,
    attention_fwd_wgmma_bf16_d64: 64;
    attention_fwd_wgmma_bf16_d128: 128;
    attention_fwd_wgmma_bf16_d256: 256;
);
hopper_entries!(F16, false, true,
    attention_fwd_cache_wgmma_f16_d64: 64;
    attention_fwd_cache_wgmma_f16_d128: 128;
    attention_fwd_cache_wgmma_f16_d256: 256;
);
hopper_entries!(Bf16, true, true,
    attention_fwd_cache_wgmma_bf16_d64: 64;
    attention_fwd_cache_wgmma_bf16_d128: 128;
    attention_fwd_cache_wgmma_bf16_d256: 256;
);
