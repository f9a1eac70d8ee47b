//! RMSNorm: `y = x / sqrt(mean(x^2, last axis) + eps) * weight`, and ORT's
//! `SimplifiedLayerNormalization` and `SkipSimplifiedLayerNormalization` (the residual add
//! fused in) on the fused kernel `rmsnorm_skip_*`.
//!
//! One folder per family: `op.rs` declares the op(s) and their registry kernels, `launch.rs`
//! validates and launches, `reference.rs` is the CPU oracle; the
//! device code is `kernels-gpu/src/rmsnorm`.

/// The block shape, shared memory and entry points shared with the kernels: the device crate's
/// own source, compiled here too, so a launch cannot disagree with its kernel (the host uses
/// only part of it).
#[allow(dead_code)]
#[path = "../../../kernels-gpu/src/rmsnorm/layout.rs"]
pub(crate) mod layout;

pub mod launch;
pub mod op;
pub mod reference;
