"""Serving reliability (issue 44), beside the fuzz and threads tests: a long decode run with the
process's memory sampled (python/dlkern_soak.py), ORT's arena exhausted under `gpu_mem_limit`,
dlkern's own workspace allocation failing on a full device, and every op on the device ORT gives
it. The long run runs on the CPU EP in CI (4,000 steps) and on the CUDA EP on the GPU host
(20,000); the rest need the CUDA EP (onnxruntime-gpu), the workspace test PyTorch too.
DLKERN_LIB = path of libdlkern.so; DLKERN_SOAK_STEPS overrides the long run's steps;
DLKERN_SOAK_REPORT, when set, is a file each long run appends its summary to (one JSON line)."""

import json
import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern_onnx as dx  # noqa: E402
import dlkern_soak as soak  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime's CUDA EP (onnxruntime-gpu)")


def cuda_devices():
    """Ordinals of the visible GPUs (nvidia-smi's count; one where it cannot tell)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return [0]
    return list(range(max(1, sum(line.startswith("GPU ") for line in out.splitlines()))))


@pytest.mark.parametrize("provider", ["cpu"] + (["cuda"] if HAS_CUDA else []))
def test_long_decode_run_repeats_its_results_and_keeps_memory_flat(provider):
    """In a process of its own: what other tests leave behind (threads, sessions, garbage) must
    not count as this run's memory."""
    import subprocess

    steps = int(os.environ.get("DLKERN_SOAK_STEPS", 20000 if provider == "cuda" else 4000))
    script = os.path.join(os.path.dirname(__file__), "..", "..", "python", "dlkern_soak.py")
    done = subprocess.run([sys.executable, script, "--lib", LIB_PATH, "--provider", provider, "--steps", str(steps)],
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the soak printed no summary (exit {done.returncode}):\n{done.stderr[-3000:]}"
    summary = json.loads(lines[-1])
    report = os.environ.get("DLKERN_SOAK_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(lines[-1] + "\n")
    assert not summary["mismatches"], summary["mismatches"]
    assert summary["rss_growth"] <= soak.RSS_TOLERANCE, summary
    assert summary["device_growth"] <= soak.DEVICE_TOLERANCE, summary
    assert done.returncode == 0, summary


def matmul_session(k, n, provider_options=None):
    """One dlkern MatMulNBits node (block 32, symmetric, f16) on the CUDA EP: A [M, K] -> Y [M, N]."""
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
    scales = rng.uniform(0.002, 0.01, (n, k // 32)).astype(np.float16)
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="dlkern", K=k, N=n, bits=4,
                            block_size=32)
    model = dx.model([node], [dx.value("A", TensorProto.FLOAT16, ["M", k])],
                     [dx.value("Y", TensorProto.FLOAT16, ["M", n])],
                     [numpy_helper.from_array(codes, "B"), numpy_helper.from_array(scales, "scales")])
    return dx.session(LIB_PATH, model, "CUDAExecutionProvider", provider_options=provider_options)


def trim_driver_pool(device=0):
    """Hands the unused memory of the device's default pool (where dlkern's workspaces come from,
    and which dlkern keeps from shrinking between calls) back to the device."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    pool = ctypes.c_void_p()
    assert cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), ctypes.c_int(device)) == 0
    assert cuda.cuMemPoolTrimTo(pool, ctypes.c_size_t(0)) == 0


def activations(m, k, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (m, k)).astype(np.float16)


@needs_cuda
def test_exhausted_gpu_mem_limit_is_an_error_and_the_session_recovers():
    """ORT's arena capped at 96 MiB: an output of 256 MiB cannot be allocated; the node says so
    (ORT's allocation error passed on, no crash), and the next small run works as before."""
    k, n = 32, 65536
    sess = matmul_session(k, n, {"gpu_mem_limit": str(96 << 20), "arena_extend_strategy": "kSameAsRequested"})
    small = activations(3, k)
    want = sess.run(None, {"A": small})[0]
    with pytest.raises(Exception) as err:
        sess.run(None, {"A": activations(2048, k)})
    message = str(err.value)
    assert "dlkern MatMulNBits" in message and "BFCArena" in message, message
    for _ in range(3):
        assert np.array_equal(sess.run(None, {"A": small})[0], want)


@needs_cuda
def test_workspace_allocation_failure_is_an_error_and_the_session_recovers():
    """dlkern's workspaces come from the CUDA driver's stream-ordered pool, not ORT's arena (see
    docs/ops.md, "Device memory"). With the pool trimmed and the device filled by PyTorch,
    MatMulNBits at M = 4096 cannot get its 72 MiB (permuted activations and split sums): the run
    fails with the driver's out-of-memory error; once the memory is free again the same binding
    gives the first result."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    k, n, m = 8192, 128, 4096
    sess = matmul_session(k, n)
    a = ort.OrtValue.ortvalue_from_numpy(activations(m, k), "cuda", 0)
    y = ort.OrtValue.ortvalue_from_shape_and_type((m, n), np.float16, "cuda", 0)
    io = sess.io_binding()
    io.bind_ortvalue_input("A", a)
    io.bind_ortvalue_output("Y", y)
    sess.run_with_iobinding(io)
    want = y.numpy().copy()
    # The pool keeps the workspace it gave (dlkern sets no release threshold): give it back, so
    # that the filled device leaves the next call nothing.
    torch.cuda.synchronize()
    trim_driver_pool()
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(free - (16 << 20), dtype=torch.uint8, device="cuda")
    try:
        with pytest.raises(Exception) as err:
            sess.run_with_iobinding(io)
        assert "out of memory" in str(err.value).lower(), str(err.value)
    finally:
        del hog
        torch.cuda.empty_cache()
    for _ in range(3):
        sess.run_with_iobinding(io)
        assert np.array_equal(y.numpy(), want)


@needs_cuda
@pytest.mark.parametrize("device_id", cuda_devices())
def test_every_op_runs_on_the_device_ort_gives_it(device_id):
    """The decode layer (norms, MatMulNBits, GroupQueryAttention with its cache in place) on
    CUDA device `device_id`, caches and activations there: its outputs are those of the CPU EP
    and repeat exactly cycle after cycle. On a one-GPU host this is device 0; on a host with
    more, every device in turn."""
    steps = soak.CACHE + 64
    on_gpu = soak.run(LIB_PATH, "cuda", steps, device_id=device_id)
    on_cpu = soak.run(LIB_PATH, "cpu", soak.CACHE)
    assert not on_gpu["mismatches"], on_gpu["mismatches"]
    np.testing.assert_allclose(on_gpu["first_cycle"].astype(np.float32), on_cpu["first_cycle"].astype(np.float32),
                               rtol=2e-2, atol=2e-2)
