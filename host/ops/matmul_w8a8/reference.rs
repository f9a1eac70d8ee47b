//! The exact reference of the W8A8 matmul: products of codes accumulated in i64 (no rounding
//! at any K), then scaled in f64.

/// `y [M, N] = (A_q [M, K] . W_q [N, K]^T) * a_scale[m] * w_scale[n] (+ bias)` with the dot
/// products exact. `a_scale` has M entries (per token) or 1 (per tensor).
pub fn matmul_reference(
    a: &[i8],
    a_scale: &[f32],
    w: &[i8],
    w_scale: &[f32],
    (m, n, k): (usize, usize, usize),
    bias: Option<&[f32]>,
) -> Vec<f64> {
    let mut y = vec![0.0; m * n];
    for i in 0..m {
        let sa = a_scale[if a_scale.len() == 1 { 0 } else { i }] as f64;
        for j in 0..n {
            let acc: i64 = (0..k).map(|p| a[i * k + p] as i64 * w[j * k + p] as i64).sum();
            y[i * n + j] = acc as f64 * sa * w_scale[j] as f64 + bias.map_or(0.0, |b| b[j] as f64);
        }
    }
    y
}
