//! `dlkern.rmsnorm` (ORT op `RMSNorm`): its declaration and its registry kernel, the GPU kernel
//! ([`super::launch`]) on CUDA tensors and the reference ([`super::reference`]) on CPU tensors.

use half::{bf16, f16};

use super::launch::{RmsNormParams, rmsnorm_raw};
use crate::dlpack::{DEVICE_MASK_CPU, DEVICE_MASK_CUDA, DeviceKind, TensorView};
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::kernel::{AttrDecl, AttrKind, KernelArgs, OpDecl, OrtDecl, TensorDecl, TensorType};
use crate::ops::common::{as_rows, same_as_first_input};
use crate::runtime::Device;

/// RMSNorm's default epsilon (ONNX `SimplifiedLayerNormalization`'s).
pub const RMSNORM_DEFAULT_EPSILON: f64 = 1e-5;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// This family's ops, in the order `docs/ops.md` lists them.
pub static DECLARATIONS: &[&OpDecl] = &[&RMSNORM];

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
