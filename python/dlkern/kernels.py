"""Any registry kernel of libdlkern.so on NumPy arrays or PyTorch / CuPy tensors, without ONNX
Runtime: the outputs are allocated from the kernel's own shape inference, like the inputs'
kind (NumPy for NumPy, torch on the inputs' device for torch), and the tensors cross through
DLPack without copies.

    import dlkern
    y = dlkern.call("dlkern.rmsnorm", x, w, epsilon=1e-6)
    q, scales = dlkern.call("dlkern.quantize_per_token", x, num_outputs=2)
    so = dlkern.session_options()          # an onnxruntime.SessionOptions with the library

CUDA tensors run on the current torch stream unless `stream` (a CUstream handle) is given.
Errors are `dlkern_ctypes.DLKernError`s carrying dlkern's message.

Tensors whose type publishes DLPack's C exchange table (PyTorch >= 2.10:
`torch.Tensor.__dlpack_c_exchange_api__`) take one C call per kernel call: dlkern reads them,
allocates the outputs with the framework's allocator and asks it for its current stream, with
no `__dlpack__` capsules and no shape inference round trip. Other arrays go through
`__dlpack__`. Set `USE_EXCHANGE_TABLES = False` to compare the two.
"""

import os
import weakref
from pathlib import Path

import dlkern_ctypes as dk

_LIBRARY = None
USE_EXCHANGE_TABLES = True

# DLPack (code, bits) of the dtypes dlkern's kernels take and give.
_NUMPY_TYPES = {(2, 16): "float16", (2, 32): "float32", (2, 64): "float64", (0, 8): "int8", (1, 8): "uint8",
                (0, 32): "int32", (0, 64): "int64"}
_TORCH_TYPES = {**_NUMPY_TYPES, (4, 16): "bfloat16"}


def get_library_path():
    """The libdlkern.so to load: $DLKERN_LIB, else one inside this package (an installed
    wheel), else the repository's release build, then its debug build."""
    here = Path(__file__).resolve().parent
    candidates = [os.environ.get("DLKERN_LIB"), here / "libdlkern.so",
                  here.parent.parent / "target" / "release" / "libdlkern.so",
                  here.parent.parent / "target" / "debug" / "libdlkern.so"]
    for path in candidates:
        if path and Path(path).is_file():
            return str(Path(path).resolve())
    raise FileNotFoundError("no libdlkern.so: set DLKERN_LIB, or build it (cargo build --release)")


def library():
    """The loaded library (one per process: ORT sessions that register the same path share its
    registry)."""
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = dk.Library(get_library_path())
    return _LIBRARY


def session_options(options=None):
    """`options` (a new onnxruntime.SessionOptions by default) with libdlkern.so registered, as
    onnxruntime-extensions' get_library_path() is used."""
    import onnxruntime as ort

    so = options or ort.SessionOptions()
    so.register_custom_ops_library(get_library_path())
    return so


def _empty_like_inputs(inputs, code, bits, shape):
    """An output of DLPack dtype (code, bits) and `shape`, of the first input's kind."""
    first = inputs[0]
    kind = type(first).__module__.split(".")[0]
    if kind == "torch":
        import torch

        dtype = getattr(torch, _TORCH_TYPES[(code, bits)])
        return torch.empty(tuple(shape), dtype=dtype, device=first.device)
    if kind == "cupy":
        import cupy

        return cupy.empty(tuple(shape), dtype=_NUMPY_TYPES[(code, bits)])
    import numpy as np

    if (code, bits) not in _NUMPY_TYPES:
        raise TypeError(f"NumPy has no dtype for DLPack code {code} with {bits} bits (use torch tensors)")
    return np.empty(tuple(shape), dtype=_NUMPY_TYPES[(code, bits)])


def _current_stream(inputs):
    """The current torch CUDA stream where the inputs are torch CUDA tensors, else None."""
    first = inputs[0]
    if type(first).__module__.split(".")[0] == "torch" and first.is_cuda:
        import torch

        return torch.cuda.current_stream(first.device).cuda_stream
    return None


def _shared_exchange_table(inputs):
    """The DLPack C exchange table all `inputs` share (one framework's tensors), else None."""
    first = type(inputs[0])
    table = dk.exchange_table(first)
    if table is None:
        return None
    for x in inputs:
        kind = type(x)
        if kind is not first:
            other = dk.exchange_table(kind)
            if other is None or other.value != table.value:
                return None
    return table


def call(name, *inputs, num_outputs=1, stream=None, **attrs):
    """Runs registry kernel `name` on `inputs` with attributes `attrs`; returns its output, or a
    tuple of `num_outputs` outputs, allocated from the kernel's inference."""
    return _call(name, inputs, num_outputs, stream, attrs, None)


def _call(name, inputs, num_outputs, stream, attrs, site):
    if not inputs:
        raise ValueError(f"{name}: no inputs")
    lib = _LIBRARY or library()
    if USE_EXCHANGE_TABLES:
        table = _shared_exchange_table(inputs)
        if table is not None:
            outputs = lib.call_objects(name, table, inputs, num_outputs, stream, attrs, site)
            return outputs[0] if num_outputs == 1 else tuple(outputs)
    specs = lib.infer(name, inputs, num_outputs, **attrs)
    outputs = [_empty_like_inputs(inputs, code, bits, shape) for code, bits, shape in specs]
    lib.call(name, inputs, outputs, stream=_current_stream(inputs) if stream is None else stream, site=site, **attrs)
    return outputs[0] if num_outputs == 1 else tuple(outputs)


def kernel(name, num_outputs=1, constant_inputs=()):
    """`name` as a function: kernel(name)(*inputs, **attrs) is call(name, *inputs, ...).

    `constant_inputs`: positions of inputs that are the same tensors, with the same contents, at
    every call of this function (a layer's weights). The function then calls through a call
    site of its own (`dlkern_call_at`), where a kernel may keep what it derives from them:
    `dlkern.matmul_nbits` keeps its CUDA weights repacked for its fast decode path, made at the
    first call. Passing other tensors there later is a contract violation (wrong results), as
    for the C ABI's sites. Like a C ABI site, such a function may be called from one thread at a
    time (calls from several threads must not overlap). The site is freed with the function."""
    site = None
    if constant_inputs:
        lib = library()
        site = lib.site_create(constant_inputs)

    def run(*inputs, stream=None, **attrs):
        return _call(name, inputs, num_outputs, stream, attrs, site)

    if site is not None:
        weakref.finalize(run, lib.site_destroy, site)
    run.__name__ = name.replace(".", "_")
    run.__doc__ = f"dlkern kernel {name!r} ({num_outputs} output(s)); see dlkern.call."
    return run
