//! CPU reference implementations: f64 arithmetic on the exact values of the (rounded) inputs.
//! They are the oracle for every GPU test and the CPU fallback of the ONNX Runtime ops.

pub mod attention;
pub mod matmul;
pub mod paged_attention;
pub mod rmsnorm;

/// The XOR of `bytes`' little-endian 32-bit words (`bytes.len() % 4 == 0`): what the
/// `probe_stream_read` kernel of the tests and benches (`tests/common/probe.rs`) leaves in its
/// output.
pub fn xor_words(bytes: &[u8]) -> u32 {
    bytes.chunks_exact(4).fold(0, |acc, w| acc ^ u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}
