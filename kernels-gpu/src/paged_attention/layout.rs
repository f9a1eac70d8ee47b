// Tile shapes, status bits and entry points of `paged_attention_*` and `paged_kv_write_*`
// (kernels-gpu/src/paged_attention/mod.rs and write.rs), also compiled into the host
// (host/ops/paged_attention/mod.rs, for its launcher): no device code.

// `Dtype` and `find`, shared by the families' tables.
include!("../entries.rs");

pub const WARPS: u32 = 4;
pub const THREADS: u32 = WARPS * 32;
/// Query rows per block: one `mma` M tile (rows past `R` are zero queries, never written).
pub const M_TILE: usize = 16;

/// Status bit: a block-table entry (or slot) outside the cache.
pub const STATUS_BAD_BLOCK: u32 = 1;
/// Status bit: a context length below `q_len` or beyond the block table.
pub const STATUS_BAD_CONTEXT: u32 = 2;
/// Status bit: a token's position lies beyond the rotary `cos`/`sin` caches.
pub const STATUS_BAD_POSITION: u32 = 4;

/// Dynamic shared memory of the partition kernel for head size `d`: permuted queries
/// `[16][32 * ceil(d / 32) + 8]` b16, per-warp max/sum `[4][16][2]` f32, per-warp
/// accumulators `[4][32 * ceil(d / 64)][32]` f32, and the new token's key and value rows
/// `[2][d]` b16 (a [`NewToken`] launch).
pub const fn shared_bytes(d: usize) -> usize {
    let d_out = d / split(d);
    M_TILE * q_row_bytes(d)
        + (WARPS as usize) * M_TILE * 2 * 4
        + (WARPS as usize) * 32 * d_out.div_ceil(64) * 32 * 4
        + new_token_bytes(d)
}

/// Bytes of the new token's key and value rows in shared memory.
pub const fn new_token_bytes(d: usize) -> usize {
    2 * d * 2
}

/// Blocks that share one partition's output columns: 2 at head size 256 (each computes the
/// scores and half of `P V`, so the accumulators fit in registers), else 1.
pub const fn split(d: usize) -> usize {
    if d > 128 { 2 } else { 1 }
}

/// Bytes per permuted query row: 16 bytes of padding keep `ldmatrix` rows on distinct banks.
pub const fn q_row_bytes(d: usize) -> usize {
    d.div_ceil(32) * 64 + 16
}

/// Scalar arguments shared by the partition and combine kernels. The host launcher passes this very type.
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// Query-row tiles of [`M_TILE`] per KV head (`ceil(group * q_len / 16)`).
    pub m_tiles: u32,
    /// [`divmod`] constants for `block_size`.
    pub block_magic: u32,
    pub block_shift: u32,
    /// Rows of the block table. With a row map (the op's per-token launch), a mapped row at or
    /// past this is treated as a bad context length instead of being read.
    pub table_rows: u32,
    /// Elements between cache blocks, between a block's tokens, and between KV heads:
    /// `block_size * kv_heads * D`, `kv_heads * D` and `D` in the paged layout; a BNSH cache
    /// (`[batch, kv_heads, capacity, D]`, GroupQueryAttention's) is one block of `capacity`
    /// tokens per sequence with `kv_heads * capacity * D`, `D` and `capacity * D`.
    pub kv_block_stride: u32,
    pub kv_token_stride: u32,
    pub kv_head_stride: u32,
    /// Added to every context length read (1 where the lengths are `seqlens_k`, count - 1).
    pub context_bias: u32,
    /// Elements between consecutive query tokens (`num_q_heads * D` when dense; more when the
    /// queries are the leading heads of a packed QKV row).
    pub q_token_stride: u32,
}

/// GroupQueryAttention's decode step in the partition kernel's launch (null `key`: none): the
/// new token of each sequence, at position `context_len - 1` (`q_len` 1), comes from the step's
/// inputs instead of the cache. Its queries are rotated as they are loaded; the blocks whose
/// partition holds that position rotate its key and take it and its value from shared memory,
/// and the one of row tile 0 (column half 0) appends both to the cache, which no block of the
/// launch reads at that position.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct NewToken {
    /// The new keys and values, `[batch, .., kv_heads, D]` with `kv_batch_stride` elements
    /// between sequences (the packed QKV row, or their own tensors).
    pub key: u64,
    pub value: u64,
    /// `[max_position, rotary_dim / 2]` angles; null when `rotary_dim` is 0.
    pub cos: u64,
    pub sin: u64,
    pub kv_batch_stride: u32,
    /// Rotated leading elements of each head, 0 for none; the head must split into whole 8-element
    /// units (`rotary_vector_units`' condition).
    pub rotary_dim: u32,
    /// 1: pairs `(2p, 2p + 1)`; 0: pairs `(p, p + rotary_dim / 2)`.
    pub interleaved: u32,
    /// Positions the `cos`/`sin` caches hold; a position past them writes NaN over the token's
    /// query and key (as the rotary launch does; the value is copied whatever its position).
    pub max_position: u32,
}

/// Scalar arguments of `paged_kv_write_rotary_*` (the op's prologue). Strides and offsets are in
/// elements; every one is a multiple of 8 so rows stay 16-byte aligned.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct WriteDims {
    /// Sequences (`cumulative_sequence_length` holds `batch + 1` entries).
    pub batch: u32,
    /// Packed query tokens (the grid's x extent).
    pub tokens: u32,
    pub num_heads: u32,
    pub kv_heads: u32,
    pub head_size: u32,
    pub num_blocks: u32,
    pub block_size: u32,
    pub max_blocks: u32,
    /// Rotated leading elements of each head (`2 * cos_cache.shape[1]`), 0 without rotary.
    pub rotary_dim: u32,
    /// 1: pairs `(2p, 2p + 1)`; 0: pairs `(p, p + rotary_dim / 2)` (see `rotary.rs`).
    pub interleaved: u32,
    /// Positions the `cos`/`sin` caches hold.
    pub cos_rows: u32,
    /// Elements between consecutive tokens of `query`, and of `key`/`value`.
    pub q_stride: u32,
    pub kv_stride: u32,
}

/// An entry point, for f16 and bf16; the attention kernels for head sizes 64, 80, 96, 128 and
/// 256.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// `paged_attention_{dtype}_d{head_size}`: the partition kernel.
    Partition(Dtype, usize),
    /// `paged_attention_combine_{dtype}_d{head_size}`: the partitions' merge.
    Combine(Dtype, usize),
    /// `paged_kv_write_{dtype}`: the cache write.
    KvWrite(Dtype),
    /// `paged_kv_write_rotary_{dtype}`: the op's prologue (rotary, cache write through the block
    /// table, per-token sequence map).
    KvWriteRotary(Dtype),
}

/// Every entry point of the family, with its symbol.
pub const ENTRIES: &[(Entry, &str)] = &[
    (Entry::Partition(Dtype::F16, 64), "paged_attention_f16_d64"),
    (Entry::Combine(Dtype::F16, 64), "paged_attention_combine_f16_d64"),
    (Entry::Partition(Dtype::F16, 80), "paged_attention_f16_d80"),
    (Entry::Combine(Dtype::F16, 80), "paged_attention_combine_f16_d80"),
    (Entry::Partition(Dtype::F16, 96), "paged_attention_f16_d96"),
    (Entry::Combine(Dtype::F16, 96), "paged_attention_combine_f16_d96"),
    (Entry::Partition(Dtype::F16, 128), "paged_attention_f16_d128"),
    (Entry::Combine(Dtype::F16, 128), "paged_attention_combine_f16_d128"),
    (Entry::Partition(Dtype::F16, 256), "paged_attention_f16_d256"),
    (Entry::Combine(Dtype::F16, 256), "paged_attention_combine_f16_d256"),
    (Entry::KvWrite(Dtype::F16), "paged_kv_write_f16"),
    (Entry::KvWriteRotary(Dtype::F16), "paged_kv_write_rotary_f16"),
    (Entry::Partition(Dtype::Bf16, 64), "paged_attention_bf16_d64"),
    (Entry::Combine(Dtype::Bf16, 64), "paged_attention_combine_bf16_d64"),
    (Entry::Partition(Dtype::Bf16, 80), "paged_attention_bf16_d80"),
    (Entry::Combine(Dtype::Bf16, 80), "paged_attention_combine_bf16_d80"),
    (Entry::Partition(Dtype::Bf16, 96), "paged_attention_bf16_d96"),
    (Entry::Combine(Dtype::Bf16, 96), "paged_attention_combine_bf16_d96"),
    (Entry::Partition(Dtype::Bf16, 128), "paged_attention_bf16_d128"),
    (Entry::Combine(Dtype::Bf16, 128), "paged_attention_combine_bf16_d128"),
    (Entry::Partition(Dtype::Bf16, 256), "paged_attention_bf16_d256"),
    (Entry::Combine(Dtype::Bf16, 256), "paged_attention_combine_bf16_d256"),
    (Entry::KvWrite(Dtype::Bf16), "paged_kv_write_bf16"),
    (Entry::KvWriteRotary(Dtype::Bf16), "paged_kv_write_rotary_bf16"),
];

/// The symbol of `entry`, if the family has it.
pub fn entry(entry: Entry) -> Option<&'static str> {
    find(ENTRIES, entry)
}
