"""Python functions as dlkern kernels (issue 43, `dlkern.register_kernel`): called from an ONNX
Runtime `DLPackKernel` node and through `dlkern.call`, checked against direct calls; errors raised
by the function, wrong outputs and wrong arity surface as ORT errors with their message; the
node runs on several threads at once. CPU EP with NumPy in CI; the CUDA EP with a PyTorch
function on ORT's stream where onnxruntime-gpu and torch are installed (the GPU host).
DLKERN_LIB = path of libdlkern.so."""

import os
import sys
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern  # noqa: E402
import dlkern_onnx as dx  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def node_model(function_name, inputs, outputs=("Z",), elem=TensorProto.FLOAT, **attrs):
    names = ",".join(attrs)
    extra = {"attribute_names": names} if names else {}
    node = helper.make_node("DLPackKernel", list(inputs), list(outputs), domain="dlkern",
                            function_name=function_name, **attrs, **extra)
    return dx.model([node], [dx.value(n, elem, None) for n in inputs], [dx.value(n, elem, None) for n in outputs])


@pytest.fixture
def kernels():
    """Registers the kernels a test asks for and unregisters them after it."""
    names = set()

    def register(name, fn, **kwargs):
        dlkern.register_kernel(name, fn, replace=True, **kwargs)
        names.add(name)
        return name

    yield register
    for name in names:
        dlkern.unregister_kernel(name)


def scaled_sum(x, y, alpha=1.0):
    return x + np.float32(alpha) * y


def test_a_python_function_runs_in_an_ort_node_as_called_directly(kernels):
    name = kernels("py.scaled_sum", scaled_sum)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, (3, 7)).astype(np.float32), rng.uniform(-1, 1, (3, 7)).astype(np.float32)
    sess = dx.session(LIB_PATH, node_model(name, ["X", "Y"], alpha=0.25))
    (z,) = sess.run(None, {"X": x, "Y": y})
    np.testing.assert_array_equal(z, scaled_sum(x, y, 0.25))
    np.testing.assert_array_equal(dlkern.call(name, x, y, alpha=0.25), z)


def test_inference_outputs_and_written_outputs(kernels):
    """Two outputs of other shapes and dtypes from `infer`; the function writes them in place."""
    def infer(specs, **_):
        (x,) = specs
        return [("float32", x.shape[:-1] + (1,)), ("int64", x.shape[:-1])]

    def stats(x, total, argmax):
        np.sum(x, axis=-1, keepdims=True, out=total)
        argmax[...] = np.argmax(x, axis=-1)

    name = kernels("py.stats", stats, num_outputs=2, infer=infer, writes_outputs=True)
    x = np.random.default_rng(1).uniform(-1, 1, (2, 5, 97)).astype(np.float32)
    node = helper.make_node("DLPackKernel", ["X"], ["T", "A"], domain="dlkern", function_name=name)
    m = dx.model([node], [dx.value("X", TensorProto.FLOAT, ["b", 5, 97])],
                 [dx.value("T", TensorProto.FLOAT, None), dx.value("A", TensorProto.INT64, None)])
    total, argmax = dx.session(LIB_PATH, m).run(None, {"X": x})
    np.testing.assert_allclose(total, x.sum(-1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(argmax, x.argmax(-1))


def test_strided_and_offset_inputs_are_viewed_in_place(kernels):
    seen = {}

    def identity(x):
        seen["base"] = x.__array_interface__["data"][0]
        return x.copy()

    name = kernels("py.identity", identity)
    block = np.arange(40, dtype=np.float32).reshape(5, 8)
    view = block[1:4, ::2]
    np.testing.assert_array_equal(dlkern.call(name, view), view)
    assert seen["base"] == view.__array_interface__["data"][0], "the input was copied"


@pytest.mark.parametrize("fn,message", [
    (lambda x: (_ for _ in ()).throw(ValueError("the plug-in says no")), "ValueError: the plug-in says no"),
    (lambda x: x.astype(np.float64), "output 0: returned float64 (4,), the call's output is float32 (4,)"),
    (lambda x: x[:2], "output 0: returned float32 (2,)"),
    (lambda x, y: x + y, "missing 1 required positional argument"),
    (lambda x: (x, x), "returned 2 outputs, the call has 1"),
])
def test_a_failing_python_kernel_is_an_ort_error_with_its_message(kernels, fn, message):
    name = kernels("py.fails", fn)
    sess = dx.session(LIB_PATH, node_model(name, ["X"]))
    with pytest.raises(Exception) as err:
        sess.run(None, {"X": np.ones(4, np.float32)})
    assert "py.fails" in str(err.value) and message in str(err.value), str(err.value)
    # The session runs on once the kernel is fixed.
    kernels("py.fails", lambda x: x * 2)
    np.testing.assert_array_equal(sess.run(None, {"X": np.ones(4, np.float32)})[0], np.full(4, 2, np.float32))


def test_a_failing_inference_and_an_unregistered_kernel_are_errors(kernels):
    name = kernels("py.bad_infer", lambda x: x, infer=lambda specs: [("complex64", (1,))])
    with pytest.raises(Exception, match="complex64"):
        dx.session(LIB_PATH, node_model(name, ["X"])).run(None, {"X": np.ones(3, np.float32)})
    with pytest.raises(Exception, match="py.gone"):
        dx.session(LIB_PATH, node_model("py.gone", ["X"])).run(None, {"X": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match="devices"):
        dlkern.register_kernel("py.nowhere", lambda x: x, devices=("tpu",))


def test_a_python_kernel_serves_several_threads_at_once(kernels):
    name = kernels("py.scaled_sum", scaled_sum)
    sessions = [dx.session(LIB_PATH, node_model(name, ["X", "Y"], alpha=2.0)) for _ in range(2)]
    errors, start = [], threading.Barrier(6)

    def work(t):
        try:
            start.wait()
            for k in range(100):
                x = np.full((2, 3), t + k, np.float32)
                (z,) = sessions[t % 2].run(None, {"X": x, "Y": np.ones((2, 3), np.float32)})
                assert np.array_equal(z, x + 2), (t, k)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads) and not errors, errors


@pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime's CUDA EP (onnxruntime-gpu)")
def test_a_torch_function_runs_in_a_cuda_node_on_orts_stream(kernels):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs PyTorch with CUDA")
    streams = []

    def gelu_mul(x, y):
        streams.append(torch.cuda.current_stream().cuda_stream)
        return torch.nn.functional.gelu(x) * y

    name = kernels("py.gelu_mul", gelu_mul)
    sess = ort.InferenceSession(node_model(name, ["X", "Y"], elem=TensorProto.FLOAT16), dlkern.session_options(),
                                providers=["CUDAExecutionProvider"])
    rng = np.random.default_rng(2)
    x, y = rng.uniform(-2, 2, (4, 1025)).astype(np.float16), rng.uniform(-2, 2, (4, 1025)).astype(np.float16)
    (z,) = sess.run(None, {"X": x, "Y": y})
    want = gelu_mul(torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()).cpu().numpy()
    np.testing.assert_allclose(z.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
    assert streams[0] not in (0, torch.cuda.default_stream().cuda_stream), "the kernel ran on torch's stream"
