//! dlkern's own kernels in the registry, under stable names. Each accepts CUDA tensors (the GPU
//! kernel on the caller's stream) and CPU tensors (the CPU reference), so every consumer of the
//! registry, ONNX Runtime's CPU execution provider included, can run them anywhere.
//!
//! | name | inputs | outputs | attributes |
//! | --- | --- | --- | --- |
//! | `dlkern.rmsnorm` | `x [..., D]` f32/f16/bf16, `weight [D]` same dtype | `y`, as `x` | `epsilon` (float, default 1e-5) |
//! | `dlkern.matmul_nbits` | `MatMulNBits`' inputs: `A [..., K]`, `B` u8 `[N, k_blocks, block_size/2]`, `scales [N, k_blocks]`, optional `zero_points`, `g_idx` (unsupported), `bias [N]`; an absent optional input is a 0-element tensor | `Y [..., N]`, A's type | `K`, `N`, `bits` (4), `block_size` (ints) |
//!
//! | `dlkern.quantize_per_token` | `x [..., K]` f32/f16/bf16 | `q` i8 `[..., K]`, `scales` f32 `[rows]` | |
//! | `dlkern.matmul_w8a8` | `a_q` i8 `[..., K]`, `a_scale` f32 `[rows]` or `[1]`, `w_q` i8 `[N, K]` (or packed, see `w_layout`), `w_scale` f32 `[N]`, optional `bias` f32 `[N]` | `y [..., N]` | `out_dtype` ("f16", "bf16", "f32"; default "f16"); `w_layout` ("nk", default; "decode_packed": `w_q` from `quant::w8::pack_for_decode`, `[ceil(N/16)*16, ceil(K/64)*64]`, for M <= 16 only on the GPU, about 5% faster at M = 16 on the H200) |
//! | `dlkern.attention`, `dlkern.attention_lse` | `q`, `k`, `v` (`[B, S, H, D]`, or `[total, H, D]` with `cu_seqlens_q`/`cu_seqlens_k` i32 `[B + 1]`) | `out` like `q`; `_lse` also `lse` f32 | `causal`, `scale`, `softcap`, `window_left` (see `builtin/attention.rs`) |
//! | `dlkern.matmul_integer_to_float` | `com.microsoft` `MatMulIntegerToFloat`'s inputs (int8 A `[..., K]` and B `[K, N]`) | `Y [..., N]`, the scales' type | |
//!
//! `dlkern.matmul_nbits` runs on CUDA tensors (f16/bf16; the tensor-core kernels of
//! `launch::matmul_nbits`) and CPU tensors (f32/f16/bf16, the reference). `quantize_per_token`
//! and `matmul_w8a8` run on CUDA tensors (`launch::matmul_w8a8`) and CPU tensors;
//! `matmul_integer_to_float` on CPU tensors only.

mod attention;
mod int8;
mod nbits;

use half::{bf16, f16};

use super::{InferArgs, KernelArgs, KernelDef, TensorSpec};
use crate::dlpack::{DEVICE_MASK_CPU, DEVICE_MASK_CUDA, DeviceKind, TensorView};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::launch::rmsnorm::{RmsNormParams, rmsnorm_raw};
use crate::runtime::Device;

/// Registry name of the W4A16 matmul in `MatMulNBits` format.
pub const MATMUL_NBITS: &str = "dlkern.matmul_nbits";
/// Registry names of the W8A8 pieces.
pub const QUANTIZE_PER_TOKEN: &str = "dlkern.quantize_per_token";
pub const MATMUL_W8A8: &str = "dlkern.matmul_w8a8";
pub const MATMUL_INTEGER_TO_FLOAT: &str = "dlkern.matmul_integer_to_float";
/// Registry names of attention (prefill): the output, and the output with the row log-sum-exp.
pub const ATTENTION: &str = "dlkern.attention";
pub const ATTENTION_LSE: &str = "dlkern.attention_lse";
/// Registry name of RMSNorm.
pub const RMSNORM: &str = "dlkern.rmsnorm";
/// RMSNorm's default epsilon (ONNX `SimplifiedLayerNormalization`'s).
pub const RMSNORM_DEFAULT_EPSILON: f64 = 1e-5;

/// The built-in kernel definitions.
pub fn definitions() -> Vec<KernelDef> {
    vec![
        KernelDef::rust(RMSNORM, DEVICE_MASK_CPU | DEVICE_MASK_CUDA, rmsnorm_compute)
            .with_infer(same_as_first_input)
            .with_outputs(1),
        KernelDef::rust(MATMUL_NBITS, DEVICE_MASK_CPU | DEVICE_MASK_CUDA, nbits::compute)
            .with_infer(nbits::infer)
            .with_outputs(1),
        KernelDef::rust(QUANTIZE_PER_TOKEN, DEVICE_MASK_CPU | DEVICE_MASK_CUDA, int8::quantize_compute)
            .with_infer(int8::quantize_infer)
            .with_outputs(2),
        KernelDef::rust(MATMUL_W8A8, DEVICE_MASK_CPU | DEVICE_MASK_CUDA, int8::w8a8_compute)
            .with_infer(int8::w8a8_infer)
            .with_outputs(1),
        KernelDef::rust(MATMUL_INTEGER_TO_FLOAT, DEVICE_MASK_CPU, int8::itf_compute)
            .with_infer(int8::itf_infer)
            .with_outputs(1),
        KernelDef::rust(ATTENTION, DEVICE_MASK_CPU | DEVICE_MASK_CUDA, attention::compute)
            .with_infer(attention::infer)
            .with_outputs(1),
        KernelDef::rust(ATTENTION_LSE, DEVICE_MASK_CPU | DEVICE_MASK_CUDA, attention::compute)
            .with_infer(attention::infer)
            .with_outputs(2),
    ]
}

/// An optional input: `None` when absent (missing or 0 elements).
pub(super) fn optional<'a>(args: &'a KernelArgs, i: usize, name: &'a str) -> Result<Option<TensorView<'a>>> {
    if i >= args.num_inputs() {
        return Ok(None);
    }
    let t = args.input(i, name)?;
    Ok(if t.is_empty() { None } else { Some(t) })
}

/// `shape` with its last dimension replaced by `n`.
pub(super) fn with_last(shape: &[i64], n: i64) -> Vec<i64> {
    let mut out = shape.to_vec();
    if let Some(last) = out.last_mut() {
        *last = n;
    }
    out
}

/// f32 values of a CPU float tensor.
///
/// # Safety
/// A CPU tensor valid for the call (the registry's contract).
pub(super) unsafe fn floats(t: &TensorView) -> Result<Vec<f32>> {
    // SAFETY: forwarded.
    unsafe {
        Ok(match t.dtype() {
            DType::F32 => t.host_slice::<f32>()?.to_vec(),
            DType::F16 => t.host_slice::<f16>()?.iter().map(|v| v.to_f32()).collect(),
            DType::BF16 => t.host_slice::<bf16>()?.iter().map(|v| v.to_f32()).collect(),
            other => {
                return Err(Error::InvalidTensor {
                    name: t.name().into(),
                    message: format!("dtype {other} (expected a float)"),
                });
            }
        })
    }
}

/// Writes `values` into a CPU float tensor of matching length.
///
/// # Safety
/// As [`floats`], and the tensor writable and unaliased.
pub(super) unsafe fn store(t: &TensorView, values: &[f64]) -> Result<()> {
    // SAFETY: forwarded.
    unsafe {
        match t.dtype() {
            DType::F32 => t.host_slice_mut::<f32>()?.iter_mut().zip(values).for_each(|(o, v)| *o = *v as f32),
            DType::F16 => t.host_slice_mut::<f16>()?.iter_mut().zip(values).for_each(|(o, v)| *o = f16::from_f64(*v)),
            DType::BF16 => {
                t.host_slice_mut::<bf16>()?.iter_mut().zip(values).for_each(|(o, v)| *o = bf16::from_f64(*v))
            }
            other => {
                return Err(Error::InvalidTensor {
                    name: t.name().into(),
                    message: format!("dtype {other} (expected a float)"),
                });
            }
        }
    }
    Ok(())
}

fn same_as_first_input(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let x = args.inputs.first().ok_or_else(|| Error::KernelFailed {
        name: args.function_name.to_string(),
        message: "needs at least one input".into(),
    })?;
    Ok(vec![TensorSpec { dtype: x.dtype(), shape: x.shape().to_vec() }])
}

/// Rows, row length and row stride of a tensor whose last axis is contiguous and whose leading
/// axes collapse into one uniformly strided row axis.
fn as_rows(t: &TensorView) -> Result<(usize, usize, usize)> {
    t.expect_rank(1, crate::dlpack::MAX_NDIM)?;
    let shape = t.shape();
    let strides = t.strides();
    let n = shape.len();
    let cols = shape[n - 1] as usize;
    let rows = shape[..n - 1].iter().product::<i64>() as usize;
    let invalid = |why: &str| Error::InvalidTensor {
        name: t.name().to_string(),
        message: format!("{why}: shape {shape:?}, strides {strides:?}"),
    };
    if cols > 1 && strides[n - 1] != 1 {
        return Err(invalid("the last axis must be contiguous"));
    }
    // Walk the leading axes from the innermost: each must step over exactly the axis inside it.
    let mut row_stride: Option<i64> = None;
    let mut span = 0i64; // elements covered by one step of the axis inside
    for axis in (0..n - 1).rev() {
        if shape[axis] == 1 {
            continue;
        }
        match row_stride {
            None => {
                row_stride = Some(strides[axis]);
                span = strides[axis] * shape[axis];
            }
            Some(_) if strides[axis] == span => span *= shape[axis],
            Some(_) => return Err(invalid("the leading axes must collapse into evenly strided rows")),
        }
    }
    let row_stride = row_stride.unwrap_or(cols as i64) as usize;
    if rows > 1 && row_stride < cols {
        return Err(invalid("rows overlap"));
    }
    Ok((rows, cols, row_stride))
}

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
            let normed = crate::reference::rmsnorm::rmsnorm(&row, &weight, 1, p.cols, p.cols, p.eps as f64);
            for (c, v) in normed.into_iter().enumerate() {
                yp.add(r * p.y_row_stride + c).write(T::from_f64(v));
            }
        }
    }
    Ok(())
}
