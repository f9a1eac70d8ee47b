"""Python functions as dlkern kernels: `register_kernel(name, fn)` puts `fn` into libdlkern.so's
registry under `name`, where everything that reaches the registry finds it: an ONNX Runtime
`DLPackKernel` node (`function_name=name`), `dlkern.call`, the C ABI.

    import numpy as np, dlkern

    def scaled_sum(x, y, alpha=1.0):
        return x + alpha * y

    dlkern.register_kernel("py.scaled_sum", scaled_sum)   # output like input 0
    # an ORT node: helper.make_node("DLPackKernel", ["x", "y"], ["z"], domain="dlkern",
    #                               function_name="py.scaled_sum", alpha=0.5, attribute_names="alpha")

The call's tensors reach `fn` without copies: CPU tensors as NumPy arrays, CUDA tensors as
PyTorch tensors (CuPy arrays where PyTorch is not installed), through the CUDA array interface,
with the call's CUDA stream (ORT's, for a node) current while `fn` runs, so its work is queued
on that stream. The views borrow the caller's memory for the call only: `fn` must not keep them.
`fn` returns its outputs (copied into the caller's output tensors, on the stream), or, with
`writes_outputs=True`, receives the output tensors after the inputs and writes them itself (no
copy). Attributes arrive as keyword arguments (int, float, str, lists of ints or floats).

Output shapes come from `infer(specs, **attrs)`, which gets one `TensorSpec` (dtype name, shape)
per input and returns one `(dtype, shape)` per output; without it every output is like input 0.

An exception in `fn` or `infer` is the call's error, with its type and message (an ORT node
fails with them); nothing escapes into the caller. dlkern's registry may call a kernel from any
thread: the GIL is taken for the call only (ctypes does it on entry), so Python kernels run one
at a time. bfloat16 has no NumPy dtype and no array-interface type code: such tensors are
refused with an error.
"""

import atexit
import ctypes
import itertools
import os
import threading
import traceback
from collections import namedtuple

import dlkern_ctypes as dk

from .kernels import _NUMPY_TYPES, library

TensorSpec = namedtuple("TensorSpec", ["dtype", "shape"])

# NumPy dtype names -> DLPack (code, bits), and array-interface type strings.
_CODES = {name: code for code, name in _NUMPY_TYPES.items()}
_TYPESTR = {"float16": "<f2", "float32": "<f4", "float64": "<f8", "int8": "|i1", "uint8": "|u1", "int32": "<i4",
            "int64": "<i8"}

# What the registry holds a pointer to, by the id passed as user_data: the callbacks and the
# Python functions stay alive until the registry lets go of them (destroy), which is after the
# last call in flight has returned.
_LIVE = {}
_LOCK = threading.Lock()
_IDS = itertools.count(1)
_NAMES = {}


@dk.DESTROY_FN
def _destroy(user_data):
    with _LOCK:
        _LIVE.pop(user_data or 0, None)


def _write_error(buf, length, message):
    data = message.encode("utf-8", "replace")[: max(length - 1, 0)]
    if length:
        ctypes.memmove(buf, data + b"\0", len(data) + 1)


def _attrs(attrs, count):
    out = {}
    for i in range(count):
        a = attrs[i]
        name = a.name.decode()
        if a.kind == dk.ATTR_INT:
            out[name] = a.i
        elif a.kind == dk.ATTR_FLOAT:
            out[name] = a.f
        elif a.kind == dk.ATTR_STRING:
            out[name] = a.s.decode() if a.s else ""
        elif a.kind == dk.ATTR_INTS:
            out[name] = [a.ints[j] for j in range(a.count)]
        elif a.kind == dk.ATTR_FLOATS:
            out[name] = [a.floats[j] for j in range(a.count)]
    return out


def _dtype_name(t):
    key = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or key not in _NUMPY_TYPES:
        raise TypeError(f"a tensor of DLPack type code {t.dtype.code}, {t.dtype.bits} bits, {t.dtype.lanes} lanes "
                        "has no NumPy dtype (Python kernels take f16, f32, f64, i8, u8, i32, i64)")
    return _NUMPY_TYPES[key]


def _spec(t):
    return TensorSpec(_dtype_name(t), tuple(t.shape[i] for i in range(t.ndim)))


def _layout(t):
    """(dtype name, shape, strides in bytes or None, address) of a DLTensor."""
    name = _dtype_name(t)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    size = t.dtype.bits // 8
    strides = tuple(t.strides[i] * size for i in range(t.ndim)) if t.strides else None
    return name, shape, strides, (t.data or 0) + t.byte_offset


def _numpy_view(t):
    import numpy as np

    name, shape, strides, address = _layout(t)
    itemsize = np.dtype(name).itemsize
    if any(n == 0 for n in shape) or not address:
        return np.empty(shape, dtype=name)
    if strides is None:
        count = int(np.prod(shape, dtype=np.int64))
        return np.ndarray(shape, dtype=name, buffer=(ctypes.c_uint8 * (count * itemsize)).from_address(address))
    # The bytes from the lowest to the highest element the view reaches (strides may be
    # negative or zero).
    low = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    high = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + itemsize
    buf = (ctypes.c_uint8 * (high - low)).from_address(address + low)
    return np.ndarray(shape, dtype=name, buffer=buf, offset=-low, strides=strides)


class _CudaArray:
    """A CUDA tensor of the call as `__cuda_array_interface__` (version 3)."""

    def __init__(self, t, stream):
        name, shape, strides, address = _layout(t)
        self.device = t.device.device_id
        self.__cuda_array_interface__ = {"shape": shape, "typestr": _TYPESTR[name], "data": (address, False),
                                         "strides": strides, "version": 3, "stream": stream or None}


def _cuda_view(t, stream):
    array = _CudaArray(t, stream)
    try:
        import torch
    except ImportError:
        import cupy

        return cupy.asarray(array)
    return torch.as_tensor(array, device=f"cuda:{array.device}")


def _stream_context(device_id, stream):
    """The call's stream made current for the framework the CUDA views belong to."""
    try:
        import torch
    except ImportError:
        import cupy

        return cupy.cuda.ExternalStream(stream or 0, device_id)
    return torch.cuda.stream(torch.cuda.ExternalStream(stream or 0, device=f"cuda:{device_id}"))


def _run(fn, writes_outputs, tensors, n_in, n_out, stream, attrs):
    all_tensors = [tensors[i] for i in range(n_in + n_out)]
    cuda = [t.device.device_type == dk.K_DL_CUDA for t in all_tensors]
    if any(cuda):
        if not all(cuda):
            raise TypeError("a Python kernel's tensors are all on the CPU or all on CUDA devices")
        device_id = all_tensors[0].device.device_id
        # Views made with the call's stream current: their array-interface stream is the
        # current one, so importing them orders nothing more.
        with _stream_context(device_id, stream):
            views = [_cuda_view(t, stream) for t in all_tensors]
            _apply(fn, writes_outputs, views, n_in, attrs, copy=lambda dst, src: dst.copy_(src)
                   if hasattr(dst, "copy_") else dst.set(src))
    else:
        views = [_numpy_view(t) for t in all_tensors]
        _apply(fn, writes_outputs, views, n_in, attrs, copy=lambda dst, src: dst.__setitem__(Ellipsis, src))


def _apply(fn, writes_outputs, views, n_in, attrs, copy):
    inputs, outputs = views[:n_in], views[n_in:]
    if writes_outputs:
        fn(*inputs, *outputs, **attrs)
        return
    result = fn(*inputs, **attrs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    if len(results) != len(outputs):
        raise ValueError(f"returned {len(results)} outputs, the call has {len(outputs)}")
    for i, (dst, src) in enumerate(zip(outputs, results)):
        got_shape = tuple(getattr(src, "shape", ()))
        if got_shape != tuple(dst.shape) or str(src.dtype).removeprefix("torch.") != str(dst.dtype).removeprefix("torch."):
            raise ValueError(f"output {i}: returned {str(src.dtype).removeprefix('torch.')} {got_shape}, the call's "
                             f"output is {str(dst.dtype).removeprefix('torch.')} {tuple(dst.shape)} (see infer)")
        copy(dst, src)


def _device_mask(devices):
    masks = {"cpu": 1 << dk.K_DL_CPU, "cuda": 1 << dk.K_DL_CUDA}
    unknown = set(devices) - set(masks)
    if unknown or not devices:
        raise ValueError(f"devices must be among {sorted(masks)}, got {list(devices)}")
    return sum(masks[d] for d in set(devices))


def _infer_outputs(name, infer):
    """A `dlkern_infer_fn` body over Python `infer(specs, **attrs)` (None: outputs like input 0)."""

    def infer_outputs(inputs, n_in, outputs, n_out, _name, attrs, n_attrs, _user, err, err_len):
        try:
            specs = [_spec(inputs[i]) for i in range(n_in)]
            kwargs = _attrs(attrs, n_attrs)
            if infer is None:
                if not specs:
                    raise ValueError("no inputs to take the outputs' type from (give infer)")
                got = [specs[0]] * n_out
            else:
                got = list(infer(specs, **kwargs))
            if len(got) != n_out:
                raise ValueError(f"infer gave {len(got)} outputs, the call has {n_out}")
            for i, (dtype, shape) in enumerate(got):
                dtype = str(dtype).removeprefix("torch.")
                if dtype not in _CODES:
                    raise TypeError(f"infer: output {i} has dtype {dtype} (one of {sorted(_CODES)})")
                if len(shape) > dk.MAX_NDIM or any(int(n) < 0 for n in shape):
                    raise ValueError(f"infer: output {i} has shape {tuple(shape)}")
                code, bits = _CODES[dtype]
                outputs[i].ndim = len(shape)
                outputs[i].dtype.code, outputs[i].dtype.bits, outputs[i].dtype.lanes = code, bits, 1
                for j, n in enumerate(shape):
                    outputs[i].shape[j] = int(n)
            return 0
        except BaseException as e:  # noqa: BLE001 - becomes the call's error; nothing may escape
            _write_error(err, err_len, f"{name} (infer): {type(e).__name__}: {e}")
            return 1

    return infer_outputs


def register_kernel(name, fn, *, num_outputs=1, infer=None, devices=("cpu", "cuda"), writes_outputs=False,
                    replace=False):
    """Registers `fn` as dlkern kernel `name` (see the module docs). `num_outputs`: a fixed count,
    or -1 for any; `devices`: where it takes tensors ("cpu", "cuda"); `replace`: swap a kernel of
    the same name. Raises `dlkern_ctypes.DLKernError` when dlkern refuses it (a taken name)."""
    if not callable(fn) or (infer is not None and not callable(infer)):
        raise TypeError("fn (and infer, when given) must be callable")
    device_mask = _device_mask(devices)

    def compute(tensors, n_in, n_out, _name, stream, attrs, n_attrs, _user, err, err_len):
        try:
            _run(fn, writes_outputs, tensors, n_in, n_out, stream, _attrs(attrs, n_attrs))
            return 0
        except BaseException as e:  # noqa: BLE001 - becomes the call's error; nothing may escape
            _write_error(err, err_len, f"{name}: {type(e).__name__}: {e}")
            return 1

    callbacks = (dk.COMPUTE_FN(compute), dk.INFER_FN(_infer_outputs(name, infer)))

    def definition(key):
        return dk.KernelDef(ctypes.sizeof(dk.KernelDef), name.encode(), callbacks[0], callbacks[1], device_mask,
                            num_outputs, key, _destroy)

    _register(name, definition, "dlkern_register_kernel", (callbacks, fn, infer), replace)


def _register(name, definition, entry, keep, replace):
    """Registers `definition(key)` through C ABI function `entry`, keeping `keep` (callbacks,
    Python functions) alive under `key` until the registry destroys the kernel."""
    key = next(_IDS)
    made = definition(key)
    with _LOCK:
        _LIVE[key] = keep
    lib = library()
    code = getattr(lib.lib, entry)(ctypes.byref(made), int(bool(replace)))
    if code != dk.DLKERN_OK:
        # A refused definition stays the caller's: the registry never calls destroy for it.
        with _LOCK:
            _LIVE.pop(key, None)
        lib._check(code)
    _NAMES[name] = key


def register_tvm_ffi(name, library, function, *, num_outputs=1, attribute_names=(), infer=None,
                     devices=("cpu", "cuda"), replace=False):
    """Registers the TVM-FFI function `function` of the shared library `library` (the symbol
    `__tvm_ffi_<function>`, as apache-tvm-ffi's TVM_FFI_DLL_EXPORT_TYPED_FUNC exports it) as
    dlkern kernel `name`. It is called destination-passing: inputs, then outputs (DLTensor*),
    then the attributes `attribute_names` in that order; for CUDA tensors the call's stream is
    its TVM-FFI environment stream (TVMFFIEnvGetStream). `infer(specs, **attrs)` sizes the outputs
    as for register_kernel (default: like input 0). The library is loaded (its initializers run)
    and stays loaded: register only libraries you trust. Raises `dlkern_ctypes.DLKernError` with
    dlkern's reason when refused (no such library or symbol, a taken name)."""
    if infer is not None and not callable(infer):
        raise TypeError("infer must be callable")
    names = [attribute_names] if isinstance(attribute_names, str) else list(attribute_names)
    device_mask = _device_mask(devices)
    callback = dk.INFER_FN(_infer_outputs(name, infer)) if infer is not None else dk.INFER_FN()
    path = os.fsencode(library)

    def definition(key):
        return dk.TvmFfiDef(ctypes.sizeof(dk.TvmFfiDef), name.encode(), path, function.encode(),
                            ",".join(names).encode(), device_mask, num_outputs, callback, key, _destroy)

    _register(name, definition, "dlkern_register_tvm_ffi", (callback, infer), replace)


def unregister_kernel(name):
    """Removes kernel `name` from the registry (calls in flight finish first)."""
    library()._check(library().lib.dlkern_unregister_kernel(name.encode()))
    _NAMES.pop(name, None)


@atexit.register
def _unregister_all():
    # Nothing may call into Python once the interpreter is gone.
    for name in list(_NAMES):
        try:
            unregister_kernel(name)
        except Exception:  # noqa: BLE001 - at exit, best effort
            traceback.print_exc()
