//! `dlkern.paged_attention`: `com.microsoft` `PagedAttention` (ONNX Runtime 1.31's schema, its
//! inputs, outputs, attributes and defaults), so moving a node to domain `dlkern` is the whole
//! change to a model. CUDA tensors (f16, bf16) run [`super::launch::paged_attention_op_raw`];
//! CPU tensors (f32, f16) run [`super::reference::paged_attention_op`].
//!
//! The caches are updated in place: the new keys and values go into `key_cache_out` /
//! `value_cache_out` when the node has them, else into `key_cache` / `value_cache` themselves (as
//! ORT's kernel does). ORT requires the outputs to be the input buffers (IO binding); a custom op
//! cannot declare that aliasing, so when the buffers differ the old caches are first copied into
//! the outputs (a full cache copy per call: bind the outputs to the inputs' buffers to avoid it).
//!
//! What ORT defines and dlkern refuses (each with an error naming it): `slot_mapping`,
//! `head_sink`, `q_norm_weight`/`k_norm_weight`, `k_scale`/`v_scale` and quantized caches
//! (`k_quant_type`/`v_quant_type` other than `NONE`, a `k_cache_dtype`/`v_cache_dtype` other than
//! the cache's own type), `kv_cache_layout = LATENT`, `v_head_size` other than the head size,
//! `rotary_offset` other than 0, and `is_causal = 0`. `attention_metadata` is accepted and not
//! read: its bounds only size ORT's launches, and dlkern's need none (every length is read on the
//! device). `qk_norm_epsilon` only matters with the norm weights.

use crate::dlpack::{DEVICE_MASK_CPU, DEVICE_MASK_CUDA, DeviceKind, TensorView};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernel::{
    AttrDecl, AttrKind, Attributes, InferArgs, KernelArgs, OpDecl, OrtDecl, TensorDecl, TensorSpec, TensorType,
};
use crate::ops::common::{dims, fail, floats, head_count, optional, round_to, store};

use super::launch::{DecodeLimits, PagedOpParams, PagedOpPointers, paged_attention_op_raw};
use super::reference::{PagedOpConfig, PagedOpInputs, paged_attention_op};

const T: TensorType = TensorType::T;
const S: TensorType = TensorType::Fixed(DType::I32);

const fn input(name: &'static str, ty: TensorType, optional: bool, shape: &'static str) -> TensorDecl {
    TensorDecl { name, ty, optional, shape }
}

/// This family's ops, in the order `docs/ops.md` lists them.
pub static DECLARATIONS: &[&OpDecl] = &[&PAGED_ATTENTION];

pub static PAGED_ATTENTION: OpDecl = OpDecl {
    name: "dlkern.paged_attention",
    inputs: &[
        input(
            "query",
            T,
            false,
            "`[tokens, num_heads * D]`, or packed QKV `[tokens, (num_heads + 2 kv_num_heads) * D]`",
        ),
        input("key", T, true, "`[tokens, kv_num_heads * D]`; absent with packed QKV"),
        input("value", T, true, "as `key`"),
        input("key_cache", T, false, "`[num_blocks, block_size, kv_num_heads, D]`; block_size a power of two >= 16"),
        input("value_cache", T, true, "as `key_cache` (required: no LATENT layout)"),
        input("cumulative_sequence_length", S, false, "`[batch + 1]`: sequence `b` owns tokens `cu[b]..cu[b + 1]`"),
        input("past_seqlens", S, false, "`[batch]`: tokens already in each sequence's cache"),
        input("block_table", S, false, "`[batch, max_blocks_per_sequence]`"),
        input("cos_cache", T, true, "`[max positions, rotary_dim / 2]`"),
        input("sin_cache", T, true, "as `cos_cache`"),
        input("slot_mapping", S, true, "refused"),
        input("head_sink", T, true, "refused"),
        input("q_norm_weight", T, true, "refused"),
        input("k_norm_weight", T, true, "refused"),
        input("k_scale", TensorType::Fixed(DType::F32), true, "refused (no quantized caches)"),
        input("v_scale", TensorType::Fixed(DType::F32), true, "refused (no quantized caches)"),
        input("attention_metadata", S, true, "`[2]` or `[3]`; accepted and not read"),
    ],
    outputs: &[
        TensorDecl { name: "output", ty: T, optional: false, shape: "`[tokens, num_heads * D]`" },
        TensorDecl { name: "key_cache_out", ty: T, optional: true, shape: "as `key_cache`: the updated cache" },
        TensorDecl { name: "value_cache_out", ty: T, optional: true, shape: "as `value_cache`" },
    ],
    attrs: &[
        AttrDecl { name: c"num_heads", kind: AttrKind::Int, doc: "query heads" },
        AttrDecl { name: c"kv_num_heads", kind: AttrKind::Int, doc: "key/value heads; divides `num_heads`" },
        AttrDecl { name: c"scale", kind: AttrKind::Float { default: 0.0 }, doc: "0 means `1/sqrt(D)`" },
        AttrDecl { name: c"softcap", kind: AttrKind::Float { default: 0.0 }, doc: "`cap * tanh(s / cap)`; 0: none" },
        AttrDecl {
            name: c"local_window_size",
            kind: AttrKind::OptionalInt { default: "-1 (none)" },
            doc: "`w >= 1`: a query at position `i` sees keys `i + 1 - w ..= i`",
        },
        AttrDecl {
            name: c"do_rotary",
            kind: AttrKind::OptionalInt { default: "0" },
            doc: "rotate q and k by position",
        },
        AttrDecl {
            name: c"rotary_interleaved",
            kind: AttrKind::OptionalInt { default: "0" },
            doc: "pairs `(2p, 2p + 1)`, else `(p, p + rotary_dim / 2)`",
        },
        AttrDecl { name: c"is_causal", kind: AttrKind::OptionalInt { default: "1" }, doc: "must be 1" },
        AttrDecl { name: c"rotary_offset", kind: AttrKind::OptionalInt { default: "0" }, doc: "must be 0" },
        AttrDecl { name: c"v_head_size", kind: AttrKind::OptionalInt { default: "0" }, doc: "0 or `D`" },
        AttrDecl {
            name: c"kv_cache_layout",
            kind: AttrKind::OptionalString { default: "`SEPARATE`" },
            doc: "must be `SEPARATE`",
        },
        AttrDecl { name: c"k_quant_type", kind: AttrKind::OptionalString { default: "`NONE`" }, doc: "must be `NONE`" },
        AttrDecl { name: c"v_quant_type", kind: AttrKind::OptionalString { default: "`NONE`" }, doc: "must be `NONE`" },
        AttrDecl {
            name: c"k_cache_dtype",
            kind: AttrKind::OptionalString { default: "`\"\"`" },
            doc: "empty or the cache's own type",
        },
        AttrDecl {
            name: c"v_cache_dtype",
            kind: AttrKind::OptionalString { default: "`\"\"`" },
            doc: "as `k_cache_dtype`",
        },
        AttrDecl { name: c"qk_norm_epsilon", kind: AttrKind::Float { default: 1e-6 }, doc: "unused (no QK norm)" },
    ],
    devices: DEVICE_MASK_CPU | DEVICE_MASK_CUDA,
    compute,
    infer,
    ort: Some(OrtDecl { name: c"PagedAttention", cuda: &[DType::F16, DType::BF16], cpu: &[DType::F32, DType::F16] }),
};

/// The attributes, checked; everything ORT defines that dlkern does not implement is refused.
struct Attrs {
    num_heads: usize,
    kv_heads: usize,
    scale: f64,
    softcap: f64,
    local_window: Option<usize>,
    do_rotary: bool,
    interleaved: bool,
}

fn attrs(name: &str, a: &Attributes) -> Result<Attrs> {
    let heads = |attr: &str| -> Result<usize> { head_count(name, attr, a.require_int(attr)?) };
    let (num_heads, kv_heads) = (heads("num_heads")?, heads("kv_num_heads")?);
    if !num_heads.is_multiple_of(kv_heads) {
        return Err(fail(name, format!("num_heads {num_heads} is not a multiple of kv_num_heads {kv_heads}")));
    }
    let flag = |attr: &str, default: i64| -> Result<bool> {
        match a.int(attr)?.unwrap_or(default) {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(fail(name, format!("attribute '{attr}' = {v} (expected 0 or 1)"))),
        }
    };
    if !flag("is_causal", 1)? {
        return Err(fail(name, "is_causal = 0 (bidirectional new tokens) is not supported".into()));
    }
    if let Some(v) = a.int("rotary_offset")?.filter(|&v| v != 0) {
        return Err(fail(name, format!("rotary_offset = {v} is not supported (only 0)")));
    }
    for (attr, want) in [("kv_cache_layout", "SEPARATE"), ("k_quant_type", "NONE"), ("v_quant_type", "NONE")] {
        if let Some(v) = a.string(attr)?.filter(|v| *v != want) {
            return Err(fail(name, format!("{attr} = '{v}' is not supported (only '{want}')")));
        }
    }
    let softcap = a.float("softcap")?.unwrap_or(0.0);
    if !(softcap.is_finite() && softcap >= 0.0) {
        return Err(fail(name, format!("softcap = {softcap} (must be finite and >= 0)")));
    }
    let scale = a.float("scale")?.unwrap_or(0.0);
    if !scale.is_finite() {
        return Err(fail(name, format!("scale = {scale} (must be finite)")));
    }
    // ORT 1.31 (GroupQueryAttention's CPU kernel, which PagedAttention's semantics follow) shows a
    // query the `w` keys ending at its own; 0 is degenerate there (neither none nor one key).
    let local_window = match a.int("local_window_size")?.unwrap_or(-1) {
        -1 => None,
        w if w >= 1 => Some(usize::try_from(w).unwrap_or(usize::MAX).min(u32::MAX as usize)),
        w => return Err(fail(name, format!("local_window_size = {w} (must be -1 for none, or >= 1)"))),
    };
    Ok(Attrs {
        num_heads,
        kv_heads,
        scale,
        softcap,
        local_window,
        do_rotary: flag("do_rotary", 0)?,
        interleaved: flag("rotary_interleaved", 0)?,
    })
}

/// Shapes of one call, from shapes alone.
struct Layout {
    tokens: usize,
    head_size: usize,
    packed: bool,
    num_blocks: usize,
    block_size: usize,
    batch: usize,
    max_blocks: usize,
}

fn shape_of(t: &TensorView, rank: usize, what: &str, name: &str) -> Result<Vec<usize>> {
    if t.ndim() != rank {
        return Err(fail(name, format!("{what} has shape {:?} (expected {rank} dimensions)", t.shape())));
    }
    Ok(dims(t))
}

#[allow(clippy::too_many_arguments)]
fn layout(
    name: &str,
    a: &Attrs,
    query: &TensorView,
    key: Option<&TensorView>,
    value: Option<&TensorView>,
    key_cache: &TensorView,
    value_cache: Option<&TensorView>,
    [cu, past, table]: [&TensorView; 3],
) -> Result<Layout> {
    let q = shape_of(query, 2, "query", name)?;
    let packed = match (key, value) {
        (None, None) => true,
        (Some(_), Some(_)) => false,
        _ => return Err(fail(name, "key and value must both be present, or both absent (packed QKV)".into())),
    };
    let width = if packed { a.num_heads + 2 * a.kv_heads } else { a.num_heads };
    if q[1] == 0 || !q[1].is_multiple_of(width) || !(q[1] / width).is_multiple_of(8) {
        return Err(fail(
            name,
            format!("query width {} is not {width} heads of a head size that is a multiple of 8", q[1]),
        ));
    }
    let head_size = q[1] / width;
    if let (Some(k), Some(v)) = (key, value) {
        for (what, t) in [("key", k), ("value", v)] {
            let s = shape_of(t, 2, what, name)?;
            if s != [q[0], a.kv_heads * head_size] {
                return Err(fail(
                    name,
                    format!(
                        "{what} has shape {:?}, expected [{}, {}] (kv_num_heads x head size)",
                        t.shape(),
                        q[0],
                        a.kv_heads * head_size
                    ),
                ));
            }
        }
    }
    let Some(value_cache) = value_cache else {
        return Err(fail(name, "value_cache is required (the LATENT layout is not supported)".into()));
    };
    let kc = shape_of(key_cache, 4, "key_cache", name)?;
    if kc[2] != a.kv_heads || kc[3] != head_size {
        return Err(fail(
            name,
            format!(
                "key_cache has shape {:?}, expected [num_blocks, block_size, {}, {head_size}]",
                key_cache.shape(),
                a.kv_heads
            ),
        ));
    }
    if value_cache.shape() != key_cache.shape() {
        return Err(fail(
            name,
            format!("value_cache has shape {:?}, key_cache {:?}", value_cache.shape(), key_cache.shape()),
        ));
    }
    if kc[1] < 16 || !kc[1].is_power_of_two() || kc[0] == 0 {
        return Err(fail(name, format!("block_size {} must be a power of two >= 16 (and num_blocks >= 1)", kc[1])));
    }
    let c = shape_of(cu, 1, "cumulative_sequence_length", name)?;
    if c[0] < 2 {
        return Err(fail(name, "cumulative_sequence_length must hold batch + 1 >= 2 entries".into()));
    }
    let batch = c[0] - 1;
    if dims(past) != [batch] {
        return Err(fail(name, format!("past_seqlens has shape {:?}, expected [{batch}]", past.shape())));
    }
    let t = shape_of(table, 2, "block_table", name)?;
    if t[0] != batch || t[1] == 0 {
        return Err(fail(
            name,
            format!("block_table has shape {:?}, expected [{batch}, max_blocks >= 1]", table.shape()),
        ));
    }
    Ok(Layout { tokens: q[0], head_size, packed, num_blocks: kc[0], block_size: kc[1], batch, max_blocks: t[1] })
}

fn infer(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let name = args.function_name;
    let a = attrs(name, args.attrs)?;
    let input = |i: usize| args.inputs.get(i).filter(|t| !t.is_empty());
    let (Some(query), Some(key_cache)) = (input(0), input(3)) else {
        return Err(fail(name, "needs inputs query and key_cache".into()));
    };
    let q = shape_of(query, 2, "query", name)?;
    let width = if input(1).is_none() { a.num_heads + 2 * a.kv_heads } else { a.num_heads };
    let hidden = (q[1] / width * a.num_heads) as i64;
    let mut specs = vec![TensorSpec { dtype: query.dtype(), shape: vec![q[0] as i64, hidden] }];
    for i in 1..args.num_outputs.min(3) {
        let cache = if i == 2 { input(4).unwrap_or(key_cache) } else { key_cache };
        specs.push(TensorSpec { dtype: cache.dtype(), shape: cache.shape().to_vec() });
    }
    Ok(specs)
}

fn compute(args: &KernelArgs) -> Result<()> {
    let name = args.function_name;
    args.expect_count_ranges(8..=17, 1..=3)?;
    let a = attrs(name, args.attrs)?;
    let query = args.input(0, "query")?;
    let key = optional(args, 1, "key")?;
    let value = optional(args, 2, "value")?;
    let key_cache = args.input(3, "key_cache")?;
    let value_cache = optional(args, 4, "value_cache")?;
    let cu = args.input(5, "cumulative_sequence_length")?;
    let past = args.input(6, "past_seqlens")?;
    let table = args.input(7, "block_table")?;
    let cos = optional(args, 8, "cos_cache")?;
    let sin = optional(args, 9, "sin_cache")?;
    for (i, input) in [
        (10, "slot_mapping"),
        (11, "head_sink"),
        (12, "q_norm_weight"),
        (13, "k_norm_weight"),
        (14, "k_scale"),
        (15, "v_scale"),
    ] {
        if optional(args, i, input)?.is_some() {
            return Err(fail(name, format!("input '{input}' is not supported")));
        }
    }
    if let Some(meta) = optional(args, 16, "attention_metadata")? {
        meta.expect_dtype(&[DType::I32])?;
        if meta.ndim() != 1 || !(2..=3).contains(&meta.len()) {
            return Err(fail(name, format!("attention_metadata has shape {:?} (expected [2] or [3])", meta.shape())));
        }
    }
    let l =
        layout(name, &a, &query, key.as_ref(), value.as_ref(), &key_cache, value_cache.as_ref(), [&cu, &past, &table])?;
    let value_cache = value_cache.expect("layout requires it");
    let dtype = query.expect_dtype(&[DType::F32, DType::F16, DType::BF16])?;
    for t in [key.as_ref(), value.as_ref(), Some(&key_cache), Some(&value_cache), cos.as_ref(), sin.as_ref()]
        .into_iter()
        .flatten()
    {
        t.expect_same_dtype(&query)?;
    }
    for (attr, cache) in [("k_cache_dtype", &key_cache), ("v_cache_dtype", &value_cache)] {
        if let Some(v) =
            args.attrs.string(attr)?.filter(|v| !v.is_empty() && *v != crate::kernel::onnx_type_name(cache.dtype()))
        {
            return Err(fail(
                name,
                format!(
                    "{attr} = '{v}' is not supported (the cache holds {})",
                    crate::kernel::onnx_type_name(cache.dtype())
                ),
            ));
        }
    }
    for t in [&cu, &past, &table] {
        t.expect_dtype(&[DType::I32])?;
    }
    let rotary = if a.do_rotary {
        let (Some(cos), Some(sin)) = (&cos, &sin) else {
            return Err(fail(
                name,
                "cos_cache and sin_cache must be passed to PagedAttention when do_rotary = 1".into(),
            ));
        };
        let c = shape_of(cos, 2, "cos_cache", name)?;
        if sin.shape() != cos.shape() || c[1] == 0 || 2 * c[1] > l.head_size || c[0] == 0 {
            return Err(fail(
                name,
                format!(
                    "cos_cache {:?} / sin_cache {:?} must both be [positions, rotary_dim / 2] with rotary_dim <= head size {}",
                    cos.shape(),
                    sin.shape(),
                    l.head_size
                ),
            ));
        }
        Some((2 * c[1], c[0]))
    } else {
        None
    };
    if let Some(v) = args.attrs.int("v_head_size")?.filter(|&v| v != 0 && v as usize != l.head_size) {
        return Err(fail(name, format!("v_head_size = {v} is not supported (only the head size {})", l.head_size)));
    }
    let output = args.output(0, "output")?;
    output.expect_same_dtype(&query)?;
    output.expect_shape(&[l.tokens as i64, (a.num_heads * l.head_size) as i64])?;
    // Where the updated caches go: the outputs when the node has them, else the inputs.
    let key_out = if args.num_outputs() > 1 { Some(args.output(1, "key_cache_out")?) } else { None };
    let value_out = if args.num_outputs() > 2 { Some(args.output(2, "value_cache_out")?) } else { None };
    for (out, cache) in [(&key_out, &key_cache), (&value_out, &value_cache)] {
        if let Some(out) = out {
            out.expect_same_dtype(cache)?;
            out.expect_shape(cache.shape())?;
        }
    }
    let all = [
        Some(&query),
        key.as_ref(),
        value.as_ref(),
        Some(&key_cache),
        Some(&value_cache),
        Some(&cu),
        Some(&past),
        Some(&table),
    ];
    for t in all
        .into_iter()
        .chain([cos.as_ref(), sin.as_ref(), Some(&output), key_out.as_ref(), value_out.as_ref()])
        .flatten()
    {
        t.expect_device(query.device())?;
        t.expect_contiguous()?;
    }
    let scale = if a.scale == 0.0 { 1.0 / (l.head_size as f64).sqrt() } else { a.scale };
    let rotary = if a.do_rotary { rotary } else { None };
    let k_target = key_out.as_ref().unwrap_or(&key_cache);
    let v_target = value_out.as_ref().unwrap_or(&value_cache);
    if let DeviceKind::Cuda(ordinal) = query.device() {
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return Err(fail(name, format!("CUDA tensors of {dtype} are not supported (float16, bfloat16)")));
        }
        let device = crate::runtime::Device::get(ordinal.max(0) as usize)?;
        let stream: cudarc::driver::sys::CUstream = args.stream.cast();
        let bytes = key_cache.len() * dtype.size_bytes();
        for (target, cache) in [(k_target, &key_cache), (v_target, &value_cache)] {
            if target.data_address() != cache.data_address() {
                // SAFETY: two distinct device tensors of the same shape and type (checked above).
                unsafe {
                    crate::runtime::copy_async(&device, stream, target.data_address(), cache.data_address(), bytes)?
                };
            }
        }
        if l.tokens == 0 {
            return Ok(());
        }
        let params = PagedOpParams {
            dtype,
            batch: l.batch,
            tokens: l.tokens,
            num_heads: a.num_heads,
            kv_heads: a.kv_heads,
            head_size: l.head_size,
            num_blocks: l.num_blocks,
            block_size: l.block_size,
            max_blocks: l.max_blocks,
            packed_qkv: l.packed,
            rotary_dim: rotary.map_or(0, |(rd, _)| rd),
            interleaved: a.interleaved,
            cos_rows: rotary.map_or(0, |(_, rows)| rows),
            scale: scale as f32,
            softcap: a.softcap as f32,
            window: a.local_window.unwrap_or(0),
        };
        let plan = params.plan(DecodeLimits::of(&device, params.dtype, params.head_size)?)?;
        // SAFETY: ORT's (or the registry caller's) stream of this device; freed on it.
        let workspace = unsafe { crate::runtime::StreamScratch::new(&device, stream, plan.workspace_bytes)? };
        let ptrs = PagedOpPointers {
            query: query.data_address(),
            key: key.as_ref().map_or(0, |t| t.data_address()),
            value: value.as_ref().map_or(0, |t| t.data_address()),
            key_cache: k_target.data_address(),
            value_cache: v_target.data_address(),
            cu_seqlens: cu.data_address(),
            past_seqlens: past.data_address(),
            block_table: table.data_address(),
            cos: cos.as_ref().map_or(0, |t| t.data_address()),
            sin: sin.as_ref().map_or(0, |t| t.data_address()),
            out: output.data_address(),
            workspace: workspace.address(),
        };
        // SAFETY: every tensor was checked against the parameters' extents, on this device and
        // contiguous; the output is distinct from the inputs (ORT allocates it); lengths and
        // block ids are checked on the device.
        return unsafe { paged_attention_op_raw(&device, stream, &params, &ptrs) }.map(|_| ());
    }
    let config = PagedOpConfig {
        num_heads: a.num_heads,
        kv_heads: a.kv_heads,
        head_size: l.head_size,
        num_blocks: l.num_blocks,
        block_size: l.block_size,
        max_blocks: l.max_blocks,
        scale,
        softcap: a.softcap,
        local_window: a.local_window,
        rotary: rotary.map(|(rd, _)| (rd, a.interleaved)),
    };
    let wide = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
    // SAFETY: CPU tensors (checked above), valid for the call by the registry's contract; the
    // output is a distinct buffer, the cache targets are written only after every read.
    unsafe {
        let (mut kc, mut vc) = (wide(floats(&key_cache)?), wide(floats(&value_cache)?));
        let key = key.as_ref().map(|t| floats(t)).transpose()?.map(wide);
        let value = value.as_ref().map(|t| floats(t)).transpose()?.map(wide);
        let (cos, sin) = match (&rotary, &cos, &sin) {
            (Some(_), Some(c), Some(s)) => (wide(floats(c)?), wide(floats(s)?)),
            _ => (Vec::new(), Vec::new()),
        };
        let x = PagedOpInputs {
            query: &wide(floats(&query)?),
            key: key.as_deref(),
            value: value.as_deref(),
            cumulative_sequence_length: cu.host_slice::<i32>()?,
            past_seqlens: past.host_slice::<i32>()?,
            block_table: table.host_slice::<i32>()?,
            cos: &cos,
            sin: &sin,
        };
        let out =
            paged_attention_op(&config, &x, &mut kc, &mut vc, |v| round_to(dtype, v)).map_err(|m| fail(name, m))?;
        store(&output, &out)?;
        store(k_target, &kc)?;
        store(v_target, &vc)
    }
}
