//! W8A8 int8 matmul (per-token activations, per-channel weights), the per-token quantizer, and
//! `MatMulIntegerToFloat`.
//!
//! One folder per family: `op.rs` declares the op(s) and their registry kernels, `launch.rs`
//! validates and launches, `reference.rs` is the CPU oracle, `pack.rs` the weight layouts; the
//! device code is `kernels-gpu/src/matmul_w8a8`.

/// The tile shapes and argument structs shared with the kernels: the device crate's own
/// source, compiled here too, so a launch cannot disagree with its kernel (the host uses only
/// part of it).
#[allow(dead_code)]
#[path = "../../../kernels-gpu/src/matmul_w8a8/layout.rs"]
pub(crate) mod layout;

pub mod launch;
pub mod op;
pub mod pack;
pub mod reference;
