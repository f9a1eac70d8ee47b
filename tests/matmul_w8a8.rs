//! W8A8 pieces: the per-row int8 quantizer's error bound and rounding, the overflow bound of
//! int32 accumulation, and the exact integer reference at int8 extremes.

mod common;

use common::Rng;
use dlkern::ops::matmul_w8a8::pack::{self, MAX_K_I32, quantize_rows};
use dlkern::ops::matmul_w8a8::reference::matmul_reference;
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

proptest! {
    /// The packed decode layout: every weight at `((n / 16 * ceil(K / 64) + k / 64) * 16 + n % 16)
    /// * 64 + k % 64`, zeros everywhere else, unpacked back exactly, and wrong lengths refused.
    #[test]
    fn decode_packing_places_every_weight_and_pads_with_zeros(n in 1usize..40, k in 1usize..200, seed: u64) {
        let mut rng = Rng::new(seed);
        // No zero codes, so that a zero in the packed buffer is padding.
        let w: Vec<i8> = rng.vec_i8(n * k).into_iter().map(|v| if v == 0 { 1 } else { v }).collect();
        let packed = pack::pack_for_decode(&w, n, k).unwrap();
        let steps = k.div_ceil(64);
        prop_assert_eq!(packed.len(), n.div_ceil(16) * 16 * steps * 64);
        let mut placed = vec![false; packed.len()];
        for r in 0..n {
            for c in 0..k {
                let at = ((r / 16 * steps + c / 64) * 16 + r % 16) * 64 + c % 64;
                prop_assert_eq!(packed[at], w[r * k + c]);
                placed[at] = true;
            }
        }
        prop_assert!(packed.iter().zip(&placed).all(|(&v, &p)| p || v == 0));
        prop_assert_eq!(pack::unpack_decode(&packed, n, k).unwrap(), w.clone());
        prop_assert!(pack::unpack_decode(&packed[1..], n, k).is_err());
        prop_assert!(pack::pack_for_decode(&w[1..], n, k).is_err());
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

/// The registry quantizer on CPU tensors: zero-width rows get scale 0 (the GPU test checks the
/// CUDA path does the same).
#[test]
fn registry_quantizer_gives_zero_width_rows_zero_scales() {
    use common::Host;
    use dlkern::registry::{self, Attributes};
    let mut x = Host::new(Vec::<half::f16>::new(), &[3, 0]);
    let mut q = Host::new(Vec::<i8>::new(), &[3, 0]);
    let mut s = Host::new(vec![7.0f32; 3], &[3]);
    // SAFETY: host tensors alive for the call.
    unsafe {
        registry::call(
            "dlkern.quantize_per_token",
            &mut [x.dl(), q.dl(), s.dl()],
            1,
            std::ptr::null_mut(),
            &Attributes::new(),
        )
    }
    .unwrap();
    assert_eq!(s.data, vec![0.0; 3]);
}

// ---------------------------------------------------------------------------------------------
// GPU kernel (`dlkern::ops::matmul_w8a8::launch`) against the exact integer reference.

mod gpu {
    use super::common::{Rng, gpu, subnormal_roundoff, unit_roundoff};
    use dlkern::ops::matmul_w8a8::launch::*;
    use dlkern::ops::matmul_w8a8::pack::pack_for_decode;
    use dlkern::ops::matmul_w8a8::reference::matmul_reference;
    use dlkern::{DType, Element};
    use half::{bf16, f16};
    use proptest::prelude::*;

    /// Runs the kernel on `a [m, k]`, `w [n, k]` with `splits` K splits requested (0: the
    /// launcher's choice) and checks every output against the exact reference: within one
    /// roundoff of the output type (plus f32 rounding of the epilogue). Returns the kernel and
    /// the splits it ran.
    #[allow(clippy::too_many_arguments)]
    fn check<T: Element>(
        m: usize,
        n: usize,
        k: usize,
        a: &[i8],
        w: &[i8],
        per_row: bool,
        bias: bool,
        seed: u64,
        splits: usize,
    ) -> (&'static str, usize) {
        check_variant::<T>(m, n, k, a, w, per_row, bias, seed, splits, None)
    }

    /// [`check`] with a forced kernel (`None`: the planner's choice).
    #[allow(clippy::too_many_arguments)]
    fn check_variant<T: Element>(
        m: usize,
        n: usize,
        k: usize,
        a: &[i8],
        w: &[i8],
        per_row: bool,
        bias: bool,
        seed: u64,
        splits: usize,
        variant: Option<W8A8Variant>,
    ) -> (&'static str, usize) {
        let (device, stream) = gpu();
        let mut rng = Rng::new(seed);
        let a_scale: Vec<f32> = (0..if per_row { m } else { 1 }).map(|_| rng.uniform(1e-3, 2e-2) as f32).collect();
        let w_scale: Vec<f32> = (0..n).map(|_| rng.uniform(1e-3, 2e-2) as f32).collect();
        let bias_v: Vec<f32> = (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let params = MatMulW8A8Params { out_dtype: T::DTYPE, m, n, k, per_row_a_scale: per_row, bias, splits, variant };
        let w_given = if variant == Some(W8A8Variant::Packed) { pack_for_decode(w, n, k).unwrap() } else { w.to_vec() };
        let (a_d, w_d) = (stream.clone_htod(a).unwrap(), stream.clone_htod(&w_given).unwrap());
        let (sa_d, sw_d, b_d) = (
            stream.clone_htod(&a_scale).unwrap(),
            stream.clone_htod(&w_scale).unwrap(),
            stream.clone_htod(&bias_v).unwrap(),
        );
        let mut y = stream.clone_htod(&vec![T::from_f64(-7.0); m * n]).unwrap();
        let plan = matmul_w8a8(&device, &stream, &params, &a_d, &sa_d, &w_d, &sw_d, bias.then_some(&b_d), &mut y)
            .unwrap_or_else(|e| panic!("{params:?}: {e}"));
        let got = stream.clone_dtoh(&y).unwrap();
        let want = matmul_reference(a, &a_scale, w, &w_scale, (m, n, k), bias.then_some(bias_v.as_slice()));
        let u = unit_roundoff(T::DTYPE).max(f32::EPSILON as f64);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // The epilogue's f32 roundings are relative to each term (the bias can cancel); the
            // final rounding to T is absolute among T's subnormals (an f16 output below 6.1e-5
            // is a multiple of 2^-24).
            let b = if bias { bias_v[i % n] as f64 } else { 0.0 };
            let tol = 2.0 * u * ((w - b).abs() + b.abs()) + subnormal_roundoff(T::DTYPE);
            let g = g.to_f64();
            assert!((g - w).abs() <= tol, "{params:?}: y[{}][{}] = {g} vs {w}", i / n, i % n);
        }
        (plan.kernel, plan.splits)
    }

    /// Split K: forced splits that divide the K tiles unevenly (and more splits than tiles),
    /// the launcher's own choice on a shape with few output tiles, both load paths, bias.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_split_k_matches_exact_reference() {
        let mut rng = Rng::new(41);
        // (M, N, K, requested splits, splits that must run)
        for &(m, n, k, req, want) in &[
            (40, 130, 1000, 3, 3), // 16 K tiles (the last partial, byte-gather path): 6 + 6 + 4
            (200, 64, 336, 8, 6),  // 6 K tiles: one per split
            (17, 300, 4096, 2, 2),
            (130, 1000, 4096, 0, 8), // 16 output tiles: the launcher splits, up to 8
        ] {
            let (a, w) = (rng.vec_i8(m * k), rng.vec_i8(n * k));
            // Forced: on Hopper the planner takes `wgmma` for K % 16 == 0.
            let tiled = Some(W8A8Variant::Tiled);
            let (kernel, splits) = check_variant::<f16>(m, n, k, &a, &w, true, req % 2 == 1, req as u64, req, tiled);
            let expected = if want > 1 { "matmul_w8a8_partial" } else { "matmul_w8a8_f16" };
            assert_eq!((kernel, splits), (expected, want), "M{m} N{n} K{k}");
            check_variant::<f32>(m, n, k, &a, &w, false, true, 7, req, tiled);
        }
        // K = 65536 at int8 extremes, split: the partial sums stay exact and add up exactly.
        let (m, n, k) = (20, 64, 65536);
        let a = vec![-128i8; m * k];
        let w = vec![-128i8; n * k];
        assert_eq!(check_variant::<f32>(m, n, k, &a, &w, true, false, 9, 8, Some(W8A8Variant::Tiled)).1, 8);
    }

    /// The decode kernel (M <= 16, K % 16 == 0): every M, N not a multiple of its 16-row tile,
    /// K not a multiple of its 64-byte step nor of its 4 x 4-step group; the tiled kernel takes
    /// K % 16 != 0, and M = 17 goes to `wgmma` on Hopper, to the tiled kernel elsewhere.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_decode_kernel_matches_exact_reference() {
        let mut rng = Rng::new(21);
        for m in 1..=16 {
            for &(n, k) in &[(1, 16), (17, 80), (100, 1040), (33, 4112)] {
                let (a, w) = (rng.vec_i8(m * k), rng.vec_i8(n * k));
                let kernel = check::<f16>(m, n, k, &a, &w, m % 2 == 0, m % 3 == 0, m as u64, 0).0;
                assert_eq!(kernel, "matmul_w8a8_small_f16");
            }
        }
        let (a, w) = (rng.vec_i8(16 * 1008), rng.vec_i8(40 * 1008));
        assert_eq!(check::<bf16>(16, 40, 1008, &a, &w, true, true, 1, 0).0, "matmul_w8a8_small_bf16");
        let (a, w) = (rng.vec_i8(5 * 24), rng.vec_i8(40 * 24));
        assert_eq!(check::<bf16>(5, 40, 24, &a, &w, true, true, 2, 0).0, "matmul_w8a8_bf16");
        let (a, w) = (rng.vec_i8(17 * 64), rng.vec_i8(40 * 64));
        let above = if gpu().0.has_wgmma() { "matmul_w8a8_wgmma_f32" } else { "matmul_w8a8_f32" };
        assert_eq!(check::<f32>(17, 40, 64, &a, &w, true, false, 3, 0).0, above);
    }

    /// The decode kernel over packed weights (`W8A8Variant::Packed`): every M, N not a multiple
    /// of its 16-row tile, K not a multiple of its 64-byte step nor of its 4 x 4-step group,
    /// every output type, bias, both activation scales, K = 65536 at int8 extremes; `[N, K]`
    /// weights passed where the packed ones belong are refused by length.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_packed_decode_kernel_matches_exact_reference() {
        let packed = Some(W8A8Variant::Packed);
        let mut rng = Rng::new(22);
        for m in 1..=16 {
            for &(n, k) in &[(1, 16), (17, 80), (97, 1040), (33, 4112), (130, 1024)] {
                let (a, w) = (rng.vec_i8(m * k), rng.vec_i8(n * k));
                let kernel = check_variant::<f16>(m, n, k, &a, &w, m % 2 == 0, m % 3 == 0, m as u64, 0, packed).0;
                assert_eq!(kernel, "matmul_w8a8_small_packed_f16");
            }
        }
        let (a, w) = (rng.vec_i8(16 * 1008), rng.vec_i8(40 * 1008));
        assert_eq!(
            check_variant::<bf16>(16, 40, 1008, &a, &w, true, true, 1, 0, packed).0,
            "matmul_w8a8_small_packed_bf16"
        );
        assert_eq!(
            check_variant::<f32>(3, 40, 1008, &a[..3 * 1008], &w, false, true, 2, 0, packed).0,
            "matmul_w8a8_small_packed_f32"
        );
        let (m, n, k) = (16, 40, 65536);
        let (a, w) = (vec![-128i8; m * k], vec![-128i8; n * k]);
        check_variant::<f32>(m, n, k, &a, &w, true, false, 3, 0, packed);

        let (device, stream) = gpu();
        let (m, n, k) = (4, 40, 80);
        let params = MatMulW8A8Params {
            out_dtype: DType::F32,
            m,
            n,
            k,
            per_row_a_scale: true,
            bias: false,
            splits: 0,
            variant: packed,
        };
        let unpacked = stream.clone_htod(&vec![1i8; n * k]).unwrap();
        let (a, sa, sw) = (
            stream.clone_htod(&vec![1i8; m * k]).unwrap(),
            stream.clone_htod(&vec![1f32; m]).unwrap(),
            stream.clone_htod(&vec![1f32; n]).unwrap(),
        );
        let mut y = stream.clone_htod(&vec![0f32; m * n]).unwrap();
        let e = matmul_w8a8(&device, &stream, &params, &a, &sa, &unpacked, &sw, None, &mut y).unwrap_err().to_string();
        assert!(e.contains("w holds 3200 elements, needs 6144"), "{e}");
    }

    /// The Hopper kernel, forced (on an sm_90a device; elsewhere the test only checks that it
    /// is refused): M and N not multiples of its 128 x 256 tile, K not a multiple of its
    /// 128-byte step, one and many K steps, 18 row tiles (a partial last group in the grouped
    /// block order), every output type, bias, per-row and scalar activation scales; K = 65536 at
    /// int8 extremes.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_wgmma_kernel_matches_exact_reference() {
        let (device, _) = gpu();
        if !device.has_wgmma() {
            let p = MatMulW8A8Params {
                out_dtype: DType::F16,
                m: 256,
                n: 256,
                k: 256,
                per_row_a_scale: true,
                bias: false,
                splits: 0,
                variant: Some(W8A8Variant::Wgmma),
            };
            let err = p.plan(device.multiprocessors(), false).unwrap_err().to_string();
            assert!(err.contains("Hopper"), "{err}");
            eprintln!("{}: no sm_90a module, wgmma kernel not run", device.name());
            return;
        }
        let mut rng = Rng::new(51);
        let wgmma = Some(W8A8Variant::Wgmma);
        for &(m, n, k) in
            &[(1, 1, 16), (17, 300, 1040), (128, 256, 128), (300, 520, 4112), (2200, 300, 272), (129, 257, 16)]
        {
            let (a, w) = (rng.vec_i8(m * k), rng.vec_i8(n * k));
            // Unsplit (requested: 1 split); the split build follows below.
            let kernel = check_variant::<f16>(m, n, k, &a, &w, true, m % 2 == 1, 2, 1, wgmma).0;
            assert_eq!(kernel, "matmul_w8a8_wgmma_f16");
            assert_eq!(check_variant::<bf16>(m, n, k, &a, &w, false, true, 3, 1, wgmma).0, "matmul_w8a8_wgmma_bf16");
            assert_eq!(check_variant::<f32>(m, n, k, &a, &w, true, false, 4, 1, wgmma).0, "matmul_w8a8_wgmma_f32");
        }
        // Split K (int32 partial sums, then the reduction): uneven shares, more splits than
        // steps, the planner's own split; K = 65536 at int8 extremes, split 8 ways.
        for &(m, n, k, req, want) in &[(40, 300, 1040, 3, 3), (200, 64, 336, 8, 3), (130, 1000, 4096, 0, 8)] {
            let (a, w) = (rng.vec_i8(m * k), rng.vec_i8(n * k));
            let (kernel, splits) = check_variant::<f16>(m, n, k, &a, &w, true, req % 2 == 1, 7, req, wgmma);
            assert_eq!((kernel, splits), ("matmul_w8a8_wgmma_partial", want), "M{m} N{n} K{k}");
        }
        let (m, n, k) = (64, 256, 65536);
        let a = vec![-128i8; m * k];
        let mut w = vec![-128i8; n * k];
        w[..k].fill(127);
        assert_eq!(check_variant::<f32>(m, n, k, &a, &w, true, false, 5, 8, wgmma).1, 8);
        // The planner's own choice at a shape whose 128 x 256 tiles fill the GPU.
        let (m, n, k) = (1024, 8192, 48);
        let (a, w) = (rng.vec_i8(m * k), rng.vec_i8(n * k));
        assert_eq!(check::<f16>(m, n, k, &a, &w, true, true, 6, 0).0, "matmul_w8a8_wgmma_f16");
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_matches_exact_reference() {
        let mut rng = Rng::new(1);
        for &(m, n, k) in &[(1, 8, 16), (3, 97, 100), (130, 200, 1000), (129, 257, 48), (256, 128, 4096), (7, 9, 1)] {
            let (a, w) = (rng.vec_i8(m * k), rng.vec_i8(n * k));
            check::<f16>(m, n, k, &a, &w, true, false, 2, 0);
            check::<bf16>(m, n, k, &a, &w, false, true, 3, 0);
            check::<f32>(m, n, k, &a, &w, true, true, 4, 0);
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_int8_extremes_and_zero_rows_do_not_overflow() {
        // K = 65536 at -128 x -128: 2^30 per output, inside int32.
        let (m, n, k) = (2, 130, 65536);
        let a = vec![-128i8; m * k];
        let mut w = vec![-128i8; n * k];
        w[..k].fill(127);
        check::<f32>(m, n, k, &a, &w, true, false, 5, 0);
        // A zero row gives exactly the bias.
        let mut a = Rng::new(6).vec_i8(4 * 64);
        a[64..128].fill(0);
        check::<f16>(4, 16, 64, &a, &Rng::new(7).vec_i8(16 * 64), true, true, 8, 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
        #[test]
        #[ignore = "needs a CUDA device"]
        fn gpu_matches_reference_on_random_shapes(
            m in 1usize..300, n in 1usize..300, k in 1usize..700, per_row: bool, bias: bool, out in 0usize..3,
            tiled: bool, seed: u64,
        ) {
            let mut rng = Rng::new(seed);
            let (a, w) = (rng.vec_i8(m * k), rng.vec_i8(n * k));
            // Half the cases force the `mma.sync` kernel, which Hopper would otherwise rarely run.
            let variant = tiled.then_some(W8A8Variant::Tiled);
            match out {
                0 => check_variant::<f16>(m, n, k, &a, &w, per_row, bias, seed, 0, variant).0,
                1 => check_variant::<bf16>(m, n, k, &a, &w, per_row, bias, seed, 0, variant).0,
                _ => check_variant::<f32>(m, n, k, &a, &w, per_row, bias, seed, 0, variant).0,
            };
        }
    }

    /// The registry kernels on CUDA tensors (what ONNX Runtime's CUDA EP, `DLPackKernel` and C
    /// callers reach): `dlkern.quantize_per_token` then `dlkern.matmul_w8a8`, decode and tiled
    /// shapes, with and without bias, against the same calls on CPU tensors; a zero-width row
    /// block still gets its (zero) scales.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_registry_kernels_run_on_cuda_tensors() {
        use super::common::Host;
        use super::common::on_cuda;
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        use dlkern::registry::{self, AttrValue, Attributes};
        let (_device, stream) = gpu();
        let raw_stream = stream.cu_stream() as *mut std::ffi::c_void;
        let attrs = Attributes::new().with("out_dtype", AttrValue::String("f32".into()));
        let mut rng = Rng::new(31);
        for &(m, n, k, bias) in &[(3, 40, 64, true), (40, 33, 100, false), (1, 17, 4096, true)] {
            let x: Vec<f16> = (0..m * k).map(|_| f16::from_f64(rng.uniform(-2.0, 2.0))).collect();
            let w: Vec<i8> = rng.vec_i8(n * k);
            let w_scale: Vec<f32> = (0..n).map(|_| rng.uniform(1e-3, 2e-2) as f32).collect();
            let bias_v: Vec<f32> = (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
            let (mi, ni, ki) = (m as i64, n as i64, k as i64);

            // CPU: quantize, then the matmul.
            let mut hx = Host::new(x.clone(), &[mi, ki]);
            let mut hq = Host::new(vec![0i8; m * k], &[mi, ki]);
            let mut hs = Host::new(vec![0f32; m], &[mi]);
            // SAFETY: host tensors alive for the call.
            unsafe {
                registry::call(
                    "dlkern.quantize_per_token",
                    &mut [hx.dl(), hq.dl(), hs.dl()],
                    1,
                    std::ptr::null_mut(),
                    &attrs,
                )
            }
            .unwrap();
            let mut hw = Host::new(w.clone(), &[ni, ki]);
            let mut hws = Host::new(w_scale.clone(), &[ni]);
            let mut hb = Host::new(bias_v.clone(), &[ni]);
            let mut hy = Host::new(vec![0f32; m * n], &[mi, ni]);
            let mut cpu = vec![hq.dl(), hs.dl(), hw.dl(), hws.dl()];
            if bias {
                cpu.push(hb.dl());
            }
            cpu.push(hy.dl());
            let inputs = cpu.len() - 1;
            // SAFETY: as above.
            unsafe { registry::call("dlkern.matmul_w8a8", &mut cpu, inputs, std::ptr::null_mut(), &attrs) }.unwrap();

            // CUDA: the same two calls on device buffers, on one stream.
            let x_d = stream.clone_htod(&x).unwrap();
            let mut q_d = stream.alloc_zeros::<i8>(m * k).unwrap();
            let mut s_d = stream.alloc_zeros::<f32>(m).unwrap();
            let (w_d, ws_d, b_d) = (
                stream.clone_htod(&w).unwrap(),
                stream.clone_htod(&w_scale).unwrap(),
                stream.clone_htod(&bias_v).unwrap(),
            );
            let mut y_d = stream.alloc_zeros::<f32>(m * n).unwrap();
            {
                let (xp, _x) = x_d.device_ptr(&stream);
                let (qp, _q) = q_d.device_ptr_mut(&stream);
                let (sp, _s) = s_d.device_ptr_mut(&stream);
                let (wp, _w) = w_d.device_ptr(&stream);
                let (wsp, _ws) = ws_d.device_ptr(&stream);
                let (bp, _b) = b_d.device_ptr(&stream);
                let (yp, _y) = y_d.device_ptr_mut(&stream);
                let mut quant = [on_cuda(hx.dl(), xp), on_cuda(hq.dl(), qp), on_cuda(hs.dl(), sp)];
                // SAFETY: device buffers of the shapes described, alive until the stream syncs.
                unsafe { registry::call("dlkern.quantize_per_token", &mut quant, 1, raw_stream, &attrs) }.unwrap();
                let mut mm =
                    vec![on_cuda(hq.dl(), qp), on_cuda(hs.dl(), sp), on_cuda(hw.dl(), wp), on_cuda(hws.dl(), wsp)];
                if bias {
                    mm.push(on_cuda(hb.dl(), bp));
                }
                mm.push(on_cuda(hy.dl(), yp));
                // SAFETY: as above.
                unsafe { registry::call("dlkern.matmul_w8a8", &mut mm, inputs, raw_stream, &attrs) }.unwrap();
            }
            stream.synchronize().unwrap();
            assert_eq!(stream.clone_dtoh(&q_d).unwrap(), hq.data, "codes, M{m} K{k}");
            assert_eq!(stream.clone_dtoh(&s_d).unwrap(), hs.data, "scales, M{m} K{k}");
            // The GPU epilogue rounds `acc * a_scale * w_scale` in f32, the reference in f64.
            for (i, (g, want)) in stream.clone_dtoh(&y_d).unwrap().iter().zip(&hy.data).enumerate() {
                let tol = 4.0 * f32::EPSILON * (want.abs() + bias_v[i % n].abs()) + 1e-30;
                assert!((g - want).abs() <= tol, "M{m} N{n} K{k}: y[{i}] = {g} vs {want}");
            }
        }

        // Rows of width 0: no codes, every scale 0 (the kernel still runs, one block per row).
        let mut s_d = stream.clone_htod(&[7.0f32; 3]).unwrap();
        let x_d = stream.alloc_zeros::<f16>(1).unwrap();
        let q_d = stream.alloc_zeros::<i8>(1).unwrap();
        {
            let mut hx = Host::new(Vec::<f16>::new(), &[3, 0]);
            let mut hq = Host::new(Vec::<i8>::new(), &[3, 0]);
            let mut hs = Host::new(vec![0f32; 3], &[3]);
            let (xp, _x) = x_d.device_ptr(&stream);
            let (qp, _q) = q_d.device_ptr(&stream);
            let (sp, _s) = s_d.device_ptr_mut(&stream);
            let mut t = [on_cuda(hx.dl(), xp), on_cuda(hq.dl(), qp), on_cuda(hs.dl(), sp)];
            // SAFETY: as above (no element of x or q is read or written).
            unsafe { registry::call("dlkern.quantize_per_token", &mut t, 1, raw_stream, &attrs) }.unwrap();
        }
        stream.synchronize().unwrap();
        assert_eq!(stream.clone_dtoh(&s_d).unwrap(), vec![0.0; 3]);
    }

    /// The GPU quantizer reproduces the host's codes and scales bit for bit (f32 and f16 rows,
    /// an all-zero row, awkward widths).
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_quantizer_matches_host_bit_for_bit() {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        use dlkern::ops::matmul_w8a8::pack::quantize_rows;
        let (device, stream) = gpu();
        let mut rng = Rng::new(11);
        for &(rows, cols) in &[(1, 1), (3, 97), (17, 1025), (64, 8192)] {
            let mut x: Vec<f32> = (0..rows * cols).map(|_| rng.uniform(-3.0, 3.0) as f32).collect();
            x[..cols].fill(0.0);
            let x16: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            let x16_as_f32: Vec<f32> = x16.iter().map(|v| v.to_f32()).collect();
            for (dtype, host_in) in [(DType::F32, &x), (DType::F16, &x16_as_f32)] {
                let (want_q, want_s) = quantize_rows(host_in, rows, cols).unwrap();
                let (x32_d, x16_d) = (stream.clone_htod(&x).unwrap(), stream.clone_htod(&x16).unwrap());
                let x_d = if dtype == DType::F32 { x32_d.device_ptr(&stream).0 } else { x16_d.device_ptr(&stream).0 };
                let mut q = stream.alloc_zeros::<i8>(rows * cols).unwrap();
                let mut s = stream.alloc_zeros::<f32>(rows).unwrap();
                {
                    let (qp, _q) = q.device_ptr_mut(&stream);
                    let (sp, _s) = s.device_ptr_mut(&stream);
                    // SAFETY: buffers of the described extents.
                    unsafe { quantize_per_token_raw(&device, stream.cu_stream(), dtype, rows, cols, x_d, qp, sp) }
                        .unwrap();
                }
                assert_eq!(stream.clone_dtoh(&q).unwrap(), want_q, "{dtype} [{rows}, {cols}] codes");
                let got_s = stream.clone_dtoh(&s).unwrap();
                assert!(got_s.iter().zip(&want_s).all(|(a, b)| a.to_bits() == b.to_bits()), "{dtype} scales");
            }
        }
    }

    #[test]
    fn plan_validates() {
        let ok = MatMulW8A8Params {
            out_dtype: DType::F16,
            m: 8192,
            n: 8192,
            k: 8192,
            per_row_a_scale: true,
            bias: false,
            splits: 0,
            variant: None,
        };
        let plan = ok.plan(132, false).unwrap();
        assert_eq!((plan.dims.grid, plan.splits, plan.workspace_bytes), ((64, 64, 1), 1, 0));
        // M = 128: 64 output tiles for 132 SMs, so K splits 5 ways (26 + 26 + 26 + 26 + 24 tiles).
        let mid = MatMulW8A8Params { m: 128, ..ok }.plan(132, false).unwrap();
        assert_eq!((mid.dims.grid, mid.splits, mid.workspace_bytes), ((64, 1, 5), 5, 5 * 128 * 8192 * 4));
        assert_eq!(mid.reduce.map(|r| r.0), Some("matmul_w8a8_reduce_f16"));
        // Decoding shapes take the decode kernel; K % 16 != 0 the tiled one, unsplit (1 K tile).
        let decode = MatMulW8A8Params { m: 16, ..ok }.plan(132, false).unwrap();
        assert_eq!((decode.kernel, decode.variant), ("matmul_w8a8_small_f16", W8A8Variant::Decode));
        let odd = MatMulW8A8Params { m: 16, k: 24, ..ok }.plan(132, false).unwrap();
        assert_eq!(
            (odd.kernel, odd.splits, odd.variant, mid.variant),
            ("matmul_w8a8_f16", 1, W8A8Variant::Tiled, W8A8Variant::Tiled)
        );
        let err = |p: MatMulW8A8Params| p.plan(132, false).unwrap_err().to_string();
        // Hopper: `wgmma` from M = 17 (K % 16 == 0), split over K while its 128 x 256 tiles leave
        // SMs idle (M = 128: 32 tiles, 4 splits of 16 steps of 128 bytes).
        let hopper = |p: MatMulW8A8Params| p.plan(132, true).unwrap();
        let big = hopper(ok);
        assert_eq!(
            (big.kernel, big.variant, big.dims.grid, big.dims.block),
            ("matmul_w8a8_wgmma_f16", W8A8Variant::Wgmma, (2048, 1, 1), (256, 1, 1))
        );
        assert_eq!((big.splits, big.workspace_bytes, big.reduce), (1, 0, None));
        assert_eq!(hopper(MatMulW8A8Params { m: 1024, out_dtype: DType::BF16, ..ok }).kernel, "matmul_w8a8_wgmma_bf16");
        let mid = hopper(MatMulW8A8Params { m: 128, ..ok });
        assert_eq!((mid.kernel, mid.dims.grid, mid.splits), ("matmul_w8a8_wgmma_partial", (32, 1, 4), 4));
        assert_eq!(
            (mid.workspace_bytes, mid.reduce.map(|r| r.0)),
            (4 * 128 * 8192 * 4, Some("matmul_w8a8_reduce_f16"))
        );
        assert_eq!(hopper(MatMulW8A8Params { m: 17, n: 40, k: 64, ..ok }).kernel, "matmul_w8a8_wgmma_f16");
        assert_eq!(hopper(MatMulW8A8Params { k: 8200, ..ok }).kernel, "matmul_w8a8_f16");
        assert_eq!(hopper(MatMulW8A8Params { m: 16, ..ok }).kernel, "matmul_w8a8_small_f16");
        // Forced kernels that cannot run are refused, not swapped.
        let wgmma = Some(W8A8Variant::Wgmma);
        assert!(err(MatMulW8A8Params { variant: wgmma, ..ok }).contains("Hopper"));
        let e = MatMulW8A8Params { variant: wgmma, k: 8200, ..ok }.plan(132, true).unwrap_err().to_string();
        assert!(e.contains("K % 16"), "{e}");
        assert!(err(MatMulW8A8Params { variant: Some(W8A8Variant::Decode), m: 17, ..ok }).contains("M <= 16"));
        let packed = Some(W8A8Variant::Packed);
        assert!(err(MatMulW8A8Params { variant: packed, m: 17, ..ok }).contains("Packed decode kernel needs M <= 16"));
        assert!(err(MatMulW8A8Params { variant: packed, m: 1, k: 8200, ..ok }).contains("K % 16"));
        let p = MatMulW8A8Params { variant: packed, m: 1, n: 97, k: 1040, ..ok };
        let plan = p.plan(132, true).unwrap();
        assert_eq!((plan.kernel, plan.dims.grid, plan.workspace_bytes), ("matmul_w8a8_small_packed_f16", (7, 1, 1), 0));
        assert_eq!(
            (p.packed_w_len(), p.w_len(W8A8Variant::Packed), p.w_len(W8A8Variant::Decode)),
            (112 * 1088, 112 * 1088, 97 * 1040)
        );
        let forced = MatMulW8A8Params { variant: Some(W8A8Variant::Tiled), m: 16, ..ok }.plan(132, true).unwrap();
        assert_eq!(forced.kernel, "matmul_w8a8_partial");
        assert!(err(MatMulW8A8Params { k: 131072, ..ok }).contains("int32 accumulation"));
        assert!(err(MatMulW8A8Params { out_dtype: DType::I8, ..ok }).contains("not supported"));
        assert!(err(MatMulW8A8Params { n: 0, ..ok }).contains("N = 0"));
    }
}
