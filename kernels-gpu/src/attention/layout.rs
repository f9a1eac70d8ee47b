// Tile shapes and entry points of `attention_fwd_*` (kernels-gpu/src/attention/mod.rs), also
// compiled into the host (host/ops/attention/mod.rs, for its launcher): plain `const fn`s, no
// device code.

// `Dtype` and `find`, shared by the families' tables.
include!("../entries.rs");

/// Warps per block; the block is `32 * WARPS` threads.
pub const WARPS: usize = 4;

/// 16-row query tiles per warp: two up to head size 128 (each K / V fragment read from shared
/// memory feeds twice the `mma`s, and each warp has two independent accumulator chains), one
/// at 256 (the output accumulators alone take 128 registers per tile there).
pub const fn m_tiles(d: usize) -> usize {
    if d > 128 { 1 } else { 2 }
}

/// Query rows per block: 4 warps x 16 x [`m_tiles`].
pub const fn block_m(d: usize) -> usize {
    WARPS * 16 * m_tiles(d)
}

/// Keys per tile: 64, or 32 at head size 256 (registers).
pub const fn block_n(d: usize) -> usize {
    if d > 128 { 32 } else { 64 }
}

/// Keys per compute pass within a tile (score registers: MT x SUB / 8 x 4 per thread).
pub const fn sub_n(d: usize) -> usize {
    if d > 128 { 32 } else { 64 }
}

/// Bytes per shared row: `D` halves plus 16 bytes of padding (conflict-free `ldmatrix`).
pub const fn row_bytes(d: usize) -> usize {
    d * 2 + 16
}

/// Dynamic shared memory for head size `d`: Q `[block_m][D]`, K and V `[2 stages][block_n][D]`.
pub const fn shared_bytes(d: usize) -> usize {
    (block_m(d) + 4 * block_n(d)) * row_bytes(d)
}

/// The Hopper kernel (`attention_fwd_wgmma_*`, sm_90a module only): a producer warpgroup that
/// copies the tiles and two consumer warpgroups of 64 query rows each, so [`HOPPER_BLOCK_M`]
/// rows per block.
pub const HOPPER_BLOCK_M: usize = 128;

/// Threads per block of the Hopper kernel: three warpgroups.
pub const HOPPER_THREADS: usize = 384;

/// Keys per tile of the Hopper kernel: 128 (a 64 x 128 f32 score tile, 64 registers per
/// consumer thread), 64 at head size 256, where the output tile alone takes 128 registers.
pub const fn hopper_block_n(d: usize) -> usize {
    if d > 128 { 64 } else { 128 }
}

/// Stages of the Hopper kernel's ring, each a K tile and a V tile: three (the tile whose `P V`
/// runs, the one whose scores run, the one landing), two at head size 256, whose three would
/// not fit in shared memory. K and V have barriers of their own, so a stage's next K lands
/// while the consumers still read its V.
pub const fn hopper_stages(d: usize) -> usize {
    if d > 128 { 2 } else { 3 }
}

/// `mbarrier`s of the Hopper kernel: Q landed, and per stage K landed, V landed, K released and
/// V released.
pub const fn hopper_barriers(d: usize) -> usize {
    1 + 4 * hopper_stages(d)
}

/// Dynamic shared memory of the Hopper kernel: Q `[128][D]` and the ring of K and V
/// `[hopper_block_n][D]` tiles (all in 128-byte-swizzle blocks of 64 columns), the 1024 bytes
/// that align them to a swizzle atom, then its `mbarrier`s.
pub const fn hopper_shared_bytes(d: usize) -> usize {
    (HOPPER_BLOCK_M + 2 * hopper_stages(d) * hopper_block_n(d)) * d * 2 + 1024 + 8 * hopper_barriers(d)
}

/// Scalar arguments. The host launcher passes this very type.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct Dims {
    pub heads: u32,
    pub kv_heads: u32,
    /// Padded batches: every sequence's lengths (ignored where `cu_q` / `cu_k` are given).
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub q_row_stride: u32,
    pub k_row_stride: u32,
    pub causal: u32,
    /// Left window in keys, negative for none.
    pub window_left: i32,
    pub scale: f32,
    /// Logit soft cap, 0 for none.
    pub softcap: f32,
    pub lse_head_stride: u32,
    pub lse_batch_stride: u32,
    /// Query and key rows in all: packed lengths are clamped to them.
    pub total_q: u32,
    pub total_k: u32,
    /// Elements between output rows (`H * D` when dense; `q_row_stride` may be larger, as in
    /// a packed QKV input).
    pub out_row_stride: u32,
    /// Elements between KV heads: `D` in token-major rows, `capacity * D` in a BNSH cache.
    pub kv_head_stride: u32,
    /// Elements between sequences' caches (KV-cache mode), 0 otherwise.
    pub kv_batch_stride: u32,
    /// Positions per sequence of the BNSH KV cache: read only by the `attention_fwd_cache_*`
    /// entries (ONNX Runtime's `GroupQueryAttention`), where `cu_k` holds `seqlens_k` (each
    /// sequence's key count minus one) and queries are padded to `seqlen_q` rows; sequence `b`
    /// sees `T = seqlens_k[b] + 1` keys (clamped to the capacity) and its first
    /// `min(seqlen_q, T)` query rows are the newest tokens.
    pub cache_capacity: u32,
}

/// An entry point: `attention_fwd_{dtype}_d{head_dim}`, for f16 and bf16 and head sizes 64, 80,
/// 96, 128 and 256.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Fwd(Dtype, usize),
    /// `attention_fwd_cache_{dtype}_d{head_dim}`: the same kernel over a BNSH KV cache.
    FwdCache(Dtype, usize),
    /// `attention_fwd_wgmma_{dtype}_d{head_dim}`: the Hopper kernel (sm_90a module only).
    Hopper(Dtype, usize),
    /// `attention_fwd_cache_wgmma_{dtype}_d{head_dim}`: the Hopper kernel over a BNSH KV cache.
    HopperCache(Dtype, usize),
    /// `attention_rotary_{dtype}`: rotary embedding over strided heads (f32 too).
    Rotary(Dtype),
    /// `attention_rotary_jobs_{dtype}`: up to [`ROTARY_JOBS`] rotary calls over the same tokens
    /// in one launch (GroupQueryAttention's queries, keys and values).
    RotaryJobs(Dtype),
}

impl Entry {
    /// Whether the entry is in the arch-specific (sm_90a) module only.
    pub const fn arch_specific(self) -> bool {
        matches!(self, Entry::Hopper(..) | Entry::HopperCache(..))
    }
}

/// Most rotary calls one `attention_rotary_jobs_*` launch makes.
pub const ROTARY_JOBS: usize = 3;

/// Threads per block of `attention_rotary_*`.
pub const ROTARY_THREADS: u32 = 128;

/// Where `attention_rotary_*` takes each token's position from (see its launch contract).
pub const POSITIONS_PER_TOKEN: u32 = 0;
pub const POSITIONS_FROM_FIRST: u32 = 1;
pub const POSITIONS_CACHE_APPEND: u32 = 2;
pub const POSITIONS_CACHE_QUERY: u32 = 3;

/// Scalar arguments of `attention_rotary_*`. Strides in elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct RotaryArgs {
    pub seq: u32,
    pub heads: u32,
    pub head_size: u32,
    /// Rotated elements per head (even, <= `head_size`); 0 copies the heads unchanged.
    pub rotary_dim: u32,
    pub interleaved: u32,
    pub src_batch_stride: u32,
    pub src_seq_stride: u32,
    pub src_head_stride: u32,
    pub dst_batch_stride: u32,
    pub dst_seq_stride: u32,
    pub dst_head_stride: u32,
    /// One of the `POSITIONS_*` modes.
    pub positions: u32,
    /// Rows of the cos / sin caches.
    pub max_position: u32,
    /// Positions per sequence in the KV cache (the cache modes clamp lengths to it).
    pub capacity: u32,
    /// 16-byte units per head ([`rotary_vector_units`]) where the call takes the vector path,
    /// 0 for the scalar path (one head per block, one element pair per thread and step).
    pub units: u32,
    /// Heads per block: `ROTARY_THREADS / units` on the vector path, 1 on the scalar path.
    pub heads_per_block: u32,
}

impl RotaryArgs {
    /// Blocks along the grid's z for this call's heads.
    pub const fn head_groups(&self) -> u32 {
        let per_block = if self.heads_per_block == 0 { 1 } else { self.heads_per_block };
        self.heads.div_ceil(per_block)
    }
}

/// The 16-byte units (`per_vec` elements each) a thread of the vector path takes, per head:
/// one per `per_vec` rotated pairs (each pair's two elements are `rotary_dim / 2` apart, so a
/// unit is two vectors there; with `interleaved` the pairs are adjacent and a unit is one vector
/// of `per_vec / 2` pairs), then one per `per_vec` elements of the pass-through tail. `None`
/// when the head does not split into whole units that way.
pub const fn rotary_vector_units(head_size: u32, rotary_dim: u32, interleaved: bool, per_vec: u32) -> Option<u32> {
    let rotated = if interleaved { rotary_dim } else { rotary_dim / 2 };
    if rotary_dim > head_size || !rotated.is_multiple_of(per_vec) || !(head_size - rotary_dim).is_multiple_of(per_vec) {
        return None;
    }
    Some(rotated / per_vec + (head_size - rotary_dim) / per_vec)
}

/// The calls of one `attention_rotary_jobs_*` launch: job `j` (of `count`) rotates (or copies)
/// from `src[j]` into `dst[j]` as `args[j]` says; every job has the launch's `seq` tokens of
/// its batch. Unused jobs are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RotaryJobs {
    pub src: [u64; ROTARY_JOBS],
    pub dst: [u64; ROTARY_JOBS],
    pub args: [RotaryArgs; ROTARY_JOBS],
    pub count: u32,
}

/// Every entry point of the family, with its symbol.
pub const ENTRIES: &[(Entry, &str)] = &[
    (Entry::Fwd(Dtype::F16, 64), "attention_fwd_f16_d64"),
    (Entry::Fwd(Dtype::F16, 80), "attention_fwd_f16_d80"),
    (Entry::Fwd(Dtype::F16, 96), "attention_fwd_f16_d96"),
    (Entry::Fwd(Dtype::F16, 128), "attention_fwd_f16_d128"),
    (Entry::Fwd(Dtype::F16, 256), "attention_fwd_f16_d256"),
    (Entry::Fwd(Dtype::Bf16, 64), "attention_fwd_bf16_d64"),
    (Entry::Fwd(Dtype::Bf16, 80), "attention_fwd_bf16_d80"),
    (Entry::Fwd(Dtype::Bf16, 96), "attention_fwd_bf16_d96"),
    (Entry::Fwd(Dtype::Bf16, 128), "attention_fwd_bf16_d128"),
    (Entry::Fwd(Dtype::Bf16, 256), "attention_fwd_bf16_d256"),
    (Entry::FwdCache(Dtype::F16, 64), "attention_fwd_cache_f16_d64"),
    (Entry::FwdCache(Dtype::F16, 80), "attention_fwd_cache_f16_d80"),
    (Entry::FwdCache(Dtype::F16, 96), "attention_fwd_cache_f16_d96"),
    (Entry::FwdCache(Dtype::F16, 128), "attention_fwd_cache_f16_d128"),
    (Entry::FwdCache(Dtype::F16, 256), "attention_fwd_cache_f16_d256"),
    (Entry::FwdCache(Dtype::Bf16, 64), "attention_fwd_cache_bf16_d64"),
    (Entry::FwdCache(Dtype::Bf16, 80), "attention_fwd_cache_bf16_d80"),
    (Entry::FwdCache(Dtype::Bf16, 96), "attention_fwd_cache_bf16_d96"),
    (Entry::FwdCache(Dtype::Bf16, 128), "attention_fwd_cache_bf16_d128"),
    (Entry::FwdCache(Dtype::Bf16, 256), "attention_fwd_cache_bf16_d256"),
    (Entry::Hopper(Dtype::F16, 64), "attention_fwd_wgmma_f16_d64"),
    (Entry::Hopper(Dtype::F16, 128), "attention_fwd_wgmma_f16_d128"),
    (Entry::Hopper(Dtype::F16, 256), "attention_fwd_wgmma_f16_d256"),
    (Entry::Hopper(Dtype::Bf16, 64), "attention_fwd_wgmma_bf16_d64"),
    (Entry::Hopper(Dtype::Bf16, 128), "attention_fwd_wgmma_bf16_d128"),
    (Entry::Hopper(Dtype::Bf16, 256), "attention_fwd_wgmma_bf16_d256"),
    (Entry::HopperCache(Dtype::F16, 64), "attention_fwd_cache_wgmma_f16_d64"),
    (Entry::HopperCache(Dtype::F16, 128), "attention_fwd_cache_wgmma_f16_d128"),
    (Entry::HopperCache(Dtype::F16, 256), "attention_fwd_cache_wgmma_f16_d256"),
    (Entry::HopperCache(Dtype::Bf16, 64), "attention_fwd_cache_wgmma_bf16_d64"),
    (Entry::HopperCache(Dtype::Bf16, 128), "attention_fwd_cache_wgmma_bf16_d128"),
    (Entry::HopperCache(Dtype::Bf16, 256), "attention_fwd_cache_wgmma_bf16_d256"),
    (Entry::Rotary(Dtype::F32), "attention_rotary_f32"),
    (Entry::Rotary(Dtype::F16), "attention_rotary_f16"),
    (Entry::Rotary(Dtype::Bf16), "attention_rotary_bf16"),
    (Entry::RotaryJobs(Dtype::F32), "attention_rotary_jobs_f32"),
    (Entry::RotaryJobs(Dtype::F16), "attention_rotary_jobs_f16"),
    (Entry::RotaryJobs(Dtype::Bf16), "attention_rotary_jobs_bf16"),
];

/// The symbol of `entry`, if the family has it.
pub fn entry(entry: Entry) -> Option<&'static str> {
    find(ENTRIES, entry)
}
