//! `dlkern.rotary_embedding` (ORT op `RotaryEmbedding`): ONNX Runtime 1.31's `com.microsoft`
//! `RotaryEmbedding`. `input` `[B, S, hidden]` or `[B, N, S, head_size]`; `position_ids` i64
//! `[B, S]`, or one element `p` meaning positions `p + s`; `cos_cache` / `sin_cache`
//! `[max_position, rotary_dim / 2]`. Each head's first `rotary_dim` elements rotate (pairs as
//! [`crate::ops::common::rotary::rotary_pair`]), the rest pass through. The head size is
//! `hidden / num_heads` when `rotary_embedding_dim` is set (then `num_heads` must be too), else
//! `2 * cos_cache`'s columns, and the rotary dim is `rotary_embedding_dim` or the head size.
//!
//! CPU tensors run the f64 reference and check every position; CUDA tensors run
//! `attention_rotary_*`, where positions stay on the device and one outside the caches turns
//! its head to NaN. Refused: `is_packed_batching = 1`. `scale` is accepted and, as in ORT (which
//! uses it only to grow the caches, which it does not implement), has no effect.

use super::launch::{HeadStrides, RotaryParams, RotaryPointers, RotaryPositions, rotary_raw};
use crate::dlpack::{DeviceKind, TensorView};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernel::{Attributes, KernelArgs};
use crate::ops::common::rotary::rotate_at;
use crate::ops::common::{fail, floats, head_count, store};
use crate::runtime::Device;

/// One call's geometry.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    batch: usize,
    seq: usize,
    heads: usize,
    head_size: usize,
    rotary_dim: usize,
    interleaved: bool,
    strides: HeadStrides,
    max_position: usize,
    /// Positions are `position_ids[0] + s` (one element) rather than per token.
    from_first: bool,
}

fn geometry(name: &str, attrs: &Attributes, x: &TensorView, pos: &TensorView, cos: &TensorView) -> Result<Geometry> {
    let int = |key: &str| -> Result<i64> { Ok(attrs.int(key)?.unwrap_or(0)) };
    let (num_heads, rotary_attr) = (int("num_heads")?, int("rotary_embedding_dim")?);
    if int("is_packed_batching")? != 0 {
        return Err(fail(name, "is_packed_batching = 1 is not supported by dlkern".into()));
    }
    let interleaved = match int("interleaved")? {
        0 => false,
        1 => true,
        other => return Err(fail(name, format!("interleaved = {other} (expected 0 or 1)"))),
    };
    if num_heads != 0 {
        head_count(name, "num_heads", num_heads)?;
    }
    // (A negative num_heads was refused just above.)
    if rotary_attr < 0 || (rotary_attr > 0 && num_heads == 0) {
        return Err(fail(
            name,
            format!("num_heads = {num_heads}, rotary_embedding_dim = {rotary_attr}: >= 0, num_heads set with the dim"),
        ));
    }
    let d: Vec<usize> = x.shape().iter().map(|&v| v.max(0) as usize).collect();
    let cd: Vec<usize> = cos.shape().iter().map(|&v| v.max(0) as usize).collect();
    if cd.len() != 2 {
        return Err(fail(name, format!("cos_cache has shape {:?}, expected [positions, rotary_dim / 2]", cos.shape())));
    }
    let (batch, seq, hidden, transposed) = match d.len() {
        3 => (d[0], d[1], d[2], false),
        4 => (d[0], d[2], d[1] * d[3], true),
        _ => return Err(fail(name, format!("input has shape {:?}, expected 3 or 4 dimensions", x.shape()))),
    };
    let head_size = if rotary_attr == 0 { 2 * cd[1] } else { hidden / num_heads as usize };
    let heads = if num_heads > 0 { num_heads as usize } else { hidden.checked_div(head_size).unwrap_or(0) };
    let rotary_dim = if rotary_attr > 0 { rotary_attr as usize } else { head_size };
    if head_size == 0 || heads * head_size != hidden || (transposed && d[3] != head_size) {
        return Err(fail(name, format!("input {:?} does not split into heads of size {head_size}", x.shape())));
    }
    if rotary_dim > head_size || rotary_dim % 2 != 0 || cd[1] != rotary_dim / 2 {
        return Err(fail(
            name,
            format!(
                "rotary dim {rotary_dim} must be even, at most the head size {head_size}, and twice cos_cache's {} columns",
                cd[1]
            ),
        ));
    }
    let from_first = pos.len() == 1 && pos.ndim() <= 1;
    if !from_first && pos.shape() != [batch as i64, seq as i64] {
        return Err(fail(
            name,
            format!("position_ids has shape {:?}, expected [{batch}, {seq}] or one element", pos.shape()),
        ));
    }
    let strides = if transposed {
        HeadStrides { batch: heads * seq * head_size, seq: head_size, head: seq * head_size }
    } else {
        HeadStrides { batch: seq * hidden, seq: hidden, head: head_size }
    };
    Ok(Geometry { batch, seq, heads, head_size, rotary_dim, interleaved, strides, max_position: cd[0], from_first })
}

pub(super) fn compute(args: &KernelArgs) -> Result<()> {
    let name = args.function_name;
    args.expect_counts(4, 1)?;
    let x = args.input(0, "input")?;
    let pos = args.input(1, "position_ids")?;
    let cos = args.input(2, "cos_cache")?;
    let sin = args.input(3, "sin_cache")?;
    let y = args.output(0, "output")?;
    let dtype = x.expect_dtype(&[DType::F32, DType::F16, DType::BF16])?;
    pos.expect_dtype(&[DType::I64])?;
    for t in [&cos, &sin, &y] {
        t.expect_dtype(&[dtype])?;
    }
    sin.expect_shape(cos.shape())?;
    y.expect_shape(x.shape())?;
    for t in [&x, &pos, &cos, &sin, &y] {
        t.expect_device(x.device())?;
        t.expect_contiguous()?;
    }
    let g = geometry(name, args.attrs, &x, &pos, &cos)?;
    if x.is_empty() {
        return Ok(());
    }
    match x.device() {
        DeviceKind::Cuda(ordinal) => {
            let device = Device::get(ordinal.max(0) as usize)?;
            let params = RotaryParams {
                dtype,
                batch: g.batch,
                seq: g.seq,
                heads: g.heads,
                head_size: g.head_size,
                rotary_dim: g.rotary_dim,
                interleaved: g.interleaved,
                src: g.strides,
                dst: g.strides,
                positions: if g.from_first { RotaryPositions::FromFirst } else { RotaryPositions::PerToken },
                max_position: g.max_position,
            };
            let ptrs = RotaryPointers {
                src: x.data_address(),
                dst: y.data_address(),
                cos: cos.data_address(),
                sin: sin.data_address(),
                position_ids: pos.data_address(),
                seqlens_k: 0,
            };
            // SAFETY: the registry's caller guarantees the tensors' memory for their extents,
            // which the shape checks relate to the parameters; `y` has `x`'s layout, so even
            // in place each thread reads its elements before writing them.
            unsafe { rotary_raw(&device, args.stream.cast(), &params, &ptrs) }
        }
        // SAFETY: CPU tensors (checked above), valid for the call; inputs are copied out first.
        DeviceKind::Cpu => unsafe {
            let wide = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
            let (xs, cs, ss) = (floats(&x)?, wide(floats(&cos)?), wide(floats(&sin)?));
            let positions = pos.host_slice::<i64>()?;
            let mut out: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
            for b in 0..g.batch {
                for s in 0..g.seq {
                    let p = if g.from_first { positions[0].saturating_add(s as i64) } else { positions[b * g.seq + s] };
                    if p < 0 || p as usize >= g.max_position {
                        return Err(fail(
                            name,
                            format!(
                                "position {p} (batch {b}, token {s}) is outside cos_cache's {} rows",
                                g.max_position
                            ),
                        ));
                    }
                    for n in 0..g.heads {
                        let at = b * g.strides.batch + s * g.strides.seq + n * g.strides.head;
                        let head = &mut out[at..at + g.head_size];
                        rotate_at(head, &cs, &ss, p as usize, g.rotary_dim, g.interleaved);
                    }
                }
            }
            store(&y, &out)
        },
    }
}
