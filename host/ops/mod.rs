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

/// Every op dlkern declares, family by family, in the order `docs/ops.md` lists them (each
/// family's `op.rs` lists its own). The registry registers each under its name; the ORT adapter
/// serves each that has an [`OpDecl::ort`].
pub fn declarations() -> impl Iterator<Item = &'static OpDecl> {
    [
        rmsnorm::op::DECLARATIONS,
        matmul_nbits::op::DECLARATIONS,
        matmul_w8a8::op::DECLARATIONS,
        attention::op::DECLARATIONS,
        paged_attention::op::DECLARATIONS,
    ]
    .into_iter()
    .flatten()
    .copied()
}
