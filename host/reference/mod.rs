//! CPU reference implementations: f64 arithmetic on the exact values of the (rounded) inputs.
//! They are the oracle for every GPU test and the CPU fallback of the ONNX Runtime ops.

pub mod attention;
pub mod matmul;
pub mod paged_attention;
pub mod rmsnorm;
