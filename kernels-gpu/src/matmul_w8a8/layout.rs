// Tile shapes, flags and entry points of `matmul_w8a8_*` (kernels-gpu/src/matmul_w8a8/), also
// compiled into the host (host/ops/matmul_w8a8/mod.rs, for its launcher): plain constants, no
// device code.

// `Dtype` and `find`, shared by the families' tables.
include!("../entries.rs");

/// Tiled kernel: rows of A and of W per block.
pub const BM: usize = 128;
pub const BN: usize = 128;
/// K bytes per tile.
pub const BK: usize = 64;
pub const STAGES: usize = 3;
/// Threads per block of the tiled kernel (8 warps, 2 x 4, each a 64 x 32 tile).
pub const THREADS: usize = 256;
/// Shared row: 64 bytes + 16 of padding (rows of one `ldmatrix` fall in distinct banks).
pub const ROW: usize = BK + 16;
pub const TILE_BYTES: usize = BM * ROW;
/// Dynamic shared memory of the tiled kernel: A and W tiles for each stage.
pub const SHARED_BYTES: usize = STAGES * 2 * TILE_BYTES;

/// Hopper kernel (`matmul_w8a8_wgmma_*`, sm_90a module only): a block is two warpgroups, each
/// a 64 x 256 `wgmma` tile, over K steps of 128 bytes (one 128-byte-swizzle row) in a ring of
/// `WGMMA_STAGES` shared-memory stages.
pub const WGMMA_BM: usize = 128;
pub const WGMMA_BN: usize = 256;
pub const WGMMA_BK: usize = 128;
pub const WGMMA_STAGES: usize = 4;
pub const WGMMA_THREADS: usize = 256;
pub const WGMMA_A_STAGE_BYTES: usize = WGMMA_BM * WGMMA_BK;
pub const WGMMA_B_STAGE_BYTES: usize = WGMMA_BN * WGMMA_BK;
/// Dynamic shared memory of the Hopper kernel: the ring, plus 1 KiB to align it to the
/// swizzle atom.
pub const WGMMA_SHARED_BYTES: usize = WGMMA_STAGES * (WGMMA_A_STAGE_BYTES + WGMMA_B_STAGE_BYTES) + 1024;
/// Block order of the Hopper kernel: runs of `WGMMA_GROUP_M` row tiles sweep the column tiles
/// together, so the blocks resident at once share their A and W tiles in L2.
pub const WGMMA_GROUP_M: usize = 16;

/// Decode kernel (`matmul_w8a8_small_*`): largest M (one 16-row `mma` tile), W rows per block,
/// threads per block (4 warps splitting K).
pub const SMALL_M_MAX: usize = 16;
pub const SMALL_N_PER_BLOCK: usize = 16;
pub const SMALL_THREADS: usize = 128;
/// K bytes per step of the decode kernel (two `mma.m16n8k32`).
pub const SMALL_K_STEP: usize = 64;
/// The decode kernel's packed weights (`matmul_w8a8_small_packed_*`): W as
/// `[ceil(N / 16)][ceil(K / 64)][16][64]` int8, zero-padded, so each block's 16 rows x 64 bytes
/// of one K step are one contiguous 1 KiB tile and a block streams 16 KiB runs.
pub const PACKED_TILE_BYTES: usize = SMALL_N_PER_BLOCK * SMALL_K_STEP;

/// Per-token quantization (`matmul_w8a8_quantize_*`): one block of this many threads per row.
pub const QUANTIZE_THREADS: usize = 256;

pub const FLAG_BIAS: u32 = 1;
pub const FLAG_SCALAR_A_SCALE: u32 = 2;
/// `K % 16 == 0` and `a`, `w` 16-byte aligned: 16-byte copies (set by the launcher).
pub const FLAG_VEC16: u32 = 4;
/// Threads per block of `matmul_w8a8_reduce_*` (one output element each).
pub const REDUCE_THREADS: usize = 256;
/// Most K splits (the workspace is `splits * M * N` int32).
pub const MAX_SPLITS: usize = 8;

/// Scalar arguments of the tiled, decode and reduction kernels (one struct, passed by value;
/// the host launcher passes this very type).
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct Dims {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub flags: u32,
    /// K tiles (of [`BK`] bytes) per split: block `z` covers `[z * this, (z + 1) * this)`.
    pub k_tiles_per_split: u32,
}

/// An entry point (output or input type f16, bf16 or f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// `matmul_w8a8_{dtype}`: the tiled kernel.
    Tiled(Dtype),
    /// `matmul_w8a8_partial`: the tiled kernel's int32 sums of one K split.
    Partial,
    /// `matmul_w8a8_small_{dtype}`: the decode kernel.
    Small(Dtype),
    /// `matmul_w8a8_small_packed_{dtype}`: the decode kernel over packed weights.
    SmallPacked(Dtype),
    /// `matmul_w8a8_reduce_{dtype}`: the split-K reduction.
    Reduce(Dtype),
    /// `matmul_w8a8_quantize_{dtype}`: per-token quantization of the activations.
    Quantize(Dtype),
    /// `matmul_w8a8_wgmma_{dtype}`: the Hopper kernel (sm_90a module only).
    Wgmma(Dtype),
    /// `matmul_w8a8_wgmma_partial`: the Hopper kernel's int32 sums of one K split (sm_90a
    /// module only).
    WgmmaPartial,
}

impl Entry {
    /// Whether only the arch-specific (sm_90a) module has it.
    pub const fn arch_specific(self) -> bool {
        matches!(self, Entry::Wgmma(_) | Entry::WgmmaPartial)
    }
}

/// Every entry point of the family, with its symbol.
pub const ENTRIES: &[(Entry, &str)] = &[
    (Entry::Tiled(Dtype::F16), "matmul_w8a8_f16"),
    (Entry::Tiled(Dtype::Bf16), "matmul_w8a8_bf16"),
    (Entry::Tiled(Dtype::F32), "matmul_w8a8_f32"),
    (Entry::Partial, "matmul_w8a8_partial"),
    (Entry::Small(Dtype::F16), "matmul_w8a8_small_f16"),
    (Entry::Small(Dtype::Bf16), "matmul_w8a8_small_bf16"),
    (Entry::Small(Dtype::F32), "matmul_w8a8_small_f32"),
    (Entry::SmallPacked(Dtype::F16), "matmul_w8a8_small_packed_f16"),
    (Entry::SmallPacked(Dtype::Bf16), "matmul_w8a8_small_packed_bf16"),
    (Entry::SmallPacked(Dtype::F32), "matmul_w8a8_small_packed_f32"),
    (Entry::Reduce(Dtype::F16), "matmul_w8a8_reduce_f16"),
    (Entry::Reduce(Dtype::Bf16), "matmul_w8a8_reduce_bf16"),
    (Entry::Reduce(Dtype::F32), "matmul_w8a8_reduce_f32"),
    (Entry::Quantize(Dtype::F16), "matmul_w8a8_quantize_f16"),
    (Entry::Quantize(Dtype::Bf16), "matmul_w8a8_quantize_bf16"),
    (Entry::Quantize(Dtype::F32), "matmul_w8a8_quantize_f32"),
    (Entry::Wgmma(Dtype::F16), "matmul_w8a8_wgmma_f16"),
    (Entry::Wgmma(Dtype::Bf16), "matmul_w8a8_wgmma_bf16"),
    (Entry::Wgmma(Dtype::F32), "matmul_w8a8_wgmma_f32"),
    (Entry::WgmmaPartial, "matmul_w8a8_wgmma_partial"),
];

/// The symbol of `entry`, if the family has it.
pub fn entry(entry: Entry) -> Option<&'static str> {
    find(ENTRIES, entry)
}
