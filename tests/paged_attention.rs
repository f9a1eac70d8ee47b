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

    /// Runs `launches` times on raw pointers, the partitions merged by the combine kernel or
    /// (`merge`) by the partition kernel over one zeroed set of arrival counters; returns each
    /// launch's output and the status check.
    fn run_gpu_raw(&self, merge: bool, launches: usize) -> (Vec<Vec<T>>, dlkern::Result<()>) {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let (device, stream) = gpu();
        let s = &stream;
        let plan = self.p.plan(DecodeLimits::of(&device, self.p.dtype, self.p.head_size).unwrap()).unwrap();
        let q = s.clone_htod(&self.q).unwrap();
        let k = s.clone_htod(&self.k).unwrap();
        let v = s.clone_htod(&self.v).unwrap();
        let tables = s.clone_htod(&self.tables).unwrap();
        let lens = s.clone_htod(&self.lens).unwrap();
        let alibi = s.clone_htod(self.alibi.as_deref().unwrap_or(&[0.0])).unwrap();
        let mut out = s.clone_htod(&vec![T::from_f64(-7.0); self.q.len()]).unwrap();
        let workspace = s.alloc_zeros::<u8>(plan.workspace_bytes.max(16)).unwrap();
        let arrivals = s.alloc_zeros::<u32>(plan.arrival_words.max(1)).unwrap();
        let mut status = s.alloc_zeros::<u32>(1).unwrap();
        let ptrs = PagedAttentionPointers {
            q: q.device_ptr(s).0,
            key_cache: k.device_ptr(s).0,
            value_cache: v.device_ptr(s).0,
            block_tables: tables.device_ptr(s).0,
            context_lens: lens.device_ptr(s).0,
            alibi: alibi.device_ptr(s).0,
            out: out.device_ptr_mut(s).0,
            workspace: workspace.device_ptr(s).0,
            arrivals: if merge { arrivals.device_ptr(s).0 } else { 0 },
            status: status.device_ptr_mut(s).0,
        };
        let mut outputs = Vec::new();
        for _ in 0..launches {
            // SAFETY: every buffer above holds the extent the params describe and outlives the
            // launch (the stream is synchronized by the copy back).
            unsafe { paged_attention_raw(&device, s.cu_stream(), &self.p, &ptrs) }.unwrap();
            outputs.push(s.clone_dtoh(&out).unwrap());
        }
        if merge {
            assert!(s.clone_dtoh(&arrivals).unwrap().iter().all(|&c| c == 0), "the counters are zero again");
        }
        (outputs, check_status(s, &status))
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

/// An H100's: 132 SMs, 227 KiB of shared memory per block, two partition blocks per SM.
const H100: DecodeLimits = DecodeLimits { multiprocessors: 132, max_shared_bytes: 227 * 1024, resident_blocks: 2 };

fn plan_err(p: PagedAttentionParams) -> String {
    match p.plan(H100) {
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

/// A BNSH plan (GroupQueryAttention's) reads queries at the given token stride: the leading
/// heads of a packed QKV row, or dense; a stride that is not a multiple of 8 (16-byte loads) or
/// below the query heads' width is refused.
#[test]
fn bnsh_plan_takes_a_query_token_stride() {
    let dense = 32 * 128;
    let bnsh = |q_token_stride: usize| BnshAttentionParams {
        dtype: DType::F16,
        batch: 2,
        q_len: 1,
        num_q_heads: 32,
        num_kv_heads: 8,
        head_size: 128,
        capacity: 4096,
        max_keys: 4096,
        scale: 0.088,
        softcap: 0.0,
        window: 0,
        q_token_stride,
    };
    for stride in [dense, (32 + 2 * 8) * 128] {
        bnsh(stride).plan(H100).unwrap();
    }
    for bad in [dense - 8, dense + 4, 0] {
        let e = bnsh(bad).plan(H100).unwrap_err().to_string();
        assert!(e.contains(&format!("query token stride {bad}")), "{e}");
    }
}

/// Scratch laid out from the status word (GroupQueryAttention's decode): the status word, the
/// arrival counters after it, the partial results from the next 256-byte boundary; a plan that
/// merges in one launch has all three, one that needs no partials only the status word.
#[test]
fn status_scratch_holds_the_status_word_counters_and_aligned_partials() {
    let bnsh = |batch: usize, capacity: usize| BnshAttentionParams {
        dtype: DType::F16,
        batch,
        q_len: 1,
        num_q_heads: 32,
        num_kv_heads: 8,
        head_size: 128,
        capacity,
        max_keys: capacity,
        scale: 0.088,
        softcap: 0.0,
        window: 0,
        q_token_stride: 32 * 128,
    };
    let base = 1 << 20;
    let split = bnsh(1, 65536).plan(H100).unwrap();
    assert!(split.arrival_words > 0 && split.workspace_bytes > 0, "{split:?}");
    let partials = (4 * (1 + split.arrival_words)).next_multiple_of(256);
    assert_eq!(split.status_words(), 1 + split.arrival_words);
    assert_eq!(split.scratch_bytes(), partials + split.workspace_bytes);
    let p = split.scratch_pointers(base);
    assert_eq!((p.status, p.arrivals, p.workspace), (base, base + 4, base + partials as u64));
    let whole = bnsh(256, 1024).plan(H100).unwrap();
    assert_eq!((whole.arrival_words, whole.workspace_bytes), (0, 0), "{whole:?}");
    assert_eq!((whole.status_words(), whole.scratch_bytes()), (1, 256));
    let p = whole.scratch_pointers(base);
    assert_eq!((p.status, p.arrivals, p.workspace), (base, 0, 0));
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
fn partitioning_fills_one_wave() {
    // 512 blocks of whole contexts already fill the 264 slots: no split, no combine.
    let big = params(DType::F16, 64, 1, 32, 8, 128, 16, 4096).plan(H100).unwrap();
    assert_eq!((big.partition, big.num_partitions, big.combine, big.workspace_bytes), (4096, 1, None, 0));
    // 128 blocks: two partitions each (256 blocks, one wave).
    let b16 = params(DType::F16, 16, 1, 32, 8, 128, 16, 4096).plan(H100).unwrap();
    assert_eq!((b16.partition, b16.num_partitions), (2048, 2));
    assert_eq!(b16.workspace_bytes, 16 * 8 * 2 * 4 * 130 * 4);
    // One sequence: 8 KV heads x 32 partitions = 256 of the 264 slots.
    for (ctx, partition) in [(8192, 256), (65536, 2048), (131072, 4032), (100, 64)] {
        let long = params(DType::F16, 1, 1, 32, 8, 128, 16, ctx).plan(H100).unwrap();
        assert_eq!(long.partition, partition, "context {ctx}");
        assert_eq!(long.num_partitions, ctx.div_ceil(partition));
        let blocks = long.attention_dims.grid.0 * long.attention_dims.grid.1 * long.attention_dims.grid.2;
        assert!(blocks <= 264, "{long:?}");
    }
    // Head size 256 takes two blocks per partition.
    let wide = params(DType::F16, 1, 1, 8, 8, 256, 16, 8192).plan(H100).unwrap();
    assert_eq!((wide.partition, wide.num_partitions), (512, 16));
    let short = params(DType::F16, 1, 1, 4, 1, 64, 16, 16).plan(H100).unwrap();
    assert_eq!((short.num_partitions, short.combine, short.workspace_bytes), (1, None, 0));
    let explicit = PagedAttentionParams { partition: 100, ..params(DType::F16, 64, 1, 32, 8, 128, 16, 4096) };
    assert_eq!(explicit.plan(H100).unwrap().num_partitions, 41, "an explicit partition is kept");
}

proptest! {
    #[test]
    fn planning_never_panics(
        batch in 0usize..70000, q_len in 0usize..80, hq in 0usize..80, hkv in 0usize..20, d in 0usize..300,
        bs in 0usize..300, mb in 0usize..100000, ctx in 0usize..10_000_000, part in 0usize..5000, window in any::<usize>(),
        smem in 0u32..300_000, sms in 0u32..300, resident in 0u32..40,
    ) {
        let p = PagedAttentionParams {
            dtype: DType::F16, batch, q_len, num_q_heads: hq, num_kv_heads: hkv, head_size: d, num_blocks: 7,
            block_size: bs, max_blocks_per_seq: mb, max_context_len: ctx, scale: 0.1, softcap: 0.0, window,
            alibi: false, partition: part,
        };
        let limits = DecodeLimits { multiprocessors: sms, max_shared_bytes: smem, resident_blocks: resident };
        if let Ok(plan) = p.plan(limits) {
            prop_assert!(plan.attention_dims.shared_bytes <= smem);
            prop_assert!(plan.num_partitions * plan.partition >= ctx);
            prop_assert!((plan.num_partitions - 1) * plan.partition < ctx, "no partition is empty");
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
            for &bs in &[16, 32, 64, 128, 256] {
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
    check::<f16>(params(DType::F16, 2, 1, 8, 2, 128, 256, 65537), &[65537, 1], 8);
}

/// The two ways of merging partitions give the reference on the same problems, launch after
/// launch on the same counters, poisoned sequences included.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_merge_in_the_partition_kernel_matches_the_combine_kernel() {
    let cases = [
        (params(DType::F16, 3, 1, 32, 8, 128, 16, 3000), vec![3000, 1, 1025], 0usize),
        (params(DType::F16, 2, 3, 16, 2, 256, 128, 5000), vec![97, 5000], 0),
        (PagedAttentionParams { partition: 64, ..params(DType::F16, 3, 2, 8, 8, 80, 32, 700) }, vec![700, 2, 129], 0),
        (params(DType::F16, 3, 1, 8, 2, 64, 16, 2000), vec![2000, 1000, 50], 1),
    ];
    for (seed, (p, lens, poison)) in cases.into_iter().enumerate() {
        let mut prob = problem::<f16>(p, &lens, 40 + seed as u64);
        if poison > 0 {
            prob.tables[p.max_blocks_per_seq + 2] = 1 << 30; // sequence 1: a block outside the cache
        }
        assert!(prob.p.plan(H100).unwrap().num_partitions > 1, "{p:?} must split");
        let want = prob.reference();
        for merge in [false, true] {
            let (outputs, status) = prob.run_gpu_raw(merge, 3);
            assert_eq!(status.is_err(), poison > 0, "{p:?}: {status:?}");
            for (i, got) in outputs.iter().enumerate() {
                assert_matches(&format!("{p:?} lens {lens:?}, merge {merge}, launch {i}"), got, &want);
            }
        }
    }
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

// ---------------------------------------------------------------------------------------------
// The `PagedAttention` op (`dlkern.paged_attention`): packed ragged batches, rotary, windows.

use common::{Host, on_cuda};
use dlkern::dlpack::DLTensor;
use dlkern::ops::common::rotary::rotate_at;
use dlkern::ops::paged_attention::reference::{PagedOpConfig, PagedOpInputs, paged_attention_op};
use dlkern::registry::{self, AttrValue, Attributes};

/// One op call: sequences of `(new tokens, past tokens)`, values representable in f16.
#[derive(Clone)]
struct OpCase {
    c: PagedOpConfig,
    seqs: Vec<(usize, usize)>,
    packed: bool,
    query: Vec<f64>,
    key: Vec<f64>,
    value: Vec<f64>,
    kc: Vec<f64>,
    vc: Vec<f64>,
    cu: Vec<i32>,
    past: Vec<i32>,
    table: Vec<i32>,
    cos: Vec<f64>,
    sin: Vec<f64>,
}

fn f16_vec(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    rng.vec::<f16>(n, lo, hi).iter().map(|v| v.to_f64()).collect()
}

#[allow(clippy::too_many_arguments)]
fn op_case(
    seqs: &[(usize, usize)],
    nh: usize,
    kvh: usize,
    d: usize,
    bs: usize,
    local_window: Option<usize>,
    softcap: f64,
    rotary: Option<(usize, bool)>,
    packed: bool,
    seed: u64,
) -> OpCase {
    let mut rng = Rng::new(seed);
    let needed: Vec<usize> = seqs.iter().map(|&(n, p)| (n + p).div_ceil(bs)).collect();
    let num_blocks = needed.iter().sum::<usize>() + 3;
    let max_blocks = needed.iter().copied().max().unwrap_or(0) + 1;
    let mut perm: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    // Unused entries hold ids far outside the cache: they must never be read.
    let mut table = vec![i32::MAX; seqs.len() * max_blocks];
    let mut next = 0;
    for (b, &n) in needed.iter().enumerate() {
        for j in 0..n {
            table[b * max_blocks + j] = perm[next];
            next += 1;
        }
    }
    let tokens: usize = seqs.iter().map(|s| s.0).sum();
    let mut cu = vec![0i32];
    for &(n, _) in seqs {
        cu.push(cu.last().unwrap() + n as i32);
    }
    let positions = seqs.iter().map(|&(n, p)| n + p).max().unwrap_or(1) + 5;
    let half = rotary.map_or(0, |(rd, _)| rd / 2);
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for pos in 0..positions {
        for i in 0..half {
            let angle = pos as f64 / 10000f64.powf(i as f64 / half as f64);
            cos.push(f16::from_f64(angle.cos()).to_f64());
            sin.push(f16::from_f64(angle.sin()).to_f64());
        }
    }
    let width = if packed { (nh + 2 * kvh) * d } else { nh * d };
    let cache = num_blocks * bs * kvh * d;
    OpCase {
        c: PagedOpConfig {
            num_heads: nh,
            kv_heads: kvh,
            head_size: d,
            num_blocks,
            block_size: bs,
            max_blocks,
            scale: 1.0 / (d as f64).sqrt(),
            softcap,
            local_window,
            rotary,
        },
        seqs: seqs.to_vec(),
        packed,
        query: f16_vec(&mut rng, tokens * width, -1.0, 1.0),
        key: if packed { Vec::new() } else { f16_vec(&mut rng, tokens * kvh * d, -1.0, 1.0) },
        value: if packed { Vec::new() } else { f16_vec(&mut rng, tokens * kvh * d, -1.0, 1.0) },
        kc: f16_vec(&mut rng, cache, -1.0, 1.0),
        vc: f16_vec(&mut rng, cache, -1.0, 1.0),
        cu,
        past: seqs.iter().map(|s| s.1 as i32).collect(),
        table,
        cos,
        sin,
    }
}

fn round16(v: f64) -> f64 {
    f16::from_f64(v).to_f64()
}

impl OpCase {
    fn tokens(&self) -> usize {
        *self.cu.last().unwrap() as usize
    }

    fn inputs(&self) -> PagedOpInputs<'_> {
        PagedOpInputs {
            query: &self.query,
            key: (!self.packed).then_some(&self.key[..]),
            value: (!self.packed).then_some(&self.value[..]),
            cumulative_sequence_length: &self.cu,
            past_seqlens: &self.past,
            block_table: &self.table,
            cos: &self.cos,
            sin: &self.sin,
        }
    }

    /// The reference: (output, key cache, value cache) after the call.
    fn reference(&self) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let (mut kc, mut vc) = (self.kc.clone(), self.vc.clone());
        let out = paged_attention_op(&self.c, &self.inputs(), &mut kc, &mut vc, round16).unwrap();
        (out, kc, vc)
    }

    /// Dense attention computed here, independently: each sequence's history gathered into
    /// contiguous rows (old ones from the cache through the table, new ones from the inputs),
    /// then masked softmax attention.
    fn dense(&self) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let c = &self.c;
        let (nh, kvh, d) = (c.num_heads, c.kv_heads, c.head_size);
        let row = kvh * d;
        let width = if self.packed { (nh + 2 * kvh) * d } else { nh * d };
        let (mut kc, mut vc) = (self.kc.clone(), self.vc.clone());
        let mut out = vec![0.0; self.tokens() * nh * d];
        let rotate = |x: &mut [f64], pos: usize| {
            if let Some((rd, inter)) = c.rotary {
                for head in x.chunks_mut(d) {
                    rotate_at(head, &self.cos, &self.sin, pos, rd, inter);
                }
            }
            x.iter_mut().for_each(|v| *v = round16(*v));
        };
        for (b, &(new, past)) in self.seqs.iter().enumerate() {
            let slot = |pos: usize| {
                self.table[b * c.max_blocks + pos / c.block_size] as usize * c.block_size + pos % c.block_size
            };
            let mut hk: Vec<Vec<f64>> = (0..past).map(|p| self.kc[slot(p) * row..][..row].to_vec()).collect();
            let mut hv: Vec<Vec<f64>> = (0..past).map(|p| self.vc[slot(p) * row..][..row].to_vec()).collect();
            let mut queries = Vec::new();
            for i in 0..new {
                let t = self.cu[b] as usize + i;
                let qrow = &self.query[t * width..][..width];
                let mut q = qrow[..nh * d].to_vec();
                let (mut k, v) = if self.packed {
                    (qrow[nh * d..][..row].to_vec(), qrow[(nh + kvh) * d..][..row].to_vec())
                } else {
                    (self.key[t * row..][..row].to_vec(), self.value[t * row..][..row].to_vec())
                };
                rotate(&mut q, past + i);
                rotate(&mut k, past + i);
                kc[slot(past + i) * row..][..row].copy_from_slice(&k);
                vc[slot(past + i) * row..][..row].copy_from_slice(&v);
                hk.push(k);
                hv.push(v);
                queries.push((t, past + i, q));
            }
            for (t, qpos, q) in queries {
                for hq in 0..nh {
                    let h = hq / (nh / kvh);
                    let lo = c.local_window.map_or(0, |w| (qpos + 1).saturating_sub(w));
                    let s: Vec<f64> = (lo..=qpos)
                        .map(|j| {
                            let dot: f64 = (0..d).map(|e| q[hq * d + e] * hk[j][h * d + e]).sum::<f64>() * c.scale;
                            if c.softcap > 0.0 { c.softcap * (dot / c.softcap).tanh() } else { dot }
                        })
                        .collect();
                    let m = s.iter().copied().fold(f64::MIN, f64::max);
                    let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                    for e in 0..d {
                        out[(t * nh + hq) * d + e] =
                            (lo..=qpos).zip(&s).map(|(j, x)| (x - m).exp() / z * hv[j][h * d + e]).sum();
                    }
                }
            }
        }
        (out, kc, vc)
    }
}

/// The awkward shapes of the op: new tokens 1, 7, 97; past 0, 1, 1025 (and an empty sequence);
/// head sizes 64, 80, 128; GQA 1, 4, 8; blocks of 16 and 32; window, softcap, rotary variants.
fn op_cases() -> Vec<OpCase> {
    let ragged: &[(usize, usize)] = &[(1, 1025), (7, 0), (97, 1), (0, 5), (1, 0), (7, 1025)];
    let mut cases = Vec::new();
    // (heads, kv heads, head size, block size, window, softcap, rotary, packed QKV)
    type Config = (usize, usize, usize, usize, Option<usize>, f64, Option<(usize, bool)>, bool);
    let configs: &[Config] = &[
        (2, 2, 64, 16, None, 0.0, None, false),
        (4, 1, 80, 32, None, 0.0, Some((80, false)), false),
        (8, 1, 128, 16, Some(40), 0.0, Some((128, true)), true),
        (8, 2, 64, 32, None, 30.0, Some((32, false)), false), // partial rotary
        (4, 1, 128, 16, Some(1), 10.0, Some((64, true)), true), // window of one key, interleaved partial
    ];
    for (i, &(nh, kvh, d, bs, window, cap, rotary, packed)) in configs.iter().enumerate() {
        cases.push(op_case(ragged, nh, kvh, d, bs, window, cap, rotary, packed, 100 + i as u64));
    }
    cases
}

#[test]
fn op_reference_matches_dense_attention_over_gathered_history() {
    for case in op_cases() {
        let (out, kc, vc) = case.reference();
        let (want, want_kc, want_vc) = case.dense();
        assert_eq!(kc, want_kc, "key cache {:?}", case.c);
        assert_eq!(vc, want_vc, "value cache {:?}", case.c);
        for (i, (g, w)) in out.iter().zip(&want).enumerate() {
            assert!((g - w).abs() < 1e-10, "{:?} element {i}: {g} vs {w}", case.c);
        }
    }
}

#[test]
fn op_reference_writes_only_the_new_slots() {
    let case = op_case(&[(3, 20), (1, 0)], 4, 2, 64, 16, None, 0.0, Some((64, false)), false, 7);
    let (_, kc, _) = case.reference();
    let row = 2 * 64;
    let changed = (0..case.c.num_blocks * 16).filter(|&s| kc[s * row..][..row] != case.kc[s * row..][..row]).count();
    assert_eq!(changed, 4, "four new tokens, four slots");
}

#[test]
fn op_reference_refuses_bad_indices() {
    let base = op_case(&[(2, 30), (1, 0)], 4, 2, 64, 16, None, 0.0, None, false, 8);
    let err = |case: &OpCase| {
        let (mut kc, mut vc) = (case.kc.clone(), case.vc.clone());
        paged_attention_op(&case.c, &case.inputs(), &mut kc, &mut vc, round16).unwrap_err()
    };
    let mut c = base.clone();
    c.table[1] = -3;
    assert!(err(&c).contains("block_table[0][1] = -3"), "{}", err(&c));
    let mut c = base.clone();
    c.past[1] = 10_000;
    assert!(err(&c).contains("exceed the block table"), "{}", err(&c));
    let mut c = base.clone();
    c.cu[1] = 5;
    assert!(err(&c).contains("cumulative_sequence_length"), "{}", err(&c));
}

/// Host tensors of one case in `T`, and the registry call.
struct OpTensors<T> {
    query: Host<T>,
    key: Host<T>,
    value: Host<T>,
    kc: Host<T>,
    vc: Host<T>,
    cu: Host<i32>,
    past: Host<i32>,
    table: Host<i32>,
    cos: Host<T>,
    sin: Host<T>,
    out: Host<T>,
}

fn host_of<T: Element + dlkern::dtype::Scalar>(v: &[f64], shape: &[i64]) -> Host<T> {
    Host::new(v.iter().map(|&x| T::from_f64(x)).collect(), shape)
}

impl OpCase {
    fn attrs(&self) -> Attributes {
        let c = &self.c;
        let mut a = Attributes::new()
            .with("num_heads", AttrValue::Int(c.num_heads as i64))
            .with("kv_num_heads", AttrValue::Int(c.kv_heads as i64))
            .with("softcap", AttrValue::Float(c.softcap))
            .with("local_window_size", AttrValue::Int(c.local_window.map_or(-1, |w| w as i64)));
        if let Some((_, inter)) = c.rotary {
            a = a.with("do_rotary", AttrValue::Int(1)).with("rotary_interleaved", AttrValue::Int(inter as i64));
        }
        a
    }

    fn tensors<T: Element + dlkern::dtype::Scalar>(&self) -> OpTensors<T> {
        let c = &self.c;
        let (t, d) = (self.tokens() as i64, c.head_size as i64);
        let width = self.query.len() as i64 / t.max(1);
        let cache = [c.num_blocks as i64, c.block_size as i64, c.kv_heads as i64, d];
        let kv = [t, c.kv_heads as i64 * d];
        let half = c.rotary.map_or(0, |(rd, _)| rd / 2) as i64;
        let rows = if half > 0 { self.cos.len() as i64 / half } else { 0 };
        let rot_shape: Vec<i64> = if half > 0 { vec![rows, half] } else { vec![0] };
        OpTensors {
            query: host_of(&self.query, &[t, width]),
            key: host_of(&self.key, if self.packed { &[0] } else { &kv }),
            value: host_of(&self.value, if self.packed { &[0] } else { &kv }),
            kc: host_of(&self.kc, &cache),
            vc: host_of(&self.vc, &cache),
            cu: Host::new(self.cu.clone(), &[self.cu.len() as i64]),
            past: Host::new(self.past.clone(), &[self.past.len() as i64]),
            table: Host::new(self.table.clone(), &[self.past.len() as i64, c.max_blocks as i64]),
            cos: host_of(&self.cos, &rot_shape),
            sin: host_of(&self.sin, &rot_shape),
            out: host_of(
                &vec![f64::NAN; self.tokens() * c.num_heads * c.head_size],
                &[t, (c.num_heads * c.head_size) as i64],
            ),
        }
    }
}

impl<T: dlkern::dtype::Scalar> OpTensors<T> {
    fn dl(&mut self) -> Vec<DLTensor> {
        vec![
            self.query.dl(),
            self.key.dl(),
            self.value.dl(),
            self.kc.dl(),
            self.vc.dl(),
            self.cu.dl(),
            self.past.dl(),
            self.table.dl(),
            self.cos.dl(),
            self.sin.dl(),
        ]
    }
}

/// Runs the op on host tensors in `T` with extra inputs/attributes, the caches updated in place.
fn run_cpu<T: Element + dlkern::dtype::Scalar>(
    case: &OpCase,
    attrs: &Attributes,
    extra: Option<(usize, Host<i32>)>,
) -> dlkern::Result<OpTensors<T>> {
    let mut x = case.tensors::<T>();
    let mut tensors = x.dl();
    let mut extra = extra;
    // Absent inputs between: 0-element tensors, kept alive (their shapes) through the call.
    let mut absent: Vec<Host<i32>> = (0..17).map(|_| Host::new(Vec::new(), &[0])).collect();
    if let Some((at, h)) = extra.as_mut() {
        let mut gaps = absent.iter_mut();
        while tensors.len() < *at {
            tensors.push(gaps.next().expect("17 placeholders").dl());
        }
        tensors.push(h.dl());
    }
    let n_in = tensors.len();
    tensors.push(x.out.dl());
    // SAFETY: host tensors alive for the call (the placeholders own no data).
    unsafe { registry::call("dlkern.paged_attention", &mut tensors, n_in, std::ptr::null_mut(), attrs) }?;
    Ok(x)
}

#[test]
fn op_on_the_cpu_matches_the_reference_in_f32_and_f16() {
    for case in op_cases().into_iter().take(3) {
        let (want, want_kc, _) = case.reference();
        let got = run_cpu::<f16>(&case, &case.attrs(), None).unwrap();
        for (i, (g, w)) in got.out.data.iter().zip(&want).enumerate() {
            assert_eq!(g.to_f64(), round16(*w), "f16 {:?} element {i}", case.c);
        }
        assert!(got.kc.data.iter().zip(&want_kc).all(|(g, w)| g.to_f64() == *w), "key cache updated in place");
        let got = run_cpu::<f32>(&case, &case.attrs(), None).unwrap();
        // f32 storage rounds the rotated values to f32 rather than f16: close, not equal.
        for (g, w) in got.out.data.iter().zip(&want) {
            assert!((*g as f64 - w).abs() < 2e-3, "f32 {:?}: {g} vs {w}", case.c);
        }
    }
}

#[test]
fn op_refuses_what_it_does_not_implement_naming_it() {
    let case = op_case(&[(2, 3)], 4, 2, 64, 16, None, 0.0, None, false, 9);
    let err = |attrs: &Attributes, extra| {
        run_cpu::<f32>(&case, attrs, extra).err().map(|e| e.to_string()).unwrap_or_default()
    };
    let with = |k: &str, v: AttrValue| case.attrs().with(k, v);
    assert!(err(&with("is_causal", AttrValue::Int(0)), None).contains("is_causal"));
    assert!(err(&with("kv_cache_layout", AttrValue::String("LATENT".into())), None).contains("kv_cache_layout"));
    assert!(err(&with("k_quant_type", AttrValue::String("PER_TENSOR".into())), None).contains("k_quant_type"));
    assert!(err(&with("rotary_offset", AttrValue::Int(8)), None).contains("rotary_offset"));
    assert!(err(&with("k_cache_dtype", AttrValue::String("int8".into())), None).contains("k_cache_dtype"));
    assert!(err(&with("v_head_size", AttrValue::Int(32)), None).contains("v_head_size"));
    assert!(err(&with("do_rotary", AttrValue::Int(1)), None).contains("cos_cache and sin_cache"));
    assert!(err(&with("num_heads", AttrValue::Int(3)), None).contains("multiple of kv_num_heads"));
    assert!(err(&with("kv_num_heads", AttrValue::Int(4)), None).contains("kv_num_heads"));
    let slots = Host::new(vec![0, 1], &[2]);
    assert!(err(&case.attrs(), Some((10, slots))).contains("slot_mapping"));
    // Accepted as ORT spells them.
    let ok = with("k_cache_dtype", AttrValue::String("float".into()))
        .with("kv_cache_layout", AttrValue::String("SEPARATE".into()));
    run_cpu::<f32>(&case, &ok, Some((16, Host::new(vec![2, 5], &[2])))).unwrap();
}

#[test]
fn op_writes_the_cache_outputs_when_given_leaving_the_inputs() {
    let case = op_case(&[(3, 17), (1, 2)], 4, 2, 64, 16, None, 0.0, Some((64, false)), false, 11);
    let (want, want_kc, want_vc) = case.reference();
    let mut x = case.tensors::<f16>();
    let mut kc_out = host_of::<f16>(&vec![5.0; case.kc.len()], &x.kc.shape.clone());
    let mut vc_out = host_of::<f16>(&vec![5.0; case.vc.len()], &x.vc.shape.clone());
    let mut tensors = x.dl();
    tensors.extend([x.out.dl(), kc_out.dl(), vc_out.dl()]);
    // SAFETY: host tensors alive for the call.
    unsafe { registry::call("dlkern.paged_attention", &mut tensors, 10, std::ptr::null_mut(), &case.attrs()) }.unwrap();
    assert!(x.out.data.iter().zip(&want).all(|(g, w)| g.to_f64() == round16(*w)));
    assert!(kc_out.data.iter().zip(&want_kc).all(|(g, w)| g.to_f64() == *w));
    assert!(vc_out.data.iter().zip(&want_vc).all(|(g, w)| g.to_f64() == *w));
    assert!(x.kc.data.iter().zip(&case.kc).all(|(g, w)| g.to_f64() == *w), "the input cache is left alone");
}

// GPU: the op on CUDA tensors against the reference, with guard bytes after every buffer it
// writes.

const GUARD: usize = 64;

/// Runs the op on the GPU (f16). Returns (output, key cache, value cache) or the error, and
/// asserts that the guard elements after each written buffer are untouched.
#[allow(clippy::type_complexity)]
fn run_gpu_op<T: Element + dlkern::dtype::Scalar + cudarc::driver::DeviceRepr + PartialEq + std::fmt::Debug>(
    case: &OpCase,
    attrs: &Attributes,
) -> dlkern::Result<(Vec<T>, Vec<T>, Vec<T>)> {
    run_gpu_op_capturing(case, attrs, false)
}

/// [`run_gpu_op`], the call made while the stream is captured into a CUDA graph when
/// `capture` (the capture must end with no error: the op leaves it valid).
#[allow(clippy::type_complexity)]
fn run_gpu_op_capturing<
    T: Element + dlkern::dtype::Scalar + cudarc::driver::DeviceRepr + PartialEq + std::fmt::Debug,
>(
    case: &OpCase,
    attrs: &Attributes,
    capture: bool,
) -> dlkern::Result<(Vec<T>, Vec<T>, Vec<T>)> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let (_device, stream) = gpu();
    let mut x = case.tensors::<T>();
    let sentinel = T::from_f64(-3.5);
    let up = |h: &Host<T>| {
        let mut v = h.data.clone();
        v.extend(std::iter::repeat_n(sentinel, GUARD));
        stream.clone_htod(&v).unwrap()
    };
    let upi = |h: &Host<i32>| stream.clone_htod(&[h.data.clone(), vec![0]].concat()).unwrap();
    let (q, k, v, cos, sin) = (up(&x.query), up(&x.key), up(&x.value), up(&x.cos), up(&x.sin));
    let (mut kc, mut vc, mut out) = (up(&x.kc), up(&x.vc), up(&x.out));
    let (cu, past, table) = (upi(&x.cu), upi(&x.past), upi(&x.table));
    let result = {
        let s = &stream;
        let addrs = [
            q.device_ptr(s).0,
            k.device_ptr(s).0,
            v.device_ptr(s).0,
            kc.device_ptr_mut(s).0,
            vc.device_ptr_mut(s).0,
            cu.device_ptr(s).0,
            past.device_ptr(s).0,
            table.device_ptr(s).0,
            cos.device_ptr(s).0,
            sin.device_ptr(s).0,
        ];
        let mut tensors: Vec<DLTensor> = x.dl().into_iter().zip(addrs).map(|(t, a)| on_cuda(t, a)).collect();
        tensors.push(on_cuda(x.out.dl(), out.device_ptr_mut(s).0));
        if capture {
            s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        }
        // SAFETY: device buffers of the tensors' extents, alive for the call; ORT-like stream.
        let result = unsafe { registry::call("dlkern.paged_attention", &mut tensors, 10, s.cu_stream().cast(), attrs) };
        if capture {
            s.end_capture(CUgraphInstantiate_flags(0)).expect("the capture is still valid after the call");
        }
        result
    };
    stream.synchronize().unwrap();
    let (out, kc, vc) =
        (stream.clone_dtoh(&out).unwrap(), stream.clone_dtoh(&kc).unwrap(), stream.clone_dtoh(&vc).unwrap());
    for (what, buf) in [("output", &out), ("key_cache", &kc), ("value_cache", &vc)] {
        assert!(buf[buf.len() - GUARD..].iter().all(|&g| g == sentinel), "{what}: written past its end");
    }
    result?;
    let strip = |v: Vec<T>| v[..v.len() - GUARD].to_vec();
    Ok((strip(out), strip(kc), strip(vc)))
}

fn check_gpu_op(case: &OpCase) {
    let (want, want_kc, want_vc) = case.reference();
    let (out, kc, vc) = run_gpu_op::<f16>(case, &case.attrs()).unwrap_or_else(|e| panic!("{:?}: {e}", case.c));
    // Rotated keys in f32 then rounded: at most one f16 step from the reference's f64 rotation.
    let u = unit_roundoff(DType::F16);
    for (what, got, want) in [("key_cache", &kc, &want_kc), ("value_cache", &vc, &want_vc)] {
        for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
            assert!(
                (g.to_f64() - w).abs() <= 2.0 * u * w.abs().max(1.0),
                "{what} {:?} element {i}: {g} vs {w}",
                case.c
            );
        }
    }
    assert_matches(&format!("{:?} seqs {:?}", case.c, case.seqs), &out, &want);
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_op_matches_reference_on_ragged_batches() {
    for case in op_cases() {
        check_gpu_op(&case);
    }
    // Decode only, prompt only, GQA 8 at head size 128, blocks of 32.
    check_gpu_op(&op_case(&[(1, 4000), (1, 17), (1, 0)], 32, 4, 128, 32, None, 0.0, Some((128, false)), false, 40));
    check_gpu_op(&op_case(&[(97, 0)], 8, 8, 64, 16, Some(31), 0.0, None, false, 41));
    check_gpu_op(&op_case(&[(7, 1025), (97, 1)], 8, 1, 80, 16, None, 20.0, Some((40, true)), true, 42));
}

/// Each call reads its status back to the host, which a CUDA graph cannot hold: captured, the
/// op refuses with an error that says so, before it queues anything (the capture stays valid);
/// outside the capture the same call runs.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_op_refuses_a_cuda_graph_capture_clearly() {
    let case = &op_cases()[0];
    let e = run_gpu_op_capturing::<f16>(case, &case.attrs(), true).unwrap_err().to_string();
    assert!(e.contains("cannot be captured into a CUDA graph") && e.contains("status"), "{e}");
    check_gpu_op(case);
}

/// A BNSH launch with a new token (GroupQueryAttention's one-launch decode) refuses, before it
/// launches anything, what the kernel cannot take: several query tokens, unaligned new rows, a
/// row stride that is not a multiple of 8, a rotary dimension that does not split into 8-element
/// units, unaligned angle caches.
#[test]
#[ignore = "needs a CUDA device"]
fn gpu_bnsh_new_token_refuses_what_the_kernel_cannot_take() {
    let (device, stream) = gpu();
    let p = BnshAttentionParams {
        dtype: DType::F16,
        batch: 1,
        q_len: 1,
        num_q_heads: 8,
        num_kv_heads: 2,
        head_size: 64,
        capacity: 64,
        max_keys: 64,
        scale: 0.125,
        softcap: 0.0,
        window: 0,
        q_token_stride: 12 * 64,
    };
    let plan = |p: &BnshAttentionParams| p.plan(DecodeLimits::of(&device, p.dtype, p.head_size).unwrap()).unwrap();
    // Addresses are never dereferenced: every call below is refused first.
    let ptrs = PagedAttentionPointers {
        q: 0x10000,
        key_cache: 0x20000,
        value_cache: 0x30000,
        block_tables: 0,
        context_lens: 0x40000,
        alibi: 0,
        out: 0x50000,
        workspace: 0x60000,
        arrivals: 0x70000,
        status: 0x80000,
    };
    let fresh = NewToken {
        key: 0x10000 + 8 * 64 * 2,
        value: 0x10000 + 10 * 64 * 2,
        cos: 0x90000,
        sin: 0xA0000,
        kv_batch_stride: 12 * 64,
        rotary_dim: 64,
        interleaved: 0,
        max_position: 64,
    };
    let refused = |p: &BnshAttentionParams, fresh: NewToken| -> String {
        // SAFETY: refused before any launch (the test's claim), so no address is read.
        unsafe { paged_attention_bnsh_raw(&device, stream.cu_stream(), p, plan(p), &ptrs, &fresh) }
            .unwrap_err()
            .to_string()
    };
    let two = BnshAttentionParams { q_len: 2, ..p };
    assert!(refused(&two, fresh).contains("one query token per sequence, not 2"));
    assert!(refused(&p, NewToken { key: fresh.key + 2, ..fresh }).contains("new key"));
    assert!(refused(&p, NewToken { kv_batch_stride: 12 * 64 + 4, ..fresh }).contains("new-token row stride"));
    assert!(refused(&p, NewToken { rotary_dim: 20, ..fresh }).contains("8-element units"));
    assert!(refused(&p, NewToken { cos: fresh.cos + 8, ..fresh }).contains("cos_cache"));
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_op_reports_bad_inputs_without_writing_outside() {
    let base = op_case(&[(3, 40), (1, 5), (2, 0)], 8, 2, 64, 16, None, 0.0, Some((64, false)), false, 50);
    let err = |case: &OpCase| run_gpu_op::<f16>(case, &case.attrs()).err().map(|e| e.to_string()).unwrap_or_default();
    let mut c = base.clone();
    c.table[1] = c.c.num_blocks as i32 + 100; // sequence 0, a block beyond the cache
    assert!(err(&c).contains("outside the cache"), "{}", err(&c));
    let mut c = base.clone();
    c.table[c.c.max_blocks] = -1; // sequence 1, a negative block id
    assert!(err(&c).contains("outside the cache"), "{}", err(&c));
    let mut c = base.clone();
    c.past[2] = 10_000; // beyond the block table
    assert!(err(&c).contains("context length"), "{}", err(&c));
    let mut c = base.clone();
    c.cos.truncate(40 * 32); // rotary rows for positions 0..40 only: sequence 0 sits at 40..43
    c.sin.truncate(40 * 32);
    assert!(err(&c).contains("cos_cache"), "{}", err(&c));
    let mut c = base.clone();
    c.cu[1] = 7; // not the lengths the query holds
    assert!(err(&c).contains("cumulative_sequence_length"), "{}", err(&c));
    // Mismatched head counts and wrong dtypes: host errors naming them.
    let mismatched = base.attrs().with("kv_num_heads", AttrValue::Int(4));
    let e = run_gpu_op::<f16>(&base, &mismatched).unwrap_err().to_string();
    assert!(e.contains("key has shape") || e.contains("key_cache has shape"), "{e}");
    let e = run_gpu_op::<f32>(&base, &base.attrs()).unwrap_err().to_string();
    assert!(e.contains("f32 are not supported"), "{e}");
}
