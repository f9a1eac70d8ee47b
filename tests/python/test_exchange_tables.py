"""dlkern.call through DLPack's C exchange table (dlkern_call_objects), on the CPU: a made-up
framework whose tensor type (`Boxed`, NumPy arrays inside) publishes a DLPackExchangeAPI built
from ctypes callbacks, so the Python glue (table discovery, outputs as the framework's objects,
reference counts, errors, release of outputs after a failure) runs in CI without PyTorch.
PyTorch's own table is exercised on the GPU host by test_kernels_api.py.
DLKERN_LIB = path of libdlkern.so."""

import ctypes
import gc
import os
import sys
import weakref
from ctypes import POINTER, c_int, c_int32, c_int64, c_void_p

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import dlkern  # noqa: E402
import dlkern_ctypes as dk  # noqa: E402

_DTYPES = {np.dtype(np.float32): (2, 32), np.dtype(np.float16): (2, 16), np.dtype(np.int8): (0, 8)}
_NUMPY = {v: k for k, v in _DTYPES.items()}


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", DELETER),
                                     ("flags", ctypes.c_uint64), ("dl_tensor", dk.DLTensor)]
SET_ERROR = ctypes.CFUNCTYPE(None, c_void_p, ctypes.c_char_p, ctypes.c_char_p)
ALLOCATOR = ctypes.CFUNCTYPE(c_int, POINTER(dk.DLTensor), POINTER(POINTER(DLManagedTensorVersioned)), c_void_p,
                             SET_ERROR)
FROM_OBJECT = ctypes.CFUNCTYPE(c_int, c_void_p, POINTER(c_void_p))
TO_OBJECT = ctypes.CFUNCTYPE(c_int, POINTER(DLManagedTensorVersioned), POINTER(c_void_p))
TO_DLTENSOR = ctypes.CFUNCTYPE(c_int, c_void_p, POINTER(dk.DLTensor))
WORK_STREAM = ctypes.CFUNCTYPE(c_int, c_int, c_int32, POINTER(c_void_p))


class DLPackExchangeAPI(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("prev_api", c_void_p), ("managed_tensor_allocator", ALLOCATOR),
                ("managed_tensor_from_py_object_no_sync", FROM_OBJECT),
                ("managed_tensor_to_py_object_no_sync", TO_OBJECT), ("dltensor_from_py_object_no_sync", TO_DLTENSOR),
                ("current_work_stream", WORK_STREAM)]


_incref = ctypes.pythonapi.Py_IncRef
_incref.argtypes = [ctypes.py_object]
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]


class Framework:
    """The made-up framework's state: its live allocations (managed tensor address -> the
    struct and its array) and what it was asked to do."""

    def __init__(self):
        self.live = {}
        self.allocations = 0
        self.fail_allocation = False
        self.table = DLPackExchangeAPI(
            DLPackVersion(1, 3), None, ALLOCATOR(self.allocate), FROM_OBJECT(lambda obj, out: -1),
            TO_OBJECT(self.to_object), TO_DLTENSOR(self.to_dltensor), WORK_STREAM(self.work_stream))
        self.deleter = DELETER(self.release)

    def to_dltensor(self, obj_address, out):
        obj = ctypes.cast(obj_address, ctypes.py_object).value
        if not isinstance(obj, Boxed):
            return -1
        t = out[0]
        t.data, t.ndim = obj.array.ctypes.data, obj.array.ndim
        t.device.device_type, t.device.device_id = dk.K_DL_CPU, 0
        t.dtype.code, t.dtype.bits = _DTYPES[obj.array.dtype]
        t.dtype.lanes = 1
        t.shape = ctypes.cast(obj.shape, POINTER(c_int64))
        t.strides, t.byte_offset = None, 0
        return 0

    def allocate(self, prototype, out, error_ctx, set_error):
        p = prototype[0]
        if self.fail_allocation:
            set_error(error_ctx, b"MemoryError", b"the made-up framework is full")
            return -1
        shape = tuple(p.shape[i] for i in range(p.ndim))
        array = np.full(shape, 7, _NUMPY[(p.dtype.code, p.dtype.bits)])
        managed = DLManagedTensorVersioned(DLPackVersion(1, 3), None, self.deleter, 0)
        shape_c = (c_int64 * max(len(shape), 1))(*shape)
        managed.dl_tensor = dk.DLTensor(array.ctypes.data, p.device, p.ndim, p.dtype,
                                        ctypes.cast(shape_c, POINTER(c_int64)), None, 0)
        self.live[ctypes.addressof(managed)] = (managed, array, shape_c)
        self.allocations += 1
        out[0] = ctypes.pointer(managed)
        return 0

    def release(self, managed):
        del self.live[ctypes.addressof(managed.contents)]

    def to_object(self, managed, out):
        _, array, _ = self.live.pop(ctypes.addressof(managed.contents))
        obj = Boxed(array)
        _incref(obj)  # the new reference the slot hands over
        out[0] = id(obj)
        return 0

    def work_stream(self, device_type, device_id, out):
        out[0] = None
        return 0


class Boxed:
    """A tensor of the made-up framework."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(array)
        self.shape = (c_int64 * max(self.array.ndim, 1))(*self.array.shape)

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


@pytest.fixture(params=["int", "capsule"])
def framework(request):
    """The made-up framework, its table published as an int (PyTorch 2.10's first form) or as
    the spec's capsule."""
    fw = Framework()
    address = ctypes.addressof(fw.table)
    for attribute in dk._EXCHANGE_ATTRIBUTES:
        if hasattr(Boxed, attribute):
            delattr(Boxed, attribute)
    if request.param == "int":
        Boxed.__c_dlpack_exchange_api__ = address
    else:
        Boxed.__dlpack_c_exchange_api__ = _capsule_new(address, dk._EXCHANGE_CAPSULE, None)
    dk._exchange_tables.pop(Boxed, None)
    yield fw
    for attribute in dk._EXCHANGE_ATTRIBUTES:
        if hasattr(Boxed, attribute):
            delattr(Boxed, attribute)
    dk._exchange_tables.pop(Boxed, None)
    gc.collect()
    assert not fw.live, "an allocation of the framework was neither handed out nor released"


def rmsnorm_ref(x, w, eps):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


@pytest.mark.parametrize("shape", [(1, 1), (7, 97), (2, 3, 1025)])
def test_outputs_are_the_frameworks_tensors(framework, shape):
    rng = np.random.default_rng(5)
    x = Boxed(rng.uniform(-2, 2, shape).astype(np.float32))
    w = Boxed(rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32))
    assert dk.exchange_table(Boxed).value == ctypes.addressof(framework.table)
    y = dlkern.call("dlkern.rmsnorm", x, w, epsilon=1e-6)
    assert isinstance(y, Boxed) and y.array.shape == shape and framework.allocations == 1
    np.testing.assert_allclose(y.array, rmsnorm_ref(x.array, w.array, 1e-6), rtol=1e-5, atol=1e-6)
    # The same call through __dlpack__ gives the same bits.
    dlkern.kernels.USE_EXCHANGE_TABLES = False
    try:
        slow = dlkern.call("dlkern.rmsnorm", x.array, w.array, epsilon=1e-6)
    finally:
        dlkern.kernels.USE_EXCHANGE_TABLES = True
    np.testing.assert_array_equal(y.array, slow)
    # Attributes are cached per value and type; a different epsilon is a different call.
    y2 = dlkern.kernel("dlkern.rmsnorm")(x, w, epsilon=0.5)
    np.testing.assert_allclose(y2.array, rmsnorm_ref(x.array, w.array, 0.5), rtol=1e-5, atol=1e-6)
    # The slots' references were handed over, not kept: the outputs die with the caller's.
    alive = [weakref.ref(y), weakref.ref(y2)]
    del y, y2
    gc.collect()
    assert [r() for r in alive] == [None, None]


def test_two_outputs_of_other_dtypes(framework):
    x = Boxed(np.random.default_rng(6).uniform(-3, 3, (5, 64)).astype(np.float32))
    q, scales = dlkern.call("dlkern.quantize_per_token", x, num_outputs=2)
    assert q.array.dtype == np.int8 and q.array.shape == (5, 64)
    assert scales.array.dtype == np.float32 and scales.array.shape == (5,)
    np.testing.assert_allclose(q.array * scales.array[:, None], x.array, atol=float(scales.array.max()))
    alive = [weakref.ref(q), weakref.ref(scales)]
    del q, scales
    gc.collect()
    assert [r() for r in alive] == [None, None]


def test_failures_raise_dlkerns_message_and_release_the_outputs(framework):
    x = Boxed(np.ones((2, 8), np.float32))
    # A failed one-output call hands back dlkern_call_object's sentinel; its count must hold.
    sentinel_references = sys.getrefcount(dk._FAILED)
    with pytest.raises(dk.DLKernError, match=r"shape \[7\] \(expected \[8\]\)"):
        dlkern.call("dlkern.rmsnorm", x, Boxed(np.ones(7, np.float32)))
    assert framework.allocations == 1 and not framework.live
    framework.fail_allocation = True
    with pytest.raises(dk.DLKernError, match="MemoryError: the made-up framework is full"):
        dlkern.call("dlkern.rmsnorm", x, Boxed(np.ones(8, np.float32)))
    framework.fail_allocation = False
    with pytest.raises(dk.DLKernError, match="no kernel named"):
        dlkern.call("dlkern.no_such_kernel", x)
    # (Counted outside the assert, whose rewriting keeps the operands it shows on failure.)
    references = sys.getrefcount(dk._FAILED)
    assert references == sentinel_references


def test_mixed_frameworks_go_through_dlpack(framework):
    x = Boxed(np.random.default_rng(7).uniform(-1, 1, (3, 16)).astype(np.float32))
    w = np.linspace(0.5, 1.5, 16, dtype=np.float32)
    y = dlkern.call("dlkern.rmsnorm", x, w, epsilon=1e-6)
    # No shared table: the __dlpack__ path, whose outputs are the first input's kind; a Boxed
    # first input is neither torch nor CuPy, so NumPy.
    assert isinstance(y, np.ndarray) and framework.allocations == 0
    np.testing.assert_allclose(y, rmsnorm_ref(x.array, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_a_kernel_handle_with_a_site_goes_through_the_table(framework):
    rng = np.random.default_rng(8)
    x = Boxed(rng.uniform(-1, 1, (2, 33)).astype(np.float32))
    w = Boxed(rng.uniform(0.5, 1.5, 33).astype(np.float32))
    lib = dlkern.library()
    # (One output goes through dlkern_call_object, several through dlkern_call_objects.)
    entries, seen = {e: getattr(lib, e) for e in ("_call_object", "_call_objects")}, []

    def recording(real):
        def record(site, *rest):
            seen.append(site)
            return real(site, *rest)
        return record

    for entry, real in entries.items():
        setattr(lib, entry, recording(real))
    try:
        rmsnorm = dlkern.kernel("dlkern.rmsnorm", constant_inputs=(1,))
        ys = [rmsnorm(x, w, epsilon=1e-6) for _ in range(3)]
    finally:
        for entry, real in entries.items():
            setattr(lib, entry, real)
    # The site reaches C whole: a c_void_p (a plain int would be masked to 32 bits without
    # argtypes), the same one at every call.
    assert all(isinstance(s, ctypes.c_void_p) and s.value == seen[0].value for s in seen) and len(seen) == 3
    assert framework.allocations == 3 and all(isinstance(y, Boxed) for y in ys)
    for y in ys:
        np.testing.assert_allclose(y.array, rmsnorm_ref(x.array, w.array, 1e-6), rtol=1e-5, atol=1e-6)
