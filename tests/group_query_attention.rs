//! `dlkern.group_query_attention` and `dlkern.rotary_embedding` through the registry: on CPU
//! tensors against a naive implementation of ONNX Runtime's semantics written here (the ORT
//! kernels themselves are the oracle of `tests/python/test_ort_gqa.py`), and on CUDA tensors
//! against the CPU op (`#[ignore = "needs a CUDA device"]`), including a guard region after the
//! caches that no call may touch.

mod common;

use common::{Host, Rng};
use dlkern::registry::{self, AttrValue, Attributes};
use half::f16;

const GQA: &str = "dlkern.group_query_attention";
const ROTARY: &str = "dlkern.rotary_embedding";

/// One GroupQueryAttention call: separate Q/K/V, a past in its own buffer (or none), rotary.
#[derive(Clone, Debug)]
struct Case {
    batch: usize,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    head: usize,
    /// Tokens of each sequence after the step (`seqlens_k + 1`).
    lengths: Vec<usize>,
    /// Positions of the past caches (`None`: no past inputs).
    past: Option<usize>,
    rotary_dim: usize,
    interleaved: bool,
    window: i64,
    softcap: f64,
}

struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    past_k: Vec<f64>,
    past_v: Vec<f64>,
    cos: Vec<f64>,
    sin: Vec<f64>,
    total: usize,
    positions: usize,
}

fn inputs(c: &Case, rng: &mut Rng) -> Inputs {
    let round = |v: Vec<f16>| v.into_iter().map(|x| x.to_f64()).collect::<Vec<f64>>();
    let total = *c.lengths.iter().max().unwrap();
    let past_len = c.past.unwrap_or(0);
    let positions = total.max(past_len) + 2;
    let half = c.rotary_dim / 2;
    let angles: Vec<f64> =
        (0..positions * half).map(|i| (i / half.max(1)) as f64 * 0.01 * (1 + i % half.max(1)) as f64).collect();
    Inputs {
        q: round(rng.vec(c.batch * c.seq * c.heads * c.head, -1.0, 1.0)),
        k: round(rng.vec(c.batch * c.seq * c.kv_heads * c.head, -1.0, 1.0)),
        v: round(rng.vec(c.batch * c.seq * c.kv_heads * c.head, -1.0, 1.0)),
        past_k: round(rng.vec(c.batch * c.kv_heads * past_len * c.head, -1.0, 1.0)),
        past_v: round(rng.vec(c.batch * c.kv_heads * past_len * c.head, -1.0, 1.0)),
        cos: angles.iter().map(|a| f16::from_f64(a.cos()).to_f64()).collect(),
        sin: angles.iter().map(|a| f16::from_f64(a.sin()).to_f64()).collect(),
        total,
        positions,
    }
}

/// ORT's GroupQueryAttention, naively: returns (output, present_k, present_v) with the present
/// caches of `max(total, past)` positions (rows from each sequence's length on are zero).
fn naive(c: &Case, x: &Inputs) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (h, hkv, d) = (c.heads, c.kv_heads, c.head);
    let past_len = c.past.unwrap_or(0);
    let cap = x.total.max(past_len);
    let rope = |head: &[f64], pos: usize| -> Vec<f64> {
        let mut out = head.to_vec();
        let half = c.rotary_dim / 2;
        for i in 0..c.rotary_dim {
            // ORT's formulation, element by element (rotary_embedding.cc).
            let (cache, sign, j) = if c.interleaved {
                (i / 2, if i % 2 == 0 { -1.0 } else { 1.0 }, if i % 2 == 0 { i + 1 } else { i - 1 })
            } else {
                (i % half, if i < half { -1.0 } else { 1.0 }, (i + half) % c.rotary_dim)
            };
            let rotated = head[i] * x.cos[pos * half + cache] + sign * head[j] * x.sin[pos * half + cache];
            out[i] = f16::from_f64(rotated).to_f64();
        }
        out
    };
    let mut pk = vec![0.0; c.batch * hkv * cap * d];
    let mut pv = pk.clone();
    let mut out = vec![0.0; c.batch * c.seq * h * d];
    for b in 0..c.batch {
        let t = c.lengths[b];
        let new = c.seq.min(t);
        let p = t - new;
        for n in 0..hkv {
            let at = |pos: usize| ((b * hkv + n) * cap + pos) * d;
            for pos in 0..p {
                let from = ((b * hkv + n) * past_len + pos) * d;
                pk[at(pos)..at(pos) + d].copy_from_slice(&x.past_k[from..from + d]);
                pv[at(pos)..at(pos) + d].copy_from_slice(&x.past_v[from..from + d]);
            }
            for s in 0..new {
                let from = ((b * c.seq + s) * hkv + n) * d;
                let k = &x.k[from..from + d];
                let k = if c.rotary_dim > 0 { rope(k, p + s) } else { k.to_vec() };
                pk[at(p + s)..at(p + s) + d].copy_from_slice(&k);
                pv[at(p + s)..at(p + s) + d].copy_from_slice(&x.v[from..from + d]);
            }
        }
        for s in 0..new {
            let pos = p + s;
            for n in 0..h {
                let from = ((b * c.seq + s) * h + n) * d;
                let q = &x.q[from..from + d];
                let q = if c.rotary_dim > 0 { rope(q, pos) } else { q.to_vec() };
                let kvh = n / (h / hkv);
                let lo = if c.window > 0 { (pos + 1).saturating_sub(c.window as usize) } else { 0 };
                let scores: Vec<f64> = (lo..=pos)
                    .map(|j| {
                        let k = &pk[((b * hkv + kvh) * cap + j) * d..][..d];
                        let s = q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt();
                        if c.softcap > 0.0 { c.softcap * (s / c.softcap).tanh() } else { s }
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for e in 0..d {
                    let acc: f64 =
                        (lo..=pos).zip(&weights).map(|(j, w)| w * pv[((b * hkv + kvh) * cap + j) * d + e]).sum();
                    out[from + e] = acc / sum;
                }
            }
        }
    }
    (out, pk, pv)
}

fn attrs(c: &Case) -> Attributes {
    Attributes::new()
        .with("num_heads", AttrValue::Int(c.heads as i64))
        .with("kv_num_heads", AttrValue::Int(c.kv_heads as i64))
        .with("do_rotary", AttrValue::Int((c.rotary_dim > 0) as i64))
        .with("rotary_interleaved", AttrValue::Int(c.interleaved as i64))
        .with("local_window_size", AttrValue::Int(if c.window > 0 { c.window } else { -1 }))
        .with("softcap", AttrValue::Float(c.softcap))
}

/// The op on CPU tensors (f16): (output, present_k, present_v).
fn run_cpu(c: &Case, x: &Inputs, attrs: &Attributes) -> dlkern::Result<(Vec<f16>, Vec<f16>, Vec<f16>)> {
    let f = |v: &[f64]| v.iter().map(|&y| f16::from_f64(y)).collect::<Vec<f16>>();
    let (b, s, d) = (c.batch as i64, c.seq as i64, c.head as i64);
    let past_len = c.past.unwrap_or(0);
    let cap = x.total.max(past_len) as i64;
    let none = || Host::<f16>::new(vec![], &[0]);
    let mut q = Host::new(f(&x.q), &[b, s, c.heads as i64 * d]);
    let mut k = Host::new(f(&x.k), &[b, s, c.kv_heads as i64 * d]);
    let mut v = Host::new(f(&x.v), &[b, s, c.kv_heads as i64 * d]);
    let past_shape = [b, c.kv_heads as i64, past_len as i64, d];
    let (mut pk, mut pv) = match c.past {
        Some(_) => (Host::new(f(&x.past_k), &past_shape), Host::new(f(&x.past_v), &past_shape)),
        None => (none(), none()),
    };
    let lens: Vec<i32> = c.lengths.iter().map(|&t| t as i32 - 1).collect();
    let mut seqlens = Host::new(lens, &[b]);
    let mut total = Host::new(vec![x.total as i32], &[1]);
    let cache = [x.positions as i64, (c.rotary_dim / 2) as i64];
    let (mut cos, mut sin) =
        if c.rotary_dim > 0 { (Host::new(f(&x.cos), &cache), Host::new(f(&x.sin), &cache)) } else { (none(), none()) };
    let mut out = Host::new(vec![f16::ZERO; (b * s * c.heads as i64 * d) as usize], &[b, s, c.heads as i64 * d]);
    let present = [b, c.kv_heads as i64, cap, d];
    let mut ok = Host::new(vec![f16::ZERO; present.iter().product::<i64>() as usize], &present);
    let mut ov = Host::new(vec![f16::ZERO; present.iter().product::<i64>() as usize], &present);
    let mut tensors = [
        q.dl(),
        k.dl(),
        v.dl(),
        pk.dl(),
        pv.dl(),
        seqlens.dl(),
        total.dl(),
        cos.dl(),
        sin.dl(),
        out.dl(),
        ok.dl(),
        ov.dl(),
    ];
    // SAFETY: host tensors of the described extents, alive for the call.
    unsafe { registry::call(GQA, &mut tensors, 9, std::ptr::null_mut(), attrs) }?;
    Ok((out.data, ok.data, ov.data))
}

fn assert_near(what: &str, got: &[f16], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f64();
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: {g} vs {w}");
    }
}

/// Compares the new tokens' output rows and each sequence's first `T` cache rows.
fn check(c: &Case, got: &(Vec<f16>, Vec<f16>, Vec<f16>), want: &(Vec<f64>, Vec<f64>, Vec<f64>), tol: f64) {
    let (h, hkv, d) = (c.heads, c.kv_heads, c.head);
    let cap = want.1.len() / (c.batch * hkv * d);
    for (b, &t) in c.lengths.iter().enumerate() {
        let rows = c.seq.min(t) * h * d;
        let at = b * c.seq * h * d;
        assert_near(&format!("{c:?} output {b}"), &got.0[at..at + rows], &want.0[at..at + rows], tol);
        for n in 0..hkv {
            let at = (b * hkv + n) * cap * d;
            assert_near(&format!("{c:?} present_key {b}/{n}"), &got.1[at..at + t * d], &want.1[at..at + t * d], tol);
            assert_near(&format!("{c:?} present_value {b}/{n}"), &got.2[at..at + t * d], &want.2[at..at + t * d], tol);
        }
    }
}

/// One token of one sequence of 4 query heads of 64 over one KV head, nothing else: what the
/// cases below vary.
fn base_case() -> Case {
    Case {
        batch: 1,
        seq: 1,
        heads: 4,
        kv_heads: 1,
        head: 64,
        lengths: vec![1],
        past: None,
        rotary_dim: 0,
        interleaved: false,
        window: -1,
        softcap: 0.0,
    }
}

fn cases() -> Vec<Case> {
    let base = base_case();
    vec![
        // A right-padded prompt, no past; head size 80, group 4.
        Case { batch: 2, seq: 7, heads: 8, kv_heads: 2, head: 80, lengths: vec![7, 3], ..base.clone() },
        // Decode over ragged pasts in their own buffer, group 8, rotary.
        Case {
            batch: 3,
            seq: 1,
            heads: 8,
            kv_heads: 1,
            lengths: vec![1, 9, 97],
            past: Some(96),
            rotary_dim: 64,
            ..base.clone()
        },
        // A continued prompt (chunked prefill) with partial interleaved rotary, window and cap.
        Case {
            seq: 7,
            heads: 4,
            kv_heads: 4,
            head: 128,
            lengths: vec![27],
            past: Some(20),
            rotary_dim: 32,
            interleaved: true,
            window: 9,
            softcap: 3.0,
            ..base.clone()
        },
        // A long prompt, MHA-sized group 1.
        Case { seq: 97, heads: 2, kv_heads: 2, lengths: vec![97], past: Some(0), rotary_dim: 64, ..base },
    ]
}

#[test]
fn cpu_op_matches_ort_semantics() {
    let mut rng = Rng::new(7);
    for c in cases() {
        let x = inputs(&c, &mut rng);
        let got = run_cpu(&c, &x, &attrs(&c)).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        check(&c, &got, &naive(&c, &x), 4e-3);
    }
}

#[test]
fn bad_inputs_are_errors_that_name_them() {
    let mut rng = Rng::new(8);
    let c = Case {
        batch: 1,
        seq: 1,
        heads: 4,
        kv_heads: 2,
        head: 64,
        lengths: vec![5],
        past: Some(8),
        rotary_dim: 0,
        interleaved: false,
        window: -1,
        softcap: 0.0,
    };
    let x = inputs(&c, &mut rng);
    let err = |c: &Case, x: &Inputs, a: &Attributes| run_cpu(c, x, a).unwrap_err().to_string();
    // A sequence longer than the cache.
    let long = Case { lengths: vec![20], ..c.clone() };
    let x_long = Inputs { total: 9, ..inputs(&long, &mut rng) };
    assert!(err(&long, &x_long, &attrs(&long)).contains("seqlens_k[0] = 19"), "{}", err(&long, &x_long, &attrs(&long)));
    // do_rotary = 1 without the caches.
    let rotary = attrs(&c).with("do_rotary", AttrValue::Int(1));
    assert!(err(&c, &x, &rotary).contains("needs cos_cache and sin_cache"));
    // Head counts that do not divide.
    let odd = attrs(&c).with("kv_num_heads", AttrValue::Int(3));
    assert!(err(&c, &x, &odd).contains("kv_num_heads = 3"));
    // What dlkern does not implement is refused by name.
    for (key, value) in
        [("smooth_softmax", 1), ("qk_output", 1), ("sliding_window_cache", 1), ("kv_cache_bit_width", 8)]
    {
        let refused = attrs(&c).with(key, AttrValue::Int(value));
        assert!(err(&c, &x, &refused).contains(key), "{key}: {}", err(&c, &x, &refused));
    }
}

#[test]
fn rotary_embedding_cpu_op_follows_ort_formula() {
    // [B, S, H * D] with per-token positions, partial rotary: the tail passes through.
    let (b, s, h, d, rd) = (2usize, 7usize, 3usize, 64usize, 32usize);
    let mut rng = Rng::new(9);
    let x: Vec<f32> = rng.vec(b * s * h * d, -2.0, 2.0);
    let positions = 20usize;
    let angles: Vec<f64> = (0..positions * rd / 2).map(|i| i as f64 * 0.003).collect();
    let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
    let pos: Vec<i64> = (0..b * s).map(|i| ((i * 7) % positions) as i64).collect();
    let mut hx = Host::new(x.clone(), &[b as i64, s as i64, (h * d) as i64]);
    let mut hp = Host::new(pos.clone(), &[b as i64, s as i64]);
    let mut hc = Host::new(cos.clone(), &[positions as i64, (rd / 2) as i64]);
    let mut hs = Host::new(sin.clone(), &[positions as i64, (rd / 2) as i64]);
    let mut hy = Host::new(vec![0f32; x.len()], &[b as i64, s as i64, (h * d) as i64]);
    let mut tensors = [hx.dl(), hp.dl(), hc.dl(), hs.dl(), hy.dl()];
    let a = Attributes::new()
        .with("num_heads", AttrValue::Int(h as i64))
        .with("rotary_embedding_dim", AttrValue::Int(rd as i64));
    // SAFETY: host tensors of the described extents, alive for the call.
    unsafe { registry::call(ROTARY, &mut tensors, 4, std::ptr::null_mut(), &a) }.unwrap();
    for t in 0..b * s {
        let p = pos[t] as usize;
        for n in 0..h {
            let head = &x[(t * h + n) * d..][..d];
            for i in 0..d {
                let want = if i < rd {
                    let half = rd / 2;
                    let (cache, sign, j) = (i % half, if i < half { -1.0 } else { 1.0 }, (i + half) % rd);
                    head[i] as f64 * cos[p * half + cache] as f64 + sign * head[j] as f64 * sin[p * half + cache] as f64
                } else {
                    head[i] as f64
                };
                let got = hy.data[(t * h + n) * d + i] as f64;
                assert!((got - want).abs() < 1e-5, "token {t} head {n} element {i}: {got} vs {want}");
            }
        }
    }
}

#[cfg(test)]
mod gpu_tests {
    use super::*;
    use common::gpu;
    use cudarc::driver::{DevicePtr, DevicePtrMut};

    /// Elements past each cache that no call may write.
    const GUARD: usize = 4096;

    /// How the tensors of a CUDA call are laid out.
    #[derive(Clone, Copy, Debug, Default)]
    struct Layout {
        /// Q, K and V as one packed QKV input (key and value absent).
        packed: bool,
        /// The past caches are the present ones, one buffer each (onnxruntime-genai's binding;
        /// needs `past` at least the longest length).
        shared: bool,
    }

    /// The op on CUDA tensors (f16; `seqlens_k` as given); the caches carry a guard region.
    fn run_gpu(c: &Case, x: &Inputs, seqlens: &[i32], layout: Layout) -> (Vec<f16>, Vec<f16>, Vec<f16>, bool) {
        let (_device, stream) = gpu();
        let f = |v: &[f64]| v.iter().map(|&y| f16::from_f64(y)).collect::<Vec<f16>>();
        let (b, s, d) = (c.batch as i64, c.seq as i64, c.head as i64);
        let (h, hkv) = (c.heads, c.kv_heads);
        let past_len = c.past.unwrap_or(0);
        let cap = x.total.max(past_len) as i64;
        assert!(!layout.shared || cap == past_len as i64, "{c:?}: a shared cache holds every position");
        let up = |v: Vec<f16>| stream.clone_htod(&v).unwrap();
        // Packed rows: each token's query heads, then its key heads, then its value heads.
        let qkv: Vec<f64> = (0..c.batch * c.seq)
            .flat_map(|t| {
                let (q, k, v) = (h * c.head, hkv * c.head, hkv * c.head);
                x.q[t * q..][..q]
                    .iter()
                    .chain(&x.k[t * k..][..k])
                    .chain(&x.v[t * v..][..v])
                    .copied()
                    .collect::<Vec<_>>()
            })
            .collect();
        let q = up(f(if layout.packed { &qkv } else { &x.q }));
        let k = up(f(&x.k));
        let v = up(f(&x.v));
        let pk = up(f(&x.past_k).into_iter().chain(std::iter::repeat_n(f16::ONE, 8)).collect());
        let pv = up(f(&x.past_v).into_iter().chain(std::iter::repeat_n(f16::ONE, 8)).collect());
        let lens = stream.clone_htod(seqlens).unwrap();
        let cos = up(f(&x.cos).into_iter().chain([f16::ZERO; 8]).collect());
        let sin = up(f(&x.sin).into_iter().chain([f16::ZERO; 8]).collect());
        let out_len = (b * s * h as i64 * d) as usize;
        let present_len = (b * hkv as i64 * cap * d) as usize;
        let sentinel = f16::from_f32(7.25);
        let mut out = up(vec![f16::ZERO; out_len]);
        // A shared cache starts as the past; its guard region follows it all the same.
        let present_init = |past: &[f64]| {
            let start: Vec<f16> = if layout.shared { f(past) } else { vec![sentinel; present_len] };
            start.into_iter().chain(std::iter::repeat_n(sentinel, GUARD)).collect::<Vec<f16>>()
        };
        let mut ok = up(present_init(&x.past_k));
        let mut ov = up(present_init(&x.past_v));
        let mut holder: Vec<Host<f16>> = Vec::new();
        let mut shape = |sh: &[i64]| {
            holder.push(Host::new(vec![], sh));
            holder.len() - 1
        };
        let q_width = if layout.packed { (h + 2 * hkv) as i64 * d } else { h as i64 * d };
        let ids = [
            shape(&[b, s, q_width]),
            shape(&[b, s, hkv as i64 * d]),
            shape(&[b, s, hkv as i64 * d]),
            shape(&[b, hkv as i64, past_len as i64, d]),
            shape(&[b, hkv as i64, past_len as i64, d]),
            shape(&[x.positions as i64, (c.rotary_dim / 2) as i64]),
            shape(&[x.positions as i64, (c.rotary_dim / 2) as i64]),
            shape(&[b, s, h as i64 * d]),
            shape(&[b, hkv as i64, cap, d]),
            shape(&[b, hkv as i64, cap, d]),
            shape(&[0]),
        ];
        let mut lens_host = Host::<i32>::new(vec![], &[b]);
        let mut total = Host::new(vec![x.total as i32], &[1]);
        let (ok_addr, ov_addr) = (ok.device_ptr_mut(&stream).0, ov.device_ptr_mut(&stream).0);
        let addr = [
            q.device_ptr(&stream).0,
            k.device_ptr(&stream).0,
            v.device_ptr(&stream).0,
            if layout.shared { ok_addr } else { pk.device_ptr(&stream).0 },
            if layout.shared { ov_addr } else { pv.device_ptr(&stream).0 },
            cos.device_ptr(&stream).0,
            sin.device_ptr(&stream).0,
            out.device_ptr_mut(&stream).0,
            ok_addr,
            ov_addr,
        ];
        let dl = |i: usize, holder: &mut Vec<Host<f16>>| common::on_cuda(holder[ids[i]].dl(), addr[i]);
        let hole = |holder: &mut Vec<Host<f16>>| common::on_cuda(holder[ids[10]].dl(), 0);
        let with_past = c.past.is_some();
        let with_rotary = c.rotary_dim > 0;
        let mut tensors = [
            dl(0, &mut holder),
            if layout.packed { hole(&mut holder) } else { dl(1, &mut holder) },
            if layout.packed { hole(&mut holder) } else { dl(2, &mut holder) },
            if with_past { dl(3, &mut holder) } else { hole(&mut holder) },
            if with_past { dl(4, &mut holder) } else { hole(&mut holder) },
            common::on_cuda(lens_host.dl(), lens.device_ptr(&stream).0),
            total.dl(),
            if with_rotary { dl(5, &mut holder) } else { hole(&mut holder) },
            if with_rotary { dl(6, &mut holder) } else { hole(&mut holder) },
            dl(7, &mut holder),
            dl(8, &mut holder),
            dl(9, &mut holder),
        ];
        // SAFETY: device buffers of the described extents, alive for the call, on this stream.
        unsafe { registry::call(GQA, &mut tensors, 9, stream.cu_stream().cast(), &attrs(c)) }.unwrap();
        stream.synchronize().unwrap();
        let (pk_all, pv_all) = (stream.clone_dtoh(&ok).unwrap(), stream.clone_dtoh(&ov).unwrap());
        let guards_intact = pk_all[present_len..].iter().chain(&pv_all[present_len..]).all(|&g| g == sentinel);
        (
            stream.clone_dtoh(&out).unwrap(),
            pk_all[..present_len].to_vec(),
            pv_all[..present_len].to_vec(),
            guards_intact,
        )
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_op_matches_the_cpu_op() {
        let mut rng = Rng::new(17);
        for c in cases() {
            let x = inputs(&c, &mut rng);
            let lens: Vec<i32> = c.lengths.iter().map(|&t| t as i32 - 1).collect();
            let (out, pk, pv, guards) = run_gpu(&c, &x, &lens, Layout::default());
            assert!(guards, "{c:?}: a write past the caches");
            let want = naive(&c, &x);
            check(&c, &(out, pk, pv), &want, 8e-3);
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_bad_lengths_stay_inside_the_caches() {
        let mut rng = Rng::new(18);
        let c = Case {
            batch: 2,
            seq: 1,
            heads: 8,
            kv_heads: 2,
            head: 64,
            lengths: vec![5, 9],
            past: Some(16),
            rotary_dim: 64,
            interleaved: false,
            window: -1,
            softcap: 0.0,
        };
        let x = inputs(&c, &mut rng);
        // Far beyond the cache, and negative: clamped on the device, never outside the buffers.
        for lens in [[1 << 30, 3], [-5, i32::MAX], [i32::MIN, 15]] {
            let (_, _, _, guards) = run_gpu(&c, &x, &lens, Layout::default());
            assert!(guards, "seqlens_k {lens:?}: a write past the caches");
        }
    }

    /// A decode step (one new token per sequence) runs as one launch of the decode kernel, which
    /// rotates the queries as it reads them and takes each new key and value from the inputs
    /// while appending them; the two-launch path (rotary launch first, as under a CUDA-graph
    /// capture) must give the same bits, and both the reference's values: over head sizes 64,
    /// 80, 96, 128 and 256, groups 1 to 32 (two row tiles), partial and interleaved rotary, none,
    /// window and cap, lengths 1 to 4097 (new tokens on partition edges and inside), ragged
    /// batches, and the builder's layout (packed QKV, past and present one buffer).
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_one_launch_decode_matches_two_launches_bit_for_bit() {
        let mut rng = Rng::new(29);
        let base = base_case();
        let cases = [
            Case {
                batch: 3,
                heads: 32,
                kv_heads: 8,
                head: 128,
                lengths: vec![1, 300, 1025],
                past: Some(1025),
                rotary_dim: 128,
                ..base.clone()
            },
            Case {
                batch: 2,
                heads: 8,
                kv_heads: 2,
                lengths: vec![97, 7],
                past: Some(97),
                rotary_dim: 32,
                interleaved: true,
                window: 20,
                softcap: 5.0,
                ..base.clone()
            },
            Case {
                heads: 4,
                kv_heads: 2,
                head: 256,
                lengths: vec![4097],
                past: Some(4097),
                rotary_dim: 64,
                ..base.clone()
            },
            Case { batch: 2, heads: 2, kv_heads: 1, head: 80, lengths: vec![15, 17], past: Some(17), ..base.clone() },
            Case {
                heads: 32,
                kv_heads: 1,
                head: 128,
                lengths: vec![200],
                past: Some(256),
                rotary_dim: 128,
                ..base.clone()
            },
            Case {
                batch: 2,
                heads: 6,
                kv_heads: 3,
                head: 96,
                lengths: vec![1, 33],
                past: Some(33),
                rotary_dim: 96,
                ..base
            },
        ];
        for c in cases {
            let x = inputs(&c, &mut rng);
            let lens: Vec<i32> = c.lengths.iter().map(|&t| t as i32 - 1).collect();
            let want = naive(&c, &x);
            for layout in
                [Layout::default(), Layout { packed: true, shared: true }, Layout { packed: true, shared: false }]
            {
                let one = run_gpu(&c, &x, &lens, layout);
                let two = dlkern::ops::attention::with_two_launch_decode(|| run_gpu(&c, &x, &lens, layout));
                assert!(one.3 && two.3, "{c:?} {layout:?}: a write past the caches");
                let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
                for (what, a, b) in
                    [("output", &one.0, &two.0), ("present_key", &one.1, &two.1), ("present_value", &one.2, &two.2)]
                {
                    assert!(bits(a) == bits(b), "{c:?} {layout:?}: {what} differs between one launch and two");
                }
                check(&c, &(one.0, one.1, one.2), &want, 8e-3);
            }
        }
    }

    /// One rotary shape for [`rotary_paths`].
    #[derive(Clone, Copy, Debug)]
    struct RotaryCase {
        batch: usize,
        seq: usize,
        heads: usize,
        head_size: usize,
        rotary_dim: usize,
        interleaved: bool,
        /// Whether the 16-byte path can take this head at all (the aligned run must take it then).
        vector: bool,
    }

    /// `rotary_raw` on aligned buffers (the vector path where the head allows it) and on the same
    /// data one element off (the scalar path): the two outputs agree bit for bit and match the
    /// f64 rotation; a position past the caches turns its token's heads to NaN (a copy reads no
    /// position).
    fn rotary_paths<T: dlkern::Element>(c: RotaryCase, rng: &mut Rng) {
        use dlkern::ops::attention::launch::{HeadStrides, RotaryParams, RotaryPointers, RotaryPositions, rotary_raw};
        let (device, stream) = gpu();
        let (tokens, width) = (c.batch * c.seq, c.heads * c.head_size);
        let n = tokens * width;
        let max_position = 40;
        let half = c.rotary_dim / 2;
        let x: Vec<T> = rng.vec(n, -2.0, 2.0);
        let angles: Vec<f64> = (0..max_position * half).map(|i| (i as f64 * 0.37).sin() * 3.0).collect();
        let cos: Vec<T> = angles.iter().map(|a| T::from_f64(a.cos())).chain([T::default(); 8]).collect();
        let sin: Vec<T> = angles.iter().map(|a| T::from_f64(a.sin())).chain([T::default(); 8]).collect();
        // The last token's position lies past the caches.
        let positions: Vec<i64> = (0..tokens)
            .map(|t| if t + 1 == tokens { max_position as i64 } else { ((t * 7) % max_position) as i64 })
            .collect();
        let strides = HeadStrides { batch: c.seq * width, seq: width, head: c.head_size };
        let params = RotaryParams {
            dtype: T::DTYPE,
            batch: c.batch,
            seq: c.seq,
            heads: c.heads,
            head_size: c.head_size,
            rotary_dim: c.rotary_dim,
            interleaved: c.interleaved,
            src: strides,
            dst: strides,
            positions: RotaryPositions::PerToken,
            max_position,
        };
        let (cos_d, sin_d, pos_d) = (
            stream.clone_htod(&cos).unwrap(),
            stream.clone_htod(&sin).unwrap(),
            stream.clone_htod(&positions).unwrap(),
        );
        // `offset` elements before the data: 0 keeps the buffers 16-byte aligned, 1 does not.
        let run = |offset: usize| -> (Vec<T>, u32) {
            let padded: Vec<T> = std::iter::repeat_n(T::default(), offset).chain(x.iter().copied()).collect();
            let src = stream.clone_htod(&padded).unwrap();
            let mut dst = stream.alloc_zeros::<T>(n + offset).unwrap();
            let elem = std::mem::size_of::<T>() as u64;
            let ptrs = RotaryPointers {
                src: src.device_ptr(&stream).0 + offset as u64 * elem,
                dst: dst.device_ptr_mut(&stream).0 + offset as u64 * elem,
                cos: cos_d.device_ptr(&stream).0,
                sin: sin_d.device_ptr(&stream).0,
                position_ids: pos_d.device_ptr(&stream).0,
                seqlens_k: 0,
            };
            let (_, _, args) = params.plan(&ptrs).unwrap();
            // SAFETY: device buffers of the described extents, alive until the stream synchronizes.
            unsafe { rotary_raw(&device, stream.cu_stream(), &params, &ptrs) }.unwrap();
            stream.synchronize().unwrap();
            (stream.clone_dtoh(&dst).unwrap()[offset..].to_vec(), args.units)
        };
        let ((vector, units), (scalar, scalar_units)) = (run(0), run(1));
        assert_eq!(
            units > 0,
            c.vector,
            "{c:?}: aligned buffers took the {} path",
            if units > 0 { "vector" } else { "scalar" }
        );
        assert_eq!(scalar_units, 0, "{c:?}: buffers one element off took the vector path");
        let bits = |v: &[T]| bytemuck::cast_slice::<T, u8>(v).to_vec();
        assert!(bits(&vector) == bits(&scalar), "{c:?}: the two paths differ");
        // Outputs up to 2 sqrt(2) in size, rounded once to T: 16 unit roundoffs leave room.
        let tol = 16.0 * common::unit_roundoff(T::DTYPE);
        for t in 0..tokens {
            for h in 0..c.heads {
                let at = t * width + h * c.head_size;
                let got = &vector[at..at + c.head_size];
                // A copy (rotary dim 0) reads no position.
                if positions[t] as usize >= max_position && c.rotary_dim > 0 {
                    assert!(got.iter().all(|v| v.to_f64().is_nan()), "{c:?}: token {t} past the caches is not NaN");
                    continue;
                }
                let mut want: Vec<f64> = x[at..at + c.head_size].iter().map(|v| v.to_f64()).collect();
                let row = |table: &[T]| -> Vec<f64> {
                    table[positions[t] as usize * half..][..half].iter().map(|v| v.to_f64()).collect()
                };
                dlkern::ops::common::rotary::rotate_head(
                    &mut want,
                    &row(&cos),
                    &row(&sin),
                    c.rotary_dim,
                    c.interleaved,
                );
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g.to_f64() - w).abs() <= tol,
                        "{c:?}: token {t} head {h} element {i}: {} vs {w}",
                        g.to_f64()
                    );
                }
            }
        }
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_rotary_vector_path_matches_scalar_path() {
        use half::bf16;
        let mut rng = Rng::new(23);
        let case = |batch, seq, heads, head_size, rotary_dim, interleaved, vector| RotaryCase {
            batch,
            seq,
            heads,
            head_size,
            rotary_dim,
            interleaved,
            vector,
        };
        for c in [
            case(2, 7, 32, 128, 128, false, true),
            case(1, 97, 3, 64, 32, true, true),
            case(1, 1, 1, 64, 64, false, true),
            case(1, 1025, 1, 128, 64, false, true),
            // Rotary dim not a multiple of 16 elements: the scalar path both times.
            case(1, 7, 4, 64, 20, false, false),
            case(2, 3, 2, 256, 128, true, true),
        ] {
            rotary_paths::<f16>(c, &mut rng);
        }
        for c in [
            case(1, 7, 13, 80, 80, false, true),
            case(2, 5, 3, 96, 48, false, true),
            case(1, 3, 2, 96, 36, true, false),
        ] {
            rotary_paths::<bf16>(c, &mut rng);
        }
        for c in
            [case(1, 7, 5, 64, 64, true, true), case(1, 9, 3, 80, 0, false, true), case(1, 3, 2, 80, 6, false, false)]
        {
            rotary_paths::<f32>(c, &mut rng);
        }
    }

    /// The fused rotary launch (GroupQueryAttention's queries, keys and values in one) refuses
    /// what it cannot hold as one launch, naming it, before it launches anything.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_rotary_jobs_refuse_jobs_one_launch_cannot_hold() {
        use dlkern::DType;
        use dlkern::ops::attention::launch::{
            HeadStrides, RotaryParams, RotaryPointers, RotaryPositions, rotary_jobs_raw,
        };
        let (device, stream) = gpu();
        let strides = HeadStrides { batch: 4 * 64, seq: 4 * 64, head: 64 };
        let params = RotaryParams {
            dtype: DType::F16,
            batch: 1,
            seq: 1,
            heads: 4,
            head_size: 64,
            rotary_dim: 0,
            interleaved: false,
            src: strides,
            dst: strides,
            positions: RotaryPositions::FromFirst,
            max_position: 16,
        };
        let ptrs = RotaryPointers { src: 0x1000, dst: 0x2000, cos: 0, sin: 0, position_ids: 0, seqlens_k: 0 };
        let raw = stream.cu_stream();
        // SAFETY: each call is refused before any launch (the addresses are never read).
        let err = |jobs: &[(RotaryParams, RotaryPointers)]| {
            unsafe { rotary_jobs_raw(&device, raw, jobs, (0, 0)) }.unwrap_err().to_string()
        };
        assert!(err(&[]).contains("no jobs"), "{}", err(&[]));
        assert!(
            err(&[(params, ptrs); 4]).contains("4 jobs in one launch (at most 3)"),
            "{}",
            err(&[(params, ptrs); 4])
        );
        let longer = RotaryParams { seq: 2, ..params };
        let e = err(&[(params, ptrs), (longer, ptrs)]);
        assert!(e.contains("rotary job 1: other tokens"), "{e}");
        let e = err(&[(params, ptrs), (params, RotaryPointers { seqlens_k: 0x3000, ..ptrs })]);
        assert!(e.contains("rotary job 1: other tokens, caches or positions"), "{e}");
    }
}
