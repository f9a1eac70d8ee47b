//! W4A16 weights in MatMulNBits format: the quantizer's error bounds and packing, and the
//! registry's CPU kernel against the f64 reference (K not a multiple of the block, packed and
//! unpacked zero points, bias). ORT's own MatMulNBits is compared in tests/python.

mod common;

use common::Rng;
use dlkern::dlpack::{DLDevice, DLDeviceType, DLTensor, dtype_to_dl};
use dlkern::dtype::Scalar;
use dlkern::quant::w4::{W4Weights, ZeroPoints, matmul_reference, quantize};
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
    let q = W4Weights {
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

struct Host<T> {
    data: Vec<T>,
    shape: Vec<i64>,
}

impl<T: Scalar> Host<T> {
    fn new(data: Vec<T>, shape: &[i64]) -> Self {
        Host { data, shape: shape.to_vec() }
    }
    fn dl(&mut self) -> DLTensor {
        DLTensor {
            data: self.data.as_mut_ptr().cast(),
            device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
            ndim: self.shape.len() as i32,
            dtype: dtype_to_dl(T::DTYPE),
            shape: self.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }
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
