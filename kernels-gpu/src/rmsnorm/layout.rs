// Block shape and shared memory of `rmsnorm_*` (kernels-gpu/src/rmsnorm/mod.rs), also compiled
// into the host launcher (host/launch/rmsnorm.rs): no device code.

/// Dynamic shared memory every RMSNorm launch provides: the block reduction's scratch, one f32
/// per warp of the largest block the kernels take (1024 threads).
pub const SHARED_BYTES: u32 = 32 * 4;
/// Largest block the launcher picks (whole warps); longer rows loop. The kernels take any
/// multiple of 32 threads up to 1024.
pub const MAX_THREADS: u32 = 256;
/// Bytes per access of the `vec` variants: their pointers, row strides and rows must be
/// multiples of it.
pub const VEC_BYTES: usize = 16;
