//! W4A16 matmul (`MatMulNBits`, block 128, f16) against cuBLAS f16 GEMM on 16-bit weights of the
//! same shape, the shapes, in the same run. Small M is bound by reading the weights, so
//! the rate reported is the bytes dlkern moves (4-bit weights, scales, A, Y) per second; the
//! cuBLAS row counts its 16-bit weights. Weights rotate through several copies where one copy
//! would fit in L2. For M <= 16 also `Variant::Packed` (`dlkern_packed_f16`: B repacked once,
//! `MatMulNBitsWeights::pack_for_decode`; filled with the same byte pattern, timing only), and on Hopper,
//! where that runs `PackedWgmma`, also `PackedMma` (`dlkern_packed_mma_f16`) over the same bytes.
//! On Hopper above M = 128 also the large-M kernels the planner did not choose (`prefill`,
//! `wgmma` over whole tiles, `wgmma` stream-K: `dlkern_prefill_f16`, `dlkern_wgmma_f16`,
//! `dlkern_streamk_f16`), so that each row shows what its choice won against.
//! `DLKERN_MATMUL_NBITS_VARIANT=small|large|tiled|packed|packed_mma|packed_wgmma|wgmma|wgmma_streamk|prefill`
//! forces a kernel variant (to compare them at one M; the ids stay the same),
//! `DLKERN_MATMUL_NBITS_SPLITS=N` the K splits of the `dlkern_f16` rows.
//!
//! Every buffer is made at the first timed call of a row that uses it, and criterion calls only
//! the rows its filter selects: a filtered run (a variant A/B at one M) skips the other shapes'
//! uploads, several GB of host-made patterns.

mod common;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use dlkern::DType;
use dlkern::ops::matmul_nbits::launch::{MatMulNBitsPointers, WeightsWritten, matmul_nbits_raw_with};
use dlkern::ops::matmul_nbits::plan::{MatMulNBitsParams, Variant, ZeroPointKind};
use half::f16;
use std::cell::{LazyCell, RefCell};
use std::time::Duration;

/// (N, K) of the weight.
const WEIGHTS: &[(usize, usize)] = &[(8192, 8192), (28672, 8192), (8192, 28672)];
const ROWS: &[usize] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 2048];
const BLOCK: usize = 128;

fn pattern<T>(len: usize, f: impl Fn(usize) -> T) -> Vec<T> {
    (0..len).map(f).collect()
}

/// A buffer (or a rotation's copies) made at its first use.
type Lazy<'a, T> = LazyCell<T, Box<dyn FnOnce() -> T + 'a>>;

fn lazy<'a, T>(make: impl FnOnce() -> T + 'a) -> Lazy<'a, T> {
    LazyCell::new(Box::new(make))
}

/// The variant `DLKERN_MATMUL_NBITS_VARIANT` forces, if any.
fn forced_variant() -> Option<Variant> {
    match std::env::var("DLKERN_MATMUL_NBITS_VARIANT").ok()?.as_str() {
        "small" => Some(Variant::Small),
        "large" => Some(Variant::Large),
        "tiled" => Some(Variant::Tiled),
        "packed" => Some(Variant::Packed),
        "packed_mma" => Some(Variant::PackedMma),
        "packed_wgmma" => Some(Variant::PackedWgmma),
        "wgmma" => Some(Variant::Wgmma),
        "wgmma_streamk" => Some(Variant::WgmmaStreamK),
        "prefill" => Some(Variant::Prefill),
        other => panic!(
            "DLKERN_MATMUL_NBITS_VARIANT={other}: expected small, large, tiled, packed, packed_mma, packed_wgmma, wgmma, \
             wgmma_streamk or prefill"
        ),
    }
}

/// The K splits `DLKERN_MATMUL_NBITS_SPLITS` forces, or 0 (the planner's choice).
fn forced_splits() -> usize {
    std::env::var("DLKERN_MATMUL_NBITS_SPLITS").map_or(0, |s| s.parse().expect("DLKERN_MATMUL_NBITS_SPLITS: a number"))
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    let variant = forced_variant();
    let splits = forced_splits();
    let blas = CudaBlas::new(gpu.stream.clone()).expect("cuBLAS");
    let mut group = c.benchmark_group("matmul_nbits");
    group.warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_millis(600)).sample_size(10);
    let s = &gpu.stream;
    for &(n, k) in WEIGHTS {
        let kb = k.div_ceil(BLOCK);
        let w4_bytes = n * kb * BLOCK / 2 + n * kb * 2;
        let copies = gpu.rotation(w4_bytes as u64);
        // `packed`: B in the repacked layout, as many bytes as it takes (timing only).
        let packed_bytes = MatMulNBitsParams {
            dtype: DType::F16,
            m: 1,
            n,
            k,
            block_size: BLOCK,
            zero_points: ZeroPointKind::Default,
            bias: false,
            variant: Some(Variant::Packed),
            splits: 0,
        }
        .packed_bytes();
        let forced_packed = variant.is_some_and(Variant::reads_packed_b);
        let b_bytes = if forced_packed { packed_bytes } else { n * kb * BLOCK / 2 };
        let upload = |bytes: usize| -> Vec<_> {
            (0..copies)
                .map(|c| s.clone_htod(&pattern(bytes, |i| ((i * 131 + c) % 251) as u8)).expect("alloc"))
                .collect()
        };
        let b = lazy(|| upload(b_bytes));
        // The packed copies for the `dlkern_packed_f16` rows (default runs only).
        let b_packed = lazy(|| upload(packed_bytes));
        let scales: Lazy<Vec<_>> = lazy(|| {
            (0..copies)
                .map(|_| {
                    s.clone_htod(&pattern(n * kb, |i| f16::from_f32(0.01 + (i % 7) as f32 * 1e-3))).expect("alloc")
                })
                .collect()
        });
        let w16_bytes = n * k * 2;
        let copies16 = gpu.rotation(w16_bytes as u64);
        let w16: Lazy<Vec<_>> = lazy(|| {
            (0..copies16)
                .map(|_| {
                    s.clone_htod(&pattern(n * k, |i| f16::from_f32(((i * 7919) % 251) as f32 / 251.0 - 0.5)))
                        .expect("alloc")
                })
                .collect()
        });
        for &m in ROWS {
            let params = MatMulNBitsParams {
                dtype: DType::F16,
                m,
                n,
                k,
                block_size: BLOCK,
                zero_points: ZeroPointKind::Default,
                bias: false,
                variant,
                splits,
            };
            let chosen = params.plan(gpu.device.multiprocessors(), gpu.device.has_wgmma()).map(|plan| plan.variant);
            if let (Some(forced), Err(e)) = (variant, &chosen) {
                // A forced variant skips the shapes it cannot run (`Packed*` above M = 16,
                // `PackedWgmma` at M <= 8).
                eprintln!("matmul_nbits: {forced:?} skips M = {m}, N = {n}, K = {k}: {e}");
                continue;
            }
            let a = lazy(move || {
                s.clone_htod(&pattern(m * k, |i| f16::from_f32(((i * 31) % 97) as f32 / 97.0 - 0.5))).expect("alloc")
            });
            let y = lazy(move || RefCell::new(s.alloc_zeros::<f16>(m * n).expect("alloc")));
            let shape = format!("M{m} N{n} K{k}");
            let io = ((m * k + m * n) * 2) as u64;
            let rotation = Rotation { a: &a, b: &b, scales: &scales, y: &y };
            bench_dlkern(&mut group, &gpu, ("dlkern_f16", "dlkern"), &shape, params, w4_bytes as u64 + io, rotation);
            let large_m = variant.is_none() && gpu.device.has_wgmma() && m > 128;
            if large_m {
                // The large-M kernels the planner did not take.
                for (other, names) in [
                    (Variant::Prefill, ("dlkern_prefill_f16", "dlkern prefill 256 x 128")),
                    (Variant::Wgmma, ("dlkern_wgmma_f16", "dlkern wgmma 128 x 128")),
                    (Variant::WgmmaStreamK, ("dlkern_streamk_f16", "dlkern wgmma stream-K")),
                ] {
                    if chosen.as_ref().is_ok_and(|&v| v != other) {
                        let rotation = Rotation { a: &a, b: &b, scales: &scales, y: &y };
                        let p = MatMulNBitsParams { variant: Some(other), ..params };
                        bench_dlkern(&mut group, &gpu, names, &shape, p, w4_bytes as u64 + io, rotation);
                    }
                }
            }
            if !large_m && variant.is_none() && chosen.is_ok_and(|v| v == Variant::WgmmaStreamK) {
                // The planner took the stream-K partition: the same kernel over whole tiles.
                let tiles = MatMulNBitsParams { variant: Some(Variant::Wgmma), ..params };
                let rotation = Rotation { a: &a, b: &b, scales: &scales, y: &y };
                let names = ("dlkern_tiles_f16", "dlkern whole tiles");
                bench_dlkern(&mut group, &gpu, names, &shape, tiles, w4_bytes as u64 + io, rotation);
            }
            if variant.is_none() && m <= 16 {
                // The records carry the scales; `scales` only has to be a valid pointer.
                let packed_params = MatMulNBitsParams { variant: Some(Variant::Packed), splits: 0, ..params };
                let rotation = Rotation { a: &a, b: &b_packed, scales: &scales, y: &y };
                let bytes = packed_bytes as u64 + io;
                bench_dlkern(
                    &mut group,
                    &gpu,
                    ("dlkern_packed_f16", "dlkern packed B"),
                    &shape,
                    packed_params,
                    bytes,
                    rotation,
                );
                if gpu.device.has_wgmma() {
                    // `Packed` ran `PackedWgmma`: the `mma.sync` decode kernels on the same bytes.
                    let mma_params = MatMulNBitsParams { variant: Some(Variant::PackedMma), splits: 0, ..params };
                    let rotation = Rotation { a: &a, b: &b_packed, scales: &scales, y: &y };
                    bench_dlkern(
                        &mut group,
                        &gpu,
                        ("dlkern_packed_mma_f16", "dlkern packed B, mma.sync"),
                        &shape,
                        mma_params,
                        bytes,
                        rotation,
                    );
                }
            }

            // cuBLAS: row-major Y[m, n] = A[m, k] W^T, W [n, k] (column-major: Y^T = W A^T).
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_T,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: n as i32,
                n: m as i32,
                k: k as i32,
                alpha: f16::ONE,
                lda: k as i32,
                ldb: k as i32,
                beta: f16::ZERO,
                ldc: n as i32,
            };
            let flops = (2 * m * n * k) as u64;
            let id = format!("cublas_f16/m{m}_n{n}_k{k}");
            common::record(&common::Meta {
                family: "matmul_nbits",
                id: format!("matmul_nbits/{id}"),
                implementation: "cuBLAS f16",
                shape,
                dtype: "f16",
                bytes: w16_bytes as u64 + io,
                flops,
                workspace_bytes: 0,
            });
            let mut turn = 0;
            group.bench_function(&id, |bench| {
                bench.iter_custom(|iters| {
                    gpu.time(iters, || {
                        turn = (turn + 1) % copies16;
                        // SAFETY: the config matches the allocations (shapes above).
                        unsafe { blas.gemm(cfg, &w16[turn], &*a, &mut *y.borrow_mut()) }.expect("cuBLAS gemm");
                    })
                })
            });
        }
    }
    group.finish();
}

/// The buffers one timed call rotates through: `b[i]` and `scales[i]` together (made at the
/// row's first timed call).
struct Rotation<'r, 'a> {
    a: &'r Lazy<'a, CudaSlice<f16>>,
    b: &'r Lazy<'a, Vec<CudaSlice<u8>>>,
    scales: &'r Lazy<'a, Vec<CudaSlice<f16>>>,
    y: &'r Lazy<'a, RefCell<CudaSlice<f16>>>,
}

/// Records and times `matmul_nbits_raw_with` (constant weights) with `params` as
/// `matmul_nbits/{name}/m_n_k` of `implementation`, moving `bytes`, B and the scales rotating
/// through their copies.
fn bench_dlkern(
    group: &mut BenchmarkGroup<WallTime>,
    gpu: &common::Gpu,
    (name, implementation): (&str, &'static str),
    shape: &str,
    params: MatMulNBitsParams,
    bytes: u64,
    buffers: Rotation,
) {
    let s = &gpu.stream;
    let (m, n, k) = (params.m, params.n, params.k);
    let plan = params.plan(gpu.device.multiprocessors(), gpu.device.has_wgmma()).expect("plan");
    let id = format!("{name}/m{m}_n{n}_k{k}");
    common::record(&common::Meta {
        family: "matmul_nbits",
        id: format!("matmul_nbits/{id}"),
        implementation,
        shape: shape.to_string(),
        dtype: "f16",
        bytes,
        flops: (2 * m * n * k) as u64,
        workspace_bytes: plan.workspace_bytes as u64,
    });
    // The workspace and the pointers, at the row's first timed call.
    let prepared = lazy(|| {
        let workspace = s.alloc_zeros::<u8>(plan.workspace_bytes.max(16)).expect("alloc");
        let y = buffers.y.borrow_mut().device_ptr_mut(s).0;
        let ptrs: Vec<MatMulNBitsPointers> = (buffers.b.iter().zip(buffers.scales.iter()))
            .map(|(b, scales)| MatMulNBitsPointers {
                a: buffers.a.device_ptr(s).0,
                b: b.device_ptr(s).0,
                scales: scales.device_ptr(s).0,
                zero_points: 0,
                bias: 0,
                y,
                workspace: workspace.device_ptr(s).0,
            })
            .collect();
        (workspace, ptrs)
    });
    let mut turn = 0;
    group.bench_function(&id, |bench| {
        let (_, ptrs) = &*prepared;
        bench.iter_custom(|iters| {
            gpu.time(iters, || {
                turn = (turn + 1) % ptrs.len();
                // SAFETY: buffers sized by the params above (B packed for `Variant::Packed`),
                // alive for the bench; the weights were uploaded before any kernel ran and no
                // kernel writes them, as a model's constants.
                unsafe {
                    matmul_nbits_raw_with(&gpu.device, s.cu_stream(), &params, &ptrs[turn], WeightsWritten::Before)
                }
                .expect("launch");
            })
        })
    });
}

criterion_group!(matmul, benches);
criterion_main!(matmul);
