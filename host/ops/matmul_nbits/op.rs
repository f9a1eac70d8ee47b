//! `dlkern.matmul_nbits`: `com.microsoft` `MatMulNBits` (bits = 4) on CUDA tensors (the
//! kernels of [`super::launch`]) and CPU tensors (the reference). At a call site that
//! marks B, the scales and the zero points constant (an ONNX node's initializers), the GPU path
//! repacks them once for `Variant::Packed` and keeps the copy in the site.

use std::any::Any;

use cudarc::driver::sys::{CUresult, CUstream};

use super::launch::{MatMulNBitsPointers, WeightsWritten, matmul_nbits_raw_planned, pack_for_decode_raw};
use super::plan::{MatMulNBitsParams, RowAlignment, Variant, ZeroPointKind};
use crate::dlpack::{DEVICE_MASK_CPU, DEVICE_MASK_CUDA, DeviceKind, TensorView};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernel::{
    AttrDecl, AttrKind, CallSite, InferArgs, KernelArgs, OpDecl, OrtDecl, TensorDecl, TensorSpec, TensorType,
};
use crate::ops::common::{floats, optional, store, with_last};
use crate::runtime::{Device, DeviceBuffer, synchronize_stream};

/// This family's ops, in the order `docs/ops.md` lists them.
pub static DECLARATIONS: &[&OpDecl] = &[&MATMUL_NBITS];

/// Exactly `com.microsoft` `MatMulNBits`' inputs and attributes (bits = 4).
pub static MATMUL_NBITS: OpDecl = OpDecl {
    name: "dlkern.matmul_nbits",
    inputs: &[
        TensorDecl { name: "A", ty: TensorType::T, optional: false, shape: "`[..., K]`" },
        TensorDecl {
            name: "B",
            ty: TensorType::Fixed(DType::U8),
            optional: false,
            shape: "`[N, k_blocks, block_size / 2]`, 4-bit values packed along K, low nibble first",
        },
        TensorDecl { name: "scales", ty: TensorType::T, optional: false, shape: "`[N, k_blocks]`" },
        TensorDecl {
            name: "zero_points",
            ty: TensorType::Any("uint8 or T"),
            optional: true,
            shape: "uint8 packed `[N, ceil(k_blocks / 2)]`, or T `[N, k_blocks]`; default 8",
        },
        TensorDecl {
            name: "g_idx",
            ty: TensorType::Fixed(DType::I32),
            optional: true,
            shape: "deprecated upstream; refused if given",
        },
        TensorDecl { name: "bias", ty: TensorType::T, optional: true, shape: "`[N]`" },
    ],
    outputs: &[TensorDecl { name: "Y", ty: TensorType::T, optional: false, shape: "`[..., N]`" }],
    attrs: &[
        AttrDecl { name: c"K", kind: AttrKind::Int, doc: "" },
        AttrDecl { name: c"N", kind: AttrKind::Int, doc: "" },
        AttrDecl { name: c"bits", kind: AttrKind::Int, doc: "must be 4" },
        AttrDecl { name: c"block_size", kind: AttrKind::Int, doc: "a power of two >= 16" },
        AttrDecl { name: c"accuracy_level", kind: AttrKind::OptionalInt { default: "0" }, doc: "ignored" },
    ],
    devices: DEVICE_MASK_CPU | DEVICE_MASK_CUDA,
    compute,
    infer,
    // The tensor-core kernels take f16/bf16; the reference takes f32/f16 on the CPU EP.
    ort: Some(OrtDecl { name: c"MatMulNBits", cuda: &[DType::F16, DType::BF16], cpu: &[DType::F32, DType::F16] }),
};

/// `MatMulNBits` attributes, checked.
struct MatMulNBitsAttrs {
    k: usize,
    n: usize,
    block_size: usize,
}

fn matmul_nbits_attrs(args_name: &str, attrs: &crate::kernel::Attributes) -> Result<MatMulNBitsAttrs> {
    let fail = |message: String| Error::KernelFailed { name: args_name.to_string(), message };
    let positive = |name: &str| -> Result<usize> {
        let v = attrs.require_int(name)?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| fail(format!("attribute '{name}' = {v} must be positive")))
    };
    let bits = attrs.require_int("bits")?;
    if bits != 4 {
        return Err(fail(format!("bits = {bits}: dlkern implements bits = 4")));
    }
    let block_size = positive("block_size")?;
    if !super::pack::valid_block_size(block_size) {
        return Err(fail(format!("block_size = {block_size} must be a power of two >= 16")));
    }
    Ok(MatMulNBitsAttrs { k: positive("K")?, n: positive("N")?, block_size })
}

fn infer(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let at = matmul_nbits_attrs(args.function_name, args.attrs)?;
    let a = args
        .inputs
        .first()
        .ok_or_else(|| Error::KernelFailed { name: args.function_name.to_string(), message: "needs input A".into() })?;
    let mut shape = a.shape().to_vec();
    match shape.last_mut() {
        Some(last) => *last = at.n as i64,
        None => shape.push(at.n as i64),
    }
    Ok(vec![TensorSpec { dtype: a.dtype(), shape }])
}

fn compute(args: &KernelArgs) -> Result<()> {
    use super::pack::{MatMulNBitsWeights, ZeroPoints};
    use super::reference::matmul_reference;
    args.expect_count_ranges(3..=6, 1..=1)?;
    let at = matmul_nbits_attrs(args.function_name, args.attrs)?;
    let a = args.input(0, "A")?;
    let b = args.input(1, "B")?;
    let scales = args.input(2, "scales")?;
    let zero_points = optional(args, 3, "zero_points")?;
    let g_idx = optional(args, 4, "g_idx")?;
    let bias = optional(args, 5, "bias")?;
    let y = args.output(0, "Y")?;
    let dtype = a.expect_dtype(&[DType::F32, DType::F16, DType::BF16])?;
    if g_idx.is_some() {
        return Err(Error::invalid("matmul_nbits", "g_idx (deprecated in MatMulNBits) is not supported"));
    }
    let k_blocks = at.k.div_ceil(at.block_size);
    if a.dim(-1) != Some(at.k) {
        return Err(Error::InvalidTensor {
            name: "A".into(),
            message: format!("last dimension of {:?} is not K = {}", a.shape(), at.k),
        });
    }
    b.expect_dtype(&[DType::U8])?;
    b.expect_shape(&[at.n as i64, k_blocks as i64, (at.block_size / 2) as i64])?;
    scales.expect_same_dtype(&a)?;
    if scales.len() != at.n * k_blocks {
        return Err(Error::InvalidTensor {
            name: "scales".into(),
            message: format!("shape {:?} (expected [{}, {k_blocks}])", scales.shape(), at.n),
        });
    }
    let zero_kind = match &zero_points {
        None => ZeroPointKind::Default,
        Some(zp) if zp.dtype() == DType::U8 => {
            if zp.len() != at.n * k_blocks.div_ceil(2) {
                return Err(Error::InvalidTensor {
                    name: "zero_points".into(),
                    message: format!("{} packed bytes (expected [{}, {}])", zp.len(), at.n, k_blocks.div_ceil(2)),
                });
            }
            ZeroPointKind::PackedU8
        }
        Some(zp) => {
            zp.expect_same_dtype(&a)?;
            if zp.len() != at.n * k_blocks {
                return Err(Error::InvalidTensor {
                    name: "zero_points".into(),
                    message: format!("{} values (expected [{}, {k_blocks}])", zp.len(), at.n),
                });
            }
            ZeroPointKind::Typed
        }
    };
    if let Some(bias) = &bias {
        bias.expect_same_dtype(&a)?;
        bias.expect_shape(&[at.n as i64])?;
    }
    y.expect_shape(&with_last(a.shape(), at.n as i64))?;
    y.expect_same_dtype(&a)?;
    for t in [Some(&b), Some(&scales), zero_points.as_ref(), bias.as_ref(), Some(&y)].into_iter().flatten() {
        t.expect_device(a.device())?;
    }
    if let DeviceKind::Cuda(ordinal) = a.device() {
        let tensors = [&a, &b, &scales, &y];
        return cuda(args, ordinal, dtype, &at, tensors, zero_kind, zero_points.as_ref(), bias.as_ref());
    }
    // SAFETY: CPU tensors (checked above), valid for the call by the registry's contract; Y
    // does not alias the inputs (ORT allocates it; C callers are told outputs are distinct
    // buffers).
    unsafe {
        let zero_points = match (&zero_points, zero_kind) {
            (Some(zp), ZeroPointKind::PackedU8) => ZeroPoints::Packed(zp.host_slice::<u8>()?.to_vec()),
            (Some(zp), ZeroPointKind::Typed) => ZeroPoints::Unpacked(floats(zp)?),
            _ => ZeroPoints::Default,
        };
        let w = MatMulNBitsWeights {
            n: at.n,
            k: at.k,
            block_size: at.block_size,
            b: b.host_slice::<u8>()?.to_vec(),
            scales: floats(&scales)?,
            zero_points,
        };
        w.validate()?;
        let bias = match &bias {
            Some(bias) => Some(floats(bias)?.into_iter().map(f64::from).collect::<Vec<f64>>()),
            None => None,
        };
        let a64: Vec<f64> = floats(&a)?.into_iter().map(f64::from).collect();
        let m = a.len() / at.k;
        store(&y, &matmul_reference(&a64, m, &w, bias.as_deref()))
    }
}

/// The GPU path of `dlkern.matmul_nbits` (inputs already checked against the attributes).
#[allow(clippy::too_many_arguments)]
fn cuda(
    args: &KernelArgs,
    ordinal: i32,
    dtype: DType,
    at: &MatMulNBitsAttrs,
    [a, b, scales, y]: [&TensorView; 4],
    zero_kind: ZeroPointKind,
    zero_points: Option<&TensorView>,
    bias: Option<&TensorView>,
) -> Result<()> {
    // The kernel reads every tensor as one dense row-major block.
    for t in [Some(a), Some(b), Some(scales), zero_points, bias, Some(y)].into_iter().flatten() {
        t.expect_contiguous()?;
    }
    let m = a.len() / at.k;
    if m == 0 {
        return Ok(());
    }
    let params = MatMulNBitsParams {
        dtype,
        m,
        n: at.n,
        k: at.k,
        block_size: at.block_size,
        zero_points: zero_kind,
        bias: bias.is_some(),
        variant: None,
        splits: 0,
    };
    let device = Device::get(ordinal.max(0) as usize)?;
    let stream: cudarc::driver::sys::CUstream = args.stream.cast();
    let mut ptrs = MatMulNBitsPointers {
        a: a.data_address(),
        b: b.data_address(),
        scales: scales.data_address(),
        zero_points: zero_points.map_or(0, |z| z.data_address()),
        bias: bias.map_or(0, |b| b.data_address()),
        y: y.data_address(),
        workspace: 0,
    };
    // Held through the launch: the repacked copy cannot be replaced while a launch reads it.
    let mut slot = None;
    let mut params = params;
    let (sms, wgmma) = (device.multiprocessors(), device.has_wgmma());
    let rows = RowAlignment::of(&params, ptrs.a, ptrs.b);
    let mut plan = None;
    if let Some(site) = args.site.filter(|site| repacking_wanted(site, zero_points.is_some())) {
        let packed = MatMulNBitsParams { variant: Some(Variant::Packed), ..params };
        // Only where `Packed` can run (M <= 16, integer zero points, blocks of at least 16,
        // 16-byte rows): it replaces `decode` and, for blocks of 16 to 64, `small`. (The
        // repacked copy's rows are 16-byte aligned as the original's were, which this plan
        // needs: the plan holds for it.)
        if let Ok(packed_plan) = packed.plan_for(sms, wgmma, rows) {
            let mut cache = site.cache();
            // SAFETY: the tensors hold the extents the shape checks relate to the params, on
            // `stream`, a live stream of their device (the registry's contract).
            if let Some(address) = unsafe { repacked_b(&mut cache, &device, stream, &params, &ptrs)? } {
                ptrs.b = address;
                params = packed;
                plan = Some(packed_plan);
                slot = Some(cache);
            }
        }
    }
    let plan = match plan {
        Some(plan) => plan,
        None => params.plan_for(sms, wgmma, rows)?,
    };
    // SAFETY: the registry's caller hands over a live stream of the tensors' device for the
    // duration of the call; the scratch is freed on it before the call returns.
    let workspace = unsafe { crate::runtime::StreamScratch::new(&device, stream, plan.workspace_bytes)? };
    ptrs.workspace = workspace.address();
    // Constant weights were uploaded before the session ran any kernel, and the repacked copy
    // is synchronized after packing: the kernel before this call did not write them.
    let weights = WeightsWritten::at_site(args.site, weight_inputs(zero_points.is_some()));
    // SAFETY: the registry's caller guarantees the tensors' memory for their extents, which the
    // shape checks relate to the parameters (the repacked B holds `packed_bytes`); Y is an
    // output distinct from the inputs; the workspace lives until it is freed in stream order
    // after the kernels.
    let launched = unsafe { matmul_nbits_raw_planned(&device, stream, &plan, &params, &ptrs, weights) };
    drop(slot);
    launched
}

/// Set to `0` to keep `dlkern.matmul_nbits` from repacking constant weights (it then reads the
/// `MatMulNBits` layout at every M, and keeps no copy of B).
pub const REPACK_ENV: &str = "DLKERN_MATMUL_NBITS_REPACK";

/// The inputs that hold the weights: B and scales (1, 2), and the zero points (3) when given.
fn weight_inputs(has_zero_points: bool) -> &'static [usize] {
    if has_zero_points { &[1, 2, 3] } else { &[1, 2] }
}

/// Whether this site's weights are constant and repacking is on (the environment read once per
/// process: not an environment lookup on every call).
fn repacking_wanted(site: &CallSite, has_zero_points: bool) -> bool {
    static REPACKING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    site.are_constant(weight_inputs(has_zero_points))
        && *REPACKING.get_or_init(|| std::env::var_os(REPACK_ENV).is_none_or(|v| v != "0"))
}

/// The inputs a repacked copy was made from: a copy serves a call only if all of them match.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PackSource {
    ordinal: usize,
    b: u64,
    scales: u64,
    zero_points: u64,
    n: usize,
    k: usize,
    block_size: usize,
    zero_kind: ZeroPointKind,
}

/// What `dlkern.matmul_nbits` keeps in a call site: B repacked for `Variant::Packed`, or `None`
/// where the device had no memory for it (the site then keeps reading the `MatMulNBits` layout).
struct RepackedB {
    source: PackSource,
    buffer: Option<DeviceBuffer>,
}

/// The address of B repacked for `Variant::Packed` (`params` without the variant), from the
/// site's slot or, the first time, packed on `stream` into a new buffer kept there; `None`
/// where the device has no memory for the copy.
///
/// # Safety
/// `ptrs` hold the extents `params` describe on `stream`, a live stream of `device`.
unsafe fn repacked_b(
    slot: &mut Option<Box<dyn Any + Send + Sync>>,
    device: &Device,
    stream: CUstream,
    params: &MatMulNBitsParams,
    ptrs: &MatMulNBitsPointers,
) -> Result<Option<u64>> {
    let source = PackSource {
        ordinal: device.ordinal(),
        b: ptrs.b,
        scales: ptrs.scales,
        zero_points: ptrs.zero_points,
        n: params.n,
        k: params.k,
        block_size: params.block_size,
        zero_kind: params.zero_points,
    };
    let cached = slot.as_ref().and_then(|c| c.downcast_ref::<RepackedB>()).filter(|c| c.source == source);
    if let Some(cached) = cached {
        return Ok(cached.buffer.as_ref().map(DeviceBuffer::address));
    }
    // The repacking synchronizes the stream once: refused during a capture before anything is
    // queued (the capture stays valid), as ORT's warm-up run before its capture avoids it.
    // SAFETY: the caller's stream.
    if unsafe { crate::runtime::stream_is_capturing(device, stream)? } {
        return Err(Error::invalid(
            "dlkern.matmul_nbits",
            "the first call at a call site with constant weights repacks them and waits for the \
             stream, which a CUDA graph capture cannot hold: run it once before capturing (docs/ops.md)",
        ));
    }
    // A copy made from other inputs goes first (its memory may be what the new one needs).
    *slot = None;
    let buffer = match DeviceBuffer::new(device, params.packed_bytes()) {
        Ok(buffer) => {
            // SAFETY: the caller's contract for the inputs; the buffer is new, of `packed_bytes`.
            unsafe {
                pack_for_decode_raw(device, stream, params, ptrs.b, ptrs.scales, ptrs.zero_points, buffer.address())?;
                // Complete before any call, on any stream, reads it.
                synchronize_stream(device, stream)?;
            }
            Some(buffer)
        }
        Err(Error::Driver { source, .. }) if source.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => None,
        Err(e) => return Err(e),
    };
    let address = buffer.as_ref().map(DeviceBuffer::address);
    *slot = Some(Box::new(RepackedB { source, buffer }));
    Ok(address)
}
