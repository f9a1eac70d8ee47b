"""The C ABI from Python with NumPy as the third-party DLPack producer (CPU; runs in CI).
Usage: python -m pytest tests/python/test_numpy_dlpack.py  (DLKERN_LIB = path of libdlkern.so)"""

import ctypes
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern_ctypes as dk  # noqa: E402

LIB = dk.Library(os.environ["DLKERN_LIB"])


def rmsnorm_ref(x, w, eps):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps) * w.astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(1, 1), (3, 97), (2, 5, 80), (1025,)])
def test_rmsnorm_on_numpy_arrays(dtype, shape):
    rng = np.random.default_rng(7)
    x = rng.uniform(-3, 3, size=shape).astype(dtype)
    w = rng.uniform(-1, 1, size=shape[-1]).astype(dtype)
    y = np.full(shape, np.nan, dtype=dtype)
    LIB.call("dlkern.rmsnorm", [x, w], [y], epsilon=1e-6)
    # One rounding to the storage type (the CPU kernel computes in f64 like the reference).
    rtol = 2 * np.finfo(dtype).eps
    np.testing.assert_allclose(y.astype(np.float64), rmsnorm_ref(x, w, 1e-6), rtol=rtol, atol=1e-7)


def test_versioned_capsules_are_accepted():
    x = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    w = np.ones(4, dtype=np.float32)
    y = np.zeros_like(x)
    try:
        LIB.call("dlkern.rmsnorm", [x, w], [y], versioned=True, epsilon=0.0)
    except TypeError:
        pytest.skip("this NumPy exports only legacy DLPack capsules")
    np.testing.assert_allclose(y, rmsnorm_ref(x, w, 0.0), rtol=1e-6)


def test_inference_and_listing():
    assert "dlkern.rmsnorm" in LIB.kernels()
    x = np.zeros((4, 6), dtype=np.float16)
    w = np.zeros(6, dtype=np.float16)
    assert LIB.infer("dlkern.rmsnorm", [x, w], 1) == [(2, 16, (4, 6))]


def test_errors_reach_python_with_their_message():
    x = np.zeros((4, 6), dtype=np.float32)
    with pytest.raises(dk.DLKernError, match="did you mean dlkern.rmsnorm"):
        LIB.call("dlkern.rmsnrom", [x, np.zeros(6, np.float32)], [np.zeros_like(x)])
    with pytest.raises(dk.DLKernError, match=r"tensor 'weight': shape \[5\] \(expected \[6\]\)"):
        LIB.call("dlkern.rmsnorm", [x, np.zeros(5, np.float32)], [np.zeros_like(x)])
    with pytest.raises(dk.DLKernError, match="tensor 'x': unsupported dtype .*bits: 64"):
        LIB.call("dlkern.rmsnorm", [x.astype(np.float64), np.zeros(6)], [np.zeros((4, 6))])
    with pytest.raises(dk.DLKernError, match="tensor 'x': dtype i32 \\(expected f32 or f16 or bf16\\)"):
        LIB.call("dlkern.rmsnorm", [x.astype(np.int32), np.zeros(6, np.int32)], [np.zeros((4, 6), np.int32)])
    # A non-contiguous (transposed) input.
    with pytest.raises(dk.DLKernError, match="last axis must be contiguous"):
        LIB.call("dlkern.rmsnorm", [np.zeros((6, 4), np.float32).T, np.zeros(6, np.float32)], [np.zeros_like(x)])
    # Hand-made malformed tensors: null data, null shape, wrong device.
    _, good = dk.borrow(x)
    for field, value, message in [
        ("data", None, "data is a null pointer"),
        ("shape", None, "shape is a null pointer"),
        ("device", dk.DLDevice(4, 0), "unsupported device type 4"),
    ]:
        bad = dk.DLTensor.from_buffer_copy(good)
        setattr(bad, field, value)
        with pytest.raises(dk.DLKernError, match=message):
            LIB.call_raw("dlkern.rmsnorm", [bad, good, good], 2, 1)
    with pytest.raises(dk.DLKernError, match="epsilon"):
        LIB.call("dlkern.rmsnorm", [x, np.zeros(6, np.float32)], [np.zeros_like(x)], epsilon="tiny")
    assert ctypes.sizeof(dk.DLTensor) == 48
