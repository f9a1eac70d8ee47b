//! The C ABI of `libdlkern.so`, declared in `include/dlkern.h` (read it for the ownership,
//! lifetime and threading rules).
//!
//! Every exported function catches panics and returns an error code; the message of the last
//! failure on the calling thread is available from `dlkern_last_error`.

mod exchange;
mod plugin;
mod tvm_ffi;

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_void};

use crate::dlpack::DLTensor;
use crate::error::Error;
use crate::kernel::CallSite;
use crate::registry::{self, Attributes, CAttr, CComputeFn, CInferFn, Compute, Infer, KernelDef, UserData};
pub use exchange::{dlkern_call_object, dlkern_call_objects};
pub use plugin::{ABI_VERSION, PluginApi, load_plugin};
pub use tvm_ffi::{TvmFfiDefC, dlkern_register_tvm_ffi};

/// Return codes (`DLKERN_OK`, ... in the header).
pub const OK: i32 = 0;
pub const ERR_INVALID_ARGUMENT: i32 = 1;
pub const ERR_UNKNOWN_KERNEL: i32 = 2;
pub const ERR_DUPLICATE_KERNEL: i32 = 3;
pub const ERR_KERNEL_FAILED: i32 = 4;
pub const ERR_CUDA: i32 = 5;
pub const ERR_PLUGIN: i32 = 6;
pub const ERR_INTERNAL: i32 = 7;

/// `dlkern_kernel_def` from `include/dlkern.h`.
#[repr(C)]
pub struct KernelDefC {
    pub struct_size: u32,
    pub name: *const c_char,
    pub compute: Option<CComputeFn>,
    pub infer: Option<CInferFn>,
    pub device_mask: u32,
    pub num_outputs: i32,
    pub user_data: *mut c_void,
    pub destroy: Option<unsafe extern "C" fn(*mut c_void)>,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    static LAST_CODE: std::cell::Cell<i32> = const { std::cell::Cell::new(OK) };
}

fn set_last_error(code: i32, message: &str) {
    LAST_CODE.with(|c| c.set(code));
    LAST_ERROR.with(|e| {
        let mut e = e.borrow_mut();
        // A success after a success touches nothing (no allocation on the success path).
        if !(message.is_empty() && e.is_empty()) {
            *e = CString::new(message.replace('\0', " ")).unwrap_or_default();
        }
    });
}

fn code_of(error: &Error) -> i32 {
    match error {
        Error::InvalidArgument { .. } | Error::InvalidTensor { .. } | Error::LaunchLimit { .. } => ERR_INVALID_ARGUMENT,
        Error::UnknownKernel { .. } => ERR_UNKNOWN_KERNEL,
        Error::DuplicateKernel(_) => ERR_DUPLICATE_KERNEL,
        Error::KernelFailed { .. } => ERR_KERNEL_FAILED,
        Error::NoDriver(_) | Error::NoDevice { .. } | Error::UnsupportedGpu { .. } | Error::Driver { .. } => ERR_CUDA,
        Error::Plugin { .. } => ERR_PLUGIN,
    }
}

/// Runs an exported function's body: errors and panics become a code and the thread's last
/// error message. Success clears the message.
fn guard(what: &str, body: impl FnOnce() -> Result<i32, Error>) -> i32 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(code)) => {
            set_last_error(OK, "");
            code
        }
        Ok(Err(error)) => {
            let code = code_of(&error);
            set_last_error(code, &error.to_string());
            code
        }
        Err(_) => {
            set_last_error(ERR_INTERNAL, &format!("{what}: internal error (panic caught at the C boundary)"));
            ERR_INTERNAL
        }
    }
}

fn invalid(message: impl Into<String>) -> Error {
    Error::invalid("dlkern C API", message)
}

/// # Safety
/// `p` must be null or NUL-terminated.
unsafe fn name_arg(p: *const c_char, what: &str) -> Result<String, Error> {
    // SAFETY: forwarded.
    unsafe { name_ref(p, what) }.map(str::to_owned)
}

/// [`name_arg`] borrowed, for a string used only during the call.
///
/// # Safety
/// `p` must be null or NUL-terminated, and outlive `'a`.
unsafe fn name_ref<'a>(p: *const c_char, what: &str) -> Result<&'a str, Error> {
    // SAFETY: forwarded.
    unsafe { crate::registry::c_str(p) }.ok_or_else(|| invalid(format!("{what} is null or not UTF-8")))
}

/// Checks a definition struct's `struct_size` against the size of the `c_type` dlkern reads.
fn struct_size_at_least<T>(struct_size: u32, c_type: &str) -> Result<(), Error> {
    if (struct_size as usize) < size_of::<T>() {
        return Err(invalid(format!(
            "def.struct_size = {struct_size} (expected {}; set it to sizeof({c_type}))",
            size_of::<T>()
        )));
    }
    Ok(())
}

/// Checks a tensor array's count against its pointer; `Ok(0)` for an empty array.
fn tensor_count(tensors: *const DLTensor, n: i32, what: &str) -> Result<usize, Error> {
    if !(0..=4096).contains(&n) {
        return Err(invalid(format!("{what}: count {n} out of range")));
    }
    if n > 0 && tensors.is_null() {
        return Err(invalid(format!("{what} is null with count {n}")));
    }
    Ok(n as usize)
}

/// # Safety
/// `tensors` must be null with `n` 0, or point to `n` DLTensors dlkern may write (outputs) for
/// the call.
unsafe fn tensor_slice_mut<'a>(tensors: *mut DLTensor, n: i32, what: &str) -> Result<&'a mut [DLTensor], Error> {
    let n = tensor_count(tensors, n, what)?;
    // SAFETY: non-null with n elements by the checks and the caller's contract.
    Ok(if n == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(tensors, n) } })
}

/// # Safety
/// `tensors` must be null with `n` 0, or point to `n` readable DLTensors.
unsafe fn tensor_slice<'a>(tensors: *const DLTensor, n: i32, what: &str) -> Result<&'a [DLTensor], Error> {
    let n = tensor_count(tensors, n, what)?;
    // SAFETY: non-null with n elements by the checks and the caller's contract.
    Ok(if n == 0 { &[] } else { unsafe { std::slice::from_raw_parts(tensors, n) } })
}

/// `int32_t dlkern_abi_version(void)`
#[unsafe(no_mangle)]
pub extern "C" fn dlkern_abi_version() -> i32 {
    plugin::ABI_VERSION as i32
}

/// `const char* dlkern_last_error(void)`: the message of the calling thread's last failed call
/// ("" after a success). Valid until the thread's next dlkern call.
#[unsafe(no_mangle)]
pub extern "C" fn dlkern_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// `int32_t dlkern_last_error_code(void)`: the code of the calling thread's last call
/// (`DLKERN_OK` after a success), for entries that return something other than a code.
#[unsafe(no_mangle)]
pub extern "C" fn dlkern_last_error_code() -> i32 {
    LAST_CODE.with(|c| c.get())
}

/// `uint64_t dlkern_device_bytes_held(void)`: device memory dlkern keeps between calls (the
/// weights `dlkern.matmul_nbits` repacks for ONNX nodes), in bytes, over all devices.
#[unsafe(no_mangle)]
pub extern "C" fn dlkern_device_bytes_held() -> u64 {
    crate::runtime::device_bytes_held()
}

/// `int32_t dlkern_register_kernel(const dlkern_kernel_def* def, int32_t replace)`
///
/// # Safety
/// As documented in `include/dlkern.h`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlkern_register_kernel(def: *const KernelDefC, replace: i32) -> i32 {
    guard("dlkern_register_kernel", || {
        // SAFETY: the caller passes a valid definition or null.
        let def = unsafe { def.as_ref() }.ok_or_else(|| invalid("def is null"))?;
        struct_size_at_least::<KernelDefC>(def.struct_size, "dlkern_kernel_def")?;
        // SAFETY: NUL-terminated by contract.
        let name = unsafe { name_arg(def.name, "def.name") }?;
        let compute = def.compute.ok_or_else(|| invalid(format!("kernel '{name}': compute is null")))?;
        let num_outputs = match def.num_outputs {
            -1 => None,
            n if n >= 0 => Some(n as usize),
            n => return Err(invalid(format!("kernel '{name}': num_outputs = {n} (use -1 for any)"))),
        };
        let kernel = KernelDef {
            name,
            compute: Compute::C(compute),
            infer: def.infer.map_or(Infer::None, Infer::C),
            device_mask: def.device_mask,
            num_outputs,
            user_data: Some(UserData { ptr: def.user_data, destroy: def.destroy }),
        };
        registry::register(kernel, replace != 0).map(|()| OK)
    })
}

/// `int32_t dlkern_unregister_kernel(const char* name)`
///
/// # Safety
/// `name` must be null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlkern_unregister_kernel(name: *const c_char) -> i32 {
    guard("dlkern_unregister_kernel", || {
        // SAFETY: forwarded.
        let name = unsafe { name_arg(name, "name") }?;
        registry::unregister(&name).map(|()| OK)
    })
}

/// `int64_t dlkern_list_kernels(char* buf, size_t len)`: writes the registered names, one per
/// line, NUL-terminated, when they fit; returns the bytes needed (including the NUL), or a
/// negative error code.
///
/// # Safety
/// `buf` must be null (with `len` 0) or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlkern_list_kernels(buf: *mut c_char, len: usize) -> i64 {
    let mut needed = 0i64;
    let code = guard("dlkern_list_kernels", || {
        let text = registry::names().join("\n");
        needed = text.len() as i64 + 1;
        if !buf.is_null() && len > text.len() {
            // SAFETY: len bytes are writable by contract.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
                *buf.add(text.len()) = 0;
            }
        }
        Ok(OK)
    });
    if code == OK { needed } else { -(code as i64) }
}

/// `int32_t dlkern_call(name, tensors, num_inputs, num_outputs, stream, attrs, num_attrs)`
///
/// # Safety
/// As documented in `include/dlkern.h`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlkern_call(
    name: *const c_char,
    tensors: *mut DLTensor,
    num_inputs: i32,
    num_outputs: i32,
    stream: *mut c_void,
    attrs: *const CAttr,
    num_attrs: i32,
) -> i32 {
    // SAFETY: the header's contract for every argument.
    guard("dlkern_call", || unsafe {
        call_through(name, tensors, num_inputs, num_outputs, stream, attrs, num_attrs, None)
    })
}

/// `dlkern_site* dlkern_site_create(uint64_t constant_inputs)`: a call site whose inputs with
/// bit `i` set are the same tensors at every call through it (see the header).
#[unsafe(no_mangle)]
pub extern "C" fn dlkern_site_create(constant_inputs: u64) -> *mut CallSite {
    let mut site = std::ptr::null_mut();
    guard("dlkern_site_create", || {
        site = Box::into_raw(Box::new(CallSite::new(constant_inputs)));
        Ok(OK)
    });
    site
}

/// `void dlkern_site_destroy(dlkern_site* site)`: frees the site and what kernels kept with it.
///
/// # Safety
/// `site` is null or came from `dlkern_site_create` and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlkern_site_destroy(site: *mut CallSite) {
    if !site.is_null() {
        guard("dlkern_site_destroy", || {
            // SAFETY: the caller's contract: a site of dlkern_site_create, used no more.
            drop(unsafe { Box::from_raw(site) });
            Ok(OK)
        });
    }
}

/// `int32_t dlkern_call_at(site, name, tensors, num_inputs, num_outputs, stream, attrs,
/// num_attrs)`: `dlkern_call` through a call site.
///
/// # Safety
/// As documented in `include/dlkern.h`: `site` from `dlkern_site_create`, alive; the inputs it
/// marks constant the same tensors, with the same contents, at every call through it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlkern_call_at(
    site: *const CallSite,
    name: *const c_char,
    tensors: *mut DLTensor,
    num_inputs: i32,
    num_outputs: i32,
    stream: *mut c_void,
    attrs: *const CAttr,
    num_attrs: i32,
) -> i32 {
    guard("dlkern_call_at", || {
        // SAFETY: the header's contract for every argument.
        unsafe {
            let site = site.as_ref().ok_or_else(|| invalid("site is NULL (dlkern_site_create makes one)"))?;
            call_through(name, tensors, num_inputs, num_outputs, stream, attrs, num_attrs, Some(site))
        }
    })
}

/// The body of `dlkern_call` and `dlkern_call_at`.
///
/// # Safety
/// As `dlkern_call_at`'s, with `site` checked.
#[allow(clippy::too_many_arguments)]
unsafe fn call_through(
    name: *const c_char,
    tensors: *mut DLTensor,
    num_inputs: i32,
    num_outputs: i32,
    stream: *mut c_void,
    attrs: *const CAttr,
    num_attrs: i32,
    site: Option<&CallSite>,
) -> Result<i32, Error> {
    // SAFETY: the caller's contract for every argument.
    unsafe {
        let name = name_ref(name, "name")?;
        if num_inputs < 0 || num_outputs < 0 {
            return Err(invalid(format!("negative tensor count ({num_inputs} inputs, {num_outputs} outputs)")));
        }
        let tensors = tensor_slice_mut(tensors, num_inputs.saturating_add(num_outputs), "tensors")?;
        with_call_attrs((attrs, num_attrs), |attrs| match site {
            Some(site) => registry::call_at(name, tensors, num_inputs as usize, stream, attrs, site),
            None => registry::call(name, tensors, num_inputs as usize, stream, attrs),
        })
        .map(|()| OK)
    }
}

/// Runs `call` with the C attributes `attrs` converted into the thread's kept list, refilled in
/// place (no allocation when a caller passes the same attributes again), or into a fresh one
/// where a kernel calls back into dlkern during the call.
///
/// # Safety
/// `attrs` points at `num_attrs` valid attributes (or is null with 0).
pub(crate) unsafe fn with_call_attrs<R>(
    (attrs, num_attrs): (*const CAttr, i32),
    call: impl FnOnce(&Attributes) -> Result<R, Error>,
) -> Result<R, Error> {
    // SAFETY: forwarded.
    CALL_ATTRS.with(|kept| match kept.try_borrow_mut() {
        Ok(mut kept) => {
            unsafe { kept.refill_from_c(attrs, num_attrs) }?;
            call(&kept)
        }
        Err(_) => call(&unsafe { Attributes::from_c(attrs, num_attrs) }?),
    })
}

thread_local! {
    /// The attributes of this thread's current `dlkern_call` (or `dlkern_call_objects`), kept
    /// between calls.
    static CALL_ATTRS: std::cell::RefCell<Attributes> = std::cell::RefCell::new(Attributes::new());
}

/// `int32_t dlkern_infer(name, inputs, num_inputs, outputs, num_outputs, attrs, num_attrs)`:
/// fills each output's `ndim`, `dtype` and `shape` (the caller points `shape` at
/// `DLKERN_MAX_NDIM` int64s).
///
/// # Safety
/// As documented in `include/dlkern.h`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlkern_infer(
    name: *const c_char,
    inputs: *const DLTensor,
    num_inputs: i32,
    outputs: *mut DLTensor,
    num_outputs: i32,
    attrs: *const CAttr,
    num_attrs: i32,
) -> i32 {
    guard("dlkern_infer", || {
        // SAFETY: the header's contract for every argument.
        unsafe {
            let name = name_arg(name, "name")?;
            // Inputs are only read: a shared slice, never a `&mut` over the caller's memory.
            let inputs = tensor_slice(inputs, num_inputs, "inputs")?;
            let outputs = tensor_slice_mut(outputs, num_outputs, "outputs")?;
            let attrs = Attributes::from_c(attrs, num_attrs)?;
            let specs = registry::infer(&name, inputs, outputs.len(), &attrs)?;
            for (i, (out, spec)) in outputs.iter_mut().zip(specs).enumerate() {
                if out.shape.is_null() {
                    return Err(invalid(format!("outputs[{i}].shape is null; point it at DLKERN_MAX_NDIM int64s")));
                }
                std::ptr::copy_nonoverlapping(spec.shape.as_ptr(), out.shape, spec.shape.len());
                out.ndim = spec.shape.len() as i32;
                out.dtype = crate::dlpack::dtype_to_dl(spec.dtype);
            }
            Ok(OK)
        }
    })
}

/// `int32_t dlkern_load_plugin(const char* path)`
///
/// # Safety
/// `path` must be null or NUL-terminated and name a trusted library (its initializers run).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlkern_load_plugin(path: *const c_char) -> i32 {
    guard("dlkern_load_plugin", || {
        // SAFETY: forwarded; trust is the caller's decision.
        unsafe {
            let path = name_arg(path, "path")?;
            plugin::load_plugin(&path).map(|()| OK)
        }
    })
}
