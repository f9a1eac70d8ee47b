//! Plug-ins: shared libraries that register kernels through a table of dlkern functions.
//!
//! Only the host application loads plug-ins, by path, through [`load_plugin`] or
//! `dlkern_load_plugin`. Nothing in dlkern loads code because a model or an operator attribute
//! names it: the ONNX Runtime ops only look kernels up by name in the registry.

use std::ffi::c_char;

use crate::error::{Error, Result};
use crate::registry::c_string;

/// The C ABI version of `dlkern_plugin_api` and `dlkern_kernel_def`.
pub const ABI_VERSION: u32 = 1;

/// `dlkern_plugin_api` from `include/dlkern.h`: what a plug-in's `dlkern_plugin_init` receives.
#[repr(C)]
pub struct PluginApi {
    pub abi_version: u32,
    pub register_kernel: unsafe extern "C" fn(def: *const super::KernelDefC, replace: i32) -> i32,
    pub last_error: unsafe extern "C" fn() -> *const c_char,
}

/// The entry point a plug-in exports.
pub const PLUGIN_INIT_SYMBOL: &str = "dlkern_plugin_init";

type PluginInit = unsafe extern "C" fn(api: *const PluginApi) -> i32;

/// Loads the shared library at `path` and calls its `dlkern_plugin_init`, which registers its
/// kernels. Errors carry the plug-in's own message.
///
/// # Safety
/// Loading a library runs its initializers: `path` must name a trusted library built for this
/// ABI. (This is why only the host application may call it.)
pub unsafe fn load_plugin(path: &str) -> Result<()> {
    let err = |message: String| Error::Plugin { path: path.to_string(), message };
    // SAFETY: the caller vouches for the library.
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| err(format!("cannot load: {e}")))?;
    // SAFETY: the symbol's type is fixed by include/dlkern.h.
    let init: PluginInit = unsafe {
        *library
            .get::<PluginInit>(PLUGIN_INIT_SYMBOL.as_bytes())
            .map_err(|e| err(format!("no `{PLUGIN_INIT_SYMBOL}` symbol: {e}")))?
    };
    let api = PluginApi {
        abi_version: ABI_VERSION,
        register_kernel: super::dlkern_register_kernel,
        last_error: super::dlkern_last_error,
    };
    // SAFETY: calling the plug-in's documented entry point with a valid table.
    let code = unsafe { init(&api) };
    if code != 0 {
        // SAFETY: dlkern_last_error returns a valid NUL-terminated string or null.
        let detail = unsafe { c_string(super::dlkern_last_error()) }.unwrap_or_default();
        return Err(err(format!(
            "dlkern_plugin_init returned {code}{}",
            if detail.is_empty() { String::new() } else { format!(": {detail}") }
        )));
    }
    crate::registry::keep_loaded(library);
    Ok(())
}
