//! Launchers for the device self-test kernels (`kernels-gpu/src/probe.rs`).
//!
//! Each probe runs one device-module primitive (`cp.async` + `ldmatrix` + `mma.sync`, or the
//! fast-math instructions) on host-provided data, so the test suite can pin down fragment
//! layouts and accuracy on a real GPU against [`crate::reference`] before larger kernels rely
//! on them.

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};

use super::{check_same_device, check_slice};
use crate::error::{Error, Result};
use crate::runtime::{Device, KernelParams, LaunchDims};

const KERNEL: &str = "probe";

/// Which tensor-core probe to run; tiles are independent 16x8 products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaProbe {
    /// `m16n8k16` f16: A `[16][16]` row-major, B `[8][16]` (n-major), C `[16][8]` f32.
    F16,
    /// `m16n8k16` bf16, layouts as [`MmaProbe::F16`].
    Bf16,
    /// `m16n8k16` f16 with B `[16][8]` (k-major) loaded by `ldmatrix.trans`.
    F16KMajorB,
    /// `m16n8k32` s8: A `[16][32]`, B `[8][32]` (n-major), C `[16][8]` i32.
    S8,
}

impl MmaProbe {
    fn kernel(self) -> &'static str {
        match self {
            MmaProbe::F16 => "probe_mma_m16n8k16_f16",
            MmaProbe::Bf16 => "probe_mma_m16n8k16_bf16",
            MmaProbe::F16KMajorB => "probe_mma_m16n8k16_f16_ktrans",
            MmaProbe::S8 => "probe_mma_m16n8k32_s8",
        }
    }

    /// Elements of A, B (input element type) and C per tile.
    pub fn tile_elements(self) -> (usize, usize, usize) {
        match self {
            MmaProbe::S8 => (16 * 32, 8 * 32, 16 * 8),
            _ => (16 * 16, 16 * 8, 16 * 8),
        }
    }

    fn input_bytes(self) -> usize {
        if self == MmaProbe::S8 { 1 } else { 2 }
    }
}

/// Runs `probe` on `tiles` tiles. `A`/`B` are the input element types (2 bytes for the 16-bit
/// probes, 1 for s8), `C` is f32 or i32 (4 bytes).
pub fn mma<A: DeviceRepr, B: DeviceRepr, C: DeviceRepr>(
    device: &Device,
    stream: &CudaStream,
    probe: MmaProbe,
    a: &CudaSlice<A>,
    b: &CudaSlice<B>,
    c: &mut CudaSlice<C>,
    tiles: usize,
) -> Result<()> {
    if size_of::<A>() != probe.input_bytes() || size_of::<B>() != probe.input_bytes() || size_of::<C>() != 4 {
        return Err(Error::invalid(
            KERNEL,
            format!("{probe:?} needs {}-byte inputs and 4-byte outputs", probe.input_bytes()),
        ));
    }
    if tiles == 0 || tiles > i32::MAX as usize {
        return Err(Error::invalid(KERNEL, format!("tiles = {tiles} out of range")));
    }
    let (a_elems, b_elems, c_elems) = probe.tile_elements();
    check_same_device(KERNEL, device, stream)?;
    check_slice(KERNEL, "a", device, a, a_elems * tiles)?;
    check_slice(KERNEL, "b", device, b, b_elems * tiles)?;
    check_slice(KERNEL, "c", device, c, c_elems * tiles)?;
    let (a_ptr, _a_sync) = a.device_ptr(stream);
    let (b_ptr, _b_sync) = b.device_ptr(stream);
    let (c_ptr, _c_sync) = c.device_ptr_mut(stream);
    // cudarc allocations are 256-byte aligned, as the probes' 16-byte copies need.
    let args = KernelParams::new().pointers(&[a_ptr, b_ptr, c_ptr]);
    let dims = LaunchDims { grid: (tiles as u32, 1, 1), block: (32, 1, 1), shared_bytes: 0 };
    // SAFETY: three pointer parameters as the kernel declares, sized by check_slice.
    unsafe { device.launch(probe.kernel(), dims, stream.cu_stream(), args) }
}

/// Runs `ex2.approx`, `rcp.approx` and `rsqrt.approx` on every element of `x`.
pub fn fast_math(
    device: &Device,
    stream: &CudaStream,
    x: &CudaSlice<f32>,
    exp2: &mut CudaSlice<f32>,
    recip: &mut CudaSlice<f32>,
    rsqrt: &mut CudaSlice<f32>,
) -> Result<()> {
    let n = x.len();
    if n == 0 {
        return Ok(());
    }
    if n > u32::MAX as usize {
        return Err(Error::invalid(KERNEL, "more than u32::MAX elements"));
    }
    check_same_device(KERNEL, device, stream)?;
    for (name, out) in [("exp2", &*exp2), ("recip", &*recip), ("rsqrt", &*rsqrt)] {
        check_slice(KERNEL, name, device, out, n)?;
    }
    let (x_ptr, _x) = x.device_ptr(stream);
    let (e_ptr, _e) = exp2.device_ptr_mut(stream);
    let (r_ptr, _r) = recip.device_ptr_mut(stream);
    let (s_ptr, _s) = rsqrt.device_ptr_mut(stream);
    let args = KernelParams::new().pointers(&[x_ptr, e_ptr, r_ptr, s_ptr]).value(n as u32);
    let dims = LaunchDims { grid: ((n as u32).div_ceil(256), 1, 1), block: (256, 1, 1), shared_bytes: 0 };
    // SAFETY: parameters as the kernel declares, every array holds n elements.
    unsafe { device.launch("probe_fast_math_f32", dims, stream.cu_stream(), args) }
}
