//! Symmetric int8 quantization (one f32 scale per row) for W8A8 matmul: per-token activations
//! and per-output-channel weights, and the decode kernel's packed weight layout.
//!
//! `q = clamp(round_half_even(x / scale), -127, 127)` with `scale = max|row| / 127` (a zero row
//! has scale 0 and codes 0). The GPU kernels accumulate products of codes in i32, exact for
//! `K <= MAX_K_I32`, then scale: `y[m][n] = acc * a_scale[m] * w_scale[n] (+ bias[n])`
//! ([`super::reference`] does the same in exact arithmetic).

use crate::error::{Error, Result};

/// The largest K for which an i32 accumulator cannot overflow with any int8 inputs, -128
/// included: 128 * 128 * K < 2^31.
pub const MAX_K_I32: usize = (i32::MAX as usize) / (128 * 128);

/// Quantizes each of `rows` rows of `cols` values to int8 with its own scale.
pub fn quantize_rows(x: &[f32], rows: usize, cols: usize) -> Result<(Vec<i8>, Vec<f32>)> {
    if x.len() != rows * cols {
        return Err(Error::invalid("int8 quantizer", format!("{} values for [{rows}, {cols}]", x.len())));
    }
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::invalid("int8 quantizer", format!("value {i} is not finite ({})", x[i])));
    }
    let mut q = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(rows);
    // By index, not `chunks`: rows of width 0 still get their (zero) scale.
    for row in (0..rows).map(|r| &x[r * cols..(r + 1) * cols]) {
        let max_abs = row.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = max_abs / 127.0;
        scales.push(scale);
        q.extend(
            row.iter().map(|&v| if scale > 0.0 { (v / scale).round_ties_even().clamp(-127.0, 127.0) as i8 } else { 0 }),
        );
    }
    Ok((q, scales))
}

/// The packed decode layout's tile: rows of W, K bytes (the decode kernel's block tile).
pub(crate) const PACKED_TILE_ROWS: usize = super::layout::SMALL_N_PER_BLOCK;
pub(crate) const PACKED_TILE_K: usize = super::layout::SMALL_K_STEP;

/// Packs int8 weights `[N, K]` (row-major) for the decode kernel's
/// [`crate::ops::matmul_w8a8::launch::W8A8Variant::Packed`]: `[ceil(N / 16)][ceil(K / 64)][16][64]`,
/// so that row `n`, column `k` lands at `((n / 16 * ceil(K / 64) + k / 64) * 16 + n % 16) * 64 +
/// k % 64`; the padding (rows past N, columns past K) is zero. Once per weight matrix, at load
/// time.
pub fn pack_for_decode(w: &[i8], n: usize, k: usize) -> Result<Vec<i8>> {
    if n.checked_mul(k) != Some(w.len()) {
        return Err(Error::invalid("int8 weight packer", format!("{} values for [{n}, {k}]", w.len())));
    }
    let [rows, cols] = packed_decode_shape(n, k);
    let mut packed = vec![0i8; rows * cols];
    for (row, values) in w.chunks_exact(k.max(1)).enumerate().take(n) {
        for (s, run) in values.chunks(PACKED_TILE_K).enumerate() {
            let at = packed_run_start(row, s, cols / PACKED_TILE_K);
            packed[at..at + run.len()].copy_from_slice(run);
        }
    }
    Ok(packed)
}

/// The shape of [`pack_for_decode`]'s output as a 2-D tensor: `[ceil(N / 16) * 16, ceil(K / 64) *
/// 64]` (the padded weight matrix, its bytes in tile order).
pub fn packed_decode_shape(n: usize, k: usize) -> [usize; 2] {
    [n.div_ceil(PACKED_TILE_ROWS) * PACKED_TILE_ROWS, k.div_ceil(PACKED_TILE_K) * PACKED_TILE_K]
}

/// The `[N, K]` weights back from [`pack_for_decode`]'s layout (the padding dropped).
pub fn unpack_decode(packed: &[i8], n: usize, k: usize) -> Result<Vec<i8>> {
    let [rows, cols] = packed_decode_shape(n, k);
    if packed.len() != rows * cols {
        return Err(Error::invalid("int8 weight packer", format!("{} packed bytes for [{n}, {k}]", packed.len())));
    }
    let steps = cols / PACKED_TILE_K;
    let mut w = Vec::with_capacity(n * k);
    for row in 0..n {
        for s in 0..steps {
            let at = packed_run_start(row, s, steps);
            w.extend_from_slice(&packed[at..at + PACKED_TILE_K.min(k - s * PACKED_TILE_K)]);
        }
    }
    Ok(w)
}

/// Where K step `step` (of `steps`) of weight row `row` starts in the packed layout: its tile
/// is `(row / 16, step)`, its row within the tile `row % 16`.
fn packed_run_start(row: usize, step: usize, steps: usize) -> usize {
    ((row / PACKED_TILE_ROWS * steps + step) * PACKED_TILE_ROWS + row % PACKED_TILE_ROWS) * PACKED_TILE_K
}
