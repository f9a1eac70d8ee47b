//! PagedAttention decode: bound by reading the KV cache, so reported as KV bytes read per
//! second (the shapes, fp16, block 16), next to the copy ceiling of the same run.
//! Caches are larger than L2 at every shape, so each step reads device memory.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use dlkern::DType;
use dlkern::ops::paged_attention::launch::{PagedAttentionParams, PagedAttentionPointers, paged_attention_raw};
use half::f16;

/// (batch, q heads, kv heads, context, head size)
const SHAPES: &[(usize, usize, usize, usize, usize)] =
    &[(64, 32, 8, 4096, 128), (16, 32, 32, 4096, 128), (1, 32, 8, 65536, 128), (256, 32, 8, 1024, 128)];

fn benches(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    let mut group = c.benchmark_group("paged_attention");
    for &(batch, hq, hkv, ctx, d) in SHAPES {
        let bs = 16;
        let blocks_per_seq = ctx / bs;
        let num_blocks = batch * blocks_per_seq;
        let params = PagedAttentionParams {
            dtype: DType::F16,
            batch,
            q_len: 1,
            num_q_heads: hq,
            num_kv_heads: hkv,
            head_size: d,
            num_blocks,
            block_size: bs,
            max_blocks_per_seq: blocks_per_seq,
            max_context_len: ctx,
            scale: 1.0 / (d as f32).sqrt(),
            softcap: 0.0,
            window: 0,
            alibi: false,
            partition: 0,
        };
        let plan = params.plan(gpu.device.multiprocessors(), gpu.device.max_shared_bytes_per_block()).expect("plan");
        let cache_elems = num_blocks * bs * hkv * d;
        let pattern = |n: usize| -> Vec<f16> {
            (0..n).map(|i| f16::from_f32(((i * 2_654_435_761) % 2039) as f32 / 1019.5 - 1.0)).collect()
        };
        let k = gpu.stream.clone_htod(&pattern(cache_elems)).expect("alloc");
        let v = gpu.stream.clone_htod(&pattern(cache_elems + 7)[7..].to_vec()).expect("alloc");
        let q = gpu.stream.clone_htod(&pattern(batch * hq * d)).expect("alloc");
        let mut out = gpu.stream.alloc_zeros::<f16>(batch * hq * d).expect("alloc");
        // Each sequence's blocks scattered over the cache (a fixed permutation).
        let tables: Vec<i32> = (0..num_blocks).map(|i| ((i * 7919) % num_blocks) as i32).collect();
        let tables = gpu.stream.clone_htod(&tables).expect("alloc");
        let lens = gpu.stream.clone_htod(&vec![ctx as i32; batch]).expect("alloc");
        let workspace = gpu.stream.alloc_zeros::<u8>(plan.workspace_bytes.max(16)).expect("alloc");
        let mut status = gpu.stream.alloc_zeros::<u32>(1).expect("alloc");
        let kv_bytes = (2 * batch * ctx * hkv * d * 2) as u64;
        let id = format!("dlkern_f16/b{batch}_hq{hq}_hkv{hkv}_ctx{ctx}_d{d}");
        group.throughput(Throughput::Bytes(kv_bytes));
        common::record(&common::Meta {
            family: "paged_attention",
            id: format!("paged_attention/{id}"),
            implementation: "dlkern",
            shape: format!("B{batch} Hq{hq} Hkv{hkv} ctx{ctx} D{d}"),
            dtype: "f16",
            bytes: kv_bytes,
            flops: (4 * batch * hq * ctx * d) as u64,
            workspace_bytes: plan.workspace_bytes as u64,
        });
        let s = &gpu.stream;
        let ptrs = PagedAttentionPointers {
            q: q.device_ptr(s).0,
            key_cache: k.device_ptr(s).0,
            value_cache: v.device_ptr(s).0,
            block_tables: tables.device_ptr(s).0,
            context_lens: lens.device_ptr(s).0,
            alibi: 0,
            out: out.device_ptr_mut(s).0,
            workspace: workspace.device_ptr(s).0,
            status: status.device_ptr_mut(s).0,
        };
        group.bench_function(&id, |b| {
            b.iter_custom(|iters| {
                // SAFETY: all buffers above outlive the timed launches and match the params.
                gpu.time(iters, || {
                    unsafe { paged_attention_raw(&gpu.device, s.cu_stream(), &params, &ptrs) }
                        .map(|_| ())
                        .expect("launch")
                })
            })
        });
        dlkern::ops::paged_attention::launch::check_status(&gpu.stream, &status).expect("status");
    }
    group.finish();
}

criterion_group!(paged, benches);
criterion_main!(paged);
