//! Attention (prefill) registry kernels, flash-attention's interface: `dlkern.attention` (the
//! output) and `dlkern.attention_lse` (the output and the row log-sum-exp). CPU tensors run the
//! f64 reference ([`crate::ops::attention::reference`], O(S) memory per row); the tensor-core kernel
//! (issue 6) will take CUDA tensors behind the same names.
//!
//! CUDA tensors (f16/bf16; head dims 64, 80, 96, 128, 256) run [`super::launch`]; packed
//! batches there also read the optional `max_seqlen_q` attribute (the longest sequence's query
//! count, flash-attention's argument; default the total), and their lengths are checked on the
//! device only for memory safety (clamped), not for meaning.
//!
//! Inputs: `q`, `k`, `v`, then optional `cu_seqlens_q`, `cu_seqlens_k` (i32 `[batch + 1]`).
//! - padded batch: `q [B, Sq, H, D]`, `k`/`v [B, Sk, Hkv, D]`, no sequence lengths.
//! - variable-length (packed) batch: `q [total_q, H, D]`, `k`/`v [total_k, Hkv, D]` and both
//!   cumulative sequence lengths (sequence `b` owns rows `cu[b]..cu[b + 1]`).
//!
//! `H` a multiple of `Hkv` (GQA/MQA); f32/f16/bf16, all the same. Outputs: `out` like `q`; with
//! `_lse`, `lse` f32 `[B, H, Sq]` (padded) or `[H, total_q]` (varlen), natural log, `-inf` for a
//! row that sees no key (its output is 0).
//!
//! Attributes: `causal` (int, 0/1, default 0; aligned to the bottom right when `Sk > Sq`, as in
//! chunked prefill), `scale` (float, default or 0: `1 / sqrt(D)`), `softcap` (float >= 0,
//! default 0 = none), `window_left` (int, default -1 = none: keys at most this far left of the
//! query's diagonal).

use crate::dlpack::{DEVICE_MASK_CPU, DEVICE_MASK_CUDA, DeviceKind, TensorView};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernel::{
    AttrDecl, AttrKind, Attributes, InferArgs, KernelArgs, OpDecl, OrtDecl, TensorDecl, TensorSpec, TensorType,
};
use crate::ops::attention::reference::{AttentionOptions, attention_varlen};
use crate::ops::common::{dims, fail, floats, optional, store};

const INPUTS: &[TensorDecl] = &[
    TensorDecl { name: "q", ty: TensorType::T, optional: false, shape: "`[B, Sq, H, D]`, or packed `[total_q, H, D]`" },
    TensorDecl {
        name: "k",
        ty: TensorType::T,
        optional: false,
        shape: "`[B, Sk, Hkv, D]`, or packed `[total_k, Hkv, D]`; `H` a multiple of `Hkv` (GQA/MQA)",
    },
    TensorDecl { name: "v", ty: TensorType::T, optional: false, shape: "as `k`" },
    TensorDecl {
        name: "cu_seqlens_q",
        ty: TensorType::Fixed(DType::I32),
        optional: true,
        shape: "`[B + 1]`, with `cu_seqlens_k` or not at all: packed (variable-length) batches; sequence `b` owns rows `cu[b]..cu[b + 1]`",
    },
    TensorDecl { name: "cu_seqlens_k", ty: TensorType::Fixed(DType::I32), optional: true, shape: "`[B + 1]`" },
];
const OUT: TensorDecl = TensorDecl { name: "out", ty: TensorType::T, optional: false, shape: "as `q`" };
const ATTRS: &[AttrDecl] = &[
    AttrDecl { name: c"causal", kind: AttrKind::OptionalInt { default: "0" }, doc: "0/1, aligned to the bottom right" },
    AttrDecl { name: c"scale", kind: AttrKind::Float { default: 0.0 }, doc: "0 means `1/sqrt(D)`" },
    AttrDecl { name: c"softcap", kind: AttrKind::Float { default: 0.0 }, doc: "`cap * tanh(s / cap)`; 0: none" },
    AttrDecl {
        name: c"window_left",
        kind: AttrKind::OptionalInt { default: "-1 (none)" },
        doc: "keys at most this far left of the diagonal",
    },
    AttrDecl {
        name: c"max_seqlen_q",
        kind: AttrKind::OptionalInt { default: "the total" },
        doc: "packed batches on the GPU: the longest sequence's query count",
    },
];
const DEVICES: u32 = DEVICE_MASK_CPU | DEVICE_MASK_CUDA;

/// This family's ops, in the order `docs/ops.md` lists them.
pub static DECLARATIONS: &[&OpDecl] = &[&ATTENTION, &ATTENTION_LSE, &GROUP_QUERY_ATTENTION, &ROTARY_EMBEDDING];

const fn opt(name: &'static str, ty: TensorType, shape: &'static str) -> TensorDecl {
    TensorDecl { name, ty, optional: true, shape }
}
const REFUSED: &str = "refused when given";

/// ONNX Runtime 1.31's `com.microsoft` `GroupQueryAttention` (semantics: `host/ops/attention/gqa.rs`, `docs/ops.md`).
pub static GROUP_QUERY_ATTENTION: OpDecl = OpDecl {
    name: "dlkern.group_query_attention",
    inputs: &[
        TensorDecl {
            name: "query",
            ty: TensorType::T,
            optional: false,
            shape: "`[B, S, H * D]`, or packed QKV `[B, S, (H + 2 Hkv) * D]` when `key` and `value` are absent",
        },
        opt("key", TensorType::T, "`[B, S, Hkv * D]`"),
        opt("value", TensorType::T, "`[B, S, Hkv * D]`"),
        opt("past_key", TensorType::T, "BNSH `[B, Hkv, L, D]`; may be `present_key`'s buffer"),
        opt("past_value", TensorType::T, "as `past_key`"),
        TensorDecl {
            name: "seqlens_k",
            ty: TensorType::Fixed(DType::I32),
            optional: false,
            shape: "`[B]`: each sequence's token count after the step, minus one",
        },
        TensorDecl {
            name: "total_sequence_length",
            ty: TensorType::Host(DType::I32),
            optional: false,
            shape: "one element: the longest sequence's token count",
        },
        opt("cos_cache", TensorType::T, "`[positions, rotary_dim / 2]`, with `do_rotary = 1`"),
        opt("sin_cache", TensorType::T, "as `cos_cache`"),
        opt("position_ids", TensorType::Fixed(DType::I64), REFUSED),
        opt("attention_bias", TensorType::T, REFUSED),
        opt("head_sink", TensorType::T, REFUSED),
        opt("k_scale", TensorType::Fixed(DType::F32), REFUSED),
        opt("v_scale", TensorType::Fixed(DType::F32), REFUSED),
        opt("q_norm_weight", TensorType::T, REFUSED),
        opt("k_norm_weight", TensorType::T, REFUSED),
    ],
    outputs: &[
        TensorDecl { name: "output", ty: TensorType::T, optional: false, shape: "`[B, S, H * D]`" },
        opt("present_key", TensorType::T, "`[B, Hkv, max(total_sequence_length, L), D]` (required by dlkern)"),
        opt("present_value", TensorType::T, "as `present_key` (required by dlkern)"),
        opt("output_qk", TensorType::T, REFUSED),
    ],
    attrs: &[
        AttrDecl { name: c"num_heads", kind: AttrKind::Int, doc: "query heads `H`" },
        AttrDecl { name: c"kv_num_heads", kind: AttrKind::Int, doc: "KV heads `Hkv` (`H` a multiple of it)" },
        AttrDecl { name: c"scale", kind: AttrKind::Float { default: 0.0 }, doc: "0 means `1/sqrt(D)`" },
        AttrDecl { name: c"softcap", kind: AttrKind::Float { default: 0.0 }, doc: "`cap * tanh(s / cap)`; 0: none" },
        AttrDecl {
            name: c"local_window_size",
            kind: AttrKind::OptionalInt { default: "-1 (none)" },
            doc: "a query sees this many keys left of its own",
        },
        AttrDecl { name: c"causal", kind: AttrKind::OptionalInt { default: "1" }, doc: "0: bidirectional" },
        AttrDecl {
            name: c"do_rotary",
            kind: AttrKind::OptionalInt { default: "0" },
            doc: "rotate new queries and keys",
        },
        AttrDecl {
            name: c"rotary_interleaved",
            kind: AttrKind::OptionalInt { default: "0" },
            doc: "pairs `(2i, 2i + 1)` instead of `(i, i + rotary_dim / 2)`",
        },
        AttrDecl { name: c"smooth_softmax", kind: AttrKind::OptionalInt { default: "0" }, doc: "1 refused" },
        AttrDecl { name: c"qk_output", kind: AttrKind::OptionalInt { default: "0" }, doc: "other values refused" },
        AttrDecl { name: c"sliding_window_cache", kind: AttrKind::OptionalInt { default: "0" }, doc: "1 refused" },
        AttrDecl { name: c"kv_cache_bit_width", kind: AttrKind::OptionalInt { default: "none" }, doc: REFUSED },
        AttrDecl { name: c"k_quant_type", kind: AttrKind::OptionalString { default: "`NONE`" }, doc: "others refused" },
        AttrDecl { name: c"v_quant_type", kind: AttrKind::OptionalString { default: "`NONE`" }, doc: "others refused" },
        AttrDecl {
            name: c"qk_norm_epsilon",
            kind: AttrKind::Float { default: 1e-6 },
            doc: "unused (`q_norm_weight` is refused)",
        },
    ],
    devices: DEVICES,
    compute: super::gqa::compute,
    infer: super::gqa::infer,
    ort: Some(OrtDecl {
        name: c"GroupQueryAttention",
        cuda: &[DType::F16, DType::BF16],
        cpu: &[DType::F32, DType::F16],
    }),
};

/// ONNX Runtime 1.31's `com.microsoft` `RotaryEmbedding` (semantics: `host/ops/attention/rotary_embedding.rs`).
pub static ROTARY_EMBEDDING: OpDecl = OpDecl {
    name: "dlkern.rotary_embedding",
    inputs: &[
        TensorDecl {
            name: "input",
            ty: TensorType::T,
            optional: false,
            shape: "`[B, S, hidden]` or `[B, N, S, head_size]`",
        },
        TensorDecl {
            name: "position_ids",
            ty: TensorType::Fixed(DType::I64),
            optional: false,
            shape: "`[B, S]`, or one element `p` (positions `p + s`)",
        },
        TensorDecl { name: "cos_cache", ty: TensorType::T, optional: false, shape: "`[max_position, rotary_dim / 2]`" },
        TensorDecl { name: "sin_cache", ty: TensorType::T, optional: false, shape: "as `cos_cache`" },
    ],
    outputs: &[TensorDecl { name: "output", ty: TensorType::T, optional: false, shape: "as `input`" }],
    attrs: &[
        AttrDecl {
            name: c"num_heads",
            kind: AttrKind::OptionalInt { default: "0 (from the head size)" },
            doc: "needed with `rotary_embedding_dim`",
        },
        AttrDecl {
            name: c"rotary_embedding_dim",
            kind: AttrKind::OptionalInt { default: "0 (the head size, `2 * cos_cache` columns)" },
            doc: "rotated elements per head",
        },
        AttrDecl {
            name: c"interleaved",
            kind: AttrKind::OptionalInt { default: "0" },
            doc: "pairs `(2i, 2i + 1)` instead of `(i, i + rotary_dim / 2)`",
        },
        AttrDecl { name: c"is_packed_batching", kind: AttrKind::OptionalInt { default: "0" }, doc: "1 refused" },
        AttrDecl { name: c"scale", kind: AttrKind::Float { default: 1.0 }, doc: "no effect (as in ORT)" },
    ],
    devices: DEVICES,
    compute: super::rotary_embedding::compute,
    infer: crate::ops::common::same_as_first_input,
    ort: Some(OrtDecl {
        name: c"RotaryEmbedding",
        cuda: &[DType::F32, DType::F16, DType::BF16],
        cpu: &[DType::F32, DType::F16],
    }),
};

pub static ATTENTION: OpDecl = OpDecl {
    name: "dlkern.attention",
    inputs: INPUTS,
    outputs: &[OUT],
    attrs: ATTRS,
    devices: DEVICES,
    compute,
    infer,
    ort: Some(OrtDecl { name: c"FlashAttention", cuda: &[DType::F16, DType::BF16], cpu: &[DType::F32, DType::F16] }),
};

pub static ATTENTION_LSE: OpDecl = OpDecl {
    name: "dlkern.attention_lse",
    inputs: INPUTS,
    outputs: &[
        OUT,
        TensorDecl {
            name: "lse",
            ty: TensorType::Fixed(DType::F32),
            optional: false,
            shape: "`[B, H, Sq]`, or `[H, total_q]` packed; natural log; `-inf` for a row that sees no key (its output is 0)",
        },
    ],
    attrs: ATTRS,
    devices: DEVICES,
    compute,
    infer,
    ort: None,
};

/// Shapes of one call (from shapes alone, so inference can use it too).
struct Layout {
    batch: usize,
    /// `Some((Sq, Sk))` for a padded batch, `None` for varlen.
    padded: Option<(usize, usize)>,
    total_q: usize,
    total_k: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

fn layout(
    name: &str,
    q: &TensorView,
    k: &TensorView,
    v: &TensorView,
    cu: Option<(&TensorView, &TensorView)>,
) -> Result<Layout> {
    let (qd, kd) = (dims(q), dims(k));
    if v.shape() != k.shape() {
        return Err(fail(name, format!("v has shape {:?}, k has {:?} (they must match)", v.shape(), k.shape())));
    }
    let l = match (qd.len(), kd.len(), cu) {
        (4, 4, None) => {
            if qd[0] != kd[0] {
                return Err(fail(name, format!("batch of q ({}) and k ({}) differ", qd[0], kd[0])));
            }
            Layout {
                batch: qd[0],
                padded: Some((qd[1], kd[1])),
                total_q: qd[0] * qd[1],
                total_k: kd[0] * kd[1],
                heads: qd[2],
                kv_heads: kd[2],
                head_dim: qd[3],
            }
        }
        (3, 3, Some((cu_q, cu_k))) => {
            for t in [cu_q, cu_k] {
                t.expect_dtype(&[DType::I32])?;
                t.expect_rank(1, 1)?;
            }
            let batch = (cu_q.len()).saturating_sub(1);
            if cu_q.len() < 2 || cu_k.len() != cu_q.len() {
                return Err(fail(
                    name,
                    format!(
                        "cu_seqlens_q and cu_seqlens_k must both hold batch + 1 >= 2 entries, got {} and {}",
                        cu_q.len(),
                        cu_k.len()
                    ),
                ));
            }
            Layout {
                batch,
                padded: None,
                total_q: qd[0],
                total_k: kd[0],
                heads: qd[1],
                kv_heads: kd[1],
                head_dim: qd[2],
            }
        }
        (4, 4, Some(_)) => return Err(fail(name, "padded [B, S, H, D] inputs take no cu_seqlens".into())),
        (3, 3, None) => {
            return Err(fail(name, "packed [total, H, D] inputs need cu_seqlens_q and cu_seqlens_k".into()));
        }
        _ => {
            return Err(fail(
                name,
                format!(
                    "q {:?} and k {:?}: expected [B, S, H, D] (padded) or [total, H, D] with cu_seqlens",
                    q.shape(),
                    k.shape()
                ),
            ));
        }
    };
    if l.head_dim == 0 || l.heads == 0 || l.kv_heads == 0 || !l.heads.is_multiple_of(l.kv_heads) {
        return Err(fail(
            name,
            format!(
                "{} query heads, {} KV heads, head dim {}: heads must be a positive multiple of KV heads",
                l.heads, l.kv_heads, l.head_dim
            ),
        ));
    }
    if kd.last() != Some(&l.head_dim) {
        return Err(fail(name, format!("head dim of q ({}) and k ({:?}) differ", l.head_dim, kd.last())));
    }
    Ok(l)
}

fn options(name: &str, attrs: &Attributes, l: &Layout) -> Result<AttentionOptions> {
    let causal = match attrs.int("causal")?.unwrap_or(0) {
        0 => false,
        1 => true,
        other => return Err(fail(name, format!("causal = {other} (expected 0 or 1)"))),
    };
    let scale = match attrs.float("scale")?.unwrap_or(0.0) {
        0.0 => 1.0 / (l.head_dim as f64).sqrt(),
        s if s.is_finite() => s,
        s => return Err(fail(name, format!("scale = {s} (must be finite)"))),
    };
    let softcap = attrs.float("softcap")?.unwrap_or(0.0);
    if !(softcap.is_finite() && softcap >= 0.0) {
        return Err(fail(name, format!("softcap = {softcap} (must be finite and >= 0)")));
    }
    let window_left = match attrs.int("window_left")?.unwrap_or(-1) {
        -1 => None,
        w if w >= 0 => Some(w as usize),
        w => return Err(fail(name, format!("window_left = {w} (-1 for none, or >= 0)"))),
    };
    Ok(AttentionOptions {
        num_heads: l.heads,
        num_kv_heads: l.kv_heads,
        head_dim: l.head_dim,
        causal,
        scale,
        softcap,
        window_left,
    })
}

fn lse_shape(l: &Layout) -> Vec<i64> {
    match l.padded {
        Some((sq, _)) => vec![l.batch as i64, l.heads as i64, sq as i64],
        None => vec![l.heads as i64, l.total_q as i64],
    }
}

fn infer(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let name = args.function_name;
    let input = |i: usize| args.inputs.get(i).filter(|t| !t.is_empty());
    let (Some(q), Some(k), Some(v)) = (input(0), input(1), input(2)) else {
        return Err(fail(name, "needs inputs q, k and v".into()));
    };
    let cu = input(3).zip(input(4));
    let l = layout(name, q, k, v, cu)?;
    let mut specs = vec![TensorSpec { dtype: q.dtype(), shape: q.shape().to_vec() }];
    if args.num_outputs == 2 {
        specs.push(TensorSpec { dtype: DType::F32, shape: lse_shape(&l) });
    }
    Ok(specs)
}

/// Sequence offsets: checked `cu_seqlens`, or uniform ones for a padded batch.
///
/// # Safety
/// CPU tensors valid for the call.
unsafe fn offsets(name: &str, l: &Layout, cu: Option<(&TensorView, &TensorView)>) -> Result<(Vec<usize>, Vec<usize>)> {
    let Some((cu_q, cu_k)) = cu else {
        let (sq, sk) = l.padded.unwrap_or((0, 0));
        return Ok(((0..=l.batch).map(|b| b * sq).collect(), (0..=l.batch).map(|b| b * sk).collect()));
    };
    let check = |t: &TensorView, total: usize, what: &str| -> Result<Vec<usize>> {
        // SAFETY: forwarded.
        let cu = unsafe { t.host_slice::<i32>()? };
        let ok = cu.first() == Some(&0)
            && cu.windows(2).all(|w| w[0] <= w[1])
            && cu.last().is_some_and(|&last| last as usize == total);
        if !ok {
            return Err(fail(name, format!("{what} {cu:?} must start at 0, never decrease and end at {total}")));
        }
        Ok(cu.iter().map(|&c| c as usize).collect())
    };
    Ok((check(cu_q, l.total_q, "cu_seqlens_q")?, check(cu_k, l.total_k, "cu_seqlens_k")?))
}

fn compute(args: &KernelArgs) -> Result<()> {
    let name = args.function_name;
    let with_lse = args.num_outputs() == 2;
    args.expect_count_ranges(3..=5, 1..=2)?;
    let q = args.input(0, "q")?;
    let k = args.input(1, "k")?;
    let v = args.input(2, "v")?;
    let cu_q = optional(args, 3, "cu_seqlens_q")?;
    let cu_k = optional(args, 4, "cu_seqlens_k")?;
    let out = args.output(0, "out")?;
    let cu = match (&cu_q, &cu_k) {
        (Some(a), Some(b)) => Some((a, b)),
        (None, None) => None,
        _ => return Err(fail(name, "give both cu_seqlens_q and cu_seqlens_k, or neither".into())),
    };
    let l = layout(name, &q, &k, &v, cu)?;
    let opts = options(name, args.attrs, &l)?;
    q.expect_dtype(&[DType::F32, DType::F16, DType::BF16])?;
    for t in [&k, &v, &out] {
        t.expect_same_dtype(&q)?;
    }
    out.expect_shape(q.shape())?;
    let lse = if with_lse { Some(args.output(1, "lse")?) } else { None };
    if let Some(lse) = &lse {
        lse.expect_dtype(&[DType::F32])?;
        lse.expect_shape(&lse_shape(&l))?;
    }
    for t in
        [Some(&q), Some(&k), Some(&v), cu_q.as_ref(), cu_k.as_ref(), Some(&out), lse.as_ref()].into_iter().flatten()
    {
        t.expect_device(q.device())?;
        t.expect_contiguous()?;
    }
    if let DeviceKind::Cuda(ordinal) = q.device() {
        return compute_cuda(args, ordinal, &l, &opts, [&q, &k, &v, &out], cu, lse.as_ref());
    }
    // SAFETY: CPU tensors (checked above), valid for the call by the registry's contract;
    // outputs are distinct buffers.
    unsafe {
        let (cu_q, cu_k) = offsets(name, &l, cu)?;
        let (o, lse_ref) = attention_varlen(&floats(&q)?, &floats(&k)?, &floats(&v)?, &cu_q, &cu_k, &opts);
        store(&out, &o)?;
        if let Some(lse) = &lse {
            let dst = lse.host_slice_mut::<f32>()?;
            match l.padded {
                // The reference's [H, total_q] rows b * Sq + i become [B, H, Sq].
                Some((sq, _)) => {
                    for b in 0..l.batch {
                        for h in 0..l.heads {
                            for i in 0..sq {
                                dst[(b * l.heads + h) * sq + i] = lse_ref[h * l.total_q + b * sq + i] as f32;
                            }
                        }
                    }
                }
                None => dst.iter_mut().zip(&lse_ref).for_each(|(d, s)| *d = *s as f32),
            }
        }
    }
    Ok(())
}

/// The GPU path: the tensor-core kernel on the caller's stream. Packed batches' lengths stay on
/// the device (the kernel clamps them to the tensors); `max_seqlen_q` (attribute, default the
/// total) sizes the grid.
fn compute_cuda(
    args: &KernelArgs,
    ordinal: i32,
    l: &Layout,
    opts: &AttentionOptions,
    [q, k, v, out]: [&TensorView; 4],
    cu: Option<(&TensorView, &TensorView)>,
    lse: Option<&TensorView>,
) -> Result<()> {
    use crate::ops::attention::launch::{AttentionParams, AttentionPointers, Batch, attention_raw};
    let name = args.function_name;
    let layout = match l.padded {
        Some((seqlen_q, seqlen_k)) => Batch::Padded { seqlen_q, seqlen_k },
        None => {
            let max_seqlen_q = match args.attrs.int("max_seqlen_q")? {
                Some(m) if m >= 1 => (m as usize).min(l.total_q),
                Some(m) => return Err(fail(name, format!("max_seqlen_q = {m} (must be >= 1)"))),
                None => l.total_q,
            };
            Batch::Packed { total_q: l.total_q, total_k: l.total_k, max_seqlen_q }
        }
    };
    if l.total_q == 0 || l.batch == 0 {
        return Ok(());
    }
    let params = AttentionParams {
        dtype: q.dtype(),
        batch: l.batch,
        layout,
        heads: l.heads,
        kv_heads: l.kv_heads,
        head_dim: l.head_dim,
        causal: opts.causal,
        window_left: opts.window_left,
        scale: opts.scale as f32,
        softcap: opts.softcap as f32,
        lse: lse.is_some(),
    };
    let device = crate::runtime::Device::get(ordinal.max(0) as usize)?;
    let ptrs = AttentionPointers {
        q: q.data_address(),
        k: k.data_address(),
        v: v.data_address(),
        out: out.data_address(),
        lse: lse.map_or(0, |t| t.data_address()),
        cu_seqlens_q: cu.map_or(0, |(a, _)| a.data_address()),
        cu_seqlens_k: cu.map_or(0, |(_, b)| b.data_address()),
    };
    // SAFETY: the registry's caller guarantees the tensors' memory for their extents, which the
    // shape checks relate to the parameters; outputs are distinct buffers; the kernel clamps
    // device-side sequence lengths to the tensors.
    unsafe { attention_raw(&device, args.stream.cast(), &params, &ptrs) }.map(|_| ())
}
