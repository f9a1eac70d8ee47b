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

/// Shapes and options of the `PagedAttention` op (`com.microsoft` semantics) for
/// [`paged_attention_op`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PagedOpConfig {
    pub num_heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
    pub num_blocks: usize,
    pub block_size: usize,
    pub max_blocks: usize,
    /// The softmax scale (already resolved: ORT's 0 means `1 / sqrt(head_size)`).
    pub scale: f64,
    /// `cap * tanh(s / cap)` on the scaled scores; 0: none.
    pub softcap: f64,
    /// ORT's `local_window_size` `w >= 1`: a query at position `i` sees the `w` keys
    /// `i + 1 - w ..= i` (what ORT 1.31's GroupQueryAttention CPU kernel computes); `None`: all.
    pub local_window: Option<usize>,
    /// `(rotary_dim, interleaved)` when `do_rotary`: the first `rotary_dim` elements of every
    /// query and key head rotate by their token's position (`cos`/`sin` rows of `rotary_dim / 2`).
    pub rotary: Option<(usize, bool)>,
}

/// The inputs of one op call, as f64 (layouts as ORT's schema: `query [tokens, num_heads * D]`
/// or packed `[tokens, (num_heads + 2 kv_heads) * D]` with `key`/`value` `None`).
pub struct PagedOpInputs<'a> {
    pub query: &'a [f64],
    pub key: Option<&'a [f64]>,
    pub value: Option<&'a [f64]>,
    pub cumulative_sequence_length: &'a [i32],
    pub past_seqlens: &'a [i32],
    pub block_table: &'a [i32],
    /// `[rows, rotary_dim / 2]` each (empty without rotary).
    pub cos: &'a [f64],
    pub sin: &'a [f64],
}

/// `com.microsoft` `PagedAttention`: token `i` of sequence `b` sits at position
/// `past_seqlens[b] + i`; its (rotated) key and value are written into the cache slot the block
/// table gives that position, then it attends, causally and within the window, over positions
/// `0..=` its own of its sequence, read through the block table. `round` is applied to what is
/// stored in the element type (the rotated query and the written keys and values), so the
/// result is exactly what an implementation storing in that type computes before its attention.
/// Returns the output `[tokens, num_heads * D]`; the caches (`[num_blocks, block_size, kv_heads,
/// D]`) are updated in place. Every index is checked first: a bad one is an error and nothing
/// is written.
pub fn paged_attention_op(
    c: &PagedOpConfig,
    x: &PagedOpInputs,
    key_cache: &mut [f64],
    value_cache: &mut [f64],
    round: impl Fn(f64) -> f64,
) -> std::result::Result<Vec<f64>, String> {
    let (nh, kvh, d) = (c.num_heads, c.kv_heads, c.head_size);
    if nh == 0 || kvh == 0 || !nh.is_multiple_of(kvh) || d == 0 {
        return Err(format!("num_heads {nh} must be a positive multiple of kv_num_heads {kvh}"));
    }
    let packed = x.key.is_none();
    let q_stride = if packed { (nh + 2 * kvh) * d } else { nh * d };
    let kv_stride = if packed { q_stride } else { kvh * d };
    let (k_off, v_off) = if packed { (nh * d, (nh + kvh) * d) } else { (0, 0) };
    let tokens = x.query.len() / q_stride;
    let cu = x.cumulative_sequence_length;
    let batch = cu.len().saturating_sub(1);
    if cu.first() != Some(&0) || cu.windows(2).any(|w| w[0] > w[1]) || cu.last() != Some(&(tokens as i32)) {
        return Err(format!("cumulative_sequence_length {cu:?} must start at 0, never decrease and end at {tokens}"));
    }
    if x.past_seqlens.len() != batch || x.block_table.len() != batch * c.max_blocks {
        return Err(format!("past_seqlens / block_table do not hold {batch} sequences"));
    }
    let row = kvh * d;
    if key_cache.len() != c.num_blocks * c.block_size * row || value_cache.len() != key_cache.len() {
        return Err("the caches do not match their shape".into());
    }
    let half = c.rotary.map_or(0, |(rd, _)| rd / 2);
    // Each token's (sequence, position), and the cache row of every position of every sequence.
    let mut token_pos = Vec::with_capacity(tokens);
    let mut rows: Vec<Vec<usize>> = Vec::with_capacity(batch);
    for b in 0..batch {
        let (past, new) = (x.past_seqlens[b], (cu[b + 1] - cu[b]) as usize);
        if past < 0 {
            return Err(format!("past_seqlens[{b}] = {past} is negative"));
        }
        let total = past as usize + new;
        if total > c.max_blocks * c.block_size {
            return Err(format!(
                "sequence {b}: past_seqlens {past} + {new} new tokens exceed the block table's {} blocks of {}",
                c.max_blocks, c.block_size
            ));
        }
        let mut seq_rows = Vec::with_capacity(total);
        for pos in 0..total {
            let entry = x.block_table[b * c.max_blocks + pos / c.block_size];
            if entry < 0 || entry as usize >= c.num_blocks {
                return Err(format!(
                    "block_table[{b}][{}] = {entry} is outside the cache's {} blocks",
                    pos / c.block_size,
                    c.num_blocks
                ));
            }
            seq_rows.push(entry as usize * c.block_size + pos % c.block_size);
        }
        if half > 0 && total > x.cos.len() / half {
            return Err(format!(
                "sequence {b} reaches position {}, beyond the {} rows of cos_cache",
                total - 1,
                x.cos.len() / half
            ));
        }
        token_pos.extend((past as usize..total).map(|pos| (b, pos)));
        rows.push(seq_rows);
    }
    // Rotate, store, write the cache.
    let mut q = vec![0.0; tokens * nh * d];
    for (t, &(b, pos)) in token_pos.iter().enumerate() {
        let src = &x.query[t * q_stride..];
        let key = x.key.unwrap_or(x.query);
        let value = x.value.unwrap_or(x.query);
        let mut k = key[t * kv_stride + k_off..][..row].to_vec();
        let v = &value[t * kv_stride + v_off..][..row];
        let qt = &mut q[t * nh * d..][..nh * d];
        qt.copy_from_slice(&src[..nh * d]);
        if let Some((rd, interleaved)) = c.rotary {
            for head in qt.chunks_mut(d).chain(k.chunks_mut(d)) {
                crate::ops::common::rotary::rotate_at(head, x.cos, x.sin, pos, rd, interleaved);
            }
        }
        qt.iter_mut().for_each(|e| *e = round(*e));
        let slot = rows[b][pos];
        for (dst, s) in key_cache[slot * row..][..row].iter_mut().zip(&k) {
            *dst = round(*s);
        }
        for (dst, s) in value_cache[slot * row..][..row].iter_mut().zip(v) {
            *dst = round(*s);
        }
    }
    // Attention over each token's history.
    let group = nh / kvh;
    let mut out = vec![0.0; tokens * nh * d];
    for (t, &(b, pos)) in token_pos.iter().enumerate() {
        let first = c.local_window.map_or(0, |w| (pos + 1).saturating_sub(w.max(1)));
        for hq in 0..nh {
            let h = hq / group;
            let qh = &q[(t * nh + hq) * d..][..d];
            let scores: Vec<f64> = (first..=pos)
                .map(|kp| {
                    let k = &key_cache[rows[b][kp] * row + h * d..][..d];
                    let s = qh.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() * c.scale;
                    if c.softcap > 0.0 { c.softcap * (s / c.softcap).tanh() } else { s }
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let total: f64 = w.iter().sum();
            let o = &mut out[(t * nh + hq) * d..][..d];
            for (kp, wk) in (first..=pos).zip(&w) {
                let v = &value_cache[rows[b][kp] * row + h * d..][..d];
                for (oi, vi) in o.iter_mut().zip(v) {
                    *oi += wk / total * vi;
                }
            }
        }
    }
    Ok(out)
}
