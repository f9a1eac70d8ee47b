// Rotary position embedding (RoPE) as ONNX Runtime defines it (`com.microsoft`
// `RotaryEmbedding`, and the rotary of `GroupQueryAttention` and `PagedAttention`): the index
// arithmetic only, no device code, so the device crate (its kernels) and the host crate (the
// references, through a #[path] module in host/ops/common/rotary.rs) share one definition.
//
// A head of `head_size` elements rotates its first `rotary_dim` (even, <= head_size) in
// `rotary_dim / 2` pairs; pair `p` uses `cos[p]` and `sin[p]` of the token's position and
// becomes `(a * cos - b * sin, b * cos + a * sin)` for its elements `(a, b)`. The rest of the
// head passes through unchanged.

/// The elements of pair `p` of a head: `(2p, 2p + 1)` when `interleaved` (GPT-J style),
/// `(p, p + rotary_dim / 2)` otherwise (GPT-NeoX / Llama style, ORT's default).
#[inline(always)]
pub const fn rotary_pair(p: usize, rotary_dim: usize, interleaved: bool) -> (usize, usize) {
    if interleaved { (2 * p, 2 * p + 1) } else { (p, p + rotary_dim / 2) }
}
