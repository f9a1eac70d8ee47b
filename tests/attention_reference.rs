//! The attention reference (groundwork for the flash-attention kernels): agreement with an
//! independent dense computation, and the semantics of causal bottom-right alignment, GQA,
//! varlen batches, soft cap, sliding window and the log-sum-exp.

mod common;

use common::Rng;
use dlkern::ops::attention::reference::{AttentionOptions, attention_varlen};
use half::f16;
use proptest::prelude::*;

fn opts(h: usize, hkv: usize, d: usize) -> AttentionOptions {
    AttentionOptions {
        num_heads: h,
        num_kv_heads: hkv,
        head_dim: d,
        causal: false,
        scale: 1.0 / (d as f64).sqrt(),
        softcap: 0.0,
        window_left: None,
    }
}

/// Independent dense softmax(q k^T * scale) v for one head of one sequence, with a mask.
fn dense(
    q: &[Vec<f64>],
    k: &[Vec<f64>],
    v: &[Vec<f64>],
    scale: f64,
    mask: impl Fn(usize, usize) -> bool,
) -> Vec<Vec<f64>> {
    q.iter()
        .enumerate()
        .map(|(i, qi)| {
            let s: Vec<f64> = k.iter().map(|kj| qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale).collect();
            let m = (0..k.len()).filter(|&j| mask(i, j)).map(|j| s[j]).fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = (0..k.len()).filter(|&j| mask(i, j)).map(|j| (s[j] - m).exp()).sum();
            (0..v[0].len())
                .map(|c| (0..k.len()).filter(|&j| mask(i, j)).map(|j| (s[j] - m).exp() / z * v[j][c]).sum())
                .collect()
        })
        .collect()
}

fn rows(x: &[f16], n: usize, heads: usize, head: usize, d: usize) -> Vec<Vec<f64>> {
    (0..n).map(|r| x[(r * heads + head) * d..][..d].iter().map(|v| v.to_f64()).collect()).collect()
}

proptest! {
    #[test]
    fn matches_dense_attention(
        sq in 1usize..9, extra in 0usize..6, ratio in prop_oneof![Just(1usize), Just(2), Just(4)], hkv in 1usize..3,
        causal: bool, seed: u64,
    ) {
        let (sk, d) = (sq + extra, 16);
        let h = hkv * ratio;
        let mut rng = Rng::new(seed);
        let q: Vec<f16> = rng.vec(sq * h * d, -1.0, 1.0);
        let k: Vec<f16> = rng.vec(sk * hkv * d, -1.0, 1.0);
        let v: Vec<f16> = rng.vec(sk * hkv * d, -1.0, 1.0);
        let o = AttentionOptions { causal, ..opts(h, hkv, d) };
        let (out, lse) = attention_varlen(&q, &k, &v, &[0, sq], &[0, sk], &o);
        for head in 0..h {
            let kvh = head / ratio; // GQA: query head -> its KV head
            let want = dense(&rows(&q, sq, h, head, d), &rows(&k, sk, hkv, kvh, d), &rows(&v, sk, hkv, kvh, d), o.scale,
                |i, j| !causal || j + sq <= i + sk);
            for i in 0..sq {
                for c in 0..d {
                    prop_assert!((out[(i * h + head) * d + c] - want[i][c]).abs() < 1e-12);
                }
                prop_assert!(lse[head * sq + i].is_finite());
            }
        }
    }
}

#[test]
fn bottom_right_causal_alignment() {
    let (h, d) = (1, 8);
    let mut rng = Rng::new(1);
    let k: Vec<f16> = rng.vec(5 * d, -1.0, 1.0);
    let v: Vec<f16> = rng.vec(5 * d, -1.0, 1.0);
    let q: Vec<f16> = rng.vec(3 * d, -1.0, 1.0);
    // One decoding query sees every key: causal equals non-causal.
    let one = &q[..d];
    let causal = AttentionOptions { causal: true, ..opts(h, h, d) };
    assert_eq!(
        attention_varlen(one, &k, &v, &[0, 1], &[0, 5], &causal),
        attention_varlen(one, &k, &v, &[0, 1], &[0, 5], &opts(h, h, d))
    );
    // More queries than keys: the first queries see nothing (output 0, lse -inf).
    let (out, lse) = attention_varlen(&q, &k[..d], &v[..d], &[0, 3], &[0, 1], &causal);
    assert!(out[..2 * d].iter().all(|&x| x == 0.0) && lse[0] == f64::NEG_INFINITY && lse[1] == f64::NEG_INFINITY);
    assert!(lse[2].is_finite());
    // A window of 0 to the left: each query sees only its diagonal key.
    let diag_only = AttentionOptions { window_left: Some(0), ..causal };
    let (out, _) = attention_varlen(&q, &k, &v, &[0, 3], &[0, 5], &diag_only);
    for i in 0..3 {
        let key = i + 2; // bottom right: query i sits at key position i + (5 - 3)
        for c in 0..d {
            assert_eq!(out[i * d + c], v[key * d + c].to_f64());
        }
    }
}

#[test]
fn varlen_equals_separate_sequences_and_lse_is_the_log_normaliser() {
    let (h, hkv, d) = (4, 2, 16);
    let mut rng = Rng::new(2);
    let (lq, lk) = ([3usize, 1, 5], [4usize, 7, 5]);
    let cu = |l: &[usize]| -> Vec<usize> {
        std::iter::once(0)
            .chain(l.iter().scan(0, |s, &x| {
                *s += x;
                Some(*s)
            }))
            .collect()
    };
    let (cq, ck) = (cu(&lq), cu(&lk));
    let q: Vec<f16> = rng.vec(cq[3] * h * d, -1.0, 1.0);
    let k: Vec<f16> = rng.vec(ck[3] * hkv * d, -1.0, 1.0);
    let v: Vec<f16> = rng.vec(ck[3] * hkv * d, -1.0, 1.0);
    let o = AttentionOptions { causal: true, softcap: 2.0, ..opts(h, hkv, d) };
    let (out, lse) = attention_varlen(&q, &k, &v, &cq, &ck, &o);
    for b in 0..3 {
        let (qs, ks) = (&q[cq[b] * h * d..cq[b + 1] * h * d], &k[ck[b] * hkv * d..ck[b + 1] * hkv * d]);
        let vs = &v[ck[b] * hkv * d..ck[b + 1] * hkv * d];
        let (o1, l1) = attention_varlen(qs, ks, vs, &[0, lq[b]], &[0, lk[b]], &o);
        assert_eq!(&out[cq[b] * h * d..cq[b + 1] * h * d], &o1[..]);
        for head in 0..h {
            assert_eq!(&lse[head * cq[3] + cq[b]..head * cq[3] + cq[b + 1]], &l1[head * lq[b]..(head + 1) * lq[b]]);
        }
    }
    // lse = log sum_j exp(capped score) over visible keys, for the last row of the last sequence.
    let (i, head) = (cq[3] - 1, 3);
    let qrow = &q[(i * h + head) * d..][..d];
    let want: f64 = (ck[2]..ck[3])
        .map(|j| {
            let s =
                qrow.iter().zip(&k[(j * hkv + head / 2) * d..][..d]).map(|(a, b)| a.to_f64() * b.to_f64()).sum::<f64>()
                    * o.scale;
            (2.0 * (s / 2.0).tanh()).exp()
        })
        .sum::<f64>()
        .ln();
    assert!((lse[head * cq[3] + i] - want).abs() < 1e-12);
}
