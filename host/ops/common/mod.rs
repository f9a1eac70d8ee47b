//! Pieces every op family shares: reading a call's tensors (optional inputs, float values on
//! the CPU, rows of a strided tensor) and the launchers' pointer checks ([`checks`]).

pub mod checks;
pub mod rotary;

use half::{bf16, f16};

use crate::dlpack::TensorView;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernel::{CallSite, InferArgs, KernelArgs, TensorSpec};

/// Who may have written a call's constant inputs last: `MatMulNBits`' B, scales and zero points,
/// a norm's scale and bias.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightsWritten {
    /// Possibly the kernel just before the call on the stream (for example
    /// `matmul_nbits::launch::pack_for_decode_raw` without a synchronization after it): the call
    /// reads them only once that kernel has completed.
    #[default]
    ByPreviousKernel,
    /// They were in place when the kernel just before the call on the stream started,
    /// and that kernel does not write them (a model's constants, uploaded or packed and
    /// synchronized earlier). On Hopper the kernels then read them while that kernel finishes
    /// (programmatic dependent launch): the W4 decode kernels their first chunks of weights,
    /// which hides their start-up latency in a chain of launches
    /// (docs/perf-notes/matmul_nbits.md, v21), the fused norms their scale and bias.
    Before,
}

impl WeightsWritten {
    /// `Before` where the call's site marks every one of `inputs` constant (an ONNX node's
    /// initializers, uploaded before the session ran any kernel), else `ByPreviousKernel`.
    pub fn at_site(site: Option<&CallSite>, inputs: &[usize]) -> Self {
        if site.is_some_and(|site| site.are_constant(inputs)) {
            WeightsWritten::Before
        } else {
            WeightsWritten::ByPreviousKernel
        }
    }
}

/// A kernel's error about its call (a bad shape, attribute or value), named after the kernel.
pub(crate) fn fail(name: &str, message: String) -> Error {
    Error::KernelFailed { name: name.to_string(), message }
}

/// A tensor's dimensions as sizes (negative ones, which validation refuses, as 0).
pub(crate) fn dims(t: &TensorView) -> Vec<usize> {
    t.shape().iter().map(|&d| d.max(0) as usize).collect()
}

/// `x` rounded to what a tensor of `dtype` stores (f32, f16, bf16; other types pass `x` on):
/// the precision ORT keeps rotated heads and caches in, for the references.
pub(crate) fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(x).to_f64(),
        DType::BF16 => bf16::from_f64(x).to_f64(),
        DType::F32 => x as f32 as f64,
        _ => x,
    }
}

/// An optional input: `None` when absent (missing or 0 elements).
pub(crate) fn optional<'a>(args: &'a KernelArgs, i: usize, name: &'a str) -> Result<Option<TensorView<'a>>> {
    if i >= args.num_inputs() {
        return Ok(None);
    }
    let t = args.input(i, name)?;
    Ok(if t.is_empty() { None } else { Some(t) })
}

/// An optional output: `None` when absent (not passed, or 0 elements: how ORT's omitted outputs
/// and the registry's placeholders arrive).
pub(crate) fn optional_output<'a>(args: &'a KernelArgs, i: usize, name: &'a str) -> Result<Option<TensorView<'a>>> {
    if i >= args.num_outputs() {
        return Ok(None);
    }
    let t = args.output(i, name)?;
    Ok(if t.is_empty() { None } else { Some(t) })
}

/// Most heads an attention op takes (a grid dimension holds 65535 blocks): attribute values past
/// it are refused before any size is computed from them.
pub(crate) const MAX_HEADS: usize = 65535;

/// A head-count attribute's value, which must lie in `1..=MAX_HEADS`.
pub(crate) fn head_count(name: &str, attr: &str, value: i64) -> Result<usize> {
    usize::try_from(value)
        .ok()
        .filter(|&v| (1..=MAX_HEADS).contains(&v))
        .ok_or_else(|| fail(name, format!("attribute '{attr}' = {value} must be in 1..={MAX_HEADS}")))
}

/// `shape` with its last dimension replaced by `n`.
pub(crate) fn with_last(shape: &[i64], n: i64) -> Vec<i64> {
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
pub(crate) unsafe fn floats(t: &TensorView) -> Result<Vec<f32>> {
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
pub(crate) unsafe fn store(t: &TensorView, values: &[f64]) -> Result<()> {
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

pub(crate) fn same_as_first_input(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let x = args.inputs.first().ok_or_else(|| Error::KernelFailed {
        name: args.function_name.to_string(),
        message: "needs at least one input".into(),
    })?;
    Ok(vec![TensorSpec { dtype: x.dtype(), shape: x.shape().to_vec() }])
}

/// Rows, row length and row stride of a tensor whose last axis is contiguous and whose leading
/// axes collapse into one uniformly strided row axis.
pub(crate) fn as_rows(t: &TensorView) -> Result<(usize, usize, usize)> {
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

/// Rows, row length and row stride of a tensor seen as `[prod(shape[..axis]), prod(shape[axis..])]`:
/// the axes from `axis` on must be contiguous (row-major among themselves) and the leading axes
/// must collapse into one uniformly strided row axis. `axis == rank - 1` is [`as_rows`].
pub(crate) fn as_rows_from(t: &TensorView, axis: usize) -> Result<(usize, usize, usize)> {
    t.expect_rank(1, crate::dlpack::MAX_NDIM)?;
    let shape = t.shape();
    let strides = t.strides();
    let n = shape.len();
    let invalid = |why: &str| Error::InvalidTensor {
        name: t.name().to_string(),
        message: format!("{why}: shape {shape:?}, strides {strides:?}"),
    };
    if axis >= n {
        return Err(invalid(&format!("axis {axis} is out of range")));
    }
    let mut inner = 1i64; // elements of the axes inside the current one
    for a in (axis..n).rev() {
        if shape[a] != 1 && strides[a] != inner {
            return Err(invalid(&format!("the axes from {axis} on must be contiguous")));
        }
        inner *= shape[a];
    }
    let cols = inner as usize;
    let rows = shape[..axis].iter().product::<i64>() as usize;
    let mut row_stride: Option<i64> = None;
    let mut span = 0i64;
    for a in (0..axis).rev() {
        if shape[a] == 1 {
            continue;
        }
        match row_stride {
            None => {
                row_stride = Some(strides[a]);
                span = strides[a] * shape[a];
            }
            Some(_) if strides[a] == span => span *= shape[a],
            Some(_) => return Err(invalid("the leading axes must collapse into evenly strided rows")),
        }
    }
    let row_stride = row_stride.unwrap_or(cols as i64) as usize;
    if rows > 1 && row_stride < cols {
        return Err(invalid("rows overlap"));
    }
    Ok((rows, cols, row_stride))
}
