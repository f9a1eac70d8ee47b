"""Call dlkern kernels on any DLPack-capable arrays (NumPy, PyTorch, CuPy, JAX) through the C ABI
of libdlkern.so, with ctypes only.

    import dlkern_ctypes as dk
    lib = dk.Library("target/release/libdlkern.so")
    lib.call("dlkern.rmsnorm", [x, w], [y], stream=torch.cuda.current_stream().cuda_stream,
             epsilon=1e-6)

Inputs and outputs are borrowed for the call (outputs are written in place); for CUDA arrays the
kernel is enqueued on `stream` (a CUstream handle as an int; None = legacy default stream).
"""

import ctypes
import struct
from ctypes import POINTER, c_char, c_char_p, c_double, c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint32, c_void_p

DLKERN_OK = 0
K_DL_CPU, K_DL_CUDA = 1, 2
ATTR_INT, ATTR_FLOAT, ATTR_STRING, ATTR_INTS, ATTR_FLOATS = range(5)
MAX_NDIM = 16


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_uint32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", c_int32),
        ("dtype", DLDataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLKernAttr(ctypes.Structure):
    _fields_ = [
        ("name", c_char_p),
        ("kind", c_int32),
        ("i", c_int64),
        ("f", c_double),
        ("s", c_char_p),
        ("ints", POINTER(c_int64)),
        ("floats", POINTER(c_double)),
        ("count", c_int64),
    ]


# `dlkern_compute_fn`, `dlkern_infer_fn`, the destroy callback and `dlkern_kernel_def`
# (include/dlkern.h), for kernels registered from Python.
COMPUTE_FN = ctypes.CFUNCTYPE(c_int32, POINTER(DLTensor), c_int32, c_int32, c_char_p, c_void_p, POINTER(DLKernAttr),
                              c_int32, c_void_p, c_void_p, c_size_t)
INFER_FN = ctypes.CFUNCTYPE(c_int32, POINTER(DLTensor), c_int32, POINTER(DLTensor), c_int32, c_char_p,
                            POINTER(DLKernAttr), c_int32, c_void_p, c_void_p, c_size_t)
DESTROY_FN = ctypes.CFUNCTYPE(None, c_void_p)


class KernelDef(ctypes.Structure):
    _fields_ = [("struct_size", c_uint32), ("name", c_char_p), ("compute", COMPUTE_FN), ("infer", INFER_FN),
                ("device_mask", c_uint32), ("num_outputs", c_int32), ("user_data", c_void_p), ("destroy", DESTROY_FN)]


class TvmFfiDef(ctypes.Structure):
    """`dlkern_tvm_ffi_def` (include/dlkern.h): a TVM-FFI function of a library as a kernel."""
    _fields_ = [("struct_size", c_uint32), ("name", c_char_p), ("library", c_char_p), ("function", c_char_p),
                ("attribute_names", c_char_p), ("device_mask", c_uint32), ("num_outputs", c_int32),
                ("infer", INFER_FN), ("user_data", c_void_p), ("destroy", DESTROY_FN)]


assert ctypes.sizeof(DLTensor) == 48 and ctypes.sizeof(DLKernAttr) == 64 and ctypes.sizeof(KernelDef) == 56
assert ctypes.sizeof(TvmFfiDef) == 72

_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, c_char_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, c_char_p]
_decref = ctypes.pythonapi.Py_DecRef
_decref.restype = None
_decref.argtypes = [ctypes.py_object]
_incref = ctypes.pythonapi.Py_IncRef
_incref.restype = None
_incref.argtypes = [ctypes.py_object]
# What dlkern_call_object returns on failure (ctypes cannot take NULL back as a py_object).
_FAILED = object()
_FAILED_ARGUMENT = ctypes.py_object(_FAILED)

# Where a tensor type publishes DLPack's C exchange table (DLPackExchangeAPI): the attribute the
# DLPack spec names, then the name PyTorch 2.10 shipped first (an int or a capsule).
_EXCHANGE_ATTRIBUTES = ("__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__")
_EXCHANGE_CAPSULE = b"dlpack_exchange_api"
_exchange_tables = {}

# Offset of dl_tensor in DLManagedTensorVersioned (version, manager_ctx, deleter, flags).
_VERSIONED_DL_TENSOR_OFFSET = 32


class DLKernError(RuntimeError):
    def __init__(self, code, message):
        super().__init__(f"dlkern error {code}: {message}")
        self.code = code
        self.message = message


def borrow(obj, stream=None, versioned=False):
    """Exports `obj` through __dlpack__ and returns (capsule, DLTensor copy). Keep the capsule
    alive while the DLTensor is used: releasing it releases the producer's tensor."""
    kwargs = {}
    if obj.__dlpack_device__()[0] == K_DL_CUDA:
        # DLPack numbers the legacy default stream 1 (its CUstream handle is 0/NULL).
        kwargs["stream"] = 1 if stream in (None, 0) else stream
    if versioned:
        capsule = obj.__dlpack__(max_version=(1, 0), **kwargs)
        if not _capsule_is_valid(capsule, b"dltensor_versioned"):
            raise TypeError("the producer did not return a versioned DLPack capsule")
        address = _capsule_get_pointer(capsule, b"dltensor_versioned") + _VERSIONED_DL_TENSOR_OFFSET
    else:
        capsule = obj.__dlpack__(**kwargs)
        address = _capsule_get_pointer(capsule, b"dltensor")
    return capsule, DLTensor.from_address(address)


def exchange_table(tensor_type):
    """The address of `tensor_type`'s DLPack C exchange table as a c_void_p, or None when the
    type publishes none (NumPy; PyTorch before 2.10). Looked up once per type."""
    try:
        return _exchange_tables[tensor_type]
    except KeyError:
        pass
    address = None
    for attribute in _EXCHANGE_ATTRIBUTES:
        value = getattr(tensor_type, attribute, None)
        if isinstance(value, int):
            address = value or None
        elif value is not None and _capsule_is_valid(value, _EXCHANGE_CAPSULE):
            address = _capsule_get_pointer(value, _EXCHANGE_CAPSULE)
        if address:
            break
    _exchange_tables[tensor_type] = c_void_p(address) if address else None
    return _exchange_tables[tensor_type]


def _attrs(attrs):
    keep = []
    arr = (DLKernAttr * max(len(attrs), 1))()
    for slot, (name, value) in zip(arr, attrs.items()):
        slot.name = name.encode()
        keep.append(slot.name)
        if isinstance(value, bool) or isinstance(value, int):
            slot.kind, slot.i = ATTR_INT, int(value)
        elif isinstance(value, float):
            slot.kind, slot.f = ATTR_FLOAT, value
        elif isinstance(value, str):
            slot.kind, slot.s = ATTR_STRING, value.encode()
        elif all(isinstance(v, int) for v in value):
            data = (c_int64 * len(value))(*value)
            keep.append(data)
            slot.kind, slot.ints, slot.count = ATTR_INTS, data, len(value)
        else:
            data = (c_double * len(value))(*[float(v) for v in value])
            keep.append(data)
            slot.kind, slot.floats, slot.count = ATTR_FLOATS, data, len(value)
    return arr, len(attrs), keep


# The input objects' addresses as the bytes of a pointer array (ctypes passes bytes as a pointer
# to them): a third cheaper per call than filling a ctypes array.
_ADDRESS_PACKERS = [struct.Struct(f"{n}P") for n in range(33)]
# ctypes array types by length, made once: `py_object * n` looks its type up on every call.
_OBJECT_ARRAYS = [ctypes.py_object * n for n in range(17)]


def _release(slots):
    """Drops the new references dlkern left in the non-empty `slots` of a failed call."""
    for i in range(len(slots)):
        try:
            obj = slots[i]
        except ValueError:  # an empty (NULL) slot
            continue
        _decref(obj)


class Library:
    """libdlkern.so loaded with ctypes."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.dlkern_last_error.restype = c_char_p
        L.dlkern_call.argtypes = [c_char_p, POINTER(DLTensor), c_int32, c_int32, c_void_p, POINTER(DLKernAttr), c_int32]
        L.dlkern_call.restype = c_int32
        L.dlkern_infer.argtypes = [c_char_p, POINTER(DLTensor), c_int32, POINTER(DLTensor), c_int32, POINTER(DLKernAttr), c_int32]
        L.dlkern_infer.restype = c_int32
        L.dlkern_list_kernels.argtypes = [POINTER(c_char), c_size_t]
        L.dlkern_list_kernels.restype = c_int64
        L.dlkern_load_plugin.argtypes = [c_char_p]
        L.dlkern_load_plugin.restype = c_int32
        L.dlkern_device_bytes_held.argtypes = []
        L.dlkern_device_bytes_held.restype = ctypes.c_uint64
        L.dlkern_register_kernel.argtypes = [POINTER(KernelDef), c_int32]
        L.dlkern_register_kernel.restype = c_int32
        L.dlkern_unregister_kernel.argtypes = [c_char_p]
        L.dlkern_register_tvm_ffi.argtypes = [POINTER(TvmFfiDef), c_int32]
        L.dlkern_register_tvm_ffi.restype = c_int32
        L.dlkern_call_at.argtypes = [c_void_p, c_char_p, POINTER(DLTensor), c_int32, c_int32, c_void_p,
                                     POINTER(DLKernAttr), c_int32]
        L.dlkern_call_at.restype = c_int32
        L.dlkern_site_create.argtypes = [ctypes.c_uint64]
        L.dlkern_site_create.restype = c_void_p
        L.dlkern_site_destroy.argtypes = [c_void_p]
        L.dlkern_site_destroy.restype = None
        L.dlkern_unregister_kernel.restype = c_int32

        # dlkern_call_objects runs the framework's exchange functions, which need the GIL: the
        # same library through PyDLL, which keeps it held. No argtypes: the arguments are passed
        # as ctypes objects already, and conversion per call is most of what a call costs here.
        self._call_objects = ctypes.PyDLL(path).dlkern_call_objects
        self._call_objects.restype = c_int32
        # One output: returned as the object itself, whose reference ctypes takes over.
        self._call_object = ctypes.PyDLL(path).dlkern_call_object
        self._call_object.restype = ctypes.py_object
        L.dlkern_last_error_code.argtypes = []
        L.dlkern_last_error_code.restype = c_int32
        self._prepared = {}

    def _prepare(self, name, attrs):
        """(name bytes, attribute array, count, what keeps them alive), cached per name and
        attribute values (with their types: 1 and 1.0 are different attributes)."""
        try:
            key = (name, tuple(attrs.items()), tuple(map(type, attrs.values())))
            return self._prepared[key]
        except TypeError:  # a list attribute: not hashable, built each call
            key = None
        except KeyError:
            pass
        arr, n_attrs, keep = _attrs(attrs)
        prepared = (name.encode(), arr, n_attrs, keep)
        if key is not None:
            if len(self._prepared) >= 4096:
                self._prepared.clear()
            self._prepared[key] = prepared
        return prepared

    def call_objects(self, name, table, inputs, num_outputs, stream=None, attrs=None, site=None):
        """Runs `name` on framework tensors through their DLPack C exchange table (see
        exchange_table): outputs are allocated by the framework and returned as its tensors, a
        list of `num_outputs`. stream None on CUDA: the framework's current stream; `site`: a
        call site of site_create, or None.

        This is the per-call path of dlkern.call on torch tensors, so it is written for speed:
        cached ctypes array types and attribute arrays, no argtypes conversion."""
        name_b, arr, n_attrs, _ = self._prepare(name, attrs) if attrs else self._prepare_plain(name)
        n = len(inputs)
        objects = (_ADDRESS_PACKERS[n] if n < len(_ADDRESS_PACKERS) else struct.Struct(f"{n}P")).pack(*map(id, inputs))
        if num_outputs == 1:
            try:
                result = self._call_object(site, name_b, table, objects, n,
                                           None if stream is None else c_void_p(stream), arr, n_attrs, _FAILED_ARGUMENT)
            except Exception as e:  # a table function failed and left its Python exception
                raise self._last_error() from e
            if result is not _FAILED:
                return [result]
            # ctypes took over a reference to the sentinel that dlkern never added: add it (and
            # drop this frame's, which a traceback would otherwise keep).
            _incref(_FAILED)
            del result
            raise self._last_error()
        outs = (_OBJECT_ARRAYS[num_outputs] if num_outputs < len(_OBJECT_ARRAYS) else ctypes.py_object * num_outputs)()
        try:
            code = self._call_objects(site, name_b, table, objects, n, outs, num_outputs,
                                      None if stream is None else c_void_p(stream), arr, n_attrs)
        except Exception as e:  # a table function failed and left its Python exception
            _release(outs)
            raise DLKernError(-1, self.lib.dlkern_last_error().decode()) from e
        if code:
            _release(outs)
            self._check(code)
        results = outs[:]
        # Each slot holds a new reference from dlkern, and reading it took another.
        for r in results:
            _decref(r)
        return results

    def _prepare_plain(self, name):
        """`_prepare` for a call without attributes."""
        try:
            return self._prepared[name]
        except KeyError:
            prepared = self._prepared[name] = self._prepare(name, {})
            return prepared

    def _last_error(self):
        """The thread's last dlkern error, for an entry that returns no code."""
        return DLKernError(self.lib.dlkern_last_error_code() or -1, self.lib.dlkern_last_error().decode())

    def _check(self, code):
        if code != DLKERN_OK:
            raise DLKernError(code, self.lib.dlkern_last_error().decode())

    def kernels(self):
        need = self.lib.dlkern_list_kernels(None, 0)
        buf = ctypes.create_string_buffer(need)
        self.lib.dlkern_list_kernels(buf, need)
        return buf.value.decode().split("\n")

    def device_bytes_held(self):
        """Device memory dlkern keeps between calls (repacked weights of ONNX nodes), in bytes."""
        return self.lib.dlkern_device_bytes_held()

    def load_plugin(self, path):
        self._check(self.lib.dlkern_load_plugin(str(path).encode()))

    def call(self, name, inputs, outputs, stream=None, versioned=False, site=None, **attrs):
        """`site`: a call site of `site_create` (dlkern_call_at), or None (dlkern_call)."""
        borrowed = [borrow(t, stream, versioned) for t in list(inputs) + list(outputs)]
        tensors = (DLTensor * len(borrowed))(*[dl for _, dl in borrowed])
        arr, n_attrs, keep = _attrs(attrs)
        if site is None:
            code = self.lib.dlkern_call(name.encode(), tensors, len(inputs), len(outputs), stream, arr, n_attrs)
        else:
            code = self.lib.dlkern_call_at(site, name.encode(), tensors, len(inputs), len(outputs), stream, arr,
                                           n_attrs)
        del borrowed, keep
        self._check(code)

    def site_create(self, constant_inputs=()):
        """A call site (dlkern_site_create, as a c_void_p) whose inputs at the positions
        `constant_inputs` are the same tensors, with the same contents, at every call through
        it; release it with site_destroy. Raises MemoryError when dlkern cannot make one."""
        mask = 0
        for i in constant_inputs:
            if not 0 <= i < 64:
                raise ValueError(f"constant input {i}: positions 0 to 63")
            mask |= 1 << i
        site = self.lib.dlkern_site_create(mask)
        if not site:
            raise MemoryError("dlkern_site_create")
        # A c_void_p, not the int ctypes returns: call_objects passes its arguments without
        # argtypes, where a plain int would be masked to a 32-bit C int.
        return c_void_p(site)

    def site_destroy(self, site):
        self.lib.dlkern_site_destroy(site)

    def call_raw(self, name, tensors, num_inputs, num_outputs, stream=None, **attrs):
        """Calls with DLTensor structs the caller built (for malformed-input tests)."""
        arr, n_attrs, keep = _attrs(attrs)
        array = (DLTensor * max(len(tensors), 1))(*tensors)
        self._check(self.lib.dlkern_call(name.encode(), array, num_inputs, num_outputs, stream, arr, n_attrs))
        del keep

    def infer(self, name, inputs, num_outputs, **attrs):
        """Output (dtype code, bits, shape) triples inferred from the inputs' metadata."""
        borrowed = [borrow(t) for t in inputs]
        ins = (DLTensor * max(len(borrowed), 1))(*[dl for _, dl in borrowed])
        shapes = [(c_int64 * MAX_NDIM)() for _ in range(num_outputs)]
        outs = (DLTensor * max(num_outputs, 1))()
        for o, s in zip(outs, shapes):
            o.shape = ctypes.cast(s, POINTER(c_int64))
        arr, n_attrs, keep = _attrs(attrs)
        self._check(self.lib.dlkern_infer(name.encode(), ins, len(borrowed), outs, num_outputs, arr, n_attrs))
        del borrowed, keep
        return [(o.dtype.code, o.dtype.bits, tuple(s[: o.ndim])) for o, s in zip(outs[:num_outputs], shapes)]
