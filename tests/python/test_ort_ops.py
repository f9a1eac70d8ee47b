"""libdlkern.so as an ONNX Runtime custom-op library on the CPU execution provider (runs in CI
with onnxruntime from PyPI): every op against NumPy, the generic op with registry kernels, and
every error case. DLKERN_LIB = path of libdlkern.so."""

import ctypes
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern_ctypes as dk  # noqa: E402
import dlkern_onnx as dx  # noqa: E402

LIB_PATH = os.path.abspath(os.environ["DLKERN_LIB"])
LIB = dk.Library(LIB_PATH)  # the same loaded library ORT will use: one registry
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def rmsnorm_ref(x, w, eps):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("np_dtype,elem", [(np.float32, TensorProto.FLOAT), (np.float16, TensorProto.FLOAT16)])
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 97), (1, 5, 80), (1, 2, 1025)])
def test_rmsnorm_on_cpu_ep(generic, np_dtype, elem, shape):
    rng = np.random.default_rng(3)
    x = rng.uniform(-3, 3, shape).astype(np_dtype)
    w = rng.uniform(-1, 1, shape[-1]).astype(np_dtype)
    sess = dx.session(LIB_PATH, dx.rmsnorm_model(elem, shape[-1], 1e-6, generic))
    (y,) = sess.run(None, {"X": x, "scale": w})
    assert y.dtype == np_dtype and y.shape == shape
    np.testing.assert_allclose(y.astype(np.float64), rmsnorm_ref(x, w, 1e-6), rtol=2 * np.finfo(np_dtype).eps, atol=1e-7)


def test_typed_op_keeps_symbolic_dims_and_default_epsilon():
    node = helper.make_node("RMSNorm", ["X", "scale"], ["Y"], domain="dlkern")
    m = dx.model([node], [dx.value("X", TensorProto.FLOAT, ["n", 4]), dx.value("scale", TensorProto.FLOAT, [4])],
                 [dx.value("Y", TensorProto.FLOAT, None)])
    sess = dx.session(LIB_PATH, m)
    assert sess.get_outputs()[0].shape == ["n", 4]
    x = np.array([[1, 2, 3, 4]], np.float32)
    (y,) = sess.run(None, {"X": x, "scale": np.ones(4, np.float32)})
    np.testing.assert_allclose(y, rmsnorm_ref(x, np.ones(4), 1e-5), rtol=1e-6)


# A kernel registered through the C ABI from Python (ctypes callbacks): y = 2x + 1, with inference.
COMPUTE, INFER, KernelDef = dk.COMPUTE_FN, dk.INFER_FN, dk.KernelDef


def _as_array(t):
    n = int(np.prod([t.shape[i] for i in range(t.ndim)]))
    buf = (ctypes.c_float * n).from_address(t.data + t.byte_offset)
    return np.frombuffer(buf, dtype=np.float32, count=n)


@COMPUTE
def affine_compute(tensors, n_in, n_out, name, stream, attrs, n_attrs, user, err, err_len):
    _as_array(tensors[1])[:] = 2.0 * _as_array(tensors[0]) + 1.0
    return 0


@INFER
def affine_infer(inputs, n_in, outputs, n_out, name, attrs, n_attrs, user, err, err_len):
    outputs[0].ndim = inputs[0].ndim
    outputs[0].dtype = inputs[0].dtype
    for i in range(inputs[0].ndim):
        outputs[0].shape[i] = inputs[0].shape[i]
    return 0


@pytest.fixture(scope="module")
def affine_kernel():
    d = KernelDef(ctypes.sizeof(KernelDef), b"py.affine", affine_compute, affine_infer, 1 << 1, 1, None, dk.DESTROY_FN())
    assert ctypes.sizeof(KernelDef) == 56
    assert LIB.lib.dlkern_register_kernel(ctypes.byref(d), 1) == 0, LIB.lib.dlkern_last_error()
    yield "py.affine"
    LIB.lib.dlkern_unregister_kernel(b"py.affine")


def generic_model(function_name, **attrs):
    node = helper.make_node("DLPackKernel", ["X"], ["Y"], domain="dlkern", name="g0", function_name=function_name, **attrs)
    return dx.model([node], [dx.value("X", TensorProto.FLOAT, ["n", 3])], [dx.value("Y", TensorProto.FLOAT, None)])


def test_generic_op_calls_a_c_abi_kernel_and_feeds_ort_ops(affine_kernel):
    nodes = [helper.make_node("DLPackKernel", ["X"], ["H"], domain="dlkern", function_name=affine_kernel),
             helper.make_node("Relu", ["H"], ["Y"])]
    m = dx.model(nodes, [dx.value("X", TensorProto.FLOAT, ["n", 3])], [dx.value("Y", TensorProto.FLOAT, None)])
    x = np.array([[-1, 0, 1], [2, -3, 4]], np.float32)
    (y,) = dx.session(LIB_PATH, m).run(None, {"X": x})
    np.testing.assert_array_equal(y, np.maximum(2 * x + 1, 0))


def error_of(fn):
    with pytest.raises(Exception) as info:
        fn()
    return str(info.value)


def test_errors_name_the_op_node_and_problem():
    x = np.ones((2, 3), np.float32)
    msg = error_of(lambda: dx.session(LIB_PATH, generic_model("dlkern.rmsnrom")))
    assert "no kernel named 'dlkern.rmsnrom'" in msg and "did you mean dlkern.rmsnorm" in msg, msg
    node = helper.make_node("DLPackKernel", ["X"], ["Y"], domain="dlkern", name="g1")
    m = dx.model([node], [dx.value("X", TensorProto.FLOAT, ["n", 3])], [dx.value("Y", TensorProto.FLOAT, None)])
    msg = error_of(lambda: dx.session(LIB_PATH, m))
    assert "missing required string attribute 'function_name'" in msg, msg
    node = helper.make_node("DLPackKernel", ["X"], ["Y"], domain="dlkern", name="g2", function_name=7)
    m = dx.model([node], [dx.value("X", TensorProto.FLOAT, ["n", 3])], [dx.value("Y", TensorProto.FLOAT, None)])
    msg = error_of(lambda: dx.session(LIB_PATH, m))
    assert "dlkern DLPackKernel node 'g2': attribute 'function_name' must be a string, got Int(7)" in msg, msg
    for bad_eps, expected in [("tiny", "attribute 'epsilon' must be a float, got String"), (-1.0, "attribute 'epsilon' = -1 must be finite")]:
        node = helper.make_node("RMSNorm", ["X", "scale"], ["Y"], domain="dlkern", name="r2", epsilon=bad_eps)
        m = dx.model([node], [dx.value("X", TensorProto.FLOAT, [2, 8]), dx.value("scale", TensorProto.FLOAT, [8])],
                     [dx.value("Y", TensorProto.FLOAT, None)])
        msg = error_of(lambda: dx.session(LIB_PATH, m))
        assert "dlkern RMSNorm node 'r2'" in msg and expected in msg, msg
    msg = error_of(lambda: dx.session(LIB_PATH, generic_model("dlkern.rmsnorm", attribute_names="nope")))
    assert "attribute_names lists 'nope'" in msg or "nope" in msg, msg
    # A kernel error at run time: the weight does not match the row length.
    node = helper.make_node("RMSNorm", ["X", "scale"], ["Y"], domain="dlkern", name="rms")
    free = dx.model([node], [dx.value("X", TensorProto.FLOAT, ["b", "s", 8]), dx.value("scale", TensorProto.FLOAT, ["d"])],
                    [dx.value("Y", TensorProto.FLOAT, None)])
    sess = dx.session(LIB_PATH, free)
    msg = error_of(lambda: sess.run(None, {"X": np.ones((1, 2, 8), np.float32), "scale": np.ones(5, np.float32)}))
    assert "dlkern RMSNorm node 'rms'" in msg and "tensor 'weight': shape [5] (expected [8])" in msg, msg
    # Wrong input count and dtype are refused by ORT against the op's schema.
    three = helper.make_node("RMSNorm", ["X", "scale", "scale"], ["Y"], domain="dlkern")
    m3 = dx.model([three], [dx.value("X", TensorProto.FLOAT, [2, 8]), dx.value("scale", TensorProto.FLOAT, [8])],
                  [dx.value("Y", TensorProto.FLOAT, None)])
    assert error_of(lambda: dx.session(LIB_PATH, m3))
    ints = dx.model([helper.make_node("RMSNorm", ["X", "scale"], ["Y"], domain="dlkern")],
                    [dx.value("X", TensorProto.INT32, [2, 8]), dx.value("scale", TensorProto.INT32, [8])],
                    [dx.value("Y", TensorProto.INT32, None)])
    assert error_of(lambda: dx.session(LIB_PATH, ints))


def test_generic_op_needs_kernels_with_inference():
    plugin = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"dlkern_ort_cpu_plugin_{os.getpid()}.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "tests", "c", "cpu_plugin.c"), "-o", plugin], check=True)
    if "plugin.negate" not in LIB.kernels():
        LIB.load_plugin(plugin)
    # The kernel exists (session creation passes) but DLPackKernel cannot size its outputs.
    msg = error_of(lambda: dx.session(LIB_PATH, generic_model("plugin.negate")).run(None, {"X": np.ones((2, 3), np.float32)}))
    assert "dlkern DLPackKernel node 'g0'" in msg and "has no output inference" in msg, msg


def test_generic_op_runs_a_c_plugin_kernel_as_called_directly():
    """A C function from a plug-in library (tests/c/cpu_plugin.c, with output inference) in an
    ORT DLPackKernel node on the CPU EP, against the same kernel through the C ABI."""
    plugin = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"dlkern_ort_cpu_plugin_{os.getpid()}.so")
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(ROOT, "include"),
                    os.path.join(ROOT, "tests", "c", "cpu_plugin.c"), "-o", plugin], check=True)
    if "plugin.scale" not in LIB.kernels():
        LIB.load_plugin(plugin)
    node = helper.make_node("DLPackKernel", ["X"], ["Y"], domain="dlkern", name="scale", function_name="plugin.scale",
                            factor=-2.5, attribute_names="factor")
    m = dx.model([node], [dx.value("X", TensorProto.FLOAT, None)], [dx.value("Y", TensorProto.FLOAT, None)])
    x = np.random.default_rng(4).uniform(-1, 1, (7, 97)).astype(np.float32)
    (y,) = dx.session(LIB_PATH, m).run(None, {"X": x})
    direct = np.empty_like(x)
    LIB.call("plugin.scale", [x], [direct], factor=-2.5)
    np.testing.assert_array_equal(y, direct)
    np.testing.assert_allclose(y, -2.5 * x, rtol=1e-6)


def test_library_exports_only_its_api_and_links_no_runtime():
    dynsym = subprocess.run(["nm", "-D", "--defined-only", LIB_PATH], capture_output=True, text=True, check=True).stdout
    exported = sorted(line.split()[-1] for line in dynsym.splitlines() if line.split()[1] in "TDB" and not line.split()[-1].startswith("_"))
    assert exported == sorted(["RegisterCustomOps", "dlkern_abi_version", "dlkern_call", "dlkern_call_at",
                               "dlkern_call_object", "dlkern_call_objects", "dlkern_device_bytes_held", "dlkern_infer",
                               "dlkern_last_error", "dlkern_last_error_code",
                               "dlkern_list_kernels", "dlkern_load_plugin", "dlkern_register_kernel",
                               "dlkern_register_tvm_ffi", "dlkern_site_create", "dlkern_site_destroy",
                               "dlkern_unregister_kernel"]), exported
    needed = subprocess.run(["readelf", "-d", LIB_PATH], capture_output=True, text=True, check=True).stdout
    # Runtimes are found at run time (CUDA, ORT's API) or through the caller's objects (Python,
    # libtvm_ffi): loading dlkern never drags them in.
    for runtime in ("onnxruntime", "libcuda", "python", "tvm_ffi"):
        assert runtime not in needed, needed


def test_refuses_a_runtime_that_is_too_old():
    """A fake OrtApiBase whose GetApi(17) is NULL (as ORT < 1.17 answers): the library must return
    an OrtStatus (built with the runtime's own v1 CreateStatus) saying what it needs."""
    messages = []
    CREATE_STATUS = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)

    @CREATE_STATUS
    def create_status(code, msg):
        messages.append(msg.decode())
        return 0xDEAD0

    v1_table = (ctypes.c_void_p * 1)(ctypes.cast(create_status, ctypes.c_void_p))
    GET_API = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)
    # The version string as a pointer into a buffer that outlives the call: a callback whose
    # restype is c_char_p and which returns bytes makes ctypes warn "memory leak in callback
    # function" (it cannot keep the returned object alive), which this test used to cause.
    GET_VERSION = ctypes.CFUNCTYPE(ctypes.c_void_p)
    version_text = ctypes.create_string_buffer(b"1.16.3")

    @GET_API
    def get_api(version):
        return ctypes.addressof(v1_table) if version == 1 else None

    @GET_VERSION
    def get_version():
        return ctypes.addressof(version_text)

    base = (ctypes.c_void_p * 2)(ctypes.cast(get_api, ctypes.c_void_p), ctypes.cast(get_version, ctypes.c_void_p))
    register = LIB.lib.RegisterCustomOps
    register.restype = ctypes.c_void_p
    register.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    status = register(ctypes.c_void_p(0x1000), ctypes.addressof(base))
    assert status == 0xDEAD0
    assert messages and "needs ONNX Runtime C API version 17" in messages[0] and "1.16.3" in messages[0], messages
