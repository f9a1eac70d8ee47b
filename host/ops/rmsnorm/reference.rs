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

/// What [`skip_rmsnorm`] computes: `y` (before rounding to the storage type), the rounded sum
/// and the per-row inverse RMS.
#[derive(Clone, Debug, PartialEq)]
pub struct SkipRmsNormOutput<T> {
    /// `[rows, cols]`, f64.
    pub y: Vec<f64>,
    /// `[rows, cols]`: `x + skip + bias`, rounded once to `T` (what the `sum` output holds and
    /// what is normalized).
    pub sum: Vec<T>,
    /// `[rows]`: `1 / sqrt(mean(sum^2) + eps)`.
    pub inv_std_var: Vec<f64>,
}

/// The fused residual RMSNorm in f64, for contiguous `x` `[rows, cols]`, `skip`
/// `[skip_rows, cols]` (row `r` adds skip row `r % skip_rows`), `gamma` `[scale_len]` with
/// `scale_len` dividing `cols` (element `c` is scaled by `gamma[c % scale_len]`) and `bias`
/// `[cols]`:
///
/// `sum = round_T(x + skip + bias)`, `inv = 1 / sqrt(mean(sum^2) + eps)`, `y = sum * inv * gamma`.
///
/// Panics if the slices are shorter than the shape says or `scale_len` does not divide
/// `cols` (a test-side bug).
#[allow(clippy::too_many_arguments)]
pub fn skip_rmsnorm<T: Element>(
    x: &[T],
    skip: Option<&[T]>,
    gamma: &[T],
    bias: Option<&[T]>,
    rows: usize,
    cols: usize,
    skip_rows: usize,
    eps: f64,
) -> SkipRmsNormOutput<T> {
    let scale_len = gamma.len();
    assert!(scale_len > 0 && cols.is_multiple_of(scale_len), "gamma of {scale_len} for rows of {cols}");
    let mut out = SkipRmsNormOutput {
        y: Vec::with_capacity(rows * cols),
        sum: Vec::with_capacity(rows * cols),
        inv_std_var: Vec::with_capacity(rows),
    };
    for r in 0..rows {
        let start = out.sum.len();
        for c in 0..cols {
            let mut v = x[r * cols + c].to_f64();
            if let Some(s) = skip {
                v += s[(r % skip_rows) * cols + c].to_f64();
            }
            if let Some(b) = bias {
                v += b[c].to_f64();
            }
            out.sum.push(T::from_f64(v));
        }
        let row = &out.sum[start..];
        let mean_sq = row.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() / cols as f64;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        out.inv_std_var.push(inv);
        out.y.extend(row.iter().enumerate().map(|(c, v)| v.to_f64() * inv * gamma[c % scale_len].to_f64()));
    }
    out
}
