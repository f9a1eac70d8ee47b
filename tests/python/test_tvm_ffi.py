"""TVM-FFI functions as dlkern kernels (issue 43, `dlkern.register_tvm_ffi`), called from ONNX
Runtime `DLPackKernel` nodes and checked against direct calls through apache-tvm-ffi's own
Python package: a library written in C (tests/c/tvm_ffi_plugin.c, compiled here with cc, CPU EP,
in CI) and one in CUDA C++ (tests/plugin/tvm_ffi_cuda.cu, compiled with nvcc on the GPU host,
CUDA EP, on ORT's stream). Errors the functions raise come back as ORT errors with their kind
and message. DLKERN_LIB = path of libdlkern.so; apache-tvm-ffi from scripts/setup.sh (or
DLKERN_TVM_FFI_DIR: its package folder)."""

import os
import shutil
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern  # noqa: E402
import dlkern_ctypes as dk  # noqa: E402
import dlkern_onnx as dx  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def tvm_ffi_dir():
    given = os.environ.get("DLKERN_TVM_FFI_DIR")
    if given:
        return given
    import tvm_ffi  # installed by scripts/setup.sh

    return os.path.dirname(tvm_ffi.__file__)


@pytest.fixture(scope="module")
def c_library(tmp_path_factory):
    tvm = tvm_ffi_dir()
    out = str(tmp_path_factory.mktemp("tvm_ffi") / "libtvm_ffi_plugin.so")
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I", f"{tvm}/include",
                    os.path.join(ROOT, "tests/c/tvm_ffi_plugin.c"), "-L", f"{tvm}/lib", "-ltvm_ffi",
                    f"-Wl,-rpath,{tvm}/lib", "-o", out], check=True)
    return out


@pytest.fixture
def registered():
    names = []

    def register(name, *args, **kwargs):
        dlkern.register_tvm_ffi(name, *args, replace=True, **kwargs)
        names.append(name)
        return name

    yield register
    for name in names:
        dlkern.unregister_kernel(name)


def node_model(function_name, inputs, elem=TensorProto.FLOAT, **attrs):
    extra = {"attribute_names": ",".join(attrs)} if attrs else {}
    node = helper.make_node("DLPackKernel", list(inputs), ["Z"], domain="dlkern", function_name=function_name,
                            **attrs, **extra)
    return dx.model([node], [dx.value(n, elem, None) for n in inputs], [dx.value("Z", elem, None)])


def direct_call(library, function, *args):
    """The function called through apache-tvm-ffi's own Python package."""
    import tvm_ffi

    return tvm_ffi.load_module(library)[function](*args)


@pytest.mark.parametrize("shape", [(1,), (7, 97), (3, 1025)])
@pytest.mark.parametrize("mode", ["add", "sub"])
def test_a_tvm_ffi_function_runs_in_an_ort_node_as_called_directly(c_library, registered, shape, mode):
    name = registered("tvm.scale_add", c_library, "scale_add", attribute_names=("alpha", "offset", "mode"))
    rng = np.random.default_rng(len(shape))
    x, y = rng.uniform(-1, 1, shape).astype(np.float32), rng.uniform(-1, 1, shape).astype(np.float32)
    sess = dx.session(LIB_PATH, node_model(name, ["X", "Y"], alpha=0.75, offset=-2, mode=mode))
    (z,) = sess.run(None, {"X": x, "Y": y})
    direct = np.empty_like(x)
    import tvm_ffi

    direct_call(c_library, "scale_add", tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(y), tvm_ffi.from_dlpack(direct),
                0.75, -2, mode)
    np.testing.assert_array_equal(z, direct)
    np.testing.assert_allclose(z, 0.75 * x + (1 if mode == "add" else -1) * y - 2, rtol=1e-6, atol=1e-6)
    # The same kernel through dlkern.call.
    np.testing.assert_array_equal(dlkern.call(name, x, y, alpha=0.75, offset=-2, mode=mode), z)


@pytest.mark.parametrize("attrs,feeds,message", [
    ({"alpha": 1.0, "offset": 0, "mode": "mul"}, None, 'ValueError: scale_add: mode must be "add" or "sub"'),
    ({"alpha": 1.0, "offset": 0}, None, "attribute 'mode' is not set"),
    ({"alpha": 1, "offset": 0, "mode": "add"}, None, "TypeError: scale_add: alpha is a float"),
    ({"alpha": 1.0, "offset": 0, "mode": "add"}, np.float16, "TypeError: scale_add: takes contiguous float32 CPU"),
])
def test_errors_are_ort_errors_with_the_functions_message(c_library, registered, attrs, feeds, message):
    name = registered("tvm.scale_add", c_library, "scale_add", attribute_names=("alpha", "offset", "mode"))
    dtype = feeds or np.float32
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    sess = dx.session(LIB_PATH, node_model(name, ["X", "Y"], elem, **attrs))
    with pytest.raises(Exception) as err:
        sess.run(None, {"X": np.ones(4, dtype), "Y": np.ones(4, dtype)})
    assert name in str(err.value) and message in str(err.value), str(err.value)


def test_registration_refusals_and_inference(c_library, registered):
    with pytest.raises(dk.DLKernError, match="no TVM-FFI function `__tvm_ffi_no_such_function`"):
        dlkern.register_tvm_ffi("tvm.nothing", c_library, "no_such_function")
    with pytest.raises(dk.DLKernError, match="cannot load"):
        dlkern.register_tvm_ffi("tvm.nothing", "/nonexistent/lib.so", "f")
    name = registered("tvm.returns_a_value", c_library, "returns_a_value")
    with pytest.raises(dk.DLKernError, match="returned a value"):
        dlkern.call(name, np.ones(3, np.float32))
    # A Python inference function sizes the outputs (here: what the function would refuse).
    name = registered("tvm.scale_add_bad_infer", c_library, "scale_add", attribute_names=("alpha", "offset", "mode"),
                      infer=lambda specs, **_: [("float32", (2,))])
    with pytest.raises(dk.DLKernError, match="x, y and out must have one shape"):
        dlkern.call(name, np.ones(3, np.float32), np.ones(3, np.float32), alpha=1.0, offset=0, mode="add")


def nvcc():
    found = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    return found if os.path.isfile(found) else None


@pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime's CUDA EP (onnxruntime-gpu)")
def test_a_cuda_tvm_ffi_function_runs_on_orts_stream(tmp_path, registered):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or nvcc() is None:
        pytest.skip("needs PyTorch with CUDA and nvcc")
    tvm = tvm_ffi_dir()
    library = str(tmp_path / "libtvm_ffi_cuda.so")
    subprocess.run([nvcc(), "-std=c++17", "-O2", "-shared", "-Xcompiler", "-fPIC", "-arch=native", "-I",
                    f"{tvm}/include", os.path.join(ROOT, "tests/plugin/tvm_ffi_cuda.cu"), "-L", f"{tvm}/lib",
                    "-ltvm_ffi", f"-Xlinker=-rpath,{tvm}/lib", "-o", library], check=True)
    name = registered("tvm.scale_add_cuda", library, "scale_add_cuda", attribute_names=("alpha",), devices=("cuda",))
    stream = torch.cuda.Stream()
    so = dlkern.session_options()
    sess = ort.InferenceSession(node_model(name, ["X", "Y"], alpha=1.5), so, providers=[
        ("CUDAExecutionProvider", {"user_compute_stream": str(stream.cuda_stream), "has_user_compute_stream": "1"})])
    rng = np.random.default_rng(3)
    x, y = rng.uniform(-1, 1, (4, 1025)).astype(np.float32), rng.uniform(-1, 1, (4, 1025)).astype(np.float32)
    (z,) = sess.run(None, {"X": x, "Y": y})
    assert direct_call(library, "last_stream") == stream.cuda_stream, "the function did not run on ORT's stream"
    xt, yt = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    direct = torch.empty_like(xt)
    direct_call(library, "scale_add_cuda", xt, yt, direct, 1.5)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(z, direct.cpu().numpy())
    # The function's own error, from a CUDA node.
    node = helper.make_node("DLPackKernel", ["X", "Y"], ["Z"], domain="dlkern", function_name=name,
                            attribute_names="alpha", alpha=1.0)
    m = dx.model([node], [dx.value(n, TensorProto.FLOAT16, None) for n in "XY"],
                 [dx.value("Z", TensorProto.FLOAT16, None)])
    bad = ort.InferenceSession(m, so, providers=["CUDAExecutionProvider"])
    with pytest.raises(Exception, match="ValueError: scale_add_cuda takes float32 CUDA tensors"):
        bad.run(None, {"X": np.ones(4, np.float16), "Y": np.ones(4, np.float16)})
