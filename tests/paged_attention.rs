//! PagedAttention decode and the cache write: the reference's invariants and the launcher's
//! validation on the CPU; the kernels against the reference on the GPU (random block tables,
//! shared prefix blocks, awkward context lengths, GQA ratios, head and block sizes, options),
//! and bad block ids / context lengths reported without reading outside the cache.

mod common;

use common::{Rng, gpu, unit_roundoff};
use dlkern::ops::paged_attention::launch::*;
use dlkern::ops::paged_attention::reference::{PagedInputs, paged_attention as reference};
use dlkern::{DType, Element, Error};
use half::{bf16, f16};
use proptest::prelude::*;

#[allow(clippy::too_many_arguments)]
fn params(
    dtype: DType,
    batch: usize,
    q_len: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    bs: usize,
    max_ctx: usize,
) -> PagedAttentionParams {
    PagedAttentionParams {
        dtype,
        batch,
        q_len,
        num_q_heads: hq,
        num_kv_heads: hkv,
        head_size: d,
        num_blocks: 1,
        block_size: bs,
        max_blocks_per_seq: max_ctx.div_ceil(bs),
        max_context_len: max_ctx,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: 0.0,
        window: 0,
        alibi: false,
        partition: 0,
    }
}

/// A random decode problem: caches with the sequences' blocks shuffled over the cache (and
/// sequence 1 sharing sequence 0's first blocks, as prefix caching does).
struct Problem<T> {
    p: PagedAttentionParams,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    tables: Vec<i32>,
    lens: Vec<i32>,
    alibi: Option<Vec<f32>>,
}

fn problem<T: Element>(mut p: PagedAttentionParams, lens: &[usize], seed: u64) -> Problem<T> {
    let mut rng = Rng::new(seed);
    let per_seq: Vec<usize> = lens.iter().map(|l| l.div_ceil(p.block_size)).collect();
    let total: usize = per_seq.iter().sum::<usize>() + 3;
    p.num_blocks = total;
    // A permutation of the physical blocks.
    let mut perm: Vec<i32> = (0..total as i32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut tables = vec![0i32; p.batch * p.max_blocks_per_seq];
    let mut next = 0;
    for (b, &n) in per_seq.iter().enumerate() {
        for j in 0..n {
            tables[b * p.max_blocks_per_seq + j] = if b == 1 && j < per_seq[0].min(n) / 2 {
                tables[j] // shared prefix
            } else {
                next += 1;
                perm[next - 1]
            };
        }
    }
    let cache = total * p.block_size * p.num_kv_heads * p.head_size;
    Problem {
        q: rng.vec(p.batch * p.q_len * p.num_q_heads * p.head_size, -1.0, 1.0),
        k: rng.vec(cache, -1.0, 1.0),
        v: rng.vec(cache, -1.0, 1.0),
        tables,
        lens: lens.iter().map(|&l| l as i32).collect(),
        alibi: p.alibi.then(|| (0..p.num_q_heads).map(|h| 0.5f32.powi(h as i32 + 1)).collect()),
        p,
    }
}

impl<T: Element> Problem<T> {
    fn reference(&self) -> Vec<f64> {
        let x = PagedInputs {
            q: &self.q,
            key_cache: &self.k,
            value_cache: &self.v,
            block_tables: &self.tables,
            context_lens: &self.lens,
            alibi: self.alibi.as_deref(),
        };
        reference(&x, &self.p)
    }

    /// Runs on the GPU; returns the output and the status check.
    fn run_gpu(&self) -> (Vec<T>, dlkern::Result<()>, PagedAttentionPlan) {
        let (device, stream) = gpu();
        let q = stream.clone_htod(&self.q).unwrap();
        let k = stream.clone_htod(&self.k).unwrap();
        let v = stream.clone_htod(&self.v).unwrap();
        let tables = stream.clone_htod(&self.tables).unwrap();
        let lens = stream.clone_htod(&self.lens).unwrap();
        let alibi = self.alibi.as_ref().map(|a| stream.clone_htod(a).unwrap());
        let mut out = stream.clone_htod(&vec![T::from_f64(-7.0); self.q.len()]).unwrap();
        let mut status = stream.alloc_zeros::<u32>(1).unwrap();
        let plan = paged_attention(
            &device,
            &stream,
            &self.p,
            &q,
            PagedKvCache { key: &k, value: &v },
            &tables,
            &lens,
            alibi.as_ref(),
            &mut out,
            &mut status,
        )
        .unwrap_or_else(|e| panic!("launch {:?}: {e}", self.p));
        let result = check_status(&stream, &status);
        (stream.clone_dtoh(&out).unwrap(), result, plan)
    }
}

/// Each element within 2 roundoffs of the reference plus an absolute floor of 8 roundoffs of
/// the largest |V| (the output is a convex combination of V rows).
fn assert_matches<T: Element>(what: &str, got: &[T], want: &[f64]) {
    let u = unit_roundoff(T::DTYPE);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f64();
        if w.is_nan() {
            assert!(g.is_nan(), "{what}: element {i} = {g}, expected NaN (invalid sequence)");
            continue;
        }
        assert!((g - w).abs() <= 2.0 * u * w.abs() + 8.0 * u, "{what}: element {i} = {g} vs reference {w}");
    }
}

// ---------------------------------------------------------------------------------------------
// CPU

#[test]
fn reference_ignores_where_blocks_live() {
    let p = params(DType::F16, 2, 1, 4, 2, 64, 16, 100);
    let mut a = problem::<f16>(p, &[100, 37], 1);
    let first = a.reference();
    // Move every block elsewhere in a bigger cache and rewrite the tables: same attention.
    let row = p.block_size * p.num_kv_heads * p.head_size;
    let nb = a.p.num_blocks;
    let mut k2 = vec![f16::ZERO; 2 * nb * row];
    let mut v2 = k2.clone();
    for blk in 0..nb {
        let to = 2 * nb - 1 - blk;
        k2[to * row..(to + 1) * row].copy_from_slice(&a.k[blk * row..(blk + 1) * row]);
        v2[to * row..(to + 1) * row].copy_from_slice(&a.v[blk * row..(blk + 1) * row]);
    }
    for e in a.tables.iter_mut() {
        *e = (2 * nb - 1) as i32 - *e;
    }
    (a.k, a.v, a.p.num_blocks) = (k2, v2, 2 * nb);
    assert_eq!(a.reference(), first);
}

#[test]
fn reference_matches_dense_attention_for_one_token() {
    // One sequence, one head, the cache in order: plain softmax(q k^T) v.
    let p = params(DType::F16, 1, 1, 1, 1, 64, 16, 40);
    let prob = problem::<f16>(p, &[40], 2);
    let got = prob.reference();
    let d = 64;
    let rows: Vec<usize> = (0..40).map(|pos| prob.tables[pos / 16] as usize * 16 + pos % 16).collect();
    let scores: Vec<f64> = rows
        .iter()
        .map(|&r| (0..d).map(|i| prob.q[i].to_f64() * prob.k[r * d + i].to_f64()).sum::<f64>() / 8.0)
        .collect();
    let m = scores.iter().copied().fold(f64::MIN, f64::max);
    let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
    for (i, g) in got.iter().enumerate().take(d) {
        let want: f64 = rows.iter().zip(&scores).map(|(&r, s)| (s - m).exp() / z * prob.v[r * d + i].to_f64()).sum();
        assert!((g - want).abs() < 1e-12, "{i}: {g} vs {want}");
    }
}

fn plan_err(p: PagedAttentionParams) -> String {
    match p.plan(132, 227 * 1024) {
        Err(e @ (Error::InvalidArgument { .. } | Error::LaunchLimit { .. })) => e.to_string(),
        other => panic!("expected an error for {p:?}, got {other:?}"),
    }
}

#[test]
fn validation_rejects_bad_shapes() {
    let ok = params(DType::F16, 4, 1, 32, 8, 128, 16, 4096);
    assert!(plan_err(PagedAttentionParams { dtype: DType::F32, ..ok }).contains("dtype f32"));
    assert!(plan_err(PagedAttentionParams { head_size: 72, ..ok }).contains("head size 72"));
    assert!(plan_err(PagedAttentionParams { num_kv_heads: 5, ..ok }).contains("not a multiple"));
    assert!(plan_err(PagedAttentionParams { q_len: 17, ..ok }).contains("exceeds 64"));
    assert!(plan_err(PagedAttentionParams { max_blocks_per_seq: 10, ..ok }).contains("exceeds the block table"));
    assert!(plan_err(PagedAttentionParams { block_size: 0, ..ok }).contains("block_size = 0"));
    assert!(plan_err(PagedAttentionParams { softcap: -1.0, ..ok }).contains("softcap"));
    assert!(plan_err(PagedAttentionParams { max_context_len: 0, ..ok }).contains("max_context_len = 0"));
}

/// The kernel's multiply-high division (`divmod` in the device code) with the launcher's
/// constants, for every block size up to 4096, powers of two and large divisors.
#[test]
fn block_divmod_constants_divide_exactly() {
    let divide = |n: u32, d: u32| {
        let (magic, shift) = divmod_constants(d);
        let hi = ((n as u64 * magic as u64) >> 32) as u32;
        (hi + n) >> shift
    };
    let mut rng = Rng::new(5);
    let divisors = (1..=4096u32).chain((0..31).map(|s| 1u32 << s)).chain([3, 7, 1000, 65537, i32::MAX as u32]);
    for d in divisors {
        let edges = [0, 1, d - 1, d, d + 1, 2 * d - 1, i32::MAX as u32 - 1, i32::MAX as u32];
        for n in edges.into_iter().chain((0..200).map(|_| (rng.next_u64() >> 33) as u32)) {
            if n <= i32::MAX as u32 {
                assert_eq!(divide(n, d), n / d, "{n} / {d}");
            }
        }
    }
}

#[test]
fn partitioning_fills_the_gpu() {
    let sms = 132;
    let big = params(DType::F16, 64, 1, 32, 8, 128, 16, 4096).plan(sms, 227 * 1024).unwrap();
    assert_eq!((big.partition, big.num_partitions), (1024, 4));
    assert!(big.combine.is_some() && big.workspace_bytes == 64 * 8 * 4 * 4 * 130 * 4);
    let long = params(DType::F16, 1, 1, 32, 8, 128, 16, 65536).plan(sms, 227 * 1024).unwrap();
    assert_eq!(long.num_partitions, 65536 / long.partition);
    assert!(long.num_partitions * 8 >= 4 * sms as usize, "{long:?}");
    let short = params(DType::F16, 1, 1, 4, 1, 64, 16, 16).plan(sms, 227 * 1024).unwrap();
    assert_eq!((short.num_partitions, short.combine, short.workspace_bytes), (1, None, 0));
}

proptest! {
    #[test]
    fn planning_never_panics(
        batch in 0usize..70000, q_len in 0usize..80, hq in 0usize..80, hkv in 0usize..20, d in 0usize..300,
        bs in 0usize..300, mb in 0usize..100000, ctx in 0usize..10_000_000, part in 0usize..5000, window in any::<usize>(),
        smem in 0u32..300_000,
    ) {
        let p = PagedAttentionParams {
            dtype: DType::F16, batch, q_len, num_q_heads: hq, num_kv_heads: hkv, head_size: d, num_blocks: 7,
            block_size: bs, max_blocks_per_seq: mb, max_context_len: ctx, scale: 0.1, softcap: 0.0, window,
            alibi: false, partition: part,
        };
        if let Ok(plan) = p.plan(132, smem) {
            prop_assert!(plan.attention_dims.shared_bytes <= smem);
            prop_assert!(plan.num_partitions * plan.partition >= ctx);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GPU

fn check<T: Element>(p: PagedAttentionParams, lens: &[usize], seed: u64) {
    let prob = problem::<T>(p, lens, seed);
    let (got, status, plan) = prob.run_gpu();
    status.unwrap_or_else(|e| panic!("{p:?}: {e}"));
    assert_matches(&format!("{p:?} lens {lens:?} ({} partitions)", plan.num_partitions), &got, &prob.reference());
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_matches_reference_across_shapes() {
    let mut seed = 10;
    for &d in &HEAD_SIZES {
        for &(hq, hkv) in &[(8, 8), (16, 4), (32, 4)] {
            for &bs in &[16, 32, 64] {
                seed += 1;
                let lens = [1000, 1, 15, 16, 17];
                check::<f16>(params(DType::F16, lens.len(), 1, hq, hkv, d, bs, 1000), &lens, seed);
            }
        }
        check::<bf16>(params(DType::BF16, 3, 1, 8, 2, d, 16, 1000), &[17, 1000, 300], seed + 100);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_speculative_tokens_and_options() {
    let base = params(DType::F16, 3, 3, 16, 4, 128, 16, 700);
    check::<f16>(base, &[700, 3, 129], 1);
    check::<f16>(PagedAttentionParams { softcap: 30.0, ..base }, &[700, 3, 129], 2);
    check::<f16>(PagedAttentionParams { window: 100, ..base }, &[700, 3, 129], 3);
    check::<f16>(PagedAttentionParams { alibi: true, ..base }, &[700, 3, 129], 4);
    check::<bf16>(
        PagedAttentionParams { dtype: DType::BF16, softcap: 20.0, window: 64, alibi: true, ..base },
        &[700, 64, 65],
        5,
    );
    // Forced tiny partitions: many partials through the combine.
    check::<f16>(PagedAttentionParams { partition: 32, ..base }, &[700, 3, 129], 6);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_long_context() {
    check::<f16>(params(DType::F16, 1, 1, 8, 2, 128, 16, 65536), &[65536], 7);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_matches_reference_on_random_problems(
        d_idx in 0usize..5, ratio in prop_oneof![Just(1usize), Just(4), Just(8)], hkv in 1usize..4,
        bs in prop_oneof![Just(16usize), Just(32), Just(64)], q_len in 1usize..4,
        lens in proptest::collection::vec(1usize..2000, 1..5), seed: u64,
    ) {
        let lens: Vec<usize> = lens.into_iter().map(|l| l.max(q_len)).collect();
        let max_ctx = *lens.iter().max().unwrap();
        check::<f16>(params(DType::F16, lens.len(), q_len, hkv * ratio, hkv, HEAD_SIZES[d_idx], bs, max_ctx), &lens, seed);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_reports_bad_block_ids_and_lengths_without_reading_outside() {
    let p = params(DType::F16, 3, 1, 8, 2, 64, 16, 200);
    let mut prob = problem::<f16>(p, &[200, 100, 50], 9);
    prob.tables[p.max_blocks_per_seq + 2] = 1 << 30; // sequence 1: a block far outside the cache
    prob.tables[2 * p.max_blocks_per_seq] = -5; // sequence 2: a negative block id
    let (got, status, _) = prob.run_gpu();
    let err = status.unwrap_err().to_string();
    assert!(err.contains("outside the cache"), "{err}");
    assert_matches("bad blocks", &got, &prob.reference()); // sequences 1 and 2 are NaN, 0 is right
    let seq = p.num_q_heads * p.head_size;
    assert!(got[seq..].iter().all(|v| v.to_f64().is_nan()));
    assert!(got[..seq].iter().all(|v| v.to_f64().is_finite()));

    let mut prob = problem::<f16>(p, &[200, 100, 50], 10);
    prob.lens[0] = 10_000; // beyond the block table
    prob.lens[2] = 0; // shorter than q_len
    let (got, status, _) = prob.run_gpu();
    assert!(status.unwrap_err().to_string().contains("context length"));
    assert_matches("bad lengths", &got, &prob.reference());
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_kv_write_fills_slots_and_flags_bad_ones() {
    let (device, stream) = gpu();
    let mut rng = Rng::new(3);
    let (hkv, d, bs, nb, tokens) = (2, 128, 16, 5, 7);
    let row = hkv * d;
    let key: Vec<f16> = rng.vec(tokens * row, -1.0, 1.0);
    let value: Vec<f16> = rng.vec(tokens * row, -1.0, 1.0);
    let slots: Vec<i32> = vec![0, 17, 79, -1, 40, 1000, 3];
    let sentinel = f16::from_f32(9.0);
    let mut kc = stream.clone_htod(&vec![sentinel; nb * bs * row]).unwrap();
    let mut vc = stream.clone_htod(&vec![sentinel; nb * bs * row]).unwrap();
    let (k_dev, v_dev, s_dev) =
        (stream.clone_htod(&key).unwrap(), stream.clone_htod(&value).unwrap(), stream.clone_htod(&slots).unwrap());
    let mut status = stream.alloc_zeros::<u32>(1).unwrap();
    {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let (kp, _a) = k_dev.device_ptr(&stream);
        let (vp, _b) = v_dev.device_ptr(&stream);
        let (kcp, _c) = kc.device_ptr_mut(&stream);
        let (vcp, _d) = vc.device_ptr_mut(&stream);
        let (sp, _e) = s_dev.device_ptr(&stream);
        let (stp, _f) = status.device_ptr_mut(&stream);
        // SAFETY: buffers of the described extents.
        unsafe {
            paged_kv_write_raw(&device, stream.cu_stream(), DType::F16, tokens, row, nb * bs, kp, vp, kcp, vcp, sp, stp)
        }
        .unwrap();
    }
    assert!(check_status(&stream, &status).unwrap_err().to_string().contains("outside the cache"));
    let (kc, vc) = (stream.clone_dtoh(&kc).unwrap(), stream.clone_dtoh(&vc).unwrap());
    for slot in 0..nb * bs {
        let token = slots.iter().position(|&s| s == slot as i32);
        for i in 0..row {
            let (want_k, want_v) = token.map_or((sentinel, sentinel), |t| (key[t * row + i], value[t * row + i]));
            assert_eq!((kc[slot * row + i], vc[slot * row + i]), (want_k, want_v), "slot {slot} element {i}");
        }
    }
}
