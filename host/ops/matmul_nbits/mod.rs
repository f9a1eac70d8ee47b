//! W4A16 matmul in ONNX Runtime's `MatMulNBits` format (bits = 4).
//!
//! One folder per family: `op.rs` declares the op and its registry kernel, `plan.rs` picks the
//! kernels for a shape (pure), `launch.rs` validates and launches, `pack.rs` holds the weight
//! format, its repacked decode layout and the quantizer, `reference.rs` the CPU oracle; the
//! device code is `kernels-gpu/src/matmul_nbits/`.

/// The entry-point names, tile shapes and argument structs shared with the kernels: the device
/// crate's own source, compiled here too, so a launch cannot disagree with its kernel (the host
/// uses only part of it).
#[allow(dead_code)]
#[path = "../../../kernels-gpu/src/matmul_nbits/layout.rs"]
pub(crate) mod layout;

pub mod launch;
pub mod op;
pub mod pack;
pub mod plan;
pub mod reference;
