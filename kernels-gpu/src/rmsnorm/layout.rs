// Block shape, shared memory and entry points of `rmsnorm_*` (kernels-gpu/src/rmsnorm/mod.rs),
// also compiled into the host (host/ops/rmsnorm/mod.rs, for its launcher): no device code.

// `Dtype` and `find`, shared by the families' tables.
include!("../entries.rs");

/// Dynamic shared memory every RMSNorm launch provides: the block reduction's scratch, one f32
/// per warp of the largest block the kernels take (1024 threads).
pub const SHARED_BYTES: u32 = 32 * 4;
/// Largest block the launcher picks (whole warps); longer rows loop. The kernels take any
/// multiple of 32 threads up to 1024.
pub const MAX_THREADS: u32 = 256;
/// Bytes per access of the `vec` variants: their pointers, row strides and rows must be
/// multiples of it.
pub const VEC_BYTES: usize = 16;

/// An entry point: `rmsnorm_vec_*` (accesses of [`VEC_BYTES`]) or `rmsnorm_scalar_*`, for
/// f32, f16 and bf16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Vec(Dtype),
    Scalar(Dtype),
}

/// Every entry point of the family, with its symbol.
pub const ENTRIES: &[(Entry, &str)] = &[
    (Entry::Vec(Dtype::F32), "rmsnorm_vec_f32"),
    (Entry::Vec(Dtype::F16), "rmsnorm_vec_f16"),
    (Entry::Vec(Dtype::Bf16), "rmsnorm_vec_bf16"),
    (Entry::Scalar(Dtype::F32), "rmsnorm_scalar_f32"),
    (Entry::Scalar(Dtype::F16), "rmsnorm_scalar_f16"),
    (Entry::Scalar(Dtype::Bf16), "rmsnorm_scalar_bf16"),
];

/// The symbol of `entry`, if the family has it.
pub fn entry(entry: Entry) -> Option<&'static str> {
    find(ENTRIES, entry)
}
