//! RMSNorm: reference properties and launcher validation on the CPU; the kernel against the
//! reference on the GPU (ignored without one).

mod common;

use common::{Rng, assert_close, gpu};
use dlkern::ops::rmsnorm::launch::{RmsNormParams, rmsnorm, rmsnorm_raw};
use dlkern::ops::rmsnorm::reference::rmsnorm as reference;
use dlkern::{DType, Element, Error};
use half::{bf16, f16};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// CPU reference

#[test]
fn reference_matches_a_worked_example() {
    // rms([3, 4]) = sqrt((9 + 16) / 2) = sqrt(12.5)
    let y = reference(&[3.0f32, 4.0], &[1.0, 2.0], 1, 2, 2, 0.0);
    let rms = 12.5f64.sqrt();
    assert!((y[0] - 3.0 / rms).abs() < 1e-15 && (y[1] - 8.0 / rms).abs() < 1e-15, "{y:?}");
}

proptest! {
    #[test]
    fn reference_rows_have_unit_rms_and_ignore_scale(
        rows in 1usize..5, cols in 1usize..300, scale in 0.01f64..100.0, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let x: Vec<f32> = rng.vec(rows * cols, -2.0, 2.0);
        let ones = vec![1.0f32; cols];
        let y = reference(&x, &ones, rows, cols, cols, 0.0);
        for row in y.chunks(cols) {
            let rms = (row.iter().map(|v| v * v).sum::<f64>() / cols as f64).sqrt();
            prop_assert!((rms - 1.0).abs() < 1e-9 || row.iter().all(|v| v.is_nan()), "rms {rms}");
        }
        let scaled: Vec<f64> = x.iter().map(|&v| v as f64 * scale).collect();
        let y_scaled = reference(&scaled.iter().map(|&v| v as f32).collect::<Vec<_>>(), &ones, rows, cols, cols, 0.0);
        // f32 rounding of the scaled input limits the agreement to ~1e-6.
        for (a, b) in y.iter().zip(&y_scaled) {
            prop_assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn reference_honours_row_stride(rows in 1usize..6, cols in 1usize..50, pad in 0usize..9, seed: u64) {
        let mut rng = Rng::new(seed);
        let stride = cols + pad;
        let x: Vec<f16> = rng.vec(rows * stride, -3.0, 3.0);
        let w: Vec<f16> = rng.vec(cols, -1.0, 1.0);
        let packed: Vec<f16> = (0..rows).flat_map(|r| x[r * stride..r * stride + cols].to_vec()).collect();
        prop_assert_eq!(reference(&x, &w, rows, cols, stride, 1e-5), reference(&packed, &w, rows, cols, cols, 1e-5));
    }
}

// ---------------------------------------------------------------------------------------------
// Launcher validation (no device needed)

const X: u64 = 0x10_0000;
const W: u64 = 0x20_0000;
const Y: u64 = 0x30_0000;

fn plan_error(params: RmsNormParams, x: u64, w: u64, y: u64) -> String {
    match params.plan(x, w, y) {
        Err(e @ Error::InvalidArgument { kernel: "rmsnorm", .. }) => e.to_string(),
        other => panic!("expected an InvalidArgument for {params:?}, got {other:?}"),
    }
}

#[test]
fn validation_rejects_bad_arguments_with_clear_messages() {
    let ok = RmsNormParams::contiguous(DType::F16, 4, 64, 1e-6);
    assert!(plan_error(RmsNormParams { dtype: DType::I8, ..ok }, X, W, Y).contains("dtype i8 not supported"));
    assert!(plan_error(RmsNormParams { cols: 0, ..ok }, X, W, Y).contains("0 elements"));
    assert!(plan_error(RmsNormParams { eps: f32::NAN, ..ok }, X, W, Y).contains("eps"));
    assert!(plan_error(RmsNormParams { eps: -1.0, ..ok }, X, W, Y).contains("eps"));
    assert!(plan_error(RmsNormParams { x_row_stride: 63, ..ok }, X, W, Y).contains("x row stride 63"));
    assert!(plan_error(RmsNormParams { y_row_stride: 10, ..ok }, X, W, Y).contains("y row stride 10"));
    assert!(plan_error(ok, 0, W, Y).contains("x is a null pointer"));
    assert!(plan_error(ok, X, 0, Y).contains("weight is a null pointer"));
    assert!(plan_error(ok, X, W, 0).contains("y is a null pointer"));
    assert!(plan_error(ok, X + 1, W, Y).contains("not 2-byte aligned"));
    assert!(plan_error(RmsNormParams::contiguous(DType::F32, 4, 64, 0.0), X, W, Y + 2).contains("not 4-byte aligned"));
    assert!(plan_error(ok, X, W, X + 2).contains("overlaps x"));
    assert!(plan_error(ok, X, Y + 8, Y).contains("overlaps weight"));
    assert!(plan_error(RmsNormParams { rows: 1 << 40, ..ok }, X, W, Y).contains("grid limit"));
}

#[test]
fn plans_pick_the_vector_path_only_when_aligned() {
    let p = RmsNormParams::contiguous(DType::F16, 8, 4096, 1e-6);
    let plan = p.plan(X, W, Y).unwrap().unwrap();
    assert_eq!(plan.kernel, "rmsnorm_vec_f16");
    assert_eq!(plan.dims.grid, (8, 1, 1));
    assert_eq!(plan.dims.block, (256, 1, 1));
    assert_eq!(p.plan(X + 2, W, Y).unwrap().unwrap().kernel, "rmsnorm_scalar_f16", "misaligned base");
    let odd = RmsNormParams::contiguous(DType::BF16, 3, 97, 1e-6);
    let plan = odd.plan(X, W, Y).unwrap().unwrap();
    assert_eq!((plan.kernel, plan.dims.block), ("rmsnorm_scalar_bf16", (128, 1, 1)));
    let f32_small = RmsNormParams::contiguous(DType::F32, 1, 8, 1e-6).plan(X, W, Y).unwrap().unwrap();
    assert_eq!((f32_small.kernel, f32_small.dims.block), ("rmsnorm_vec_f32", (32, 1, 1)));
    assert_eq!(RmsNormParams { rows: 0, ..p }.plan(X, W, Y).unwrap(), None, "zero rows launch nothing");
    assert!(p.plan(X, W, X).unwrap().is_some(), "in place is allowed");
}

proptest! {
    /// Any parameters: validation answers without panicking, and an accepted vector plan
    /// really satisfies the vector kernel's alignment contract.
    #[test]
    fn validation_never_panics(
        dtype in prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16), Just(DType::I32)],
        rows in 0usize..1 << 33, cols in 0usize..1 << 34, xs in 0usize..1 << 34, ys in 0usize..1 << 34,
        eps in proptest::num::f32::ANY, x in 0u64..1 << 48, w in 0u64..1 << 48, y in 0u64..1 << 48,
    ) {
        let params = RmsNormParams { dtype, rows, cols, x_row_stride: xs, y_row_stride: ys, eps };
        if let Ok(Some(plan)) = params.plan(x, w, y) {
            if plan.kernel.contains("_vec_") {
                prop_assert!(x % 16 == 0 && w % 16 == 0 && y % 16 == 0);
                prop_assert!((cols * dtype.size_bytes()) % 16 == 0);
            }
            prop_assert!(plan.dims.block.0 % 32 == 0 && plan.dims.block.0 <= 1024);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GPU

/// Runs RMSNorm on the GPU for `[rows, cols]` with the given row strides and base offsets
/// (elements), then checks every element against the reference. The output buffer is poisoned
/// with NaN so unwritten elements fail.
fn check_on_gpu<T: Element>(rows: usize, cols: usize, pad: usize, offset: usize, eps: f32, seed: u64) {
    let (device, stream) = gpu();
    let mut rng = Rng::new(seed);
    let stride = cols + pad;
    let len = offset + rows * stride;
    let x: Vec<T> = rng.vec(len, -4.0, 4.0);
    let w: Vec<T> = rng.vec(offset + cols, -2.0, 2.0);
    let poison = vec![T::from_f64(f64::NAN); len];
    let x_dev = stream.clone_htod(&x).unwrap();
    let w_dev = stream.clone_htod(&w).unwrap();
    let y_dev = stream.clone_htod(&poison).unwrap();
    let params = RmsNormParams { dtype: T::DTYPE, rows, cols, x_row_stride: stride, y_row_stride: stride, eps };
    let base = |s: &cudarc::driver::CudaSlice<T>| {
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(s, &stream);
        ptr + (offset * size_of::<T>()) as u64
    };
    // SAFETY: each buffer holds offset + the extents described by params.
    unsafe { rmsnorm_raw(&device, stream.cu_stream(), &params, base(&x_dev), base(&w_dev), base(&y_dev)) }
        .unwrap_or_else(|e| panic!("launch {rows}x{cols}: {e}"));
    let y: Vec<T> = stream.clone_dtoh(&y_dev).unwrap();
    let expected = reference(&x[offset..], &w[offset..], rows, cols, stride, eps as f64);
    let got: Vec<T> = (0..rows).flat_map(|r| y[offset + r * stride..offset + r * stride + cols].to_vec()).collect();
    let what = format!("{} rows={rows} cols={cols} pad={pad} offset={offset}", T::DTYPE);
    // One rounding to the storage type, plus the f32 accumulation and rsqrt.approx.
    assert_close(&what, &got, &expected, 2.0, 1e-6);
    // Padding between rows stays untouched (still NaN).
    for r in 0..rows {
        for c in cols..stride {
            assert!(y[offset + r * stride + c].to_f64().is_nan(), "{what}: padding written at row {r} col {c}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_matches_reference_on_awkward_shapes() {
    for &(rows, cols) in &[(1, 1), (3, 97), (5, 1025), (7, 80), (2, 4096), (64, 8192), (33, 4097), (1, 65536)] {
        check_on_gpu::<f16>(rows, cols, 0, 0, 1e-6, rows as u64 * 7919 + cols as u64);
        check_on_gpu::<bf16>(rows, cols, 0, 0, 1e-5, rows as u64 * 31 + cols as u64);
        check_on_gpu::<f32>(rows, cols, 0, 0, 1e-6, rows as u64 * 131 + cols as u64);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_handles_strides_misalignment_and_in_place() {
    check_on_gpu::<f16>(9, 128, 8, 0, 1e-6, 1); // strided rows, vector path
    check_on_gpu::<f16>(9, 128, 3, 0, 1e-6, 2); // odd stride: scalar path
    check_on_gpu::<bf16>(4, 256, 0, 1, 1e-6, 3); // misaligned base: scalar path
    check_on_gpu::<f32>(6, 96, 4, 4, 1e-6, 4); // 16-byte aligned offset and stride
    // In place through the safe API's raw sibling.
    let (device, stream) = gpu();
    let mut rng = Rng::new(5);
    let (rows, cols) = (16, 1024);
    let x: Vec<f16> = rng.vec(rows * cols, -1.0, 1.0);
    let w: Vec<f16> = rng.vec(cols, 0.5, 1.5);
    let xy = stream.clone_htod(&x).unwrap();
    let w_dev = stream.clone_htod(&w).unwrap();
    let (p, _s) = cudarc::driver::DevicePtr::device_ptr(&xy, &stream);
    let (wp, _ws) = cudarc::driver::DevicePtr::device_ptr(&w_dev, &stream);
    let params = RmsNormParams::contiguous(DType::F16, rows, cols, 1e-6);
    // SAFETY: both buffers hold the extents described.
    unsafe { rmsnorm_raw(&device, stream.cu_stream(), &params, p, wp, p) }.unwrap();
    drop((_s, _ws));
    let y: Vec<f16> = stream.clone_dtoh(&xy).unwrap();
    assert_close("in place", &y, &reference(&x, &w, rows, cols, cols, 1e-6), 2.0, 1e-6);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_safe_api_checks_lengths_and_runs() {
    let (device, stream) = gpu();
    let mut rng = Rng::new(11);
    let (rows, cols) = (12, 768);
    let x: Vec<bf16> = rng.vec(rows * cols, -3.0, 3.0);
    let w: Vec<bf16> = rng.vec(cols, -1.0, 1.0);
    let x_dev = stream.clone_htod(&x).unwrap();
    let w_dev = stream.clone_htod(&w).unwrap();
    let mut short = stream.alloc_zeros::<bf16>(rows * cols - 1).unwrap();
    let err = rmsnorm(&device, &stream, &x_dev, &w_dev, &mut short, rows, cols, 1e-6).unwrap_err();
    assert!(err.to_string().contains("y holds 9215 elements, needs 9216"), "{err}");
    let mut y_dev = stream.alloc_zeros::<bf16>(rows * cols).unwrap();
    rmsnorm(&device, &stream, &x_dev, &w_dev, &mut y_dev, rows, cols, 1e-6).unwrap();
    let y: Vec<bf16> = stream.clone_dtoh(&y_dev).unwrap();
    assert_close("safe api", &y, &reference(&x, &w, rows, cols, cols, 1e-6), 2.0, 1e-6);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_matches_reference_on_random_shapes(
        rows in 1usize..40, cols in 1usize..5000, pad in 0usize..17, which in 0u8..3, seed: u64,
    ) {
        match which {
            0 => check_on_gpu::<f16>(rows, cols, pad, 0, 1e-6, seed),
            1 => check_on_gpu::<bf16>(rows, cols, pad, 0, 1e-6, seed),
            _ => check_on_gpu::<f32>(rows, cols, pad, 0, 1e-6, seed),
        }
    }
}
