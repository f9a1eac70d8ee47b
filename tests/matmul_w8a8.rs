//! W8A8 pieces: the per-row int8 quantizer's error bound and rounding, the overflow bound of
//! int32 accumulation, and the exact integer reference at int8 extremes.

mod common;

use common::Rng;
use dlkern::quant::w8::{MAX_K_I32, matmul_reference, quantize_rows};
use proptest::prelude::*;

proptest! {
    #[test]
    fn quantization_error_is_half_a_step(rows in 1usize..5, cols in 1usize..300, spread in 0.001f64..100.0, seed: u64) {
        let mut rng = Rng::new(seed);
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.uniform(-spread, spread) as f32).collect();
        let (q, scales) = quantize_rows(&x, rows, cols).unwrap();
        for r in 0..rows {
            let max_code = q[r * cols..(r + 1) * cols].iter().map(|c| c.unsigned_abs()).max().unwrap();
            prop_assert!(max_code == 127 || scales[r] == 0.0, "the largest value maps to +-127");
            for c in 0..cols {
                let err = (q[r * cols + c] as f64 * scales[r] as f64 - x[r * cols + c] as f64).abs();
                // Half a step, plus f32 rounding of x / scale (|x / scale| <= 127: 127 * 2^-23).
                prop_assert!(err <= scales[r] as f64 * (0.5 + 127.0 * 2f64.powi(-23)) + 1e-30);
                prop_assert!(q[r * cols + c] != -128, "symmetric: -128 is never produced");
            }
        }
    }
}

#[test]
fn rounding_is_half_to_even_and_zero_rows_stay_zero() {
    // scale = 127 / 127 = 1: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> -0.
    let (q, s) = quantize_rows(&[127.0, 0.5, 1.5, 2.5, -0.5, -1.5], 1, 6).unwrap();
    assert_eq!((q, s), (vec![127, 0, 2, 2, 0, -2], vec![1.0]));
    let (q, s) = quantize_rows(&[0.0; 4], 1, 4).unwrap();
    assert_eq!((q, s), (vec![0; 4], vec![0.0]));
    assert!(quantize_rows(&[f32::INFINITY], 1, 1).is_err());
}

#[test]
fn int32_accumulation_is_exact_up_to_max_k() {
    // The bound is tight, and covers the K = 65536 the issue asks for (checked at compile time).
    const _: () = assert!(MAX_K_I32 >= 65536);
    const _: () = assert!(128i64 * 128 * MAX_K_I32 as i64 <= i32::MAX as i64);
    const _: () = assert!(128i64 * 128 * (MAX_K_I32 as i64 + 1) > i32::MAX as i64);
    // All -128 times all -128 over K = 65536: 2^30, exactly.
    let k = 65536;
    let y = matmul_reference(&vec![-128; k], &[1.0], &vec![-128; 2 * k], &[1.0, 0.5], (1, 2, k), Some(&[0.0, 1.0]));
    assert_eq!(y, vec![(1u64 << 30) as f64, (1u64 << 29) as f64 + 1.0]);
}
