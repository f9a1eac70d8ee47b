//! dlkern's own kernels in the registry, under stable names. Each accepts CUDA tensors (the GPU
//! kernel on the caller's stream) and CPU tensors (the CPU reference), so every consumer of the
//! registry, ONNX Runtime's CPU execution provider included, can run them anywhere.
//!
//! | name | inputs | outputs | attributes |
//! | --- | --- | --- | --- |
//! | `dlkern.rmsnorm` | `x [..., D]` f32/f16/bf16, `weight [D]` same dtype | `y`, as `x` | `epsilon` (float, default 1e-5) |

use half::{bf16, f16};

use super::{InferArgs, KernelArgs, KernelDef, TensorSpec};
use crate::dlpack::{DEVICE_MASK_CPU, DEVICE_MASK_CUDA, DeviceKind, TensorView};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::launch::rmsnorm::{RmsNormParams, rmsnorm_raw};
use crate::runtime::Device;

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
    ]
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
