"""GPU host, with onnxruntime-gpu: dlkern's ops on the CUDA execution provider against the CPU
EP, with I/O binding on device memory, and DLPackKernel calling a CUDA kernel registered
through the C ABI (the nvcc-built plug-in). Skipped where the CUDA EP is unavailable."""

import collections
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
if "CUDAExecutionProvider" not in ort.get_available_providers():
    pytest.skip("needs onnxruntime-gpu with the CUDA execution provider", allow_module_level=True)

from onnx import TensorProto, helper  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
import dlkern_ctypes as dk  # noqa: E402
import dlkern_onnx as dx  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
LIB = dk.Library(LIB_PATH)
CUDA = "CUDAExecutionProvider"


def providers_of(sess):
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    used = collections.defaultdict(set)
    for e in events:
        if e.get("cat") == "Node":
            used[e["args"].get("op_name")].add(e["args"].get("provider"))
    return used


def run_bound(sess, feeds, device):
    io = sess.io_binding()
    for name, arr in feeds.items():
        io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(arr, device, 0))
    io.bind_output(sess.get_outputs()[0].name, device)
    sess.run_with_iobinding(io)
    return io.copy_outputs_to_cpu()[0]


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("np_dtype,elem", [(np.float32, TensorProto.FLOAT), (np.float16, TensorProto.FLOAT16)])
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 97), (1, 5, 80), (4, 64, 4096), (1, 2, 1025)])
def test_cuda_ep_matches_cpu_ep(generic, np_dtype, elem, shape):
    rng = np.random.default_rng(11)
    x = rng.uniform(-3, 3, shape).astype(np_dtype)
    w = rng.uniform(-1, 1, shape[-1]).astype(np_dtype)
    model = dx.rmsnorm_model(elem, shape[-1], 1e-6, generic)
    gpu = dx.session(LIB_PATH, model, CUDA, profile=True)
    y_gpu = run_bound(gpu, {"X": x, "scale": w}, "cuda")
    assert providers_of(gpu)["DLPackKernel" if generic else "RMSNorm"] == {CUDA}
    (y_cpu,) = dx.session(LIB_PATH, model).run(None, {"X": x, "scale": w})
    # The CPU EP rounds the f64 reference once; the GPU adds f32 accumulation: 2 roundoffs.
    np.testing.assert_allclose(y_gpu.astype(np.float64), y_cpu.astype(np.float64), rtol=4 * np.finfo(np_dtype).eps, atol=1e-6)


@pytest.fixture(scope="module")
def cuda_plugin():
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    out = os.path.join(tempfile.mkdtemp(), "libdlkern_cuda_plugin.so")
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-I", os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "tests", "plugin", "cuda_plugin.cu"), "-o", out], check=True)
    if "plugin.saxpy" not in LIB.kernels():
        LIB.load_plugin(out)
    return out


def test_generic_op_runs_a_c_abi_cuda_kernel_on_ort_stream(cuda_plugin):
    node = helper.make_node("DLPackKernel", ["X"], ["H"], domain="dlkern", name="saxpy", function_name="plugin.saxpy",
                            a=3.0, b=0.5, attribute_names="a, b")
    relu = helper.make_node("Relu", ["H"], ["Y"])
    model = dx.model([node, relu], [dx.value("X", TensorProto.FLOAT, ["n", 1000])], [dx.value("Y", TensorProto.FLOAT, None)])
    sess = dx.session(LIB_PATH, model, CUDA, profile=True)
    x = np.random.default_rng(2).standard_normal((7, 1000)).astype(np.float32)
    y = run_bound(sess, {"X": x}, "cuda")
    np.testing.assert_allclose(y, np.maximum(3.0 * x + 0.5, 0), rtol=1e-6, atol=1e-6)
    assert providers_of(sess)["DLPackKernel"] == {CUDA}


def test_cuda_ep_reports_kernel_errors():
    node = helper.make_node("RMSNorm", ["X", "scale"], ["Y"], domain="dlkern", name="bad")
    model = dx.model([node], [dx.value("X", TensorProto.FLOAT16, [2, 8]), dx.value("scale", TensorProto.FLOAT16, ["d"])],
                     [dx.value("Y", TensorProto.FLOAT16, None)])
    sess = dx.session(LIB_PATH, model, CUDA)
    with pytest.raises(Exception, match=r"dlkern RMSNorm node 'bad'.*tensor 'weight': shape \[3\] \(expected \[8\]\)"):
        sess.run(None, {"X": np.ones((2, 8), np.float16), "scale": np.ones(3, np.float16)})


@pytest.mark.parametrize("block_size", [16, 32, 128])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("m", [1, 5, 70])
def test_matmulnbits_on_cuda_ep_matches_ort(block_size, symmetric, m):
    """A model quantized by ORT's own tool runs on dlkern's tensor-core kernels (CUDA EP) and
    agrees with ORT's com.microsoft MatMulNBits (CPU EP)."""
    pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    from test_matmulnbits import quantized_model, run, with_bias

    # K not a multiple of the block size (for blocks of 16 with rows of whole 16 bytes, which
    # the repacked path needs)
    k, n = (216 if block_size == 16 else 200), 48
    model = with_bias(quantized_model(k, n, block_size, symmetric, TensorProto.FLOAT16, seed=block_size), n, np.float16, 3)
    a = np.random.default_rng(m).standard_normal((m, k)).astype(np.float16)
    (expected,) = run(model).run(None, {"A": a})
    model.graph.node[0].domain = "dlkern"
    model.opset_import.append(helper.make_opsetid("dlkern", 1))
    gc.collect()
    held = LIB.device_bytes_held()
    sess = dx.session(LIB_PATH, model.SerializeToString(), CUDA, profile=True)
    got = run_bound(sess, {"A": a}, "cuda")
    assert providers_of(sess)["MatMulNBits"] == {CUDA}
    # Both dequantize to f16 and accumulate in f32; they differ in summation order.
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=4e-3, atol=4e-3)
    # B, scales and zero points are initializers: where `Packed` runs (M <= 16) the node
    # repacked them once, one record per 32 columns and 128 of K (2176 bytes; 2432 for blocks
    # of 32 and 64, which carry a scale per 32 of K; 2688 for blocks of 16)...
    record = {16: 2688, 32: 2432}.get(block_size, 2176)
    repacked = (n + 31) // 32 * ((k + 127) // 128) * record if m <= 16 else 0
    assert LIB.device_bytes_held() - held == repacked
    # ...reads its copy on the next run (same result) and frees it with the session.
    np.testing.assert_array_equal(run_bound(sess, {"A": a}, "cuda"), got)
    del sess
    gc.collect()
    assert LIB.device_bytes_held() == held


@pytest.mark.parametrize("np_dtype,elem", [(np.float16, TensorProto.FLOAT16)])
@pytest.mark.parametrize("attrs", [dict(), dict(causal=1), dict(causal=1, window_left=20, softcap=3.0)])
@pytest.mark.parametrize("heads,kv_heads,d", [(8, 2, 128), (4, 4, 80)])
def test_flash_attention_on_cuda_ep_matches_numpy(np_dtype, elem, attrs, heads, kv_heads, d):
    from test_attention import attention_np

    rng = np.random.default_rng(d)
    b, sq, sk = 2, 97, 130
    q = rng.uniform(-1, 1, (b, sq, heads, d)).astype(np_dtype)
    k = rng.uniform(-1, 1, (b, sk, kv_heads, d)).astype(np_dtype)
    v = rng.uniform(-1, 1, (b, sk, kv_heads, d)).astype(np_dtype)
    sess = dx.session(LIB_PATH, dx.attention_model(elem, heads, kv_heads, d, **attrs), CUDA, profile=True)
    o = run_bound(sess, {"Q": q, "K": k, "V": v}, "cuda")
    assert providers_of(sess)["FlashAttention"] == {CUDA}
    for i in range(b):
        want, _ = attention_np(q[i], k[i], v[i], **attrs)
        np.testing.assert_allclose(o[i].astype(np.float64), want, rtol=4e-3, atol=4e-3)


def test_flash_attention_packed_on_cuda_ep_with_lse():
    from test_attention import attention_np

    rng = np.random.default_rng(3)
    heads, kv_heads, d = 4, 2, 64
    lens_q, lens_k = [3, 100, 65], [10, 100, 200]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.standard_normal((cu_q[-1], heads, d)).astype(np.float16)
    k = rng.standard_normal((cu_k[-1], kv_heads, d)).astype(np.float16)
    v = rng.standard_normal((cu_k[-1], kv_heads, d)).astype(np.float16)
    model = dx.attention_model(TensorProto.FLOAT16, heads, kv_heads, d, packed=True, generic_lse=True, causal=1,
                               max_seqlen_q=100)
    sess = dx.session(LIB_PATH, model, CUDA)
    o, lse = sess.run(None, {"Q": q, "K": k, "V": v, "cu_q": cu_q, "cu_k": cu_k})
    for i in range(3):
        rows = slice(cu_q[i], cu_q[i + 1])
        want, want_lse = attention_np(q[rows], k[cu_k[i]:cu_k[i + 1]], v[cu_k[i]:cu_k[i + 1]], causal=1)
        np.testing.assert_allclose(o[rows].astype(np.float64), want, rtol=4e-3, atol=4e-3)
        np.testing.assert_allclose(lse[:, rows], want_lse, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("m,layout", [(1, "nk"), (16, "nk"), (40, "nk"), (1, "decode_packed"), (16, "decode_packed")])
def test_w8a8_through_dlpackkernel_on_cuda_ep_matches_cpu_ep(m, layout):
    """Per-token quantization and the W8A8 matmul (DLPackKernel, the registry's GPU kernels on
    ORT's stream) against the same model on the CPU EP: the codes are bit-exact, the f16 outputs
    one rounding apart at most (f32 epilogue on the GPU, f64 on the CPU)."""
    from test_int8_matmul import quantize_rows

    rng = np.random.default_rng(m)
    n, k = 97, 1040  # N not a multiple of 16, K not a multiple of 64
    w_q, w_scale = quantize_rows(rng.standard_normal((n, k)).astype(np.float32))
    w_given = dx.pack_w8_for_decode(w_q) if layout == "decode_packed" else w_q
    model = dx.w8a8_model(k, w_given, w_scale, TensorProto.FLOAT16, layout)
    x = rng.standard_normal((m, k)).astype(np.float16)
    (expected,) = dx.session(LIB_PATH, model).run(None, {"x": x})
    sess = dx.session(LIB_PATH, model, CUDA, profile=True)
    got = run_bound(sess, {"x": x}, "cuda")
    assert providers_of(sess)["DLPackKernel"] == {CUDA}
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=2e-3, atol=1e-6)


def test_w8a8_packed_weights_refuse_more_than_16_rows_on_cuda_ep():
    w_q = np.ones((40, 64), dtype=np.int8)
    model = dx.w8a8_model(64, dx.pack_w8_for_decode(w_q), np.ones(40, np.float32), TensorProto.FLOAT16, "decode_packed")
    sess = dx.session(LIB_PATH, model, CUDA)
    with pytest.raises(Exception, match=r"Packed decode kernel needs M <= 16"):
        run_bound(sess, {"x": np.ones((17, 64), np.float16)}, "cuda")
