//! PagedAttention reference: gathers each sequence's keys and values through its block table and
//! runs plain attention in f64, with the kernel's options and error semantics (a sequence with a
//! bad block id or context length yields NaN).

use crate::dtype::Element;
use crate::ops::paged_attention::launch::PagedAttentionParams;

/// Borrowed host copies of a decode step's inputs (layouts as in
/// [`crate::ops::paged_attention::launch`]).
pub struct PagedInputs<'a, T> {
    pub q: &'a [T],
    pub key_cache: &'a [T],
    pub value_cache: &'a [T],
    pub block_tables: &'a [i32],
    pub context_lens: &'a [i32],
    pub alibi: Option<&'a [f32]>,
}

/// Output `[batch, q_len, num_q_heads, head_size]` in f64.
pub fn paged_attention<T: Element>(x: &PagedInputs<T>, p: &PagedAttentionParams) -> Vec<f64> {
    let d = p.head_size;
    let group = p.num_q_heads / p.num_kv_heads;
    let mut out = vec![f64::NAN; p.batch * p.q_len * p.num_q_heads * d];
    for b in 0..p.batch {
        let ctx = x.context_lens[b];
        if ctx < p.q_len as i32
            || ctx as usize > p.max_blocks_per_seq * p.block_size
            || ctx as usize > p.max_context_len
        {
            continue; // stays NaN
        }
        let ctx = ctx as usize;
        // Cache row of each position, or None for a bad block id.
        let rows: Vec<Option<usize>> = (0..ctx)
            .map(|pos| {
                let entry = x.block_tables[b * p.max_blocks_per_seq + pos / p.block_size];
                (entry >= 0 && (entry as usize) < p.num_blocks)
                    .then(|| entry as usize * p.block_size + pos % p.block_size)
            })
            .collect();
        if rows.iter().any(Option::is_none) {
            continue;
        }
        for t in 0..p.q_len {
            let qpos = ctx - p.q_len + t;
            for hq in 0..p.num_q_heads {
                let h = hq / group;
                let q = &x.q[((b * p.q_len + t) * p.num_q_heads + hq) * d..][..d];
                let mut scores = vec![f64::NEG_INFINITY; ctx];
                for (pos, row) in rows.iter().enumerate() {
                    let visible = pos <= qpos && (p.window == 0 || pos + p.window > qpos);
                    if !visible {
                        continue;
                    }
                    let k = &x.key_cache[(row.unwrap_or(0) * p.num_kv_heads + h) * d..][..d];
                    let mut s = q.iter().zip(k).map(|(a, b)| a.to_f64() * b.to_f64()).sum::<f64>() * p.scale as f64;
                    if p.softcap > 0.0 {
                        s = p.softcap as f64 * (s / p.softcap as f64).tanh();
                    }
                    if let Some(slopes) = x.alibi {
                        s += slopes[hq] as f64 * (pos as f64 - qpos as f64);
                    }
                    scores[pos] = s;
                }
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let total: f64 = weights.iter().sum();
                let o = &mut out[((b * p.q_len + t) * p.num_q_heads + hq) * d..][..d];
                o.fill(0.0);
                for (pos, w) in weights.iter().enumerate() {
                    if *w == 0.0 {
                        continue;
                    }
                    let v = &x.value_cache[(rows[pos].unwrap_or(0) * p.num_kv_heads + h) * d..][..d];
                    for (oi, vi) in o.iter_mut().zip(v) {
                        *oi += w / total * vi.to_f64();
                    }
                }
            }
        }
    }
    out
}
