//! Helpers shared by the integration tests: a seeded RNG, the GPU handle for ignored tests,
//! tolerances, and locating `ptxas`.
#![allow(dead_code)]

use std::sync::Arc;

use cudarc::driver::CudaStream;
use dlkern::runtime::Device;
use dlkern::{DType, Element};

/// SplitMix64: small, seeded, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn vec<T: Element>(&mut self, n: usize, lo: f64, hi: f64) -> Vec<T> {
        (0..n).map(|_| T::from_f64(self.uniform(lo, hi))).collect()
    }
    pub fn vec_i8(&mut self, n: usize) -> Vec<i8> {
        (0..n).map(|_| self.next_u64() as i8).collect()
    }
}

/// The GPU every ignored test runs on, with a fresh stream. Panics (failing the test) when no
/// GPU is usable: these tests only run with `--include-ignored` on the GPU host.
pub fn gpu() -> (Arc<Device>, Arc<CudaStream>) {
    let device = Device::get(0).unwrap_or_else(|e| panic!("GPU test needs a CUDA device: {e}"));
    let stream = device.context().new_stream().expect("create stream");
    (device, stream)
}

/// Unit roundoff of the storage type: half the distance between 1 and the next value.
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => f32::EPSILON as f64 / 2.0,
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        other => panic!("no roundoff for {other}"),
    }
}

/// Largest error of rounding to `dtype` among its subnormals (half their spacing): where a
/// relative bound from [`unit_roundoff`] is smaller than this, it is too strict.
pub fn subnormal_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2f64.powi(-150),
        DType::F16 => 2f64.powi(-25),
        DType::BF16 => 2f64.powi(-134),
        other => panic!("no roundoff for {other}"),
    }
}

/// Asserts `got` (as stored) matches the f64 reference within `ulps` units of roundoff of the
/// storage type, relative to each value, plus `abs` absolute. Reports the worst element.
pub fn assert_close<T: Element>(what: &str, got: &[T], reference: &[f64], ulps: f64, abs: f64) {
    assert_eq!(got.len(), reference.len(), "{what}: length");
    let u = unit_roundoff(T::DTYPE);
    let mut worst = (0usize, 0.0f64);
    for (i, (g, r)) in got.iter().zip(reference).enumerate() {
        let g = g.to_f64();
        assert!(g.is_finite(), "{what}: element {i} is {g} (reference {r}); unwritten or overflow");
        let excess = (g - r).abs() / (ulps * u * r.abs() + abs);
        if excess > worst.1 {
            worst = (i, excess);
        }
    }
    let (i, excess) = worst;
    assert!(
        excess <= 1.0,
        "{what}: element {i} = {} vs reference {} exceeds {ulps} ulps + {abs} ({excess:.2}x the bound)",
        got[i].to_f64(),
        reference[i]
    );
}

/// `ptxas` from `$DLKERN_PTXAS`, `PATH`, or the PyPI package `nvidia-cuda-nvcc`.
pub fn find_ptxas() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("DLKERN_PTXAS") {
        return Some(p.into());
    }
    if let Ok(out) = std::process::Command::new("ptxas").arg("--version").output()
        && out.status.success()
    {
        return Some("ptxas".into());
    }
    let script = "import nvidia, os, glob; \
        print('\\n'.join(p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, '*', 'bin', 'ptxas'))))";
    let out = std::process::Command::new("python3").args(["-c", script]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().next().map(Into::into)
}

/// `t`'s shape and type at device address `address` on CUDA device 0 (what the registry's CUDA
/// paths receive from ONNX Runtime or a C caller).
pub fn on_cuda(t: dlkern::dlpack::DLTensor, address: u64) -> dlkern::dlpack::DLTensor {
    use dlkern::dlpack::{DLDevice, DLDeviceType, DLTensor};
    DLTensor {
        data: address as *mut std::ffi::c_void,
        device: DLDevice { device_type: DLDeviceType::CUDA, device_id: 0 },
        ..t
    }
}

/// A CPU tensor owning its data, shape and (optional, in elements) strides, lent to the
/// registry as a DLTensor.
pub struct Host<T> {
    pub data: Vec<T>,
    pub shape: Vec<i64>,
    pub strides: Option<Vec<i64>>,
}

impl<T: dlkern::dtype::Scalar> Host<T> {
    pub fn new(data: Vec<T>, shape: &[i64]) -> Self {
        Host { data, shape: shape.to_vec(), strides: None }
    }
    /// A DLTensor over the data (valid while `self` is neither moved nor resized).
    pub fn dl(&mut self) -> dlkern::dlpack::DLTensor {
        use dlkern::dlpack::{DLDevice, DLDeviceType, DLTensor, dtype_to_dl};
        DLTensor {
            data: self.data.as_mut_ptr().cast(),
            device: DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
            ndim: self.shape.len() as i32,
            dtype: dtype_to_dl(T::DTYPE),
            shape: self.shape.as_mut_ptr(),
            strides: self.strides.as_mut().map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: 0,
        }
    }
}
