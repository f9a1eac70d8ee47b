//! The op families, one folder each: `op.rs` (the declarations: schema, registry name, ORT op,
//! and the registry kernel), `launch.rs` (validate, then one launch), `reference.rs` (the CPU
//! oracle), and where a family has them `plan.rs` (shape -> variant) and `pack.rs` (weight
//! layouts). Families import `kernel`, `runtime`, `dlpack` and [`common`], never each other nor
//! the registry or the adapters above them. See `docs/architecture.md`.

pub mod attention;
pub mod common;
pub mod matmul_nbits;
pub mod matmul_w8a8;
pub mod paged_attention;
pub mod rmsnorm;

use crate::kernel::OpDecl;

/// Every op dlkern declares, in the order `docs/ops.md` lists them. The registry registers
/// each under its name; the ORT adapter serves each that has an [`OpDecl::ort`].
pub static DECLARATIONS: &[&OpDecl] = &[
    &rmsnorm::op::RMSNORM,
    &matmul_nbits::op::MATMUL_NBITS,
    &matmul_w8a8::op::QUANTIZE_PER_TOKEN,
    &matmul_w8a8::op::MATMUL_W8A8,
    &matmul_w8a8::op::MATMUL_INTEGER_TO_FLOAT,
    &attention::op::ATTENTION,
    &attention::op::ATTENTION_LSE,
];
