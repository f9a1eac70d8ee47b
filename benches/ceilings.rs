//! The machine's measured ceilings, in the same run as the kernel benches: device-to-device copy
//! bandwidth (bytes read + written per second), the bar for every memory-bound kernel; the
//! read-only rate of a chain of launches that read as many bytes as the matmul_nbits weights of its
//! shapes, and 1 GiB for the decode caches (`probe_stream_read`: plain launches, programmatic dependents that wait before
//! reading, and ones that read before the wait as the matmul_nbits decode kernels copy their first
//! weights), the bound of those kernels; and cuBLAS GEMM rates (bf16, fp16 at 8192^3; the fp16
//! 1x8192x8192 GEMV), the bars for the matmul and attention kernels.

mod common;
/// The probe kernels' launchers, shared with `tests/probe.rs` (the probes are not in the library).
#[path = "../tests/common/probe.rs"]
mod probe;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use dlkern::Element;
use half::{bf16, f16};
use probe::{Probes, StreamReadOrder, StreamReadPlan, stream_read, stream_read_constant, stream_read_wave};

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

/// How a chain of `probe_stream_read` launches follows the launch before it: as `stream_read`
/// orders it (waiting before it reads), or reading before its wait (`stream_read_constant`).
#[derive(Clone, Copy)]
enum ReadChain {
    Ordered(StreamReadOrder),
    ReadFirst { early_dependents: bool },
}

fn stream_read_rates(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    let wave = Probes::new(&gpu.device).and_then(|probes| stream_read_wave(&probes).map(|blocks| (probes, blocks)));
    let (probes, blocks) = match wave {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("skipping the read ceilings: {e}");
            return;
        }
    };
    let mut group = c.benchmark_group("ceilings");
    // The 4-bit weights and f16 scales (blocks of 128) of the matmul_nbits bench's shapes:
    // N = K = 8192, and N or K = 28672; and 1 GiB, the size of the decode benches' largest KV
    // caches (the paged_attention table's ceiling).
    for (name, what, bytes) in [
        ("matmul_nbits_8192x8192", "matmul_nbits N = K = 8192", 8192 * 4096 + 8192 * 64 * 2),
        ("matmul_nbits_28672x8192", "matmul_nbits N or K = 28672", 28672 * 4096 + 28672 * 64 * 2),
        ("decode_kv_1g", "decode KV caches", 1 << 30),
    ] {
        let plan = StreamReadPlan::new(bytes, blocks).expect("plan");
        // Copies rotated so that every launch reads device memory, not L2.
        let copies: Vec<_> = (0..gpu.rotation(bytes as u64))
            .map(|c| {
                gpu.stream.clone_htod(&(0..bytes).map(|i| (i * 131 + c) as u8).collect::<Vec<_>>()).expect("alloc")
            })
            .collect();
        let mut out = gpu.stream.alloc_zeros::<u32>(plan.out_words).expect("alloc");
        let chains = [
            ("serialized", "plain launches", ReadChain::Ordered(StreamReadOrder::Serialized)),
            (
                "wait_first",
                "programmatic, wait then read",
                ReadChain::Ordered(StreamReadOrder::Overlapped { early_dependents: false }),
            ),
            ("read_first", "programmatic, read then wait", ReadChain::ReadFirst { early_dependents: false }),
            (
                "read_first_early",
                "programmatic, read then wait, next grid early",
                ReadChain::ReadFirst { early_dependents: true },
            ),
        ];
        for (chain_id, chain_name, chain) in chains {
            let id = format!("stream_read_{chain_id}/{name}");
            group.throughput(Throughput::Bytes(bytes as u64));
            common::record(&common::Meta {
                family: "ceilings",
                id: format!("ceilings/{id}"),
                implementation: &format!("probe_stream_read ({chain_name})"),
                shape: format!("{bytes} B ({what})"),
                dtype: "u8",
                bytes: bytes as u64,
                flops: 0,
                workspace_bytes: 0,
            });
            group.bench_function(&id, |b| {
                let mut next = 0;
                b.iter_custom(|iters| {
                    gpu.time(iters, || {
                        let src = &copies[next % copies.len()];
                        next += 1;
                        match chain {
                            ReadChain::Ordered(order) => {
                                stream_read(&probes, &gpu.stream, src, &mut out, blocks, order)
                            }
                            // SAFETY: nothing writes the copies after their upload.
                            ReadChain::ReadFirst { early_dependents } => unsafe {
                                stream_read_constant(&probes, &gpu.stream, src, &mut out, blocks, early_dependents)
                            },
                        }
                        .expect("stream read")
                    })
                })
            });
        }
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

criterion_group!(benches, copy_bandwidth, stream_read_rates, gemm_rates);
criterion_main!(benches);
