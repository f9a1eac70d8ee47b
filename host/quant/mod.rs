//! Weight quantizers for the quantized matmul kernels, and the exact dequantization they imply.

pub mod w4;
pub mod w8;
