//! Attention (prefill) forward: the shapes (B16 H16 S2048 D128, B4 H16 S8192 D128,
//! B8 H32 S4096 D64, B4 H16 S4096 D256), causal and not, f16 and bf16, reported in TFLOP/s
//! (4 B H S^2 D, halved when causal). The kernel each GPU runs by default ("dlkern": the
//! `wgmma` kernel on Hopper up to head size 128), and on Hopper the mma.sync kernel too
//! ("dlkern mma.sync"). PyTorch SDPA (flash and cuDNN backends) on the same shapes comes from
//! `benches/compare_torch.py` in the same run.

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use dlkern::DType;
use dlkern::ops::attention::launch::{AttentionParams, AttentionPointers, Batch, attention_raw_planned};
use half::{bf16, f16};
use std::time::Duration;

/// (batch, heads, seqlen, head dim)
const SHAPES: &[(usize, usize, usize, usize)] =
    &[(16, 16, 2048, 128), (4, 16, 8192, 128), (8, 32, 4096, 64), (4, 16, 4096, 256)];

fn bench_dtype<T: dlkern::Element + cudarc::driver::DeviceRepr>(
    c: &mut Criterion,
    gpu: &common::Gpu,
    dtype: DType,
    name: &str,
) {
    let mut group = c.benchmark_group("attention");
    group.warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1)).sample_size(10);
    let s = &gpu.stream;
    for &(b, h, seq, d) in SHAPES {
        let n = b * seq * h * d;
        // Distinct pseudo-random Q, K, V (never zeros, never Q = K: the softmax must do real work).
        let data =
            |mult: usize| -> Vec<T> { (0..n).map(|i| T::from_f64(((i * mult) % 251) as f64 / 125.5 - 1.0)).collect() };
        // Q, K, V and the output, made at the first row of this shape that criterion's filter
        // selects (it calls no other row's closure): a filtered run skips the rest's uploads.
        let mut buffers: Option<[CudaSlice<T>; 4]> = None;
        for causal in [false, true] {
            let params = AttentionParams {
                dtype,
                batch: b,
                layout: Batch::Padded { seqlen_q: seq, seqlen_k: seq },
                heads: h,
                kv_heads: h,
                head_dim: d,
                causal,
                window_left: None,
                scale: 1.0 / (d as f32).sqrt(),
                softcap: 0.0,
                lse: false,
            };
            let flops = (4 * b * h * seq * seq * d / if causal { 2 } else { 1 }) as u64;
            let shape = format!("B{b} H{h} S{seq} D{d}{}", if causal { " causal" } else { "" });
            let default = params.plan().expect("plan").on(&gpu.device);
            let mut plans = vec![("dlkern", name.to_string(), default)];
            if default.is_hopper() {
                plans.push(("dlkern mma.sync", format!("mma_sync_{name}"), params.plan().expect("plan")));
            }
            for (implementation, prefix, plan) in plans {
                let id = format!("dlkern_{prefix}/b{b}_h{h}_s{seq}_d{d}{}", if causal { "_causal" } else { "" });
                common::record(&common::Meta {
                    family: "attention",
                    id: format!("attention/{id}"),
                    implementation,
                    shape: shape.clone(),
                    dtype: name,
                    bytes: (4 * n * std::mem::size_of::<T>()) as u64,
                    flops,
                    workspace_bytes: 0,
                });
                group.bench_function(&id, |bench| {
                    let [q, k, v, out] = buffers.get_or_insert_with(|| {
                        [
                            s.clone_htod(&data(7919)).unwrap(),
                            s.clone_htod(&data(104729)).unwrap(),
                            s.clone_htod(&data(15485863)).unwrap(),
                            s.alloc_zeros::<T>(n).unwrap(),
                        ]
                    });
                    let ptrs = AttentionPointers {
                        q: q.device_ptr(s).0,
                        k: k.device_ptr(s).0,
                        v: v.device_ptr(s).0,
                        out: out.device_ptr_mut(s).0,
                        lse: 0,
                        cu_seqlens_q: 0,
                        cu_seqlens_k: 0,
                    };
                    bench.iter_custom(|iters| {
                        gpu.time(iters, || {
                            // SAFETY: buffers sized by the params above, alive for the bench.
                            unsafe { attention_raw_planned(&gpu.device, s.cu_stream(), &params, &plan, &ptrs) }
                                .expect("launch");
                        })
                    })
                });
            }
        }
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    bench_dtype::<f16>(c, &gpu, DType::F16, "f16");
    bench_dtype::<bf16>(c, &gpu, DType::BF16, "bf16");
}

criterion_group!(attention, benches);
criterion_main!(attention);
