//! W4A16 weights in MatMulNBits format: the quantizer's error bounds and packing, and the
//! registry's CPU kernel against the f64 reference (K not a multiple of the block, packed and
//! unpacked zero points, bias). ORT's own MatMulNBits is compared in tests/python.

mod common;

use common::{Host, Rng, on_cuda};
use dlkern::dlpack::DLTensor;
use dlkern::ops::matmul_nbits::pack::{MatMulNBitsWeights, ZeroPoints, quantize};
use dlkern::ops::matmul_nbits::reference::matmul_reference;
use dlkern::registry::{self, AttrValue, Attributes};
use proptest::prelude::*;

proptest! {
    #[test]
    fn quantization_error_is_bounded(
        n in 1usize..6, k in 1usize..300, block in prop_oneof![Just(16usize), Just(32), Just(64), Just(128), Just(256)],
        symmetric: bool, seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let w: Vec<f32> = (0..n * k).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
        let q = quantize(&w, n, k, block, symmetric).unwrap();
        q.validate().unwrap();
        let deq = q.dequantize();
        for row in 0..n {
            for col in 0..k {
                let scale = q.scales[row * q.k_blocks() + col / block] as f64;
                let err = (deq[row * k + col] - w[row * k + col] as f64).abs();
                // Rounding to the nearest code: half a step (asymmetric: the rounded zero point
                // can push an extreme value one more half step).
                // ... plus f32 rounding of w / scale (|w / scale| <= 15: 15 * 2^-23).
                let bound = (if symmetric { 0.5 } else { 1.0 } + 15.0 * 2f64.powi(-23)) * scale + 1e-12;
                prop_assert!(err <= bound, "w[{row}][{col}] = {} dequantized to {} (scale {scale})", w[row * k + col], deq[row * k + col]);
            }
        }
    }
}

#[test]
fn packing_is_low_nibble_first_along_k() {
    // One row, K = 20 in blocks of 16: codes 0..15 then 4 values and padding.
    let q = MatMulNBitsWeights {
        n: 1,
        k: 20,
        block_size: 16,
        b: (0..16u8).map(|i| (2 * i % 16) | ((2 * i + 1) % 16) << 4).collect(),
        scales: vec![1.0, 2.0],
        zero_points: ZeroPoints::Packed(vec![0x3_5]),
    };
    q.validate().unwrap();
    assert_eq!((q.code(0, 0), q.code(0, 1), q.code(0, 15), q.code(0, 16)), (0, 1, 15, 0));
    assert_eq!((q.zero_point(0, 0), q.zero_point(0, 1)), (5.0, 3.0));
    let deq = q.dequantize();
    assert_eq!(&deq[..3], &[-5.0, -4.0, -3.0]);
    assert_eq!(deq[16], (0.0 - 3.0) * 2.0);
    // All-zero blocks dequantize to exact zeros; padding past K holds the zero point.
    let zeros = quantize(&[0.0; 40], 2, 20, 16, false).unwrap();
    assert!(zeros.dequantize().iter().all(|&v| v == 0.0));
    assert!(quantize(&[1.0; 40], 2, 20, 24, true).is_err(), "block size must be a power of two");
    assert!(quantize(&[f32::NAN; 40], 2, 20, 16, true).is_err());
}

proptest! {
    /// The `Packed` records (`pack_for_decode`): every code, scale and zero point of every
    /// column and chunk where the documented layout puts it, columns past N repeating N - 1;
    /// blocks of 32 and 64 in the fine records (constants per 32 K, codes past a row's end
    /// as 8, the constants of a step past K those of the row's last block), blocks of 16 in the
    /// fine16 records (constants per lane parity and word, zero points as nibbles).
    #[test]
    fn packing_for_decode_places_every_code_and_constant(
        n in 1usize..70, k in 1usize..700,
        block in prop_oneof![Just(16usize), Just(32), Just(64), Just(128), Just(256)],
        symmetric: bool, seed: u64,
    ) {
        let fine = block < 128;
        let record_bytes = match block {
            16 => 32 * 64 + 8 * 80,
            32 | 64 => 32 * 64 + 8 * 48,
            _ => 32 * 64 + 128,
        };
        let mut rng = Rng::new(seed);
        let w: Vec<f32> = (0..n * k).map(|_| rng.uniform(-2.0, 2.0) as f32).collect();
        let q = quantize(&w, n, k, block, symmetric).unwrap();
        let bits: Vec<u16> = (0..q.scales.len()).map(|i| i as u16 ^ 0x5a5a).collect();
        let packed = q.pack_for_decode(&bits).unwrap();
        let chunks = k.div_ceil(128);
        prop_assert_eq!(packed.len(), n.div_ceil(32) * chunks * record_bytes);
        let row_codes = q.k_blocks() * block;
        for tile in 0..n.div_ceil(32) {
            for chunk in 0..chunks {
                let record = &packed[(tile * chunks + chunk) * record_bytes..][..record_bytes];
                for local in 0..32 {
                    let col = (tile * 32 + local).min(n - 1);
                    for i in 0..128 {
                        // The chunk's word `i / 8` = `4 w + piece` is word `w` of `piece`;
                        // in it, code `r` is at nibble `r / 2`, plus 4 when `r` is odd.
                        let (w, piece, r) = (i / 32, i / 8 % 4, i % 8);
                        let nibble = r / 2 + 4 * (r % 2);
                        let byte = record[local * 64 + 16 * piece + 4 * w + nibble / 2];
                        let code = if nibble % 2 == 0 { byte & 15 } else { byte >> 4 };
                        let at = chunk * 128 + i;
                        if at < k {
                            prop_assert_eq!(code, q.code(col, at));
                        } else if at >= row_codes {
                            prop_assert_eq!(code, 8, "past the row's end");
                        }
                    }
                    let (g, u) = (local % 8, local / 8);
                    if block == 16 {
                        let consts = &record[2048 + 80 * g..][..80];
                        for (h, i) in (0..2).flat_map(|h| (0..4).map(move |i| (h, i))) {
                            // Word `i` of the lanes of parity `h` (K `32 i + 8 q`, q / 2 = h).
                            let blk = ((chunk * 128 + 32 * i + 16 * h) / 16).min(q.k_blocks() - 1);
                            let at = 32 * h + 2 * (4 * i + u);
                            prop_assert_eq!(u16::from_le_bytes([consts[at], consts[at + 1]]), bits[col * q.k_blocks() + blk]);
                            let nibble = 4 * i + u;
                            let zero = (consts[64 + 8 * h + nibble / 2] >> (4 * (nibble % 2))) & 15;
                            prop_assert_eq!(zero as f32, q.zero_point(col, blk));
                        }
                    } else if fine {
                        let consts = &record[2048 + 48 * g..][..48];
                        for step in 0..4 {
                            let blk = ((chunk * 128 + 32 * step) / block).min(q.k_blocks() - 1);
                            let at = 8 * step + 2 * u;
                            prop_assert_eq!(u16::from_le_bytes([consts[at], consts[at + 1]]), bits[col * q.k_blocks() + blk]);
                            prop_assert_eq!(consts[32 + 4 * step + u] as f32, q.zero_point(col, blk));
                        }
                    } else {
                        let blk = chunk * 128 / block;
                        let consts = &record[2048 + 16 * g..][..16];
                        prop_assert_eq!(u16::from_le_bytes([consts[2 * u], consts[2 * u + 1]]), bits[col * q.k_blocks() + blk]);
                        prop_assert_eq!(consts[8 + u] as f32, q.zero_point(col, blk));
                    }
                }
            }
        }
    }
}

#[test]
fn packing_for_decode_refuses_bad_scales_and_typed_zero_points() {
    let mut q = quantize(&[0.5; 128], 1, 128, 128, true).unwrap();
    assert!(q.pack_for_decode(&[0, 0]).unwrap_err().to_string().contains("scale bits"));
    q.zero_points = ZeroPoints::Unpacked(vec![8.0]);
    assert!(q.pack_for_decode(&[0]).unwrap_err().to_string().contains("integer zero points"));
}

/// The variant part of an entry name: `decode8_packed` of `matmul_nbits_decode8_packed_f16`.
fn variant_of(kernel: &str) -> &str {
    let variant = kernel.strip_prefix("matmul_nbits_").unwrap_or_else(|| panic!("not a matmul_nbits entry: {kernel}"));
    variant.strip_suffix("_f16").or_else(|| variant.strip_suffix("_bf16")).unwrap_or(variant)
}

fn attrs(k: usize, n: usize, block: usize) -> Attributes {
    Attributes::new()
        .with("K", AttrValue::Int(k as i64))
        .with("N", AttrValue::Int(n as i64))
        .with("bits", AttrValue::Int(4))
        .with("block_size", AttrValue::Int(block as i64))
}

#[test]
fn registry_kernel_matches_reference_on_cpu() {
    let (m, k, n, block) = (3, 100, 24, 32);
    let mut rng = Rng::new(5);
    let w: Vec<f32> = (0..n * k).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
    for symmetric in [true, false] {
        for with_bias in [false, true] {
            let q = quantize(&w, n, k, block, symmetric).unwrap();
            let a: Vec<f32> = (0..m * k).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
            let bias: Vec<f32> = (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
            let kb = q.k_blocks();
            let mut ta = Host::new(a.clone(), &[m as i64, k as i64]);
            let mut tb = Host::new(q.b.clone(), &[n as i64, kb as i64, (block / 2) as i64]);
            let mut ts = Host::new(q.scales.clone(), &[n as i64, kb as i64]);
            let mut tzp = match &q.zero_points {
                ZeroPoints::Packed(zp) => Host::new(zp.clone(), &[n as i64, kb.div_ceil(2) as i64]),
                _ => Host::new(vec![], &[0]),
            };
            let mut tg = Host::<i32>::new(vec![], &[0]);
            let mut tbias = if with_bias { Host::new(bias.clone(), &[n as i64]) } else { Host::new(vec![], &[0]) };
            let mut ty = Host::new(vec![f32::NAN; m * n], &[m as i64, n as i64]);
            let mut tensors = [ta.dl(), tb.dl(), ts.dl(), tzp.dl(), tg.dl(), tbias.dl(), ty.dl()];
            // SAFETY: host tensors alive for the call.
            unsafe {
                registry::call("dlkern.matmul_nbits", &mut tensors, 6, std::ptr::null_mut(), &attrs(k, n, block))
            }
            .unwrap();
            let a64: Vec<f64> = a.iter().map(|&v| v as f64).collect();
            let b64: Vec<f64> = bias.iter().map(|&v| v as f64).collect();
            let want = matmul_reference(&a64, m, &q, with_bias.then_some(b64.as_slice()));
            for (g, w) in ty.data.iter().zip(&want) {
                assert!((*g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
            }
        }
    }
}

#[test]
fn registry_kernel_reports_format_errors() {
    let (k, n, block) = (64, 8, 32);
    let q = quantize(&vec![0.5; n * k], n, k, block, true).unwrap();
    let mut ta = Host::new(vec![1.0f32; 2 * k], &[2, k as i64]);
    let mut tb = Host::new(q.b.clone(), &[n as i64, 2, 16]);
    let mut tb_bad = Host::new(q.b.clone(), &[n as i64, 16, 2]);
    let mut ts = Host::new(q.scales.clone(), &[n as i64, 2]);
    let mut ty = Host::new(vec![0.0f32; 2 * n], &[2, n as i64]);
    let call = |tensors: &mut [DLTensor], attrs: &Attributes| {
        // SAFETY: host tensors alive for the call.
        unsafe { registry::call("dlkern.matmul_nbits", tensors, tensors.len() - 1, std::ptr::null_mut(), attrs) }
            .unwrap_err()
            .to_string()
    };
    let err = call(&mut [ta.dl(), tb_bad.dl(), ts.dl(), ty.dl()], &attrs(k, n, block));
    assert!(err.contains("tensor 'B': shape [8, 16, 2] (expected [8, 2, 16])"), "{err}");
    let err = call(&mut [ta.dl(), tb.dl(), ts.dl(), ty.dl()], &attrs(k, n, block).with("bits", AttrValue::Int(2)));
    assert!(err.contains("bits = 2"), "{err}");
    let err = call(&mut [ta.dl(), tb.dl(), ts.dl(), ty.dl()], &attrs(k + 1, n, block));
    assert!(err.contains("is not K = 65"), "{err}");
    let err = call(&mut [ta.dl(), tb.dl(), ts.dl(), ty.dl()], &Attributes::new());
    assert!(err.contains("required attribute 'bits' is missing"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// GPU kernels (`dlkern::ops::matmul_nbits::{plan, launch}`) against the f64 reference.

mod gpu {
    use super::common::{Rng, gpu, unit_roundoff};
    use super::variant_of;
    use cudarc::driver::{CudaSlice, CudaStream};
    use dlkern::ops::matmul_nbits::pack::{MatMulNBitsWeights, ZeroPoints as HostZeros, quantize};
    use dlkern::ops::matmul_nbits::reference::matmul_reference;
    use dlkern::ops::matmul_nbits::{launch::*, plan::*};
    use dlkern::runtime::Device;
    use dlkern::{DType, Element};
    use half::{bf16, f16};
    use proptest::prelude::*;
    use std::sync::Arc;

    /// A problem whose scales, zero points, activations and bias are representable in `T`,
    /// so the reference sees exactly what the kernel sees.
    #[derive(Clone)]
    struct Problem<T> {
        p: MatMulNBitsParams,
        w: MatMulNBitsWeights,
        a: Vec<T>,
        bias: Option<Vec<T>>,
        zeros_t: Vec<T>,
    }

    fn problem<T: Element>(p: MatMulNBitsParams, seed: u64) -> Problem<T> {
        let mut rng = Rng::new(seed);
        let (m, n, k) = (p.m, p.n, p.k);
        let wf: Vec<f32> = (0..n * k).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let symmetric = p.zero_points == ZeroPointKind::Default;
        let mut w = quantize(&wf, n, k, p.block_size, symmetric).unwrap();
        let round = |v: f64| T::from_f64(v).to_f64() as f32;
        w.scales = w.scales.iter().map(|&s| round(s as f64)).collect();
        let mut zeros_t = Vec::new();
        if p.zero_points == ZeroPointKind::Typed {
            // Fractional zero points, as a float-typed zero-point input allows.
            let kb = w.k_blocks();
            let z: Vec<f32> = (0..n * kb).map(|i| round((i % 15) as f64 + 0.25)).collect();
            zeros_t = z.iter().map(|&v| T::from_f64(v as f64)).collect();
            w.zero_points = HostZeros::Unpacked(z);
        }
        let a: Vec<T> = rng.vec(m * k, -1.0, 1.0);
        let bias = p.bias.then(|| rng.vec(n, -1.0, 1.0));
        Problem { p, w, a, bias, zeros_t }
    }

    impl<T: Element> Problem<T> {
        fn run(&self) -> (Vec<T>, MatMulNBitsPlan) {
            let (device, stream) = gpu();
            let a = stream.clone_htod(&self.a).unwrap();
            let scales: Vec<T> = self.w.scales.iter().map(|&s| T::from_f64(s as f64)).collect();
            let b = if self.p.variant.is_some_and(Variant::reads_packed_b) {
                let bits: &[u16] = bytemuck::cast_slice(&scales);
                stream.clone_htod(&self.w.pack_for_decode(bits).unwrap()).unwrap()
            } else {
                stream.clone_htod(&self.w.b).unwrap()
            };
            let scales = stream.clone_htod(&scales).unwrap();
            let zp_u8 = match &self.w.zero_points {
                HostZeros::Packed(z) => Some(stream.clone_htod(z).unwrap()),
                _ => None,
            };
            let zp_t = (!self.zeros_t.is_empty()).then(|| stream.clone_htod(&self.zeros_t).unwrap());
            let zero_points = match (&zp_u8, &zp_t) {
                (Some(z), _) => ZeroPoints::PackedU8(z),
                (_, Some(z)) => ZeroPoints::Typed(z),
                _ => ZeroPoints::Default,
            };
            let bias = self.bias.as_ref().map(|b| stream.clone_htod(b).unwrap());
            let mut y = stream.clone_htod(&vec![T::from_f64(-7.0); self.p.m * self.p.n]).unwrap();
            let w = MatMulNBitsDeviceWeights { b: &b, scales: &scales, zero_points };
            let plan = matmul_nbits(&device, &stream, &self.p, &a, &w, bias.as_ref(), &mut y)
                .unwrap_or_else(|e| panic!("{:?}: {e}", self.p));
            (stream.clone_dtoh(&y).unwrap(), plan)
        }

        /// Each output within 2 roundoffs of sum |a| |w| (each weight is rounded to T once)
        /// plus one roundoff of the value (the final rounding).
        /// Runs the GPU kernel and checks it against the reference; returns what it launched.
        fn check(&self) -> MatMulNBitsPlan {
            let (got, plan) = self.run();
            self.check_values(&got, &format!("{:?}, {} splits", plan.variant, plan.splits));
            plan
        }

        fn check_values(&self, got: &[T], what: &str) {
            let (m, n, k) = (self.p.m, self.p.n, self.p.k);
            let a64: Vec<f64> = self.a.iter().map(|v| v.to_f64()).collect();
            let b64: Option<Vec<f64>> = self.bias.as_ref().map(|b| b.iter().map(|v| v.to_f64()).collect());
            let want = matmul_reference(&a64, m, &self.w, b64.as_deref());
            let deq = self.w.dequantize();
            let u = unit_roundoff(T::DTYPE);
            for row in 0..m {
                for col in 0..n {
                    let mass: f64 = (0..k).map(|i| (a64[row * k + i] * deq[col * k + i]).abs()).sum();
                    let (g, w) = (got[row * n + col].to_f64(), want[row * n + col]);
                    let tol = 2.0 * u * mass + u * w.abs() + 1e-6;
                    assert!(
                        (g - w).abs() <= tol,
                        "{:?} ({what}): y[{row}][{col}] = {g} vs {w} (tolerance {tol})",
                        self.p
                    );
                }
            }
        }
    }

    fn params(dtype: DType, m: usize, n: usize, k: usize, block: usize) -> MatMulNBitsParams {
        MatMulNBitsParams {
            dtype,
            m,
            n,
            k,
            block_size: block,
            zero_points: ZeroPointKind::PackedU8,
            bias: false,
            variant: None,
            splits: 0,
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_matches_reference_across_shapes() {
        let mut seed = 1;
        for &(m, n, k) in &[(1, 8, 16), (1, 97, 1025), (3, 256, 1000), (16, 130, 4096), (17, 64, 200), (130, 200, 777)]
        {
            for block in [16, 32, 64, 128, 256] {
                for zero_points in [ZeroPointKind::Default, ZeroPointKind::PackedU8, ZeroPointKind::Typed] {
                    seed += 1;
                    let p =
                        MatMulNBitsParams { zero_points, bias: seed % 2 == 0, ..params(DType::F16, m, n, k, block) };
                    problem::<f16>(p, seed).check();
                }
            }
            let p = MatMulNBitsParams { bias: true, ..params(DType::BF16, m, n, k, 32) };
            problem::<bf16>(p, seed + 100).check();
        }
    }

    /// The `decode` builds (integer zero points, blocks >= 128, 16-byte rows): both row builds,
    /// N not a multiple of the 32-column tile, K ending inside a chunk and inside a block,
    /// forced K splits, both types.
    /// Runs `base` (f16) with each integer zero-point kind and with the chosen, 3 and 11 K
    /// splits, bias on every other case, then each case again in bf16 (seed + 1000);
    /// `kernel_ok` must accept every kernel launched. `seed` advances once per case. On Hopper
    /// 2 to 8 splits of the `decode` kernels must sum in clusters (3 here), more through the
    /// reduction kernel (11, where K has 9 chunks or more); so must those of `small`.
    fn check_zero_points_and_splits(base: MatMulNBitsParams, seed: &mut u64, kernel_ok: impl Fn(&str) -> bool) {
        let (device, _) = gpu();
        let check_plan = |p: &MatMulNBitsParams, plan: MatMulNBitsPlan| {
            assert!(kernel_ok(plan.kernel), "{p:?}: {}", plan.kernel);
            // (`small` and the `decode` kernels: `tiled` and `wgmma` share this helper.)
            let sums_in_clusters = plan.kernel.contains("decode") || plan.kernel.contains("_small");
            let clustered = sums_in_clusters && device.has_wgmma() && (2..=8).contains(&plan.splits);
            let expect = clustered.then_some((1, 1, plan.splits as u32));
            assert_eq!((plan.cluster, plan.reduce.is_some()), (expect, plan.splits > 1 && !clustered), "{p:?}");
        };
        for zero_points in [ZeroPointKind::Default, ZeroPointKind::PackedU8] {
            for splits in [0, 3, 11] {
                *seed += 1;
                let p = MatMulNBitsParams { zero_points, splits, bias: seed.is_multiple_of(2), ..base };
                check_plan(&p, problem::<f16>(p, *seed).check());
                let p = MatMulNBitsParams { dtype: DType::BF16, ..p };
                check_plan(&p, problem::<bf16>(p, *seed + 1000).check());
            }
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_decode_kernels_match_reference() {
        let mut seed = 500;
        for m in [1, 5, 8, 9, 16, 33] {
            for (block, k) in [(128, 1096), (256, 4104), (128, 128)] {
                // M = 33 (three row tiles) would run `tiled` unless forced.
                let base = MatMulNBitsParams { variant: Some(Variant::Small), ..params(DType::F16, m, 100, k, block) };
                check_zero_points_and_splits(base, &mut seed, |kernel| kernel.contains("decode"));
            }
        }
        // M <= 8 runs `decode8_ahead3` while the grid fits one wave of 2 blocks per SM (all of
        // the above), `decode8` beyond (N = 9000: 282 blocks of 32 columns).
        for (m, n, expect) in [(1, 100, "decode8_ahead3"), (5, 9000, "decode8"), (8, 9000, "decode8")] {
            let p = MatMulNBitsParams { zero_points: ZeroPointKind::PackedU8, ..params(DType::F16, m, n, 1096, 128) };
            assert_eq!(variant_of(problem::<f16>(p, m as u64).check().kernel), expect);
            let p = MatMulNBitsParams { dtype: DType::BF16, bias: true, ..p };
            assert_eq!(variant_of(problem::<bf16>(p, 7 + m as u64).check().kernel), expect);
        }
    }

    /// `PackedMma`: B, scales and zero points repacked per 32-column tile and K chunk; both row
    /// builds, N off the tile, K ending inside a chunk and a block or a multiple of both, forced
    /// splits, both types.
    /// M <= 8 runs `decode8_packed_wide` (M <= 16 `decode16_packed_wide`) while the grid fits
    /// one wave of 2 blocks per SM (the small N here), `decode8_packed` (`decode16_packed`)
    /// beyond (N = 9000: 282 blocks of 32 columns).
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_packed_decode_matches_reference() {
        let (device, _) = gpu();
        let one_wave = 2 * device.multiprocessors() as usize;
        let mut seed = 900;
        for m in [1, 5, 8, 9, 16] {
            // K = 2048: the loop for K a multiple of the chunk, over several steps per warp.
            // Blocks of 32 and 64 (the fine records): K ending inside a chunk (4160 = 32.5
            // chunks, 1096) and inside a block of 64 (1064); the builder's K = 4096. Blocks of
            // 16 (the fine16 records): K ending inside a chunk (1056, 288, 4160).
            for (n, k, block) in [
                (100, 1096, 128),
                (64, 4104, 256),
                (33, 128, 128),
                (9000, 264, 128),
                (100, 2048, 256),
                (97, 4160, 32),
                (64, 1064, 64),
                (9000, 264, 32),
                (40, 4096, 32),
                (100, 1096, 64),
                (97, 4160, 16),
                (100, 1056, 16),
                (9000, 288, 16),
                (40, 4096, 16),
            ] {
                let base =
                    MatMulNBitsParams { variant: Some(Variant::PackedMma), ..params(DType::F16, m, n, k, block) };
                let fine = match block {
                    16 => "_fine16",
                    32 | 64 => "_fine",
                    _ => "",
                };
                check_zero_points_and_splits(base, &mut seed, |kernel| {
                    let tiles = n.div_ceil(32);
                    let want = if m > 8 && tiles > one_wave {
                        "decode16_packed"
                    } else if m > 8 {
                        "decode16_packed_wide"
                    } else if tiles > one_wave {
                        "decode8_packed"
                    } else {
                        // At most 4 tiles x 16 splits: inside one wave of any GPU of 32 SMs.
                        "decode8_packed_wide"
                    };
                    variant_of(kernel) == format!("{want}{fine}")
                });
            }
        }
    }

    /// One small problem on each `decode*_packed*_fine16` entry (blocks of 16; no, u8 zero
    /// points; f16 and bf16; K ending inside a chunk, clusters of K splits): what the sanitizers
    /// run. Many columns force the 4-warp builds, few the wide ones.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_fine16_builds_small() {
        let (device, _) = gpu();
        let one_wave = 2 * device.multiprocessors() as usize;
        let mut seed = 1600;
        for (m, n) in [(1, 40), (5, 32 * one_wave + 1), (9, 40), (16, 32 * one_wave + 1)] {
            for (zero_points, splits) in [(ZeroPointKind::Default, 0), (ZeroPointKind::PackedU8, 3)] {
                seed += 1;
                let p = MatMulNBitsParams {
                    zero_points,
                    splits,
                    bias: true,
                    variant: Some(Variant::PackedMma),
                    ..params(DType::F16, m, n, 288, 16)
                };
                let wide = if n == 40 { "_wide" } else { "" };
                let want = format!("decode{}_packed{wide}_fine16", if m <= 8 { 8 } else { 16 });
                assert_eq!(problem::<f16>(p, seed).check().kernel, format!("matmul_nbits_{want}_f16"));
                let p = MatMulNBitsParams { dtype: DType::BF16, ..p };
                assert_eq!(problem::<bf16>(p, seed + 100).check().kernel, format!("matmul_nbits_{want}_bf16"));
            }
        }
    }

    /// A problem's weights on the device (repacked on the stream where the variant reads the
    /// packed layout: a kernel just before the first call), its plan's workspace, and one call
    /// of a chain from any input to any output.
    struct DeviceWeights {
        p: MatMulNBitsParams,
        plan: MatMulNBitsPlan,
        b: CudaSlice<u8>,
        scales: CudaSlice<f16>,
        z: CudaSlice<u8>,
        b_packed: Option<CudaSlice<u8>>,
        workspace: CudaSlice<u8>,
    }

    impl DeviceWeights {
        fn new(device: &Device, stream: &Arc<CudaStream>, pr: &Problem<f16>) -> Self {
            use cudarc::driver::DevicePtr;
            let p = pr.p;
            let scales: Vec<f16> = pr.w.scales.iter().map(|&v| f16::from_f32(v)).collect();
            let HostZeros::Packed(z) = &pr.w.zero_points else { panic!("packed zero points") };
            let (b, scales, z) = (
                stream.clone_htod(&pr.w.b).unwrap(),
                stream.clone_htod(&scales).unwrap(),
                stream.clone_htod(z).unwrap(),
            );
            let b_packed = p.variant.is_some_and(Variant::reads_packed_b).then(|| {
                let packed = stream.alloc_zeros::<u8>(p.packed_bytes()).unwrap();
                let (bp, sp, zp) = (b.device_ptr(stream).0, scales.device_ptr(stream).0, z.device_ptr(stream).0);
                // SAFETY: B, scales and zero points as the params describe; `packed` holds
                // `packed_bytes` and overlaps none of them.
                unsafe { pack_for_decode_raw(device, stream.cu_stream(), &p, bp, sp, zp, packed.device_ptr(stream).0) }
                    .unwrap();
                packed
            });
            let plan = p.plan(device.multiprocessors(), device.has_wgmma()).unwrap();
            let workspace = stream.alloc_zeros::<u8>(plan.workspace_bytes.max(16)).unwrap();
            Self { p, plan, b, scales, z, b_packed, workspace }
        }

        /// The raw pointers of `to = from x W`. Taking them is what synchronizes cudarc's
        /// per-slice events, which a stream capture must not see (waiting there on an event
        /// recorded before the capture is an isolation error), so a capture takes them first.
        fn pointers(
            &self,
            stream: &Arc<CudaStream>,
            from: &CudaSlice<f16>,
            to: &mut CudaSlice<f16>,
        ) -> MatMulNBitsPointers {
            use cudarc::driver::{DevicePtr, DevicePtrMut};
            MatMulNBitsPointers {
                a: from.device_ptr(stream).0,
                b: self.b_packed.as_ref().unwrap_or(&self.b).device_ptr(stream).0,
                scales: self.scales.device_ptr(stream).0,
                zero_points: self.z.device_ptr(stream).0,
                bias: 0,
                y: to.device_ptr_mut(stream).0,
                workspace: self.workspace.device_ptr(stream).0,
            }
        }

        /// One call over `pointers`' result on `stream`: the launches and nothing else.
        fn launch(
            &self,
            device: &Device,
            stream: &Arc<CudaStream>,
            ptrs: &MatMulNBitsPointers,
            weights: WeightsWritten,
        ) {
            // SAFETY: `ptrs` came from `pointers` over live buffers of the extents the params
            // describe, `to` not `from`; what `weights` says is the caller's to make true.
            unsafe { matmul_nbits_raw_with(device, stream.cu_stream(), &self.p, ptrs, weights) }.unwrap();
        }

        /// `to = from x W` on `stream`; `to` is not `from`.
        fn call(
            &self,
            device: &Device,
            stream: &Arc<CudaStream>,
            from: &CudaSlice<f16>,
            to: &mut CudaSlice<f16>,
            weights: WeightsWritten,
        ) {
            let ptrs = self.pointers(stream, from, to);
            self.launch(device, stream, &ptrs, weights);
        }
    }

    /// Back-to-back decode calls on one stream overlap (programmatic dependent launches on
    /// Hopper) only as far as they may. B is packed on the device by the kernel just before the
    /// first call (`WeightsWritten::ByPreviousKernel`); the second reads the first's output and
    /// overwrites its input, the third reads that (`WeightsWritten::Before`: their first
    /// weights copied while the previous kernel runs). Each output is checked against the
    /// reference on the input the GPU held; an early read would see zeros or stale values.
    /// With and without K splits (a reduction kernel between the calls), both row builds, the
    /// `[N, K]` and the packed kernels; grids that let the next one start early (8 splits: 512
    /// blocks, more than an H200 holds) and at exit (one split: 64 blocks).
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_decode_chain_waits_for_the_previous_kernel() {
        let (device, stream) = gpu();
        let mut seed = 2100;
        for (m, variant) in [(1, None), (9, None), (5, Some(Variant::PackedMma)), (16, Some(Variant::PackedMma))] {
            for splits in [0, 1, 8] {
                // N = K so that outputs feed the next call; small enough that three products of
                // uniform weights stay far from f16's range.
                let n = 2048;
                seed += 1;
                let p = MatMulNBitsParams { variant, splits, ..params(DType::F16, m, n, n, 128) };
                let pr = problem::<f16>(p, seed);
                let weights = DeviceWeights::new(&device, &stream, &pr);
                let plan = &weights.plan;
                assert!(plan.kernel.contains("decode"), "{p:?}: {}", plan.kernel);
                let mut x = stream.clone_htod(&pr.a).unwrap();
                let (mut q, mut r) =
                    (stream.alloc_zeros::<f16>(m * n).unwrap(), stream.alloc_zeros::<f16>(m * n).unwrap());
                // The packing kernel (if any) runs just before the first call.
                weights.call(&device, &stream, &x, &mut q, WeightsWritten::ByPreviousKernel);
                weights.call(&device, &stream, &q, &mut x, WeightsWritten::Before);
                weights.call(&device, &stream, &x, &mut r, WeightsWritten::Before);
                let (q, x, r) =
                    (stream.clone_dtoh(&q).unwrap(), stream.clone_dtoh(&x).unwrap(), stream.clone_dtoh(&r).unwrap());
                let what = format!("{}, {} splits", plan.kernel, plan.splits);
                pr.check_values(&q, &format!("first call, {what}"));
                let pr = Problem { a: q, ..pr };
                pr.check_values(&x, &format!("second call, {what}"));
                let pr = Problem { a: x, ..pr };
                pr.check_values(&r, &format!("third call, {what}"));
            }
        }
    }

    /// The same kind of chain captured into a CUDA graph and replayed, as ONNX Runtime's
    /// `enable_cuda_graph` runs a model: the programmatic dependent launches (decode kernels,
    /// the permutation before `wgmma`, which also clears the stream-K flags) become graph
    /// edges, which must order them as the stream did. Warm-up calls first (the kernels load,
    /// the occupancy is cached: ORT captures after warm-up runs too), then a capture of three
    /// calls (the second reads the first's output and overwrites its input), two replays from
    /// the same input, each output checked against the reference. Decode (packed and `[N, K]`,
    /// with and without splits) and the larger-M kernels (`wgmma` pair, stream-K, whole tiles).
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_chain_replays_from_a_cuda_graph() {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let (device, stream) = gpu();
        let mut seed = 2600;
        let cases = [
            (1, 2048, None, 0),
            (9, 2048, Some(Variant::PackedMma), 8),
            (16, 2048, Some(Variant::Packed), 0),
            (64, 1024, None, 0),
            (96, 1024, Some(Variant::WgmmaStreamK), 0),
            (128, 1024, Some(Variant::Wgmma), 0),
            (300, 1024, Some(Variant::Prefill), 0),
        ];
        for (m, n, variant, splits) in cases {
            let hopper_only = matches!(variant, Some(Variant::Wgmma | Variant::WgmmaStreamK | Variant::Prefill));
            if hopper_only && !device.has_wgmma() {
                continue;
            }
            seed += 1;
            // N = K so that outputs feed the next call.
            let p = MatMulNBitsParams { variant, splits, ..params(DType::F16, m, n, n, 128) };
            let pr = problem::<f16>(p, seed);
            let weights = DeviceWeights::new(&device, &stream, &pr);
            // The weights are in place before the chain, as an initializer is before a run.
            stream.synchronize().unwrap();
            let a0 = stream.clone_htod(&pr.a).unwrap();
            let mut x = stream.clone_htod(&pr.a).unwrap();
            let (mut q, mut r) = (stream.alloc_zeros::<f16>(m * n).unwrap(), stream.alloc_zeros::<f16>(m * n).unwrap());
            let calls = [
                weights.pointers(&stream, &x, &mut q),
                weights.pointers(&stream, &q, &mut x),
                weights.pointers(&stream, &x, &mut r),
            ];
            let chain = || {
                for ptrs in &calls {
                    weights.launch(&device, &stream, ptrs, WeightsWritten::Before);
                }
            };
            // Warm-up: the same calls, outside any capture.
            chain();
            stream.synchronize().unwrap();
            // Thread-local: the other tests' threads keep using the device meanwhile, and
            // anything this thread's launches do that a capture forbids still fails here.
            stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
            chain();
            let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph");
            let what = format!("{}, {} splits, graph", weights.plan.kernel, weights.plan.splits);
            for replay in 0..2 {
                stream.memcpy_dtod(&a0, &mut x).unwrap();
                stream.memset_zeros(&mut q).unwrap();
                stream.memset_zeros(&mut r).unwrap();
                graph.launch().unwrap();
                let (qh, xh, rh) =
                    (stream.clone_dtoh(&q).unwrap(), stream.clone_dtoh(&x).unwrap(), stream.clone_dtoh(&r).unwrap());
                pr.check_values(&qh, &format!("first call, {what}, replay {replay}"));
                let next = Problem { a: qh, ..pr.clone() };
                next.check_values(&xh, &format!("second call, {what}, replay {replay}"));
                let last = Problem { a: xh, ..pr.clone() };
                last.check_values(&rh, &format!("third call, {what}, replay {replay}"));
            }
        }
    }

    /// Whether the GPU runs the sm_90a module; elsewhere checks that `variant` (one of its
    /// kernels) is refused there, and says that it is not run.
    fn hopper_or_refused(variant: Variant) -> bool {
        let (device, _) = gpu();
        if device.has_wgmma() {
            return true;
        }
        let p = MatMulNBitsParams { variant: Some(variant), ..params(DType::F16, 16, 64, 256, 128) };
        let err = p.plan(device.multiprocessors(), false).unwrap_err().to_string();
        assert!(err.contains("Hopper"), "{err}");
        eprintln!("{}: no sm_90a module, {variant:?} not run", device.name());
        false
    }

    /// `PackedWgmma` (Hopper; the planner's `Packed` there) over the same records: its 16-token
    /// build (8 < M <= 16), N off the 128-column block and off the 32-column tile (tiles past N
    /// in a block), K ending inside a chunk and a block, one split chosen or forced, both types;
    /// `Packed` runs it where N fills the GPU.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_packed_decode_wgmma_matches_reference() {
        if !hopper_or_refused(Variant::PackedWgmma) {
            return;
        }
        let (device, _) = gpu();
        let mut seed = 1700u64;
        for m in [9, 16] {
            for (n, k, block) in [(100, 1096, 128), (300, 4104, 256), (33, 128, 128), (160, 2048, 128)] {
                let base =
                    MatMulNBitsParams { variant: Some(Variant::PackedWgmma), ..params(DType::F16, m, n, k, block) };
                for (zero_points, splits) in [(ZeroPointKind::Default, 0), (ZeroPointKind::PackedU8, 1)] {
                    seed += 1;
                    let p = MatMulNBitsParams { zero_points, splits, bias: seed.is_multiple_of(2), ..base };
                    let plan = problem::<f16>(p, seed).check();
                    assert!(plan.kernel.contains("_packed_wgmma") && plan.reduce.is_none(), "{p:?}: {}", plan.kernel);
                    let p = MatMulNBitsParams { dtype: DType::BF16, ..p };
                    assert!(
                        problem::<bf16>(p, seed + 1000).check().kernel == "matmul_nbits_packed_wgmma16_bf16",
                        "{p:?}"
                    );
                }
            }
        }
        // `Packed` runs it where M > 8 and N alone fills the GPU: no split.
        let n = 128 * device.multiprocessors() as usize + 40;
        let p = MatMulNBitsParams { variant: Some(Variant::Packed), bias: true, ..params(DType::F16, 16, n, 256, 128) };
        let plan = problem::<f16>(p, 77).check();
        assert_eq!(
            (plan.variant, plan.kernel, plan.splits),
            (Variant::PackedWgmma, "matmul_nbits_packed_wgmma16_f16", 1)
        );
    }

    /// The device packer writes what `MatMulNBitsWeights::pack_for_decode` writes, byte for byte: N off
    /// the 32-column tile (33, 97, 100), K ending inside a chunk and inside a block (1000,
    /// 1096, 4104, 4160, 1064), blocks 32 to 256, both integer zero-point kinds, both types.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_device_packing_matches_host_packing() {
        let (device, stream) = gpu();
        let mut seed = 1300;
        for (n, k, block) in [
            (33, 128, 128),
            (97, 1000, 128),
            (100, 1096, 128),
            (64, 4104, 256),
            (40, 1000, 256),
            (97, 4160, 32),
            (33, 1000, 32),
            (64, 1064, 64),
            (40, 200, 64),
            (97, 4160, 16),
            (33, 1000, 16),
        ] {
            for zero_points in [ZeroPointKind::Default, ZeroPointKind::PackedU8] {
                for dtype in [DType::F16, DType::BF16] {
                    seed += 1;
                    let p = MatMulNBitsParams { zero_points, ..params(dtype, 1, n, k, block) };
                    let pr = problem::<f16>(p, seed);
                    // The scales' bits are all the packer sees of the type.
                    let bits: Vec<u16> = pr.w.scales.iter().map(|&s| f16::from_f32(s).to_bits()).collect();
                    let want = pr.w.pack_for_decode(&bits).unwrap();
                    let b = stream.clone_htod(&pr.w.b).unwrap();
                    let zp = match &pr.w.zero_points {
                        HostZeros::Packed(z) => Some(stream.clone_htod(z).unwrap()),
                        _ => None,
                    };
                    let got = if dtype == DType::F16 {
                        let scales = stream.clone_htod(bytemuck::cast_slice::<u16, f16>(&bits)).unwrap();
                        let zero_points = zp.as_ref().map_or(ZeroPoints::Default, ZeroPoints::PackedU8);
                        pack_for_decode(
                            &device,
                            &stream,
                            &p,
                            &MatMulNBitsDeviceWeights { b: &b, scales: &scales, zero_points },
                        )
                    } else {
                        let scales = stream.clone_htod(bytemuck::cast_slice::<u16, bf16>(&bits)).unwrap();
                        let zero_points = zp.as_ref().map_or(ZeroPoints::Default, ZeroPoints::PackedU8);
                        pack_for_decode(
                            &device,
                            &stream,
                            &p,
                            &MatMulNBitsDeviceWeights { b: &b, scales: &scales, zero_points },
                        )
                    };
                    let got = stream.clone_dtoh(&got.unwrap_or_else(|e| panic!("{p:?}: {e}"))).unwrap();
                    assert_eq!(got.len(), p.packed_bytes(), "{p:?}");
                    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
                        panic!("{p:?}: byte {i} of {} is {} on the device, {} on the host", got.len(), got[i], want[i]);
                    }
                }
            }
        }
        // The safe wrapper refuses what the packed layout cannot hold, and mismatched slices.
        let p = params(DType::F16, 1, 32, 256, 16);
        let pr = problem::<f16>(p, 7);
        let b = stream.clone_htod(&pr.w.b).unwrap();
        let scales = stream.clone_htod(&vec![f16::ONE; 32 * 4]).unwrap();
        let zp = stream.clone_htod(&vec![0x88u8; 32 * 2]).unwrap();
        let w = MatMulNBitsDeviceWeights { b: &b, scales: &scales, zero_points: ZeroPoints::PackedU8(&zp) };
        let err = pack_for_decode(&device, &stream, &MatMulNBitsParams { block_size: 8, ..p }, &w).unwrap_err();
        assert!(err.to_string().contains("block_size >= 16, got 8"), "{err}");
        let p = MatMulNBitsParams { block_size: 128, ..p };
        let w = MatMulNBitsDeviceWeights { zero_points: ZeroPoints::Default, ..w };
        let err = pack_for_decode(&device, &stream, &p, &w).unwrap_err().to_string();
        assert!(err.contains("must match the slices"), "{err}");
        let p = MatMulNBitsParams { zero_points: ZeroPointKind::Default, n: 64, ..p };
        let err = pack_for_decode(&device, &stream, &p, &w).unwrap_err().to_string();
        assert!(err.contains("B holds"), "{err}");
    }

    /// `tiled` (M > 16, integer zero points, blocks >= 32): both row tiles, M, N and K off
    /// their tiles (K ending inside a chunk and inside a block), forced splits, bias, both
    /// types; then the unaligned fallbacks through raw pointers.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_tiled_kernels_match_reference() {
        let mut seed = 500;
        for &(m, n, k, block) in &[
            (17, 8, 16, 32),
            (17, 100, 1096, 32),
            (33, 130, 1000, 32),
            (64, 256, 4096, 128),
            (97, 80, 1025, 64),
            (200, 136, 777, 256),
        ] {
            // Forced: Hopper takes `wgmma` for those above 32 rows (tested below).
            let base = MatMulNBitsParams { variant: Some(Variant::Tiled), ..params(DType::F16, m, n, k, block) };
            check_zero_points_and_splits(base, &mut seed, |kernel| kernel.contains("tiled"));
        }
        // More than 64 rows: 128 x 128.
        let tiled = Some(Variant::Tiled);
        let p = MatMulNBitsParams { bias: true, variant: tiled, ..params(DType::F16, 1030, 4200, 300, 64) };
        assert!(problem::<f16>(p, 7).check().kernel.contains("tiled128x128"));
        let p = MatMulNBitsParams { bias: true, variant: tiled, ..params(DType::BF16, 130, 4200, 1000, 32) };
        assert!(problem::<bf16>(p, 8).check().kernel.contains("tiled128x128"));
    }

    /// `wgmma` (Hopper; elsewhere only its refusal is checked): M, N and K off its 128 x 128
    /// tile and 128-wide K chunk (K ending inside a chunk and inside a block, K odd: A's rows
    /// then allow no 16-byte loads, which the permutation absorbs), every block size it takes,
    /// both zero-point kinds, forced and chosen splits, bias, both types; the planner's own
    /// choice for M > 32.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_wgmma_kernel_matches_reference() {
        let wgmma = Some(Variant::Wgmma);
        if !hopper_or_refused(Variant::Wgmma) {
            return;
        }
        let (device, _) = gpu();
        let mut seed = 700;
        for &(m, n, k, block) in &[
            (1, 8, 16, 32),
            (17, 8, 72, 32),
            (33, 130, 1000, 32),
            (128, 128, 64, 64),
            (97, 80, 1032, 64),
            (70, 72, 1001, 32),
            (200, 136, 776, 256),
            (300, 260, 4104, 128),
        ] {
            let base = MatMulNBitsParams { variant: wgmma, ..params(DType::F16, m, n, k, block) };
            check_zero_points_and_splits(base, &mut seed, |kernel| kernel.contains("_wgmma"));
            // Two splits: the cluster pair.
            let p = MatMulNBitsParams { splits: 2, bias: true, ..base };
            if p.k.div_ceil(128) >= 2 {
                assert_eq!(problem::<f16>(p, seed).check().kernel, "matmul_nbits_wgmma_pair_f16");
                let p = MatMulNBitsParams { dtype: DType::BF16, zero_points: ZeroPointKind::PackedU8, ..p };
                assert_eq!(problem::<bf16>(p, seed + 1).check().kernel, "matmul_nbits_wgmma_pair_bf16");
            }
        }
        // The planner's choice: 200 tiles, which fill 2 waves of 132 SMs to 76%, run stream-K
        // (as 100 tiles of 256 rows they would not fill the SMs for `prefill`).
        let p = MatMulNBitsParams { bias: true, ..params(DType::F16, 200, 12750, 320, 64) };
        let plan = problem::<f16>(p, 9).check();
        let expect = if device.multiprocessors() == 132 { "matmul_nbits_wgmma_streamk_f16" } else { plan.kernel };
        assert_eq!(plan.kernel, expect);
        assert!(variant_of(plan.kernel).starts_with("wgmma") && plan.kernel.ends_with("_f16"), "{}", plan.kernel);
    }

    /// `prefill` (Hopper; elsewhere only the refusal is checked): M, N and K off the 256 x 128
    /// tile and 128-wide K chunk (K ending inside a chunk and inside a block, K odd, K of one
    /// to many more chunks than the code ring holds), every block size it takes, both
    /// zero-point kinds, bias, both types; the planner's own choice where the tiles fill the SMs.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_prefill_kernel_matches_reference() {
        if !hopper_or_refused(Variant::Prefill) {
            return;
        }
        let (device, _) = gpu();
        let mut seed = 900u64;
        for &(m, n, k, block) in &[
            (1, 8, 16, 32),
            (260, 24, 256, 32),
            (200, 40, 392, 128),
            (97, 80, 1032, 64),
            (257, 136, 776, 256),
            (300, 260, 4104, 128),
            (513, 130, 1000, 32),
            (1025, 72, 1001, 32),
        ] {
            for zero_points in [ZeroPointKind::Default, ZeroPointKind::PackedU8] {
                seed += 1;
                let bias = seed.is_multiple_of(2);
                let p = MatMulNBitsParams {
                    zero_points,
                    bias,
                    variant: Some(Variant::Prefill),
                    ..params(DType::F16, m, n, k, block)
                };
                assert_eq!(problem::<f16>(p, seed).check().kernel, "matmul_nbits_prefill_f16");
                let p = MatMulNBitsParams { dtype: DType::BF16, ..p };
                assert_eq!(problem::<bf16>(p, seed + 1000).check().kernel, "matmul_nbits_prefill_bf16");
            }
        }
        // The planner's choice where its tiles fill a wave: 2 x 66 of them on 132 SMs.
        let p = MatMulNBitsParams { bias: true, ..params(DType::F16, 257, 66 * 128, 200, 32) };
        let plan = problem::<f16>(p, 9).check();
        if device.multiprocessors() <= 132 {
            assert_eq!(plan.kernel, "matmul_nbits_prefill_f16");
        }
    }

    /// The `_any` builds of the `wgmma` kernels and of `prefill` (Hopper): blocks of 16 with each
    /// kind of zero points, and fractional zero points in A's type at blocks of 32 to 256, on
    /// every forced variant (whole tiles, the cluster pair, stream-K, `prefill`), M, N and K off
    /// the tiles, K ending inside a chunk and inside a block, bias, both types; and the
    /// planner's choice for those formats above M = 16.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_any_format_builds_match_reference() {
        if !hopper_or_refused(Variant::Wgmma) {
            return;
        }
        let (device, _) = gpu();
        let mut seed = 1300u64;
        let formats = [
            (16, ZeroPointKind::Default),
            (16, ZeroPointKind::PackedU8),
            (16, ZeroPointKind::Typed),
            (32, ZeroPointKind::Typed),
            (64, ZeroPointKind::Typed),
            (128, ZeroPointKind::Typed),
            (256, ZeroPointKind::Typed),
        ];
        for (block, zero_points) in formats {
            for &(m, n, k, variant, splits) in &[
                (17usize, 40usize, 1000usize, Variant::Wgmma, 0usize),
                (97, 136, 1032, Variant::Wgmma, 2),
                (130, 72, 4104, Variant::Wgmma, 3),
                (64, 200, 776, Variant::WgmmaStreamK, 0),
                (257, 136, 2056, Variant::Prefill, 0),
                (300, 24, 520, Variant::Prefill, 0),
            ] {
                // Rows of B are whole 16-byte vectors (`k_blocks` even at blocks of 16).
                let k = if block == 16 { k.div_ceil(32) * 32 } else { k };
                seed += 1;
                let p = MatMulNBitsParams {
                    zero_points,
                    splits,
                    bias: seed.is_multiple_of(2),
                    variant: Some(variant),
                    ..params(DType::F16, m, n, k, block)
                };
                let entry = match (variant, splits) {
                    (Variant::Wgmma, 2) => "wgmma_pair_any",
                    (Variant::Wgmma, _) => "wgmma_any",
                    (Variant::WgmmaStreamK, _) => "wgmma_streamk_any",
                    _ => "prefill_any",
                };
                assert_eq!(problem::<f16>(p, seed).check().kernel, format!("matmul_nbits_{entry}_f16"), "{p:?}");
                let p = MatMulNBitsParams { dtype: DType::BF16, ..p };
                assert_eq!(problem::<bf16>(p, seed + 1000).check().kernel, format!("matmul_nbits_{entry}_bf16"));
            }
            // The planner's choice from M = 17 (`large` before).
            let p = MatMulNBitsParams { zero_points, bias: true, ..params(DType::F16, 17, 300, 512, block) };
            let plan = problem::<f16>(p, seed + 2000).check();
            assert!(
                plan.kernel.starts_with("matmul_nbits_wgmma") && plan.kernel.ends_with("_any_f16"),
                "{}",
                plan.kernel
            );
        }
        // `prefill_any` where its tiles fill the SMs.
        let p = MatMulNBitsParams { zero_points: ZeroPointKind::Typed, ..params(DType::F16, 257, 66 * 128, 256, 16) };
        let plan = problem::<f16>(p, 3000).check();
        if device.multiprocessors() <= 132 {
            assert_eq!(plan.kernel, "matmul_nbits_prefill_any_f16");
        }
    }

    /// One small problem on each `_any` entry (blocks of 16, typed zero points; f16 and bf16):
    /// what the sanitizers run.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_any_format_builds_small() {
        if !hopper_or_refused(Variant::Wgmma) {
            return;
        }
        for (i, &(m, n, k, variant, splits)) in [
            (40usize, 24usize, 288usize, Variant::Wgmma, 0usize),
            (40, 24, 288, Variant::Wgmma, 2),
            (40, 24, 288, Variant::WgmmaStreamK, 0),
            (260, 24, 544, Variant::Prefill, 0),
        ]
        .iter()
        .enumerate()
        {
            let p = MatMulNBitsParams {
                zero_points: ZeroPointKind::Typed,
                splits,
                bias: true,
                variant: Some(variant),
                ..params(DType::F16, m, n, k, 16)
            };
            assert!(problem::<f16>(p, 1400 + i as u64).check().kernel.ends_with("_any_f16"));
            let p = MatMulNBitsParams { dtype: DType::BF16, zero_points: ZeroPointKind::PackedU8, ..p };
            assert!(problem::<bf16>(p, 1500 + i as u64).check().kernel.ends_with("_any_bf16"));
        }
    }

    /// Runs `pr` through [`matmul_nbits_raw`] with A and B starting `a_off` elements and `b_off`
    /// bytes into their buffers (so off alignment) and a workspace whose every byte is `fill`
    /// (what the kernels may not rely on: a caller's workspace holds anything).
    fn run_raw(pr: &Problem<f16>, a_off: usize, b_off: usize, fill: u8) -> (Vec<f16>, MatMulNBitsPlan) {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let (device, stream) = gpu();
        let (m, n) = (pr.p.m, pr.p.n);
        let a = stream.clone_htod(&[vec![f16::ZERO; a_off], pr.a.clone()].concat()).unwrap();
        let b = stream.clone_htod(&[vec![0u8; b_off], pr.w.b.clone()].concat()).unwrap();
        let scales: Vec<f16> = pr.w.scales.iter().map(|&s| f16::from_f32(s)).collect();
        let scales = stream.clone_htod(&scales).unwrap();
        let HostZeros::Packed(z) = &pr.w.zero_points else { panic!("packed zero points") };
        let z = stream.clone_htod(z).unwrap();
        let bias = stream.clone_htod(pr.bias.as_ref().unwrap()).unwrap();
        let mut y = stream.alloc_zeros::<f16>(m * n).unwrap();
        let rows =
            RowAlignment::of(&pr.p, a.device_ptr(&stream).0 + 2 * a_off as u64, b.device_ptr(&stream).0 + b_off as u64);
        let plan = pr.p.plan_for(device.multiprocessors(), device.has_wgmma(), rows).unwrap();
        let ws = stream.clone_htod(&vec![fill; plan.workspace_bytes.max(16)]).unwrap();
        let ptrs = MatMulNBitsPointers {
            a: a.device_ptr(&stream).0 + 2 * a_off as u64,
            b: b.device_ptr(&stream).0 + b_off as u64,
            scales: scales.device_ptr(&stream).0,
            zero_points: z.device_ptr(&stream).0,
            bias: bias.device_ptr(&stream).0,
            y: y.device_ptr_mut(&stream).0,
            workspace: ws.device_ptr(&stream).0,
        };
        // SAFETY: every buffer holds the extent the params describe past its offset.
        let plan = unsafe { matmul_nbits_raw(&device, stream.cu_stream(), &pr.p, &ptrs) }.unwrap();
        (stream.clone_dtoh(&y).unwrap(), plan)
    }

    /// Rows of B off 16-byte alignment run `large`, rows of A off it still run `tiled` or, on
    /// Hopper, `wgmma` (their permutation reads any alignment); all against the reference,
    /// through raw pointers.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_tiled_falls_back_on_unaligned_rows() {
        let (device, _) = gpu();
        let pr = problem::<f16>(MatMulNBitsParams { bias: true, ..params(DType::F16, 40, 72, 520, 32) }, 77);
        // Hopper runs `wgmma` for M = 40 (from the same permuted copy of A), elsewhere `tiled`.
        let aligned_b = if device.has_wgmma() { "wgmma" } else { "tiled64x128" };
        for (a_off, b_off, expect) in [(1usize, 0usize, aligned_b), (0, 4, "large"), (3, 4, "large")] {
            let (y, plan) = run_raw(&pr, a_off, b_off, 0);
            assert_eq!(variant_of(plan.kernel), expect);
            pr.check_values(&y, plan.kernel);
        }
    }

    /// `wgmma_streamk` (Hopper), forced: grids of one block per chunk (every tile summed from
    /// up to 16 blocks' parts), of fewer blocks than chunks with tiles split unevenly, and of
    /// blocks spanning two or three tiles (266 tiles of 2 chunks on the SMs); K off the chunk
    /// and the block, M and N off the tile, both types and zero-point kinds, bias; the planner's
    /// own choice where whole tiles fill the last wave poorly (150 tiles); and a workspace of
    /// 0xff bytes, twice (its flags must be cleared for each launch).
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_wgmma_streamk_matches_reference() {
        let streamk = Some(Variant::WgmmaStreamK);
        if !hopper_or_refused(Variant::WgmmaStreamK) {
            return;
        }
        let (device, _) = gpu();
        let mut seed = 900;
        for &(m, n, k, block) in &[
            (1, 8, 16, 32),
            (33, 130, 1000, 32),
            (97, 80, 1032, 64),
            (200, 136, 776, 256),
            (300, 260, 4104, 128),
            (130, 17024, 256, 128),
        ] {
            for zero_points in [ZeroPointKind::Default, ZeroPointKind::PackedU8] {
                seed += 1;
                let p = MatMulNBitsParams {
                    zero_points,
                    bias: seed % 2 == 0,
                    variant: streamk,
                    ..params(DType::F16, m, n, k, block)
                };
                assert_eq!(problem::<f16>(p, seed).check().kernel, "matmul_nbits_wgmma_streamk_f16");
                let p = MatMulNBitsParams { dtype: DType::BF16, ..p };
                assert_eq!(problem::<bf16>(p, seed + 1000).check().kernel, "matmul_nbits_wgmma_streamk_bf16");
            }
        }
        let p = MatMulNBitsParams { bias: true, ..params(DType::F16, 128, 150 * 128, 256, 128) };
        let pr = problem::<f16>(p, 990);
        let plan = pr.check();
        if device.multiprocessors() == 132 {
            assert_eq!(plan.kernel, "matmul_nbits_wgmma_streamk_f16");
        }
        let pr = problem::<f16>(MatMulNBitsParams { variant: streamk, ..p }, 991);
        for _ in 0..2 {
            let (y, plan) = run_raw(&pr, 0, 0, 0xff);
            pr.check_values(&y, plan.kernel);
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_variants_and_splits_agree_with_reference() {
        for variant in [Variant::Small, Variant::Large, Variant::Tiled] {
            for splits in [1, 2, 7] {
                let p = MatMulNBitsParams { variant: Some(variant), splits, ..params(DType::F16, 70, 136, 1100, 64) };
                problem::<f16>(p, splits as u64).check();
                let p = MatMulNBitsParams { dtype: DType::BF16, bias: true, ..p };
                problem::<bf16>(p, 10 + splits as u64).check();
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
        #[test]
        #[ignore = "needs a CUDA device"]
        fn gpu_matches_reference_on_random_shapes(
            m in 1usize..80, n in 1usize..300, k in 1usize..1200,
            block in prop_oneof![Just(16usize), Just(32), Just(64), Just(128), Just(256)],
            zero in 0usize..3, bias: bool, variant in 0usize..4, splits in 0usize..4, bf: bool, seed: u64,
        ) {
            let zero_points = [ZeroPointKind::Default, ZeroPointKind::PackedU8, ZeroPointKind::Typed][zero];
            let mut variant = [None, Some(Variant::Small), Some(Variant::Large), Some(Variant::Tiled)][variant];
            if variant == Some(Variant::Tiled) && (zero_points == ZeroPointKind::Typed || block < 32) {
                variant = None; // `tiled` refuses these (see gpu_plan_validates_and_splits)
            }
            let dtype = if bf { DType::BF16 } else { DType::F16 };
            let p = MatMulNBitsParams { zero_points, bias, variant, splits, ..params(dtype, m, n, k, block) };
            if bf { problem::<bf16>(p, seed).check(); } else { problem::<f16>(p, seed).check(); }
        }
    }
}

/// The device packer's plan: one block of `PACK_THREADS` per 32-column tile and K chunk, and
/// the same refusals as the host packer (checked without a GPU).
#[test]
fn device_packing_plan_covers_every_record_and_refuses_what_packed_cannot_hold() {
    use dlkern::DType;
    use dlkern::ops::matmul_nbits::plan::*;
    let p = MatMulNBitsParams {
        dtype: DType::BF16,
        m: 1,
        n: 97,
        k: 1000,
        block_size: 256,
        zero_points: ZeroPointKind::PackedU8,
        bias: false,
        variant: None,
        splits: 0,
    };
    let (dims, args) = pack_for_decode_plan(&p).unwrap();
    assert_eq!(dims.grid, (4 * 8, 1, 1)); // ceil(97 / 32) tiles x ceil(1000 / 128) chunks
    assert_eq!(dims.block.0 as usize * 16 + 128, p.packed_bytes() / 32, "16 bytes of codes a thread");
    assert_eq!((args.k_blocks, args.block_shift, args.row_bytes), (4, 8, 512));
    let refuse = |q: MatMulNBitsParams, what: &str| {
        let err = pack_for_decode_plan(&q).unwrap_err().to_string();
        assert!(err.contains(what), "{q:?}: {err}");
    };
    // The fine records (blocks of 32 and 64): 48 bytes of constants per lane group.
    let fine = MatMulNBitsParams { block_size: 32, ..p };
    let (dims, args) = pack_for_decode_plan(&fine).unwrap();
    assert_eq!(dims.grid, (4 * 8, 1, 1));
    assert_eq!(dims.block.0 as usize * 16 + 8 * 48, fine.packed_bytes() / 32);
    assert_eq!((args.k_blocks, args.block_shift, args.row_bytes), (32, 5, 512));
    // The fine16 records (blocks of 16): 80 bytes of constants per lane group.
    let fine16 = MatMulNBitsParams { block_size: 16, ..p };
    let (dims, args) = pack_for_decode_plan(&fine16).unwrap();
    assert_eq!(dims.block.0 as usize * 16 + 8 * 80, fine16.packed_bytes() / 32);
    assert_eq!((args.k_blocks, args.block_shift, args.row_bytes), (63, 4, 504));
    refuse(MatMulNBitsParams { block_size: 8, ..p }, "block_size >= 16");
    refuse(MatMulNBitsParams { block_size: 192, ..p }, "block_size >= 16");
    refuse(MatMulNBitsParams { zero_points: ZeroPointKind::Typed, ..p }, "integer zero points");
    refuse(MatMulNBitsParams { dtype: DType::F32, ..p }, "dtype f32");
    refuse(MatMulNBitsParams { n: 0, ..p }, "N = 0");
}

#[test]
fn gpu_plan_validates_and_splits() {
    use dlkern::DType;
    use dlkern::ops::matmul_nbits::plan::*;
    let ok = MatMulNBitsParams {
        dtype: DType::F16,
        m: 1,
        n: 8192,
        k: 8192,
        block_size: 128,
        zero_points: ZeroPointKind::Default,
        bias: false,
        variant: None,
        splits: 0,
    };
    // N alone fills the GPU: 256 blocks of 32 columns, the 8-row build, no K split; one wave
    // of 2 blocks per SM, so activations 3 chunks ahead; more blocks take `decode8`.
    let plan = ok.plan(132, false).unwrap();
    assert_eq!(
        (plan.variant, plan.kernel, plan.dims.grid, plan.splits),
        (Variant::Small, "matmul_nbits_decode8_ahead3_f16", (256, 1, 1), 1)
    );
    let plan = MatMulNBitsParams { n: 28672, ..ok }.plan(132, false).unwrap();
    assert_eq!((plan.kernel, plan.dims.grid), ("matmul_nbits_decode8_f16", (896, 1, 1)));
    assert_eq!((plan.reduce, plan.workspace_bytes, plan.permute), (None, 0, None));
    // `Packed` reads its own B layout: never a non-packed build, whatever the grid; without
    // `wgmma`, the `mma.sync` decode kernels.
    // M <= 8: 8 warps per block while the grid is one wave of 2 blocks per SM (256 blocks), 4
    // beyond (896); M <= 16: 6 warps, 4 beyond.
    for (m, n, expect) in [
        (1, 8192, "decode8_packed_wide"),
        (8, 8192, "decode8_packed_wide"),
        (1, 28672, "decode8_packed"),
        (9, 8192, "decode16_packed_wide"),
        (16, 28672, "decode16_packed"),
    ] {
        let plan = MatMulNBitsParams { m, n, variant: Some(Variant::Packed), ..ok }.plan(132, false).unwrap();
        assert_eq!(plan.kernel, format!("matmul_nbits_{expect}_f16"), "M = {m}, N = {n}");
        assert_eq!(plan.variant, Variant::PackedMma);
        let (threads, shared) = match expect {
            "decode8_packed_wide" => (256, 2 * 34816),
            "decode16_packed_wide" => (192, 3 * 34816 / 2),
            _ => (128, 34816),
        };
        assert_eq!((plan.dims.block, plan.dims.shared_bytes), ((threads, 1, 1), shared), "M = {m}, N = {n}");
    }
    // With `wgmma`, `Packed` runs `PackedWgmma` where M > 8 and N alone fills the GPU (no K
    // split), the `mma.sync` kernels elsewhere.
    for (m, n, expect) in [
        (1, 28672, "decode8_packed"),
        (8, 28672, "decode8_packed"),
        (16, 8192, "decode16_packed_wide"),
        (16, 16768, "decode16_packed"),
        (9, 28672, "packed_wgmma16"),
        (16, 16896, "packed_wgmma16"),
    ] {
        let plan = MatMulNBitsParams { m, n, variant: Some(Variant::Packed), ..ok }.plan(132, true).unwrap();
        let variant = if expect.starts_with("packed_wgmma") { Variant::PackedWgmma } else { Variant::PackedMma };
        assert_eq!((plan.variant, plan.kernel), (variant, &*format!("matmul_nbits_{expect}_f16")), "M = {m}, N = {n}");
    }
    // Forced `PackedWgmma`: 128 columns per block, 16 rows, K not split; no workspace.
    for (m, n, k, expect, grid) in [
        (9, 28672, 8192, "packed_wgmma16", (224, 1, 1)),
        (16, 16384, 8192, "packed_wgmma16", (128, 1, 1)),
        (16, 8192, 8192, "packed_wgmma16", (64, 1, 1)),
        (16, 100, 1000, "packed_wgmma16", (1, 1, 1)),
    ] {
        let plan = MatMulNBitsParams { m, n, k, variant: Some(Variant::PackedWgmma), ..ok }.plan(132, true).unwrap();
        let what = format!("M = {m}, N = {n}, K = {k}");
        assert_eq!(
            (plan.variant, plan.kernel, plan.dims.grid),
            (Variant::PackedWgmma, &*format!("matmul_nbits_{expect}_f16"), grid),
            "{what}"
        );
        assert_eq!(
            (plan.dims.block, plan.workspace_bytes, plan.reduce, plan.permute),
            ((256, 1, 1), 0, None, None),
            "{what}"
        );
        // The `mma.sync` kernels stay available on Hopper.
        let mma = MatMulNBitsParams { m, n, k, variant: Some(Variant::PackedMma), ..ok }.plan(132, true).unwrap();
        let variant = variant_of(mma.kernel);
        assert!(variant.ends_with("_packed") || variant.ends_with("_packed_wide"), "{what}: {}", mma.kernel);
    }
    // `Packed` with K split by force stays on the `mma.sync` kernels.
    let plan = MatMulNBitsParams { m: 16, n: 28672, splits: 2, variant: Some(Variant::Packed), ..ok };
    let plan = plan.plan(132, true).unwrap();
    assert_eq!((plan.variant, plan.kernel, plan.splits), (Variant::PackedMma, "matmul_nbits_decode16_packed_f16", 2));
    let unaligned = ok.plan_for(132, false, RowAlignment::UNALIGNED).unwrap();
    assert_eq!(unaligned.kernel, "matmul_nbits_small_f16");
    // K % 8 != 0: rows of A are not 16-byte multiples even in an aligned tensor.
    assert_eq!(MatMulNBitsParams { k: 1001, ..ok }.plan(132, false).unwrap().kernel, "matmul_nbits_small_f16");
    let plan = MatMulNBitsParams { m: 9, ..ok }.plan(132, false).unwrap();
    assert_eq!((plan.kernel, plan.dims.grid.1), ("matmul_nbits_decode16_f16", 1));
    // Blocks smaller than a K chunk and fractional zero points take the general `small`.
    let plan = MatMulNBitsParams { block_size: 64, ..ok }.plan(132, false).unwrap();
    assert_eq!((plan.kernel, plan.dims.grid.1), ("matmul_nbits_small_f16", 1));
    let plan = MatMulNBitsParams { m: 9, zero_points: ZeroPointKind::Typed, ..ok }.plan(132, false).unwrap();
    assert_eq!(plan.kernel, "matmul_nbits_small_zf_f16");
    // Few columns: K is split until every SM has a block.
    let plan = MatMulNBitsParams { n: 1024, ..ok }.plan(132, false).unwrap();
    assert!(plan.splits == 5 && plan.reduce.is_some() && plan.workspace_bytes == 5 * 1024 * 4);
    // Larger M: `tiled`, the 64-row tile until the 128-row one alone fills the GPU; the
    // permuted activations lead the workspace.
    let plan = MatMulNBitsParams { m: 128, ..ok }.plan(132, false).unwrap();
    assert_eq!(
        (plan.variant, plan.kernel, plan.dims.grid, plan.splits),
        (Variant::Tiled, "matmul_nbits_tiled128x128_f16", (64, 1, 2), 2)
    );
    let permuted = 128 * 8192 * 2;
    assert_eq!(
        (plan.permute.unwrap().0, plan.workspace_bytes),
        ("matmul_nbits_permute_f16", permuted + 2 * 128 * 8192 * 4)
    );
    let plan = MatMulNBitsParams { m: 1024, ..ok }.plan(132, false).unwrap();
    assert_eq!((plan.kernel, plan.dims.grid), ("matmul_nbits_tiled128x128_f16", (64, 8, 1)));
    let plan = MatMulNBitsParams { m: 64, ..ok }.plan(132, false).unwrap();
    assert_eq!((plan.kernel, plan.splits), ("matmul_nbits_tiled64x128_f16", 2));
    assert_eq!(MatMulNBitsParams { m: 17, ..ok }.plan(132, false).unwrap().kernel, "matmul_nbits_tiled32x128_f16");
    assert_eq!(plan.workspace_bytes, 64 * 8192 * 2 + 2 * 64 * 8192 * 4);
    // Unaligned rows of B, fractional zero points and 16-wide blocks take `large`.
    let params = MatMulNBitsParams { m: 100, k: 1000, ..ok };
    let rows = RowAlignment { a_vec16: true, b_vec16: false };
    let fallback = params.plan_for(132, false, rows).unwrap();
    assert_eq!((fallback.variant, fallback.kernel, fallback.permute), (Variant::Large, "matmul_nbits_large_f16", None));
    let typed = MatMulNBitsParams { zero_points: ZeroPointKind::Typed, ..params };
    assert_eq!(typed.plan(132, false).unwrap().kernel, "matmul_nbits_large_zf_f16");
    assert_eq!(
        MatMulNBitsParams { block_size: 16, ..params }.plan(132, false).unwrap().kernel,
        "matmul_nbits_large_f16"
    );
    let err = |p: MatMulNBitsParams| p.plan(132, false).unwrap_err().to_string();
    let packed_wgmma = MatMulNBitsParams { m: 16, variant: Some(Variant::PackedWgmma), ..ok };
    assert!(err(packed_wgmma).contains("needs a Hopper GPU"));
    let e = MatMulNBitsParams { splits: 2, ..packed_wgmma }.plan(132, true).unwrap_err().to_string();
    assert!(e.contains("PackedWgmma does not split K (2 splits asked)"), "{e}");
    let e = MatMulNBitsParams { m: 8, ..packed_wgmma }.plan(132, true).unwrap_err().to_string();
    assert!(e.contains("PackedWgmma needs M > 8"), "{e}");
    let e = MatMulNBitsParams { m: 17, ..packed_wgmma }.plan(132, true).unwrap_err().to_string();
    assert!(e.contains("PackedWgmma needs M <= 16"), "{e}");
    let e =
        MatMulNBitsParams { block_size: 16, variant: Some(Variant::Packed), zero_points: ZeroPointKind::Typed, ..ok }
            .plan(132, true)
            .unwrap_err();
    assert!(e.to_string().contains("integer zero points, block_size >= 16"), "{e}");
    // Blocks of 32 and 64 take the fine records, on the `mma.sync` kernels only.
    let fine = MatMulNBitsParams { m: 16, n: 28672, block_size: 32, variant: Some(Variant::Packed), ..ok };
    let plan = fine.plan(132, true).unwrap();
    assert_eq!((plan.variant, plan.kernel), (Variant::PackedMma, "matmul_nbits_decode16_packed_fine_f16"));
    assert_eq!(plan.dims.shared_bytes, 4 * 4 * (2048 + 384));
    let e = MatMulNBitsParams { variant: Some(Variant::PackedWgmma), ..fine }.plan(132, true).unwrap_err();
    assert!(e.to_string().contains("PackedWgmma needs block_size >= 128, got 32"), "{e}");
    let plan = MatMulNBitsParams { m: 1, n: 4096, block_size: 64, ..fine }.plan(132, true).unwrap();
    assert_eq!(plan.kernel, "matmul_nbits_decode8_packed_wide_fine_f16");
    assert_eq!((plan.dims.block.0, plan.dims.shared_bytes), (256, 8 * 4 * (2048 + 384)));
    // Blocks of 16 take the fine16 records (80 bytes of constants per lane group), on the
    // `mma.sync` kernels only.
    let fine16 = MatMulNBitsParams { block_size: 16, ..fine };
    let plan = fine16.plan(132, true).unwrap();
    assert_eq!((plan.variant, plan.kernel), (Variant::PackedMma, "matmul_nbits_decode16_packed_fine16_f16"));
    assert_eq!(plan.dims.shared_bytes, 4 * 4 * (2048 + 640));
    let e = MatMulNBitsParams { variant: Some(Variant::PackedWgmma), ..fine16 }.plan(132, true).unwrap_err();
    assert!(e.to_string().contains("PackedWgmma needs block_size >= 128, got 16"), "{e}");
    let plan = MatMulNBitsParams { m: 1, n: 4096, ..fine16 }.plan(132, true).unwrap();
    assert_eq!(plan.kernel, "matmul_nbits_decode8_packed_wide_fine16_f16");
    assert_eq!((plan.dims.block.0, plan.dims.shared_bytes), (256, 8 * 4 * (2048 + 640)));
    assert!(err(MatMulNBitsParams { dtype: DType::F32, ..ok }).contains("not supported on the GPU"));
    assert!(err(MatMulNBitsParams { block_size: 24, ..ok }).contains("block_size 24"));
    assert!(err(MatMulNBitsParams { k: 0, ..ok }).contains("K = 0"));
    assert!(err(MatMulNBitsParams { variant: Some(Variant::Tiled), ..typed }).contains("integer zero points"));
    assert!(err(MatMulNBitsParams { m: 16 * 65536, variant: Some(Variant::Small), ..ok }).contains("row tiles"));
    // Hopper: `wgmma` for M > 32 (integer zero points, blocks >= 32, 16-byte rows of B),
    // split while its 128 x 128 tiles leave SMs idle; `tiled` up to 32 rows; refused where it
    // cannot run.
    let hopper = |p: MatMulNBitsParams| p.plan(132, true).unwrap();
    // Two splits run as clusters of the pair (no partial sums, no reduction); others through
    // the workspace.
    let plan = hopper(MatMulNBitsParams { m: 128, ..ok });
    assert_eq!(
        (plan.variant, plan.kernel, plan.dims.grid, plan.splits, plan.reduce),
        (Variant::Wgmma, "matmul_nbits_wgmma_pair_f16", (64, 1, 2), 2, None)
    );
    // It reads the permuted A, as `tiled`.
    assert_eq!(plan.permute.map(|(name, _)| name), Some("matmul_nbits_permute_f16"));
    assert_eq!((plan.workspace_bytes, plan.dims.block), (128 * 8192 * 2, (256, 1, 1)));
    let plan = hopper(MatMulNBitsParams { m: 128, splits: 3, ..ok });
    assert_eq!((plan.kernel, plan.splits), ("matmul_nbits_wgmma_f16", 3));
    assert_eq!(plan.reduce.map(|(name, _)| name), Some("matmul_nbits_reduce_f16"));
    assert_eq!(plan.workspace_bytes, 128 * 8192 * 2 + 3 * 128 * 8192 * 4);
    // From where its 256 x 128 tiles fill the SMs, the warp-specialized `prefill`, unsplit,
    // over the image of its stages.
    let plan = hopper(MatMulNBitsParams { m: 1024, ..ok });
    assert_eq!(
        (plan.variant, plan.kernel, plan.dims.grid, plan.dims.block, plan.splits),
        (Variant::Prefill, "matmul_nbits_prefill_f16", (64, 4, 1), (384, 1, 1), 1)
    );
    assert_eq!(plan.permute.map(|(name, _)| name), Some("matmul_nbits_permute_image_f16"));
    assert_eq!(plan.workspace_bytes, 1024 * 8192 * 2);
    // The image holds whole tiles of 256 rows.
    let plan = hopper(MatMulNBitsParams { m: 300, n: 8192 + 3 * 128, ..ok });
    assert_eq!((plan.kernel, plan.dims.grid), ("matmul_nbits_prefill_f16", (67, 2, 1)));
    assert_eq!(plan.workspace_bytes, 512 * 8192 * 2);
    assert_eq!(hopper(MatMulNBitsParams { m: 256, ..ok }).kernel, "matmul_nbits_wgmma_f16");
    let e = MatMulNBitsParams { m: 1024, splits: 2, variant: Some(Variant::Prefill), ..ok }.plan(132, true);
    assert!(e.unwrap_err().to_string().contains("does not split K"));
    assert!(err(MatMulNBitsParams { m: 1024, variant: Some(Variant::Prefill), ..ok }).contains("Hopper"));
    assert_eq!(hopper(MatMulNBitsParams { m: 16, ..ok }).kernel, "matmul_nbits_decode16_f16");
    assert_eq!(hopper(MatMulNBitsParams { m: 32, ..ok }).kernel, "matmul_nbits_tiled32x128_f16");
    assert_eq!(hopper(MatMulNBitsParams { m: 33, ..ok }).kernel, "matmul_nbits_wgmma_pair_f16");
    // Fractional zero points and blocks of 16 take the `_any` builds of `wgmma` (and of
    // `prefill`), `large` only where rows of B are not 16-byte aligned.
    let plan = hopper(typed);
    assert_eq!((plan.variant, plan.kernel), (Variant::Wgmma, "matmul_nbits_wgmma_pair_any_f16"));
    assert_eq!(hopper(MatMulNBitsParams { m: 17, ..typed }).kernel, "matmul_nbits_wgmma_pair_any_f16");
    // `prefill_any` reads its constants cooked once per call, after the image in the workspace: a
    // word and a byte per (row, block), each part a multiple of 256 bytes.
    let plan = hopper(MatMulNBitsParams { m: 1024, k: 8192, ..typed });
    assert_eq!(plan.kernel, "matmul_nbits_prefill_any_f16");
    let (cook, cook_dims) = plan.cook.unwrap();
    let blocks = typed.n * 8192 / 128;
    assert_eq!(
        (cook, cook_dims.grid, cook_dims.block),
        ("matmul_nbits_cook_consts_f16", (blocks as u32 / 256, 1, 1), (256, 1, 1))
    );
    assert_eq!(plan.workspace_bytes, 1024 * 8192 * 2 + 5 * blocks);
    assert!(hopper(MatMulNBitsParams { m: 1024, k: 8192, ..ok }).cook.is_none(), "the plain builds cook per chunk");
    assert!(hopper(typed).cook.is_none(), "so does `wgmma_any`");
    assert_eq!(hopper(MatMulNBitsParams { m: 128, n: 28672, ..typed }).kernel, "matmul_nbits_wgmma_streamk_any_f16");
    let block16 = MatMulNBitsParams { block_size: 16, k: 1024, ..params };
    assert_eq!(hopper(MatMulNBitsParams { splits: 3, ..block16 }).kernel, "matmul_nbits_wgmma_any_f16");
    let unaligned_b_rows = RowAlignment { a_vec16: true, b_vec16: false };
    assert_eq!(typed.plan_for(132, true, unaligned_b_rows).unwrap().kernel, "matmul_nbits_large_zf_f16");
    // The permutation takes any A: only B's rows must allow 16-byte copies.
    let unaligned_a = RowAlignment { a_vec16: false, b_vec16: true };
    assert_eq!(params.plan_for(132, true, unaligned_a).unwrap().kernel, "matmul_nbits_wgmma_pair_f16");
    let unaligned_b = RowAlignment { a_vec16: true, b_vec16: false };
    assert_eq!(params.plan_for(132, true, unaligned_b).unwrap().kernel, "matmul_nbits_large_f16");
    // Stream-K where whole tiles would leave over a tenth of the last wave idle: M = 128,
    // N = 28672 is 224 tiles on 132 SMs (85% of two waves).
    let wide = MatMulNBitsParams { m: 128, n: 28672, ..ok };
    let plan = hopper(wide);
    assert_eq!(
        (plan.variant, plan.kernel, plan.dims.grid, plan.splits, plan.reduce),
        (Variant::WgmmaStreamK, "matmul_nbits_wgmma_streamk_f16", (132, 1, 1), 1, None)
    );
    assert_eq!(plan.permute.map(|(name, _)| name), Some("matmul_nbits_permute_f16"));
    assert_eq!((plan.workspace_bytes, plan.dims.block), (128 * 8192 * 2 + 132 * (128 * 128 * 4 + 4), (256, 1, 1)));
    assert_eq!(hopper(MatMulNBitsParams { m: 1024, ..wide }).kernel, "matmul_nbits_prefill_f16");
    // Above M = 128 stream-K keeps the shapes whose 256-row tiles would not fill the SMs: 200 x
    // 12750 is 100 of them, and 200 tiles of 128 (76% of two waves).
    let plan = hopper(MatMulNBitsParams { m: 200, n: 12750, k: 320, block_size: 64, ..ok });
    assert_eq!(plan.kernel, "matmul_nbits_wgmma_streamk_f16");
    // Nearly full waves keep whole tiles: 1792 tiles are 97% of 14 waves.
    let forced_wgmma = MatMulNBitsParams { m: 1024, variant: Some(Variant::Wgmma), ..wide };
    assert_eq!(hopper(forced_wgmma).kernel, "matmul_nbits_wgmma_f16");
    // Forced `Wgmma` keeps whole tiles; forced stream-K takes a block per chunk when there are
    // fewer chunks than SMs, splits no further and needs Hopper.
    assert_eq!(hopper(MatMulNBitsParams { variant: Some(Variant::Wgmma), ..wide }).dims.grid, (224, 1, 1));
    let forced = MatMulNBitsParams { m: 64, n: 64, k: 256, variant: Some(Variant::WgmmaStreamK), ..ok };
    assert_eq!(hopper(forced).dims.grid, (2, 1, 1));
    let e = MatMulNBitsParams { splits: 3, ..forced }.plan(132, true).unwrap_err().to_string();
    assert!(e.contains("does not split K"), "{e}");
    assert!(err(forced).contains("variant WgmmaStreamK needs a Hopper GPU"), "{}", err(forced));
    assert!(err(MatMulNBitsParams { m: 128, variant: Some(Variant::Wgmma), ..ok }).contains("Hopper"));
    let forced16 = MatMulNBitsParams { m: 128, block_size: 16, variant: Some(Variant::Wgmma), ..ok };
    assert!(hopper(forced16).kernel.ends_with("_any_f16"));
    // Forced splits never exceed the K chunks.
    let one_chunk = MatMulNBitsParams { k: 100, splits: 9, ..ok }.plan(132, false).unwrap();
    assert_eq!((one_chunk.splits, one_chunk.reduce), (1, None));
    // Hopper: the K splits (up to 8) of `small` and the `decode` kernels run as clusters of the
    // splits, one launch, no workspace; elsewhere (and beyond 8 splits) the reduction.
    assert_eq!(MatMulNBitsParams { n: 1024, ..ok }.plan(132, false).unwrap().cluster, None);
    let few_columns = hopper(MatMulNBitsParams { n: 1024, ..ok });
    assert_eq!(
        (few_columns.kernel, few_columns.splits, few_columns.cluster, few_columns.reduce, few_columns.workspace_bytes),
        ("matmul_nbits_decode8_ahead3_f16", 5, Some((1, 1, 5)), None, 0)
    );
    let builder_o = MatMulNBitsParams { n: 4096, k: 4096, block_size: 32, variant: Some(Variant::Packed), ..ok };
    let plan = hopper(builder_o);
    assert_eq!(
        (plan.kernel, plan.dims.grid, plan.cluster, plan.reduce, plan.workspace_bytes),
        ("matmul_nbits_decode8_packed_wide_fine_f16", (128, 1, 2), Some((1, 1, 2)), None, 0)
    );
    let plan = hopper(MatMulNBitsParams { m: 16, splits: 8, ..builder_o });
    assert_eq!(
        (plan.kernel, plan.cluster, plan.reduce),
        ("matmul_nbits_decode16_packed_fine_f16", Some((1, 1, 8)), None)
    );
    let plan = hopper(MatMulNBitsParams { splits: 12, ..builder_o });
    assert_eq!(
        (plan.splits, plan.cluster, plan.reduce.map(|(name, _)| name)),
        (11, None, Some("matmul_nbits_reduce_f16"))
    );
    let plan = hopper(MatMulNBitsParams { n: 1024, block_size: 64, ..ok });
    assert_eq!(
        (plan.kernel, plan.splits, plan.cluster, plan.reduce, plan.workspace_bytes),
        ("matmul_nbits_small_f16", 5, Some((1, 1, 5)), None, 0)
    );
    let plan = MatMulNBitsParams { n: 1024, block_size: 64, ..ok }.plan(132, false).unwrap();
    assert_eq!((plan.kernel, plan.cluster, plan.reduce.is_some()), ("matmul_nbits_small_f16", None, true));
    assert_eq!(hopper(ok).cluster, None);
}

/// An f16 `dlkern.matmul_nbits` problem for the registry (asymmetric, so with packed zero
/// points, and a bias) with up to `max_m` rows of A, and its device copies.
struct RegistryProblem {
    k: usize,
    n: usize,
    block: usize,
    a: Vec<half::f16>,
    q: MatMulNBitsWeights,
    zp: Vec<u8>,
    scales: Vec<half::f16>,
    bias: Vec<half::f16>,
    attrs: Attributes,
}

/// A, B, scales, zero points, the absent g_idx, bias and Y as host tensors.
type MatMulNBitsHosts =
    (Host<half::f16>, Host<u8>, Host<half::f16>, Host<u8>, Host<i32>, Host<half::f16>, Host<half::f16>);

impl RegistryProblem {
    fn new(max_m: usize, k: usize, n: usize, block: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let w: Vec<f32> = (0..n * k).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let q = quantize(&w, n, k, block, false).unwrap();
        let ZeroPoints::Packed(zp) = q.zero_points.clone() else { panic!("asymmetric quantization packs zero points") };
        let halves = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x)).collect::<Vec<_>>();
        let a = halves(&(0..max_m * k).map(|_| rng.uniform(-1.0, 1.0) as f32).collect::<Vec<_>>());
        let bias = halves(&(0..n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect::<Vec<_>>());
        let scales = halves(&q.scales);
        RegistryProblem { k, n, block, a, q, zp, scales, bias, attrs: attrs(k, n, block) }
    }

    fn hosts(&self, m: usize) -> MatMulNBitsHosts {
        let (k, n, kb) = (self.k as i64, self.n as i64, self.q.k_blocks() as i64);
        (
            Host::new(self.a[..m * self.k].to_vec(), &[m as i64, k]),
            Host::new(self.q.b.clone(), &[n, kb, (self.block / 2) as i64]),
            Host::new(self.scales.clone(), &[n, kb]),
            Host::new(self.zp.clone(), &[n, (kb + 1) / 2]),
            Host::new(vec![], &[0]),
            Host::new(self.bias.clone(), &[n]),
            Host::new(vec![half::f16::ZERO; m * self.n], &[m as i64, n]),
        )
    }

    /// Y for the first `m` rows from the registry kernel's CPU path.
    fn on_cpu(&self, m: usize) -> Vec<half::f16> {
        let mut h = self.hosts(m);
        let mut cpu = [h.0.dl(), h.1.dl(), h.2.dl(), h.3.dl(), h.4.dl(), h.5.dl(), h.6.dl()];
        // SAFETY: host tensors alive for the call.
        unsafe { registry::call("dlkern.matmul_nbits", &mut cpu, 6, std::ptr::null_mut(), &self.attrs) }.unwrap();
        h.6.data
    }
}

/// A [`RegistryProblem`]'s tensors on the device.
struct OnCuda {
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    a: cudarc::driver::CudaSlice<half::f16>,
    b: cudarc::driver::CudaSlice<u8>,
    scales: cudarc::driver::CudaSlice<half::f16>,
    zp: cudarc::driver::CudaSlice<u8>,
    bias: cudarc::driver::CudaSlice<half::f16>,
    y: cudarc::driver::CudaSlice<half::f16>,
}

impl OnCuda {
    fn new(p: &RegistryProblem) -> Self {
        let (_device, stream) = common::gpu();
        OnCuda {
            a: stream.clone_htod(&p.a).unwrap(),
            b: stream.clone_htod(&p.q.b).unwrap(),
            scales: stream.clone_htod(&p.scales).unwrap(),
            zp: stream.clone_htod(&p.zp).unwrap(),
            bias: stream.clone_htod(&p.bias).unwrap(),
            y: stream.alloc_zeros(p.a.len() / p.k * p.n).unwrap(),
            stream,
        }
    }

    /// Y for the first `m` rows from the registry kernel on these buffers, at `site` or by a
    /// plain call.
    fn run(&mut self, p: &RegistryProblem, m: usize, site: Option<&registry::CallSite>) -> Vec<half::f16> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let mut h = p.hosts(m);
        let stream = self.stream.clone();
        {
            let (ap, _a) = self.a.device_ptr(&stream);
            let (bp, _b) = self.b.device_ptr(&stream);
            let (sp, _s) = self.scales.device_ptr(&stream);
            let (zpp, _z) = self.zp.device_ptr(&stream);
            let (biasp, _bias) = self.bias.device_ptr(&stream);
            let (yp, _y) = self.y.device_ptr_mut(&stream);
            let mut gpu = [
                on_cuda(h.0.dl(), ap),
                on_cuda(h.1.dl(), bp),
                on_cuda(h.2.dl(), sp),
                on_cuda(h.3.dl(), zpp),
                on_cuda(h.4.dl(), ap), // the absent g_idx: a 0-element tensor (never read)
                on_cuda(h.5.dl(), biasp),
                on_cuda(h.6.dl(), yp),
            ];
            let raw_stream = stream.cu_stream() as *mut std::ffi::c_void;
            // SAFETY: device buffers of the shapes described, alive until the stream is
            // synchronized; a site's constant inputs are these same buffers on every call (a
            // test that overwrites B breaks that on purpose).
            unsafe {
                match site {
                    Some(site) => registry::call_at("dlkern.matmul_nbits", &mut gpu, 6, raw_stream, &p.attrs, site),
                    None => registry::call("dlkern.matmul_nbits", &mut gpu, 6, raw_stream, &p.attrs),
                }
            }
            .unwrap();
            stream.synchronize().unwrap();
        }
        stream.clone_dtoh(&self.y).unwrap()[..m * p.n].to_vec()
    }
}

impl RegistryProblem {
    /// Whether the first `got.len() / n` rows of two f16 outputs agree within what rounding the
    /// weights to f16 once can do (2 roundoffs of sum |a| |w|, as the kernel tests allow: the
    /// `tiled` kernels dequantize to f16) plus a roundoff of each output; the worst case goes
    /// to stderr when they do not.
    fn close(&self, got: &[half::f16], want: &[half::f16]) -> bool {
        let (k, u) = (self.k, 2f64.powi(-11));
        let deq = self.q.dequantize();
        let excess = |i: usize| {
            let (row, col) = (i / self.n, i % self.n);
            let mass: f64 = (0..k).map(|j| (self.a[row * k + j].to_f64() * deq[col * k + j]).abs()).sum();
            let (g, w) = (got[i].to_f64(), want[i].to_f64());
            (g - w).abs() / (2.0 * u * (mass + w.abs()) + 1e-6)
        };
        let worst = (0..got.len().min(want.len())).map(|i| (i, excess(i))).max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((i, e)) = worst.filter(|&(_, e)| e > 1.0) {
            eprintln!("y[{i}] = {} against {}: {e:.2}x the tolerance", got[i], want[i]);
        }
        got.len() == want.len() && worst.is_none_or(|(_, e)| e <= 1.0)
    }
}

/// The registry kernel on CUDA tensors (what ONNX Runtime's CUDA EP and C callers reach) agrees
/// with its CPU path on the same inputs.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_registry_kernel_runs_on_cuda_tensors() {
    let p = RegistryProblem::new(5, 200, 48, 32, 21);
    assert!(p.close(&OnCuda::new(&p).run(&p, 5, None), &p.on_cpu(5)));
}

/// At a call site that marks B, the scales and the zero points constant (what the ORT adapter
/// does for a node's initializers), the GPU path repacks them once for `Variant::Packed`, keeps
/// the copy in the site and reads it on later calls (proved by overwriting B afterwards, which
/// a plain call then sees), only where `decode` would run, and frees it with the site.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_registry_kernel_repacks_constant_weights_at_a_call_site() {
    // Blocks of 128 (2176-byte records), the builder's 32 (the fine records, 2432 bytes) and
    // 16 (the fine16 records, 2688 bytes).
    for (block, record_bytes) in [(128, 2176), (32, 2432), (16, 2688)] {
        repacks_at_a_call_site(block, record_bytes);
    }
}

fn repacks_at_a_call_site(block: usize, record_bytes: usize) {
    use registry::CallSite;
    // K ending inside a chunk and a block; for blocks of 16 one whose rows hold whole 16-byte
    // pieces, which the repacked path needs (1096 would make rows of 69 blocks, 552 bytes).
    let (k, n) = (if block == 16 { 1080 } else { 1096 }, 100);
    let p = RegistryProblem::new(17, k, n, block, 23);
    let mut gpu = OnCuda::new(&p);
    let (want5, want17) = (p.on_cpu(5), p.on_cpu(17));
    let packed_bytes = n.div_ceil(32) * k.div_ceil(128) * record_bytes;
    let held = dlkern::runtime::device_bytes_held();

    let site = CallSite::new(0b1110); // B, scales, zero points
    assert!(p.close(&gpu.run(&p, 5, Some(&site)), &want5), "block {block}: first call at the site");
    assert!(site.cache().is_some(), "block {block}: M = 5 runs `Packed`: the site keeps a repacked B");
    assert_eq!(dlkern::runtime::device_bytes_held() - held, packed_bytes as u64, "block {block}");
    let fresh = CallSite::new(0b1110);
    assert!(p.close(&gpu.run(&p, 17, Some(&fresh)), &want17), "block {block}: M = 17");
    assert!(fresh.cache().is_none(), "block {block}: M = 17 does not run `Packed`: nothing to repack");
    assert!(p.close(&gpu.run(&p, 17, Some(&site)), &want17), "block {block}: M = 17 where a copy is kept");
    let not_constant = CallSite::new(0b0110);
    assert!(p.close(&gpu.run(&p, 5, Some(&not_constant)), &want5), "block {block}");
    assert!(not_constant.cache().is_none(), "block {block}: B not constant: nothing kept");

    gpu.stream.clone().memset_zeros(&mut gpu.b).unwrap();
    assert!(p.close(&gpu.run(&p, 5, Some(&site)), &want5), "block {block}: the site reads its copy, not B");
    assert!(!p.close(&gpu.run(&p, 5, None), &want5), "block {block}: a plain call reads the overwritten B");
    drop(site);
    assert_eq!(dlkern::runtime::device_bytes_held(), held, "block {block}: the copy goes with its site");
}

/// A CPU tensor among CUDA ones is refused by validation, before any device is touched (so this
/// runs without a GPU: the CUDA "pointers" are never dereferenced).
#[test]
fn registry_kernel_refuses_mixed_devices() {
    let (k, n, block) = (64, 8, 32);
    let q = quantize(&vec![0.5; n * k], n, k, block, true).unwrap();
    let mut ta = Host::new(vec![1.0f32; 2 * k], &[2, k as i64]);
    let mut tb = Host::new(q.b.clone(), &[n as i64, 2, 16]);
    let mut ts = Host::new(q.scales.clone(), &[n as i64, 2]);
    let mut ty = Host::new(vec![0.0f32; 2 * n], &[2, n as i64]);
    let fake = 0x1000;
    let mut tensors = [on_cuda(ta.dl(), fake), on_cuda(tb.dl(), fake), ts.dl(), on_cuda(ty.dl(), fake)];
    // SAFETY: validation fails before any pointer is used.
    let err =
        unsafe { registry::call("dlkern.matmul_nbits", &mut tensors, 3, std::ptr::null_mut(), &attrs(k, n, block)) }
            .unwrap_err()
            .to_string();
    assert!(err.contains("'scales'") && err.contains("is on Cpu, expected Cuda(0)"), "{err}");
}
