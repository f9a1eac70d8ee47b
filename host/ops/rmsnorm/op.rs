//! The family's ops: `dlkern.rmsnorm` (ORT op `RMSNorm`), `dlkern.simplified_layer_normalization`
//! (`SimplifiedLayerNormalization`) and `dlkern.skip_simplified_layer_normalization`
//! (`SkipSimplifiedLayerNormalization`): their declarations and registry kernels, the GPU
//! kernels ([`super::launch`]) on CUDA tensors and the reference ([`super::reference`]) on CPU
//! tensors.
//!
//! The two ORT-named ops are drop-ins for ONNX Runtime's own (`SimplifiedLayerNormalization` of
//! the ONNX domain as ORT defines it, `com.microsoft` `SkipSimplifiedLayerNormalization`): the
//! same inputs, outputs, attributes and defaults, the same shape rules and messages, so a node
//! moves to domain `dlkern` unchanged.

use half::{bf16, f16};

use super::launch::{RmsNormParams, SkipRmsNormParams, SkipRmsNormPointers, rmsnorm_raw, skip_rmsnorm_raw_with};
use crate::dlpack::{DEVICE_MASK_CPU, DEVICE_MASK_CUDA, DeviceKind, TensorView};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::kernel::{
    AttrDecl, AttrKind, Attributes, InferArgs, KernelArgs, OpDecl, OrtDecl, TensorDecl, TensorSpec, TensorType,
};
use crate::ops::common::WeightsWritten;
use crate::ops::common::{as_rows, as_rows_from, optional, optional_output, same_as_first_input};
use crate::runtime::Device;

/// RMSNorm's default epsilon (ONNX `SimplifiedLayerNormalization`'s).
pub const RMSNORM_DEFAULT_EPSILON: f64 = 1e-5;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// This family's ops, in the order `docs/ops.md` lists them.
pub static DECLARATIONS: &[&OpDecl] =
    &[&RMSNORM, &SIMPLIFIED_LAYER_NORMALIZATION, &SKIP_SIMPLIFIED_LAYER_NORMALIZATION];

pub static RMSNORM: OpDecl = OpDecl {
    name: "dlkern.rmsnorm",
    inputs: &[
        TensorDecl { name: "X", ty: TensorType::T, optional: false, shape: "`[..., D]`" },
        TensorDecl { name: "scale", ty: TensorType::T, optional: false, shape: "`[D]`" },
    ],
    outputs: &[TensorDecl {
        name: "Y",
        ty: TensorType::T,
        optional: false,
        shape: "as `X` (symbolic dimensions kept)",
    }],
    attrs: &[AttrDecl { name: c"epsilon", kind: AttrKind::Float { default: 1e-5 }, doc: "" }],
    devices: DEVICE_MASK_CPU | DEVICE_MASK_CUDA,
    compute: rmsnorm_compute,
    infer: same_as_first_input,
    ort: Some(OrtDecl { name: c"RMSNorm", cuda: FLOATS, cpu: FLOATS }),
};

fn rmsnorm_compute(args: &KernelArgs) -> Result<()> {
    args.expect_counts(2, 1)?;
    let x = args.input(0, "x")?;
    let weight = args.input(1, "weight")?;
    let y = args.output(0, "y")?;
    let dtype = x.expect_dtype(&[DType::F32, DType::F16, DType::BF16])?;
    weight.expect_same_dtype(&x)?;
    y.expect_same_dtype(&x)?;
    y.expect_shape(x.shape())?;
    let (rows, cols, x_row_stride) = as_rows(&x)?;
    weight.expect_shape(&[cols as i64])?;
    let (_, _, y_row_stride) = as_rows(&y)?;
    let eps = args.attrs.float("epsilon")?.unwrap_or(RMSNORM_DEFAULT_EPSILON);
    for t in [&weight, &y] {
        t.expect_device(x.device())?;
    }
    let params = RmsNormParams { dtype, rows, cols, x_row_stride, y_row_stride, eps: eps as f32 };
    match x.device() {
        DeviceKind::Cuda(ordinal) => {
            let device = Device::get(ordinal.max(0) as usize)?;
            // SAFETY: the registry's caller guarantees the tensors' memory for their extents,
            // which `as_rows` and the shape checks relate to the parameters.
            unsafe {
                rmsnorm_raw(
                    &device,
                    args.stream.cast(),
                    &params,
                    x.data_address(),
                    weight.data_address(),
                    y.data_address(),
                )
            }
        }
        DeviceKind::Cpu => {
            params.plan(x.data_address(), weight.data_address(), y.data_address())?;
            match dtype {
                DType::F32 => rmsnorm_cpu::<f32>(&x, &weight, &y, &params),
                DType::F16 => rmsnorm_cpu::<f16>(&x, &weight, &y, &params),
                _ => rmsnorm_cpu::<bf16>(&x, &weight, &y, &params),
            }
        }
    }
}

fn rmsnorm_cpu<T: Element>(x: &TensorView, weight: &TensorView, y: &TensorView, p: &RmsNormParams) -> Result<()> {
    let (xp, wp, yp) = (x.data_address() as *const T, weight.data_address() as *const T, y.data_address() as *mut T);
    // SAFETY: host memory of the described extents (the registry's caller guarantees it). Rows
    // are copied out before the output row is written, and only raw pointers touch memory, so
    // the exact in-place case the plan allows is sound.
    unsafe {
        let weight: Vec<T> = (0..p.cols).map(|c| wp.add(c).read()).collect();
        for r in 0..p.rows {
            let row: Vec<T> = (0..p.cols).map(|c| xp.add(r * p.x_row_stride + c).read()).collect();
            let normed = super::reference::rmsnorm(&row, &weight, 1, p.cols, p.cols, p.eps as f64);
            for (c, v) in normed.into_iter().enumerate() {
                yp.add(r * p.y_row_stride + c).write(T::from_f64(v));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// SimplifiedLayerNormalization

/// `SimplifiedLayerNormalization`'s default epsilon (ORT's schema).
pub const SIMPLIFIED_LAYER_NORM_DEFAULT_EPSILON: f64 = 1e-5;
/// `SkipSimplifiedLayerNormalization`'s default epsilon (ORT's `kDefaultSkipLayerNormEpsilon`).
pub const SKIP_LAYER_NORM_DEFAULT_EPSILON: f64 = 1e-12;

const STATS_SHAPE: &str = "`[d0, ..., d(axis-1), 1, ..., 1]`";

pub static SIMPLIFIED_LAYER_NORMALIZATION: OpDecl = OpDecl {
    name: "dlkern.simplified_layer_normalization",
    inputs: &[
        TensorDecl { name: "X", ty: TensorType::T, optional: false, shape: "`[d0, ..., d(r-1)]`" },
        TensorDecl {
            name: "scale",
            ty: TensorType::Any("T (ORT's V; dlkern refuses a type other than X's)"),
            optional: false,
            shape: "`X.shape[axis:]`, or a suffix of it (broadcast over the leading normalized axes)",
        },
    ],
    outputs: &[
        TensorDecl { name: "Y", ty: TensorType::T, optional: false, shape: "as `X`" },
        TensorDecl { name: "inv_std_var", ty: TensorType::Fixed(DType::F32), optional: true, shape: STATS_SHAPE },
    ],
    attrs: &[
        AttrDecl {
            name: c"axis",
            kind: AttrKind::OptionalInt { default: "`-1`" },
            doc: "the first normalized axis, in `[-r, r)`: rows are `X.shape[:axis]`, normalized over `X.shape[axis:]`",
        },
        AttrDecl { name: c"epsilon", kind: AttrKind::Float { default: 1e-5 }, doc: "" },
        AttrDecl {
            name: c"stash_type",
            kind: AttrKind::OptionalInt { default: "`1`" },
            doc: "the statistics' type; only `1` (float)",
        },
    ],
    devices: DEVICE_MASK_CPU | DEVICE_MASK_CUDA,
    compute: simplified_compute,
    infer: simplified_infer,
    ort: Some(OrtDecl { name: c"SimplifiedLayerNormalization", cuda: FLOATS, cpu: FLOATS }),
};

/// The attributes of `SimplifiedLayerNormalization` for an `X` of rank `rank`: the first
/// normalized axis (non-negative) and epsilon.
fn simplified_attrs(attrs: &Attributes, rank: usize) -> Result<(usize, f64)> {
    let name = SIMPLIFIED_LAYER_NORMALIZATION.name;
    let fail = |message: String| Error::KernelFailed { name: name.to_string(), message };
    let axis = attrs.int("axis")?.unwrap_or(-1);
    let r = rank as i64;
    if rank == 0 || axis < -r || axis >= r {
        return Err(fail(format!("axis {axis} is not in valid range [{}, {}] for X of rank {rank}", -r, r - 1)));
    }
    let stash_type = attrs.int("stash_type")?.unwrap_or(1);
    if stash_type != 1 {
        return Err(fail(format!(
            "stash_type = {stash_type}: dlkern computes the statistics in float (stash_type 1) only"
        )));
    }
    let eps = attrs.float("epsilon")?.unwrap_or(SIMPLIFIED_LAYER_NORM_DEFAULT_EPSILON);
    Ok((if axis < 0 { axis + r } else { axis } as usize, eps))
}

/// `shape` with the axes from `axis` on set to 1: the statistics' shape.
fn stats_shape(shape: &[i64], axis: usize) -> Vec<i64> {
    shape.iter().enumerate().map(|(a, &d)| if a < axis { d } else { 1 }).collect()
}

fn float_types(name: &str, t: &crate::dlpack::TensorView) -> Result<DType> {
    t.expect_dtype(FLOATS).map_err(|e| Error::KernelFailed { name: name.to_string(), message: e.to_string() })
}

/// dlkern has no kernels of mixed element types: a scale of another type than X (ORT's `V`) is
/// refused rather than computed differently.
fn same_type_as(name: &str, t: &crate::dlpack::TensorView, t_name: &str, x: &crate::dlpack::TensorView) -> Result<()> {
    if t.dtype() == x.dtype() {
        return Ok(());
    }
    Err(Error::KernelFailed {
        name: name.to_string(),
        message: format!(
            "{t_name} is {} but X is {}: dlkern needs them of one type (no mixed-type kernels)",
            t.dtype(),
            x.dtype()
        ),
    })
}

fn simplified_infer(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let name = SIMPLIFIED_LAYER_NORMALIZATION.name;
    let fail = |message: String| Error::KernelFailed { name: name.to_string(), message };
    let [x, scale] = args.inputs else { return Err(fail(format!("needs 2 inputs, got {}", args.inputs.len()))) };
    if args.num_outputs > 2 {
        return Err(fail(format!("has at most 2 outputs, asked for {}", args.num_outputs)));
    }
    let dtype = float_types(name, x)?;
    same_type_as(name, scale, "scale", x)?;
    let (axis, _) = simplified_attrs(args.attrs, x.ndim())?;
    let specs = [
        TensorSpec { dtype, shape: x.shape().to_vec() },
        TensorSpec { dtype: DType::F32, shape: stats_shape(x.shape(), axis) },
    ];
    Ok(specs[..args.num_outputs].to_vec())
}

/// The number of elements of `scale` if it is `X.shape[axis:]` or a suffix of it (leading 1s
/// aside): the broadcast the kernels implement as `gamma[c % scale_len]`.
fn scale_len_for(scale: &crate::dlpack::TensorView, normalized: &[i64]) -> Result<usize> {
    let dims: Vec<i64> = scale.shape().iter().copied().skip_while(|&d| d == 1).collect();
    let fits = dims.len() <= normalized.len() && normalized[normalized.len() - dims.len()..] == dims[..];
    if !fits {
        return Err(Error::InvalidTensor {
            name: scale.name().to_string(),
            message: format!(
                "shape {:?} is neither X.shape[axis:] = {normalized:?} nor a suffix of it (ORT also \
                 broadcasts scale's inner axes; dlkern refuses that)",
                scale.shape()
            ),
        });
    }
    scale.expect_contiguous()?;
    Ok(dims.iter().product::<i64>() as usize)
}

fn simplified_compute(args: &KernelArgs) -> Result<()> {
    let name = SIMPLIFIED_LAYER_NORMALIZATION.name;
    args.expect_count_ranges(2..=2, 1..=2)?;
    let x = args.input(0, "X")?;
    let scale = args.input(1, "scale")?;
    let y = args.output(0, "Y")?;
    let inv = optional_output(args, 1, "inv_std_var")?;
    let dtype = float_types(name, &x)?;
    same_type_as(name, &scale, "scale", &x)?;
    let (axis, eps) = simplified_attrs(args.attrs, x.ndim())?;
    y.expect_same_dtype(&x)?;
    y.expect_shape(x.shape())?;
    let scale_len = scale_len_for(&scale, &x.shape()[axis..])?;
    let (rows, cols, x_row_stride) = as_rows_from(&x, axis)?;
    let (_, _, y_row_stride) = as_rows_from(&y, axis)?;
    if let Some(inv) = &inv {
        inv.expect_dtype(&[DType::F32])?;
        inv.expect_shape(&stats_shape(x.shape(), axis))?;
        inv.expect_contiguous()?;
        inv.expect_device(x.device())?;
    }
    for t in [&scale, &y] {
        t.expect_device(x.device())?;
    }
    let params = SkipRmsNormParams {
        dtype,
        rows,
        cols,
        scale_len,
        skip_rows: 1,
        x_row_stride,
        skip_row_stride: cols,
        y_row_stride,
        sum_row_stride: cols,
        eps: eps as f32,
    };
    let ptrs = SkipRmsNormPointers {
        x: x.data_address(),
        gamma: scale.data_address(),
        y: y.data_address(),
        inv_std_var: inv.as_ref().map_or(0, |t| t.data_address()),
        ..SkipRmsNormPointers::default()
    };
    run_skip(args, x.device(), &params, &ptrs, &[1])
}

// ---------------------------------------------------------------------------------------------
// SkipSimplifiedLayerNormalization

pub static SKIP_SIMPLIFIED_LAYER_NORMALIZATION: OpDecl = OpDecl {
    name: "dlkern.skip_simplified_layer_normalization",
    inputs: &[
        TensorDecl { name: "input", ty: TensorType::T, optional: false, shape: "`[B, S, H]` or `[T, H]`" },
        TensorDecl {
            name: "skip",
            ty: TensorType::T,
            optional: false,
            shape: "as `input`; for a 3-D input also `[b, S, H]` (`b = 1`: broadcast) or `[S, H]`",
        },
        TensorDecl { name: "gamma", ty: TensorType::T, optional: false, shape: "`[H]`" },
        TensorDecl { name: "bias", ty: TensorType::T, optional: true, shape: "`[H]`" },
    ],
    outputs: &[
        TensorDecl { name: "output", ty: TensorType::T, optional: false, shape: "as `input`" },
        TensorDecl {
            name: "mean",
            ty: TensorType::Fixed(DType::F32),
            optional: true,
            shape: "`input.shape[:-1] + [1]`, zeros",
        },
        TensorDecl {
            name: "inv_std_var",
            ty: TensorType::Fixed(DType::F32),
            optional: true,
            shape: "`input.shape[:-1] + [1]`",
        },
        TensorDecl { name: "input_skip_bias_sum", ty: TensorType::T, optional: true, shape: "as `input`" },
    ],
    attrs: &[AttrDecl { name: c"epsilon", kind: AttrKind::Float { default: 1e-12 }, doc: "" }],
    devices: DEVICE_MASK_CPU | DEVICE_MASK_CUDA,
    compute: skip_compute,
    infer: skip_infer,
    ort: Some(OrtDecl { name: c"SkipSimplifiedLayerNormalization", cuda: FLOATS, cpu: FLOATS }),
};

fn skip_infer(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let name = SKIP_SIMPLIFIED_LAYER_NORMALIZATION.name;
    let fail = |message: String| Error::KernelFailed { name: name.to_string(), message };
    let input = args.inputs.first().ok_or_else(|| fail("needs the input".into()))?;
    if args.num_outputs > 4 {
        return Err(fail(format!("has at most 4 outputs, asked for {}", args.num_outputs)));
    }
    let dtype = float_types(name, input)?;
    let rank = input.ndim();
    if rank != 2 && rank != 3 {
        return Err(fail(format!("input is expected to have 3 or 2 dimensions, got {rank}")));
    }
    let stats = crate::ops::common::with_last(input.shape(), 1);
    let specs = [
        TensorSpec { dtype, shape: input.shape().to_vec() },
        TensorSpec { dtype: DType::F32, shape: stats.clone() },
        TensorSpec { dtype: DType::F32, shape: stats },
        TensorSpec { dtype, shape: input.shape().to_vec() },
    ];
    Ok(specs[..args.num_outputs].to_vec())
}

/// ORT's shape rules for `skip` (contrib_ops/cpu/skip_layer_norm_helper.h), with its messages:
/// the rows of `skip`, which the kernels index modulo (row `r` adds skip row `r % skip_rows`).
fn skip_rows_for(input: &crate::dlpack::TensorView, skip: &crate::dlpack::TensorView) -> Result<usize> {
    let fail = |message: String| Error::InvalidTensor { name: skip.name().to_string(), message };
    let (i, s) = (input.shape(), skip.shape());
    if s.len() != 2 && s.len() != 3 {
        return Err(fail(format!("skip is expected to have 3 or 2 dimensions, got {}", s.len())));
    }
    // ORT's condition, as it is: a 2-D skip of one row passes here for a 2-D input and fails the
    // next check unless it equals the input.
    if i != s && (s[0] != 1 || s.len() != 2) && i.len() != 3 {
        return Err(fail(format!(
            "skip is expected to have same shape as input (shape {s:?}, input {i:?}) or, a batch size of 1 or no \
             batch size when input has 3 dimensions"
        )));
    }
    if s[s.len() - 1] != i[i.len() - 1] || s[s.len() - 2] != i[i.len() - 2] {
        return Err(fail(format!("last two dimensions of skip needs to be same as input (skip {s:?}, input {i:?})")));
    }
    Ok(s[..s.len() - 1].iter().product::<i64>() as usize)
}

fn expect_vector(t: &crate::dlpack::TensorView, what: &str, hidden: usize) -> Result<()> {
    let fail = |message: String| Error::InvalidTensor { name: t.name().to_string(), message };
    if t.ndim() != 1 {
        return Err(fail(format!("{what} is expected to have 1 dimension, got {}", t.ndim())));
    }
    if t.shape()[0] as usize != hidden {
        return Err(fail(format!("Last dimension of {what} and input does not match ({} vs {hidden})", t.shape()[0])));
    }
    t.expect_contiguous()
}

fn skip_compute(args: &KernelArgs) -> Result<()> {
    let name = SKIP_SIMPLIFIED_LAYER_NORMALIZATION.name;
    args.expect_count_ranges(3..=4, 1..=4)?;
    let input = args.input(0, "input")?;
    let skip = args.input(1, "skip")?;
    let gamma = args.input(2, "gamma")?;
    let bias = optional(args, 3, "bias")?;
    let y = args.output(0, "output")?;
    let mean = optional_output(args, 1, "mean")?;
    let inv = optional_output(args, 2, "inv_std_var")?;
    let sum = optional_output(args, 3, "input_skip_bias_sum")?;
    let dtype = float_types(name, &input)?;
    let rank = input.ndim();
    if rank != 2 && rank != 3 {
        return Err(Error::InvalidTensor {
            name: input.name().to_string(),
            message: format!("input is expected to have 3 or 2 dimensions, got {rank}"),
        });
    }
    for t in [Some(&skip), Some(&gamma), bias.as_ref(), Some(&y), sum.as_ref()].into_iter().flatten() {
        t.expect_same_dtype(&input)?;
        t.expect_device(input.device())?;
    }
    let skip_rows = skip_rows_for(&input, &skip)?;
    let hidden = input.shape()[rank - 1] as usize;
    expect_vector(&gamma, "gamma", hidden)?;
    if let Some(b) = &bias {
        expect_vector(b, "bias", hidden)?;
    }
    y.expect_shape(input.shape())?;
    let stats = crate::ops::common::with_last(input.shape(), 1);
    for t in [mean.as_ref(), inv.as_ref()].into_iter().flatten() {
        t.expect_dtype(&[DType::F32])?;
        t.expect_shape(&stats)?;
        t.expect_contiguous()?;
        t.expect_device(input.device())?;
    }
    let (rows, cols, x_row_stride) = as_rows(&input)?;
    let (_, _, skip_row_stride) = as_rows(&skip)?;
    let (_, _, y_row_stride) = as_rows(&y)?;
    let sum_row_stride = match &sum {
        Some(s) => {
            s.expect_shape(input.shape())?;
            as_rows(s)?.2
        }
        None => cols,
    };
    let eps = args.attrs.float("epsilon")?.unwrap_or(SKIP_LAYER_NORM_DEFAULT_EPSILON);
    let params = SkipRmsNormParams {
        dtype,
        rows,
        cols,
        scale_len: cols,
        skip_rows,
        x_row_stride,
        skip_row_stride,
        y_row_stride,
        sum_row_stride,
        eps: eps as f32,
    };
    let address = |t: Option<&crate::dlpack::TensorView>| t.map_or(0, |t| t.data_address());
    let ptrs = SkipRmsNormPointers {
        x: input.data_address(),
        skip: skip.data_address(),
        gamma: gamma.data_address(),
        bias: address(bias.as_ref()),
        y: y.data_address(),
        sum: address(sum.as_ref()),
        mean: address(mean.as_ref()),
        inv_std_var: address(inv.as_ref()),
    };
    run_skip(args, input.device(), &params, &ptrs, if bias.is_some() { &[2, 3] } else { &[2] })
}

/// The fused kernel on CUDA tensors, the reference on CPU ones. `scale_inputs`: the indices of
/// the call's scale (and bias) among its inputs.
fn run_skip(
    args: &KernelArgs,
    device: DeviceKind,
    params: &SkipRmsNormParams,
    ptrs: &SkipRmsNormPointers,
    scale_inputs: &[usize],
) -> Result<()> {
    match device {
        DeviceKind::Cuda(ordinal) => {
            let device = Device::get(ordinal.max(0) as usize)?;
            let constants = WeightsWritten::at_site(args.site, scale_inputs);
            // SAFETY: the registry's caller guarantees the tensors' memory for their extents,
            // which the shape checks and `as_rows` relate to the parameters; the site vouches
            // for its constant inputs.
            unsafe { skip_rmsnorm_raw_with(&device, args.stream.cast(), params, ptrs, constants) }
        }
        DeviceKind::Cpu => {
            if params.plan(ptrs)?.is_none() {
                return Ok(());
            }
            // SAFETY: as above, host memory; the plan checked the in-place rules.
            unsafe {
                match params.dtype {
                    DType::F32 => skip_cpu::<f32>(params, ptrs),
                    DType::F16 => skip_cpu::<f16>(params, ptrs),
                    _ => skip_cpu::<bf16>(params, ptrs),
                }
            }
            Ok(())
        }
    }
}

/// The reference over strided host rows.
///
/// # Safety
/// Host memory of the extents `p` describes at the addresses `ptrs` holds, which
/// [`SkipRmsNormParams::plan`] accepted. Each row's inputs are copied out before its outputs
/// are written, and only raw pointers touch memory, so the exact in-place cases it allows are
/// sound.
unsafe fn skip_cpu<T: Element>(p: &SkipRmsNormParams, ptrs: &SkipRmsNormPointers) {
    let read = |addr: u64, offset: usize, n: usize| -> Vec<T> {
        // SAFETY: the caller's contract.
        (0..n).map(|i| unsafe { (addr as *const T).add(offset + i).read() }).collect()
    };
    let gamma = read(ptrs.gamma, 0, p.scale_len);
    let bias = (ptrs.bias != 0).then(|| read(ptrs.bias, 0, p.cols));
    for r in 0..p.rows {
        let x = read(ptrs.x, r * p.x_row_stride, p.cols);
        let skip = (ptrs.skip != 0).then(|| read(ptrs.skip, (r % p.skip_rows.max(1)) * p.skip_row_stride, p.cols));
        let out =
            super::reference::skip_rmsnorm(&x, skip.as_deref(), &gamma, bias.as_deref(), 1, p.cols, 1, p.eps as f64);
        // SAFETY: the caller's contract.
        unsafe {
            for (c, v) in out.y.iter().enumerate() {
                (ptrs.y as *mut T).add(r * p.y_row_stride + c).write(T::from_f64(*v));
            }
            if ptrs.sum != 0 {
                for (c, v) in out.sum.iter().enumerate() {
                    (ptrs.sum as *mut T).add(r * p.sum_row_stride + c).write(*v);
                }
            }
            if ptrs.mean != 0 {
                (ptrs.mean as *mut f32).add(r).write(0.0);
            }
            if ptrs.inv_std_var != 0 {
                (ptrs.inv_std_var as *mut f32).add(r).write(out.inv_std_var[0] as f32);
            }
        }
    }
}
