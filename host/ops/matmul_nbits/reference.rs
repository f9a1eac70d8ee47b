//! The W4A16 reference: the CPU oracle of the kernels and the registry kernel's CPU path.

use super::pack::MatMulNBitsWeights;

/// `Y [M, N] = A [M, K] * dequantize(W)^T (+ bias)` in f64: the reference for the W4A16 kernels
/// and for `MatMulNBits`.
pub fn matmul_reference(a: &[f64], m: usize, w: &MatMulNBitsWeights, bias: Option<&[f64]>) -> Vec<f64> {
    let deq = w.dequantize();
    let mut y = vec![0.0; m * w.n];
    for i in 0..m {
        for j in 0..w.n {
            let dot: f64 = (0..w.k).map(|p| a[i * w.k + p] * deq[j * w.k + p]).sum();
            y[i * w.n + j] = dot + bias.map_or(0.0, |b| b[j]);
        }
    }
    y
}
