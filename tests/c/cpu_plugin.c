/* A plug-in as a user would write it: registers "plugin.negate" (CPU, f32, no output
 * inference: callers allocate) and "plugin.scale" (CPU, f32, y = factor * x, output inferred
 * like its input, so an ORT DLPackKernel node can run it) through the table dlkern passes,
 * without linking against libdlkern. */
#include <stdio.h>
#include <string.h>

#include "dlkern.h"

/* y = factor * x over one f32 input and its output. */
static int32_t scaled(DLTensor* t, int32_t num_inputs, int32_t num_outputs, const char* name, double factor,
                      char* err, size_t err_len) {
  if (num_inputs != 1 || num_outputs != 1 || t[0].dtype.code != kDLFloat || t[0].dtype.bits != 32) {
    snprintf(err, err_len, "%s: needs one f32 input and one output", name);
    return 1;
  }
  int64_t n = 1;
  for (int i = 0; i < t[0].ndim; ++i) n *= t[0].shape[i];
  const float* x = (const float*)((const char*)t[0].data + t[0].byte_offset);
  float* y = (float*)((char*)t[1].data + t[1].byte_offset);
  for (int64_t i = 0; i < n; ++i) y[i] = (float)(factor * x[i]);
  return 0;
}

static int32_t negate(DLTensor* t, int32_t num_inputs, int32_t num_outputs, const char* name,
                      void* stream, const dlkern_attr* attrs, int32_t num_attrs, void* user_data,
                      char* err, size_t err_len) {
  (void)stream; (void)attrs; (void)num_attrs; (void)user_data;
  return scaled(t, num_inputs, num_outputs, name, -1.0, err, err_len);
}

static int32_t scale(DLTensor* t, int32_t num_inputs, int32_t num_outputs, const char* name,
                     void* stream, const dlkern_attr* attrs, int32_t num_attrs, void* user_data,
                     char* err, size_t err_len) {
  (void)stream; (void)user_data;
  double factor = 1.0;
  for (int32_t i = 0; i < num_attrs; ++i)
    if (strcmp(attrs[i].name, "factor") == 0 && attrs[i].kind == DLKERN_ATTR_FLOAT) factor = attrs[i].f;
  return scaled(t, num_inputs, num_outputs, name, factor, err, err_len);
}

/* The output has the input's dtype and shape. */
static int32_t like_input(const DLTensor* in, int32_t num_inputs, DLTensor* out, int32_t num_outputs,
                          const char* name, const dlkern_attr* attrs, int32_t num_attrs,
                          void* user_data, char* err, size_t err_len) {
  (void)attrs; (void)num_attrs; (void)user_data;
  if (num_inputs != 1 || num_outputs != 1) {
    snprintf(err, err_len, "%s: one input, one output", name);
    return 1;
  }
  out[0].ndim = in[0].ndim;
  out[0].dtype = in[0].dtype;
  memcpy(out[0].shape, in[0].shape, sizeof(int64_t) * (size_t)in[0].ndim);
  return 0;
}

int32_t dlkern_plugin_init(const dlkern_plugin_api* api) {
  if (api->abi_version != DLKERN_ABI_VERSION) return 1;
  dlkern_kernel_def def = {sizeof(dlkern_kernel_def), "plugin.negate", negate, NULL,
                           DLKERN_DEVICE_CPU, 1, NULL, NULL};
  int32_t code = api->register_kernel(&def, 0);
  if (code != 0) return code;
  dlkern_kernel_def scaled = {sizeof(dlkern_kernel_def), "plugin.scale", scale, like_input,
                              DLKERN_DEVICE_CPU, 1, NULL, NULL};
  return api->register_kernel(&scaled, 0);
}
