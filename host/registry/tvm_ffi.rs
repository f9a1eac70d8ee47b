//! TVM-FFI functions as registry kernels: a function a library exports through `apache-tvm-ffi`'s
//! C ABI (the symbol `__tvm_ffi_<name>`, of type `TVMFFISafeCallType`: FlashInfer's and
//! TileLang's kernels, anything made with `TVM_FFI_DLL_EXPORT_TYPED_FUNC`) runs wherever a
//! registry kernel does: an ORT `DLPackKernel` node, the C ABI, Rust.
//!
//! The calling convention is destination-passing: the function gets the call's input tensors,
//! then its output tensors (each a `DLTensor*`, `kTVMFFIDLTensorPtr`, which `TensorView`
//! parameters accept), then the attributes named at registration, in that order (int, float or
//! string), writes the outputs and returns nothing. Output shapes come from the registrant's
//! inference function, or are those of input 0. For CUDA tensors the call's stream is the
//! TVM-FFI environment stream of the device while the function runs (`TVMFFIEnvSetStream`; the
//! function reads it with `TVMFFIEnvGetStream`), and the previous one is put back after. An
//! error the function raises comes back as the call's error, with its kind and message.
//!
//! dlkern does not link `libtvm_ffi`: the environment and error functions are looked up in the
//! function's library, which links it. Only `apache-tvm-ffi`'s C ABI (`tvm/ffi/c_api.h`,
//! `tvm/ffi/extra/c_env_api.h`) is used, declared here for the handful of items needed; the
//! `tvm-ffi` crates would link `libtvm_ffi` into every process that loads dlkern (ORT's
//! included), for the sake of three function pointers.

use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::Arc;

use super::{Compute, Infer, KernelArgs, KernelDef, TensorSpec, UserData};
use crate::dlpack::{DLDeviceType, DLTensor};
use crate::error::{Error, Result};
use crate::kernel::AttrValue;

/// `TVMFFIAny`: a type index and an 8-byte payload (int64, double or pointer).
#[repr(C)]
#[derive(Clone, Copy)]
struct Any {
    type_index: i32,
    zero_padding: u32,
    payload: u64,
}

/// `TVMFFITypeIndex` values dlkern passes or reads.
const TYPE_NONE: i32 = 0;
const TYPE_INT: i32 = 1;
const TYPE_FLOAT: i32 = 3;
const TYPE_DLTENSOR_PTR: i32 = 7;
const TYPE_RAW_STR: i32 = 8;
const TYPE_STATIC_OBJECT_BEGIN: i32 = 64;

/// Bytes of `TVMFFIObject` (reference count u64, type index i32, padding u32, deleter
/// pointer), the header before every object's cell.
const OBJECT_HEADER_BYTES: usize = 24;

/// `TVMFFIByteArray`.
#[repr(C)]
struct ByteArray {
    data: *const c_char,
    size: usize,
}

/// The start of `TVMFFIErrorCell`, which follows an error object's header.
#[repr(C)]
struct ErrorCell {
    kind: ByteArray,
    message: ByteArray,
}

type SafeCall = unsafe extern "C" fn(handle: *mut c_void, args: *const Any, num_args: i32, result: *mut Any) -> c_int;
type EnvSetStream =
    unsafe extern "C" fn(device_type: i32, device_id: i32, stream: *mut c_void, original: *mut *mut c_void) -> c_int;
type ErrorMoveFromRaised = unsafe extern "C" fn(result: *mut *mut c_void);
type ObjectDecRef = unsafe extern "C" fn(object: *mut c_void) -> c_int;

/// A TVM-FFI function to register (see the module docs for the calling convention).
pub struct TvmFfiKernel {
    /// The registry name.
    pub name: String,
    /// Path of the shared library that exports the function.
    pub library: String,
    /// The exported function: `add_one` looks up `__tvm_ffi_add_one`; a name that already
    /// starts with `__tvm_ffi_` is looked up as it is.
    pub function: String,
    /// The attributes passed after the tensors, in this order (each must be set at every call).
    pub attribute_names: Vec<String>,
    /// Accepted tensor devices ([`crate::dlpack::DEVICE_MASK_CPU`] | [`crate::dlpack::DEVICE_MASK_CUDA`]).
    pub device_mask: u32,
    /// The number of outputs (at least 1: the function writes them).
    pub num_outputs: usize,
    /// Output inference; [`Infer::None`]: every output has input 0's dtype and shape.
    pub infer: Infer,
    /// The registrant's data for a C inference function, freed with the kernel.
    pub user_data: Option<UserData>,
}

/// The function and the TVM-FFI runtime functions its library brings.
struct Function {
    call: SafeCall,
    set_stream: Option<EnvSetStream>,
    take_error: Option<ErrorMoveFromRaised>,
    dec_ref: Option<ObjectDecRef>,
}

// SAFETY: plain function pointers into a library that is never unloaded.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

/// Registers `kernel` (`replace`: swap a kernel of the same name).
///
/// # Safety
/// Loading a library runs its initializers: `kernel.library` must name a trusted library, and
/// its function must follow TVM-FFI's calling convention. (Only the host application calls
/// this: nothing in a model names a library.)
pub unsafe fn register_tvm_ffi(mut kernel: TvmFfiKernel, replace: bool) -> Result<()> {
    // SAFETY: the caller's contract.
    let function = match unsafe { load(&kernel) } {
        Ok(function) => function,
        Err(error) => {
            // A refused definition's user data stays the registrant's (as `register`'s).
            if let Some(user) = kernel.user_data.as_mut() {
                user.disown();
            }
            return Err(error);
        }
    };
    let function = Arc::new(function);
    let attribute_names = kernel.attribute_names;
    let infer = match kernel.infer {
        Infer::None => Infer::Rust(Arc::new(|args: &super::InferArgs| {
            let first = args.inputs.first().ok_or_else(|| Error::KernelFailed {
                name: args.function_name.to_string(),
                message: "no inputs to take the outputs' dtype and shape from".into(),
            })?;
            let spec = TensorSpec { dtype: first.dtype(), shape: first.shape().to_vec() };
            Ok(vec![spec; args.num_outputs])
        })),
        given => given,
    };
    let def = KernelDef {
        name: kernel.name,
        compute: Compute::Rust(Arc::new(move |args: &KernelArgs| {
            // SAFETY: the registrant vouched for the function's convention.
            unsafe { call(&function, &attribute_names, args) }
        })),
        infer,
        device_mask: kernel.device_mask,
        num_outputs: Some(kernel.num_outputs),
        user_data: kernel.user_data,
    };
    super::register(def, replace)
}

/// Loads `kernel`'s library (kept loaded for good) and looks up its function and the TVM-FFI
/// runtime functions it links.
///
/// # Safety
/// As [`register_tvm_ffi`].
unsafe fn load(kernel: &TvmFfiKernel) -> Result<Function> {
    let err = |message: String| Error::Plugin { path: kernel.library.clone(), message };
    if kernel.num_outputs == 0 {
        return Err(err(format!(
            "{}: num_outputs = 0 (a TVM-FFI function is called destination-passing: it writes its outputs)",
            kernel.name
        )));
    }
    let symbol = if kernel.function.starts_with("__tvm_ffi_") {
        kernel.function.clone()
    } else {
        format!("__tvm_ffi_{}", kernel.function)
    };
    // SAFETY: the caller vouches for the library.
    let library = unsafe { libloading::Library::new(&kernel.library) }.map_err(|e| err(format!("cannot load: {e}")))?;
    // SAFETY: the types are those of tvm/ffi/c_api.h and tvm/ffi/extra/c_env_api.h; a lookup
    // through the library's handle also searches the libraries it links (libtvm_ffi).
    let function = unsafe {
        Function {
            call: *library
                .get::<SafeCall>(symbol.as_bytes())
                .map_err(|e| err(format!("no TVM-FFI function `{symbol}`: {e}")))?,
            set_stream: library.get::<EnvSetStream>(b"TVMFFIEnvSetStream").ok().map(|s| *s),
            take_error: library.get::<ErrorMoveFromRaised>(b"TVMFFIErrorMoveFromRaised").ok().map(|s| *s),
            dec_ref: library.get::<ObjectDecRef>(b"TVMFFIObjectDecRef").ok().map(|s| *s),
        }
    };
    super::keep_loaded(library);
    Ok(function)
}

/// One call of a TVM-FFI function on a registry call's tensors.
///
/// # Safety
/// `function` follows TVM-FFI's convention; the call's tensors are valid (the registry's contract).
unsafe fn call(function: &Function, attribute_names: &[String], args: &KernelArgs) -> Result<()> {
    let fail = |message: String| Error::KernelFailed { name: args.function_name.to_string(), message };
    let (num_inputs, num_outputs) = (args.num_inputs(), args.num_outputs());
    let mut values = Vec::with_capacity(num_inputs + num_outputs + attribute_names.len());
    let mut device = None;
    for i in 0..num_inputs + num_outputs {
        let view = if i < num_inputs { args.input(i, "input") } else { args.output(i - num_inputs, "output") }?;
        let tensor: &DLTensor = view.raw();
        let here = (tensor.device.device_type, tensor.device.device_id);
        if *device.get_or_insert(here) != here {
            return Err(fail("the tensors of a TVM-FFI call must all be on one device".into()));
        }
        values.push(Any { type_index: TYPE_DLTENSOR_PTR, zero_padding: 0, payload: tensor as *const DLTensor as u64 });
    }
    // Attribute strings must outlive the call.
    let mut strings = Vec::new();
    for name in attribute_names {
        let value = args.attrs.get(name).ok_or_else(|| {
            fail(format!(
                "attribute '{name}' is not set (a TVM-FFI kernel takes {attribute_names:?}, in that order; an ORT \
                 node lists them in attribute_names)"
            ))
        })?;
        values.push(match value {
            AttrValue::Int(v) => Any { type_index: TYPE_INT, zero_padding: 0, payload: *v as u64 },
            AttrValue::Float(v) => Any { type_index: TYPE_FLOAT, zero_padding: 0, payload: v.to_bits() },
            AttrValue::String(s) => {
                let c = CString::new(s.as_str()).map_err(|_| fail(format!("attribute '{name}' contains NUL")))?;
                let payload = c.as_ptr() as u64;
                strings.push(c);
                Any { type_index: TYPE_RAW_STR, zero_padding: 0, payload }
            }
            AttrValue::Ints(_) | AttrValue::Floats(_) => {
                return Err(fail(format!(
                    "attribute '{name}' is a list; TVM-FFI kernels take int, float and string attributes"
                )));
            }
        });
    }

    // The call's stream is the device's environment stream while the function runs.
    let cuda_device = device.filter(|(kind, _)| *kind == DLDeviceType::CUDA).map(|(_, id)| id);
    let mut previous = std::ptr::null_mut();
    let set_stream = cuda_device.and(function.set_stream);
    if let (Some(set), Some(id)) = (set_stream, cuda_device) {
        // SAFETY: TVMFFIEnvSetStream's contract; `previous` is writable.
        if unsafe { set(DLDeviceType::CUDA.0 as i32, id, args.stream, &mut previous) } != 0 {
            // SAFETY: as below.
            return Err(fail(format!("TVMFFIEnvSetStream failed: {}", unsafe { raised(function, -1) })));
        }
    }
    let mut result = Any { type_index: TYPE_NONE, zero_padding: 0, payload: 0 };
    // SAFETY: the convention: a null self for exported functions, `values.len()` arguments.
    let code = unsafe { (function.call)(std::ptr::null_mut(), values.as_ptr(), values.len() as i32, &mut result) };
    if let (Some(set), Some(id)) = (set_stream, cuda_device) {
        // SAFETY: as above; putting the previous stream back.
        unsafe { set(DLDeviceType::CUDA.0 as i32, id, previous, std::ptr::null_mut()) };
    }
    drop(strings);
    if code != 0 {
        // SAFETY: the function reported an error by its convention.
        return Err(fail(unsafe { raised(function, code) }));
    }
    if result.type_index != TYPE_NONE {
        if result.type_index >= TYPE_STATIC_OBJECT_BEGIN
            && let Some(dec_ref) = function.dec_ref
        {
            // SAFETY: an object result is a strong reference the caller owns.
            unsafe { dec_ref(result.payload as *mut c_void) };
        }
        return Err(fail(format!(
            "returned a value (TVM-FFI type index {}); dlkern calls TVM-FFI functions destination-passing: write the \
             outputs passed after the inputs and return nothing",
            result.type_index
        )));
    }
    Ok(())
}

/// The message of the error a TVM-FFI function raised: "kind: message".
///
/// # Safety
/// Called right after a TVM-FFI call that returned `code` != 0, on the same thread.
unsafe fn raised(function: &Function, code: c_int) -> String {
    let Some(take_error) = function.take_error else {
        return format!("failed with code {code} (its library has no TVMFFIErrorMoveFromRaised to say why)");
    };
    let mut error = std::ptr::null_mut();
    // SAFETY: moves the thread's raised error (or null) into `error`, which we then own.
    unsafe { take_error(&mut error) };
    if error.is_null() {
        return format!("failed with code {code} without raising an error");
    }
    let text = |bytes: &ByteArray| {
        if bytes.data.is_null() {
            String::new()
        } else {
            // SAFETY: a byte array of the error's cell, alive while we hold the error.
            String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(bytes.data.cast::<u8>(), bytes.size) })
                .into_owned()
        }
    };
    // SAFETY: an error object is its header followed by its cell (TVMFFIErrorGetCellPtr).
    let cell = unsafe { &*error.cast::<u8>().add(OBJECT_HEADER_BYTES).cast::<ErrorCell>() };
    let message = format!("{}: {}", text(&cell.kind), text(&cell.message));
    if let Some(dec_ref) = function.dec_ref {
        // SAFETY: we own the reference TVMFFIErrorMoveFromRaised gave us.
        unsafe { dec_ref(error) };
    }
    message
}
