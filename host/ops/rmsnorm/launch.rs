//! RMSNorm launcher: `y = x / sqrt(mean(x^2, last axis) + eps) * weight`.
//!
//! Kernels `rmsnorm_{vec,scalar}_{f32,f16,bf16}` (device code: `kernels-gpu/src/rmsnorm/`).
//! One block per row; the `vec` variant moves 16 bytes per access and is chosen whenever the
//! pointers, strides and row length allow it.

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ops::common::WeightsWritten;
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

// ---------------------------------------------------------------------------------------------
// Fused residual RMSNorm: `rmsnorm_skip_*`

/// Shape and layout of one fused residual RMSNorm call (`SkipSimplifiedLayerNormalization`,
/// and `SimplifiedLayerNormalization` without a skip). `x`, `y` and `sum` are `[rows, cols]`,
/// `skip` is `[skip_rows, cols]` (row `r` adds skip row `r % skip_rows`), `gamma` is
/// `[scale_len]` (`scale_len` divides `cols`: element `c` is scaled by `gamma[c % scale_len]`),
/// `bias` is `[cols]`, `mean` and `inv_std_var` are `[rows]` f32. Row strides are in elements;
/// rows are contiguous.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SkipRmsNormParams {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub scale_len: usize,
    /// Ignored when the call has no skip.
    pub skip_rows: usize,
    pub x_row_stride: usize,
    pub skip_row_stride: usize,
    pub y_row_stride: usize,
    pub sum_row_stride: usize,
    pub eps: f32,
}

/// Device (or, for the CPU path's checks, host) addresses of one call; 0 means absent, which
/// only the optional ones (`skip`, `bias`, `sum`, `mean`, `inv_std_var`) may be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SkipRmsNormPointers {
    pub x: u64,
    pub skip: u64,
    pub gamma: u64,
    pub bias: u64,
    pub y: u64,
    pub sum: u64,
    pub mean: u64,
    pub inv_std_var: u64,
}

/// What a validated fused call will launch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SkipRmsNormPlan {
    /// Kernel symbol, e.g. `rmsnorm_skip_vec_f16`.
    pub kernel: &'static str,
    pub dims: LaunchDims,
    pub args: layout::SkipArgs,
}

impl SkipRmsNormParams {
    /// Contiguous tensors: `[rows, cols]` x, y, sum; `[skip_rows, cols]` skip; `[cols]` gamma.
    pub fn contiguous(dtype: DType, rows: usize, cols: usize, skip_rows: usize, eps: f32) -> Self {
        SkipRmsNormParams {
            dtype,
            rows,
            cols,
            scale_len: cols,
            skip_rows,
            x_row_stride: cols,
            skip_row_stride: cols,
            y_row_stride: cols,
            sum_row_stride: cols,
            eps,
        }
    }

    /// Validates the call for these addresses and picks the kernel variant and launch
    /// dimensions. `None` means there is nothing to do (zero rows).
    pub fn plan(&self, ptrs: &SkipRmsNormPointers) -> Result<Option<SkipRmsNormPlan>> {
        let p = self;
        let kernel = KERNEL;
        let size = p.dtype.size_bytes();
        let variant = |vec: bool| -> Result<&'static str> {
            let dtype = layout::Dtype::from_name(p.dtype.name());
            let entry = dtype.and_then(|t| layout::entry(if vec { Entry::SkipVec(t) } else { Entry::SkipScalar(t) }));
            entry.ok_or_else(|| Error::invalid(kernel, format!("dtype {} not supported (f32, f16, bf16)", p.dtype)))
        };
        variant(false)?;
        let has = |ptr: u64| ptr != 0;
        let skip = has(ptrs.skip);
        if p.cols == 0 {
            return Err(Error::invalid(kernel, "rows have 0 elements (cols must be >= 1)"));
        }
        if p.cols > u32::MAX as usize {
            return Err(Error::invalid(kernel, format!("cols = {} exceeds {}", p.cols, u32::MAX)));
        }
        if p.scale_len == 0 || !p.cols.is_multiple_of(p.scale_len) {
            return Err(Error::invalid(
                kernel,
                format!("gamma has {} elements, which does not divide the row length {}", p.scale_len, p.cols),
            ));
        }
        if !(p.eps.is_finite() && p.eps >= 0.0) {
            return Err(Error::invalid(kernel, format!("eps = {} must be finite and >= 0", p.eps)));
        }
        if p.rows > i32::MAX as usize {
            return Err(Error::invalid(kernel, format!("rows = {} exceeds the grid limit {}", p.rows, i32::MAX)));
        }
        if skip && (p.skip_rows == 0 || p.skip_rows > u32::MAX as usize) {
            return Err(Error::invalid(kernel, format!("skip_rows = {} must be in 1..={}", p.skip_rows, u32::MAX)));
        }
        let skip_rows = if skip { p.skip_rows } else { 1 };
        let strided = [
            ("x", p.rows, p.x_row_stride, true),
            ("skip", skip_rows, p.skip_row_stride, skip),
            ("y", p.rows, p.y_row_stride, true),
            ("sum", p.rows, p.sum_row_stride, has(ptrs.sum)),
        ];
        for &(name, rows, stride, present) in &strided {
            if present && rows > 1 && stride < p.cols {
                return Err(Error::invalid(
                    kernel,
                    format!("{name} row stride {stride} is smaller than the row length {}: rows would overlap", p.cols),
                ));
            }
        }
        if p.rows == 0 {
            return Ok(None);
        }
        for (name, ptr) in [("x", ptrs.x), ("gamma", ptrs.gamma), ("y", ptrs.y)] {
            check_pointer(kernel, name, ptr, size as u64)?;
        }
        for (name, ptr, align) in [
            ("skip", ptrs.skip, size),
            ("bias", ptrs.bias, size),
            ("sum", ptrs.sum, size),
            ("mean", ptrs.mean, 4),
            ("inv_std_var", ptrs.inv_std_var, 4),
        ] {
            if has(ptr) {
                check_pointer(kernel, name, ptr, align as u64)?;
            }
        }
        let too_big = || Error::invalid(kernel, "tensor size overflows the address space");
        let span = |rows: usize, stride: usize| span_bytes(rows, p.cols, stride, size).ok_or_else(too_big);
        let stats_len = (p.rows as u64).checked_mul(4).ok_or_else(too_big)?;
        // (name, address, bytes); absent tensors span nothing and overlap nothing.
        let region = |name: &'static str, ptr: u64, len: u64| (name, ptr, if has(ptr) { len } else { 0 });
        let x = region("x", ptrs.x, span(p.rows, p.x_row_stride)?);
        let sk = region("skip", ptrs.skip, span(skip_rows, p.skip_row_stride)?);
        let gamma = region("gamma", ptrs.gamma, (p.scale_len * size) as u64);
        let bias = region("bias", ptrs.bias, (p.cols * size) as u64);
        let y = region("y", ptrs.y, span(p.rows, p.y_row_stride)?);
        let sum = region("sum", ptrs.sum, span(p.rows, p.sum_row_stride)?);
        let mean = region("mean", ptrs.mean, stats_len);
        let inv = region("inv_std_var", ptrs.inv_std_var, stats_len);
        // An output may be exactly x, or exactly a skip that is not broadcast (each element is
        // read before the same thread writes over it); every other overlap is refused.
        let exact = |out: (&str, u64, u64), stride: usize| {
            (out.1 == x.1 && stride == p.x_row_stride)
                || (skip && out.1 == sk.1 && stride == p.skip_row_stride && skip_rows >= p.rows)
        };
        let overlap = |a: (&str, u64, u64), b: (&str, u64, u64)| overlaps(a.1, a.2, b.1, b.2);
        for (out, stride) in [(y, p.y_row_stride), (sum, p.sum_row_stride)] {
            for input in [x, sk] {
                if overlap(out, input) && !exact(out, stride) {
                    return Err(Error::invalid(
                        kernel,
                        format!("{} overlaps {} without being exactly it (in place)", out.0, input.0),
                    ));
                }
            }
        }
        let outputs = [y, sum, mean, inv];
        for (i, &out) in outputs.iter().enumerate() {
            for &other in outputs[i + 1..].iter().chain(&[gamma, bias]) {
                if overlap(out, other) {
                    return Err(Error::invalid(kernel, format!("{} overlaps {}", out.0, other.0)));
                }
            }
        }
        for stat in [mean, inv] {
            for input in [x, sk] {
                if overlap(stat, input) {
                    return Err(Error::invalid(kernel, format!("{} overlaps {}", stat.0, input.0)));
                }
            }
        }
        let per_vec = VEC_BYTES / size;
        let vec_aligned = |v: u64| v.is_multiple_of(VEC_BYTES as u64);
        let strides_ok = strided.iter().all(|&(_, _, stride, present)| !present || stride.is_multiple_of(per_vec));
        let vec = [x, sk, gamma, bias, y, sum].iter().all(|r| r.2 == 0 || vec_aligned(r.1))
            && p.cols.is_multiple_of(per_vec)
            && p.scale_len.is_multiple_of(per_vec)
            && strides_ok;
        let units = if vec { p.cols / per_vec } else { p.cols };
        let cached = layout::SKIP_CACHED_UNITS;
        let whole_warps = |n: usize| n.div_ceil(32) * 32;
        let threads = if units <= MAX_THREADS as usize * cached {
            whole_warps(units).clamp(32, MAX_THREADS as usize)
        } else {
            whole_warps(units.div_ceil(cached)).min(layout::SKIP_MAX_THREADS as usize)
        } as u32;
        let args = layout::SkipArgs {
            cols: p.cols as u32,
            scale_len: p.scale_len as u32,
            skip_rows: skip_rows as u32,
            eps: p.eps,
            x_row_stride: p.x_row_stride as u64,
            skip_row_stride: p.skip_row_stride as u64,
            y_row_stride: p.y_row_stride as u64,
            sum_row_stride: p.sum_row_stride as u64,
            flags: 0,
        };
        Ok(Some(SkipRmsNormPlan {
            kernel: variant(vec)?,
            dims: LaunchDims { grid: (p.rows as u32, 1, 1), block: (threads, 1, 1), shared_bytes: SHARED_BYTES },
            args,
        }))
    }
}

/// Fused residual RMSNorm on raw device pointers, on `stream`: [`skip_rmsnorm_raw_with`] for a
/// `gamma` and `bias` that the kernel just before on the stream may have written.
///
/// # Safety
/// As [`skip_rmsnorm_raw_with`].
pub unsafe fn skip_rmsnorm_raw(
    device: &Device,
    stream: CUstream,
    params: &SkipRmsNormParams,
    ptrs: &SkipRmsNormPointers,
) -> Result<()> {
    // SAFETY: forwarded contract.
    unsafe { skip_rmsnorm_raw_with(device, stream, params, ptrs, WeightsWritten::ByPreviousKernel) }
}

/// Fused residual RMSNorm on raw device pointers, on `stream`, `gamma` and `bias` last written
/// as `constants` says.
///
/// Everything checkable is validated first (see [`SkipRmsNormParams::plan`]): null or
/// misaligned pointers, overlaps other than the exact in-place ones, bad shapes and eps are
/// errors, not launches. On Hopper a grid that fits in one wave is a programmatic dependent of
/// the kernel before it on the stream (it waits for it before it reads `x` or `skip`; see
/// [`Device::launch_overlapping_in_one_wave`]), reads `gamma` and `bias` before that wait with
/// [`WeightsWritten::Before`], and lets the next kernel start early.
///
/// # Safety
/// Every non-zero address in `ptrs` must be a device address in `device`'s context valid for
/// the extent the parameters describe (reads of `x`, `skip`, `gamma`, `bias`; writes of `y`,
/// `sum`, `mean`, `inv_std_var`) until the kernel has run on `stream`, and `stream` must
/// belong to `device`'s primary context. With [`WeightsWritten::Before`], `gamma` and `bias`
/// must be in place when the kernel just before the call on `stream` starts, and that kernel
/// must not write them.
pub unsafe fn skip_rmsnorm_raw_with(
    device: &Device,
    stream: CUstream,
    params: &SkipRmsNormParams,
    ptrs: &SkipRmsNormPointers,
    constants: WeightsWritten,
) -> Result<()> {
    let Some(mut plan) = params.plan(ptrs)? else { return Ok(()) };
    if constants == WeightsWritten::Before {
        plan.args.flags |= layout::SKIP_FLAG_GAMMA_READY;
    }
    let args = KernelParams::new()
        .pointers(&[ptrs.x, ptrs.skip, ptrs.gamma, ptrs.bias, ptrs.y, ptrs.sum, ptrs.mean, ptrs.inv_std_var])
        .value(plan.args);
    // SAFETY: the arguments match the kernel signature (8 pointers, SkipArgs); pointer validity
    // is the caller's contract; the plan checked alignment and overlap. The kernel waits for
    // the grid before it (`griddepcontrol.wait`) before it reads anything but `gamma` and
    // `bias` (those only with the flag, which the caller vouches for) and before it writes.
    unsafe { device.launch_overlapping_in_one_wave(plan.kernel, plan.dims, stream, args) }
}

/// The buffers of a contiguous fused residual RMSNorm call (see [`skip_rmsnorm`]).
pub struct SkipRmsNormBuffers<'a, T: Element> {
    /// `[rows, cols]`.
    pub x: &'a CudaSlice<T>,
    /// `[skip_rows, cols]`.
    pub skip: Option<&'a CudaSlice<T>>,
    /// `[cols]`.
    pub gamma: &'a CudaSlice<T>,
    /// `[cols]`.
    pub bias: Option<&'a CudaSlice<T>>,
    /// `[rows, cols]`.
    pub y: &'a mut CudaSlice<T>,
    /// `[rows, cols]`: `x + skip + bias`.
    pub sum: Option<&'a mut CudaSlice<T>>,
    /// `[rows]`.
    pub inv_std_var: Option<&'a mut CudaSlice<f32>>,
}

/// Fused residual RMSNorm over contiguous slices on `stream` (safe: the slice lengths bound
/// every access): `sum = x + skip[r % skip_rows] + bias`, `y = rmsnorm(sum) * gamma`.
pub fn skip_rmsnorm<T: Element>(
    device: &Device,
    stream: &CudaStream,
    buffers: SkipRmsNormBuffers<'_, T>,
    rows: usize,
    cols: usize,
    skip_rows: usize,
    eps: f32,
) -> Result<()> {
    let overflow = || Error::invalid(KERNEL, "rows * cols overflows");
    let elements = rows.checked_mul(cols).ok_or_else(overflow)?;
    let skip_elements = skip_rows.checked_mul(cols).ok_or_else(overflow)?;
    check_same_device(KERNEL, device, stream)?;
    let SkipRmsNormBuffers { x, skip, gamma, bias, y, sum, inv_std_var } = buffers;
    check_slice(KERNEL, "x", device, x, elements)?;
    check_slice(KERNEL, "gamma", device, gamma, cols)?;
    check_slice(KERNEL, "y", device, y, elements)?;
    if let Some(s) = skip {
        check_slice(KERNEL, "skip", device, s, skip_elements)?;
    }
    if let Some(b) = bias {
        check_slice(KERNEL, "bias", device, b, cols)?;
    }
    if let Some(s) = &sum {
        check_slice(KERNEL, "sum", device, *s, elements)?;
    }
    if let Some(v) = &inv_std_var {
        check_slice(KERNEL, "inv_std_var", device, *v, rows)?;
    }
    let params = SkipRmsNormParams::contiguous(T::DTYPE, rows, cols, skip_rows, eps);
    let (x_ptr, _x_sync) = x.device_ptr(stream);
    let (g_ptr, _g_sync) = gamma.device_ptr(stream);
    let (y_ptr, _y_sync) = y.device_ptr_mut(stream);
    let skip = skip.map(|s| s.device_ptr(stream));
    let bias = bias.map(|b| b.device_ptr(stream));
    let sum = sum.map(|s| s.device_ptr_mut(stream));
    let inv = inv_std_var.map(|v| v.device_ptr_mut(stream));
    let addr = |p: &Option<(u64, _)>| p.as_ref().map_or(0, |(ptr, _)| *ptr);
    let ptrs = SkipRmsNormPointers {
        x: x_ptr,
        skip: addr(&skip),
        gamma: g_ptr,
        bias: addr(&bias),
        y: y_ptr,
        sum: addr(&sum),
        mean: 0,
        inv_std_var: addr(&inv),
    };
    // SAFETY: the slices are live allocations of at least the needed lengths on this device
    // (distinct slices, so only exact aliasing could arise, and the borrow rules exclude even
    // that), and the sync guards order the launch with other streams' use of them.
    unsafe { skip_rmsnorm_raw(device, stream.cu_stream(), &params, &ptrs) }
}
