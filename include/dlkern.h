/*
 * dlkern C ABI: a registry of kernels that take DLPack tensors, found by name.
 *
 * Kernels come from dlkern itself (built-ins, e.g. "dlkern.rmsnorm") or from users: any C
 * function with the dlkern_compute_fn signature, registered at run time directly
 * (dlkern_register_kernel) or by a plug-in library the host application loads
 * (dlkern_load_plugin). Link against libdlkern.so, or receive the function table in a plug-in.
 *
 * OWNERSHIP AND LIFETIME
 * - Tensors are always borrowed. dlkern never frees, retains or reallocates a DLTensor, its
 *   shape/strides arrays or its data beyond the call it was passed to.
 * - Outputs are allocated by the caller. dlkern_infer tells the caller their dtype and shape
 *   when the kernel provides inference (ONNX Runtime's ops allocate through ORT this way).
 * - Strings passed in (names, attribute strings) are copied if kept; pass any storage.
 * - dlkern_register_kernel copies the definition. If it succeeds, user_data is owned by the
 *   registry from then on (if it fails, user_data stays the caller's and destroy is not called): destroy(user_data) runs exactly once, when the kernel is unregistered or replaced and
 *   the last call using it has returned (or never, if it stays registered until exit).
 * - dlkern_last_error's string belongs to the calling thread and is valid until that thread's
 *   next dlkern call.
 * - Plug-in libraries are never unloaded.
 *
 * THREADING
 * - Every function may be called from any thread, concurrently. Registration, unregistration,
 *   listing, inference and calls are safe against each other. A compute function may run on
 *   several threads at once, with the same user_data: make it thread-safe or serialize inside.
 * - A call in flight keeps the kernel it found: unregistering or replacing it does not affect
 *   the running call.
 *
 * CUDA
 * - For kDLCUDA tensors, `stream` is a CUstream / cudaStream_t of the tensors' device's primary
 *   context (NULL = legacy default stream). dlkern's kernels only enqueue work on it: results
 *   are ready when the stream is synchronized. Compute functions must do the same (no implicit
 *   device synchronization is required or performed).
 *
 * ERRORS
 * - Functions return DLKERN_OK (0) or a DLKERN_ERR_* code; dlkern_last_error() says why.
 * - Compute/infer functions return 0, or non-zero after writing a NUL-terminated message of at
 *   most error_buf_len bytes into error_buf (snprintf). The message reaches the caller.
 * - No C++ exception or Rust panic may cross these functions (dlkern catches its own panics).
 */
#ifndef DLKERN_H_
#define DLKERN_H_

#include <stddef.h>
#include <stdint.h>

#include "dlpack/dlpack.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DLKERN_ABI_VERSION 1
/* Most dimensions of a tensor dlkern accepts; size of the shape buffers dlkern_infer fills. */
#define DLKERN_MAX_NDIM 16

/* Return codes. */
#define DLKERN_OK 0
#define DLKERN_ERR_INVALID_ARGUMENT 1 /* bad tensor, shape, dtype, stride, attribute, pointer */
#define DLKERN_ERR_UNKNOWN_KERNEL 2   /* no such name (the message suggests close matches) */
#define DLKERN_ERR_DUPLICATE_KERNEL 3 /* name taken and replace == 0 */
#define DLKERN_ERR_KERNEL_FAILED 4    /* the kernel reported a failure */
#define DLKERN_ERR_CUDA 5             /* no driver/device, or a CUDA call failed */
#define DLKERN_ERR_PLUGIN 6           /* a plug-in failed to load or register */
#define DLKERN_ERR_INTERNAL 7         /* a bug in dlkern, contained */

/* Device masks for dlkern_kernel_def.device_mask: bit (1 << DLDeviceType). */
#define DLKERN_DEVICE_CPU (1u << kDLCPU)
#define DLKERN_DEVICE_CUDA (1u << kDLCUDA)

/* Attribute kinds. */
#define DLKERN_ATTR_INT 0
#define DLKERN_ATTR_FLOAT 1
#define DLKERN_ATTR_STRING 2
#define DLKERN_ATTR_INTS 3
#define DLKERN_ATTR_FLOATS 4

/* One named attribute. Only the field(s) of its kind are read: i, f, s, or ints/floats with
 * count elements. */
typedef struct dlkern_attr {
  const char* name;
  int32_t kind;
  int64_t i;
  double f;
  const char* s;
  const int64_t* ints;
  const double* floats;
  int64_t count;
} dlkern_attr;

/* A kernel. tensors[0 .. num_inputs) are inputs, tensors[num_inputs .. num_inputs+num_outputs)
 * are caller-allocated outputs to write. function_name is the name it was called by. */
typedef int32_t (*dlkern_compute_fn)(DLTensor* tensors, int32_t num_inputs, int32_t num_outputs,
                                     const char* function_name, void* stream,
                                     const dlkern_attr* attrs, int32_t num_attrs, void* user_data,
                                     char* error_buf, size_t error_buf_len);

/* Output inference: from the inputs' dtype/shape/device (data may be NULL), set each output's
 * ndim (<= DLKERN_MAX_NDIM), dtype, and shape[0 .. ndim) (shape points to DLKERN_MAX_NDIM
 * int64s owned by dlkern). */
typedef int32_t (*dlkern_infer_fn)(const DLTensor* inputs, int32_t num_inputs, DLTensor* outputs,
                                   int32_t num_outputs, const char* function_name,
                                   const dlkern_attr* attrs, int32_t num_attrs, void* user_data,
                                   char* error_buf, size_t error_buf_len);

typedef struct dlkern_kernel_def {
  uint32_t struct_size;       /* sizeof(dlkern_kernel_def) */
  const char* name;           /* unique; no NUL or newline */
  dlkern_compute_fn compute;  /* required */
  dlkern_infer_fn infer;      /* optional (NULL: callers must know the output shapes) */
  uint32_t device_mask;       /* DLKERN_DEVICE_CPU | DLKERN_DEVICE_CUDA */
  int32_t num_outputs;        /* fixed count, or -1 for any */
  void* user_data;            /* passed to compute/infer; owned by the registry */
  void (*destroy)(void* user_data); /* optional; see OWNERSHIP */
} dlkern_kernel_def;

/* The table a plug-in's dlkern_plugin_init receives. */
typedef struct dlkern_plugin_api {
  uint32_t abi_version; /* DLKERN_ABI_VERSION of the loading dlkern */
  int32_t (*register_kernel)(const dlkern_kernel_def* def, int32_t replace);
  const char* (*last_error)(void);
} dlkern_plugin_api;

/* A plug-in library exports this; it registers its kernels and returns 0. */
typedef int32_t (*dlkern_plugin_init_fn)(const dlkern_plugin_api* api);
#define DLKERN_PLUGIN_INIT_SYMBOL "dlkern_plugin_init"

int32_t dlkern_abi_version(void);
const char* dlkern_last_error(void);
/* The DLKERN_* code of the calling thread's last call (DLKERN_OK after a success), for the
 * entries that return something else (dlkern_call_object). */
int32_t dlkern_last_error_code(void);

/* Registers a kernel; replace != 0 swaps an existing one of the same name. */
int32_t dlkern_register_kernel(const dlkern_kernel_def* def, int32_t replace);
int32_t dlkern_unregister_kernel(const char* name);

/* A TVM-FFI function (apache-tvm-ffi's C ABI: a symbol `__tvm_ffi_<function>` of type
 * TVMFFISafeCallType, as TVM_FFI_DLL_EXPORT_TYPED_FUNC makes) as a kernel. It is called
 * destination-passing: the inputs, then the outputs (each a DLTensor*, kTVMFFIDLTensorPtr), then
 * the attributes named in attribute_names, in that order (int, float or string; every one must
 * be set at each call); it writes the outputs and returns nothing. For CUDA tensors the call's
 * stream is the device's TVM-FFI environment stream while it runs (TVMFFIEnvGetStream reads it);
 * an error it raises (TVMFFIErrorSetRaised...) is the call's error, "kind: message". dlkern does
 * not link libtvm_ffi: it finds TVMFFIEnvSetStream, TVMFFIErrorMoveFromRaised and
 * TVMFFIObjectDecRef through the function's library, which links it. The library is loaded by
 * path and never unloaded (trust it as a plug-in). user_data/destroy: as dlkern_kernel_def's. */
typedef struct dlkern_tvm_ffi_def {
  uint32_t struct_size;        /* sizeof(dlkern_tvm_ffi_def) */
  const char* name;            /* registry name */
  const char* library;         /* path of the shared library that exports the function */
  const char* function;        /* "add_one" looks up __tvm_ffi_add_one (a "__tvm_ffi_" name as is) */
  const char* attribute_names; /* comma-separated, in argument order; NULL or "" for none */
  uint32_t device_mask;        /* DLKERN_DEVICE_CPU | DLKERN_DEVICE_CUDA */
  int32_t num_outputs;         /* fixed count, at least 1 */
  dlkern_infer_fn infer;       /* NULL: every output has input 0's dtype and shape */
  void* user_data;             /* passed to infer */
  void (*destroy)(void* user_data);
} dlkern_tvm_ffi_def;
int32_t dlkern_register_tvm_ffi(const dlkern_tvm_ffi_def* def, int32_t replace);

/* Names of all kernels, '\n'-separated, NUL-terminated, written when len suffices. Returns the
 * bytes needed including the NUL (call with buf = NULL, len = 0 to size), or -code on error. */
int64_t dlkern_list_kernels(char* buf, size_t len);

/* Calls kernel `name`: tensors holds num_inputs inputs then num_outputs outputs. */
int32_t dlkern_call(const char* name, DLTensor* tensors, int32_t num_inputs, int32_t num_outputs,
                    void* stream, const dlkern_attr* attrs, int32_t num_attrs);

/* A call site: a caller that calls the same kernel again and again from one place (a layer's
 * projection, say) keeps one, and says which inputs never change there: bit i of
 * constant_inputs set means input i is the same tensor (same address, same contents) at every
 * call through the site. A kernel may then keep what it derives from those inputs with the site
 * (dlkern.matmul_nbits: a copy of constant CUDA weights repacked for its fast decode path, made
 * at the first call, which waits for the stream once) until dlkern_site_destroy. NULL when out
 * of memory. A site may be used from one thread at a time, or from several with calls that do
 * not overlap in time. */
typedef struct dlkern_site dlkern_site;
dlkern_site* dlkern_site_create(uint64_t constant_inputs);
/* Frees the site and what kernels kept with it (NULL: nothing); no call may use it after. */
void dlkern_site_destroy(dlkern_site* site);
/* dlkern_call through a site (NULL site: an error). */
int32_t dlkern_call_at(dlkern_site* site, const char* name, DLTensor* tensors, int32_t num_inputs,
                       int32_t num_outputs, void* stream, const dlkern_attr* attrs, int32_t num_attrs);

/* dlkern_call on a framework's own tensor objects, through DLPack's C exchange API: `api` is a
 * `const DLPackExchangeAPI*` (dlpack.h 1.2+, the table behind a tensor type's
 * `__dlpack_c_exchange_api__`; void here because the dlpack.h shipped beside this header is
 * 1.1). dlkern walks its prev_api chain to the DLPack major version it reads.
 * - inputs: num_inputs (>= 1) objects of the table's type (PyObject* for Python frameworks),
 *   read through dltensor_from_py_object_no_sync: borrowed, nothing retained. The array needs
 *   no alignment (Python passes the bytes of a packed struct).
 * - outputs: num_outputs slots. Their shapes come from the kernel's inference, their memory from
 *   the table's managed_tensor_allocator on the first input's device, and each slot receives a
 *   new object (a new reference) made by managed_tensor_to_py_object_no_sync. On failure the
 *   slots hold NULL, except after a failed conversion of output i: the objects before it are
 *   in their slots, and releasing them is the caller's.
 * - stream NULL on CUDA: the table's current_work_stream of the first input's device (torch:
 *   the current stream), so the kernel is ordered after the framework's work. No other
 *   synchronization happens (the table's functions are the `_no_sync` ones).
 * - site: NULL, or a site of dlkern_site_create as for dlkern_call_at.
 * - The table's functions need what the framework needs: for Python, call with the GIL held
 *   (ctypes.PyDLL). A failed table function leaves its Python exception set; dlkern's code
 *   and message come back as usual. */
int32_t dlkern_call_objects(dlkern_site* site, const char* name, const void* api, void* const* inputs,
                            int32_t num_inputs, void** outputs, int32_t num_outputs, void* stream,
                            const dlkern_attr* attrs, int32_t num_attrs);

/* dlkern_call_objects for a kernel with one output, which it returns: a new object (a new
 * reference), or `failed` on failure (dlkern_last_error_code() and dlkern_last_error() say why).
 * From Python declare restype ctypes.py_object, which takes the reference over (no output array,
 * no release afterwards), and pass a sentinel object as `failed` (ctypes cannot take NULL back
 * as a py_object; it then holds one reference to the sentinel that it was never given: add one). */
void* dlkern_call_object(dlkern_site* site, const char* name, const void* api, void* const* inputs,
                         int32_t num_inputs, void* stream, const dlkern_attr* attrs, int32_t num_attrs,
                         void* failed);

/* Infers the outputs of kernel `name` (each outputs[i].shape must point to DLKERN_MAX_NDIM
 * int64s; ndim, dtype and shape are written). */
int32_t dlkern_infer(const char* name, const DLTensor* inputs, int32_t num_inputs,
                     DLTensor* outputs, int32_t num_outputs, const dlkern_attr* attrs,
                     int32_t num_attrs);

/* Device memory dlkern keeps between calls, in bytes, over all devices: the copies of constant
 * weights that dlkern.matmul_nbits repacks for ONNX nodes (freed with their sessions). */
uint64_t dlkern_device_bytes_held(void);

/* Host applications only: loads a plug-in library by path and runs its dlkern_plugin_init.
 * Nothing in dlkern (in particular no ONNX model or operator attribute) loads code by itself. */
int32_t dlkern_load_plugin(const char* path);

#ifdef __cplusplus
}
#endif

#endif /* DLKERN_H_ */
