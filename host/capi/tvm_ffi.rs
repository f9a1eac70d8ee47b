//! `dlkern_register_tvm_ffi`: a TVM-FFI function of a library as a registry kernel
//! ([`crate::registry::register_tvm_ffi`] has the calling convention).

use std::ffi::{c_char, c_void};

use super::{OK, guard, invalid, name_arg, struct_size_at_least};
use crate::registry::{self, CInferFn, Infer, TvmFfiKernel, UserData};

/// `dlkern_tvm_ffi_def` from `include/dlkern.h`.
#[repr(C)]
pub struct TvmFfiDefC {
    pub struct_size: u32,
    pub name: *const c_char,
    pub library: *const c_char,
    pub function: *const c_char,
    pub attribute_names: *const c_char,
    pub device_mask: u32,
    pub num_outputs: i32,
    pub infer: Option<CInferFn>,
    pub user_data: *mut c_void,
    pub destroy: Option<unsafe extern "C" fn(*mut c_void)>,
}

/// `int32_t dlkern_register_tvm_ffi(const dlkern_tvm_ffi_def* def, int32_t replace)`
///
/// # Safety
/// As documented in `include/dlkern.h`: the library is loaded (its initializers run), so it
/// must be trusted.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlkern_register_tvm_ffi(def: *const TvmFfiDefC, replace: i32) -> i32 {
    guard("dlkern_register_tvm_ffi", || {
        // SAFETY: the caller passes a valid definition or null.
        let def = unsafe { def.as_ref() }.ok_or_else(|| invalid("def is null"))?;
        struct_size_at_least::<TvmFfiDefC>(def.struct_size, "dlkern_tvm_ffi_def")?;
        // SAFETY: NUL-terminated strings by contract.
        let (name, library, function) = unsafe {
            (
                name_arg(def.name, "def.name")?,
                name_arg(def.library, "def.library")?,
                name_arg(def.function, "def.function")?,
            )
        };
        let attribute_names = if def.attribute_names.is_null() {
            Vec::new()
        } else {
            // SAFETY: as above.
            let list = unsafe { name_arg(def.attribute_names, "def.attribute_names") }?;
            list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
        };
        if def.num_outputs < 1 {
            return Err(invalid(format!("kernel '{name}': num_outputs = {} (at least 1)", def.num_outputs)));
        }
        let kernel = TvmFfiKernel {
            name,
            library,
            function,
            attribute_names,
            device_mask: def.device_mask,
            num_outputs: def.num_outputs as usize,
            infer: def.infer.map_or(Infer::None, Infer::C),
            user_data: Some(UserData { ptr: def.user_data, destroy: def.destroy }),
        };
        // SAFETY: the caller vouches for the library.
        unsafe { registry::register_tvm_ffi(kernel, replace != 0) }.map(|()| OK)
    })
}
