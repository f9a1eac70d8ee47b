// A TVM-FFI library in CUDA C++, as FlashInfer-style kernels are exported (built with nvcc on
// the GPU host by tests/python/test_tvm_ffi.py): scale_add_cuda(x, y, out, alpha) writes
// out = alpha * x + y over float32 CUDA tensors on the TVM-FFI environment stream, raising
// ValueError for anything else; last_stream() returns the stream the last call ran on.
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include <atomic>

namespace {

std::atomic<int64_t> last_stream{0};

__global__ void ScaleAddKernel(const float* x, const float* y, float* out, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = alpha * x[i] + y[i];
  }
}

bool IsF32Cuda(const tvm::ffi::TensorView& t) {
  DLDataType dtype = t.dtype();
  return t.device().device_type == kDLCUDA && dtype.code == kDLFloat && dtype.bits == 32 && dtype.lanes == 1;
}

void ScaleAddCuda(tvm::ffi::TensorView x, tvm::ffi::TensorView y, tvm::ffi::TensorView out, double alpha) {
  if (!IsF32Cuda(x) || !IsF32Cuda(y) || !IsF32Cuda(out)) {
    TVM_FFI_THROW(ValueError) << "scale_add_cuda takes float32 CUDA tensors";
  }
  if (x.numel() != y.numel() || x.numel() != out.numel()) {
    TVM_FFI_THROW(ValueError) << "scale_add_cuda: x, y and out differ in size";
  }
  DLDevice device = out.device();
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
  last_stream.store(reinterpret_cast<int64_t>(stream));
  int64_t n = out.numel();
  int blocks = static_cast<int>(n / 256 + 1 < 1024 ? n / 256 + 1 : 1024);
  ScaleAddKernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(x.data_ptr()),
                                             static_cast<const float*>(y.data_ptr()),
                                             static_cast<float*>(out.data_ptr()), static_cast<float>(alpha), n);
  cudaError_t launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    TVM_FFI_THROW(RuntimeError) << "scale_add_cuda: " << cudaGetErrorString(launched);
  }
}

int64_t LastStream() { return last_stream.load(); }

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale_add_cuda, ScaleAddCuda);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(last_stream, LastStream);
