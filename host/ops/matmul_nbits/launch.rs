//! W4A16 matmul in `MatMulNBits` format on the GPU: validation of the pointers and slices, and
//! the launches of what [`super::plan`] chose (the kernels and when each runs are described
//! there; device code in `kernels-gpu/src/matmul_nbits/`).

use std::sync::Arc;

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::layout::{self, FLAG_EARLY_DEPENDENTS, FLAG_WEIGHTS_READY};
use super::plan::{
    KERNEL, MatMulNBitsParams, MatMulNBitsPlan, RowAlignment, Variant, ZeroPointKind, early_dependents,
    pack_for_decode_plan,
};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::ops::common::checks::{check_pointer, check_same_device, check_slice};
use crate::runtime::{Device, KernelParams};

/// Device addresses of one call; `zero_points` and `bias` may be 0 when the params say they
/// are absent, `workspace` when the plan needs none.
#[derive(Clone, Copy, Debug)]
pub struct MatMulNBitsPointers {
    pub a: u64,
    pub b: u64,
    pub scales: u64,
    pub zero_points: u64,
    pub bias: u64,
    pub y: u64,
    pub workspace: u64,
}

/// (Defined with the other families' shared pieces; the norms take it too.)
pub use crate::ops::common::WeightsWritten;

/// W4A16 matmul on raw device pointers, on `stream`: [`matmul_nbits_raw_with`] for weights
/// that the kernel just before on the stream may have written.
///
/// # Safety
/// As [`matmul_nbits_raw_with`].
pub unsafe fn matmul_nbits_raw(
    device: &Device,
    stream: CUstream,
    params: &MatMulNBitsParams,
    ptrs: &MatMulNBitsPointers,
) -> Result<MatMulNBitsPlan> {
    // SAFETY: forwarded contract.
    unsafe { matmul_nbits_raw_with(device, stream, params, ptrs, WeightsWritten::ByPreviousKernel) }
}

/// W4A16 matmul on raw device pointers, on `stream`, the weights last written as `weights`
/// says.
///
/// # Safety
/// Every pointer must be a device address in `device`'s context valid for the extent the
/// parameters describe (`a` M x K, `b` N x row_bytes, `scales` N x k_blocks, zero points and
/// bias as given, `y` M x N not overlapping the inputs, the workspace for the
/// `workspace_bytes` of `params.plan_for(.., .., RowAlignment::of(params, a, b))`) until the
/// kernels have run on `stream`. With [`WeightsWritten::Before`], B, the scales and the zero
/// points must be in place when the kernel just before the call on `stream` starts, and that
/// kernel must not write them.
pub unsafe fn matmul_nbits_raw_with(
    device: &Device,
    stream: CUstream,
    params: &MatMulNBitsParams,
    ptrs: &MatMulNBitsPointers,
    weights: WeightsWritten,
) -> Result<MatMulNBitsPlan> {
    let rows = RowAlignment::of(params, ptrs.a, ptrs.b);
    let plan = params.plan_for(device.multiprocessors(), device.has_wgmma(), rows)?;
    // SAFETY: forwarded contract; the plan is the one for these params and pointers.
    unsafe { matmul_nbits_raw_planned(device, stream, &plan, params, ptrs, weights)? };
    Ok(plan)
}

/// [`matmul_nbits_raw_with`] for a plan the caller made already (the registry's path, which
/// plans once per call).
///
/// # Safety
/// As [`matmul_nbits_raw_with`]; `plan` is `params.plan_for(device.multiprocessors(),
/// device.has_wgmma(), RowAlignment::of(params, ptrs.a, ptrs.b))`.
pub(crate) unsafe fn matmul_nbits_raw_planned(
    device: &Device,
    stream: CUstream,
    plan: &MatMulNBitsPlan,
    params: &MatMulNBitsParams,
    ptrs: &MatMulNBitsPointers,
    weights: WeightsWritten,
) -> Result<()> {
    let elem = 2;
    for (name, ptr) in [("A", ptrs.a), ("scales", ptrs.scales), ("Y", ptrs.y)] {
        check_pointer(KERNEL, name, ptr, elem)?;
    }
    check_pointer(KERNEL, "B", ptrs.b, 4)?;
    match params.zero_points {
        ZeroPointKind::Default => {}
        ZeroPointKind::PackedU8 => check_pointer(KERNEL, "zero_points", ptrs.zero_points, 1)?,
        ZeroPointKind::Typed => check_pointer(KERNEL, "zero_points", ptrs.zero_points, elem)?,
    }
    if params.bias {
        check_pointer(KERNEL, "bias", ptrs.bias, elem)?;
    }
    if plan.workspace_bytes > 0 {
        check_pointer(KERNEL, "workspace", ptrs.workspace, 16)?;
    }
    let (zeros_u8, zeros_t) = match params.zero_points {
        ZeroPointKind::Default => (0, 0),
        ZeroPointKind::PackedU8 => (ptrs.zero_points, 0),
        ZeroPointKind::Typed => (0, ptrs.zero_points),
    };
    let bias = if params.bias { ptrs.bias } else { 0 };
    // `tiled` and `wgmma` read A from its permuted copy at the start of the workspace; the
    // permutation also clears the stream-K flags (no memset between it and the previous call's
    // kernel, which it overlaps).
    let mut a = ptrs.a;
    if let Some((permute, permute_dims)) = plan.permute {
        let (zeroed, words) = match plan.zeroed {
            Some((offset, bytes)) => (ptrs.workspace + offset as u64, (bytes / 4) as u32),
            None => (0, 0),
        };
        let args = KernelParams::new().pointers(&[ptrs.a, ptrs.workspace, zeroed]).value(plan.args).value(words);
        // SAFETY: three pointers, Dims and a u32, as the kernel declares; the workspace holds
        // the copy and the flags (inside it, sized by the plan). It waits for the grid before
        // it before it reads or writes anything.
        unsafe { device.launch_overlapping(permute, permute_dims, stream, args)? };
        a = ptrs.workspace;
    }
    // `prefill_any` reads its constants cooked, from the workspace: the cooking (a plain launch)
    // starts once everything before it in the stream is done, the permutation included, and the
    // kernel, its programmatic dependent, waits for it before it reads them.
    let (mut scales, mut zeros_u8) = (ptrs.scales, zeros_u8);
    if let Some((cook, cook_dims)) = plan.cook {
        let cooked = ptrs.workspace + plan.cooked_offset as u64;
        let cooked_zero = cooked + layout::cooked_zero_offset(params.n, params.k_blocks()) as u64;
        let args =
            KernelParams::new().pointers(&[ptrs.scales, zeros_u8, zeros_t, cooked, cooked_zero]).value(plan.args);
        // SAFETY: five pointers and Dims, as the kernel declares; the cooked constants lie in
        // the workspace (sized by the plan), apart from the inputs.
        unsafe { device.launch(cook, cook_dims, stream, args)? };
        (scales, zeros_u8) = (cooked, cooked_zero);
    }
    let partials = ptrs.workspace + plan.partials_offset as u64;
    let mut dims = plan.args;
    // (The flags change nothing where the kernel is not a programmatic dependent.)
    if plan.decode && device.overlaps_launches() {
        if weights == WeightsWritten::Before {
            dims.flags |= FLAG_WEIGHTS_READY;
        }
        let (gx, gy, gz) = plan.dims.grid;
        let per_sm = device.resident_blocks_per_sm(plan.kernel, &plan.dims)?;
        if early_dependents(gx as u64 * gy as u64 * gz as u64, per_sm, device.multiprocessors()) {
            dims.flags |= FLAG_EARLY_DEPENDENTS;
        }
    }
    let args =
        KernelParams::new().pointers(&[a, ptrs.b, scales, zeros_u8, zeros_t, bias, ptrs.y, partials]).value(dims);
    // SAFETY: eight pointers and the Dims struct, as the kernel declares; validity by contract.
    // Kernels that overlap wait for the grid before them (`griddepcontrol.wait`) before they
    // read anything it may write (the decode kernels copy weights before it only when the
    // caller says the weights were written earlier) and before they write anything.
    if let Some(cluster) = plan.cluster {
        // SAFETY: as below; the kernel sums its K splits in clusters of this shape (the flag
        // the plan set).
        unsafe { device.launch_clustered(plan.kernel, plan.dims, cluster, stream, args, plan.overlaps_previous())? };
    } else if plan.overlaps_previous() {
        unsafe { device.launch_overlapping(plan.kernel, plan.dims, stream, args)? };
    } else {
        unsafe { device.launch(plan.kernel, plan.dims, stream, args)? };
    }
    if let Some((reduce, reduce_dims)) = plan.reduce {
        let args = KernelParams::new().pointers(&[bias, ptrs.y, partials]).value(plan.args).value(plan.splits as u32);
        // SAFETY: three pointers, Dims and a u32, as the reduction kernel declares.
        unsafe { device.launch(reduce, reduce_dims, stream, args)? };
    }
    Ok(())
}

/// Zero points of a [`matmul_nbits`] call.
pub enum ZeroPoints<'a, T> {
    Default,
    PackedU8(&'a CudaSlice<u8>),
    Typed(&'a CudaSlice<T>),
}

/// The weight of a [`matmul_nbits`] call in `MatMulNBits` layout.
pub struct MatMulNBitsDeviceWeights<'a, T> {
    pub b: &'a CudaSlice<u8>,
    pub scales: &'a CudaSlice<T>,
    pub zero_points: ZeroPoints<'a, T>,
}

/// W4A16 matmul over cudarc slices (safe: lengths are checked against the params). Allocates
/// the workspace it needs on `stream`.
pub fn matmul_nbits<T: Element>(
    device: &Device,
    stream: &Arc<CudaStream>,
    params: &MatMulNBitsParams,
    a: &CudaSlice<T>,
    w: &MatMulNBitsDeviceWeights<T>,
    bias: Option<&CudaSlice<T>>,
    y: &mut CudaSlice<T>,
) -> Result<MatMulNBitsPlan> {
    let p = params;
    if T::DTYPE != p.dtype {
        return Err(Error::invalid(KERNEL, format!("slices hold {}, params say {}", T::DTYPE, p.dtype)));
    }
    let kind = match w.zero_points {
        ZeroPoints::Default => ZeroPointKind::Default,
        ZeroPoints::PackedU8(_) => ZeroPointKind::PackedU8,
        ZeroPoints::Typed(_) => ZeroPointKind::Typed,
    };
    if kind != p.zero_points || p.bias != bias.is_some() {
        return Err(Error::invalid(KERNEL, "params.zero_points / params.bias must match the slices given"));
    }
    check_same_device(KERNEL, device, stream)?;
    check_slice(KERNEL, "A", device, a, p.m * p.k)?;
    let b_len = if p.variant.is_some_and(Variant::reads_packed_b) { p.packed_bytes() } else { p.n * p.row_bytes() };
    check_slice(KERNEL, "B", device, w.b, b_len)?;
    check_slice(KERNEL, "scales", device, w.scales, p.n * p.k_blocks())?;
    check_slice(KERNEL, "Y", device, y, p.m * p.n)?;
    match w.zero_points {
        ZeroPoints::Default => {}
        ZeroPoints::PackedU8(z) => check_slice(KERNEL, "zero_points", device, z, p.n * p.k_blocks().div_ceil(2))?,
        ZeroPoints::Typed(z) => check_slice(KERNEL, "zero_points", device, z, p.n * p.k_blocks())?,
    }
    if let Some(bias) = bias {
        check_slice(KERNEL, "bias", device, bias, p.n)?;
    }
    let (a_ptr, _a) = a.device_ptr(stream);
    let (b_ptr, _b) = w.b.device_ptr(stream);
    let plan = p.plan_for(device.multiprocessors(), device.has_wgmma(), RowAlignment::of(p, a_ptr, b_ptr))?;
    let workspace = stream
        .alloc_zeros::<u8>(plan.workspace_bytes.max(16))
        .map_err(|source| Error::Driver { call: "cuMemAllocAsync", source })?;
    let (s_ptr, _s) = w.scales.device_ptr(stream);
    let zp = match w.zero_points {
        ZeroPoints::Default => None,
        ZeroPoints::PackedU8(z) => Some(z.device_ptr(stream)),
        ZeroPoints::Typed(z) => Some(z.device_ptr(stream)),
    };
    let bias_ptr = bias.map(|b| b.device_ptr(stream));
    let (y_ptr, _y) = y.device_ptr_mut(stream);
    let (ws_ptr, _ws) = workspace.device_ptr(stream);
    let ptrs = MatMulNBitsPointers {
        a: a_ptr,
        b: b_ptr,
        scales: s_ptr,
        zero_points: zp.as_ref().map_or(0, |(p, _)| *p),
        bias: bias_ptr.as_ref().map_or(0, |(p, _)| *p),
        y: y_ptr,
        workspace: ws_ptr,
    };
    // SAFETY: every slice was checked to hold the extent the params describe; `y` is borrowed
    // mutably, so it cannot alias the inputs.
    unsafe { matmul_nbits_raw(device, stream.cu_stream(), params, &ptrs) }
}

/// Repacks B, its scales and zero points for [`Variant::Packed`] on the device: the
/// [`MatMulNBitsParams::packed_bytes`] that
/// [`MatMulNBitsWeights::pack_for_decode`](crate::ops::matmul_nbits::pack::MatMulNBitsWeights::pack_for_decode) builds on the
/// host, byte for byte. `zero_points` is read only for [`ZeroPointKind::PackedU8`].
///
/// # Safety
/// `b` (N x row_bytes), `scales` (N x k_blocks) and the zero points must be device addresses in
/// `device`'s context valid until the kernel has run on `stream`, and `packed` must hold
/// `params.packed_bytes()` writable bytes that overlap none of them.
pub unsafe fn pack_for_decode_raw(
    device: &Device,
    stream: CUstream,
    params: &MatMulNBitsParams,
    b: u64,
    scales: u64,
    zero_points: u64,
    packed: u64,
) -> Result<()> {
    let (dims, args) = pack_for_decode_plan(params)?;
    check_pointer(KERNEL, "B", b, 16)?;
    check_pointer(KERNEL, "scales", scales, 2)?;
    if params.zero_points == ZeroPointKind::PackedU8 {
        check_pointer(KERNEL, "zero_points", zero_points, 1)?;
    }
    check_pointer(KERNEL, "packed", packed, 16)?;
    let zeros = if params.zero_points == ZeroPointKind::PackedU8 { zero_points } else { 0 };
    let params = KernelParams::new().pointers(&[b, scales, zeros, packed]).value(args);
    // SAFETY: four pointers and Dims, as the kernel declares; validity by the caller's contract.
    unsafe { device.launch(layout::PACK_DECODE_ENTRY, dims, stream, params) }
}

/// [`pack_for_decode_raw`] over cudarc slices (safe: lengths are checked against the params):
/// B in `MatMulNBits` layout in, a new allocation of the repacked records out, for
/// [`matmul_nbits`] with [`Variant::Packed`].
pub fn pack_for_decode<T: Element>(
    device: &Device,
    stream: &Arc<CudaStream>,
    params: &MatMulNBitsParams,
    w: &MatMulNBitsDeviceWeights<T>,
) -> Result<CudaSlice<u8>> {
    let p = params;
    if T::DTYPE != p.dtype {
        return Err(Error::invalid(KERNEL, format!("slices hold {}, params say {}", T::DTYPE, p.dtype)));
    }
    pack_for_decode_plan(p)?;
    check_same_device(KERNEL, device, stream)?;
    check_slice(KERNEL, "B", device, w.b, p.n * p.row_bytes())?;
    check_slice(KERNEL, "scales", device, w.scales, p.n * p.k_blocks())?;
    let zp = match w.zero_points {
        ZeroPoints::Default if p.zero_points == ZeroPointKind::Default => None,
        ZeroPoints::PackedU8(z) if p.zero_points == ZeroPointKind::PackedU8 => {
            check_slice(KERNEL, "zero_points", device, z, p.n * p.k_blocks().div_ceil(2))?;
            Some(z.device_ptr(stream))
        }
        _ => return Err(Error::invalid(KERNEL, "params.zero_points must match the slices given (u8 or none)")),
    };
    // SAFETY: every byte is written by the kernel before anything reads it.
    let mut packed = unsafe { stream.alloc::<u8>(p.packed_bytes()) }
        .map_err(|source| Error::Driver { call: "cuMemAllocAsync", source })?;
    {
        let (b_ptr, _b) = w.b.device_ptr(stream);
        let (s_ptr, _s) = w.scales.device_ptr(stream);
        let (out_ptr, _out) = packed.device_ptr_mut(stream);
        let z_ptr = zp.as_ref().map_or(0, |(z, _)| *z);
        // SAFETY: the slices hold the extents the params describe (checked above); `packed` is a
        // fresh allocation of `packed_bytes`, so it overlaps nothing.
        unsafe { pack_for_decode_raw(device, stream.cu_stream(), p, b_ptr, s_ptr, z_ptr, out_ptr)? };
    }
    Ok(packed)
}
