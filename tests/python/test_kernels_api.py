"""dlkern.call / dlkern.kernel on NumPy arrays (CI) and torch CUDA tensors (the GPU host), and
dlkern.session_options with ONNX Runtime: outputs allocated from each kernel's inference, errors
as DLKernError with dlkern's message. DLKERN_LIB = path of libdlkern.so."""

import gc
import os
import sys
import weakref

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern  # noqa: E402
import dlkern_ctypes as dk  # noqa: E402
import dlkern_onnx as dx  # noqa: E402


def rmsnorm_ref(x, w, eps):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


def test_library_path_is_the_one_the_tests_load():
    assert dlkern.get_library_path() == os.path.abspath(os.environ["DLKERN_LIB"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(1, 1), (7, 97), (2, 3, 1025)])
def test_call_allocates_outputs_from_inference(dtype, shape):
    rng = np.random.default_rng(1)
    x = rng.uniform(-2, 2, shape).astype(dtype)
    w = rng.uniform(0.5, 1.5, shape[-1]).astype(dtype)
    y = dlkern.call("dlkern.rmsnorm", x, w, epsilon=1e-6)
    assert isinstance(y, np.ndarray) and y.shape == shape and y.dtype == dtype
    np.testing.assert_allclose(y.astype(np.float64), rmsnorm_ref(x, w, 1e-6), rtol=2 * np.finfo(dtype).eps, atol=1e-7)
    # The same kernel as a function.
    rmsnorm = dlkern.kernel("dlkern.rmsnorm")
    np.testing.assert_array_equal(rmsnorm(x, w, epsilon=1e-6), y)


def test_call_with_two_outputs_of_other_dtypes():
    x = np.random.default_rng(2).uniform(-3, 3, (5, 64)).astype(np.float32)
    q, scales = dlkern.call("dlkern.quantize_per_token", x, num_outputs=2)
    assert q.dtype == np.int8 and q.shape == (5, 64) and scales.dtype == np.float32 and scales.shape == (5,)
    np.testing.assert_allclose(q * scales[:, None], x, atol=float(scales.max()))


def w4_inputs(rng, m, n, k, block, lib):
    """MatMulNBits inputs (A, B packed 4-bit, scales) for `lib` (numpy or torch)."""
    blocks = -(-k // block)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.05, (n, blocks)).astype(np.float16)
    if lib == "numpy":
        return a, b, scales
    import torch

    return tuple(torch.from_numpy(t).cuda() for t in (a, b, scales))


def test_a_kernel_handle_with_constant_inputs_calls_through_a_site():
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (3, 97)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, 97).astype(np.float32)
    rmsnorm = dlkern.kernel("dlkern.rmsnorm", constant_inputs=(1,))
    for _ in range(3):
        np.testing.assert_array_equal(rmsnorm(x, w, epsilon=1e-6), dlkern.call("dlkern.rmsnorm", x, w, epsilon=1e-6))
    a, b, scales = w4_inputs(rng, 1, 16, 97, 32, "numpy")
    attrs = dict(K=97, N=16, bits=4, block_size=32)
    matmul = dlkern.kernel("dlkern.matmul_nbits", constant_inputs=(1, 2))
    np.testing.assert_array_equal(matmul(a, b, scales, **attrs), dlkern.call("dlkern.matmul_nbits", a, b, scales, **attrs))
    with pytest.raises(ValueError, match="positions 0 to 63"):
        dlkern.kernel("dlkern.rmsnorm", constant_inputs=(64,))


def test_a_kernel_handle_keeps_repacked_cuda_weights_at_its_site():
    """On CUDA, dlkern.matmul_nbits keeps its weights repacked at the handle's site (its fast
    decode path) and gives what a call without a site gives, through torch's exchange table."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    rng = np.random.default_rng(6)
    for m, n, k in [(1, 4096, 4096), (4, 97, 1025), (1, 7, 64)]:
        a, b, scales = w4_inputs(rng, m, n, k, 32, "torch")
        attrs = dict(K=k, N=n, bits=4, block_size=32)
        # f64 reference: codes low nibble first, symmetric (zero point 8), K padded to the block.
        codes = torch.stack((b & 15, b >> 4), dim=-1).reshape(n, -1)[:, :k].double()
        weight = (codes - 8) * scales.double().repeat_interleave(32, dim=1)[:, :k]
        want = a.double() @ weight.T
        # The two paths accumulate in other orders: each within a few f16 roundings of the
        # output's scale.
        atol = 2e-3 * want.abs().max().item()
        plain = dlkern.call("dlkern.matmul_nbits", a, b, scales, **attrs)
        torch.testing.assert_close(plain.double(), want, rtol=2e-3, atol=atol)
        matmul = dlkern.kernel("dlkern.matmul_nbits", constant_inputs=(1, 2))
        for _ in range(3):
            torch.testing.assert_close(matmul(a, b, scales, **attrs).double(), want, rtol=2e-3, atol=atol)
        del matmul
        gc.collect()


def test_errors_carry_dlkerns_message():
    x = np.ones((2, 8), np.float32)
    with pytest.raises(dk.DLKernError, match=r"shape \[7\] \(expected \[8\]\)"):
        dlkern.call("dlkern.rmsnorm", x, np.ones(7, np.float32))
    with pytest.raises(dk.DLKernError, match="no kernel named"):
        dlkern.call("dlkern.no_such_kernel", x)


def test_session_options_register_the_library_with_ort():
    import onnxruntime as ort

    from onnx import TensorProto

    sess = ort.InferenceSession(dx.rmsnorm_model(TensorProto.FLOAT, 16, 1e-6), dlkern.session_options(),
                                providers=["CPUExecutionProvider"])
    x = np.random.default_rng(3).uniform(-1, 1, (2, 3, 16)).astype(np.float32)
    w = np.ones(16, np.float32)
    (y,) = sess.run(None, {"X": x, "scale": w})
    np.testing.assert_allclose(y, dlkern.call("dlkern.rmsnorm", x, w, epsilon=1e-6), rtol=1e-6)


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange-table", "dlpack"])
def test_call_on_torch_cuda_tensors_uses_the_current_stream(exchange):
    """Ordered after the current stream's work: a side stream sleeps, then fills the input; a
    kernel enqueued anywhere else would read the zeros it held before."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")
    if exchange and dk.exchange_table(torch.Tensor) is None:
        pytest.skip(f"torch {torch.__version__} publishes no DLPack C exchange table")
    x = torch.randn(16, 4096, device="cuda", dtype=torch.float16)
    w = torch.rand(4096, device="cuda", dtype=torch.float16) + 0.5
    filled = torch.zeros_like(x)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    dlkern.kernels.USE_EXCHANGE_TABLES = exchange
    try:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(50_000_000)
            filled.copy_(x)
            y = dlkern.call("dlkern.rmsnorm", filled, w, epsilon=1e-6)
    finally:
        dlkern.kernels.USE_EXCHANGE_TABLES = True
    stream.synchronize()
    assert y.is_cuda and y.dtype == torch.float16 and y.shape == x.shape
    want = torch.nn.functional.rms_norm(x.float(), (4096,), w.float(), eps=1e-6)
    torch.testing.assert_close(y.float(), want, rtol=2e-3, atol=2e-3)


def test_torch_tensors_through_the_exchange_table():
    """torch >= 2.10 publishes DLPack's C exchange table: outputs are torch tensors from its
    allocator, on the inputs' device, with no reference left behind, bit-equal to the
    __dlpack__ path, on CPU and CUDA, with one and two outputs."""
    torch = pytest.importorskip("torch")
    if dk.exchange_table(torch.Tensor) is None:
        pytest.skip(f"torch {torch.__version__} publishes no DLPack C exchange table")
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        x = torch.randn(7, 97, device=device, dtype=torch.float32)
        w = torch.rand(97, device=device, dtype=torch.float32) + 0.5
        y = dlkern.call("dlkern.rmsnorm", x, w, epsilon=1e-6)
        assert type(y) is torch.Tensor and y.device == x.device
        dlkern.kernels.USE_EXCHANGE_TABLES = False
        try:
            slow = dlkern.call("dlkern.rmsnorm", x, w, epsilon=1e-6)
        finally:
            dlkern.kernels.USE_EXCHANGE_TABLES = True
        assert torch.equal(y, slow)
        # A parameter is a tensor subclass with the same table.
        y_param = dlkern.call("dlkern.rmsnorm", x, torch.nn.Parameter(w), epsilon=1e-6)
        assert torch.equal(y_param, y)
        # dlkern kept no reference: the output dies with the caller's last one.
        alive = weakref.ref(y)
        del y
        gc.collect()
        assert alive() is None, "dlkern.call left a reference to its output behind"
    x = torch.randn(5, 64)
    q, scales = dlkern.call("dlkern.quantize_per_token", x, num_outputs=2)
    assert q.dtype == torch.int8 and scales.shape == (5,)
    torch.testing.assert_close(q.float() * scales[:, None], x, atol=float(scales.max()), rtol=0)
    with pytest.raises(dk.DLKernError, match=r"shape \[7\] \(expected \[8\]\)"):
        dlkern.call("dlkern.rmsnorm", torch.ones(2, 8), torch.ones(7))
