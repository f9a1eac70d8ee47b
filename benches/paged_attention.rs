//! PagedAttention decode: bound by reading the KV cache, so reported as KV bytes read per
//! second, next to the copy ceiling of the same run. Issue 42's rows (batch 1 at 8k-128k,
//! batched at 1k-4k, 8 and 32 KV heads, one row of 4 queries per sequence), f16, blocks of 16
//! and 128; caches smaller than a few L2s rotate through copies, so each launch reads device
//! memory.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use dlkern::DType;
use dlkern::ops::paged_attention::launch::{
    DecodeLimits, PagedAttentionParams, PagedAttentionPointers, paged_attention_raw,
};
use half::f16;

/// Issue 42's rows: (batch, q heads, kv heads, context, query tokens per sequence), head 128,
/// each over blocks of 16 and of 128 tokens.
const SHAPES: &[(usize, usize, usize, usize, usize)] = &[
    (1, 32, 8, 8192, 1),
    (1, 32, 8, 32768, 1),
    (1, 32, 8, 65536, 1),
    (1, 32, 8, 131072, 1),
    (16, 32, 8, 4096, 1),
    (16, 32, 32, 4096, 1),
    (64, 32, 8, 4096, 1),
    (256, 32, 8, 1024, 1),
    (64, 32, 8, 4096, 4),
];

/// One f16 decode step of `batch` sequences of `ctx` tokens over blocks of `bs` (as many as
/// the sequences need), planned by the launcher.
fn decode_params(batch: usize, hq: usize, hkv: usize, ctx: usize, d: usize, bs: usize) -> PagedAttentionParams {
    PagedAttentionParams {
        dtype: DType::F16,
        batch,
        q_len: 1,
        num_q_heads: hq,
        num_kv_heads: hkv,
        head_size: d,
        num_blocks: batch * (ctx / bs),
        block_size: bs,
        max_blocks_per_seq: ctx / bs,
        max_context_len: ctx,
        scale: 1.0 / (d as f32).sqrt(),
        softcap: 0.0,
        window: 0,
        alibi: false,
        partition: 0,
    }
}

/// `n` pseudo-random values in [-1, 1), the sequence's elements `skew..n + skew`: distinct
/// skews give distinct tensors (keys, values, queries) from one formula.
fn pattern(n: usize, skew: usize) -> Vec<f16> {
    (skew..n + skew).map(|i| f16::from_f32(((i * 2_654_435_761) % 2039) as f32 / 1019.5 - 1.0)).collect()
}

/// A decode step's buffers on the device: `copies` K/V caches to rotate through (each
/// sequence's blocks scattered by a fixed permutation), the queries, the output, the block
/// table, the lengths (every sequence at `max_context_len`) and the status word.
struct DecodeBuffers {
    caches: Vec<(CudaSlice<f16>, CudaSlice<f16>)>,
    q: CudaSlice<f16>,
    out: CudaSlice<f16>,
    tables: CudaSlice<i32>,
    lens: CudaSlice<i32>,
    status: CudaSlice<u32>,
}

impl DecodeBuffers {
    fn new(s: &Arc<CudaStream>, p: &PagedAttentionParams, copies: usize) -> Self {
        let cache_elems = p.num_blocks * p.block_size * p.num_kv_heads * p.head_size;
        let queries = p.batch * p.q_len * p.num_q_heads * p.head_size;
        let tables: Vec<i32> = (0..p.num_blocks).map(|i| ((i * 7919) % p.num_blocks) as i32).collect();
        DecodeBuffers {
            caches: (0..copies)
                .map(|c| {
                    let k = s.clone_htod(&pattern(cache_elems, c)).expect("alloc");
                    (k, s.clone_htod(&pattern(cache_elems, c + 7)).expect("alloc"))
                })
                .collect(),
            q: s.clone_htod(&pattern(queries, 3)).expect("alloc"),
            out: s.alloc_zeros::<f16>(queries).expect("alloc"),
            tables: s.clone_htod(&tables).expect("alloc"),
            lens: s.clone_htod(&vec![p.max_context_len as i32; p.batch]).expect("alloc"),
            status: s.alloc_zeros::<u32>(1).expect("alloc"),
        }
    }

    /// One set of pointers per cache copy, with `workspace` and `arrivals` (0: the combine
    /// kernel merges).
    fn pointers(&mut self, s: &Arc<CudaStream>, workspace: u64, arrivals: u64) -> Vec<PagedAttentionPointers> {
        let (out, status) = (self.out.device_ptr_mut(s).0, self.status.device_ptr_mut(s).0);
        self.caches
            .iter()
            .map(|(k, v)| PagedAttentionPointers {
                q: self.q.device_ptr(s).0,
                key_cache: k.device_ptr(s).0,
                value_cache: v.device_ptr(s).0,
                block_tables: self.tables.device_ptr(s).0,
                context_lens: self.lens.device_ptr(s).0,
                alibi: 0,
                out,
                workspace,
                arrivals,
                status,
            })
            .collect()
    }
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    let mut group = c.benchmark_group("paged_attention");
    let s = &gpu.stream;
    for &(batch, hq, hkv, ctx, q_len) in SHAPES {
        for bs in [16, 128] {
            let d = 128;
            let params = PagedAttentionParams { q_len, ..decode_params(batch, hq, hkv, ctx, d, bs) };
            let plan = params
                .plan(DecodeLimits::of(&gpu.device, params.dtype, params.head_size).expect("limits"))
                .expect("plan");
            let kv_bytes = (2 * batch * ctx * hkv * d * 2) as u64;
            let queries = if q_len > 1 { format!(" q{q_len}") } else { String::new() };
            let id = format!("dlkern_f16/b{batch}_hq{hq}_hkv{hkv}_ctx{ctx}_d{d}_bs{bs}_q{q_len}");
            group.throughput(Throughput::Bytes(kv_bytes));
            common::record(&common::Meta {
                family: "paged_attention",
                id: format!("paged_attention/{id}"),
                implementation: "dlkern",
                shape: format!("B{batch} Hq{hq} Hkv{hkv} ctx{ctx} D{d} block{bs}{queries}"),
                dtype: "f16",
                bytes: kv_bytes,
                flops: (4 * batch * q_len * hq * ctx * d) as u64,
                workspace_bytes: plan.workspace_bytes as u64,
            });
            let mut turn = 0;
            let mut state = None;
            group.bench_function(&id, |b| {
                // Built at the first call, which criterion makes only for a row its filter
                // selects: a filtered run does not fill every row's caches (seconds each).
                let (_, _, ptrs) = state.get_or_insert_with(|| {
                    // Caches smaller than L2 several times over rotate, so each launch reads memory.
                    let mut buffers = DecodeBuffers::new(s, &params, gpu.rotation(kv_bytes));
                    let workspace = s.alloc_zeros::<u8>(plan.workspace_bytes.max(16)).expect("alloc");
                    let ptrs = buffers.pointers(s, workspace.device_ptr(s).0, 0);
                    (buffers, workspace, ptrs)
                });
                b.iter_custom(|iters| {
                    gpu.time(iters, || {
                        turn += 1;
                        // SAFETY: all buffers above outlive the timed launches and match the
                        // params.
                        unsafe { paged_attention_raw(&gpu.device, s.cu_stream(), &params, &ptrs[turn % ptrs.len()]) }
                            .map(|_| ())
                            .expect("launch")
                    })
                })
            });
            if let Some((buffers, ..)) = &state {
                dlkern::ops::paged_attention::launch::check_status(s, &buffers.status).expect("status");
            }
        }
    }
    group.finish();
    op_benches(c, &gpu);
    if let Ok(batches) = std::env::var("DLKERN_BENCH_PARTITION_SWEEP") {
        partition_sweep(&gpu, &batches);
    }
}

/// The planner's tuning data (`DLKERN_BENCH_PARTITION_SWEEP=1`, or a list of batch sizes such
/// as `b1,b16`; printed, not recorded): decode
/// time per partition length for batch 1 at long contexts and the batched shapes, blocks of 16
/// scattered over the cache and one contiguous block per sequence (GroupQueryAttention's BNSH
/// cache), caches rotated so that every launch reads device memory.
fn partition_sweep(gpu: &common::Gpu, batches: &str) {
    let s = &gpu.stream;
    let shapes: &[(usize, usize, usize, usize)] = &[
        (1, 32, 8, 4096),
        (1, 32, 8, 8192),
        (1, 32, 8, 32768),
        (1, 32, 8, 65536),
        (1, 32, 8, 131072),
        (16, 32, 8, 4096),
        (64, 32, 8, 4096),
        (16, 32, 32, 4096),
        (256, 32, 8, 1024),
    ];
    println!("partition sweep: batch hq hkv ctx block partition -> us, TB/s (planned partition marked *)");
    for &(batch, hq, hkv, ctx) in shapes {
        if batches != "1" && !batches.split(',').any(|b| b == format!("b{batch}")) {
            continue;
        }
        for bs in [16, ctx] {
            let d = 128;
            let mut params = decode_params(batch, hq, hkv, ctx, d, bs);
            let limits = DecodeLimits::of(&gpu.device, params.dtype, params.head_size).expect("limits");
            let planned = params.plan(limits).expect("plan").partition;
            let kv_bytes = (2 * batch * ctx * hkv * d * 2) as u64;
            let mut buffers = DecodeBuffers::new(s, &params, gpu.rotation(kv_bytes));
            let mut partitions: Vec<usize> =
                [64, 128, 256, 512, 1024, 2048, 4096, 8192].into_iter().filter(|&p| p <= ctx).collect();
            if !partitions.contains(&planned) {
                partitions.push(planned);
            }
            for partition in partitions {
                params.partition = partition;
                let plan = params.plan(limits).expect("plan");
                let workspace = s.alloc_zeros::<u8>(plan.workspace_bytes.max(16)).expect("alloc");
                let arrivals = s.alloc_zeros::<u32>(plan.arrival_words.max(1)).expect("alloc");
                let merges: &[bool] = if plan.arrival_words > 0 { &[false, true] } else { &[false] };
                for &merge in merges {
                    let arrivals = if merge { arrivals.device_ptr(s).0 } else { 0 };
                    let ptrs = buffers.pointers(s, workspace.device_ptr(s).0, arrivals);
                    let mut i = 0;
                    let mut launch = || {
                        // SAFETY: all buffers above outlive the timed launches and match the
                        // params; the kernel leaves the arrival counters zero.
                        unsafe { paged_attention_raw(&gpu.device, s.cu_stream(), &params, &ptrs[i % ptrs.len()]) }
                            .expect("launch");
                        i += 1;
                    };
                    gpu.time(20, &mut launch);
                    let iters = 200;
                    let us = gpu.time(iters, &mut launch).as_secs_f64() * 1e6 / iters as f64;
                    println!(
                        "sweep b{batch} hq{hq} hkv{hkv} ctx{ctx} block{bs} partition{partition}{} {} -> {us:.2} us, {:.2} TB/s ({} blocks)",
                        if partition == planned { "*" } else { "" },
                        if merge { "merged in kernel" } else { "combine kernel" },
                        kv_bytes as f64 / us * 1e-6,
                        plan.attention_dims.grid.0 * plan.attention_dims.grid.1 * plan.attention_dims.grid.2,
                    );
                }
            }
            dlkern::ops::paged_attention::launch::check_status(s, &buffers.status).expect("status");
        }
    }
}

/// The `PagedAttention` op's path (prologue with rotary, per-token attention, the status
/// read-back): decode steps of batch 16 and 64 at context 4k, 32 query / 8 KV heads, head 128,
/// f16, blocks of 16 and 32.
fn op_benches(c: &mut Criterion, gpu: &common::Gpu) {
    use dlkern::ops::paged_attention::launch::{PagedOpParams, PagedOpPointers, paged_attention_op_raw};
    let mut group = c.benchmark_group("paged_attention_op");
    for (batch, bs) in [(16usize, 16usize), (16, 32), (64, 16), (64, 32)] {
        let (hq, hkv, d, ctx) = (32, 8, 128, 4096);
        let max_blocks = ctx / bs;
        let num_blocks = batch * max_blocks;
        let params = PagedOpParams {
            dtype: DType::F16,
            batch,
            tokens: batch,
            num_heads: hq,
            kv_heads: hkv,
            head_size: d,
            num_blocks,
            block_size: bs,
            max_blocks,
            packed_qkv: false,
            rotary_dim: d,
            interleaved: false,
            cos_rows: ctx,
            scale: 1.0 / (d as f32).sqrt(),
            softcap: 0.0,
            window: 0,
        };
        let plan =
            params.plan(DecodeLimits::of(&gpu.device, params.dtype, params.head_size).expect("limits")).expect("plan");
        let s = &gpu.stream;
        let kv_bytes = (2 * batch * ctx * hkv * d * 2) as u64;
        let id = format!("dlkern_f16/b{batch}_hq{hq}_hkv{hkv}_ctx{ctx}_d{d}_bs{bs}");
        group.throughput(Throughput::Bytes(kv_bytes));
        common::record(&common::Meta {
            family: "paged_attention",
            id: format!("paged_attention_op/{id}"),
            implementation: "dlkern",
            shape: format!("op B{batch} Hq{hq} Hkv{hkv} ctx{ctx} D{d} block{bs} rotary"),
            dtype: "f16",
            bytes: kv_bytes,
            flops: (4 * batch * hq * ctx * d) as u64,
            workspace_bytes: plan.workspace_bytes as u64,
        });
        let mut state = None;
        group.bench_function(&id, |b| {
            // Built at the first call (only for a row criterion's filter selects), as above.
            let (_, ptrs) = state.get_or_insert_with(|| {
                let cache_elems = num_blocks * bs * hkv * d;
                let mut kc = s.clone_htod(&pattern(cache_elems, 0)).expect("alloc");
                let mut vc = s.clone_htod(&pattern(cache_elems, 7)).expect("alloc");
                let q = s.clone_htod(&pattern(batch * hq * d, 0)).expect("alloc");
                let k = s.clone_htod(&pattern(batch * hkv * d, 0)).expect("alloc");
                let v = s.clone_htod(&pattern(batch * hkv * d, 3)).expect("alloc");
                let cos = s.clone_htod(&pattern(ctx * d / 2, 0)).expect("alloc");
                let sin = s.clone_htod(&pattern(ctx * d / 2, 1)).expect("alloc");
                let mut out = s.alloc_zeros::<f16>(batch * hq * d).expect("alloc");
                let tables: Vec<i32> = (0..num_blocks).map(|i| ((i * 7919) % num_blocks) as i32).collect();
                let tables = s.clone_htod(&tables).expect("alloc");
                // Each sequence holds ctx - 1 tokens and gets one: the step attends over the full 4k.
                let cu = s.clone_htod(&(0..=batch as i32).collect::<Vec<i32>>()).expect("alloc");
                let past = s.clone_htod(&vec![ctx as i32 - 1; batch]).expect("alloc");
                let workspace = s.alloc_zeros::<u8>(plan.workspace_bytes).expect("alloc");
                let ptrs = PagedOpPointers {
                    query: q.device_ptr(s).0,
                    key: k.device_ptr(s).0,
                    value: v.device_ptr(s).0,
                    key_cache: kc.device_ptr_mut(s).0,
                    value_cache: vc.device_ptr_mut(s).0,
                    cu_seqlens: cu.device_ptr(s).0,
                    past_seqlens: past.device_ptr(s).0,
                    block_table: tables.device_ptr(s).0,
                    cos: cos.device_ptr(s).0,
                    sin: sin.device_ptr(s).0,
                    out: out.device_ptr_mut(s).0,
                    workspace: workspace.device_ptr(s).0,
                };
                // (Kept with the pointers: the memory must outlive the timed calls.)
                let buffers = (kc, vc, q, k, v, cos, sin, out, tables, cu, past, workspace);
                (buffers, ptrs)
            });
            b.iter_custom(|iters| {
                // SAFETY: all buffers above outlive the timed calls and match the params.
                gpu.time(iters, || {
                    unsafe { paged_attention_op_raw(&gpu.device, s.cu_stream(), &params, &*ptrs) }
                        .map(|_| ())
                        .expect("op")
                })
            })
        });
    }
    group.finish();
}

criterion_group!(paged, benches);
criterion_main!(paged);
