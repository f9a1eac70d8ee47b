//! RMSNorm reference.

use crate::dtype::Element;

/// `y[r, c] = x[r, c] / sqrt(mean(x[r, :]^2) + eps) * weight[c]` in f64, for `x` of `rows`
/// rows of `cols` elements, `x_row_stride` elements apart. Returns the contiguous `[rows, cols]`
/// result. Panics if the slices are shorter than the shape says (a test-side bug).
pub fn rmsnorm<T: Element>(x: &[T], weight: &[T], rows: usize, cols: usize, x_row_stride: usize, eps: f64) -> Vec<f64> {
    let mut y = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = &x[r * x_row_stride..r * x_row_stride + cols];
        let mean_sq = row.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() / cols as f64;
        let inv_rms = 1.0 / (mean_sq + eps).sqrt();
        y.extend(row.iter().zip(weight).map(|(v, w)| v.to_f64() * inv_rms * w.to_f64()));
    }
    y
}
