//! W8A8 matmul on the GPU (device code: `kernels-gpu/src/matmul_w8a8/`): int8 activations
//! `[M, K]` (per-row or one scale) times int8 weights `[N, K]` (per-row scales) on int8 tensor
//! cores, int32 accumulation, f32 epilogue (+ bias), stored as f16, bf16 or f32.

use std::sync::Arc;

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::pack::MAX_K_I32;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ops::common::checks::{check_pointer, check_same_device, check_slice};
use crate::runtime::{Device, KernelParams, LaunchDims};

const KERNEL: &str = "matmul_w8a8";
use super::layout;
use layout::{
    BK, BM, BN, Dims, Entry, FLAG_BIAS, FLAG_SCALAR_A_SCALE, FLAG_VEC16, MAX_SPLITS, QUANTIZE_THREADS, REDUCE_THREADS,
    SHARED_BYTES, SMALL_M_MAX, SMALL_N_PER_BLOCK, SMALL_THREADS, THREADS, WGMMA_BK, WGMMA_BM, WGMMA_BN,
    WGMMA_SHARED_BYTES, WGMMA_THREADS,
};

/// The kernels of a W8A8 call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum W8A8Variant {
    /// `matmul_w8a8_small_*`: M <= 16, K % 16 == 0, 16-byte aligned operands; one pass over W.
    Decode,
    /// `matmul_w8a8_small_packed_*`: `Decode` over W packed by
    /// [`crate::ops::matmul_w8a8::pack::pack_for_decode`] (passed as `w`, [`MatMulW8A8Params::packed_w_len`]
    /// bytes), where each block reads one contiguous run instead of 16 rows `K` apart (about 5%
    /// faster at M = 16 on the H200). Only on request: the planner cannot know `w`'s layout.
    Packed,
    /// `matmul_w8a8_*` (`mma.sync`, any alignment), split over K when its tiles are few.
    Tiled,
    /// `matmul_w8a8_wgmma_*`: Hopper's warpgroup tensor cores (the sm_90a module only), K % 16
    /// == 0, 16-byte aligned operands; split over K when its tiles leave SMs idle.
    Wgmma,
}

/// Shapes and options of one call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatMulW8A8Params {
    /// Output type: f16, bf16 or f32.
    pub out_dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// One activation scale per row (`[M]`), else a single one (`[1]`).
    pub per_row_a_scale: bool,
    pub bias: bool,
    /// K splits of the tiled and `wgmma` kernels (int32 partial sums in a workspace, then a
    /// reduction): 0 picks them (enough blocks to fill the SMs), 1 never splits.
    pub splits: usize,
    /// Forces a kernel (to compare them; an error where it cannot run); `None` lets the planner
    /// pick.
    pub variant: Option<W8A8Variant>,
}

/// What a validated call launches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatMulW8A8Plan {
    pub kernel: &'static str,
    pub dims: LaunchDims,
    /// `Decode` and `Wgmma` need 16-byte aligned `a` and `w`.
    pub variant: W8A8Variant,
    /// K splits (1: none) and the workspace bytes they need (0 when unsplit).
    pub splits: usize,
    pub workspace_bytes: usize,
    /// The split-K reduction, when split.
    pub reduce: Option<(&'static str, LaunchDims)>,
    args: Dims,
}

impl MatMulW8A8Params {
    /// Validates the shapes and picks the kernel for a GPU of `multiprocessors` SMs, `wgmma`
    /// when it runs the Hopper module ([`Device::has_wgmma`]): the decode kernel for M <= 16
    /// (K % 16 == 0), else `wgmma` (Hopper, K % 16 == 0), split over K when its output tiles
    /// alone leave SMs idle, else the tiled kernel, split over K when its output tiles alone
    /// cannot give every SM two blocks. Decode and `wgmma` need 16-byte aligned operands; for
    /// others the launcher falls back to the tiled kernel, unsplit.
    pub fn plan(&self, multiprocessors: u32, wgmma: bool) -> Result<MatMulW8A8Plan> {
        let p = self;
        let args = p.validate()?;
        let vec16 = p.k.is_multiple_of(16);
        let variant = match p.variant {
            Some(v @ (W8A8Variant::Decode | W8A8Variant::Packed)) if !(p.m <= SMALL_M_MAX && vec16) => {
                return Err(Error::invalid(
                    KERNEL,
                    format!("the {v:?} decode kernel needs M <= 16 and K % 16 == 0, got M = {} and K = {}", p.m, p.k),
                ));
            }
            Some(W8A8Variant::Wgmma) if !(wgmma && vec16) => {
                return Err(Error::invalid(
                    KERNEL,
                    format!(
                        "the wgmma kernel needs a Hopper GPU (sm_90a module: {wgmma}) and K % 16 == 0 (K = {})",
                        p.k
                    ),
                ));
            }
            Some(v) => v,
            // Decoding: one pass over W with 16-byte loads; the tiled kernels would leave most
            // of each 128-row A tile empty.
            None if p.m <= SMALL_M_MAX && vec16 => W8A8Variant::Decode,
            None if wgmma && vec16 => W8A8Variant::Wgmma,
            None => W8A8Variant::Tiled,
        };
        match variant {
            W8A8Variant::Decode | W8A8Variant::Packed => {
                let dims = LaunchDims {
                    grid: (p.n.div_ceil(SMALL_N_PER_BLOCK) as u32, 1, 1),
                    block: (SMALL_THREADS as u32, 1, 1),
                    shared_bytes: 0,
                };
                let packed = variant == W8A8Variant::Packed;
                let kernel = kernel_name(p.out_dtype, if packed { Entry::SmallPacked } else { Entry::Small })?;
                Ok(MatMulW8A8Plan { kernel, dims, variant, splits: 1, workspace_bytes: 0, reduce: None, args })
            }
            W8A8Variant::Wgmma => p.wgmma(args, multiprocessors, p.splits),
            W8A8Variant::Tiled => p.tiled(args, multiprocessors, p.splits),
        }
    }

    /// Bytes of W packed for [`W8A8Variant::Packed`] ([`crate::ops::matmul_w8a8::pack::pack_for_decode`]):
    /// N and K padded to the kernel's 16 x 64 tiles.
    pub fn packed_w_len(&self) -> usize {
        let [rows, cols] = crate::ops::matmul_w8a8::pack::packed_decode_shape(self.n, self.k);
        rows * cols
    }

    /// Elements of `w` the plan's kernel reads: `N * K`, or [`Self::packed_w_len`] for `Packed`.
    pub fn w_len(&self, variant: W8A8Variant) -> usize {
        if variant == W8A8Variant::Packed { self.packed_w_len() } else { self.n * self.k }
    }

    /// The checks every kernel needs; the scalar arguments without a split.
    fn validate(&self) -> Result<Dims> {
        let p = self;
        let bad = |m: String| Error::invalid(KERNEL, m);
        if !matches!(p.out_dtype, DType::F16 | DType::BF16 | DType::F32) {
            return Err(bad(format!("output dtype {} not supported (f16, bf16, f32)", p.out_dtype)));
        }
        for (name, v) in [("M", p.m), ("N", p.n), ("K", p.k)] {
            if v == 0 || v > i32::MAX as usize {
                return Err(bad(format!("{name} = {v} (must be 1..=2^31-1)")));
            }
        }
        if p.k > MAX_K_I32 {
            return Err(bad(format!("K = {} exceeds {MAX_K_I32}, where int32 accumulation could overflow", p.k)));
        }
        if p.m.div_ceil(BM) > 65535 || (p.m as u64) * (p.k.max(p.n) as u64) > i64::MAX as u64 / 4 {
            return Err(bad(format!("M = {} too large", p.m)));
        }
        let mut flags = if p.bias { FLAG_BIAS } else { 0 };
        if !p.per_row_a_scale {
            flags |= FLAG_SCALAR_A_SCALE;
        }
        let k_tiles = p.k.div_ceil(BK) as u32;
        Ok(Dims { m: p.m as u32, n: p.n as u32, k: p.k as u32, flags, k_tiles_per_split: k_tiles })
    }

    /// The tiled kernel with `requested` K splits (0: enough blocks for two per SM).
    fn tiled(&self, mut args: Dims, multiprocessors: u32, requested: usize) -> Result<MatMulW8A8Plan> {
        let p = self;
        let k_tiles = p.k.div_ceil(BK);
        let tiles = p.n.div_ceil(BN) * p.m.div_ceil(BM);
        let wanted = match requested {
            // Two blocks per SM fit (registers and shared memory); keep at least four K tiles
            // per split so the three-stage pipeline still has something to overlap.
            0 => (2 * multiprocessors.max(1) as usize).div_ceil(tiles).min(k_tiles / 4),
            s => s,
        };
        let splits = split_k(&mut args, k_tiles, wanted);
        let dims = LaunchDims {
            grid: (p.n.div_ceil(BN) as u32, p.m.div_ceil(BM) as u32, splits as u32),
            block: (THREADS as u32, 1, 1),
            shared_bytes: SHARED_BYTES as u32,
        };
        let unsplit = kernel_name(p.out_dtype, Entry::Tiled)?;
        p.finish(args, dims, W8A8Variant::Tiled, splits, unsplit, entry_name(Entry::Partial)?)
    }

    /// The `wgmma` kernel with `requested` K splits (0: as many as fill the SMs once, one block
    /// each: it needs all of an SM's shared memory).
    fn wgmma(&self, mut args: Dims, multiprocessors: u32, requested: usize) -> Result<MatMulW8A8Plan> {
        let p = self;
        let k_steps = p.k.div_ceil(WGMMA_BK);
        let tiles = p.m.div_ceil(WGMMA_BM) * p.n.div_ceil(WGMMA_BN);
        if tiles > i32::MAX as usize {
            return Err(Error::invalid(KERNEL, "M x N too large for the wgmma grid"));
        }
        let wanted = match requested {
            // At least four K steps per split, so that the ring still overlaps copies and math.
            0 => (multiprocessors.max(1) as usize / tiles).min(k_steps / 4),
            s => s,
        };
        let splits = split_k(&mut args, k_steps, wanted);
        let dims = LaunchDims {
            grid: (tiles as u32, 1, splits as u32),
            block: (WGMMA_THREADS as u32, 1, 1),
            shared_bytes: WGMMA_SHARED_BYTES as u32,
        };
        let unsplit = kernel_name(p.out_dtype, Entry::Wgmma)?;
        p.finish(args, dims, W8A8Variant::Wgmma, splits, unsplit, entry_name(Entry::WgmmaPartial)?)
    }

    /// The plan of a tiled or `wgmma` launch: `unsplit` when `splits == 1`, else `partial` (int32
    /// sums of each split into the workspace) and the reduction.
    fn finish(
        &self,
        args: Dims,
        dims: LaunchDims,
        variant: W8A8Variant,
        splits: usize,
        unsplit: &'static str,
        partial: &'static str,
    ) -> Result<MatMulW8A8Plan> {
        let p = self;
        if splits == 1 {
            return Ok(MatMulW8A8Plan {
                kernel: unsplit,
                dims,
                variant,
                splits,
                workspace_bytes: 0,
                reduce: None,
                args,
            });
        }
        if (p.m * p.n).div_ceil(REDUCE_THREADS) > i32::MAX as usize {
            return Err(Error::invalid(KERNEL, "M x N too large for the split-K reduction grid"));
        }
        let reduce_dims = LaunchDims {
            grid: ((p.m * p.n).div_ceil(REDUCE_THREADS) as u32, 1, 1),
            block: (REDUCE_THREADS as u32, 1, 1),
            shared_bytes: 0,
        };
        let reduce = Some((kernel_name(p.out_dtype, Entry::Reduce)?, reduce_dims));
        Ok(MatMulW8A8Plan {
            kernel: partial,
            dims,
            variant,
            splits,
            workspace_bytes: splits * p.m * p.n * 4,
            reduce,
            args,
        })
    }
}

/// Splits `steps` K steps `wanted` ways (clamped to 1..=min(MAX_SPLITS, steps)) into equal
/// shares but the last; sets `args.k_tiles_per_split` and returns the splits that run.
fn split_k(args: &mut Dims, steps: usize, wanted: usize) -> usize {
    let per_split = steps.div_ceil(wanted.clamp(1, MAX_SPLITS.min(steps)));
    args.k_tiles_per_split = per_split as u32;
    steps.div_ceil(per_split)
}

/// The symbol of `entry` (from the kernels' table of entry points).
fn entry_name(entry: Entry) -> Result<&'static str> {
    layout::entry(entry).ok_or_else(|| Error::invalid(KERNEL, format!("no kernel {entry:?}")))
}

/// `matmul_w8a8[_variant]_{f16,bf16,f32}`, e.g. `kernel_name(DType::F16, Entry::Small)`.
fn kernel_name(dtype: DType, variant: fn(layout::Dtype) -> Entry) -> Result<&'static str> {
    let Some(dtype) = layout::Dtype::from_name(dtype.name()) else {
        return Err(Error::invalid(KERNEL, format!("dtype {dtype} not supported (f16, bf16, f32)")));
    };
    entry_name(variant(dtype))
}

/// Device addresses of one call (`bias` 0 when absent).
#[derive(Clone, Copy, Debug)]
pub struct MatMulW8A8Pointers {
    pub a: u64,
    pub a_scale: u64,
    pub w: u64,
    pub w_scale: u64,
    pub bias: u64,
    pub y: u64,
    /// Int32 partial sums of a split-K plan (`plan.workspace_bytes`, 16-byte aligned); 0 when
    /// the plan needs none.
    pub workspace: u64,
}

/// W8A8 matmul on raw device pointers, on `stream`.
///
/// # Safety
/// Device addresses in `device`'s context valid for the extents the parameters describe (`a`
/// M x K, `w` N x K int8 or, for [`W8A8Variant::Packed`], [`MatMulW8A8Params::packed_w_len`]
/// bytes, scales and bias f32, `y` M x N of the output type, not overlapping
/// the inputs, the workspace for `plan.workspace_bytes`) until the kernels have run on `stream`.
pub unsafe fn matmul_w8a8_raw(
    device: &Device,
    stream: CUstream,
    params: &MatMulW8A8Params,
    ptrs: &MatMulW8A8Pointers,
) -> Result<MatMulW8A8Plan> {
    let mut plan = params.plan(device.multiprocessors(), device.has_wgmma())?;
    check_pointer(KERNEL, "a", ptrs.a, 1)?;
    check_pointer(KERNEL, "w", ptrs.w, 1)?;
    check_pointer(KERNEL, "a_scale", ptrs.a_scale, 4)?;
    check_pointer(KERNEL, "w_scale", ptrs.w_scale, 4)?;
    check_pointer(KERNEL, "y", ptrs.y, params.out_dtype.size_bytes() as u64)?;
    if params.bias {
        check_pointer(KERNEL, "bias", ptrs.bias, 4)?;
    }
    if plan.workspace_bytes > 0 {
        check_pointer(KERNEL, "workspace", ptrs.workspace, 16)?;
    }
    if params.k.is_multiple_of(16) && ptrs.a.is_multiple_of(16) && ptrs.w.is_multiple_of(16) {
        plan.args.flags |= FLAG_VEC16;
    } else if plan.variant != W8A8Variant::Tiled {
        // Decode and wgmma need 16-byte rows: gather bytes in the tiled kernel instead, unsplit
        // (the plan reserved no workspace), unless the caller insisted.
        if params.variant.is_some() {
            return Err(Error::invalid(
                KERNEL,
                format!("the {:?} kernel needs 16-byte aligned a and w and K % 16 == 0", plan.variant),
            ));
        }
        plan = params.tiled(plan.args, device.multiprocessors(), 1)?;
    }
    let bias = if params.bias { ptrs.bias } else { 0 };
    let args = KernelParams::new()
        .pointers(&[ptrs.a, ptrs.w, ptrs.a_scale, ptrs.w_scale, bias, ptrs.y, ptrs.workspace])
        .value(plan.args);
    // SAFETY: seven pointers and the Dims struct, as the kernels declare; validity by contract.
    unsafe { device.launch(plan.kernel, plan.dims, stream, args)? };
    if let Some((reduce, reduce_dims)) = plan.reduce {
        let args = KernelParams::new()
            .pointers(&[ptrs.workspace, ptrs.a_scale, ptrs.w_scale, bias, ptrs.y])
            .value(plan.args)
            .value(plan.splits as u32);
        // SAFETY: five pointers, Dims and a u32, as the reduction kernel declares.
        unsafe { device.launch(reduce, reduce_dims, stream, args)? };
    }
    Ok(plan)
}

/// W8A8 matmul over cudarc slices (safe: lengths are checked against the params).
#[allow(clippy::too_many_arguments)]
pub fn matmul_w8a8<T: Element>(
    device: &Device,
    stream: &Arc<CudaStream>,
    params: &MatMulW8A8Params,
    a: &CudaSlice<i8>,
    a_scale: &CudaSlice<f32>,
    w: &CudaSlice<i8>,
    w_scale: &CudaSlice<f32>,
    bias: Option<&CudaSlice<f32>>,
    y: &mut CudaSlice<T>,
) -> Result<MatMulW8A8Plan> {
    let p = params;
    if T::DTYPE != p.out_dtype || p.bias != bias.is_some() {
        return Err(Error::invalid(KERNEL, "y's type and the bias must match params.out_dtype and params.bias"));
    }
    let plan = p.plan(device.multiprocessors(), device.has_wgmma())?;
    check_same_device(KERNEL, device, stream)?;
    check_slice(KERNEL, "a", device, a, p.m * p.k)?;
    check_slice(KERNEL, "a_scale", device, a_scale, if p.per_row_a_scale { p.m } else { 1 })?;
    check_slice(KERNEL, "w", device, w, p.w_len(plan.variant))?;
    check_slice(KERNEL, "w_scale", device, w_scale, p.n)?;
    check_slice(KERNEL, "y", device, y, p.m * p.n)?;
    if let Some(b) = bias {
        check_slice(KERNEL, "bias", device, b, p.n)?;
    }
    let (a_ptr, _a) = a.device_ptr(stream);
    let (sa_ptr, _sa) = a_scale.device_ptr(stream);
    let (w_ptr, _w) = w.device_ptr(stream);
    let (sw_ptr, _sw) = w_scale.device_ptr(stream);
    let bias_ptr = bias.map(|b| b.device_ptr(stream));
    let (y_ptr, _y) = y.device_ptr_mut(stream);
    let workspace = stream
        .alloc_zeros::<u8>(plan.workspace_bytes.max(16))
        .map_err(|source| Error::Driver { call: "cuMemAllocAsync", source })?;
    let (ws_ptr, _ws) = workspace.device_ptr(stream);
    let ptrs = MatMulW8A8Pointers {
        a: a_ptr,
        a_scale: sa_ptr,
        w: w_ptr,
        w_scale: sw_ptr,
        bias: bias_ptr.as_ref().map_or(0, |(p, _)| *p),
        y: y_ptr,
        workspace: ws_ptr,
    };
    // SAFETY: every slice holds the extent the params describe; `y` is borrowed mutably.
    unsafe { matmul_w8a8_raw(device, stream.cu_stream(), params, &ptrs) }
}

/// Per-token int8 quantization on the GPU: row `r` of `x [rows, cols]` (f16/bf16/f32) to int8
/// `q` with `scales[r] = max|x| / 127`, bit for bit what [`crate::ops::matmul_w8a8::pack::quantize_rows`]
/// computes on finite inputs.
///
/// # Safety
/// Device addresses in `device`'s context: `x` rows x cols of `dtype`, `q` rows x cols int8,
/// `scales` rows f32, outputs not overlapping `x`, valid until the kernel has run on `stream`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn quantize_per_token_raw(
    device: &Device,
    stream: CUstream,
    dtype: DType,
    rows: usize,
    cols: usize,
    x: u64,
    q: u64,
    scales: u64,
) -> Result<()> {
    let Ok(kernel) = kernel_name(dtype, Entry::Quantize) else {
        return Err(Error::invalid(KERNEL, format!("input dtype {dtype} not supported (f16, bf16, f32)")));
    };
    // Zero-width rows still get their scales (0), so only an empty batch launches nothing.
    if rows == 0 {
        return Ok(());
    }
    if rows > i32::MAX as usize || cols > u32::MAX as usize || (rows as u64) * (cols as u64) > i64::MAX as u64 / 4 {
        return Err(Error::invalid(KERNEL, format!("[{rows}, {cols}] too large")));
    }
    if cols > 0 {
        check_pointer(KERNEL, "x", x, dtype.size_bytes() as u64)?;
        check_pointer(KERNEL, "q", q, 1)?;
    }
    check_pointer(KERNEL, "scales", scales, 4)?;
    let args = KernelParams::new().pointers(&[x, q, scales]).value(cols as u32);
    let dims = LaunchDims { grid: (rows as u32, 1, 1), block: (QUANTIZE_THREADS as u32, 1, 1), shared_bytes: 0 };
    // SAFETY: three pointers and a u32, as the kernel declares; validity by contract.
    unsafe { device.launch(kernel, dims, stream, args) }
}
