"""dlkern's Python side: run its kernels on NumPy / PyTorch / CuPy arrays (`dlkern.call`,
`dlkern.kernel`), register libdlkern.so with ONNX Runtime (`dlkern.session_options`,
`dlkern.get_library_path`), `dlkern.retarget` (move an ONNX model's nodes to dlkern's ops) and
`dlkern.synth` (builder-shaped LLM graphs with random weights, for shapes no fixture covers),
and Python functions and TVM-FFI functions as registry kernels (`dlkern.register_kernel`,
`dlkern.register_tvm_ffi`: an ORT `DLPackKernel` node then runs them).

The C ABI wrapper and the ONNX test-model helpers are the modules `dlkern_ctypes` and
`dlkern_onnx` beside this package."""

from .kernels import call, get_library_path, kernel, library, session_options
from .python_kernels import TensorSpec, register_kernel, register_tvm_ffi, unregister_kernel

__all__ = ["TensorSpec", "call", "get_library_path", "kernel", "library", "register_kernel", "register_tvm_ffi",
           "session_options", "unregister_kernel"]
