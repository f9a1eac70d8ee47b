//! Host time per call of dlkern's launch path, piece by piece (GPU host): what one decode-sized
//! call costs the calling thread, not the GPU. Each row times only the calls themselves, on the
//! host clock; the stream is synchronized every [`BATCH`] calls outside the timed part, so the
//! launch queue never fills and blocks a call.
//!
//! Rows: a trivial driver call (`cuCtxGetCurrent`), `Device::get`, a workspace allocated and
//! freed in stream order (`StreamScratch`, what a K-split call allocates), the planned W4 launch
//! on raw pointers (`matmul_nbits_raw_with`: plan, checks, 1-2 launches), one RMSNorm launch on
//! raw pointers (`rmsnorm_raw`: the floor of one checked launch), and whole registry
//! calls (`registry::call_at`, what the C ABI and the ORT op reach): W4 GEMV M = 1 at
//! N = K = 4096 (block 32 symmetric, weights constant at the site: the repacked path the ORT op
//! runs), and RMSNorm of 16 x 4096.

mod common;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use dlkern::dlpack::{DLDevice, DLDeviceType, DLTensor, dtype_to_dl};
use dlkern::kernel::{AttrValue, Attributes, CallSite};
use dlkern::ops::matmul_nbits::launch::{MatMulNBitsPointers, WeightsWritten, matmul_nbits_raw_with};
use dlkern::ops::matmul_nbits::plan::{MatMulNBitsParams, Variant, ZeroPointKind};
use dlkern::ops::rmsnorm::launch::{RmsNormParams, rmsnorm_raw};
use dlkern::runtime::{Device, StreamScratch};
use dlkern::{DType, registry};
use half::f16;

/// Calls per synchronization (well below the launch queue's depth).
const BATCH: u64 = 32;
const N: usize = 4096;
const K: usize = 4096;
const BLOCK: usize = 32;

/// The report's line for row `name` (BENCHMARKS.md, "Host time per call"); returns `name`.
fn row(name: &'static str) -> &'static str {
    common::record(&common::Meta {
        family: "host_cost",
        id: format!("host_cost/{name}"),
        implementation: "dlkern",
        shape: String::new(),
        dtype: "",
        bytes: 0,
        flops: 0,
        workspace_bytes: 0,
    });
    name
}

/// Host time of `iters` calls of `call`, synchronizing `stream` every [`BATCH`] calls untimed.
fn host_time(stream: &cudarc::driver::CudaStream, iters: u64, mut call: impl FnMut()) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = BATCH.min(iters - done);
        let start = Instant::now();
        for _ in 0..n {
            call();
        }
        total += start.elapsed();
        stream.synchronize().expect("synchronize");
        done += n;
    }
    total
}

/// A CUDA DLTensor over `address` with `shape` (dense).
fn cuda_tensor(address: u64, dtype: DType, shape: &mut [i64]) -> DLTensor {
    DLTensor {
        data: address as *mut std::ffi::c_void,
        device: DLDevice { device_type: DLDeviceType::CUDA, device_id: 0 },
        ndim: shape.len() as i32,
        dtype: dtype_to_dl(dtype),
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

fn benches(c: &mut Criterion) {
    let Some(gpu) = common::gpu() else { return };
    let (device, s) = (&gpu.device, &gpu.stream);
    let raw_stream = s.cu_stream();
    let mut group = c.benchmark_group("host_cost");
    group.warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1)).sample_size(10);

    group.bench_function(row("cuCtxGetCurrent"), |b| {
        b.iter_custom(|iters| {
            host_time(s, iters, || {
                std::hint::black_box(cudarc::driver::result::ctx::get_current().expect("ctx"));
            })
        })
    });
    group.bench_function(row("Device::get"), |b| {
        b.iter_custom(|iters| host_time(s, iters, || drop(std::hint::black_box(Device::get(0).expect("device")))))
    });
    group.bench_function(row("StreamScratch 64 KiB"), |b| {
        b.iter_custom(|iters| {
            host_time(s, iters, || {
                // SAFETY: the bench stream, alive for the whole bench.
                drop(std::hint::black_box(unsafe { StreamScratch::new(device, raw_stream, 64 << 10) }.expect("alloc")));
            })
        })
    });

    // The W4 GEMV at M = 1: A [1, K], B [N, K / 32, 16], scales [N, K / 32], Y [1, N].
    let k_blocks = K / BLOCK;
    let a = s.clone_htod(&vec![f16::from_f32(0.01); K]).expect("alloc");
    let b_codes = s.clone_htod(&vec![0x98u8; N * k_blocks * BLOCK / 2]).expect("alloc");
    let scales = s.clone_htod(&vec![f16::from_f32(0.02); N * k_blocks]).expect("alloc");
    let mut y = s.alloc_zeros::<f16>(N).expect("alloc");
    let params = MatMulNBitsParams {
        dtype: DType::F16,
        m: 1,
        n: N,
        k: K,
        block_size: BLOCK,
        zero_points: ZeroPointKind::Default,
        bias: false,
        variant: Some(Variant::Packed),
        splits: 0,
    };
    let packed = s.alloc_zeros::<u8>(params.packed_bytes()).expect("alloc");
    let plan = params.plan(device.multiprocessors(), device.has_wgmma()).expect("plan");
    eprintln!(
        "host_cost: W4 M = 1 runs {} ({} splits, {} workspace bytes)",
        plan.kernel, plan.splits, plan.workspace_bytes
    );
    {
        let (ap, _a) = a.device_ptr(s);
        let (pp, _p) = packed.device_ptr(s);
        let (sp, _s) = scales.device_ptr(s);
        let (yp, _y) = y.device_ptr_mut(s);
        let workspace = s.alloc_zeros::<u8>(plan.workspace_bytes.max(16)).expect("alloc");
        let (wp, _w) = workspace.device_ptr(s);
        let ptrs = MatMulNBitsPointers { a: ap, b: pp, scales: sp, zero_points: 0, bias: 0, y: yp, workspace: wp };
        // The first launch loads the module and queries the occupancy: out of the timing.
        // SAFETY: as in the loop below.
        unsafe { matmul_nbits_raw_with(device, raw_stream, &params, &ptrs, WeightsWritten::Before) }.expect("launch");
        s.synchronize().expect("synchronize");
        group.bench_function(row("matmul_nbits_raw_with M1 4096x4096 b32"), |bch| {
            bch.iter_custom(|iters| {
                host_time(s, iters, || {
                    // SAFETY: buffers of the shapes the params describe (B repacked, zeros:
                    // timing only), the workspace the plan asks for, the bench stream.
                    unsafe { matmul_nbits_raw_with(device, raw_stream, &params, &ptrs, WeightsWritten::Before) }
                        .expect("launch");
                })
            })
        });
    }

    let attrs = Attributes::new()
        .with("K", AttrValue::Int(K as i64))
        .with("N", AttrValue::Int(N as i64))
        .with("bits", AttrValue::Int(4))
        .with("block_size", AttrValue::Int(BLOCK as i64));
    let site = CallSite::new(0b110); // B and scales
    {
        let (ap, _a) = a.device_ptr(s);
        let (bp, _b) = b_codes.device_ptr(s);
        let (sp, _s) = scales.device_ptr(s);
        let (yp, _y) = y.device_ptr_mut(s);
        let mut shapes = [
            vec![1, K as i64],
            vec![N as i64, k_blocks as i64, (BLOCK / 2) as i64],
            vec![N as i64, k_blocks as i64],
            vec![1, N as i64],
        ];
        let [sa, sb, ss, sy] = &mut shapes;
        let mut tensors = [
            cuda_tensor(ap, DType::F16, sa),
            cuda_tensor(bp, DType::U8, sb),
            cuda_tensor(sp, DType::F16, ss),
            cuda_tensor(yp, DType::F16, sy),
        ];
        group.bench_function(row("registry call_at matmul_nbits M1 4096x4096 b32"), |bch| {
            bch.iter_custom(|iters| {
                host_time(s, iters, || {
                    // SAFETY: device tensors of the shapes described, alive for the bench; the
                    // site's constant inputs (B, scales) are the same buffers on every call.
                    unsafe {
                        registry::call_at("dlkern.matmul_nbits", &mut tensors, 3, raw_stream.cast(), &attrs, &site)
                    }
                    .expect("call");
                })
            })
        });
    }

    let (rows, d) = (16usize, 4096usize);
    let x = s.clone_htod(&vec![f16::from_f32(0.5); rows * d]).expect("alloc");
    let gamma = s.clone_htod(&vec![f16::ONE; d]).expect("alloc");
    let mut out = s.alloc_zeros::<f16>(rows * d).expect("alloc");
    {
        let (xp, _x) = x.device_ptr(s);
        let (gp, _g) = gamma.device_ptr(s);
        let (op, _o) = out.device_ptr_mut(s);
        let mut shapes = [vec![rows as i64, d as i64], vec![d as i64], vec![rows as i64, d as i64]];
        let [sx, sg, so] = &mut shapes;
        let mut tensors =
            [cuda_tensor(xp, DType::F16, sx), cuda_tensor(gp, DType::F16, sg), cuda_tensor(op, DType::F16, so)];
        // One plain launch with its checks: the floor under every registry call.
        let params = RmsNormParams { dtype: DType::F16, rows, cols: d, x_row_stride: d, y_row_stride: d, eps: 1e-5 };
        group.bench_function(row("rmsnorm_raw 16x4096"), |bch| {
            bch.iter_custom(|iters| {
                host_time(s, iters, || {
                    // SAFETY: device buffers of `rows x d` and `d` halves, the bench stream.
                    unsafe { rmsnorm_raw(device, raw_stream, &params, xp, gp, op) }.expect("launch");
                })
            })
        });
        let attrs = Attributes::new().with("epsilon", AttrValue::Float(1e-5));
        group.bench_function(row("registry call rmsnorm 16x4096"), |bch| {
            bch.iter_custom(|iters| {
                host_time(s, iters, || {
                    // SAFETY: device tensors of the shapes described, alive for the bench.
                    unsafe { registry::call("dlkern.rmsnorm", &mut tensors, 2, raw_stream.cast(), &attrs) }
                        .expect("call");
                })
            })
        });
    }
    group.finish();
}

criterion_group!(host_cost, benches);
criterion_main!(host_cost);
