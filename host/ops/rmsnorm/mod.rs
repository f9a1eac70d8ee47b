//! RMSNorm: `y = x / sqrt(mean(x^2, last axis) + eps) * weight`.
//!
//! One folder per family: `op.rs` declares the op(s) and their registry kernels, `launch.rs`
//! validates and launches, `reference.rs` is the CPU oracle; the
//! device code is `kernels-gpu/src/rmsnorm`.

pub mod launch;
pub mod op;
pub mod reference;
