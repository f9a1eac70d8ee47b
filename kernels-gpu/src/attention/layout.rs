// Tile shapes of `attention_fwd_*` (kernels-gpu/src/attention/mod.rs), also compiled into the host
// launcher (host/launch/attention.rs): plain `const fn`s, no device code.

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
}
