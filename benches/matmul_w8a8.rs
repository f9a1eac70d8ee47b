//! W8A8 matmul (int8 tensor cores, f16 out) on the shapes, next to cuBLAS bf16 and f16
//! GEMM of the same shape in the same binary and run (`torch._int_mm` comes from
//! `benches/compare_torch.py`), and the per-token activation quantization it needs, timed on
//! its own (`w8a8_quantize`). For M <= 16 also the decode kernel over packed weights
//! (`dlkern_packed`, `W8A8Variant::Packed`). `DLKERN_W8A8_VARIANT=decode|tiled|wgmma` forces a
//! kernel (to compare them; shapes it cannot run are skipped; the ids stay the same).

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use dlkern::DType;
use dlkern::ops::matmul_w8a8::launch::{
    MatMulW8A8Params, MatMulW8A8Pointers, W8A8Variant, matmul_w8a8_raw, quantize_per_token_raw,
};
use half::{bf16, f16};
use std::time::Duration;

/// (M, N, K)
const SHAPES: &[(usize, usize, usize)] = &[
    (8192, 8192, 8192),
    (1, 8192, 8192),
    (16, 8192, 8192),
    (128, 8192, 8192),
    (1024, 8192, 8192),
    (4096, 8192, 8192),
    (4096, 28672, 8192),
];

/// The kernel `DLKERN_W8A8_VARIANT` forces, if any.
fn forced_variant() -> Option<W8A8Variant> {
    match std::env::var("DLKERN_W8A8_VARIANT").ok()?.as_str() {
        "decode" => Some(W8A8Variant::Decode),
        "tiled" => Some(W8A8Variant::Tiled),
        "wgmma" => Some(W8A8Variant::Wgmma),
        other => panic!("DLKERN_W8A8_VARIANT={other}: expected decode, tiled or wgmma"),
    }
}

/// Row-major `y [m, n] = a [m, k] w [n, k]^T` through cuBLAS (column-major: `y^T = w a^T`).
fn gemm_config<T>(m: usize, n: usize, k: usize, one: T, zero: T) -> GemmConfig<T> {
    GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_T,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: one,
        lda: k as i32,
        ldb: k as i32,
        beta: zero,
        ldc: n as i32,
    }
}

/// Values in [-1, 1) for the cuBLAS baselines: never constant data, which can run faster.
fn pseudo_random(i: usize) -> f32 {
    ((i * 7919) % 251) as f32 / 125.5 - 1.0
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    let blas = CudaBlas::new(gpu.stream.clone()).expect("cuBLAS");
    let mut group = c.benchmark_group("matmul_w8a8");
    group.warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_millis(700)).sample_size(10);
    let s = &gpu.stream;
    for &(m, n, k) in SHAPES {
        let shape = format!("M{m} N{n} K{k}");
        let flops = (2 * m * n * k) as u64;
        let a = s.clone_htod(&(0..m * k).map(|i| (i % 251) as i8).collect::<Vec<_>>()).unwrap();
        let w_host: Vec<i8> = (0..n * k).map(|i| (i % 241) as i8).collect();
        let w = s.clone_htod(&w_host).unwrap();
        let sa = s.clone_htod(&vec![0.01f32; m]).unwrap();
        let sw = s.clone_htod(&vec![0.01f32; n]).unwrap();
        let mut y = s.alloc_zeros::<f16>(m * n).unwrap();
        let params = MatMulW8A8Params {
            out_dtype: DType::F16,
            m,
            n,
            k,
            per_row_a_scale: true,
            bias: false,
            splits: 0,
            variant: forced_variant(),
        };
        let Ok(plan) = params.plan(gpu.device.multiprocessors(), gpu.device.has_wgmma()) else {
            eprintln!("{shape}: {:?} cannot run it, skipped", params.variant);
            continue;
        };
        let workspace = s.alloc_zeros::<u8>(plan.workspace_bytes.max(16)).expect("alloc");
        let ptrs = MatMulW8A8Pointers {
            a: a.device_ptr(s).0,
            a_scale: sa.device_ptr(s).0,
            w: w.device_ptr(s).0,
            w_scale: sw.device_ptr(s).0,
            bias: 0,
            y: y.device_ptr_mut(s).0,
            workspace: workspace.device_ptr(s).0,
        };
        let id = format!("dlkern/m{m}_n{n}_k{k}");
        let record = |id: &str, implementation: &'static str, bytes: usize, workspace_bytes: usize| {
            common::record(&common::Meta {
                family: "matmul_w8a8",
                id: format!("matmul_w8a8/{id}"),
                implementation,
                shape: shape.clone(),
                dtype: "int8 -> f16",
                bytes: bytes as u64,
                flops,
                workspace_bytes: workspace_bytes as u64,
            })
        };
        record(&id, "dlkern", m * k + n * k + 2 * m * n, plan.workspace_bytes);
        group.bench_function(&id, |bench| {
            bench.iter_custom(|iters| {
                gpu.time(iters, || {
                    // SAFETY: buffers sized by the params above, alive for the bench.
                    unsafe { matmul_w8a8_raw(&gpu.device, s.cu_stream(), &params, &ptrs) }.expect("launch");
                })
            })
        });

        // The same call over the packed weights (`dlkern_packed`, M <= 16 only), launched the
        // same way.
        if m <= 16 && params.variant.is_none() {
            let packed_params = MatMulW8A8Params { variant: Some(W8A8Variant::Packed), ..params };
            let packed =
                s.clone_htod(&dlkern::ops::matmul_w8a8::pack::pack_for_decode(&w_host, n, k).unwrap()).unwrap();
            let packed_ptrs = MatMulW8A8Pointers { w: packed.device_ptr(s).0, ..ptrs };
            let id = format!("dlkern_packed/m{m}_n{n}_k{k}");
            record(&id, "dlkern packed W", m * k + packed_params.packed_w_len() + 2 * m * n, 0);
            group.bench_function(&id, |bench| {
                bench.iter_custom(|iters| {
                    gpu.time(iters, || {
                        // SAFETY: buffers sized by the params above (W packed), alive for the bench.
                        unsafe { matmul_w8a8_raw(&gpu.device, s.cu_stream(), &packed_params, &packed_ptrs) }
                            .expect("launch");
                    })
                })
            });
        }

        // The activation quantization the W8A8 path adds (f16 rows to int8 + scales), once per
        // activation shape (two shapes share M = 4096, K = 8192).
        let quantize_done =
            SHAPES.iter().take_while(|&&shape| shape != (m, n, k)).any(|&(m2, _, k2)| (m2, k2) == (m, k));
        if !quantize_done {
            let x = s
                .clone_htod(&(0..m * k).map(|i| f16::from_f32((i % 97) as f32 / 97.0 - 0.5)).collect::<Vec<_>>())
                .unwrap();
            let mut q = s.alloc_zeros::<i8>(m * k).unwrap();
            let mut qs = s.alloc_zeros::<f32>(m).unwrap();
            let (xp, qp, qsp) = (x.device_ptr(s).0, q.device_ptr_mut(s).0, qs.device_ptr_mut(s).0);
            let qid = format!("quantize/m{m}_k{k}");
            common::record(&common::Meta {
                family: "w8a8_quantize",
                id: format!("matmul_w8a8/{qid}"),
                implementation: "dlkern",
                shape: format!("M{m} K{k}"),
                dtype: "f16 -> int8",
                bytes: (3 * m * k + 4 * m) as u64,
                flops: 0,
                workspace_bytes: 0,
            });
            group.bench_function(&qid, |bench| {
                bench.iter_custom(|iters| {
                    gpu.time(iters, || {
                        // SAFETY: buffers of [m, k] and [m], alive for the bench.
                        unsafe { quantize_per_token_raw(&gpu.device, s.cu_stream(), DType::F16, m, k, xp, qp, qsp) }
                            .expect("launch");
                    })
                })
            });
        }

        // cuBLAS bf16 (the large-shape bar) and f16 (the small-M bar).
        let abf = s.clone_htod(&(0..m * k).map(|i| bf16::from_f32(pseudo_random(i))).collect::<Vec<_>>()).unwrap();
        let wbf = s.clone_htod(&(0..n * k).map(|i| bf16::from_f32(pseudo_random(i + 1))).collect::<Vec<_>>()).unwrap();
        let mut ybf = s.alloc_zeros::<bf16>(m * n).unwrap();
        let id = format!("cublas_bf16/m{m}_n{n}_k{k}");
        record(&id, "cuBLAS bf16", 2 * (m * k + n * k + m * n), 0);
        let cfg = gemm_config(m, n, k, bf16::ONE, bf16::ZERO);
        group.bench_function(&id, |bench| {
            bench.iter_custom(|iters| {
                // SAFETY: the config matches the allocations.
                gpu.time(iters, || unsafe { blas.gemm(cfg, &wbf, &abf, &mut ybf) }.expect("cuBLAS"))
            })
        });
        drop((abf, wbf, ybf));
        if m <= 16 {
            let a16 = s.clone_htod(&(0..m * k).map(|i| f16::from_f32(pseudo_random(i))).collect::<Vec<_>>()).unwrap();
            let w16 =
                s.clone_htod(&(0..n * k).map(|i| f16::from_f32(pseudo_random(i + 1))).collect::<Vec<_>>()).unwrap();
            let mut y16 = s.alloc_zeros::<f16>(m * n).unwrap();
            let id = format!("cublas_f16/m{m}_n{n}_k{k}");
            record(&id, "cuBLAS f16", 2 * (m * k + n * k + m * n), 0);
            let cfg = gemm_config(m, n, k, f16::ONE, f16::ZERO);
            group.bench_function(&id, |bench| {
                bench.iter_custom(|iters| {
                    // SAFETY: the config matches the allocations.
                    gpu.time(iters, || unsafe { blas.gemm(cfg, &w16, &a16, &mut y16) }.expect("cuBLAS"))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(matmul, benches);
criterion_main!(matmul);
