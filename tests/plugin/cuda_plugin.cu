// A third-party CUDA C kernel as a dlkern plug-in: compiled by nvcc on its own, loaded by the
// host application with dlkern_load_plugin, registered by name, called on DLPack tensors.
//
//   nvcc -shared -Xcompiler -fPIC -I include tests/plugin/cuda_plugin.cu -o libcuda_plugin.so
//
// Registers "plugin.saxpy": y = a * x + b elementwise (f32, CUDA, contiguous), attributes a, b.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "dlkern.h"

__global__ void saxpy_kernel(const float* x, float* y, float a, float b, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}

static int contiguous(const DLTensor* t) {
  if (t->strides == NULL) return 1;
  long long expected = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

static int32_t saxpy(DLTensor* t, int32_t num_inputs, int32_t num_outputs, const char* name,
                     void* stream, const dlkern_attr* attrs, int32_t num_attrs, void* user_data,
                     char* err, size_t err_len) {
  (void)user_data;
  if (num_inputs != 1 || num_outputs != 1) {
    snprintf(err, err_len, "%s: needs 1 input and 1 output", name);
    return 1;
  }
  for (int k = 0; k < 2; ++k) {
    if (t[k].device.device_type != kDLCUDA || t[k].dtype.code != kDLFloat || t[k].dtype.bits != 32 ||
        !contiguous(&t[k])) {
      snprintf(err, err_len, "%s: tensor %d must be a contiguous f32 CUDA tensor", name, k);
      return 1;
    }
  }
  long long n = 1, m = 1;
  for (int d = 0; d < t[0].ndim; ++d) n *= t[0].shape[d];
  for (int d = 0; d < t[1].ndim; ++d) m *= t[1].shape[d];
  if (n != m) {
    snprintf(err, err_len, "%s: x has %lld elements, y %lld", name, n, m);
    return 1;
  }
  float a = 1.0f, b = 0.0f;
  for (int i = 0; i < num_attrs; ++i) {
    if (strcmp(attrs[i].name, "a") == 0) a = (float)attrs[i].f;
    if (strcmp(attrs[i].name, "b") == 0) b = (float)attrs[i].f;
  }
  if (n == 0) return 0;
  const float* x = (const float*)((const char*)t[0].data + t[0].byte_offset);
  float* y = (float*)((char*)t[1].data + t[1].byte_offset);
  unsigned blocks = (unsigned)((n + 255) / 256);
  saxpy_kernel<<<blocks, 256, 0, (cudaStream_t)stream>>>(x, y, a, b, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    snprintf(err, err_len, "%s: launch failed: %s", name, cudaGetErrorString(e));
    return 2;
  }
  return 0;
}

// Output inference, so ONNX Runtime's DLPackKernel can allocate y: same type and shape as x.
static int32_t saxpy_infer(const DLTensor* in, int32_t num_inputs, DLTensor* out, int32_t num_outputs,
                           const char* name, const dlkern_attr* attrs, int32_t num_attrs,
                           void* user_data, char* err, size_t err_len) {
  (void)attrs; (void)num_attrs; (void)user_data;
  if (num_inputs != 1 || num_outputs != 1) {
    snprintf(err, err_len, "%s: needs 1 input and 1 output", name);
    return 1;
  }
  out[0].ndim = in[0].ndim;
  out[0].dtype = in[0].dtype;
  for (int d = 0; d < in[0].ndim; ++d) out[0].shape[d] = in[0].shape[d];
  return 0;
}

extern "C" int32_t dlkern_plugin_init(const dlkern_plugin_api* api) {
  if (api->abi_version != DLKERN_ABI_VERSION) return 1;
  dlkern_kernel_def def = {sizeof(dlkern_kernel_def), "plugin.saxpy", saxpy, saxpy_infer,
                           DLKERN_DEVICE_CUDA, 1, NULL, NULL};
  return api->register_kernel(&def, 0);
}
