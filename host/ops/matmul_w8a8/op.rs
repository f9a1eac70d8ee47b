//! The int8 (W8A8) ops: per-token quantization and the W8A8 matmul (GPU kernels on CUDA
//! tensors, the exact references on CPU tensors), and `com.microsoft` `MatMulIntegerToFloat`
//! with int8 inputs (CPU only).

use super::pack;
use crate::dlpack::{DEVICE_MASK_CPU, DEVICE_MASK_CUDA, DeviceKind, TensorView};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernel::{AttrDecl, AttrKind, InferArgs, KernelArgs, OpDecl, OrtDecl, TensorDecl, TensorSpec, TensorType};
use crate::ops::common::{fail, floats, optional, store, with_last};

const FLOAT_TYPES: TensorType = TensorType::Any("`float`, `float16`, `bfloat16`");
const I8: TensorType = TensorType::Fixed(DType::I8);
const F32: TensorType = TensorType::Fixed(DType::F32);

/// This family's ops, in the order `docs/ops.md` lists them.
pub static DECLARATIONS: &[&OpDecl] = &[&QUANTIZE_PER_TOKEN, &MATMUL_W8A8, &MATMUL_INTEGER_TO_FLOAT];

pub static QUANTIZE_PER_TOKEN: OpDecl = OpDecl {
    name: "dlkern.quantize_per_token",
    inputs: &[TensorDecl { name: "x", ty: FLOAT_TYPES, optional: false, shape: "`[..., K]`" }],
    outputs: &[
        TensorDecl { name: "q", ty: I8, optional: false, shape: "`[..., K]`" },
        TensorDecl { name: "scales", ty: F32, optional: false, shape: "`[rows]`" },
    ],
    attrs: &[],
    devices: DEVICE_MASK_CPU | DEVICE_MASK_CUDA,
    compute: quantize_compute,
    infer: quantize_infer,
    ort: None,
};

pub static MATMUL_W8A8: OpDecl = OpDecl {
    name: "dlkern.matmul_w8a8",
    inputs: &[
        TensorDecl { name: "a_q", ty: I8, optional: false, shape: "`[..., K]`" },
        TensorDecl { name: "a_scale", ty: F32, optional: false, shape: "`[rows]` or `[1]`" },
        TensorDecl { name: "w_q", ty: I8, optional: false, shape: "`[N, K]`, or packed (see `w_layout`)" },
        TensorDecl { name: "w_scale", ty: F32, optional: false, shape: "`[N]`" },
        TensorDecl { name: "bias", ty: F32, optional: true, shape: "`[N]`" },
    ],
    outputs: &[TensorDecl {
        name: "y",
        ty: TensorType::Any("`float16`, `bfloat16` or `float`, as `out_dtype`"),
        optional: false,
        shape: "`[..., N]`",
    }],
    attrs: &[
        AttrDecl {
            name: c"out_dtype",
            kind: AttrKind::OptionalString { default: "`\"f16\"`" },
            doc: "`f16`, `bf16` or `f32`",
        },
        AttrDecl {
            name: c"w_layout",
            kind: AttrKind::OptionalString { default: "`\"nk\"`" },
            doc: "`nk`, or `decode_packed`: `w_q` from `pack_for_decode`, `[ceil(N/16)*16, ceil(K/64)*64]`, for M <= 16 on the GPU",
        },
    ],
    devices: DEVICE_MASK_CPU | DEVICE_MASK_CUDA,
    compute: w8a8_compute,
    infer: w8a8_infer,
    ort: None,
};

pub static MATMUL_INTEGER_TO_FLOAT: OpDecl = OpDecl {
    name: "dlkern.matmul_integer_to_float",
    inputs: &[
        TensorDecl { name: "A", ty: I8, optional: false, shape: "`[..., K]`" },
        TensorDecl { name: "B", ty: I8, optional: false, shape: "`[K, N]`" },
        TensorDecl { name: "a_scale", ty: TensorType::T, optional: false, shape: "`[1]` or `[K]`" },
        TensorDecl { name: "b_scale", ty: TensorType::T, optional: false, shape: "`[1]` or `[N]`" },
        TensorDecl { name: "a_zero_point", ty: I8, optional: true, shape: "`[1]` or `[K]`" },
        TensorDecl { name: "b_zero_point", ty: I8, optional: true, shape: "`[1]` or `[N]`" },
        TensorDecl { name: "bias", ty: TensorType::T, optional: true, shape: "`[N]`" },
    ],
    outputs: &[TensorDecl { name: "Y", ty: TensorType::T, optional: false, shape: "`[..., N]`" }],
    attrs: &[],
    devices: DEVICE_MASK_CPU,
    compute: itf_compute,
    infer: itf_infer,
    // No GPU kernel: its `B [K, N]` with zero points does not fit the int8 tensor-core kernels.
    ort: Some(OrtDecl { name: c"MatMulIntegerToFloat", cuda: &[], cpu: &[DType::F32, DType::F16] }),
};

/// Leading dimensions (rows) and last dimension of a rank >= 1 tensor shape.
fn rows_cols(shape: &[i64]) -> (usize, usize) {
    let cols = shape.last().copied().unwrap_or(1) as usize;
    (shape[..shape.len().saturating_sub(1)].iter().product::<i64>() as usize, cols)
}

fn quantize_infer(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let x = args.inputs.first().ok_or_else(|| fail(args.function_name, "needs input x".into()))?;
    let (rows, _) = rows_cols(x.shape());
    Ok(vec![
        TensorSpec { dtype: DType::I8, shape: x.shape().to_vec() },
        TensorSpec { dtype: DType::F32, shape: vec![rows as i64] },
    ])
}

fn quantize_compute(args: &KernelArgs) -> Result<()> {
    args.expect_counts(1, 2)?;
    let x = args.input(0, "x")?;
    x.expect_rank(1, crate::dlpack::MAX_NDIM)?;
    let dtype = x.expect_dtype(&[DType::F32, DType::F16, DType::BF16])?;
    let (rows, cols) = rows_cols(x.shape());
    let q = args.output(0, "q")?;
    let scales = args.output(1, "scales")?;
    q.expect_shape(x.shape())?;
    q.expect_dtype(&[DType::I8])?;
    scales.expect_shape(&[rows as i64])?;
    scales.expect_dtype(&[DType::F32])?;
    for t in [&x, &q, &scales] {
        t.expect_device(x.device())?;
        t.expect_contiguous()?;
    }
    if let DeviceKind::Cuda(ordinal) = x.device() {
        let device = crate::runtime::Device::get(ordinal.max(0) as usize)?;
        // SAFETY: the registry's caller guarantees the tensors (shapes checked above); the
        // outputs are distinct buffers.
        return unsafe {
            crate::ops::matmul_w8a8::launch::quantize_per_token_raw(
                &device,
                args.stream.cast(),
                dtype,
                rows,
                cols,
                x.data_address(),
                q.data_address(),
                scales.data_address(),
            )
        };
    }
    // SAFETY: CPU tensors valid for the call; outputs are distinct buffers.
    unsafe {
        let (codes, s) = pack::quantize_rows(&floats(&x)?, rows, cols)?;
        q.host_slice_mut::<i8>()?.copy_from_slice(&codes);
        scales.host_slice_mut::<f32>()?.copy_from_slice(&s);
    }
    Ok(())
}

fn out_dtype(name: &str, attrs: &crate::kernel::Attributes) -> Result<DType> {
    match attrs.string("out_dtype")?.unwrap_or("f16") {
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        "f32" => Ok(DType::F32),
        other => Err(fail(name, format!("out_dtype '{other}' (expected f16, bf16 or f32)"))),
    }
}

/// `w_q`'s layout (attribute `w_layout`): `"nk"` (default), `[N, K]` row-major; or
/// `"decode_packed"`, the decode kernel's tiles (`super::pack::pack_for_decode`, shape
/// `packed_decode_shape(N, K)`), N then given by `w_scale`.
fn w_packed(name: &str, attrs: &crate::kernel::Attributes) -> Result<bool> {
    match attrs.string("w_layout")?.unwrap_or("nk") {
        "nk" => Ok(false),
        "decode_packed" => Ok(true),
        other => Err(fail(name, format!("w_layout '{other}' (expected nk or decode_packed)"))),
    }
}

fn w8a8_infer(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let (a, w, w_scale) = match args.inputs {
        [a, _, w, w_scale, ..] => (a, w, w_scale),
        _ => return Err(fail(args.function_name, "needs a_q, a_scale, w_q, w_scale".into())),
    };
    let n_of = if w_packed(args.function_name, args.attrs)? { w_scale } else { w };
    let n = n_of.shape().first().copied().unwrap_or(0);
    Ok(vec![TensorSpec { dtype: out_dtype(args.function_name, args.attrs)?, shape: with_last(a.shape(), n) }])
}

fn w8a8_compute(args: &KernelArgs) -> Result<()> {
    let name = args.function_name;
    args.expect_count_ranges(4..=5, 1..=1)?;
    let a = args.input(0, "a_q")?;
    let a_scale = args.input(1, "a_scale")?;
    let w = args.input(2, "w_q")?;
    let w_scale = args.input(3, "w_scale")?;
    let bias = optional(args, 4, "bias")?;
    let y = args.output(0, "y")?;
    for t in [&a, &w] {
        t.expect_dtype(&[DType::I8])?;
    }
    a.expect_rank(1, crate::dlpack::MAX_NDIM)?;
    w.expect_rank(2, 2)?;
    w_scale.expect_rank(1, 1)?;
    let packed = w_packed(name, args.attrs)?;
    let (m, k) = rows_cols(a.shape());
    let n = if packed { w_scale.shape()[0] } else { w.shape()[0] } as usize;
    let (w_shape, layout) =
        if packed { (pack::packed_decode_shape(n, k), "decode_packed") } else { ([n, k], "[N, K]") };
    if w.shape() != [w_shape[0] as i64, w_shape[1] as i64] {
        return Err(Error::InvalidTensor {
            name: "w_q".into(),
            message: format!("shape {:?} (expected {w_shape:?}: {layout} for N = {n}, K = {k})", w.shape()),
        });
    }
    if k > pack::MAX_K_I32 {
        return Err(fail(name, format!("K = {k} exceeds {} (int32 accumulation could overflow)", pack::MAX_K_I32)));
    }
    a_scale.expect_dtype(&[DType::F32])?;
    if a_scale.len() != m && a_scale.len() != 1 {
        return Err(Error::InvalidTensor {
            name: "a_scale".into(),
            message: format!("{} scales for {m} rows (expected {m} or 1)", a_scale.len()),
        });
    }
    w_scale.expect_dtype(&[DType::F32])?;
    w_scale.expect_shape(&[n as i64])?;
    y.expect_shape(&with_last(a.shape(), n as i64))?;
    let want = out_dtype(name, args.attrs)?;
    if y.dtype() != want {
        return Err(Error::InvalidTensor {
            name: "y".into(),
            message: format!("dtype {} (out_dtype says {want})", y.dtype()),
        });
    }
    if let Some(b) = &bias {
        b.expect_dtype(&[DType::F32])?;
        b.expect_shape(&[n as i64])?;
    }
    for t in [Some(&a_scale), Some(&w), Some(&w_scale), bias.as_ref(), Some(&y)].into_iter().flatten() {
        t.expect_device(a.device())?;
        t.expect_contiguous()?;
    }
    a.expect_contiguous()?;
    if let DeviceKind::Cuda(ordinal) = a.device() {
        use crate::ops::matmul_w8a8::launch::{MatMulW8A8Params, MatMulW8A8Pointers, matmul_w8a8_raw};
        if m == 0 {
            return Ok(());
        }
        let params = MatMulW8A8Params {
            out_dtype: want,
            m,
            n,
            k,
            per_row_a_scale: a_scale.len() == m,
            bias: bias.is_some(),
            splits: 0,
            variant: packed.then_some(crate::ops::matmul_w8a8::launch::W8A8Variant::Packed),
        };
        let device = crate::runtime::Device::get(ordinal.max(0) as usize)?;
        let plan = params.plan(device.multiprocessors(), device.has_wgmma())?;
        let stream: cudarc::driver::sys::CUstream = args.stream.cast();
        // SAFETY: the registry's caller hands over a live stream of the tensors' device for the
        // duration of the call; the scratch is freed on it after the kernels.
        let workspace = unsafe { crate::runtime::StreamScratch::new(&device, stream, plan.workspace_bytes)? };
        let ptrs = MatMulW8A8Pointers {
            a: a.data_address(),
            a_scale: a_scale.data_address(),
            w: w.data_address(),
            w_scale: w_scale.data_address(),
            bias: bias.as_ref().map_or(0, |b| b.data_address()),
            y: y.data_address(),
            workspace: workspace.address(),
        };
        // SAFETY: the registry's caller guarantees the tensors for their extents (checked
        // against the params above); y is a distinct output buffer; the workspace lives until
        // it is freed in stream order after the kernels.
        return unsafe { matmul_w8a8_raw(&device, stream, &params, &ptrs) }.map(|_| ());
    }
    // SAFETY: CPU tensors valid for the call; y is a distinct buffer.
    unsafe {
        let bias = match &bias {
            Some(b) => Some(b.host_slice::<f32>()?),
            None => None,
        };
        let unpacked;
        let w = if packed {
            unpacked = pack::unpack_decode(w.host_slice::<i8>()?, n, k)?;
            &unpacked[..]
        } else {
            w.host_slice::<i8>()?
        };
        let out = super::reference::matmul_reference(
            a.host_slice::<i8>()?,
            a_scale.host_slice::<f32>()?,
            w,
            w_scale.host_slice::<f32>()?,
            (m, n, k),
            bias,
        );
        store(&y, &out)
    }
}

fn itf_infer(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let (a, b, a_scale) = match args.inputs {
        [a, b, a_scale, ..] => (a, b, a_scale),
        _ => return Err(fail(args.function_name, "needs A, B, a_scale, b_scale".into())),
    };
    let n = b.shape().last().copied().unwrap_or(0);
    Ok(vec![TensorSpec { dtype: a_scale.dtype(), shape: with_last(a.shape(), n) }])
}

/// A scalar-or-per-index parameter of `MatMulIntegerToFloat`: one value for every index, or one
/// per index. Kept as given (a scalar is not spread over `len` values: `len` comes from the
/// shapes, and an empty B may declare any N).
struct PerIndex(Vec<f64>);

impl PerIndex {
    /// The value at index `i`.
    fn at(&self, i: usize) -> f64 {
        if self.0.len() == 1 { self.0[0] } else { self.0[i] }
    }

    /// `t`'s values, which must be 1 or `len`.
    ///
    /// # Safety
    /// As [`floats`].
    unsafe fn of(t: &TensorView, len: usize, what: &str) -> Result<Self> {
        // SAFETY: forwarded.
        let v: Vec<f64> = match t.dtype() {
            DType::I8 => unsafe { t.host_slice::<i8>()? }.iter().map(|&x| x as f64).collect(),
            _ => unsafe { floats(t)? }.into_iter().map(f64::from).collect(),
        };
        match v.len() {
            l if l == 1 || l == len => Ok(PerIndex(v)),
            l => Err(Error::InvalidTensor { name: what.into(), message: format!("{l} values (expected 1 or {len})") }),
        }
    }
}

/// `com.microsoft` `MatMulIntegerToFloat` with int8 A and B:
/// `Y = sum_k (A[m,k] - a_zp[k]) a_scale[k] (B[k,n] - b_zp[n]) b_scale[n] + bias[n]`, where the A
/// parameters are scalars or per column of A (per k), as that op defines them.
fn itf_compute(args: &KernelArgs) -> Result<()> {
    args.expect_count_ranges(4..=7, 1..=1)?;
    let a = args.input(0, "A")?;
    let b = args.input(1, "B")?;
    let a_scale = args.input(2, "a_scale")?;
    let b_scale = args.input(3, "b_scale")?;
    let a_zp = optional(args, 4, "a_zero_point")?;
    let b_zp = optional(args, 5, "b_zero_point")?;
    let bias = optional(args, 6, "bias")?;
    let y = args.output(0, "Y")?;
    for t in [&a, &b] {
        t.expect_dtype(&[DType::I8])?;
        t.expect_device(DeviceKind::Cpu)?;
    }
    a.expect_rank(1, crate::dlpack::MAX_NDIM)?;
    b.expect_rank(2, 2)?;
    let (m, k) = rows_cols(a.shape());
    let n = b.shape()[1] as usize;
    if b.shape()[0] as usize != k {
        return Err(Error::InvalidTensor {
            name: "B".into(),
            message: format!("shape {:?} (expected [{k}, N])", b.shape()),
        });
    }
    a_scale.expect_dtype(&[DType::F32, DType::F16])?;
    b_scale.expect_same_dtype(&a_scale)?;
    y.expect_same_dtype(&a_scale)?;
    y.expect_shape(&with_last(a.shape(), n as i64))?;
    // SAFETY: CPU tensors valid for the call; Y is a distinct buffer.
    unsafe {
        let sa = PerIndex::of(&a_scale, k, "a_scale")?;
        let sb = PerIndex::of(&b_scale, n, "b_scale")?;
        let zero_point = |t: &Option<TensorView>, len: usize, what: &str| -> Result<PerIndex> {
            match t {
                Some(t) => {
                    t.expect_dtype(&[DType::I8])?;
                    PerIndex::of(t, len, what)
                }
                None => Ok(PerIndex(vec![0.0])),
            }
        };
        let za = zero_point(&a_zp, k, "a_zero_point")?;
        let zb = zero_point(&b_zp, n, "b_zero_point")?;
        let bias = match &bias {
            Some(t) => {
                t.expect_same_dtype(&a_scale)?;
                PerIndex::of(t, n, "bias")?
            }
            None => PerIndex(vec![0.0]),
        };
        let av = a.host_slice::<i8>()?;
        let bv = b.host_slice::<i8>()?;
        let mut out = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let dot: f64 = (0..k)
                    .map(|p| (av[i * k + p] as f64 - za.at(p)) * sa.at(p) * (bv[p * n + j] as f64 - zb.at(j)))
                    .sum();
                out[i * n + j] = dot * sb.at(j) + bias.at(j);
            }
        }
        store(&y, &out)
    }
}
