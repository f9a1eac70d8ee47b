//! The machine's measured ceilings, in the same run as the kernel benches: device-to-device copy
//! bandwidth (bytes read + written per second), the bar for every memory-bound kernel, and
//! cuBLAS GEMM rates (bf16, fp16 at 8192^3; the fp16 1x8192x8192 GEMV), the bars for the
//! matmul and attention kernels.

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use dlkern::Element;
use half::{bf16, f16};

fn copy_bandwidth(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    let mut group = c.benchmark_group("ceilings");
    for mib in [256usize, 1024] {
        let n = mib << 20;
        let src = gpu.stream.alloc_zeros::<u8>(n).expect("alloc");
        let mut dst = gpu.stream.alloc_zeros::<u8>(n).expect("alloc");
        let id = format!("copy_d2d/{mib}MiB");
        let moved = 2 * n as u64; // read + write
        group.throughput(Throughput::Bytes(moved));
        common::record(&common::Meta {
            family: "ceilings",
            id: format!("ceilings/{id}"),
            implementation: "cuMemcpyDtoDAsync",
            shape: format!("{mib} MiB"),
            dtype: "u8",
            bytes: moved,
            flops: 0,
            workspace_bytes: 0,
        });
        group.bench_function(&id, |b| {
            b.iter_custom(|iters| gpu.time(iters, || gpu.stream.memcpy_dtod(&src, &mut dst).expect("copy")))
        });
    }
    group.finish();
}

/// Row-major `C[m,n] = A[m,k] B[k,n]` through cuBLAS (column-major: `C^T = B^T A^T`).
fn cublas_gemm<T>(c: &mut Criterion, gpu: &common::Gpu, blas: &CudaBlas, dtype: &str, (m, n, k): (usize, usize, usize))
where
    T: Element,
    CudaBlas: Gemm<T>,
{
    let pattern =
        |len: usize| -> Vec<T> { (0..len).map(|i| T::from_f64(((i * 7919) % 251) as f64 / 251.0 - 0.5)).collect() };
    let a = gpu.stream.clone_htod(&pattern(m * k)).expect("alloc");
    let b = gpu.stream.clone_htod(&pattern(k * n)).expect("alloc");
    let mut out = gpu.stream.alloc_zeros::<T>(m * n).expect("alloc");
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: T::from_f64(1.0),
        lda: n as i32,
        ldb: k as i32,
        beta: T::from_f64(0.0),
        ldc: n as i32,
    };
    let flops = (2 * m * n * k) as u64;
    let id = format!("cublas_gemm_{dtype}/{m}x{n}x{k}");
    let mut group = c.benchmark_group("ceilings");
    group.throughput(Throughput::Elements(flops));
    common::record(&common::Meta {
        family: "ceilings",
        id: format!("ceilings/{id}"),
        implementation: "cuBLAS",
        shape: format!("{m}x{n}x{k}"),
        dtype,
        bytes: ((m * k + k * n + m * n) * size_of::<T>()) as u64,
        flops,
        workspace_bytes: 0,
    });
    group.bench_function(&id, |bench| {
        bench.iter_custom(|iters| {
            // SAFETY: the config matches the allocations (row-major shapes above).
            gpu.time(iters, || unsafe { blas.gemm(cfg, &b, &a, &mut out) }.expect("cuBLAS gemm"))
        })
    });
    group.finish();
}

fn gemm_rates(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    let blas = match CudaBlas::new(gpu.stream.clone()) {
        Ok(blas) => blas,
        Err(e) => {
            eprintln!("skipping cuBLAS ceilings: {e:?}");
            return;
        }
    };
    cublas_gemm::<bf16>(c, &gpu, &blas, "bf16", (8192, 8192, 8192));
    cublas_gemm::<f16>(c, &gpu, &blas, "f16", (8192, 8192, 8192));
    cublas_gemm::<f16>(c, &gpu, &blas, "f16", (1, 8192, 8192));
}

criterion_group!(benches, copy_bandwidth, gemm_rates);
criterion_main!(benches);
