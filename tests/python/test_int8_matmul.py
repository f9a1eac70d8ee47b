"""W8A8 pieces on ONNX Runtime's CPU EP (CI): dlkern's MatMulIntegerToFloat against ORT's own
com.microsoft MatMulIntegerToFloat (int8 A and B, scalar or per-column scales and zero points,
bias, f32/f16), and per-token quantization + W8A8 matmul chained through DLPackKernel (two
heterogeneous outputs) against NumPy. DLKERN_LIB = path of libdlkern.so."""

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern_onnx as dx  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])


def itf_model(domain, elem, m, k, n, per_column, zero_points, bias, seed):
    rng = np.random.default_rng(seed)
    np_dtype = np.float16 if elem == TensorProto.FLOAT16 else np.float32
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    b_scale = (rng.uniform(0.001, 0.02, n) if per_column else np.array(0.01)).astype(np_dtype)
    a_scale = np.array(0.02, dtype=np_dtype)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(a_scale, "a_scale"), numpy_helper.from_array(b_scale, "b_scale")]
    inputs = ["A", "B", "a_scale", "b_scale"]
    if zero_points or bias:
        inputs += ["a_zp", "b_zp"] if zero_points else ["", ""]
    if zero_points:
        inits.append(numpy_helper.from_array(np.array(3, dtype=np.int8), "a_zp"))
        inits.append(numpy_helper.from_array(rng.integers(-5, 6, n, dtype=np.int8), "b_zp"))
    if bias:
        inputs.append("bias")
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np_dtype), "bias"))
    node = helper.make_node("MatMulIntegerToFloat", inputs, ["Y"], domain=domain, name="mm")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.INT8, ["M", k])],
                              [helper.make_tensor_value_info("Y", elem, None)], initializer=inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("dlkern", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    return model.SerializeToString()


def session(model, lib=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if lib:
        so.register_custom_ops_library(lib)
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("elem,np_dtype", [(TensorProto.FLOAT, np.float32), (TensorProto.FLOAT16, np.float16)])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_ort_matmul_integer_to_float(elem, np_dtype, per_column, zero_points, bias):
    m, k, n = 5, 70, 24  # K not a multiple of 32
    a = np.random.default_rng(1).integers(-128, 128, (m, k), dtype=np.int8)
    a[0, :] = -128  # extremes
    args = (elem, m, k, n, per_column, zero_points, bias, 9)
    (expected,) = session(itf_model("com.microsoft", *args)).run(None, {"A": a})
    (got,) = session(itf_model("dlkern", *args), LIB_PATH).run(None, {"A": a})
    assert got.dtype == expected.dtype and got.shape == expected.shape == (m, n)
    tol = 2e-3 if np_dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol * np.abs(expected).max())


def test_an_empty_b_of_huge_n_is_no_huge_allocation():
    """Found by the fuzz campaign (seed 7, case 28340): B [0, 2^40 + 1] with scalar scales gives
    an empty Y, which the kernel must produce without spreading the scalars over N values (an
    allocation of 8 TB that aborted the process)."""
    import onnxruntime as ort

    n = (1 << 40) + 1
    node = helper.make_node("MatMulIntegerToFloat", ["A", "B", "a_scale", "b_scale"], ["Y"], domain="dlkern")
    ins = [helper.make_tensor_value_info("A", TensorProto.INT8, [0, 0]),
           helper.make_tensor_value_info("B", TensorProto.INT8, [0, n]),
           helper.make_tensor_value_info("a_scale", TensorProto.FLOAT, [1]),
           helper.make_tensor_value_info("b_scale", TensorProto.FLOAT, [1])]
    graph = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dlkern", 1)])
    model.ir_version = 9
    sess = session(model.SerializeToString(), LIB_PATH)
    io = sess.io_binding()  # (numpy cannot make the [0, 2^40 + 1] output array)
    feeds = {"A": np.zeros((0, 0), np.int8), "B": np.zeros((0, n), np.int8),
             "a_scale": np.array([0.5], np.float32), "b_scale": np.array([0.25], np.float32)}
    for name, value in feeds.items():
        io.bind_cpu_input(name, value)
    io.bind_output("Y", "cpu")
    sess.run_with_iobinding(io)
    assert io.get_outputs()[0].shape() == [0, n]
    assert isinstance(io.get_outputs()[0], ort.OrtValue)


def quantize_rows(x):
    scale = np.abs(x).max(axis=-1) / 127.0
    safe = np.where(scale > 0, scale, 1.0)
    q = np.where(scale[..., None] > 0, np.clip(np.round(x / safe[..., None]), -127, 127), 0).astype(np.int8)
    return q, scale.astype(np.float32)


def test_per_token_w8a8_through_dlpackkernel():
    rng = np.random.default_rng(4)
    m, k, n = 6, 97, 40
    w = rng.standard_normal((n, k)).astype(np.float32)
    w_q, w_scale = quantize_rows(w)
    nodes = [
        helper.make_node("DLPackKernel", ["x"], ["x_q", "x_scale"], domain="dlkern", name="quant", function_name="dlkern.quantize_per_token"),
        helper.make_node("DLPackKernel", ["x_q", "x_scale", "w_q", "w_scale"], ["y"], domain="dlkern", name="mm",
                         function_name="dlkern.matmul_w8a8", out_dtype="f32", attribute_names="out_dtype"),
    ]
    inits = [numpy_helper.from_array(w_q, "w_q"), numpy_helper.from_array(w_scale, "w_scale")]
    model = dx.model(nodes, [dx.value("x", TensorProto.FLOAT, ["m", k])],
                     [dx.value("y", TensorProto.FLOAT, None), dx.value("x_q", TensorProto.INT8, None)], inits)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[1] = 0.0  # a zero row: scale 0, codes 0
    y, x_q = session(model, LIB_PATH).run(None, {"x": x})
    q_ref, s_ref = quantize_rows(x)
    np.testing.assert_array_equal(x_q, q_ref)
    acc = q_ref.astype(np.int64) @ w_q.astype(np.int64).T  # exact
    y_ref = acc * s_ref[:, None].astype(np.float64) * w_scale[None, :].astype(np.float64)
    np.testing.assert_allclose(y, y_ref, rtol=1e-6, atol=1e-6)
    assert np.all(y[1] == 0)
    # And it approximates the float matmul to int8 accuracy.
    assert np.abs(y - x @ w.T).max() < 0.05 * np.abs(x @ w.T).max()


@pytest.mark.parametrize("m,n,k", [(1, 40, 97), (16, 33, 1040), (20, 17, 80)])
def test_packed_weights_give_the_same_result_on_cpu(m, n, k):
    rng = np.random.default_rng(m + n + k)
    w_q, w_scale = quantize_rows(rng.standard_normal((n, k)).astype(np.float32))
    packed = dx.pack_w8_for_decode(w_q)
    assert packed.shape == (-(-n // 16) * 16, -(-k // 64) * 64)
    # Tile (row // 16, column // 64) is contiguous; inside it, row-major 16 x 64.
    flat = packed.reshape(-1)
    r, c = n - 1, k - 1
    assert flat[((r // 16 * (packed.shape[1] // 64) + c // 64) * 16 + r % 16) * 64 + c % 64] == w_q[r, c]
    x = rng.standard_normal((m, k)).astype(np.float32)
    (plain,) = session(dx.w8a8_model(k, w_q, w_scale, TensorProto.FLOAT), LIB_PATH).run(None, {"x": x})
    (got,) = session(dx.w8a8_model(k, packed, w_scale, TensorProto.FLOAT, "decode_packed"), LIB_PATH).run(None, {"x": x})
    np.testing.assert_array_equal(got, plain)


def test_packed_weights_of_the_wrong_shape_are_refused():
    w_q = np.ones((40, 97), dtype=np.int8)
    bad = session(dx.w8a8_model(97, w_q, np.ones(40, np.float32), TensorProto.FLOAT, "decode_packed"), LIB_PATH)
    with pytest.raises(Exception, match=r"w_q.*expected \[48, 128\]: decode_packed for N = 40, K = 97"):
        bad.run(None, {"x": np.ones((2, 97), np.float32)})
