//! Attention (prefill) reference in f64, with the options flash-attention users rely on: causal
//! masking aligned to the bottom right (chunked prefill: queries are the last `seqlen_q` of
//! `seqlen_k` positions), GQA/MQA, softmax scale, logit soft cap, sliding window, variable-length
//! packed batches (cumulative sequence lengths), and the row log-sum-exp.
//!
//! Layouts (flash-attention's varlen ones): `q` `[total_q, num_heads, head_dim]`, `k`/`v`
//! `[total_k, num_kv_heads, head_dim]`, `cu_seqlens_q`/`cu_seqlens_k` `[batch + 1]` (sequence `b`
//! owns rows `cu[b]..cu[b + 1]`). A padded batch `[B, S, H, D]` is the same with uniform lengths.
//! Output `[total_q, num_heads, head_dim]`; log-sum-exp `[num_heads, total_q]` (natural log of the
//! sum of `exp(score)`), `-inf` for a row that sees no key (its output is 0).

use crate::dtype::Element;

/// Options of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionOptions {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    pub scale: f64,
    /// `cap * tanh(s / cap)` when > 0.
    pub softcap: f64,
    /// Keys at most this far left of the query's (bottom-right aligned) diagonal, if set.
    pub window_left: Option<usize>,
}

/// Whether query row `i` of a sequence with `sq` queries and `sk` keys sees key `j`.
pub fn visible(opts: &AttentionOptions, i: usize, j: usize, sq: usize, sk: usize) -> bool {
    // The query's position among the keys: queries are the last sq of sk positions.
    let diag = i as i64 + sk as i64 - sq as i64;
    let j = j as i64;
    (!opts.causal || j <= diag) && opts.window_left.is_none_or(|w| j >= diag - w as i64)
}

/// Varlen attention; returns (output, log-sum-exp). Panics if the slices do not match the
/// lengths (a test-side bug).
pub fn attention_varlen<T: Element>(
    q: &[T],
    k: &[T],
    v: &[T],
    cu_seqlens_q: &[usize],
    cu_seqlens_k: &[usize],
    opts: &AttentionOptions,
) -> (Vec<f64>, Vec<f64>) {
    let (h, hkv, d) = (opts.num_heads, opts.num_kv_heads, opts.head_dim);
    let group = h / hkv;
    let total_q = *cu_seqlens_q.last().unwrap_or(&0);
    let mut out = vec![0.0; total_q * h * d];
    let mut lse = vec![f64::NEG_INFINITY; h * total_q];
    for b in 0..cu_seqlens_q.len().saturating_sub(1) {
        let (q0, q1) = (cu_seqlens_q[b], cu_seqlens_q[b + 1]);
        let (k0, k1) = (cu_seqlens_k[b], cu_seqlens_k[b + 1]);
        let (sq, sk) = (q1 - q0, k1 - k0);
        for head in 0..h {
            let kv_head = head / group;
            for i in 0..sq {
                let qrow = &q[((q0 + i) * h + head) * d..][..d];
                let scores: Vec<Option<f64>> = (0..sk)
                    .map(|j| {
                        visible(opts, i, j, sq, sk).then(|| {
                            let krow = &k[((k0 + j) * hkv + kv_head) * d..][..d];
                            let s =
                                qrow.iter().zip(krow).map(|(a, b)| a.to_f64() * b.to_f64()).sum::<f64>() * opts.scale;
                            if opts.softcap > 0.0 { opts.softcap * (s / opts.softcap).tanh() } else { s }
                        })
                    })
                    .collect();
                let m = scores.iter().flatten().copied().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue; // no visible key: output 0, lse -inf
                }
                let total: f64 = scores.iter().flatten().map(|s| (s - m).exp()).sum();
                lse[head * total_q + q0 + i] = m + total.ln();
                let o = &mut out[((q0 + i) * h + head) * d..][..d];
                for (j, s) in scores.iter().enumerate() {
                    if let Some(s) = s {
                        let p = (s - m).exp() / total;
                        let vrow = &v[((k0 + j) * hkv + kv_head) * d..][..d];
                        for (oi, vi) in o.iter_mut().zip(vrow) {
                            *oi += p * vi.to_f64();
                        }
                    }
                }
            }
        }
    }
    (out, lse)
}
