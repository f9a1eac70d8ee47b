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

/// Largest block the launcher picks for `rmsnorm_skip_*`: long rows get more threads rather
/// than more loop trips, so that each thread's share stays within [`SKIP_CACHED_UNITS`]. Not
/// 1024: the vec variants use about 80 registers (ptxas, sm_90a, with the scale and bias of the
/// cached units held across the reduction), and 1024 threads of them would not fit an SM's
/// register file.
pub const SKIP_MAX_THREADS: u32 = 512;
/// Units (16-byte vectors, or single elements in the scalar variant) of its row that each
/// thread of `rmsnorm_skip_*` keeps in registers between the sum-of-squares pass and the
/// normalized write; units past these are read again (from `sum` when it is written, else
/// recomputed from the inputs).
pub const SKIP_CACHED_UNITS: usize = 4;

/// An entry point: `rmsnorm_vec_*` (accesses of [`VEC_BYTES`]) or `rmsnorm_scalar_*`, and the
/// fused residual variants `rmsnorm_skip_vec_*` / `rmsnorm_skip_scalar_*`, for f32, f16 and
/// bf16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    Vec(Dtype),
    Scalar(Dtype),
    SkipVec(Dtype),
    SkipScalar(Dtype),
}

/// The scalar arguments of `rmsnorm_skip_*` (after its eight pointers), passed by value; the
/// host launcher passes this very type.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct SkipArgs {
    /// Elements per row (the normalized size).
    pub cols: u32,
    /// Elements of `gamma`: `cols`, or a divisor of it when the scale is broadcast over the
    /// leading normalized axes (element `c` of a row is scaled by `gamma[c % scale_len]`).
    pub scale_len: u32,
    /// Rows of `skip`: row `r` adds skip row `r % skip_rows` (a skip broadcast over the batch).
    pub skip_rows: u32,
    pub eps: f32,
    /// Row strides in elements.
    pub x_row_stride: u64,
    pub skip_row_stride: u64,
    pub y_row_stride: u64,
    pub sum_row_stride: u64,
    /// [`SKIP_FLAG_GAMMA_READY`] or 0.
    pub flags: u32,
}

/// `gamma` and `bias` were in place when the grid before this one in the stream started, and
/// that grid does not write them (a model's constants): launched as a programmatic dependent,
/// the kernel reads its share of them before it waits for that grid.
pub const SKIP_FLAG_GAMMA_READY: u32 = 1;

/// Every entry point of the family, with its symbol.
pub const ENTRIES: &[(Entry, &str)] = &[
    (Entry::Vec(Dtype::F32), "rmsnorm_vec_f32"),
    (Entry::Vec(Dtype::F16), "rmsnorm_vec_f16"),
    (Entry::Vec(Dtype::Bf16), "rmsnorm_vec_bf16"),
    (Entry::Scalar(Dtype::F32), "rmsnorm_scalar_f32"),
    (Entry::Scalar(Dtype::F16), "rmsnorm_scalar_f16"),
    (Entry::Scalar(Dtype::Bf16), "rmsnorm_scalar_bf16"),
    (Entry::SkipVec(Dtype::F32), "rmsnorm_skip_vec_f32"),
    (Entry::SkipVec(Dtype::F16), "rmsnorm_skip_vec_f16"),
    (Entry::SkipVec(Dtype::Bf16), "rmsnorm_skip_vec_bf16"),
    (Entry::SkipScalar(Dtype::F32), "rmsnorm_skip_scalar_f32"),
    (Entry::SkipScalar(Dtype::F16), "rmsnorm_skip_scalar_f16"),
    (Entry::SkipScalar(Dtype::Bf16), "rmsnorm_skip_scalar_bf16"),
];

/// The symbol of `entry`, if the family has it.
pub fn entry(entry: Entry) -> Option<&'static str> {
    find(ENTRIES, entry)
}
