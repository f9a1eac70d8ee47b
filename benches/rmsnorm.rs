//! RMSNorm: memory-bound, so reported as bytes/s against the copy ceiling (benches/ceilings.rs)
//! measured in the same run. Shapes: LLM hidden sizes at decode (few rows) and prefill (many).
//! Inputs and outputs rotate through enough copies that each launch reads device memory, not L2.
//!
//! `rmsnorm_skip`: the fused residual norm (SkipSimplifiedLayerNormalization as the model builder
//! emits it: input + skip, y and the sum written), tokens 1, 16, 2048 and 16384 x hidden 4096, f16;
//! its bytes are the four row tensors and gamma, each moved once.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dlkern::Element;
use dlkern::ops::rmsnorm::launch::{SkipRmsNormBuffers, rmsnorm, skip_rmsnorm};
use half::{bf16, f16};

const SHAPES: &[(usize, usize)] = &[(64, 4096), (2048, 4096), (16384, 4096), (4096, 8192), (16384, 8192)];

fn bench_dtype<T: Element>(c: &mut Criterion, gpu: &common::Gpu) {
    let dtype = T::DTYPE;
    let mut group = c.benchmark_group("rmsnorm");
    for &(rows, cols) in SHAPES {
        // Varied data (never zeros or a constant: they can run faster than real data).
        let pattern = |n: usize| -> Vec<T> {
            (0..n).map(|i| T::from_f64(((i * 2_654_435_761) % 4093) as f64 / 1024.0 - 2.0)).collect()
        };
        let bytes = ((2 * rows * cols + cols) * dtype.size_bytes()) as u64;
        let sets = gpu.rotation(bytes);
        let host = pattern(rows * cols);
        let xs: Vec<_> = (0..sets).map(|_| gpu.stream.clone_htod(&host).expect("alloc")).collect();
        let w = gpu.stream.clone_htod(&pattern(cols)).expect("alloc");
        let mut ys: Vec<_> = (0..sets).map(|_| gpu.stream.alloc_zeros::<T>(rows * cols).expect("alloc")).collect();
        let id = format!("dlkern_{dtype}/{rows}x{cols}");
        group.throughput(Throughput::Bytes(bytes));
        common::record(&common::Meta {
            family: "rmsnorm",
            id: format!("rmsnorm/{id}"),
            implementation: "dlkern",
            shape: format!("{rows}x{cols}"),
            dtype: dtype.name(),
            bytes,
            flops: (4 * rows * cols) as u64,
            workspace_bytes: 0,
        });
        let mut next = 0usize;
        group.bench_function(&id, |b| {
            b.iter_custom(|iters| {
                gpu.time(iters, || {
                    let k = next % sets;
                    next += 1;
                    rmsnorm(&gpu.device, &gpu.stream, &xs[k], &w, &mut ys[k], rows, cols, 1e-6).expect("launch")
                })
            })
        });
    }
    group.finish();
}

const SKIP_SHAPES: &[(usize, usize)] = &[(1, 4096), (16, 4096), (2048, 4096), (16384, 4096)];

fn bench_skip<T: Element>(c: &mut Criterion, gpu: &common::Gpu) {
    let dtype = T::DTYPE;
    let mut group = c.benchmark_group("rmsnorm_skip");
    for &(rows, cols) in SKIP_SHAPES {
        let pattern = |n: usize, k: usize| -> Vec<T> {
            (0..n).map(|i| T::from_f64((((i + k) * 2_654_435_761) % 4093) as f64 / 1024.0 - 2.0)).collect()
        };
        // input, skip read; y, sum written; gamma read.
        let bytes = ((4 * rows * cols + cols) * dtype.size_bytes()) as u64;
        let sets = gpu.rotation(bytes);
        let alloc = |k: usize| gpu.stream.clone_htod(&pattern(rows * cols, k)).expect("alloc");
        let xs: Vec<_> = (0..sets).map(alloc).collect();
        let skips: Vec<_> = (0..sets).map(|k| alloc(k + 1)).collect();
        let gamma = gpu.stream.clone_htod(&pattern(cols, 7)).expect("alloc");
        let zeros = || gpu.stream.alloc_zeros::<T>(rows * cols).expect("alloc");
        let mut ys: Vec<_> = (0..sets).map(|_| zeros()).collect();
        let mut sums: Vec<_> = (0..sets).map(|_| zeros()).collect();
        let id = format!("dlkern_{dtype}/{rows}x{cols}");
        group.throughput(Throughput::Bytes(bytes));
        common::record(&common::Meta {
            family: "rmsnorm_skip",
            id: format!("rmsnorm_skip/{id}"),
            implementation: "dlkern",
            shape: format!("{rows}x{cols}"),
            dtype: dtype.name(),
            bytes,
            flops: (6 * rows * cols) as u64,
            workspace_bytes: 0,
        });
        let mut next = 0usize;
        group.bench_function(&id, |b| {
            b.iter_custom(|iters| {
                gpu.time(iters, || {
                    let k = next % sets;
                    next += 1;
                    let (y, sum) = (&mut ys[k], &mut sums[k]);
                    let buffers = SkipRmsNormBuffers {
                        x: &xs[k],
                        skip: Some(&skips[k]),
                        gamma: &gamma,
                        bias: None,
                        y,
                        sum: Some(sum),
                        inv_std_var: None,
                    };
                    skip_rmsnorm(&gpu.device, &gpu.stream, buffers, rows, cols, rows, 1e-6).expect("launch")
                })
            })
        });
    }
    group.finish();
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    bench_dtype::<f16>(c, &gpu);
    bench_dtype::<bf16>(c, &gpu);
    bench_skip::<f16>(c, &gpu);
}

criterion_group!(rmsnorm_benches, benches);
criterion_main!(rmsnorm_benches);
