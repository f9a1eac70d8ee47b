//! ONNX Runtime custom-op library: `RegisterCustomOps` adds dlkern's op domain to a session.
//!
//! The library never links `libonnxruntime`: it takes the C API from the runtime that loads it
//! (`OrtApiBase::GetApi`), asking for [`ORT_API_VERSION_NEEDED`], and refuses older runtimes with
//! an `OrtStatus` that says so. Ops (domain [`DOMAIN`]; schemas in `docs/ops.md`):
//!
//! - `RMSNorm(X, scale) -> Y`, `epsilon` (float, default 1e-5): the `dlkern.rmsnorm` kernel.
//! - `DLPackKernel(inputs...) -> outputs...`, `function_name` (string, required),
//!   `attribute_names` (string, optional, comma-separated names of the node's other attributes
//!   to pass to the kernel: ORT's kernel-info API has no way to enumerate attributes): calls any
//!   kernel in the registry by name. Inputs and outputs are variadic and heterogeneous; output
//!   shapes come from the kernel's inference function and outputs are allocated through ORT.
//!
//! Every op is registered twice, for `CUDAExecutionProvider` (device pointers, ORT's compute
//! stream, no host copies) and for the CPU execution provider (the CPU references), so a model
//! runs on any ORT build. Failures become `OrtStatus` errors naming the op, the node and the
//! problem; no panic crosses into ORT.

mod api;
mod ops;

use std::ffi::c_char;

pub use api::ORT_API_VERSION_NEEDED;
use ort_sys::{OrtApiBase, OrtSessionOptions, OrtStatus};

/// The op domain of dlkern's ops.
pub const DOMAIN: &str = "dlkern";

/// ONNX Runtime's entry point for custom-op libraries
/// (`SessionOptions.register_custom_ops_library`, `RegisterCustomOpsLibrary_V2`).
///
/// # Safety
/// Called by ONNX Runtime with valid session options and API base.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RegisterCustomOps(
    options: *mut OrtSessionOptions,
    api_base: *const OrtApiBase,
) -> *mut OrtStatus {
    // SAFETY: forwarded from ORT.
    unsafe { ops::register(options, api_base) }
}

/// The ORT version string of the runtime, for messages.
///
/// # Safety
/// `api_base` must be ORT's.
pub(crate) unsafe fn runtime_version(api_base: *const OrtApiBase) -> String {
    // SAFETY: GetVersionString returns a static NUL-terminated string.
    unsafe {
        let s: *const c_char = ((*api_base).GetVersionString)();
        if s.is_null() { "unknown".into() } else { std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned() }
    }
}
