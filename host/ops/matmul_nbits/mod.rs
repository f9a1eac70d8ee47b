//! W4A16 matmul in ONNX Runtime's `MatMulNBits` format (bits = 4): the op, the planner, the launchers, the weight format and its repacked decode layout, the reference.
//!
//! One folder per family: `op.rs` declares the op(s) and their registry kernels, `launch.rs`
//! validates and launches, `reference.rs` is the CPU oracle, `pack.rs` the weight layouts; the
//! device code is `kernels-gpu/src/matmul_nbits`.

/// The entry-point names, tile shapes and argument structs shared with the kernels: the device
/// crate's own source, compiled here too, so a launch cannot disagree with its kernel (the host
/// uses only part of it).
#[allow(dead_code)]
#[path = "../../../kernels-gpu/src/matmul_nbits/layout.rs"]
pub(crate) mod layout;

/// The family's entry points: [`ENTRIES`] in every PTX module, [`HOPPER_ENTRIES`] in the
/// sm_90a one only (`matmul_nbits_<variant>_<dtype>`, and `matmul_nbits_pack_decode`).
pub use layout::{ENTRIES, HOPPER_ENTRIES};

pub mod launch;
pub mod op;
pub mod pack;
