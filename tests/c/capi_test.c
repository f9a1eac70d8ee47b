/* The C ABI from C: header layout, built-in and user kernels, inference, errors, plug-ins.
 * Built and run by tests/capi.rs: capi_test <path of cpu_plugin.so> */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dlkern.h"

_Static_assert(sizeof(DLTensor) == 48, "DLTensor layout");
_Static_assert(sizeof(dlkern_attr) == 64, "dlkern_attr layout (must match host/registry/attributes.rs)");
_Static_assert(sizeof(dlkern_kernel_def) == 56, "dlkern_kernel_def layout (must match host/capi)");
_Static_assert(sizeof(dlkern_plugin_api) == 24, "dlkern_plugin_api layout");

#define CHECK(cond)                                                                              \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      fprintf(stderr, "FAIL %s:%d: %s (last error: %s)\n", __FILE__, __LINE__, #cond,           \
              dlkern_last_error());                                                              \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

static int destroyed = 0;
static void destroy_token(void* token) { destroyed += *(int*)token; }

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

/* y = x * factor (attribute "factor", default 1); refuses negative factors. */
static int32_t scale_compute(DLTensor* t, int32_t num_inputs, int32_t num_outputs,
                             const char* name, void* stream, const dlkern_attr* attrs,
                             int32_t num_attrs, void* user_data, char* err, size_t err_len) {
  (void)stream;
  (void)user_data;
  if (num_inputs != 1 || num_outputs != 1) {
    snprintf(err, err_len, "%s: expected 1 input and 1 output", name);
    return 1;
  }
  double factor = 1.0;
  for (int i = 0; i < num_attrs; ++i)
    if (strcmp(attrs[i].name, "factor") == 0 && attrs[i].kind == DLKERN_ATTR_FLOAT) factor = attrs[i].f;
  if (factor < 0) {
    snprintf(err, err_len, "negative factor %g", factor);
    return 7;
  }
  const float* x = (const float*)((const char*)t[0].data + t[0].byte_offset);
  float* y = (float*)((char*)t[1].data + t[1].byte_offset);
  for (int64_t i = 0; i < numel(&t[0]); ++i) y[i] = (float)(x[i] * factor);
  return 0;
}

static int32_t scale_infer(const DLTensor* in, int32_t num_inputs, DLTensor* out, int32_t num_outputs,
                           const char* name, const dlkern_attr* attrs, int32_t num_attrs,
                           void* user_data, char* err, size_t err_len) {
  (void)name; (void)attrs; (void)num_attrs; (void)user_data; (void)err; (void)err_len;
  if (num_inputs != 1 || num_outputs != 1) return 1;
  out[0].ndim = in[0].ndim;
  out[0].dtype = in[0].dtype;
  memcpy(out[0].shape, in[0].shape, sizeof(int64_t) * (size_t)in[0].ndim);
  return 0;
}

static DLTensor cpu_f32(float* data, int64_t* shape, int32_t ndim) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

int main(int argc, char** argv) {
  CHECK(argc == 2);
  CHECK(dlkern_abi_version() == DLKERN_ABI_VERSION);
  CHECK(dlkern_device_bytes_held() == 0); /* nothing repacked: no ONNX node has run */

  char names[4096];
  int64_t need = dlkern_list_kernels(NULL, 0);
  CHECK(need > 1 && need < (int64_t)sizeof names);
  CHECK(dlkern_list_kernels(names, sizeof names) == need);
  CHECK(strstr(names, "dlkern.rmsnorm") != NULL);

  /* Built-in RMSNorm on CPU tensors. */
  float x[8] = {1, 2, 3, 4, -1, 0, 0, 1};
  float w[4] = {1, 1, 1, 2};
  float y[8];
  int64_t x_shape[2] = {2, 4}, w_shape[1] = {4};
  DLTensor rms[3] = {cpu_f32(x, x_shape, 2), cpu_f32(w, w_shape, 1), cpu_f32(y, x_shape, 2)};
  dlkern_attr eps = {"epsilon", DLKERN_ATTR_FLOAT, 0, 0.0, NULL, NULL, NULL, 0};
  CHECK(dlkern_call("dlkern.rmsnorm", rms, 2, 1, NULL, &eps, 1) == DLKERN_OK);
  CHECK(fabsf(y[3] - 8.0f / sqrtf(7.5f)) < 1e-6f);
  CHECK(fabsf(y[4] + 1.0f / sqrtf(0.5f)) < 1e-6f);

  /* A user kernel. */
  int token = 5;
  dlkern_kernel_def def = {sizeof(dlkern_kernel_def), "c.scale", scale_compute, scale_infer,
                           DLKERN_DEVICE_CPU, 1, &token, destroy_token};
  CHECK(dlkern_register_kernel(&def, 0) == DLKERN_OK);
  CHECK(dlkern_register_kernel(&def, 0) == DLKERN_ERR_DUPLICATE_KERNEL);
  CHECK(strstr(dlkern_last_error(), "already registered") != NULL);

  int64_t out_shape[DLKERN_MAX_NDIM];
  DLTensor out;
  memset(&out, 0, sizeof out);
  out.shape = out_shape;
  CHECK(dlkern_infer("c.scale", rms, 1, &out, 1, NULL, 0) == DLKERN_OK);
  CHECK(out.ndim == 2 && out_shape[0] == 2 && out_shape[1] == 4 && out.dtype.bits == 32);

  float scaled[8];
  DLTensor io[2] = {cpu_f32(x, x_shape, 2), cpu_f32(scaled, x_shape, 2)};
  dlkern_attr factor = {"factor", DLKERN_ATTR_FLOAT, 0, 2.5, NULL, NULL, NULL, 0};
  CHECK(dlkern_call("c.scale", io, 1, 1, NULL, &factor, 1) == DLKERN_OK);
  CHECK(scaled[3] == 10.0f && scaled[4] == -2.5f);
  CHECK(strcmp(dlkern_last_error(), "") == 0);
  CHECK(dlkern_last_error_code() == DLKERN_OK);

  /* The kernel's own failure message reaches the caller. */
  factor.f = -1.0;
  CHECK(dlkern_call("c.scale", io, 1, 1, NULL, &factor, 1) == DLKERN_ERR_KERNEL_FAILED);
  CHECK(strstr(dlkern_last_error(), "negative factor -1") != NULL);
  CHECK(dlkern_last_error_code() == DLKERN_ERR_KERNEL_FAILED);

  /* Errors: unknown names (with suggestions), null pointers, bad tensors, bad counts. */
  CHECK(dlkern_call("c.scael", io, 1, 1, NULL, NULL, 0) == DLKERN_ERR_UNKNOWN_KERNEL);
  CHECK(strstr(dlkern_last_error(), "did you mean c.scale") != NULL);
  CHECK(dlkern_call(NULL, io, 1, 1, NULL, NULL, 0) == DLKERN_ERR_INVALID_ARGUMENT);
  CHECK(dlkern_call("c.scale", NULL, 1, 1, NULL, NULL, 0) == DLKERN_ERR_INVALID_ARGUMENT);
  CHECK(dlkern_call("c.scale", io, -1, 1, NULL, NULL, 0) == DLKERN_ERR_INVALID_ARGUMENT);
  CHECK(dlkern_call("c.scale", io, 1, 1, NULL, NULL, -3) == DLKERN_ERR_INVALID_ARGUMENT);
  int64_t negative[2] = {2, -4};
  DLTensor bad[2] = {cpu_f32(x, negative, 2), cpu_f32(scaled, x_shape, 2)};
  CHECK(dlkern_call("c.scale", bad, 1, 1, NULL, NULL, 0) == DLKERN_ERR_INVALID_ARGUMENT);
  CHECK(strstr(dlkern_last_error(), "dimension 1 is negative") != NULL);
  def.compute = NULL;
  def.name = "c.no_compute";
  CHECK(dlkern_register_kernel(&def, 0) == DLKERN_ERR_INVALID_ARGUMENT);
  CHECK(dlkern_register_kernel(NULL, 0) == DLKERN_ERR_INVALID_ARGUMENT);

  /* Unregistering releases the user data exactly once. */
  CHECK(dlkern_unregister_kernel("c.scale") == DLKERN_OK);
  CHECK(destroyed == 5);
  CHECK(dlkern_unregister_kernel("c.scale") == DLKERN_ERR_UNKNOWN_KERNEL);

  /* Plug-ins. */
  CHECK(dlkern_load_plugin("/nonexistent/libnothing.so") == DLKERN_ERR_PLUGIN);
  CHECK(dlkern_load_plugin(argv[1]) == DLKERN_OK);
  float negated[8];
  DLTensor neg[2] = {cpu_f32(x, x_shape, 2), cpu_f32(negated, x_shape, 2)};
  CHECK(dlkern_call("plugin.negate", neg, 1, 1, NULL, NULL, 0) == DLKERN_OK);
  CHECK(negated[0] == -1.0f && negated[3] == -4.0f && negated[4] == 1.0f);
  CHECK(dlkern_load_plugin(argv[1]) == DLKERN_ERR_PLUGIN); /* registers the same name again */
  CHECK(strstr(dlkern_last_error(), "already registered") != NULL);

  printf("capi_test: all checks passed\n");
  return 0;
}
