//! `dlkern.group_query_attention` (ORT op `GroupQueryAttention`): ONNX Runtime 1.31's
//! `com.microsoft` `GroupQueryAttention`, with its inputs, outputs, attributes and semantics, so
//! that moving a node to domain `dlkern` is the whole change to a model.
//!
//! Semantics (ORT's): `query` `[B, S, H * D]` (or packed QKV `[B, S, (H + 2 Hkv) * D]` when `key`
//! and `value` are absent); caches BNSH `[B, Hkv, L, D]`. Sequence `b` holds `T = seqlens_k[b] + 1`
//! tokens after the step, of which the newest `Q = min(S, T)` are this call's rows `0..Q` (the
//! rest are right padding) and `P = T - Q` were cached before. Row `s` sits at position `P + s`:
//! rotary uses that position, causal attention sees keys `0..=P + s` (within
//! `local_window_size`), and the new keys and values go to cache rows `P..T`. The present caches
//! hold `max(total_sequence_length, L)` positions; when `present_key` is `past_key`'s very buffer
//! (onnxruntime-genai binds them so) only the new rows are written. Output rows `Q..S` and cache
//! rows from `T` on are unspecified (dlkern writes zeros on the CPU and leaves them on the GPU).
//!
//! CPU tensors run the f64 reference. On CUDA tensors (f16, bf16; a copy of the past first when
//! the present is another buffer) a decode step (one new token per sequence) is one launch of
//! the paged family's split-KV decode kernel, which rotates the queries as it reads them and
//! takes each new key and value from the inputs while it appends them to the caches; under a
//! CUDA-graph capture, and for prompts, one rotary launch (new queries into a workspace, new
//! keys and values into the caches) comes first, then the decode kernel or the attention
//! kernel's KV-cache mode.
//! `total_sequence_length` is a host-memory input (as in ORT's CUDA kernel); `seqlens_k` stays
//! on the device there, where the kernels clamp it to the cache (memory-safe, not checked for
//! meaning), while the CPU path checks it.
//!
//! Refused with an error naming them: `position_ids`, `attention_bias`, `head_sink`, the
//! quantized caches (`k_scale`, `v_scale`, `kv_cache_bit_width`, `k_quant_type`,
//! `v_quant_type`), `q_norm_weight` / `k_norm_weight`, `smooth_softmax = 1`, `qk_output != 0`
//! (and the `output_qk` output), `sliding_window_cache = 1`.

use super::launch::{
    CacheAttentionParams, HeadStrides, RotaryParams, RotaryPointers, RotaryPositions, attention_cache_raw,
    rotary_jobs_raw,
};
use super::reference::{AttentionOptions, attention_varlen};
use crate::dlpack::{DeviceKind, TensorView};
use crate::dtype::DType;
use crate::error::Result;
use crate::kernel::{Attributes, InferArgs, KernelArgs, TensorSpec};
use crate::ops::common::rotary::rotate_at;
use crate::ops::common::{dims, fail, floats, head_count, round_to, store};
use crate::ops::paged_attention::launch::{
    BnshAttentionParams, DecodeLimits, NewToken, PagedAttentionPlan, PagedAttentionPointers, paged_attention_bnsh_raw,
};
use crate::runtime::{Device, StreamScratch, copy_2d_async, stream_is_capturing};

thread_local! {
    static TWO_LAUNCH_DECODE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's GroupQueryAttention decode steps on CUDA taken by the two-launch
/// path (the rotary launch, then the decode kernel), as under a CUDA-graph capture, instead of
/// the one launch: for tests and comparisons of the two (their results agree bit for bit).
pub fn with_two_launch_decode<R>(f: impl FnOnce() -> R) -> R {
    let before = TWO_LAUNCH_DECODE.with(|c| c.replace(true));
    let result = f();
    TWO_LAUNCH_DECODE.with(|c| c.set(before));
    result
}

/// Inputs by position (ORT's order).
const QUERY: usize = 0;
const KEY: usize = 1;
const VALUE: usize = 2;
const PAST_KEY: usize = 3;
const PAST_VALUE: usize = 4;
const SEQLENS_K: usize = 5;
const TOTAL_SEQUENCE_LENGTH: usize = 6;
const COS_CACHE: usize = 7;
const SIN_CACHE: usize = 8;
/// Optional inputs ORT defines that dlkern refuses when given.
const REFUSED_INPUTS: &[(usize, &str)] = &[
    (9, "position_ids"),
    (10, "attention_bias"),
    (11, "head_sink"),
    (12, "k_scale"),
    (13, "v_scale"),
    (14, "q_norm_weight"),
    (15, "k_norm_weight"),
];

/// The attributes, checked.
#[derive(Clone, Copy, Debug)]
struct Options {
    heads: usize,
    kv_heads: usize,
    scale: f64,
    softcap: f64,
    /// Keys left of the query's own that it sees (ORT's `local_window_size - 1`).
    window: Option<usize>,
    causal: bool,
    do_rotary: bool,
    interleaved: bool,
}

fn options(name: &str, attrs: &Attributes) -> Result<Options> {
    let int = |key: &str, default: i64| -> Result<i64> { Ok(attrs.int(key)?.unwrap_or(default)) };
    let flag = |key: &str, default: i64| -> Result<bool> {
        match int(key, default)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(fail(name, format!("{key} = {other} (expected 0 or 1)"))),
        }
    };
    let heads = attrs.int("num_heads")?.ok_or_else(|| fail(name, "missing attribute num_heads".into()))?;
    let kv_heads = attrs.int("kv_num_heads")?.ok_or_else(|| fail(name, "missing attribute kv_num_heads".into()))?;
    // (Bounded before any size is computed from them.)
    head_count(name, "num_heads", heads)?;
    head_count(name, "kv_num_heads", kv_heads)?;
    if heads % kv_heads != 0 {
        return Err(fail(
            name,
            format!("num_heads = {heads}, kv_num_heads = {kv_heads}: both >= 1, num_heads a multiple of kv_num_heads"),
        ));
    }
    for (key, default, what) in [
        ("smooth_softmax", 0, "smooth softmax"),
        ("qk_output", 0, "the QK output"),
        ("sliding_window_cache", 0, "a window-sized (sliding) KV cache"),
    ] {
        if int(key, default)? != default {
            return Err(fail(name, format!("{key} = {}: dlkern does not support {what}", int(key, default)?)));
        }
    }
    if let Some(bits) = attrs.int("kv_cache_bit_width")? {
        return Err(fail(name, format!("kv_cache_bit_width = {bits}: dlkern does not support quantized KV caches")));
    }
    for key in ["k_quant_type", "v_quant_type"] {
        if let Some(kind) = attrs.string(key)?
            && kind != "NONE"
        {
            return Err(fail(name, format!("{key} = {kind:?}: dlkern does not support quantized KV caches")));
        }
    }
    let causal = flag("causal", 1)?;
    let window = match int("local_window_size", -1)? {
        -1 => None,
        // ORT's window counts the query's own key: `w` keys, so `w - 1` to its left.
        w if w > 0 && causal => Some(w as usize - 1),
        w if !causal => return Err(fail(name, format!("local_window_size = {w} needs causal = 1"))),
        w => return Err(fail(name, format!("local_window_size = {w} (-1 for none, or >= 1)"))),
    };
    let scale = attrs.float("scale")?.unwrap_or(0.0);
    let softcap = attrs.float("softcap")?.unwrap_or(0.0);
    if !(scale.is_finite() && softcap.is_finite() && softcap >= 0.0) {
        return Err(fail(name, format!("scale = {scale}, softcap = {softcap}: finite, softcap >= 0")));
    }
    Ok(Options {
        heads: heads as usize,
        kv_heads: kv_heads as usize,
        scale,
        softcap,
        window,
        causal,
        do_rotary: flag("do_rotary", 0)?,
        interleaved: flag("rotary_interleaved", 0)?,
    })
}

/// Shapes of one call, from shapes alone (inference uses it too) plus `total_sequence_length`
/// when its value is known.
#[derive(Clone, Copy, Debug)]
struct Shape {
    batch: usize,
    seq: usize,
    head_size: usize,
    packed: bool,
    /// Positions of the past caches, 0 without them.
    past_len: usize,
    /// Positions of the present caches.
    present_len: usize,
    /// `total_sequence_length` (the longest sequence's tokens), or `present_len` unknown.
    max_keys: usize,
    /// Rotated elements per head (0: no rotary).
    rotary_dim: usize,
    /// Rows of the cos / sin caches.
    max_position: usize,
}

fn shape(name: &str, o: &Options, inputs: &[Option<&TensorView>], total: Option<usize>) -> Result<Shape> {
    let q = inputs[QUERY].ok_or_else(|| fail(name, "missing input query".into()))?;
    let qd = dims(q);
    if qd.len() != 3 {
        return Err(fail(name, format!("query has shape {:?}, expected [batch, sequence, hidden]", q.shape())));
    }
    let (batch, seq) = (qd[0], qd[1]);
    let (packed, head_size) = match (inputs[KEY], inputs[VALUE]) {
        (None, None) => (true, qd[2] / (o.heads + 2 * o.kv_heads)),
        (Some(k), Some(v)) => {
            if !qd[2].is_multiple_of(o.heads) {
                return Err(fail(
                    name,
                    format!("query hidden size {} is not a multiple of num_heads {}", qd[2], o.heads),
                ));
            }
            let hs = qd[2] / o.heads;
            for (t, what) in [(k, "key"), (v, "value")] {
                let expect = [batch as i64, seq as i64, (o.kv_heads * hs) as i64];
                if t.shape() != expect {
                    return Err(fail(
                        name,
                        format!("{what} has shape {:?}, expected {expect:?} (kv_num_heads x head size)", t.shape()),
                    ));
                }
            }
            (false, hs)
        }
        _ => return Err(fail(name, "key and value must both be given, or both absent (packed QKV)".into())),
    };
    let width = if packed { (o.heads + 2 * o.kv_heads) * head_size } else { o.heads * head_size };
    if head_size == 0 || width != qd[2] || !head_size.is_multiple_of(8) {
        return Err(fail(
            name,
            format!(
                "query hidden size {} does not split into {} heads{} of a head size that is a multiple of 8",
                qd[2],
                o.heads,
                if packed { format!(" + 2 x {} KV heads", o.kv_heads) } else { String::new() }
            ),
        ));
    }
    let (past_len, has_past) = match (inputs[PAST_KEY], inputs[PAST_VALUE]) {
        (None, None) => (0, false),
        (Some(pk), Some(pv)) => {
            let pd = dims(pk);
            if pd.len() != 4 || pd[0] != batch || pd[1] != o.kv_heads || pd[3] != head_size || pv.shape() != pk.shape()
            {
                return Err(fail(
                    name,
                    format!(
                        "past_key {:?} and past_value {:?} must both be [batch {batch}, kv_num_heads {}, length, head \
                         size {head_size}]",
                        pk.shape(),
                        pv.shape(),
                        o.kv_heads
                    ),
                ));
            }
            (pd[2], true)
        }
        _ => return Err(fail(name, "past_key and past_value must both be given, or both absent".into())),
    };
    let (rotary_dim, max_position) = match (inputs[COS_CACHE], inputs[SIN_CACHE]) {
        (None, None) if o.do_rotary => return Err(fail(name, "do_rotary = 1 needs cos_cache and sin_cache".into())),
        (None, None) => (0, 0),
        (Some(c), Some(s)) => {
            let cd = dims(c);
            if cd.len() != 2 || c.shape() != s.shape() {
                return Err(fail(
                    name,
                    format!(
                        "cos_cache {:?} and sin_cache {:?} must be one [positions, rotary_dim / 2] shape",
                        c.shape(),
                        s.shape()
                    ),
                ));
            }
            if o.do_rotary
                && (!head_size.is_multiple_of(16)
                    || cd[1] > head_size / 16 * 8
                    || !cd[1].is_multiple_of(8)
                    || cd[1] == 0)
            {
                return Err(fail(
                    name,
                    format!(
                        "rotary: head size {head_size} must be a multiple of 16 and cos_cache's {} columns a positive \
                         multiple of 8 and at most head size / 2",
                        cd[1]
                    ),
                ));
            }
            if o.do_rotary { (2 * cd[1], cd[0]) } else { (0, 0) }
        }
        _ => return Err(fail(name, "cos_cache and sin_cache must both be given, or both absent".into())),
    };
    // Without the value (shape inference), a shared buffer's length, or this step's tokens.
    let present_len = match total {
        Some(t) => t.max(past_len),
        None if has_past => past_len,
        None => seq,
    };
    if let Some(total) = total {
        if total < seq && has_past {
            return Err(fail(name, format!("total_sequence_length {total} is below the sequence length {seq}")));
        }
        if rotary_dim > 0 && max_position < total {
            return Err(fail(
                name,
                format!("cos_cache has {max_position} positions, fewer than total_sequence_length {total}"),
            ));
        }
    }
    Ok(Shape {
        batch,
        seq,
        head_size,
        packed,
        past_len,
        present_len,
        max_keys: total.unwrap_or(present_len),
        rotary_dim,
        max_position,
    })
}

fn output_specs(o: &Options, s: &Shape, dtype: DType, num_outputs: usize) -> Vec<TensorSpec> {
    let (out, cache) = output_shapes(o, s);
    let mut specs = vec![TensorSpec { dtype, shape: out.to_vec() }];
    for _ in 1..num_outputs.min(3) {
        specs.push(TensorSpec { dtype, shape: cache.to_vec() });
    }
    specs
}

/// The output's shape and the present caches'.
fn output_shapes(o: &Options, s: &Shape) -> ([i64; 3], [i64; 4]) {
    (
        [s.batch as i64, s.seq as i64, (o.heads * s.head_size) as i64],
        [s.batch as i64, o.kv_heads as i64, s.present_len as i64, s.head_size as i64],
    )
}

/// `total_sequence_length`'s value when its data is readable here (host memory).
fn total_of(name: &str, t: &TensorView) -> Result<Option<usize>> {
    if t.len() != 1 {
        return Err(fail(name, format!("total_sequence_length has shape {:?}, expected one element", t.shape())));
    }
    t.expect_dtype(&[DType::I32])?;
    if t.data_address() == 0 {
        return Ok(None);
    }
    if t.device() != DeviceKind::Cpu {
        return Err(fail(name, "total_sequence_length must be in host memory".into()));
    }
    // SAFETY: a host tensor of one i32, valid for the call (the registry's contract).
    let total = unsafe { t.host_slice::<i32>()? }[0];
    if total < 1 {
        return Err(fail(name, format!("total_sequence_length = {total} (must be >= 1)")));
    }
    Ok(Some(total as usize))
}

pub(super) fn infer(args: &InferArgs) -> Result<Vec<TensorSpec>> {
    let name = args.function_name;
    let o = options(name, args.attrs)?;
    let inputs: [Option<&TensorView>; SIN_CACHE + 1] =
        std::array::from_fn(|i| args.inputs.get(i).filter(|t| !t.is_empty()));
    let total = match inputs[TOTAL_SEQUENCE_LENGTH] {
        Some(t) => total_of(name, t)?,
        None => return Err(fail(name, "missing input total_sequence_length".into())),
    };
    let s = shape(name, &o, &inputs, total)?;
    let q = inputs[QUERY].expect("checked by shape");
    Ok(output_specs(&o, &s, q.dtype(), args.num_outputs))
}

pub(super) fn compute(args: &KernelArgs) -> Result<()> {
    let name = args.function_name;
    args.expect_count_ranges(7..=16, 1..=4)?;
    let o = options(name, args.attrs)?;
    let mut inputs: [Option<TensorView>; 16] = [None; 16];
    for (i, name) in INPUT_NAMES.iter().enumerate().take(args.num_inputs()) {
        let t = args.input(i, name)?;
        inputs[i] = if t.is_empty() { None } else { Some(t) };
    }
    for &(i, what) in REFUSED_INPUTS {
        if inputs[i].is_some() {
            return Err(fail(name, format!("input {what} is not supported by dlkern")));
        }
    }
    if args.num_outputs() == 4 && !args.output(3, "output_qk")?.is_empty() {
        return Err(fail(name, "output output_qk is not supported by dlkern".into()));
    }
    if args.num_outputs() < 3 {
        return Err(fail(name, "dlkern needs the present_key and present_value outputs".into()));
    }
    let refs = inputs.each_ref().map(Option::as_ref);
    let seqlens = refs[SEQLENS_K].ok_or_else(|| fail(name, "missing input seqlens_k".into()))?;
    let total_t =
        refs[TOTAL_SEQUENCE_LENGTH].ok_or_else(|| fail(name, "missing input total_sequence_length".into()))?;
    let total = total_of(name, total_t)?.ok_or_else(|| fail(name, "total_sequence_length has no data".into()))?;
    let s = shape(name, &o, &refs, Some(total))?;
    let q = refs[QUERY].expect("checked by shape");
    let dtype = q.expect_dtype(&[DType::F32, DType::F16, DType::BF16])?;
    seqlens.expect_dtype(&[DType::I32])?;
    seqlens.expect_shape(&[s.batch as i64])?;
    let out = args.output(0, "output")?;
    let present_k = args.output(1, "present_key")?;
    let present_v = args.output(2, "present_value")?;
    let (out_shape, cache_shape) = output_shapes(&o, &s);
    for (t, shape) in [(&out, &out_shape[..]), (&present_k, &cache_shape), (&present_v, &cache_shape)] {
        t.expect_dtype(&[dtype])?;
        t.expect_shape(shape)?;
    }
    let floats_in = [KEY, VALUE, PAST_KEY, PAST_VALUE, COS_CACHE, SIN_CACHE].iter().filter_map(|&i| refs[i]);
    for t in floats_in.clone().chain([&out, &present_k, &present_v]) {
        t.expect_dtype(&[dtype])?;
    }
    for t in floats_in.chain([q, seqlens, &out, &present_k, &present_v]) {
        t.expect_device(q.device())?;
        t.expect_contiguous()?;
    }
    match q.device() {
        DeviceKind::Cuda(ordinal) => compute_cuda(args, ordinal, &o, &s, &refs, [&out, &present_k, &present_v]),
        DeviceKind::Cpu => {
            // SAFETY: CPU tensors (checked above), valid for the call by the registry's contract.
            unsafe { compute_cpu(name, &o, &s, &refs, [&out, &present_k, &present_v]) }
        }
    }
}

const INPUT_NAMES: [&str; 16] = [
    "query",
    "key",
    "value",
    "past_key",
    "past_value",
    "seqlens_k",
    "total_sequence_length",
    "cos_cache",
    "sin_cache",
    "position_ids",
    "attention_bias",
    "head_sink",
    "k_scale",
    "v_scale",
    "q_norm_weight",
    "k_norm_weight",
];

/// Each sequence's `(P, Q)`: tokens cached before the step and new tokens, from `seqlens_k`,
/// checked against the caches.
fn steps(name: &str, s: &Shape, seqlens: &[i32]) -> Result<Vec<(usize, usize)>> {
    seqlens
        .iter()
        .enumerate()
        .map(|(b, &k)| {
            let total = k as i64 + 1;
            if total < 1 || total as usize > s.present_len {
                return Err(fail(
                    name,
                    format!(
                        "seqlens_k[{b}] = {k}: the sequence's {total} tokens do not fit the cache's {} positions",
                        s.present_len
                    ),
                ));
            }
            let total = total as usize;
            let new = s.seq.min(total);
            let past = total - new;
            if past > s.past_len {
                return Err(fail(
                    name,
                    format!("seqlens_k[{b}] = {k}: {past} cached tokens, but past_key holds {} positions", s.past_len),
                ));
            }
            if s.rotary_dim > 0 && total > s.max_position {
                return Err(fail(
                    name,
                    format!("seqlens_k[{b}] = {k}: beyond cos_cache's {} positions", s.max_position),
                ));
            }
            Ok((past, new))
        })
        .collect()
}

/// # Safety
/// CPU tensors valid for the call; outputs writable (the present caches may be the past ones).
unsafe fn compute_cpu(
    name: &str,
    o: &Options,
    s: &Shape,
    inputs: &[Option<&TensorView>],
    [out, present_k, present_v]: [&TensorView; 3],
) -> Result<()> {
    let (h, hkv, d) = (o.heads, o.kv_heads, s.head_size);
    let q_t = inputs[QUERY].expect("checked");
    let dtype = q_t.dtype();
    // SAFETY (whole body): forwarded; inputs are read into owned vectors before any output is
    // written, so a present cache that is its past's buffer reads its old contents.
    unsafe {
        let seqlens = inputs[SEQLENS_K].expect("checked").host_slice::<i32>()?;
        let steps = steps(name, s, seqlens)?;
        let query = floats(q_t)?;
        let (key, value) = match (inputs[KEY], inputs[VALUE]) {
            (Some(k), Some(v)) => (Some(floats(k)?), Some(floats(v)?)),
            _ => (None, None),
        };
        let past = match (inputs[PAST_KEY], inputs[PAST_VALUE]) {
            (Some(k), Some(v)) => Some((floats(k)?, floats(v)?)),
            _ => None,
        };
        let rotary = match (inputs[COS_CACHE], inputs[SIN_CACHE]) {
            (Some(c), Some(sn)) if s.rotary_dim > 0 => {
                let wide = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
                Some((wide(floats(c)?), wide(floats(sn)?)))
            }
            _ => None,
        };
        let row = if s.packed { (h + 2 * hkv) * d } else { h * d };
        // Head `n` of token `(b, t)` of the new keys / values (packed: after the query heads).
        let new_head = |which: usize, b: usize, t: usize, n: usize| -> Vec<f64> {
            let (src, base, width) = match (which, &key, &value) {
                (1, Some(k), _) => (k, 0, hkv * d),
                (2, _, Some(v)) => (v, 0, hkv * d),
                (w, _, _) => (&query, (h + (w - 1) * hkv) * d, row),
            };
            src[(b * s.seq + t) * width + base + n * d..][..d].iter().map(|&x| x as f64).collect()
        };
        let rotate = |head: &mut Vec<f64>, position: usize| {
            if let Some((cos, sin)) = &rotary {
                rotate_at(head, cos, sin, position, s.rotary_dim, o.interleaved);
                head.iter_mut().for_each(|x| *x = round_to(dtype, *x));
            }
        };
        // The present caches: zeros, the past's first P rows, then the new tokens.
        let cache_len = s.present_len;
        let mut caches = [vec![0.0f64; s.batch * hkv * cache_len * d], vec![0.0f64; s.batch * hkv * cache_len * d]];
        for (b, &(p, new)) in steps.iter().enumerate() {
            for n in 0..hkv {
                for (which, cache) in caches.iter_mut().enumerate() {
                    let dst = |t: usize| ((b * hkv + n) * cache_len + t) * d;
                    if let Some((pk, pv)) = &past {
                        let src = if which == 0 { pk } else { pv };
                        for t in 0..p {
                            let from = ((b * hkv + n) * s.past_len + t) * d;
                            for (x, &y) in cache[dst(t)..][..d].iter_mut().zip(&src[from..from + d]) {
                                *x = y as f64;
                            }
                        }
                    }
                    for t in 0..new {
                        let mut head = new_head(which + 1, b, t, n);
                        if which == 0 {
                            rotate(&mut head, p + t);
                        }
                        cache[dst(p + t)..][..d].copy_from_slice(&head);
                    }
                }
            }
        }
        // Attention per sequence: its Q new query rows against its T cached keys.
        let opts = AttentionOptions {
            num_heads: h,
            num_kv_heads: hkv,
            head_dim: d,
            causal: o.causal,
            scale: if o.scale == 0.0 { 1.0 / (d as f64).sqrt() } else { o.scale },
            softcap: o.softcap,
            window_left: o.window,
        };
        let mut output = vec![0.0f64; s.batch * s.seq * h * d];
        for (b, &(p, new)) in steps.iter().enumerate() {
            let total = p + new;
            let mut qs = Vec::with_capacity(new * h * d);
            for t in 0..new {
                for n in 0..h {
                    let mut head: Vec<f64> =
                        query[(b * s.seq + t) * row + n * d..][..d].iter().map(|&x| x as f64).collect();
                    rotate(&mut head, p + t);
                    qs.extend(head);
                }
            }
            let gather = |cache: &[f64]| {
                let mut rows = Vec::with_capacity(total * hkv * d);
                for t in 0..total {
                    for n in 0..hkv {
                        rows.extend_from_slice(&cache[((b * hkv + n) * cache_len + t) * d..][..d]);
                    }
                }
                rows
            };
            let (ks, vs) = (gather(&caches[0]), gather(&caches[1]));
            // Every value is a rounded input or rotated head (f32 or narrower): exact in f32.
            let narrow = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
            let (qs, ks, vs) = (narrow(qs), narrow(ks), narrow(vs));
            let (o_b, _) = attention_varlen(&qs, &ks, &vs, &[0, new], &[0, total], &opts);
            output[b * s.seq * h * d..][..new * h * d].copy_from_slice(&o_b);
        }
        store(out, &output)?;
        store(present_k, &caches[0])?;
        store(present_v, &caches[1])?;
    }
    Ok(())
}

/// The GPU path, on the caller's stream: a decode step in one launch of the decode kernel
/// (rotary and append inside it; its workspace kept per stream), or under a capture and for
/// prompts the rotary / append launch, then the decode kernel or the attention kernel's KV-cache
/// mode.
fn compute_cuda(
    args: &KernelArgs,
    ordinal: i32,
    o: &Options,
    s: &Shape,
    inputs: &[Option<&TensorView>],
    [out, present_k, present_v]: [&TensorView; 3],
) -> Result<()> {
    let q = inputs[QUERY].expect("checked");
    let dtype = q.expect_dtype(&[DType::F16, DType::BF16])?;
    let (h, hkv, d) = (o.heads, o.kv_heads, s.head_size);
    let device = Device::get(ordinal.max(0) as usize)?;
    let stream = args.stream.cast();
    let size = dtype.size_bytes();
    let row = if s.packed { (h + 2 * hkv) * d } else { h * d };
    let cache = HeadStrides { batch: hkv * s.present_len * d, seq: d, head: s.present_len * d };
    let seqlens = inputs[SEQLENS_K].expect("checked").data_address();
    let (cos, sin) = match (inputs[COS_CACHE], inputs[SIN_CACHE]) {
        (Some(c), Some(sn)) if s.rotary_dim > 0 => (c.data_address(), sn.data_address()),
        _ => (0, 0),
    };
    let rotary = |heads: usize, rotary_dim: usize, src: HeadStrides, dst: HeadStrides, positions: RotaryPositions| {
        RotaryParams {
            dtype,
            batch: s.batch,
            seq: s.seq,
            heads,
            head_size: d,
            rotary_dim,
            interleaved: o.interleaved,
            src,
            dst,
            positions,
            max_position: s.max_position,
        }
    };
    let pointers = |src: u64, dst: u64| RotaryPointers { src, dst, cos, sin, position_ids: 0, seqlens_k: seqlens };
    // The new tokens' keys and values, in the layout of the query (packed) or their own.
    let (k_src, v_src, kv_strides) = match (inputs[KEY], inputs[VALUE]) {
        (Some(k), Some(v)) => {
            (k.data_address(), v.data_address(), HeadStrides { batch: s.seq * hkv * d, seq: hkv * d, head: d })
        }
        _ => {
            let base = q.data_address();
            (
                base + (h * d * size) as u64,
                base + ((h + hkv) * d * size) as u64,
                HeadStrides { batch: s.seq * row, seq: row, head: d },
            )
        }
    };
    let q_strides = HeadStrides { batch: s.seq * row, seq: row, head: d };
    let scale = if o.scale == 0.0 { 1.0 / (d as f32).sqrt() } else { o.scale as f32 };
    // One new token per sequence: the split-KV decode kernels (the paged family's, over the
    // BNSH cache as one block per sequence; all query heads of a KV head in one pass over it);
    // otherwise the prefill kernel's KV-cache mode.
    let decode = BnshAttentionParams {
        dtype,
        batch: s.batch,
        q_len: 1,
        num_q_heads: h,
        num_kv_heads: hkv,
        head_size: d,
        capacity: s.present_len,
        max_keys: s.present_len.min(s.max_keys),
        scale,
        softcap: o.softcap as f32,
        window: o.window.map_or(0, |w| w + 1),
        q_token_stride: row,
    };
    let decode = (s.seq == 1 && decode.supported()).then_some(decode);
    // The new token as the one-launch decode takes it from the inputs.
    let fresh = NewToken {
        key: k_src,
        value: v_src,
        cos,
        sin,
        kv_batch_stride: kv_strides.batch as u32,
        rotary_dim: s.rotary_dim as u32,
        interleaved: o.interleaved as u32,
        max_position: if s.rotary_dim == 0 { u32::MAX } else { s.max_position.min(u32::MAX as usize) as u32 },
    };
    // One launch where the kernel takes these inputs as they are (else the rotary launch makes
    // them what the decode kernel reads).
    let one_launch = decode.is_some_and(|p| p.check_new_token(&fresh).is_ok())
        && q.data_address().is_multiple_of(16)
        && !TWO_LAUNCH_DECODE.with(|c| c.get())
        // SAFETY: `stream` is ORT's (or the registry caller's) stream of this device.
        && !unsafe { stream_is_capturing(&device, stream)? };
    // The kernels read queries with a row stride, so only the two-launch path's rotated ones
    // need the workspace's dense copy.
    let dense_q = !one_launch && s.rotary_dim > 0;
    let decode = decode.map(|p| BnshAttentionParams { q_token_stride: if dense_q { h * d } else { row }, ..p });
    let decode_plan = match &decode {
        Some(p) => Some(p.plan(DecodeLimits::of(&device, p.dtype, p.head_size)?)?),
        None => None,
    };
    // SAFETY: the registry's caller guarantees the tensors' memory for their extents, which the
    // shape checks above relate to every parameter; the kernels clamp device-side lengths to
    // the caches and write NaN for device-side positions outside the cos / sin caches.
    unsafe {
        if let (Some(pk), Some(pv)) = (inputs[PAST_KEY], inputs[PAST_VALUE]) {
            // A present cache in another buffer starts as a copy of the past (one strided copy
            // per cache: each head's past rows into its longer present rows).
            let (row, past_pitch, present_pitch) =
                (s.past_len * d * size, s.past_len * d * size, s.present_len * d * size);
            for (from, to) in [(pk, present_k), (pv, present_v)] {
                if from.data_address() != to.data_address() {
                    copy_2d_async(
                        &device,
                        stream,
                        (to.data_address(), present_pitch),
                        (from.data_address(), past_pitch),
                        row,
                        s.batch * hkv,
                    )?;
                }
            }
        }
        // Decode: the status word the kernels flag bad lengths in (they write NaN rows for
        // them; nothing reads it back), the counters that let the last partition block of each
        // row tile merge the partitions (no combine launch), then the partial results.
        let status_words = decode_plan.map_or(0, |p| p.status_words());
        let decode_bytes = decode_plan.map_or(0, |p| p.scratch_bytes());
        // The decode kernel's pointers, with queries at `q_ptr` and its status word, counters
        // and partial sums from `status` on.
        let decode_ptrs = |q_ptr: u64, status: u64, plan: &PagedAttentionPlan| PagedAttentionPointers {
            q: q_ptr,
            key_cache: present_k.data_address(),
            value_cache: present_v.data_address(),
            context_lens: seqlens,
            out: out.data_address(),
            ..plan.scratch_pointers(status)
        };
        if let (true, Some(params), Some(plan)) = (one_launch, &decode, decode_plan) {
            // One launch: the kernel leaves the counters zero, so the stream's kept workspace
            // serves every call on it without clearing.
            let ws = device.stream_workspace(stream, decode_bytes)?;
            paged_attention_bnsh_raw(&device, stream, params, plan, &decode_ptrs(q.data_address(), ws, &plan), &fresh)?;
            return Ok(());
        }
        let q_bytes = if dense_q { (s.batch * s.seq * h * d * size).next_multiple_of(256) } else { 0 };
        // SAFETY: `stream` is ORT's (or the registry caller's) stream of this device; the
        // scratch is freed on it after the launches below.
        let workspace = StreamScratch::new(&device, stream, q_bytes + decode_bytes)?;
        // The new keys (rotated) and values appended to the caches, and the queries rotated
        // into the dense workspace layout where the kernels need it: one launch, which also
        // clears the decode kernels' status word and counters.
        let append = RotaryPositions::CacheAppend { capacity: s.present_len };
        let mut jobs = vec![
            (rotary(hkv, s.rotary_dim, kv_strides, cache, append), pointers(k_src, present_k.data_address())),
            (rotary(hkv, 0, kv_strides, cache, append), pointers(v_src, present_v.data_address())),
        ];
        let (q_ptr, q_row_stride) = if dense_q {
            let dense = HeadStrides { batch: s.seq * h * d, seq: h * d, head: d };
            let query = RotaryPositions::CacheQuery { capacity: s.present_len };
            jobs.push((
                rotary(h, s.rotary_dim, q_strides, dense, query),
                pointers(q.data_address(), workspace.address()),
            ));
            (workspace.address(), h * d)
        } else {
            (q.data_address(), row)
        };
        let status = decode.is_some().then(|| workspace.address() + q_bytes as u64);
        rotary_jobs_raw(&device, stream, &jobs, (status.unwrap_or(0), status_words))?;
        let tensors = [q_ptr, present_k.data_address(), present_v.data_address(), out.data_address(), seqlens];
        if let (Some(params), Some(plan), Some(status)) = (&decode, decode_plan, status) {
            let ptrs = decode_ptrs(q_ptr, status, &plan);
            paged_attention_bnsh_raw(&device, stream, params, plan, &ptrs, &NewToken::default())?;
            drop(workspace);
            return Ok(());
        }
        let params = CacheAttentionParams {
            dtype,
            batch: s.batch,
            seqlen_q: s.seq,
            capacity: s.present_len,
            heads: h,
            kv_heads: hkv,
            head_dim: d,
            q_row_stride,
            causal: o.causal,
            window_left: o.window,
            scale,
            softcap: o.softcap as f32,
        };
        attention_cache_raw(&device, stream, &params, tensors)?;
        drop(workspace);
    }
    Ok(())
}
