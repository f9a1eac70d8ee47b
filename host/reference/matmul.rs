//! Matrix product references.

/// `C[m][n] = sum_k A[m][k] * B[n][k]` (B given n-major, "NT") in f64.
pub fn matmul_nt(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[j * k + p]).sum();
        }
    }
    c
}

/// `C[m][n] = sum_k A[m][k] * B[n][k]` in exact integer arithmetic (i64, so no overflow for
/// any int8 inputs with k < 2^48).
pub fn matmul_nt_i8(a: &[i8], b: &[i8], m: usize, n: usize, k: usize) -> Vec<i64> {
    let mut c = vec![0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] as i64 * b[j * k + p] as i64).sum();
        }
    }
    c
}
