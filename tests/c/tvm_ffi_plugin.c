/* A TVM-FFI library written in C against apache-tvm-ffi's C ABI, for dlkern's tests:
 * scale_add(x, y, out, alpha: float, offset: int, mode: str) writes
 * out = alpha * x + y + offset ("add") or alpha * x - y + offset ("sub") over f32 CPU tensors of
 * one shape, and raises TVM-FFI errors (kind and message) for anything else; returns_a_value
 * returns an int, which a destination-passing caller must refuse. */
#include <string.h>

#include <tvm/ffi/c_api.h>

static int fail(const char* kind, const char* message) {
  TVMFFIErrorSetRaisedFromCStr(kind, message);
  return -1;
}

/* A tensor argument: a DLTensor* (what dlkern passes) or a tensor object (what TVM-FFI's own
 * callers pass), whose DLTensor follows the object header. NULL for anything else. */
static DLTensor* tensor_arg(const TVMFFIAny* arg) {
  if (arg->type_index == kTVMFFIDLTensorPtr) return (DLTensor*)arg->v_ptr;
  if (arg->type_index == kTVMFFITensor) return (DLTensor*)((char*)arg->v_obj + sizeof(TVMFFIObject));
  return NULL;
}

/* A string argument as bytes: a C string (dlkern), a small string held in the value itself or a
 * string object (TVM-FFI's own callers). 0 when the argument is not a string. */
static int string_arg(const TVMFFIAny* arg, const char** data, size_t* size) {
  if (arg->type_index == kTVMFFIRawStr) {
    *data = arg->v_c_str;
    *size = strlen(arg->v_c_str);
  } else if (arg->type_index == kTVMFFISmallStr) {
    *data = arg->v_bytes;
    *size = arg->small_str_len;
  } else if (arg->type_index == kTVMFFIStr) {
    const TVMFFIByteArray* bytes = (const TVMFFIByteArray*)((const char*)arg->v_obj + sizeof(TVMFFIObject));
    *data = bytes->data;
    *size = bytes->size;
  } else {
    return 0;
  }
  return 1;
}

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

static int same_shape(const DLTensor* a, const DLTensor* b) {
  if (a->ndim != b->ndim) return 0;
  for (int32_t i = 0; i < a->ndim; ++i)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

/* Row-major without gaps: no strides, or the strides of that layout (TVM-FFI's tensors always
 * carry strides). */
static int is_contiguous(const DLTensor* t) {
  if (t->strides == NULL) return 1;
  int64_t expected = 1;
  for (int32_t i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && t->strides[i] != expected) return 0;
    expected *= t->shape[i];
  }
  return 1;
}

static int is_f32_cpu(const DLTensor* t) {
  return t->device.device_type == kDLCPU && t->dtype.code == kDLFloat && t->dtype.bits == 32 &&
         t->dtype.lanes == 1 && is_contiguous(t);
}

TVM_FFI_DLL_EXPORT int __tvm_ffi_scale_add(void* self, const TVMFFIAny* args, int32_t num_args,
                                           TVMFFIAny* result) {
  (void)self;
  if (num_args != 6) return fail("TypeError", "scale_add takes x, y, out, alpha, offset, mode");
  const DLTensor* x = tensor_arg(&args[0]);
  const DLTensor* y = tensor_arg(&args[1]);
  DLTensor* out = tensor_arg(&args[2]);
  if (x == NULL || y == NULL || out == NULL) return fail("TypeError", "scale_add: x, y and out must be tensors");
  const char* mode;
  size_t mode_len;
  if (args[3].type_index != kTVMFFIFloat || args[4].type_index != kTVMFFIInt || !string_arg(&args[5], &mode, &mode_len))
    return fail("TypeError", "scale_add: alpha is a float, offset an int, mode a string");
  if (!is_f32_cpu(x) || !is_f32_cpu(y) || !is_f32_cpu(out))
    return fail("TypeError", "scale_add: takes contiguous float32 CPU tensors");
  if (!same_shape(x, y) || !same_shape(x, out))
    return fail("ValueError", "scale_add: x, y and out must have one shape");
  float sign;
  if (mode_len == 3 && memcmp(mode, "add", 3) == 0) {
    sign = 1.0f;
  } else if (mode_len == 3 && memcmp(mode, "sub", 3) == 0) {
    sign = -1.0f;
  } else {
    return fail("ValueError", "scale_add: mode must be \"add\" or \"sub\"");
  }
  const float* xs = (const float*)((const char*)x->data + x->byte_offset);
  const float* ys = (const float*)((const char*)y->data + y->byte_offset);
  float* os = (float*)((char*)out->data + out->byte_offset);
  const float alpha = (float)args[3].v_float64, offset = (float)args[4].v_int64;
  for (int64_t i = 0, n = numel(x); i < n; ++i) os[i] = alpha * xs[i] + sign * ys[i] + offset;
  result->type_index = kTVMFFINone;
  return 0;
}

TVM_FFI_DLL_EXPORT int __tvm_ffi_returns_a_value(void* self, const TVMFFIAny* args, int32_t num_args,
                                                 TVMFFIAny* result) {
  (void)self;
  (void)args;
  (void)num_args;
  result->type_index = kTVMFFIInt;
  result->v_int64 = 42;
  return 0;
}
