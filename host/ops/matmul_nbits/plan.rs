//! The W4A16 planner: shape, SM count and architecture in, the kernels to launch out (which
//! entry, grid, K splits, workspace), validated. Pure: no device, no pointers beyond their
//! alignment ([`RowAlignment`]); [`super::launch`] runs what it plans. `Y [M, N] = A [M, K] W^T
//! (+ bias)` with `W` given as ONNX Runtime's 4-bit blocks (see [`super::pack`] for the format);
//! device code in `kernels-gpu/src/matmul_nbits/`.
//!
//! Tensor-core kernels: for small M, `decode8` / `decode16` (the common case: integer zero
//! points, blocks >= 128, 16-byte rows) or else `small` stream the weights once per 8- or
//! 16-row tile of A, 4 warps splitting K, activations straight from global memory. For larger M,
//! `tiled` (integer zero points, blocks >= 32, 16-byte rows of B) reuses each dequantized weight
//! over 32 to 128 rows, fed by a `cp.async` ring; it reads A from a copy permuted into the
//! weights' K order (`permute`, in the workspace). On Hopper, `wgmma` (the same needs) takes
//! M > 32 from the same permuted copy, the weights dequantized straight into the register
//! operand of the warpgroup tensor cores. `large` (128 x 128 tiles, A staged per chunk) takes
//! the rest. Over B repacked once ([`Variant::Packed`]), the `decode*_packed` kernels, or on
//! Hopper for M > 8 with N wide enough to fill the GPU, `packed_wgmma16` (each chunk's
//! activations staged once per block as the tensor cores' shared-memory operand). Any of them
//! but `packed_wgmma16` may split K over several blocks when the output tiles alone cannot fill
//! the GPU; the partial sums then go through an f32 workspace and a reduction
//! kernel, except on Hopper for two splits of `wgmma` and up to eight of `small` and the
//! `decode*` kernels, which run as a cluster of the splits that sum through distributed shared
//! memory. Where `wgmma`'s whole tiles would leave much of the
//! last wave idle, `wgmma_streamk` gives each SM an equal share of all tiles' K chunks instead
//! ([`Variant::WgmmaStreamK`]).

use super::layout::{
    self, CHUNK, COOK_THREADS, DECODE, DECODE_COLUMNS, DECODE_SHARED_BYTES, DECODE_WARPS, DECODE_WIDE, DECODE8_ROWS,
    DECODE16_WIDE, Dims, ElementType, Entry, FINE_STEP, FLAG_A_VEC16, FLAG_B_VEC16, FLAG_BIAS, FLAG_ZERO_T,
    FLAG_ZERO_U8, LARGE, LARGE_SHARED_BYTES, MAX_CLUSTER_SPLITS, PACKED_MIN_BLOCK, PACKED_WGMMA_COLUMNS,
    PACKED_WGMMA_SHARED_BYTES, PACKED_WGMMA_THREADS, PERMUTE_THREADS, PREFILL_BM, PREFILL_BN, PREFILL_SHARED_BYTES,
    PREFILL_THREADS, REDUCE_THREADS, SMALL, TILED_MIN_BLOCK, TILED32X128, TILED64X128, TILED128X128, Tiling, WGMMA_BM,
    WGMMA_BN, WGMMA_SHARED_BYTES, WGMMA_STREAMK_SLOT_BYTES, WGMMA_THREADS, cooked_consts_bytes,
    decode_packed_shared_bytes, packed_record_bytes, prefill_image_bytes, prefill_image_rows, tiled_shared_bytes,
    wgmma_streamk_workspace_bytes,
};
use super::pack::valid_block_size;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::LaunchDims;

/// The family's name in error messages.
pub(super) const KERNEL: &str = "matmul_nbits";

/// `PackedWgmma` plans with this tiling: 8 warps, 128 columns, 16 rows (`block_m` is unused).
const PACKED_WGMMA: Tiling = Tiling { mt: 1, nt: PACKED_WGMMA_COLUMNS / 8, wm: 1, wn: 1, wk: 8 };
const _: () = assert!(PACKED_WGMMA.threads() == PACKED_WGMMA_THREADS && PACKED_WGMMA.block_n() == PACKED_WGMMA_COLUMNS);

/// `Prefill` plans with this tiling: 256 rows of A x 128 columns, 12 warps (`prefill`'s
/// producer and two consumer warpgroups).
const PREFILL: Tiling = Tiling { mt: 16, nt: 16, wm: 1, wn: 1, wk: 12 };
const _: () =
    assert!(PREFILL.block_m() == PREFILL_BM && PREFILL.block_n() == PREFILL_BN && PREFILL.threads() == PREFILL_THREADS);

// `Variant::Wgmma` plans with `tiled128x128`'s tiling: the same block tile and threads.
const _: () = assert!(
    WGMMA_BM == TILED128X128.block_m() && WGMMA_BN == TILED128X128.block_n() && WGMMA_THREADS == TILED128X128.threads()
);

/// `wgmma` takes M above this (when the GPU runs it); `tiled` below.
pub const WGMMA_MIN_M: usize = 32;

/// Largest M for the small-M kernels (`decode*`, `small`): they read the weights once per 16
/// rows, which `tiled` beats from here on.
pub const SMALL_MAX_M: usize = 16;

/// How the zero points are given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroPointKind {
    /// None: 8 for every block.
    Default,
    /// u8 `[N, ceil(k_blocks / 2)]`, two blocks per byte (low nibble first).
    PackedU8,
    /// `[N, k_blocks]` in A's type (may be fractional).
    Typed,
}

/// Which kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Block tile 16 x 32 (8 x 32 for M <= 8), 4 warps splitting K: small M.
    Small,
    /// Block tile 128 x 128 (8 warps), A staged per K chunk: large M, any zero points, any
    /// alignment.
    Large,
    /// Block tile 32, 64 or 128 x 128 (8 warps), a `cp.async` ring over permuted A and the packed
    /// weights: large M with integer zero points and blocks of at least 32. Runs `Large` when
    /// the rows of B are not 16-byte aligned.
    Tiled,
    /// B repacked by [`crate::ops::matmul_nbits::pack::MatMulNBitsWeights::pack_for_decode`] (then passed as `b`; the
    /// scales and zero points are read from it): M <= 16, integer zero points, blocks of at
    /// least 16 (below 128 the fine records, a scale per 32 K, and for blocks of 16 the fine16
    /// records, whose kernels round the weights to T), 16-byte aligned A and B. The
    /// planner runs [`Variant::PackedWgmma`] where the GPU has `wgmma`, blocks are of at least
    /// 128, M > 8, `ceil(N / 128)` is at least the SM count (measured faster there) and K is
    /// not split by force, else [`Variant::PackedMma`]; the plan names the one it runs.
    Packed,
    /// [`Variant::Packed`] on the `mma.sync` decode kernels (`decode*_packed`: 4 warps per
    /// 32 columns splitting K), on any GPU.
    PackedMma,
    /// [`Variant::Packed`] on Hopper's warpgroup tensor cores (the sm_90a module only,
    /// `packed_wgmma16`): 128 columns per block, each chunk's activations staged once per block
    /// for the tensor cores to read from shared memory; 8 < M <= 16, K not split.
    PackedWgmma,
    /// Hopper's warpgroup tensor cores (the sm_90a module only): block tile 128 x 128, the
    /// weights dequantized straight into `wgmma`'s register operand, the permuted A (as
    /// `Tiled`) its shared-memory operand: the planner's choice for M > [`WGMMA_MIN_M`] with
    /// 16-byte aligned rows of B (and for M > 16 where `Tiled` cannot take the format), unless
    /// its tiles fill the SMs' last wave poorly ([`Variant::WgmmaStreamK`]). Blocks of 16 and
    /// typed zero points run its `_any` builds (so do those of the two below). Forced, it
    /// splits K (`splits`) rather than take the stream-K partition.
    Wgmma,
    /// [`Variant::Wgmma`]'s kernel over a stream-K partition: one block per SM, each taking an
    /// equal share of all tiles' K chunks, a tile split between blocks summed by the block
    /// holding its last chunk (f32 partial sums through the workspace). The planner's choice
    /// where whole tiles would leave more than a tenth of the last wave idle (M = 128,
    /// N = 28672: 224 tiles on 132 SMs, 85%).
    WgmmaStreamK,
    /// [`Variant::Wgmma`]'s operands and needs on a block tile of 128 weight rows x 256 rows of
    /// A, warp-specialized (`prefill`: a producer warpgroup copies the activations, two
    /// consumers copy their weight codes, dequantize and multiply `m64n256k16`), over the
    /// permuted A laid out as its stages (`permute_image`, one bulk copy per stage); K not
    /// split. The planner's choice where M > 128 and its tiles fill at least one wave of the
    /// SMs.
    Prefill,
}

impl Variant {
    /// Whether the kernel reads B in the repacked layout
    /// ([`MatMulNBitsParams::packed_bytes`]) rather than `MatMulNBits`'s.
    pub fn reads_packed_b(self) -> bool {
        matches!(self, Variant::Packed | Variant::PackedMma | Variant::PackedWgmma)
    }
}

/// Shapes and options of one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatMulNBitsParams {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub block_size: usize,
    pub zero_points: ZeroPointKind,
    pub bias: bool,
    /// Kernel variant, or `None` to choose from M.
    pub variant: Option<Variant>,
    /// K splits, 0 to choose from the grid size.
    pub splits: usize,
}

/// What a validated call launches, in order: `permute` (if any), `kernel`, `reduce` (if any).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatMulNBitsPlan {
    pub kernel: &'static str,
    pub dims: LaunchDims,
    pub variant: Variant,
    pub splits: usize,
    /// The activation permutation `tiled` reads, into the start of the workspace.
    pub permute: Option<(&'static str, LaunchDims)>,
    /// `prefill_any`'s constants cooked before it (`matmul_nbits_cook_consts`), into the
    /// workspace after the permuted activations.
    pub cook: Option<(&'static str, LaunchDims)>,
    /// The reduction kernel, when K is split and the splits do not sum in clusters.
    pub reduce: Option<(&'static str, LaunchDims)>,
    /// The cluster shape the main kernel is launched with, where its K splits sum in clusters
    /// (`small`, `decode` and the packed `mma.sync` kernels on Hopper; `wgmma_pair`'s cluster is
    /// in its entry instead).
    pub cluster: Option<(u32, u32, u32)>,
    /// Device memory needed beyond inputs and outputs (permuted activations, f32 partial sums),
    /// in bytes.
    pub workspace_bytes: usize,
    /// Offset of the f32 partial sums in the workspace.
    pub(super) partials_offset: usize,
    /// Offset of the cooked constants in the workspace (`layout::cooked_consts_bytes`).
    pub(super) cooked_offset: usize,
    /// Bytes of the workspace (offset, length) that must be zero when the kernel starts (the
    /// stream-K flags): the permutation before the kernel clears them.
    pub(super) zeroed: Option<(usize, usize)>,
    /// The main kernel has the decode kernels' prologue (`decode*`, `packed_wgmma16`), which reads
    /// [`FLAG_WEIGHTS_READY`] and [`FLAG_EARLY_DEPENDENTS`].
    pub(super) decode: bool,
    pub(super) args: Dims,
}

impl MatMulNBitsPlan {
    /// The main kernel waits (`griddepcontrol.wait`) for the grid before it in the stream
    /// before it reads what that grid may write, so it may be launched as its programmatic
    /// dependent: the decode kernels (after whatever came before the call) and the `wgmma`
    /// kernels (after their permutation).
    pub(super) fn overlaps_previous(&self) -> bool {
        self.decode || matches!(self.variant, Variant::Wgmma | Variant::WgmmaStreamK | Variant::Prefill)
    }
}

/// Whether the rows of A and B allow 16-byte vector loads (`K % 8 == 0` and `a` 16-byte
/// aligned; `row_bytes % 16 == 0` and `b` 16-byte aligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowAlignment {
    pub a_vec16: bool,
    pub b_vec16: bool,
}

impl RowAlignment {
    pub const ALIGNED: Self = RowAlignment { a_vec16: true, b_vec16: true };
    pub const UNALIGNED: Self = RowAlignment { a_vec16: false, b_vec16: false };

    /// The alignment of the rows of `a` and `b` at these device addresses.
    pub fn of(params: &MatMulNBitsParams, a: u64, b: u64) -> Self {
        RowAlignment {
            a_vec16: a.is_multiple_of(16) && params.k.is_multiple_of(8),
            b_vec16: b.is_multiple_of(16) && params.row_bytes().is_multiple_of(16),
        }
    }
}

impl MatMulNBitsParams {
    pub fn k_blocks(&self) -> usize {
        self.k.div_ceil(self.block_size.max(1))
    }

    /// Bytes of `b` per output column.
    pub fn row_bytes(&self) -> usize {
        self.k_blocks() * self.block_size / 2
    }

    /// Bytes of B repacked for [`Variant::Packed`]
    /// ([`crate::ops::matmul_nbits::pack::MatMulNBitsWeights::pack_for_decode`]).
    pub fn packed_bytes(&self) -> usize {
        self.n.div_ceil(DECODE_COLUMNS) * self.k.div_ceil(CHUNK) * packed_record_bytes(self.block_size)
    }

    /// The K span of one scale in the repacked B (`layout::packed_step`): a chunk for blocks
    /// of at least 128, 32 in the fine records (blocks of 32 and 64), 16 in the fine16 records.
    pub fn packed_step(&self) -> usize {
        layout::packed_step(self.block_size)
    }

    /// Validates the shapes and picks the variant and split for a device with
    /// `multiprocessors` SMs that runs `wgmma` or not ([`Device::has_wgmma`](crate::runtime::Device::has_wgmma)), for
    /// tensors that
    /// start 16-byte aligned (every cudarc allocation).
    pub fn plan(&self, multiprocessors: u32, wgmma: bool) -> Result<MatMulNBitsPlan> {
        self.plan_for(multiprocessors, wgmma, RowAlignment::of(self, 0, 0))
    }

    /// [`Self::plan`] for rows of the given alignment ([`RowAlignment::of`] the pointers):
    /// what [`matmul_nbits_raw`](super::launch::matmul_nbits_raw) launches.
    pub fn plan_for(&self, multiprocessors: u32, wgmma: bool, rows: RowAlignment) -> Result<MatMulNBitsPlan> {
        let p = self;
        let sms = multiprocessors.max(1) as usize;
        let bad = |m: String| Error::invalid(KERNEL, m);
        let typed = p.zero_points == ZeroPointKind::Typed;
        let t = match p.dtype {
            DType::F16 => ElementType::F16,
            DType::BF16 => ElementType::Bf16,
            other => return Err(bad(format!("dtype {other} not supported on the GPU (f16, bf16)"))),
        };
        let name = |entry: Entry| entry.name(t);
        for (name, v) in [("M", p.m), ("N", p.n), ("K", p.k)] {
            if v == 0 || v > i32::MAX as usize {
                return Err(bad(format!("{name} = {v} (must be 1..=2^31-1)")));
            }
        }
        if !valid_block_size(p.block_size) || p.block_size > 1 << 16 {
            return Err(bad(format!("block_size {} (must be a power of two, at least 16)", p.block_size)));
        }
        if (p.n as u64) * (p.row_bytes() as u64) > i64::MAX as u64 / 2
            || (p.m as u64) * (p.k.max(p.n) as u64) > i64::MAX as u64 / 8
            || p.row_bytes() > u32::MAX as usize
        {
            return Err(bad("tensors too large".into()));
        }
        let tiled_ok = !typed && p.block_size >= TILED_MIN_BLOCK;
        // The `wgmma` kernels take every format: what `tiled` does not (blocks of 16, typed zero
        // points) on their `_any` builds.
        let wgmma_ok = wgmma && rows.b_vec16;
        let any_format = !tiled_ok;
        let hopper_entry = |plain: Entry, any: Entry| name(if any_format { any } else { plain });
        let step = p.packed_step();
        let variant = match p.variant {
            Some(Variant::PackedWgmma) if !wgmma => {
                return Err(bad(format!("variant PackedWgmma needs a Hopper GPU (sm_90a module: {wgmma})")));
            }
            // `packed_wgmma16` scales each chunk's sums once: its build takes the coarse records.
            Some(Variant::PackedWgmma) if step < CHUNK => {
                return Err(bad(format!("variant PackedWgmma needs block_size >= {CHUNK}, got {}", p.block_size)));
            }
            // Measured on the H200 (2026-12-01, docs/perf-notes/matmul_nbits.md, v19):
            // `PackedWgmma` wins where M > 8 and N alone fills the GPU without a K split (M = 16,
            // N = 28672: 55.3 against 69.2 us); with fewer columns, where it needs clusters of
            // K splits, and for M <= 8 the `mma.sync` kernels stay faster.
            Some(Variant::Packed)
                if wgmma
                    && step == CHUNK
                    && p.m > DECODE8_ROWS
                    && p.n.div_ceil(PACKED_WGMMA_COLUMNS) >= sms
                    && p.splits <= 1 =>
            {
                Variant::PackedWgmma
            }
            Some(Variant::Packed) => Variant::PackedMma,
            Some(Variant::Tiled) if !tiled_ok => {
                return Err(bad("variant Tiled needs integer zero points and block_size >= 32".into()));
            }
            Some(v @ (Variant::Wgmma | Variant::WgmmaStreamK | Variant::Prefill)) if !wgmma_ok => {
                return Err(bad(format!(
                    "variant {v:?} needs a Hopper GPU (sm_90a module: {wgmma}) and 16-byte aligned rows of B"
                )));
            }
            Some(v) => v,
            None if p.m <= SMALL_MAX_M => Variant::Small,
            // Measured on the H200 (2026-12-01; M = 32 / 64 at N = K = 8192, N = 28672,
            // K = 28672): the first register-A `wgmma` (the landed one is 10-15% faster at
            // M = 128) 50 / 52, 160 / 164, 142 / 147 us; `tiled` 41 / 55, 126 / 169, 106 / 144:
            // `tiled` up to 32 rows, `wgmma` beyond.
            // `prefill` where its 256-row tiles are more than half used and fill the SMs. On an
            // H100 (2026-12-06, M = 1024 / 2048, N = 8192 / 28672, K = 8192, the permutation
            // included) it took 0.70-0.73x the time of `wgmma` over whole tiles, 0.64-0.80x that
            // of stream-K.
            None if wgmma_ok && p.m > PREFILL_BM / 2 && p.m.div_ceil(PREFILL_BM) * p.n.div_ceil(PREFILL_BN) >= sms => {
                Variant::Prefill
            }
            // Blocks of 16 and typed zero points above M = 16 run `wgmma_any` from M = 17: `tiled`
            // does not take them, and `large` ran 0.13-0.16x onnxruntime-gpu's node at M = 2048
            // and 0.62-0.65x at M = 64 (H100, 2026-12-07).
            None if wgmma_ok && (p.m > WGMMA_MIN_M || !tiled_ok) => Variant::Wgmma,
            None if tiled_ok => Variant::Tiled,
            None => Variant::Large,
        };
        // `tiled` copies B with 16-byte `cp.async`.
        let variant = if variant == Variant::Tiled && !rows.b_vec16 { Variant::Large } else { variant };
        // `decode` (the lean `small`) needs integer zero points, one block per K chunk and
        // 16-byte rows.
        let decode_ok = !typed && p.block_size >= CHUNK && rows.a_vec16 && rows.b_vec16;
        let decode = variant == Variant::Small && decode_ok;
        // The packed kernels are `decode` over another layout of B: the same needs, and M <= 16,
        // but blocks of 16 to 64 too (the fine and fine16 records).
        let packed = variant.reads_packed_b();
        let packed_ok = !typed && p.block_size >= PACKED_MIN_BLOCK && rows.a_vec16 && rows.b_vec16;
        if packed && !(packed_ok && p.m <= SMALL_MAX_M) {
            return Err(bad(format!(
                "variant {variant:?} needs M <= 16, integer zero points, block_size >= {PACKED_MIN_BLOCK} and \
                 16-byte aligned A and B"
            )));
        }
        // `packed_wgmma16` alone is built: 16 rows, K not split (what the planner chooses it for).
        if variant == Variant::PackedWgmma && p.m <= DECODE8_ROWS {
            return Err(bad(format!("variant PackedWgmma needs M > {DECODE8_ROWS} (its 16-row build), got {}", p.m)));
        }
        if variant == Variant::PackedWgmma && p.splits > 1 {
            return Err(bad(format!("variant PackedWgmma does not split K ({} splits asked)", p.splits)));
        }
        let rows8 = (decode || packed) && p.m <= DECODE8_ROWS;
        // `tiled`: as few rows as M needs up to 64, then 128 x 128 (measured faster than
        // 128 x 64 with twice the blocks at M = 128 and 256: each warp then does twice the
        // `mma`s per chunk for the same copies and dequantization).
        let (tiled, tiled_kernel): (Tiling, _) = if p.m <= TILED32X128.block_m() {
            (TILED32X128, name(Entry::Tiled32x128))
        } else if p.m <= TILED64X128.block_m() {
            (TILED64X128, name(Entry::Tiled64x128))
        } else {
            (TILED128X128, name(Entry::Tiled128x128))
        };
        let (kernel, tiling) = match variant {
            Variant::Small if decode => (if rows8 { name(Entry::Decode8) } else { name(Entry::Decode16) }, DECODE),
            Variant::Small => (if typed { name(Entry::SmallZf) } else { name(Entry::Small) }, SMALL),
            Variant::Large => (if typed { name(Entry::LargeZf) } else { name(Entry::Large) }, LARGE),
            Variant::Tiled => (tiled_kernel, tiled),
            // (`Packed` was resolved to one of the two above.)
            Variant::Packed | Variant::PackedMma => (name(packed_decode_entry(rows8, false, step)), DECODE),
            Variant::PackedWgmma => (name(Entry::PackedWgmma16), PACKED_WGMMA),
            // The same block tile and threads as `tiled128x128` (two warpgroups of 64 x 128).
            // (Stream-K's entry is named below, once the planner may have chosen it.)
            Variant::Wgmma | Variant::WgmmaStreamK => (hopper_entry(Entry::Wgmma, Entry::WgmmaAny), TILED128X128),
            Variant::Prefill => (hopper_entry(Entry::Prefill, Entry::PrefillAny), PREFILL),
        };
        let (bm, bn, threads) = match variant {
            Variant::PackedWgmma => (SMALL_MAX_M, tiling.block_n(), tiling.threads()),
            _ => (if rows8 { DECODE8_ROWS } else { tiling.block_m() }, tiling.block_n(), tiling.threads()),
        };
        let tiles_m = p.m.div_ceil(bm);
        let tiles_n = p.n.div_ceil(bn);
        if tiles_m > 65535 || tiles_n > i32::MAX as usize {
            return Err(bad(format!("M = {} needs {tiles_m} row tiles (at most 65535)", p.m)));
        }
        let chunks = p.k.div_ceil(CHUNK);
        // `wgmma` runs one block per SM (its ring fills the shared memory). Whole tiles leave
        // part of the last wave idle unless their count is near a multiple of the SMs; the
        // stream-K partition gives every SM the same share of chunks instead, for the price of
        // a partial tile per block through the workspace (and a flag wait, normally long
        // satisfied). Below one wave the splits fill the SMs well enough (64 tiles x 2 on 132).
        // Measured on the H200 (2026-12-01, docs/perf-notes/matmul_nbits.md v20): at N = 28672
        // M = 64 / 128 / 256 ran 9% / 2-4% / 7% faster; forced at N = 8192 it was 3-11% slower
        // at every M (nearly full waves there, and the tiles it runs together share less in L2).
        let tiles = tiles_m * tiles_n;
        let streamk_fits = (tiles * chunks) as u64 <= u32::MAX as u64;
        let variant = if p.variant.is_none() && variant == Variant::Wgmma && tiles >= sms && streamk_fits {
            let waves = tiles.div_ceil(sms);
            if tiles * 10 < waves * sms * 9 { Variant::WgmmaStreamK } else { variant }
        } else {
            variant
        };
        if variant == Variant::WgmmaStreamK && !streamk_fits {
            return Err(bad(format!(
                "variant WgmmaStreamK needs fewer than 2^32 chunks over all tiles, got {}",
                tiles * chunks
            )));
        }
        let prefill = variant == Variant::Prefill;
        if (prefill || variant == Variant::WgmmaStreamK) && p.splits > 1 {
            return Err(bad(format!("variant {variant:?} does not split K by `splits` ({} asked)", p.splits)));
        }
        let kernel = if variant == Variant::WgmmaStreamK {
            hopper_entry(Entry::WgmmaStreamK, Entry::WgmmaStreamKAny)
        } else {
            kernel
        };
        // Split K until there are about four blocks per SM (`large`; one for `small`, whose
        // warps already split K four ways, and for `tiled`, whose ring fills the SM's shared
        // memory), or one chunk per split.
        let wanted = if prefill || matches!(variant, Variant::WgmmaStreamK | Variant::PackedWgmma) {
            1
        } else if p.splits > 0 {
            p.splits
        } else {
            let per_sm = if variant == Variant::Large { 4 } else { 1 };
            let target = per_sm * sms;
            if matches!(variant, Variant::Tiled | Variant::Wgmma) {
                // One wave of big blocks: a nearly full wave beats a split's extra traffic.
                (target / (tiles_m * tiles_n)).clamp(1, 16)
            } else {
                target.div_ceil(tiles_m * tiles_n).clamp(1, 16)
            }
        };
        let chunks_per_split = chunks.div_ceil(wanted.clamp(1, chunks));
        let splits = chunks.div_ceil(chunks_per_split);
        if splits > 65535 {
            return Err(bad(format!("K = {} needs {splits} splits (at most 65535)", p.k)));
        }
        // `decode8_ahead3` loads the activations 3 chunks ahead instead of 1: faster while the
        // grid fits in one wave of 2 blocks per SM, which its registers allow (measured: 8-10%
        // at M = 1 with 256 blocks); a larger grid runs better on `decode8`'s 3 blocks per SM.
        // (`decode8_packed` always loads 3 ahead.)
        let kernel =
            if decode && rows8 && tiles_m * tiles_n * splits <= 2 * sms { name(Entry::Decode8Ahead3) } else { kernel };
        // `decode8_packed_wide` (8 warps on the same block tile, 2 blocks per SM) while the grid
        // fits one wave of it, `decode8_packed` (4 warps, 4 blocks per SM since v28, 3 before)
        // beyond. Measured on the H200 (2026-12-01, docs/perf-notes/matmul_nbits.md v23): 256
        // blocks (N = 8192) 1.5-4% faster at M = 1-8; 896 blocks (N = 28672) 2-9% slower, in 3.4
        // waves instead of 2.3.
        // Likewise at M <= 16: `decode16_packed_wide` (6 warps, 2 blocks per SM) while the grid
        // fits one wave of it, `decode16_packed` (4 warps, 3 blocks per SM) beyond. Measured on
        // the H200 (2026-12-02, docs/perf-notes/matmul_nbits.md v29): 256 blocks 6-8% faster at
        // M = 16; 896 blocks (N = 28672) 3% slower.
        // The wide build's name, threads and shared bytes, where it runs.
        let wide = (variant == Variant::PackedMma && tiles_m * tiles_n * splits <= 2 * sms).then(|| {
            let tiling = if rows8 { DECODE_WIDE } else { DECODE16_WIDE };
            (
                name(packed_decode_entry(rows8, true, step)),
                tiling.threads(),
                decode_packed_shared_bytes(tiling.wk, step),
            )
        });
        let (kernel, threads) = wide.map_or((kernel, threads), |(name, threads, _)| (name, threads));
        // Two splits of `wgmma` run as clusters of the pair, which sum through distributed
        // shared memory: no partial sums in the workspace, no reduction kernel.
        let pair = variant == Variant::Wgmma && splits == 2;
        let kernel = if pair { hopper_entry(Entry::WgmmaPair, Entry::WgmmaPairAny) } else { kernel };
        // So do the splits of `small` (`decode` included) and the packed `mma.sync` kernels on
        // Hopper, launched in clusters of the splits up to the portable cluster size: one launch
        // instead of two, no partial sums through memory, no workspace.
        let sums_in_clusters = matches!(variant, Variant::Small | Variant::PackedMma);
        let clustered = wgmma && sums_in_clusters && (2..=MAX_CLUSTER_SPLITS).contains(&splits);
        // Other splits leave f32 partial sums in the workspace for the reduction kernel.
        let reduced = splits > 1 && !pair && !clustered;
        // The permuted activations (rows padded to whole chunks), then the partial sums.
        let permuted = prefill || matches!(variant, Variant::Tiled | Variant::Wgmma | Variant::WgmmaStreamK);
        // (`prefill` reads it as the image of its stages: whole tiles of rows.)
        let permuted_bytes = if prefill {
            prefill_image_bytes(p.m, p.k)
        } else if permuted {
            (p.m * chunks * CHUNK * 2).next_multiple_of(256)
        } else {
            0
        };
        // `prefill_any` reads its constants cooked once per call (per chunk they took a third of its
        // instructions: docs/perf-notes/matmul_nbits.md, v37).
        let cooked_bytes = if prefill && any_format { cooked_consts_bytes(p.n, p.k_blocks()) } else { 0 };
        if cooked_bytes > 0 && p.n * p.k_blocks() > u32::MAX as usize {
            return Err(bad("N x k_blocks too large for the cooking kernel (at most 2^32 - 1)".into()));
        }
        let cook = (cooked_bytes > 0).then(|| {
            let grid = ((p.n * p.k_blocks()).div_ceil(COOK_THREADS) as u32, 1, 1);
            (name(Entry::CookConsts), LaunchDims { grid, block: (COOK_THREADS as u32, 1, 1), shared_bytes: 0 })
        });
        // Stream-K: one block per SM (fewer when there are fewer chunks), a slot of partial sums
        // and a flag each.
        let streamk_blocks = (variant == Variant::WgmmaStreamK).then(|| sms.min(tiles * chunks));
        let partials_bytes = match streamk_blocks {
            Some(blocks) => wgmma_streamk_workspace_bytes(blocks),
            None if reduced => splits * p.m * p.n * 4,
            None => 0,
        };
        // (Stream-K is a permuted variant: the permutation clears the flags.)
        let zeroed = streamk_blocks.map(|blocks| (permuted_bytes + blocks * WGMMA_STREAMK_SLOT_BYTES, blocks * 4));
        let workspace_bytes = permuted_bytes + cooked_bytes + partials_bytes;
        let mut flags = match p.zero_points {
            ZeroPointKind::Default => 0,
            ZeroPointKind::PackedU8 => FLAG_ZERO_U8,
            ZeroPointKind::Typed => FLAG_ZERO_T,
        };
        if p.bias {
            flags |= FLAG_BIAS;
        }
        if rows.a_vec16 {
            flags |= FLAG_A_VEC16;
        }
        if rows.b_vec16 {
            flags |= FLAG_B_VEC16;
        }
        let args = Dims {
            m: p.m as u32,
            n: p.n as u32,
            k: p.k as u32,
            k_blocks: p.k_blocks() as u32,
            block_shift: p.block_size.trailing_zeros(),
            row_bytes: p.row_bytes() as u32,
            chunks_per_split: chunks_per_split as u32,
            flags,
        };
        let dims = LaunchDims {
            grid: match streamk_blocks {
                Some(blocks) => (blocks as u32, 1, 1),
                None => (tiles_n as u32, tiles_m as u32, splits as u32),
            },
            block: (threads as u32, 1, 1),
            shared_bytes: match variant {
                Variant::Small if decode => DECODE_SHARED_BYTES as u32,
                Variant::Small => 0,
                Variant::Large => LARGE_SHARED_BYTES as u32,
                Variant::Tiled => tiled_shared_bytes(tiling) as u32,
                Variant::Packed | Variant::PackedMma => {
                    wide.map_or(decode_packed_shared_bytes(DECODE_WARPS, step), |(_, _, bytes)| bytes) as u32
                }
                Variant::PackedWgmma => PACKED_WGMMA_SHARED_BYTES as u32,
                Variant::Wgmma | Variant::WgmmaStreamK => WGMMA_SHARED_BYTES as u32,
                Variant::Prefill => PREFILL_SHARED_BYTES as u32,
            },
        };
        let permuted_rows = if prefill { prefill_image_rows(p.m) } else { p.m };
        let permute_blocks = (permuted_rows * chunks * CHUNK / 8).div_ceil(PERMUTE_THREADS);
        if permute_blocks > i32::MAX as usize {
            return Err(bad("M x K too large for the permutation grid".into()));
        }
        let permute = permuted.then(|| {
            let dims = LaunchDims {
                grid: (permute_blocks as u32, 1, 1),
                block: (PERMUTE_THREADS as u32, 1, 1),
                shared_bytes: 0,
            };
            (name(if prefill { Entry::PermuteImage } else { Entry::Permute }), dims)
        });
        let reduce = reduced.then(|| {
            let grid = ((p.m * p.n).div_ceil(REDUCE_THREADS) as u32, 1, 1);
            (name(Entry::Reduce), LaunchDims { grid, block: (REDUCE_THREADS as u32, 1, 1), shared_bytes: 0 })
        });
        if (p.m * p.n).div_ceil(REDUCE_THREADS) > i32::MAX as usize {
            return Err(bad("M x N too large for the reduction grid".into()));
        }
        // The kernels with `decode`'s prologue: `decode8*`, `decode16`, `decode*_packed`,
        // `packed_wgmma16`.
        let decode_prologue = decode || matches!(variant, Variant::PackedMma | Variant::PackedWgmma);
        Ok(MatMulNBitsPlan {
            kernel,
            dims,
            variant,
            splits,
            permute,
            cook,
            reduce,
            cluster: clustered.then_some((1, 1, splits as u32)),
            workspace_bytes,
            partials_offset: permuted_bytes + cooked_bytes,
            cooked_offset: permuted_bytes,
            zeroed,
            decode: decode_prologue,
            args,
        })
    }
}

/// The `decode*_packed` build for 8 rows of A or 16, the wide block or not, over the records of
/// kind `step` (`layout::packed_step`).
fn packed_decode_entry(rows8: bool, wide: bool, step: usize) -> Entry {
    use Entry::*;
    const COARSE: [[Entry; 2]; 2] = [[Decode16Packed, Decode16PackedWide], [Decode8Packed, Decode8PackedWide]];
    const FINE: [[Entry; 2]; 2] =
        [[Decode16PackedFine, Decode16PackedWideFine], [Decode8PackedFine, Decode8PackedWideFine]];
    const FINE16: [[Entry; 2]; 2] =
        [[Decode16PackedFine16, Decode16PackedWideFine16], [Decode8PackedFine16, Decode8PackedWideFine16]];
    let table = match step {
        CHUNK => &COARSE,
        FINE_STEP => &FINE,
        _ => &FINE16,
    };
    table[rows8 as usize][wide as usize]
}

/// Whether a `decode` grid of `blocks` lets the next grid start as soon as its blocks are past
/// their wait ([`FLAG_EARLY_DEPENDENTS`]) rather than as they exit: where it runs more than one
/// wave (the next grid's blocks then fill the SMs the last wave leaves idle), or one wave that
/// leaves fewer than half an SM's count of resident slots free. A wave with more free slots
/// would take the next grid's blocks early, to wait beside it, and that ran slower: measured on
/// the H200 (2026-12-01, docs/perf-notes/matmul_nbits.md v21), `decode8_packed` with 256 blocks
/// in 396 slots, M = 1, took 14.0 us at N = K = 8192 and 45.7 at K = 28672 starting early,
/// 12.9 and 40.1 starting at exit; `decode8_ahead3` with 256 in 264 slots 14.0 against 15.1.
pub(super) fn early_dependents(blocks: u64, blocks_per_sm: u32, sms: u32) -> bool {
    let slots = blocks_per_sm as u64 * sms as u64;
    blocks > slots || (slots - blocks) * 2 < sms as u64
}

/// Launch dimensions and scalar arguments of `matmul_nbits_pack_decode` for `params`' B, after
/// checking that [`Variant::Packed`] can take it (integer zero points, blocks of at least 32).
/// `params.m`, `bias`, `variant` and `splits` play no part.
pub fn pack_for_decode_plan(params: &MatMulNBitsParams) -> Result<(LaunchDims, Dims)> {
    let p = params;
    let bad = |m: String| Error::invalid(KERNEL, m);
    if !matches!(p.dtype, DType::F16 | DType::BF16) {
        return Err(bad(format!("dtype {} not supported on the GPU (f16, bf16)", p.dtype)));
    }
    for (name, v) in [("N", p.n), ("K", p.k)] {
        if v == 0 || v > i32::MAX as usize {
            return Err(bad(format!("{name} = {v} (must be 1..=2^31-1)")));
        }
    }
    if !valid_block_size(p.block_size) || p.block_size < PACKED_MIN_BLOCK || p.block_size > 1 << 16 {
        return Err(bad(format!(
            "packing for decode needs a power-of-two block_size >= {PACKED_MIN_BLOCK}, got {}",
            p.block_size
        )));
    }
    if p.zero_points == ZeroPointKind::Typed {
        return Err(bad("packing for decode needs integer zero points (u8 or none)".into()));
    }
    let records = p.n.div_ceil(DECODE_COLUMNS) * p.k.div_ceil(CHUNK);
    if records > i32::MAX as usize
        || (p.n as u64) * (p.row_bytes() as u64) > i64::MAX as u64 / 2
        || p.row_bytes() > u32::MAX as usize
    {
        return Err(bad("tensors too large".into()));
    }
    let dims = LaunchDims { grid: (records as u32, 1, 1), block: (layout::PACK_THREADS as u32, 1, 1), shared_bytes: 0 };
    let args = Dims {
        m: 0,
        n: p.n as u32,
        k: p.k as u32,
        k_blocks: p.k_blocks() as u32,
        block_shift: p.block_size.trailing_zeros(),
        row_bytes: p.row_bytes() as u32,
        chunks_per_split: 0,
        flags: if p.zero_points == ZeroPointKind::PackedU8 { FLAG_ZERO_U8 } else { 0 },
    };
    Ok((dims, args))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::layout::{ENTRIES, HOPPER_ENTRIES, PACK_DECODE_ENTRY, StreamKBlock, StreamKPartition, StreamKSegment};
    use super::{DType, MatMulNBitsParams, RowAlignment, Variant, ZeroPointKind};
    use proptest::prelude::*;

    /// Every kernel the planner launches (main kernel, permutation, cooking, reduction) over a grid of
    /// shapes, zero points, block sizes, alignments and SM counts, unforced or `Packed` (what
    /// the ORT op asks for), K splits chosen: the portable module's entries without `wgmma`, with
    /// it the sm_90a module's.
    fn planned(wgmma: bool) -> BTreeSet<&'static str> {
        let mut seen = BTreeSet::new();
        let rows = [
            RowAlignment::ALIGNED,
            RowAlignment::UNALIGNED,
            RowAlignment { a_vec16: false, b_vec16: true },
            RowAlignment { a_vec16: true, b_vec16: false },
        ];
        for sms in [108, 132] {
            for dtype in [DType::F16, DType::BF16] {
                for zero_points in [ZeroPointKind::Default, ZeroPointKind::PackedU8, ZeroPointKind::Typed] {
                    for block_size in [16, 32, 64, 128] {
                        for m in [1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 1024] {
                            for (n, k) in [(1024, 1000), (4096, 8192), (8192, 8192), (12288, 8192), (28672, 8192)] {
                                for variant in [None, Some(Variant::Packed)] {
                                    let p = MatMulNBitsParams {
                                        dtype,
                                        m,
                                        n,
                                        k,
                                        block_size,
                                        zero_points,
                                        bias: false,
                                        variant,
                                        splits: 0,
                                    };
                                    for rows in rows {
                                        let Ok(plan) = p.plan_for(sms, wgmma, rows) else { continue };
                                        seen.insert(plan.kernel);
                                        seen.extend(plan.permute.map(|(name, _)| name));
                                        seen.extend(plan.cook.map(|(name, _)| name));
                                        seen.extend(plan.reduce.map(|(name, _)| name));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        seen
    }

    /// The planner can choose every entry the modules ship (`pack_decode` is the repacker's),
    /// and nothing else: a variant it never chooses does not stay in the kernels (issue 37).
    /// On Hopper `wgmma` takes every M > 32 that `tiled64x128` and `tiled128x128` would, so
    /// those two run only from the portable module.
    #[test]
    fn the_planner_reaches_every_shipped_entry() {
        let portable: BTreeSet<&str> = ENTRIES.iter().copied().filter(|&e| e != PACK_DECODE_ENTRY).collect();
        assert_eq!(planned(false), portable);
        let mut hopper: BTreeSet<&str> = portable.iter().chain(HOPPER_ENTRIES).copied().collect();
        for tiled in ["tiled64x128", "tiled128x128"] {
            for t in ["f16", "bf16"] {
                assert!(hopper.remove(&*format!("matmul_nbits_{tiled}_{t}")), "{tiled} {t}");
            }
        }
        assert_eq!(planned(true), hopper);
    }

    /// The decode grids of the bench on 132 SMs: early where they run several waves or fill
    /// nearly all slots, at exit where one wave leaves many free.
    #[test]
    fn early_dependents_follow_the_free_slots() {
        use super::early_dependents;
        // 256 blocks at 3 per SM (`decode16_packed`) and at 2 (`decode8_ahead3`, `decode16`).
        assert!(!early_dependents(256, 3, 132));
        assert!(early_dependents(256, 2, 132));
        // 896 blocks (N = 28672) at 3 per SM: three waves.
        assert!(early_dependents(896, 3, 132));
        // Exactly full, one short of half an SM's count of free slots, and half of it.
        assert!(early_dependents(396, 3, 132));
        assert!(early_dependents(396 - 65, 3, 132));
        assert!(!early_dependents(396 - 66, 3, 132));
        // A GPU on which nothing fits says nothing useful: one more wave than it holds.
        assert!(early_dependents(1, 0, 132));
    }

    /// Every block's segments, as the `wgmma_streamk` kernel walks them.
    fn segments(tiles_n: u32, tiles_m: u32, chunks: u32, blocks: u32) -> Vec<Vec<StreamKSegment>> {
        let partition = StreamKPartition::new(tiles_n * tiles_m * chunks, blocks);
        (0..blocks)
            .map(|b| {
                let block = StreamKBlock::new(partition, b, chunks, tiles_n);
                (0..block.segments()).map(|i| block.segment(i)).collect()
            })
            .collect()
    }

    /// The stream-K partition covers every chunk of every tile once; each tile is written by
    /// exactly one block, the one holding its last chunk, after adding the parts of exactly the
    /// lower blocks that hold its other chunks (the kernel's walk down from `block - 1`); a
    /// block publishes at most one part, in its first segment, and waits only in its last,
    /// only for lower blocks; the blocks' shares differ by one chunk at most.
    fn check_partition(tiles_n: u32, tiles_m: u32, chunks: u32, blocks: u32) {
        let (tiles, total) = ((tiles_n * tiles_m) as usize, tiles_n * tiles_m * chunks);
        let partition = StreamKPartition::new(total, blocks);
        let mut covered = vec![0u8; total as usize];
        // Per tile: the blocks that write it, that publish a part of it, and whose parts its
        // writer adds.
        let (mut writers, mut published, mut added) = (vec![vec![]; tiles], vec![vec![]; tiles], vec![vec![]; tiles]);
        for (b, segs) in segments(tiles_n, tiles_m, chunks, blocks).iter().enumerate() {
            let b = b as u32;
            let share: u32 = segs.iter().map(|s| s.chunks).sum();
            assert_eq!(share, partition.begin(b + 1) - partition.begin(b));
            assert!(share == total / blocks || share == total / blocks + 1, "block {b}: {share} of {total}");
            for (i, s) in segs.iter().enumerate() {
                let t = s.tile as usize;
                assert!(s.chunks > 0 && s.first + s.chunks <= chunks, "{s:?}");
                assert_eq!((s.tile_n, s.tile_m), (s.tile % tiles_n, s.tile / tiles_n));
                assert!(i == 0 || s.tile < segs[i - 1].tile, "block {b}: tiles not descending");
                assert_eq!(s.starts, s.first == 0);
                for c in s.first..s.first + s.chunks {
                    covered[(s.tile * chunks + c) as usize] += 1;
                }
                if !s.finalizes {
                    assert_eq!(i, 0, "block {b} publishes in a later segment");
                    published[t].push(b);
                    continue;
                }
                assert_eq!(s.first + s.chunks, chunks);
                writers[t].push(b);
                if !s.starts {
                    assert_eq!(i, segs.len() - 1, "block {b} waits before its last segment");
                    // The kernel's walk: `block - 1` down to the block holding chunk 0.
                    let mut other = b;
                    loop {
                        other = other.checked_sub(1).expect("a walk below block 0");
                        added[t].push(other);
                        if partition.begin(other) <= s.tile * chunks {
                            break;
                        }
                    }
                }
            }
        }
        assert!(covered.iter().all(|&c| c == 1), "chunks not covered exactly once");
        for t in 0..tiles {
            assert_eq!(writers[t].len(), 1, "tile {t}: writers {:?}", writers[t]);
            added[t].sort_unstable();
            published[t].sort_unstable();
            assert_eq!(added[t], published[t], "tile {t}");
            assert!(published[t].iter().all(|&p| p < writers[t][0]), "tile {t}");
        }
    }

    #[test]
    fn streamk_partition_of_the_bench_shapes() {
        // M = 128 and 256 at N = 28672 (K = 8192) on 132 SMs; K = 28672; N = K = 8192 (blocks
        // of half a tile); tiles of one chunk; as many blocks as chunks.
        for (tiles_n, tiles_m, chunks, blocks) in
            [(224, 1, 64, 132), (224, 2, 64, 132), (64, 1, 224, 132), (64, 1, 64, 132), (200, 1, 1, 132), (3, 1, 5, 15)]
        {
            check_partition(tiles_n, tiles_m, chunks, blocks);
        }
    }

    proptest! {
        #[test]
        fn streamk_partition_covers_and_orders(
            tiles_n in 1u32..40, tiles_m in 1u32..4, chunks in 1u32..70, blocks in 1u32..140,
        ) {
            let blocks = blocks.min(tiles_n * tiles_m * chunks);
            check_partition(tiles_n, tiles_m, chunks, blocks);
        }
    }

    /// `permute_image` writes every element of every 256-row tile and K chunk to its own 2 bytes
    /// of the image `prefill` copies stage by stage, filling it exactly; each stage's two halves
    /// are the 128-byte-swizzle tiles `wgmma` reads: the same K element of 8 consecutive rows in 8
    /// different 16-byte columns.
    #[test]
    fn prefill_image_is_a_permutation_of_whole_stages() {
        use super::layout::{PREFILL_A_STAGE_BYTES, PREFILL_BM, prefill_image_bytes, prefill_image_offset};
        for (m, k) in [(1usize, 16usize), (300, 1000), (513, 256)] {
            let chunks = k.div_ceil(128);
            let bytes = prefill_image_bytes(m, k);
            assert_eq!(bytes, m.div_ceil(PREFILL_BM) * chunks * PREFILL_A_STAGE_BYTES);
            let mut seen = vec![false; bytes / 2];
            for row in 0..m.div_ceil(PREFILL_BM) * PREFILL_BM {
                for chunk in 0..chunks {
                    for e in 0..128 {
                        let at = prefill_image_offset(row, chunk, chunks, e);
                        assert!(at.is_multiple_of(2) && at < bytes, "row {row} chunk {chunk} e {e}: {at}");
                        assert!(
                            !std::mem::replace(&mut seen[at / 2], true),
                            "row {row} chunk {chunk} e {e}: {at} twice"
                        );
                        // Its stage, half and row of 128 bytes.
                        let stage = (row / PREFILL_BM) * chunks + chunk;
                        assert_eq!(at / PREFILL_A_STAGE_BYTES, stage);
                        assert_eq!((at % PREFILL_A_STAGE_BYTES) / (PREFILL_BM * 128), e / 64);
                        assert_eq!((at % (PREFILL_BM * 128)) / 128, row % PREFILL_BM);
                    }
                }
            }
            assert!(seen.iter().all(|&s| s));
            let columns: std::collections::HashSet<usize> =
                (0..8).map(|row| prefill_image_offset(row, 0, 1, 5) % 128 / 16).collect();
            assert_eq!(columns.len(), 8);
        }
    }
}
