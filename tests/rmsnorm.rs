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

// =============================================================================================
// Fused residual RMSNorm (SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization)

use common::Host;
use dlkern::dtype::Scalar;
use dlkern::ops::common::WeightsWritten;
use dlkern::ops::rmsnorm::launch::{
    SkipRmsNormBuffers, SkipRmsNormParams, SkipRmsNormPointers, skip_rmsnorm, skip_rmsnorm_raw_with,
};
use dlkern::ops::rmsnorm::reference::skip_rmsnorm as skip_reference;
use dlkern::registry::{self, AttrValue, Attributes};

const AWKWARD_ROWS: &[usize] = &[1, 7, 97, 1025];
const AWKWARD_HIDDEN: &[usize] = &[1, 7, 80, 97, 1025, 4096];

// ---------------------------------------------------------------------------------------------
// CPU reference

#[test]
fn skip_reference_matches_a_worked_example() {
    // s = [1, 2] + [2, 2] + [0, 0] = [3, 4]; rms = sqrt(12.5)
    let out = skip_reference(&[1.0f32, 2.0], Some(&[2.0, 2.0]), &[1.0, 2.0], Some(&[0.0, 0.0]), 1, 2, 1, 0.0);
    let rms = 12.5f64.sqrt();
    assert_eq!(out.sum, vec![3.0f32, 4.0]);
    assert!((out.inv_std_var[0] - 1.0 / rms).abs() < 1e-15);
    assert!((out.y[0] - 3.0 / rms).abs() < 1e-15 && (out.y[1] - 8.0 / rms).abs() < 1e-15, "{:?}", out.y);
}

#[test]
fn skip_reference_rounds_the_sum_before_normalizing() {
    // 1 + 2^-11 is not an f16: the sum rounds to 1 (ties to even), and y normalizes that.
    let x = [f16::ONE, f16::ONE];
    let skip = [f16::from_f64(2f64.powi(-11)), f16::ZERO];
    let out = skip_reference(&x, Some(&skip), &[f16::ONE, f16::ONE], None, 1, 2, 1, 0.0);
    assert_eq!(out.sum, vec![f16::ONE, f16::ONE]);
    assert_eq!(out.y, vec![1.0, 1.0]);
    assert_eq!(out.inv_std_var, vec![1.0]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Over the awkward shapes: without skip and bias it is RMSNorm; a broadcast skip is the
    /// tiled one; the sum is x + skip + bias; with gamma = 1 and eps = 0 rows have unit RMS and
    /// inv_std_var is 1 / rms(sum).
    #[test]
    fn skip_reference_properties(
        rows in prop::sample::select(AWKWARD_ROWS), cols in prop::sample::select(AWKWARD_HIDDEN),
        divisor in prop::sample::select(&[1usize, 7, 97][..]), seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let skip_rows = if rows % divisor == 0 { rows / divisor } else { rows };
        let x: Vec<f32> = rng.vec(rows * cols, -2.0, 2.0);
        let skip: Vec<f32> = rng.vec(skip_rows * cols, -2.0, 2.0);
        let bias: Vec<f32> = rng.vec(cols, -1.0, 1.0);
        let gamma: Vec<f32> = rng.vec(cols, -1.0, 1.0);
        let plain = skip_reference(&x, None, &gamma, None, rows, cols, 1, 1e-6);
        prop_assert_eq!(&plain.y, &reference(&x, &gamma, rows, cols, cols, 1e-6));
        prop_assert_eq!(&plain.sum, &x);
        let tiled: Vec<f32> = (0..rows).flat_map(|r| skip[(r % skip_rows) * cols..][..cols].to_vec()).collect();
        let broadcast = skip_reference(&x, Some(&skip), &gamma, Some(&bias), rows, cols, skip_rows, 1e-6);
        prop_assert_eq!(&broadcast, &skip_reference(&x, Some(&tiled), &gamma, Some(&bias), rows, cols, rows, 1e-6));
        for (i, s) in broadcast.sum.iter().enumerate() {
            prop_assert_eq!(*s, (x[i] as f64 + tiled[i] as f64 + bias[i % cols] as f64) as f32);
        }
        let ones = vec![1.0f32; cols];
        let unit = skip_reference(&x, Some(&skip), &ones, Some(&bias), rows, cols, skip_rows, 0.0);
        for (r, row) in unit.y.chunks(cols).enumerate() {
            let rms = (row.iter().map(|v| v * v).sum::<f64>() / cols as f64).sqrt();
            let sum = &unit.sum[r * cols..][..cols];
            let sum_rms = (sum.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64).sqrt();
            prop_assert!((rms - 1.0).abs() < 1e-9 || sum_rms == 0.0, "rms {}", rms);
            prop_assert!((unit.inv_std_var[r] * sum_rms - 1.0).abs() < 1e-12 || sum_rms == 0.0);
        }
    }

    /// A gamma broadcast over leading normalized axes is the tiled gamma.
    #[test]
    fn skip_reference_broadcasts_gamma(rows in 1usize..5, reps in 1usize..6, len in 1usize..40, seed: u64) {
        let mut rng = Rng::new(seed);
        let cols = reps * len;
        let x: Vec<bf16> = rng.vec(rows * cols, -3.0, 3.0);
        let gamma: Vec<bf16> = rng.vec(len, -1.0, 1.0);
        let tiled: Vec<bf16> = (0..cols).map(|c| gamma[c % len]).collect();
        prop_assert_eq!(
            skip_reference(&x, None, &gamma, None, rows, cols, 1, 1e-5),
            skip_reference(&x, None, &tiled, None, rows, cols, 1, 1e-5)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Fused launcher validation (no device needed)

const XS: u64 = 0x10_0000;
const SK: u64 = 0x20_0000;
const G: u64 = 0x30_0000;
const B: u64 = 0x40_0000;
const YS: u64 = 0x50_0000;
const SUM: u64 = 0x60_0000;
const MEAN: u64 = 0x70_0000;
const INV: u64 = 0x80_0000;

fn all_pointers() -> SkipRmsNormPointers {
    SkipRmsNormPointers { x: XS, skip: SK, gamma: G, bias: B, y: YS, sum: SUM, mean: MEAN, inv_std_var: INV }
}

fn skip_plan_error(params: SkipRmsNormParams, ptrs: SkipRmsNormPointers) -> String {
    match params.plan(&ptrs) {
        Err(e @ Error::InvalidArgument { kernel: "rmsnorm", .. }) => e.to_string(),
        other => panic!("expected an InvalidArgument for {params:?} {ptrs:?}, got {other:?}"),
    }
}

#[test]
fn skip_validation_rejects_bad_arguments_with_clear_messages() {
    let ok = SkipRmsNormParams::contiguous(DType::F16, 4, 64, 4, 1e-6);
    let p = all_pointers();
    assert!(ok.plan(&p).unwrap().is_some());
    let err = |params, ptrs| skip_plan_error(params, ptrs);
    assert!(err(SkipRmsNormParams { dtype: DType::I8, ..ok }, p).contains("dtype i8 not supported"));
    assert!(err(SkipRmsNormParams { cols: 0, ..ok }, p).contains("0 elements"));
    assert!(err(SkipRmsNormParams { scale_len: 48, ..ok }, p).contains("gamma has 48 elements"));
    assert!(err(SkipRmsNormParams { scale_len: 0, ..ok }, p).contains("gamma has 0 elements"));
    assert!(err(SkipRmsNormParams { eps: f32::INFINITY, ..ok }, p).contains("eps"));
    assert!(err(SkipRmsNormParams { skip_rows: 0, ..ok }, p).contains("skip_rows = 0"));
    assert!(err(SkipRmsNormParams { sum_row_stride: 63, ..ok }, p).contains("sum row stride 63"));
    assert!(err(SkipRmsNormParams { skip_row_stride: 8, ..ok }, p).contains("skip row stride 8"));
    assert!(err(SkipRmsNormParams { rows: 1 << 40, ..ok }, p).contains("grid limit"));
    for (name, ptrs) in [
        ("x", SkipRmsNormPointers { x: 0, ..p }),
        ("gamma", SkipRmsNormPointers { gamma: 0, ..p }),
        ("y", SkipRmsNormPointers { y: 0, ..p }),
    ] {
        assert!(err(ok, ptrs).contains(&format!("{name} is a null pointer")), "{name}");
    }
    assert!(err(ok, SkipRmsNormPointers { bias: B + 1, ..p }).contains("bias at 0x400001 is not 2-byte aligned"));
    assert!(err(ok, SkipRmsNormPointers { inv_std_var: INV + 2, ..p }).contains("inv_std_var at 0x800002"));
    assert!(err(ok, SkipRmsNormPointers { y: XS + 2, ..p }).contains("y overlaps x without being exactly it"));
    assert!(err(ok, SkipRmsNormPointers { sum: SK + 64, ..p }).contains("sum overlaps skip without being exactly it"));
    assert!(err(ok, SkipRmsNormPointers { sum: YS + 8, ..p }).contains("y overlaps sum"));
    assert!(err(ok, SkipRmsNormPointers { y: G, ..p }).contains("y overlaps gamma"));
    assert!(err(ok, SkipRmsNormPointers { mean: INV + 4, ..p }).contains("mean overlaps inv_std_var"));
    assert!(err(ok, SkipRmsNormPointers { inv_std_var: XS + 8, ..p }).contains("inv_std_var overlaps x"));
    // A broadcast skip is read by every row: nothing may overwrite it.
    let broadcast = SkipRmsNormParams { skip_rows: 1, ..ok };
    assert!(err(broadcast, SkipRmsNormPointers { y: SK, ..p }).contains("y overlaps skip"));
    assert!(err(broadcast, SkipRmsNormPointers { sum: SK, ..p }).contains("sum overlaps skip"));
}

#[test]
fn skip_plans_allow_exact_in_place_and_pick_variants() {
    let p = all_pointers();
    let ok = SkipRmsNormParams::contiguous(DType::F16, 8, 4096, 8, 1e-6);
    for ptrs in [
        SkipRmsNormPointers { y: XS, ..p },
        SkipRmsNormPointers { y: SK, ..p },
        SkipRmsNormPointers { sum: XS, ..p },
        SkipRmsNormPointers { sum: SK, ..p },
        SkipRmsNormPointers { y: XS, sum: SK, ..p },
    ] {
        assert!(ok.plan(&ptrs).unwrap().is_some(), "{ptrs:?}");
    }
    let plan = ok.plan(&p).unwrap().unwrap();
    assert_eq!((plan.kernel, plan.dims.grid, plan.dims.block), ("rmsnorm_skip_vec_f16", (8, 1, 1), (256, 1, 1)));
    assert_eq!((plan.args.cols, plan.args.scale_len, plan.args.skip_rows), (4096, 4096, 8));
    // Absent optional tensors: zero addresses, and their misalignment cannot matter.
    let bare = SkipRmsNormPointers { x: XS, gamma: G, y: YS, ..SkipRmsNormPointers::default() };
    assert_eq!(ok.plan(&bare).unwrap().unwrap().kernel, "rmsnorm_skip_vec_f16");
    assert_eq!(ok.plan(&SkipRmsNormPointers { sum: SUM + 2, ..p }).unwrap().unwrap().kernel, "rmsnorm_skip_scalar_f16");
    let odd = SkipRmsNormParams::contiguous(DType::BF16, 3, 97, 1, 1e-6).plan(&p).unwrap().unwrap();
    assert_eq!((odd.kernel, odd.dims.block), ("rmsnorm_skip_scalar_bf16", (128, 1, 1)));
    let strided = SkipRmsNormParams { skip_row_stride: 4100, ..ok };
    assert_eq!(strided.plan(&p).unwrap().unwrap().kernel, "rmsnorm_skip_scalar_f16", "stride not 16-byte");
    let scale = SkipRmsNormParams { scale_len: 1024, ..ok };
    assert_eq!(scale.plan(&p).unwrap().unwrap().kernel, "rmsnorm_skip_vec_f16");
    // Long rows take more threads so each thread's share stays in registers.
    let long = SkipRmsNormParams::contiguous(DType::F16, 2, 65536, 2, 1e-6).plan(&p).unwrap().unwrap();
    assert_eq!(long.dims.block, (512, 1, 1));
    let mid = SkipRmsNormParams::contiguous(DType::F32, 2, 8192, 2, 1e-6).plan(&p).unwrap().unwrap();
    assert_eq!(mid.dims.block, (512, 1, 1));
    assert_eq!(SkipRmsNormParams { rows: 0, ..ok }.plan(&p).unwrap(), None, "zero rows launch nothing");
}

proptest! {
    /// Any parameters and addresses: validation answers without panicking; an accepted vector
    /// plan satisfies the vector kernel's alignment contract and blocks are whole warps.
    #[test]
    fn skip_validation_never_panics(
        dtype in prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16), Just(DType::I32)],
        rows in 0usize..1 << 33, cols in 0usize..1 << 34, scale_len in 0usize..1 << 34, skip_rows in 0usize..1 << 33,
        strides in prop::array::uniform4(0usize..1 << 34), eps in proptest::num::f32::ANY,
        addrs in prop::array::uniform8(prop_oneof![Just(0u64), 0u64..1 << 48]),
    ) {
        let params = SkipRmsNormParams {
            dtype, rows, cols, scale_len, skip_rows, x_row_stride: strides[0], skip_row_stride: strides[1],
            y_row_stride: strides[2], sum_row_stride: strides[3], eps,
        };
        let [x, skip, gamma, bias, y, sum, mean, inv_std_var] = addrs;
        let ptrs = SkipRmsNormPointers { x, skip, gamma, bias, y, sum, mean, inv_std_var };
        if let Ok(Some(plan)) = params.plan(&ptrs) {
            if plan.kernel.contains("_vec_") {
                prop_assert!([x, skip, gamma, bias, y, sum].iter().all(|a| a % 16 == 0));
                prop_assert!((cols * dtype.size_bytes()) % 16 == 0 && (scale_len * dtype.size_bytes()) % 16 == 0);
            }
            prop_assert!(cols % scale_len == 0);
            prop_assert!(plan.dims.block.0 % 32 == 0 && plan.dims.block.0 <= 1024);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The registry kernels on CPU tensors (what the CPU execution provider runs)

fn call(name: &str, tensors: &mut [DLTensorOf], inputs: usize, attrs: &Attributes) -> dlkern::Result<()> {
    let mut dl: Vec<_> = tensors.iter_mut().map(|t| t.dl()).collect();
    // SAFETY: host tensors alive for the call.
    unsafe { registry::call(name, &mut dl, inputs, std::ptr::null_mut(), attrs) }
}

/// A host tensor of any of the test's element types, for heterogeneous calls.
enum DLTensorOf {
    F32(Host<f32>),
    F16(Host<f16>),
    I32(Host<i32>),
    /// A 0-element placeholder: an omitted optional input or output.
    Absent(Host<f32>),
}

impl DLTensorOf {
    fn dl(&mut self) -> dlkern::dlpack::DLTensor {
        match self {
            DLTensorOf::F32(h) | DLTensorOf::Absent(h) => h.dl(),
            DLTensorOf::F16(h) => h.dl(),
            DLTensorOf::I32(h) => h.dl(),
        }
    }
    fn f32s(&self) -> &[f32] {
        match self {
            DLTensorOf::F32(h) => &h.data,
            _ => panic!("not f32"),
        }
    }
}

fn absent() -> DLTensorOf {
    DLTensorOf::Absent(Host::new(vec![], &[0]))
}

fn host<T: Scalar + Element>(rng: &mut Rng, shape: &[i64]) -> Host<T> {
    let n = shape.iter().product::<i64>() as usize;
    Host::new(rng.vec(n, -2.0, 2.0), shape)
}

const SKIP_OP: &str = "dlkern.skip_simplified_layer_normalization";
const SIMPLIFIED_OP: &str = "dlkern.simplified_layer_normalization";

#[test]
fn skip_op_on_cpu_matches_the_reference_with_every_output_combination() {
    let mut rng = Rng::new(3);
    let (b, s, h) = (3usize, 5usize, 24usize);
    let x = host::<f32>(&mut rng, &[b as i64, s as i64, h as i64]);
    let eps = 1e-4;
    let attrs = Attributes::new().with("epsilon", AttrValue::Float(eps));
    for skip_shape in [vec![b as i64, s as i64, h as i64], vec![1, s as i64, h as i64], vec![s as i64, h as i64]] {
        let skip = host::<f32>(&mut rng, &skip_shape);
        let gamma = host::<f32>(&mut rng, &[h as i64]);
        let bias = host::<f32>(&mut rng, &[h as i64]);
        let skip_rows = skip.data.len() / h;
        for with_bias in [false, true] {
            let expected = skip_reference(
                &x.data,
                Some(&skip.data),
                &gamma.data,
                with_bias.then_some(&bias.data[..]),
                b * s,
                h,
                skip_rows,
                eps,
            );
            for outputs in 1..=4usize {
                for mask in 0..1u32 << (outputs - 1) {
                    let present = |i: usize| i == 0 || mask & (1 << (i - 1)) != 0;
                    let stats = || DLTensorOf::F32(Host::new(vec![f32::NAN; b * s], &[b as i64, s as i64, 1]));
                    let full = || DLTensorOf::F32(Host::new(vec![f32::NAN; b * s * h], &x.shape));
                    let mut t = vec![
                        DLTensorOf::F32(Host::new(x.data.clone(), &x.shape)),
                        DLTensorOf::F32(Host::new(skip.data.clone(), &skip.shape)),
                        DLTensorOf::F32(Host::new(gamma.data.clone(), &gamma.shape)),
                        if with_bias { DLTensorOf::F32(Host::new(bias.data.clone(), &bias.shape)) } else { absent() },
                    ];
                    for i in 0..outputs {
                        t.push(if !present(i) {
                            absent()
                        } else if i == 1 || i == 2 {
                            stats()
                        } else {
                            full()
                        });
                    }
                    call(SKIP_OP, &mut t, 4, &attrs).unwrap();
                    let what = format!("skip {skip_shape:?} bias {with_bias} outputs {outputs} mask {mask}");
                    let y: Vec<f64> = expected.y.iter().map(|&v| v as f32 as f64).collect();
                    assert_eq!(t[4].f32s().iter().map(|&v| v as f64).collect::<Vec<_>>(), y, "{what}");
                    if outputs > 1 && present(1) {
                        assert!(t[5].f32s().iter().all(|&m| m == 0.0), "{what}: mean");
                    }
                    if outputs > 2 && present(2) {
                        let inv: Vec<f32> = expected.inv_std_var.iter().map(|&v| v as f32).collect();
                        assert_eq!(t[6].f32s(), &inv[..], "{what}: inv_std_var");
                    }
                    if outputs > 3 && present(3) {
                        assert_eq!(t[7].f32s(), &expected.sum[..], "{what}: sum");
                    }
                }
            }
        }
    }
}

#[test]
fn skip_op_reports_bad_inputs_as_errors() {
    let mut rng = Rng::new(4);
    let f = |rng: &mut Rng, shape: &[i64]| DLTensorOf::F32(host::<f32>(rng, shape));
    let none = Attributes::new();
    let run = |inputs: Vec<DLTensorOf>, outputs: Vec<DLTensorOf>| {
        let n = inputs.len();
        let mut t: Vec<DLTensorOf> = inputs.into_iter().chain(outputs).collect();
        call(SKIP_OP, &mut t, n, &none).unwrap_err().to_string()
    };
    let msg = run(vec![f(&mut rng, &[5, 8]), f(&mut rng, &[5, 4]), f(&mut rng, &[8])], vec![f(&mut rng, &[5, 8])]);
    assert!(msg.contains("skip is expected to have same shape as input"), "{msg}");
    let msg =
        run(vec![f(&mut rng, &[2, 5, 8]), f(&mut rng, &[2, 4, 8]), f(&mut rng, &[8])], vec![f(&mut rng, &[2, 5, 8])]);
    assert!(msg.contains("last two dimensions of skip needs to be same as input"), "{msg}");
    let msg =
        run(vec![f(&mut rng, &[2, 5, 8]), f(&mut rng, &[2, 5, 8]), f(&mut rng, &[7])], vec![f(&mut rng, &[2, 5, 8])]);
    assert!(msg.contains("Last dimension of gamma and input does not match (7 vs 8)"), "{msg}");
    let msg = run(
        vec![f(&mut rng, &[1, 2, 5, 8]), f(&mut rng, &[1, 2, 5, 8]), f(&mut rng, &[8])],
        vec![f(&mut rng, &[1, 2, 5, 8])],
    );
    assert!(msg.contains("input is expected to have 3 or 2 dimensions, got 4"), "{msg}");
    // Missing gamma: two inputs.
    let msg = run(vec![f(&mut rng, &[2, 8]), f(&mut rng, &[2, 8])], vec![f(&mut rng, &[2, 8])]);
    assert!(msg.contains("inputs"), "{msg}");
    // Wrong and mixed dtypes.
    let ints = DLTensorOf::I32(Host::new(vec![0; 16], &[2, 8]));
    let msg = run(vec![ints, f(&mut rng, &[2, 8]), f(&mut rng, &[8])], vec![f(&mut rng, &[2, 8])]);
    assert!(msg.contains("dtype i32"), "{msg}");
    let half = DLTensorOf::F16(Host::new(vec![f16::ONE; 16], &[2, 8]));
    let msg = run(vec![f(&mut rng, &[2, 8]), half, f(&mut rng, &[8])], vec![f(&mut rng, &[2, 8])]);
    assert!(msg.contains("dtype f16 differs from input's f32"), "{msg}");
    // Output shapes and types.
    let msg = run(vec![f(&mut rng, &[2, 8]), f(&mut rng, &[2, 8]), f(&mut rng, &[8])], vec![f(&mut rng, &[8, 2])]);
    assert!(msg.contains("shape [8, 2] (expected [2, 8])"), "{msg}");
    let msg = run(
        vec![f(&mut rng, &[2, 8]), f(&mut rng, &[2, 8]), f(&mut rng, &[8])],
        vec![f(&mut rng, &[2, 8]), absent(), f(&mut rng, &[2])],
    );
    assert!(msg.contains("tensor 'inv_std_var': shape [2] (expected [2, 1])"), "{msg}");
    // The sum may not be y.
    let mut t = [f(&mut rng, &[2, 8]), f(&mut rng, &[2, 8]), f(&mut rng, &[8]), f(&mut rng, &[2, 8])];
    let mut hole = absent();
    let mut dl: Vec<_> = t.iter_mut().map(|t| t.dl()).collect();
    // Outputs y, '', '', and the sum over y itself.
    dl.extend([hole.dl(), hole.dl(), dl[3]]);
    // SAFETY: host tensors alive for the call.
    let err = unsafe { registry::call(SKIP_OP, &mut dl, 3, std::ptr::null_mut(), &none) }.unwrap_err();
    assert!(err.to_string().contains("y overlaps sum"), "{err}");
}

#[test]
fn simplified_op_on_cpu_handles_axis_and_broadcast_scale() {
    let mut rng = Rng::new(5);
    let x = host::<f16>(&mut rng, &[3, 4, 10]);
    for (axis, scale_shape) in
        [(-1i64, vec![10i64]), (2, vec![10]), (1, vec![4, 10]), (-2, vec![10]), (0, vec![1, 4, 10])]
    {
        let scale = host::<f16>(&mut rng, &scale_shape);
        let first = if axis < 0 { axis + 3 } else { axis } as usize;
        let cols: usize = x.shape[first..].iter().product::<i64>() as usize;
        let rows = x.data.len() / cols;
        let stats: Vec<i64> = x.shape.iter().enumerate().map(|(a, &d)| if a < first { d } else { 1 }).collect();
        let mut t = vec![
            DLTensorOf::F16(Host::new(x.data.clone(), &x.shape)),
            DLTensorOf::F16(Host::new(scale.data.clone(), &scale.shape)),
            DLTensorOf::F16(Host::new(vec![f16::NAN; x.data.len()], &x.shape)),
            DLTensorOf::F32(Host::new(vec![f32::NAN; rows], &stats)),
        ];
        let attrs = Attributes::new().with("axis", AttrValue::Int(axis)).with("stash_type", AttrValue::Int(1));
        call(SIMPLIFIED_OP, &mut t, 2, &attrs).unwrap();
        let expected = skip_reference(&x.data, None, &scale.data, None, rows, cols, 1, 1e-5);
        let DLTensorOf::F16(y) = &t[2] else { unreachable!() };
        let want: Vec<f16> = expected.y.iter().map(|&v| f16::from_f64(v)).collect();
        assert_eq!(y.data, want, "axis {axis}");
        let inv: Vec<f32> = expected.inv_std_var.iter().map(|&v| v as f32).collect();
        assert_eq!(t[3].f32s(), &inv[..], "axis {axis}");
    }
}

#[test]
fn simplified_op_reports_bad_inputs_as_errors() {
    let mut rng = Rng::new(6);
    let f = |rng: &mut Rng, shape: &[i64]| DLTensorOf::F32(host::<f32>(rng, shape));
    let run = |t: Vec<DLTensorOf>, attrs: Attributes| {
        let mut t = t;
        call(SIMPLIFIED_OP, &mut t, 2, &attrs).unwrap_err().to_string()
    };
    let axis = |a: i64| Attributes::new().with("axis", AttrValue::Int(a));
    let msg = run(vec![f(&mut rng, &[2, 3, 8]), f(&mut rng, &[8]), f(&mut rng, &[2, 3, 8])], axis(3));
    assert!(msg.contains("axis 3 is not in valid range [-3, 2]"), "{msg}");
    let msg = run(vec![f(&mut rng, &[2, 3, 8]), f(&mut rng, &[24]), f(&mut rng, &[2, 3, 8])], axis(1));
    assert!(msg.contains("shape [24] is neither X.shape[axis:] = [3, 8] nor a suffix of it"), "{msg}");
    let msg = run(vec![f(&mut rng, &[2, 3, 8]), f(&mut rng, &[3, 1]), f(&mut rng, &[2, 3, 8])], axis(1));
    assert!(msg.contains("shape [3, 1] is neither"), "{msg}");
    let stash = Attributes::new().with("stash_type", AttrValue::Int(11));
    let msg = run(vec![f(&mut rng, &[2, 8]), f(&mut rng, &[8]), f(&mut rng, &[2, 8])], stash);
    assert!(msg.contains("stash_type = 11"), "{msg}");
    let half = DLTensorOf::F16(Host::new(vec![f16::ONE; 8], &[8]));
    let msg = run(vec![f(&mut rng, &[2, 8]), half, f(&mut rng, &[2, 8])], Attributes::new());
    assert!(msg.contains("scale is f16 but X is f32"), "{msg}");
    let msg = run(
        vec![f(&mut rng, &[2, 8]), f(&mut rng, &[8]), f(&mut rng, &[2, 8]), f(&mut rng, &[2, 8])],
        Attributes::new(),
    );
    assert!(msg.contains("inv_std_var"), "{msg}");
    let msg = run(vec![f(&mut rng, &[2, 8])], Attributes::new());
    assert!(msg.contains("inputs") || msg.contains("input 1"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// Fused kernel on the GPU against the reference

/// Which outputs a GPU case writes, and which aliasing it exercises.
#[derive(Clone, Copy, Debug)]
struct Case {
    rows: usize,
    cols: usize,
    skip_rows: usize,
    /// `None`: no skip (SimplifiedLayerNormalization).
    skip: bool,
    bias: bool,
    sum: bool,
    stats: bool,
    /// Elements of gamma (divides cols).
    scale_len: usize,
    /// Elements of padding after each row of x, y and sum.
    pad: usize,
    in_place: InPlace,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum InPlace {
    No,
    YIsX,
    SumIsX,
    SumIsSkip,
}

impl Case {
    fn new(rows: usize, cols: usize) -> Self {
        Case {
            rows,
            cols,
            skip_rows: rows,
            skip: true,
            bias: false,
            sum: true,
            stats: false,
            scale_len: cols,
            pad: 0,
            in_place: InPlace::No,
        }
    }
}

fn check_skip_on_gpu<T: Element>(c: Case, seed: u64) {
    use cudarc::driver::{CudaSlice, DevicePtr};
    let (device, stream) = gpu();
    let mut rng = Rng::new(seed);
    let stride = c.cols + c.pad;
    let len = c.rows * stride;
    let x: Vec<T> = rng.vec(len, -3.0, 3.0);
    let skip: Vec<T> = rng.vec(c.skip_rows * stride, -3.0, 3.0);
    let gamma: Vec<T> = rng.vec(c.scale_len, -1.5, 1.5);
    let bias: Vec<T> = rng.vec(c.cols, -1.0, 1.0);
    let nan = T::from_f64(f64::NAN);
    let x_dev = stream.clone_htod(&x).unwrap();
    let skip_dev = stream.clone_htod(&skip).unwrap();
    let g_dev = stream.clone_htod(&gamma).unwrap();
    let b_dev = stream.clone_htod(&bias).unwrap();
    let y_dev = stream.clone_htod(&vec![nan; len]).unwrap();
    let sum_dev = stream.clone_htod(&vec![nan; len]).unwrap();
    let mean_dev = stream.clone_htod(&vec![f32::NAN; c.rows]).unwrap();
    let inv_dev = stream.clone_htod(&vec![f32::NAN; c.rows]).unwrap();
    let ptr = |s: &CudaSlice<T>| s.device_ptr(&stream).0;
    let ptr32 = |s: &CudaSlice<f32>| s.device_ptr(&stream).0;
    let params = SkipRmsNormParams {
        dtype: T::DTYPE,
        rows: c.rows,
        cols: c.cols,
        scale_len: c.scale_len,
        skip_rows: c.skip_rows,
        x_row_stride: stride,
        skip_row_stride: stride,
        y_row_stride: stride,
        sum_row_stride: stride,
        eps: 1e-6,
    };
    let opt = |on: bool, p: u64| if on { p } else { 0 };
    let mut ptrs = SkipRmsNormPointers {
        x: ptr(&x_dev),
        skip: opt(c.skip, ptr(&skip_dev)),
        gamma: ptr(&g_dev),
        bias: opt(c.bias, ptr(&b_dev)),
        y: ptr(&y_dev),
        sum: opt(c.sum, ptr(&sum_dev)),
        mean: opt(c.stats, ptr32(&mean_dev)),
        inv_std_var: opt(c.stats, ptr32(&inv_dev)),
    };
    match c.in_place {
        InPlace::No => {}
        InPlace::YIsX => ptrs.y = ptrs.x,
        InPlace::SumIsX => ptrs.sum = ptrs.x,
        InPlace::SumIsSkip => ptrs.sum = ptrs.skip,
    }
    // Every other seed reads gamma and bias before its wait for the grid before it (in place
    // since their synchronous upload).
    let constants = if seed % 2 == 1 { WeightsWritten::Before } else { WeightsWritten::ByPreviousKernel };
    // SAFETY: every buffer holds the extents the parameters describe; gamma and bias were
    // uploaded before any kernel ran.
    unsafe { skip_rmsnorm_raw_with(&device, stream.cu_stream(), &params, &ptrs, constants) }
        .unwrap_or_else(|e| panic!("launch {c:?}: {e}"));
    let rows_of =
        |v: &[T], rows: usize| -> Vec<T> { (0..rows).flat_map(|r| v[r * stride..][..c.cols].to_vec()).collect() };
    let expected = skip_reference(
        &rows_of(&x, c.rows),
        c.skip.then(|| rows_of(&skip, c.skip_rows)).as_deref(),
        &gamma,
        c.bias.then_some(&bias[..]),
        c.rows,
        c.cols,
        c.skip_rows,
        1e-6,
    );
    let what = format!("{} {c:?}", T::DTYPE);
    let y_buf = if c.in_place == InPlace::YIsX { &x_dev } else { &y_dev };
    let y_all: Vec<T> = stream.clone_dtoh(y_buf).unwrap();
    // One rounding to T, the f32 arithmetic and rsqrt.approx (about 2 f32 ulps, and the f32
    // sum of squares of long rows adds a few more).
    let f32_storage = T::DTYPE == DType::F32;
    assert_close(&what, &rows_of(&y_all, c.rows), &expected.y, if f32_storage { 16.0 } else { 3.0 }, 1e-6);
    if c.sum {
        let sum_buf = match c.in_place {
            InPlace::SumIsX => &x_dev,
            InPlace::SumIsSkip => &skip_dev,
            _ => &sum_dev,
        };
        let sum_all: Vec<T> = stream.clone_dtoh(sum_buf).unwrap();
        let sum_ref: Vec<f64> = expected.sum.iter().map(|v| v.to_f64()).collect();
        // f16/bf16 operands add exactly in f32, so the sum rounds as the f64 one does; f32 ones
        // round twice, an ulp of the operands (|x|, |skip| <= 3) where they cancel.
        let abs = if f32_storage { 2e-6 } else { 1e-30 };
        assert_close(&format!("{what} sum"), &rows_of(&sum_all, c.rows), &sum_ref, 2.0, abs);
    } else {
        let untouched: Vec<T> = stream.clone_dtoh(&sum_dev).unwrap();
        assert!(untouched.iter().all(|v| v.to_f64().is_nan()), "{what}: sum written though absent");
    }
    let mean: Vec<f32> = stream.clone_dtoh(&mean_dev).unwrap();
    let inv: Vec<f32> = stream.clone_dtoh(&inv_dev).unwrap();
    if c.stats {
        assert!(mean.iter().all(|&m| m == 0.0), "{what}: mean");
        assert_close(&format!("{what} inv_std_var"), &inv, &expected.inv_std_var, 64.0, 0.0);
    } else {
        assert!(mean.iter().chain(&inv).all(|v| v.is_nan()), "{what}: statistics written though absent");
    }
    if c.pad > 0 && c.in_place != InPlace::YIsX {
        for r in 0..c.rows {
            assert!(y_all[r * stride + c.cols..][..c.pad].iter().all(|v| v.to_f64().is_nan()), "{what}: padding");
        }
    }
}

fn for_each_dtype(c: Case, seed: u64) {
    check_skip_on_gpu::<f16>(c, seed);
    check_skip_on_gpu::<bf16>(c, seed + 1);
    check_skip_on_gpu::<f32>(c, seed + 2);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_skip_matches_reference_on_awkward_shapes() {
    for &rows in AWKWARD_ROWS {
        for &cols in AWKWARD_HIDDEN {
            let seed = (rows * 7919 + cols) as u64;
            for_each_dtype(Case { bias: rows % 2 == 1, stats: cols % 2 == 0, ..Case::new(rows, cols) }, seed);
        }
    }
    // Rows past what the registers keep (the re-read path), with and without a sum to re-read.
    for cols in [65536, 65536 + 8, 40_001] {
        for sum in [false, true] {
            for_each_dtype(Case { sum, bias: true, stats: true, ..Case::new(3, cols) }, cols as u64);
        }
    }
}

/// A chain of fused norms, each reading what the one before wrote, launched back to back as
/// programmatic dependents with their scales marked constant (read before each kernel's wait):
/// every step must be the reference of its own input, so a read of `x` or `skip` before the
/// wait (a NaN of the buffer's initial contents, or a stale value) fails the test.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_skip_chain_of_programmatic_dependents_matches_reference() {
    use cudarc::driver::DevicePtr;
    let (device, stream) = gpu();
    let mut rng = Rng::new(45);
    for (rows, cols) in [(1, 4096), (16, 4096), (3, 97), (2, 65536 + 8)] {
        let steps = 24;
        let len = rows * cols;
        let gamma: Vec<f16> = rng.vec(cols, 0.5, 1.5);
        let bias: Vec<f16> = rng.vec(cols, -0.5, 0.5);
        let g_dev = stream.clone_htod(&gamma).unwrap();
        let b_dev = stream.clone_htod(&bias).unwrap();
        // Step i reads bufs[i] as x and sums[i] as skip, writes bufs[i + 1] and sums[i + 1].
        let first: Vec<f16> = rng.vec(len, -3.0, 3.0);
        let first_skip: Vec<f16> = rng.vec(len, -3.0, 3.0);
        let nan = vec![f16::NAN; len];
        let bufs: Vec<_> =
            (0..=steps).map(|i| stream.clone_htod(if i == 0 { &first } else { &nan }).unwrap()).collect();
        let sums: Vec<_> =
            (0..=steps).map(|i| stream.clone_htod(if i == 0 { &first_skip } else { &nan }).unwrap()).collect();
        stream.synchronize().unwrap();
        let params = SkipRmsNormParams::contiguous(DType::F16, rows, cols, rows, 1e-6);
        let ptr = |s: &cudarc::driver::CudaSlice<f16>| s.device_ptr(&stream).0;
        for i in 0..steps {
            let ptrs = SkipRmsNormPointers {
                x: ptr(&bufs[i]),
                skip: ptr(&sums[i]),
                gamma: ptr(&g_dev),
                bias: ptr(&b_dev),
                y: ptr(&bufs[i + 1]),
                sum: ptr(&sums[i + 1]),
                ..SkipRmsNormPointers::default()
            };
            // SAFETY: every buffer holds rows x cols elements; gamma and bias were uploaded and
            // synchronized before the chain, and no kernel writes them.
            unsafe { skip_rmsnorm_raw_with(&device, stream.cu_stream(), &params, &ptrs, WeightsWritten::Before) }
                .unwrap();
        }
        let host: Vec<Vec<f16>> = bufs.iter().map(|b| stream.clone_dtoh(b).unwrap()).collect();
        let host_sums: Vec<Vec<f16>> = sums.iter().map(|b| stream.clone_dtoh(b).unwrap()).collect();
        for i in 0..steps {
            let want = skip_reference(&host[i], Some(&host_sums[i]), &gamma, Some(&bias), rows, cols, rows, 1e-6);
            assert_close(&format!("{rows}x{cols} step {i}"), &host[i + 1], &want.y, 3.0, 1e-6);
            assert_eq!(host_sums[i + 1], want.sum, "{rows}x{cols} step {i}: sum");
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_skip_outputs_bias_broadcast_and_scale() {
    let (rows, cols) = (97, 4096);
    for (sum, stats) in [(true, false), (false, false), (false, true), (true, true)] {
        for bias in [false, true] {
            for_each_dtype(Case { sum, stats, bias, ..Case::new(rows, cols) }, 17);
        }
    }
    // Broadcast skips: one row for all ([1, H] / [S, H] with S = 1), and a batch of 1 over 5.
    for_each_dtype(Case { skip_rows: 1, bias: true, ..Case::new(rows, cols) }, 18);
    for_each_dtype(Case { skip_rows: 205, ..Case::new(1025, 80) }, 19);
    for_each_dtype(Case { skip_rows: 7, stats: true, ..Case::new(7 * 3, 97) }, 20);
    // SimplifiedLayerNormalization: no skip, no sum; a scale broadcast over a leading axis.
    for_each_dtype(Case { skip: false, sum: false, stats: true, ..Case::new(33, 4096) }, 21);
    for_each_dtype(Case { skip: false, sum: false, stats: true, scale_len: 256, ..Case::new(9, 1024) }, 22);
    for_each_dtype(Case { skip: false, sum: false, scale_len: 97, ..Case::new(9, 97 * 3) }, 23);
    // Strided rows: 16-byte strides keep the vector path, odd ones take the scalar one.
    for_each_dtype(Case { pad: 8, bias: true, stats: true, ..Case::new(9, 1024) }, 24);
    for_each_dtype(Case { pad: 3, ..Case::new(9, 1024) }, 25);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_skip_in_place() {
    for in_place in [InPlace::YIsX, InPlace::SumIsX, InPlace::SumIsSkip] {
        for cols in [4096, 97, 65536] {
            for_each_dtype(Case { in_place, bias: true, stats: true, ..Case::new(16, cols) }, cols as u64);
        }
    }
    // y over x with a broadcast skip; the sum over the skip needs a skip that is not broadcast.
    for_each_dtype(Case { in_place: InPlace::YIsX, skip_rows: 1, ..Case::new(16, 4096) }, 31);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_skip_safe_api_and_registry_on_cuda_tensors() {
    use cudarc::driver::DevicePtr;
    let (device, stream) = gpu();
    let mut rng = Rng::new(41);
    let (b, s, h) = (2usize, 16usize, 4096usize);
    let rows = b * s;
    let x: Vec<f16> = rng.vec(rows * h, -3.0, 3.0);
    let skip: Vec<f16> = rng.vec(s * h, -3.0, 3.0);
    let gamma: Vec<f16> = rng.vec(h, -1.0, 1.0);
    let x_dev = stream.clone_htod(&x).unwrap();
    let skip_dev = stream.clone_htod(&skip).unwrap();
    let g_dev = stream.clone_htod(&gamma).unwrap();
    let mut y_dev = stream.alloc_zeros::<f16>(rows * h).unwrap();
    let mut sum_dev = stream.alloc_zeros::<f16>(rows * h).unwrap();
    let mut short = stream.alloc_zeros::<f16>(rows * h - 1).unwrap();
    let buffers = |y, sum| SkipRmsNormBuffers {
        x: &x_dev,
        skip: Some(&skip_dev),
        gamma: &g_dev,
        bias: None,
        y,
        sum,
        inv_std_var: None,
    };
    let err = skip_rmsnorm(&device, &stream, buffers(&mut short, None), rows, h, s, 1e-6).unwrap_err();
    assert!(err.to_string().contains("y holds 131071 elements, needs 131072"), "{err}");
    skip_rmsnorm(&device, &stream, buffers(&mut y_dev, Some(&mut sum_dev)), rows, h, s, 1e-6).unwrap();
    let expected = skip_reference(&x, Some(&skip), &gamma, None, rows, h, s, 1e-6);
    assert_close("safe api", &stream.clone_dtoh(&y_dev).unwrap(), &expected.y, 3.0, 1e-6);
    assert_eq!(stream.clone_dtoh(&sum_dev).unwrap(), expected.sum);
    // The registry kernel with ORT's shapes on CUDA tensors: [B, S, H] input, [S, H] skip,
    // outputs [y, '', '', sum] (placeholders for the omitted ones).
    let mut y2 = stream.alloc_zeros::<f16>(rows * h).unwrap();
    let mut sum2 = stream.alloc_zeros::<f16>(rows * h).unwrap();
    let shape = [b as i64, s as i64, h as i64];
    let (xp, gp, sp) = (x_dev.device_ptr(&stream).0, g_dev.device_ptr(&stream).0, skip_dev.device_ptr(&stream).0);
    let (yp, sump) = (
        cudarc::driver::DevicePtrMut::device_ptr_mut(&mut y2, &stream).0,
        cudarc::driver::DevicePtrMut::device_ptr_mut(&mut sum2, &stream).0,
    );
    let mut hx = Host::<f16>::new(vec![], &shape);
    let mut hs = Host::<f16>::new(vec![], &[s as i64, h as i64]);
    let mut hg = Host::<f16>::new(vec![], &[h as i64]);
    let mut hy = Host::<f16>::new(vec![], &shape);
    let mut hsum = Host::<f16>::new(vec![], &shape);
    let mut hole = Host::<f32>::new(vec![], &[0]);
    let mut tensors = [
        common::on_cuda(hx.dl(), xp),
        common::on_cuda(hs.dl(), sp),
        common::on_cuda(hg.dl(), gp),
        common::on_cuda(hole.dl(), 0),
        common::on_cuda(hy.dl(), yp),
        common::on_cuda(hole.dl(), 0),
        common::on_cuda(hole.dl(), 0),
        common::on_cuda(hsum.dl(), sump),
    ];
    let attrs = Attributes::new().with("epsilon", AttrValue::Float(1e-6));
    // SAFETY: device buffers of the described extents, alive for the call, on this stream.
    unsafe { registry::call(SKIP_OP, &mut tensors, 4, stream.cu_stream().cast(), &attrs) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(stream.clone_dtoh(&y2).unwrap(), stream.clone_dtoh(&y_dev).unwrap());
    assert_eq!(stream.clone_dtoh(&sum2).unwrap(), expected.sum);
}
