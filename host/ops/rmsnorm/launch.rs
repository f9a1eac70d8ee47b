//! RMSNorm launcher: `y = x / sqrt(mean(x^2, last axis) + eps) * weight`.
//!
//! Kernels `rmsnorm_{vec,scalar}_{f32,f16,bf16}` (device code: `kernels-gpu/src/rmsnorm/`).
//! One block per row; the `vec` variant moves 16 bytes per access and is chosen whenever the
//! pointers, strides and row length allow it.

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ops::common::checks::{check_pointer, check_same_device, check_slice, overlaps, span_bytes};
use crate::runtime::{Device, KernelParams, LaunchDims};

const KERNEL: &str = "rmsnorm";
use super::layout;
use layout::{Entry, MAX_THREADS, SHARED_BYTES, VEC_BYTES};

/// Shape and layout of one RMSNorm call. `x` and `y` are `[rows, cols]` with the given row
/// strides (elements; the last axis is contiguous), `weight` is `[cols]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormParams {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub x_row_stride: usize,
    pub y_row_stride: usize,
    pub eps: f32,
}

/// What a validated call will launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmsNormPlan {
    /// Kernel symbol, e.g. `rmsnorm_vec_f16`.
    pub kernel: &'static str,
    pub dims: LaunchDims,
}

impl RmsNormParams {
    /// Contiguous `[rows, cols]` tensors.
    pub fn contiguous(dtype: DType, rows: usize, cols: usize, eps: f32) -> Self {
        RmsNormParams { dtype, rows, cols, x_row_stride: cols, y_row_stride: cols, eps }
    }

    /// Validates the call for these device addresses and picks the kernel variant and launch
    /// dimensions. `None` means there is nothing to do (zero rows).
    pub fn plan(&self, x: u64, weight: u64, y: u64) -> Result<Option<RmsNormPlan>> {
        let p = self;
        let kernel = KERNEL;
        let size = p.dtype.size_bytes();
        let variant = |vec: bool| -> Result<&'static str> {
            let dtype = layout::Dtype::from_name(p.dtype.name());
            let entry = dtype.and_then(|t| layout::entry(if vec { Entry::Vec(t) } else { Entry::Scalar(t) }));
            entry.ok_or_else(|| Error::invalid(kernel, format!("dtype {} not supported (f32, f16, bf16)", p.dtype)))
        };
        variant(false)?;
        if p.cols == 0 {
            return Err(Error::invalid(kernel, "rows have 0 elements (cols must be >= 1)"));
        }
        if p.cols > u32::MAX as usize {
            return Err(Error::invalid(kernel, format!("cols = {} exceeds {}", p.cols, u32::MAX)));
        }
        if !(p.eps.is_finite() && p.eps >= 0.0) {
            return Err(Error::invalid(kernel, format!("eps = {} must be finite and >= 0", p.eps)));
        }
        if p.rows > i32::MAX as usize {
            return Err(Error::invalid(kernel, format!("rows = {} exceeds the grid limit {}", p.rows, i32::MAX)));
        }
        for (name, stride) in [("x", p.x_row_stride), ("y", p.y_row_stride)] {
            if p.rows > 1 && stride < p.cols {
                return Err(Error::invalid(
                    kernel,
                    format!("{name} row stride {stride} is smaller than the row length {}: rows would overlap", p.cols),
                ));
            }
        }
        if p.rows == 0 {
            return Ok(None);
        }
        for (name, ptr) in [("x", x), ("weight", weight), ("y", y)] {
            check_pointer(kernel, name, ptr, size as u64)?;
        }
        let too_big = || Error::invalid(kernel, "tensor size overflows the address space");
        let x_len = span_bytes(p.rows, p.cols, p.x_row_stride, size).ok_or_else(too_big)?;
        let y_len = span_bytes(p.rows, p.cols, p.y_row_stride, size).ok_or_else(too_big)?;
        let w_len = (p.cols * size) as u64;
        let in_place = x == y && p.x_row_stride == p.y_row_stride;
        if !in_place && overlaps(x, x_len, y, y_len) {
            return Err(Error::invalid(kernel, "y overlaps x without being exactly x (in place)"));
        }
        if overlaps(weight, w_len, y, y_len) {
            return Err(Error::invalid(kernel, "y overlaps weight"));
        }
        let vec_aligned = |v: u64| v.is_multiple_of(VEC_BYTES as u64);
        let vec = [x, y, weight].into_iter().all(vec_aligned)
            && [p.cols, p.x_row_stride, p.y_row_stride].into_iter().all(|n| vec_aligned((n * size) as u64));
        let per_thread_units = if vec { p.cols / (VEC_BYTES / size) } else { p.cols };
        let threads = (per_thread_units.div_ceil(32) * 32).clamp(32, MAX_THREADS as usize) as u32;
        Ok(Some(RmsNormPlan {
            kernel: variant(vec)?,
            dims: LaunchDims { grid: (p.rows as u32, 1, 1), block: (threads, 1, 1), shared_bytes: SHARED_BYTES },
        }))
    }
}

/// RMSNorm on raw device pointers, on `stream`.
///
/// Everything checkable is validated first (see [`RmsNormParams::plan`]): null or misaligned
/// pointers, overlapping outputs, bad shapes and eps are errors, not launches.
///
/// # Safety
/// `x`, `weight` and `y` must be device addresses in `device`'s context valid for the extents
/// the parameters describe (reads of `x` and `weight`, writes of `y`) until the kernel has run
/// on `stream`, and `stream` must belong to `device`'s primary context.
pub unsafe fn rmsnorm_raw(
    device: &Device,
    stream: CUstream,
    params: &RmsNormParams,
    x: u64,
    weight: u64,
    y: u64,
) -> Result<()> {
    let Some(plan) = params.plan(x, weight, y)? else { return Ok(()) };
    let args = KernelParams::new()
        .pointers(&[x, weight, y])
        .value(params.cols as u32)
        .value(params.x_row_stride as u64)
        .value(params.y_row_stride as u64)
        .value(params.eps);
    // SAFETY: the arguments match the kernel signature (u64 x3, u32, u64 x2, f32); pointer
    // validity is the caller's contract; the plan checked alignment and overlap.
    unsafe { device.launch(plan.kernel, plan.dims, stream, args) }
}

/// RMSNorm over contiguous `[rows, cols]` slices on `stream` (safe: the slice lengths bound
/// every access).
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm<T: Element>(
    device: &Device,
    stream: &CudaStream,
    x: &CudaSlice<T>,
    weight: &CudaSlice<T>,
    y: &mut CudaSlice<T>,
    rows: usize,
    cols: usize,
    eps: f32,
) -> Result<()> {
    let elements = rows.checked_mul(cols).ok_or_else(|| Error::invalid(KERNEL, "rows * cols overflows"))?;
    check_same_device(KERNEL, device, stream)?;
    check_slice(KERNEL, "x", device, x, elements)?;
    check_slice(KERNEL, "weight", device, weight, cols)?;
    check_slice(KERNEL, "y", device, y, elements)?;
    let params = RmsNormParams::contiguous(T::DTYPE, rows, cols, eps);
    let (x_ptr, _x_sync) = x.device_ptr(stream);
    let (w_ptr, _w_sync) = weight.device_ptr(stream);
    let (y_ptr, _y_sync) = y.device_ptr_mut(stream);
    // SAFETY: the slices are live allocations of at least the needed length on this device,
    // and the sync guards order the launch with other streams' use of them.
    unsafe { rmsnorm_raw(device, stream.cu_stream(), &params, x_ptr, w_ptr, y_ptr) }
}
