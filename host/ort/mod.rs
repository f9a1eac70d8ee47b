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

/// The C API version the runtime provides: ONNX Runtime 1.N provides version N (0 where the
/// version string does not say).
///
/// # Safety
/// `api_base` must be ORT's.
pub(crate) unsafe fn runtime_api_version(api_base: *const OrtApiBase) -> u32 {
    // SAFETY: forwarded contract.
    api_version_of(&unsafe { runtime_version(api_base) })
}

/// The C API version of ONNX Runtime `version` ("1.31.1": 31).
fn api_version_of(version: &str) -> u32 {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(1), Some(minor)) => minor,
        (Some(major), Some(_)) if major > 1 => u32::MAX,
        _ => 0,
    }
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

#[cfg(test)]
mod tests {
    #[test]
    fn api_versions_follow_the_runtime_minor_version() {
        use super::api_version_of;
        assert_eq!(api_version_of("1.31.1"), 31);
        assert_eq!(api_version_of("1.17.0"), 17);
        assert_eq!(api_version_of("2.0.0"), u32::MAX);
        assert_eq!(api_version_of("unknown"), 0);
        assert_eq!(api_version_of("1"), 0);
    }
}
