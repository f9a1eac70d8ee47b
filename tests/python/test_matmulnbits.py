"""W4A16 format compatibility (CPU, CI): a MatMul model quantized by ONNX Runtime's own tool
(MatMulNBitsQuantizer) runs on dlkern by changing the node's domain to "dlkern", and agrees with
ONNX Runtime's own com.microsoft MatMulNBits on the same inputs: symmetric and asymmetric, block
sizes 16..256, K not a multiple of the block size, with and without bias, f32 and f16.
DLKERN_LIB = path of libdlkern.so."""

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern_onnx as dx  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")


def quantized_model(k, n, block_size, symmetric, elem, seed):
    rng = np.random.default_rng(seed)
    np_dtype = np.float16 if elem == TensorProto.FLOAT16 else np.float32
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np_dtype)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "W"], ["Y"], name="proj")], "g",
        [helper.make_tensor_value_info("A", elem, ["M", k])], [helper.make_tensor_value_info("Y", elem, None)],
        initializer=[numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    cfg = quantizer.DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric)
    q = quantizer.MatMulNBitsQuantizer(model, algo_config=cfg)
    q.process()
    qm = q.model.model if hasattr(q.model, "model") else q.model
    assert [nd.op_type for nd in qm.graph.node] == ["MatMulNBits"]
    return qm


def with_bias(model, n, np_dtype, seed):
    bias = np.random.default_rng(seed).standard_normal(n).astype(np_dtype)
    model.graph.initializer.append(numpy_helper.from_array(bias, "bias"))
    node = model.graph.node[0]
    while len(node.input) < 5:
        node.input.append("")  # zero_points / g_idx omitted
    node.input.append("bias")
    return model


def run(model, lib=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if lib:
        so.register_custom_ops_library(lib)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess


@pytest.mark.parametrize("elem,np_dtype", [(TensorProto.FLOAT, np.float32), (TensorProto.FLOAT16, np.float16)])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_dlkern_runs_models_quantized_by_ort(elem, np_dtype, block_size, symmetric, bias):
    k, n = 200, 48  # K not a multiple of any block size
    model = quantized_model(k, n, block_size, symmetric, elem, seed=block_size)
    if bias:
        model = with_bias(model, n, np_dtype, seed=3)
    a = np.random.default_rng(7).standard_normal((5, k)).astype(np_dtype)
    (expected,) = run(model).run(None, {"A": a})
    model.graph.node[0].domain = "dlkern"
    model.opset_import.append(helper.make_opsetid("dlkern", 1))
    (got,) = run(model, LIB_PATH).run(None, {"A": a})
    assert got.dtype == expected.dtype and got.shape == expected.shape == (5, n)
    # ORT accumulates in f32 (f16 inputs: rounded to f16 at the end); dlkern's CPU path in f64.
    tol = 2e-3 if np_dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol)


def test_dlkern_matmulnbits_errors():
    model = quantized_model(64, 16, 32, False, TensorProto.FLOAT, 1)
    model.graph.node[0].domain = "dlkern"
    model.opset_import.append(helper.make_opsetid("dlkern", 1))
    for attr in model.graph.node[0].attribute:
        if attr.name == "bits":
            attr.i = 8
    sess = run(model, LIB_PATH)
    with pytest.raises(Exception, match="bits = 8: dlkern implements bits = 4"):
        sess.run(None, {"A": np.ones((2, 64), np.float32)})
    model = quantized_model(64, 16, 32, False, TensorProto.FLOAT, 1)
    model.graph.node[0].domain = "dlkern"
    model.opset_import.append(helper.make_opsetid("dlkern", 1))
    del model.graph.node[0].attribute[:]  # no K, N, bits, block_size
    with pytest.raises(Exception, match="missing required int attribute 'K'"):
        run(model, LIB_PATH)
