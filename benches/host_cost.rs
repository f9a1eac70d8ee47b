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
//! runs), and RMSNorm of 16 x 4096; through `dlkern_call` (the C ABI, as a C caller makes it):
//! RMSNorm, the same W4 GEMV (no call site there, so over the weights as given), the W8A8 GEMV
//! at M = 1 and GroupQueryAttention decoding one token at 4k context, with that call's pieces
//! below the op (plan, capture query, kept workspace, the launcher alone, its launch through the
//! device layer alone); and, as the floor
//! under all of them, the same kernel launched on the driver alone (`cuLaunchKernel`, and
//! `cuLaunchKernelEx` with programmatic serialization).

mod common;

use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use dlkern::dlpack::{DLDevice, DLDeviceType, DLTensor, dense_tensor};
use dlkern::kernel::{AttrValue, Attributes, CallSite};
use dlkern::ops::matmul_nbits::launch::{MatMulNBitsPointers, WeightsWritten, matmul_nbits_raw_with};
use dlkern::ops::matmul_nbits::plan::{MatMulNBitsParams, Variant, ZeroPointKind};
use dlkern::ops::paged_attention::launch::{
    BnshAttentionParams, DecodeLimits, NewToken, PagedAttentionPointers, paged_attention_bnsh_raw,
};
use dlkern::ops::rmsnorm::launch::{RmsNormParams, rmsnorm_raw};
use dlkern::registry::CAttr;
use dlkern::runtime::{Device, StreamScratch, stream_is_capturing};
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
    let cuda = DLDevice { device_type: DLDeviceType::CUDA, device_id: 0 };
    dense_tensor(address as *mut std::ffi::c_void, cuda, dtype, shape)
}

/// One C-ABI call as a C caller makes it (with a `site`, through `dlkern_call_at`); panics with
/// the library's message on an error.
fn c_abi_call(
    stream: &cudarc::driver::CudaStream,
    label: &str,
    name: &std::ffi::CStr,
    tensors: &mut [DLTensor],
    inputs: usize,
    attrs: &[CAttr],
    site: Option<*const dlkern::kernel::CallSite>,
) {
    let (n_in, n_out) = (inputs as i32, (tensors.len() - inputs) as i32);
    let (t, a, n_attrs) = (tensors.as_mut_ptr(), attrs.as_ptr(), attrs.len() as i32);
    let raw_stream = stream.cu_stream();
    // SAFETY: the header's contract: a NUL-terminated name, valid DLTensors over device
    // buffers of their shapes (host ones where the kernel takes them) alive for the bench,
    // `inputs` of them inputs, the bench stream, `attrs` with 'static names; a site from
    // dlkern_site_create whose constant inputs are the same buffers at every call.
    let code = unsafe {
        match site {
            Some(site) => {
                dlkern::capi::dlkern_call_at(site, name.as_ptr(), t, n_in, n_out, raw_stream.cast(), a, n_attrs)
            }
            None => dlkern::capi::dlkern_call(name.as_ptr(), t, n_in, n_out, raw_stream.cast(), a, n_attrs),
        }
    };
    if code != 0 {
        // SAFETY: dlkern_last_error returns this thread's NUL-terminated message.
        let message = unsafe { std::ffi::CStr::from_ptr(dlkern::capi::dlkern_last_error()) };
        panic!("{label}: {}", message.to_string_lossy());
    }
}

/// A row timing `dlkern_call` (or, with a `site`, `dlkern_call_at`) as a C caller makes it:
/// name, tensors and attributes prepared once, only the call in the loop, timed as `timing`
/// says. The first call (module load, occupancy queries, a site's repacking) is made before the
/// timing.
#[allow(clippy::too_many_arguments)]
fn c_abi_row(
    group: &mut BenchmarkGroup<WallTime>,
    stream: &cudarc::driver::CudaStream,
    label: &'static str,
    name: &std::ffi::CStr,
    tensors: &mut [DLTensor],
    inputs: usize,
    attrs: &[CAttr],
    site: Option<*const dlkern::kernel::CallSite>,
    timing: Timing,
) {
    let mut call = || c_abi_call(stream, label, name, tensors, inputs, attrs, site);
    call();
    stream.synchronize().expect("synchronize");
    match timing {
        Timing::Host => {
            group.bench_function(row(label), |b| b.iter_custom(|iters| host_time(stream, iters, &mut call)))
        }
        Timing::Synchronized => group.bench_function(row(label), |b| {
            b.iter(|| {
                call();
                stream.synchronize().expect("synchronize");
            })
        }),
    };
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
    // What the Hopper attention kernel's launch adds: it encodes three such maps (Q, K, V).
    group.bench_function(row("TensorMap::tiled 3-D (cuTensorMapEncodeTiled, checked)"), |b| {
        use dlkern::runtime::tensor_map::{MapElement, MapSwizzle, TensorMap, TiledTensor};
        let tensor = TiledTensor {
            element: MapElement::F16,
            address: 1 << 20,
            dims: &[128, 32, 8192],
            strides: &[256, 8192],
            box_dims: &[64, 1, 128],
            swizzle: MapSwizzle::Bytes128,
        };
        b.iter_custom(|iters| {
            host_time(s, iters, || {
                std::hint::black_box(TensorMap::tiled("host_cost", std::hint::black_box(&tensor)).expect("map"));
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
        // The same call through the C ABI, which has no call site: the weights as given (no
        // repacked copy), what a C caller gets.
        let w4_attrs = [
            CAttr::int(c"K", K as i64),
            CAttr::int(c"N", N as i64),
            CAttr::int(c"bits", 4),
            CAttr::int(c"block_size", BLOCK as i64),
        ];
        c_abi_row(
            &mut group,
            s,
            "dlkern_call matmul_nbits M1 4096x4096 b32",
            c"dlkern.matmul_nbits",
            &mut tensors,
            3,
            &w4_attrs,
            None,
            Timing::Host,
        );
        // Through a call site that marks B and the scales constant: the repacked path the ORT
        // op takes.
        let site = dlkern::capi::dlkern_site_create(0b110);
        c_abi_row(
            &mut group,
            s,
            "dlkern_call_at matmul_nbits M1 4096x4096 b32",
            c"dlkern.matmul_nbits",
            &mut tensors,
            3,
            &w4_attrs,
            Some(site),
            Timing::Host,
        );
        // SAFETY: the site of dlkern_site_create, used no more.
        unsafe { dlkern::capi::dlkern_site_destroy(site) };
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
        // The same kernel on the driver alone: the handle resolved and the parameter list built
        // once, only `cuLaunchKernel` (or `cuLaunchKernelEx` with programmatic serialization,
        // as `Device::launch_overlapping` makes it) in the loop. The floor under the rows above.
        let plan = params.plan(xp, gp, op).expect("plan").expect("rows");
        let function = device.function(plan.kernel).expect("function").cu_function();
        let (mut cols, mut x_stride, mut y_stride, mut eps) = (d as u32, d as u64, d as u64, 1e-5f32);
        let (mut xa, mut ga, mut oa) = (xp, gp, op);
        let mut raw_params: [*mut std::ffi::c_void; 7] = [
            (&raw mut xa).cast(),
            (&raw mut ga).cast(),
            (&raw mut oa).cast(),
            (&raw mut cols).cast(),
            (&raw mut x_stride).cast(),
            (&raw mut y_stride).cast(),
            (&raw mut eps).cast(),
        ];
        let dims = plan.dims;
        group.bench_function(row("cuLaunchKernel rmsnorm 16x4096"), |bch| {
            bch.iter_custom(|iters| {
                host_time(s, iters, || {
                    // SAFETY: the kernel's parameter list (u64 x3, u32, u64 x2, f32), each
                    // pointing at a local that outlives the bench; buffers as above.
                    unsafe {
                        cudarc::driver::result::launch_kernel(
                            function,
                            dims.grid,
                            dims.block,
                            dims.shared_bytes,
                            raw_stream,
                            &mut raw_params,
                        )
                    }
                    .expect("launch");
                })
            })
        });
        for (label, programmatic) in
            [("cuLaunchKernelEx rmsnorm 16x4096", false), ("cuLaunchKernelEx rmsnorm 16x4096 programmatic", true)]
        {
            use cudarc::driver::sys::{
                CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig, cuLaunchKernelEx,
            };
            group.bench_function(row(label), |bch| {
                bch.iter_custom(|iters| {
                    host_time(s, iters, || {
                        let mut attribute = CUlaunchAttribute {
                            id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                            pad: [0; 4],
                            value: CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
                        };
                        let config = CUlaunchConfig {
                            gridDimX: dims.grid.0,
                            gridDimY: dims.grid.1,
                            gridDimZ: dims.grid.2,
                            blockDimX: dims.block.0,
                            blockDimY: dims.block.1,
                            blockDimZ: dims.block.2,
                            sharedMemBytes: dims.shared_bytes,
                            hStream: raw_stream,
                            attrs: &mut attribute,
                            numAttrs: u32::from(programmatic),
                        };
                        // SAFETY: as above; the kernel reads nothing an earlier launch in the loop
                        // writes, so overlapping the previous one changes no result.
                        unsafe { cuLaunchKernelEx(&config, function, raw_params.as_mut_ptr(), std::ptr::null_mut()) }
                            .result()
                            .expect("launch");
                    })
                })
            });
        }
        let attrs = Attributes::new().with("epsilon", AttrValue::Float(1e-5));
        c_abi_row(
            &mut group,
            s,
            "dlkern_call rmsnorm 16x4096",
            c"dlkern.rmsnorm",
            &mut tensors,
            2,
            &[CAttr::float(c"epsilon", 1e-5)],
            None,
            Timing::Host,
        );
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
    // The W8A8 GEMV at M = 1, N = K = 4096 ([N, K] weights, f16 out), through the C ABI.
    {
        let a_q = s.clone_htod(&vec![1i8; K]).expect("alloc");
        let a_scale = s.clone_htod(&[0.01f32]).expect("alloc");
        let w_q = s.clone_htod(&vec![1i8; N * K]).expect("alloc");
        let w_scale = s.clone_htod(&vec![0.01f32; N]).expect("alloc");
        let mut y = s.alloc_zeros::<f16>(N).expect("alloc");
        let mut shapes = [vec![1, K as i64], vec![1], vec![N as i64, K as i64], vec![N as i64], vec![1, N as i64]];
        let [sa, sas, sw, sws, sy] = &mut shapes;
        let mut tensors = [
            cuda_tensor(a_q.device_ptr(s).0, DType::I8, sa),
            cuda_tensor(a_scale.device_ptr(s).0, DType::F32, sas),
            cuda_tensor(w_q.device_ptr(s).0, DType::I8, sw),
            cuda_tensor(w_scale.device_ptr(s).0, DType::F32, sws),
            cuda_tensor(y.device_ptr_mut(s).0, DType::F16, sy),
        ];
        c_abi_row(
            &mut group,
            s,
            "dlkern_call matmul_w8a8 M1 4096x4096",
            c"dlkern.matmul_w8a8",
            &mut tensors,
            4,
            &[],
            None,
            Timing::Host,
        );
    }

    // GroupQueryAttention decoding one token per sequence (32 query / 8 KV heads of 128, packed
    // QKV, rotary, the builder's node) over shared past/present caches, through the C ABI: one
    // launch (the default) and two (the rotary launch first, the CUDA-graph capture path).
    gqa_decode_rows(&mut group, s, 1, 4096, Timing::Host);
    gqa_launcher_rows(&mut group, device, s, 4096);
    for (batch, context) in [(1, 8192), (16, 4096), (64, 4096)] {
        gqa_decode_rows(&mut group, s, batch, context, Timing::Synchronized);
    }
    group.finish();
}

/// What a row times.
#[derive(Clone, Copy, PartialEq)]
enum Timing {
    /// The calling thread's time per call (the stream synchronized untimed, every [`BATCH`]).
    Host,
    /// Each call followed by a stream synchronization: the call's latency, host and device.
    Synchronized,
}

/// The GroupQueryAttention rows' shape: 32 query heads over 8 KV heads of 128, packed QKV.
const GQA_HEADS: usize = 32;
const GQA_KV_HEADS: usize = 8;
const GQA_HEAD: usize = 128;
const GQA_QKV: usize = (GQA_HEADS + 2 * GQA_KV_HEADS) * GQA_HEAD;

/// A decode step's device buffers for `batch` sequences of `context` positions (the last one
/// new): packed QKV, BNSH caches, `seqlens_k`, cos / sin caches (angle 0) and the output.
struct GqaBuffers {
    query: cudarc::driver::CudaSlice<f16>,
    key_cache: cudarc::driver::CudaSlice<f16>,
    value_cache: cudarc::driver::CudaSlice<f16>,
    seqlens_k: cudarc::driver::CudaSlice<i32>,
    cos: cudarc::driver::CudaSlice<f16>,
    sin: cudarc::driver::CudaSlice<f16>,
    out: cudarc::driver::CudaSlice<f16>,
}

impl GqaBuffers {
    fn new(s: &std::sync::Arc<cudarc::driver::CudaStream>, batch: usize, context: usize) -> Self {
        let cache_len = batch * GQA_KV_HEADS * context * GQA_HEAD;
        let angles = context * GQA_HEAD / 2;
        GqaBuffers {
            query: s.clone_htod(&vec![f16::from_f32(0.1); batch * GQA_QKV]).expect("alloc"),
            key_cache: s.clone_htod(&vec![f16::from_f32(0.1); cache_len]).expect("alloc"),
            value_cache: s.clone_htod(&vec![f16::from_f32(0.1); cache_len]).expect("alloc"),
            seqlens_k: s.clone_htod(&vec![context as i32 - 1; batch]).expect("alloc"),
            cos: s.clone_htod(&vec![f16::ONE; angles]).expect("alloc"),
            sin: s.alloc_zeros::<f16>(angles).expect("alloc"),
            out: s.alloc_zeros::<f16>(batch * GQA_HEADS * GQA_HEAD).expect("alloc"),
        }
    }
}

/// GroupQueryAttention decode rows at `batch` sequences of `context` tokens (the new one
/// included), one launch and two, timed as `timing` says.
fn gqa_decode_rows(
    group: &mut BenchmarkGroup<WallTime>,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    batch: usize,
    context: usize,
    timing: Timing,
) {
    let (heads, kv_heads, head, qkv) = (GQA_HEADS, GQA_KV_HEADS, GQA_HEAD, GQA_QKV);
    let GqaBuffers { query, key_cache, value_cache, seqlens_k, cos, sin, mut out } = GqaBuffers::new(s, batch, context);
    let mut total_sequence_length = context as i32;
    let (b, cache_shape) = (batch as i64, [batch as i64, kv_heads as i64, context as i64, head as i64]);
    let mut shapes = [
        vec![b, 1, qkv as i64],
        vec![0],
        vec![0],
        cache_shape.to_vec(),
        cache_shape.to_vec(),
        vec![b],
        vec![1],
        vec![context as i64, head as i64 / 2],
        vec![context as i64, head as i64 / 2],
        vec![b, 1, (heads * head) as i64],
        cache_shape.to_vec(),
        cache_shape.to_vec(),
    ];
    let [sq, sk, sv, spk, spv, sl, st, sc, ss, so, sok, sov] = &mut shapes;
    let (kp, vp) = (key_cache.device_ptr(s).0, value_cache.device_ptr(s).0);
    let mut total = cuda_tensor((&raw mut total_sequence_length) as u64, DType::I32, st);
    total.device = DLDevice { device_type: DLDeviceType::CPU, device_id: 0 };
    let mut tensors = [
        cuda_tensor(query.device_ptr(s).0, DType::F16, sq),
        cuda_tensor(0, DType::F16, sk),
        cuda_tensor(0, DType::F16, sv),
        cuda_tensor(kp, DType::F16, spk),
        cuda_tensor(vp, DType::F16, spv),
        cuda_tensor(seqlens_k.device_ptr(s).0, DType::I32, sl),
        total,
        cuda_tensor(cos.device_ptr(s).0, DType::F16, sc),
        cuda_tensor(sin.device_ptr(s).0, DType::F16, ss),
        cuda_tensor(out.device_ptr_mut(s).0, DType::F16, so),
        cuda_tensor(kp, DType::F16, sok),
        cuda_tensor(vp, DType::F16, sov),
    ];
    let attrs = [
        CAttr::int(c"num_heads", heads as i64),
        CAttr::int(c"kv_num_heads", kv_heads as i64),
        CAttr::int(c"do_rotary", 1),
        CAttr::int(c"local_window_size", -1),
        CAttr::float(c"softcap", 0.0),
        CAttr::float(c"scale", 1.0 / (head as f64).sqrt()),
    ];
    let shape = format!("B{batch} 32/8x128 ctx{context}");
    for two in [false, true] {
        let path = if two { " two launches" } else { "" };
        let label: &'static str = match timing {
            Timing::Host => format!("dlkern_call group_query_attention decode {shape}{path}"),
            Timing::Synchronized => format!("dlkern_call + synchronize group_query_attention decode {shape}{path}"),
        }
        .leak();
        let run = |group: &mut BenchmarkGroup<WallTime>, tensors: &mut [DLTensor]| {
            c_abi_row(group, s, label, c"dlkern.group_query_attention", tensors, 9, &attrs, None, timing)
        };
        if two {
            dlkern::ops::attention::with_two_launch_decode(|| run(group, &mut tensors));
        } else {
            run(group, &mut tensors);
        }
    }
}

/// The pieces of a one-launch GroupQueryAttention decode call below the op (B1, 32 / 8 heads of
/// 128, packed QKV with rotary, `context` keys): the decode plan (`DecodeLimits::of` and
/// `BnshAttentionParams::plan`), the capture query, the stream's kept workspace, and the launcher
/// on prepared arguments (its checks and one launch); `dlkern_call`'s row minus these is the C
/// ABI's and the op's own share.
fn gqa_launcher_rows(
    group: &mut BenchmarkGroup<WallTime>,
    device: &Device,
    s: &std::sync::Arc<cudarc::driver::CudaStream>,
    context: usize,
) {
    let (heads, kv_heads, head, qkv) = (GQA_HEADS, GQA_KV_HEADS, GQA_HEAD, GQA_QKV);
    let raw_stream = s.cu_stream();
    let GqaBuffers { query, key_cache, value_cache, seqlens_k, cos, sin, mut out } = GqaBuffers::new(s, 1, context);
    let params = BnshAttentionParams {
        dtype: DType::F16,
        batch: 1,
        q_len: 1,
        num_q_heads: heads,
        num_kv_heads: kv_heads,
        head_size: head,
        capacity: context,
        max_keys: context,
        scale: 1.0 / (head as f32).sqrt(),
        softcap: 0.0,
        window: 0,
        q_token_stride: qkv,
    };
    let plan_it = || params.plan(DecodeLimits::of(device, DType::F16, head).expect("limits")).expect("plan");
    let plan = plan_it();
    group.bench_function(row("GQA decode plan (DecodeLimits::of + BnshAttentionParams::plan)"), |b| {
        b.iter_custom(|iters| {
            host_time(s, iters, || {
                std::hint::black_box(plan_it());
            })
        })
    });
    group.bench_function(row("stream_is_capturing"), |b| {
        b.iter_custom(|iters| {
            // SAFETY: the bench stream, alive for the whole bench.
            host_time(s, iters, || drop(std::hint::black_box(unsafe { stream_is_capturing(device, raw_stream) })))
        })
    });
    let bytes = plan.scratch_bytes();
    // SAFETY: the bench stream; only the decode launches below use the memory, each leaving its
    // counters zero.
    let workspace = || unsafe { device.stream_workspace(raw_stream, bytes) }.expect("workspace");
    let status = workspace();
    group.bench_function(row("Device::stream_workspace (kept)"), |b| {
        b.iter_custom(|iters| {
            host_time(s, iters, || {
                std::hint::black_box(workspace());
            })
        })
    });
    let (qp, _q) = query.device_ptr(s);
    let (kp, _k) = key_cache.device_ptr(s);
    let (vp, _v) = value_cache.device_ptr(s);
    let (lp, _l) = seqlens_k.device_ptr(s);
    let (cp, _c) = cos.device_ptr(s);
    let (sp, _s) = sin.device_ptr(s);
    let (op, _o) = out.device_ptr_mut(s);
    let ptrs = PagedAttentionPointers {
        q: qp,
        key_cache: kp,
        value_cache: vp,
        context_lens: lp,
        out: op,
        ..plan.scratch_pointers(status)
    };
    let element = std::mem::size_of::<f16>() as u64;
    let fresh = NewToken {
        key: qp + (heads * head) as u64 * element,
        value: qp + ((heads + kv_heads) * head) as u64 * element,
        cos: cp,
        sin: sp,
        kv_batch_stride: qkv as u32,
        rotary_dim: head as u32,
        interleaved: 0,
        max_position: context as u32,
    };
    // SAFETY: buffers of the shapes the params describe (one sequence whose last position is
    // `context - 1`, angles for `context` positions), the plan's workspace from the stream's
    // kept buffer, the bench stream.
    let mut launch = || {
        unsafe { paged_attention_bnsh_raw(device, raw_stream, &params, plan, &ptrs, &fresh) }.expect("launch");
    };
    launch();
    s.synchronize().expect("synchronize");
    group.bench_function(row("paged_attention_bnsh_raw GQA decode one launch B1 32/8x128 ctx4096"), |b| {
        b.iter_custom(|iters| host_time(s, iters, &mut launch))
    });
    // The same launch through the device layer alone (function, shared-memory limit and
    // occupancy lookups, `cuLaunchKernelEx` with its 13 parameters): the launcher's own checks
    // are the row above minus this one.
    let mut device_launch = || {
        // SAFETY: as the launcher's launch above (the arguments it passes, already checked).
        unsafe {
            device.launch_overlapping_in_one_wave(
                plan.attention,
                plan.attention_dims,
                raw_stream,
                plan.attention_params(&ptrs, 0, &fresh),
            )
        }
        .expect("launch");
    };
    group.bench_function(row("Device::launch_overlapping_in_one_wave GQA decode B1 32/8x128 ctx4096"), |b| {
        b.iter_custom(|iters| host_time(s, iters, &mut device_launch))
    });
}

criterion_group!(host_cost, benches);
criterion_main!(host_cost);
