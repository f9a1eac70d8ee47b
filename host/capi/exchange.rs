//! `dlkern_call_objects`: a registry call on a framework's own tensor objects (PyTorch's
//! `torch.Tensor`, ...) through DLPack's C exchange API (`DLPackExchangeAPI`, dlpack.h 1.2+),
//! the table a framework publishes as its tensor type's `__dlpack_c_exchange_api__`.
//!
//! Why it exists: through `__dlpack__`, a Python call of one small kernel costs ~100 us of
//! capsule making, stream handshakes and ctypes struct building per tensor. The exchange API
//! turns an object into a `DLTensor` in one C call that allocates nothing, allocates outputs
//! with the framework's own allocator (its caching allocator on CUDA) and names the
//! framework's current stream, so the whole call is one trip from Python into this library.
//!
//! dlkern never links Python: the objects are opaque pointers handed to the framework's
//! functions. Those functions need the GIL, so Python callers reach this entry through
//! `ctypes.PyDLL`, which keeps it held.

use std::ffi::{CStr, c_char, c_void};

use super::{OK, guard, invalid, name_ref, with_call_attrs};
use crate::dlpack::{
    DLDeviceType, DLManagedTensorVersioned, DLPackExchangeAPI, DLPackExchangeAPIHeader, DLTensor, ManagedTensor,
    dtype_to_dl,
};
use crate::error::Error;
use crate::kernel::CallSite;
use crate::registry::{self, CAttr};

/// The DLPack major version whose exchange table dlkern reads.
const EXCHANGE_MAJOR_VERSION: u32 = crate::dlpack::SUPPORTED_MAJOR_VERSION;

/// Bounds on the object counts, against garbage counts from a caller.
const MAX_INPUTS: i32 = 4096;
const MAX_OUTPUTS: i32 = 64;

/// The table of `api`'s chain that dlkern can read: the first whose DLPack major version is
/// dlkern's (a framework may publish a newer major first and older ones through `prev_api`).
///
/// # Safety
/// `api` is null or a framework's exchange table, alive for the call (the spec: for the process).
unsafe fn compatible_api<'a>(api: *const DLPackExchangeAPIHeader) -> Result<&'a DLPackExchangeAPI, Error> {
    let mut header = api;
    let mut offered = Vec::new();
    // A chain longer than a few links is a corrupt table, not a framework with history.
    for _ in 0..16 {
        // SAFETY: the caller's contract; every `prev_api` is null or another header.
        let Some(h) = (unsafe { header.as_ref() }) else { break };
        if h.version.major == EXCHANGE_MAJOR_VERSION {
            // SAFETY: a header of this major version heads a full `DLPackExchangeAPI`.
            return Ok(unsafe { &*header.cast::<DLPackExchangeAPI>() });
        }
        offered.push(h.version.major);
        header = h.prev_api;
    }
    Err(invalid(if api.is_null() {
        "api is null (pass the tensor type's __dlpack_c_exchange_api__ table)".to_string()
    } else {
        format!("the exchange table offers DLPack major versions {offered:?}; dlkern reads {EXCHANGE_MAJOR_VERSION}")
    }))
}

/// What a framework's allocator reported through `set_error`.
#[derive(Default)]
struct AllocatorError {
    message: Option<String>,
}

/// The `set_error` callback of `managed_tensor_allocator`: keeps the framework's message.
///
/// # Safety
/// `ctx` is the `AllocatorError` passed with the allocation; `kind`/`message` null or C strings.
unsafe extern "C" fn keep_allocator_error(ctx: *mut c_void, kind: *const c_char, message: *const c_char) {
    let text = |p: *const c_char| {
        // SAFETY: null or NUL-terminated by the callback's contract.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    // No unwinding out of an extern "C" callback: a failed String build only loses the message.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // SAFETY: the caller's contract.
        if let Some(error) = unsafe { ctx.cast::<AllocatorError>().as_mut() } {
            error.message = Some(match (text(kind), text(message)) {
                (Some(k), Some(m)) => format!("{k}: {m}"),
                (k, m) => k.or(m).unwrap_or_default(),
            });
        }
    }));
}

/// `int32_t dlkern_call_objects(site, name, api, inputs, num_inputs, outputs, num_outputs,
/// stream, attrs, num_attrs)`: see `include/dlkern.h`.
///
/// # Safety
/// As documented in `include/dlkern.h`: `api` the exchange table of the objects' type, every
/// input a live object of that type, `outputs` writable for `num_outputs` pointers, the
/// thread holding what the framework's functions need (Python's GIL).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dlkern_call_objects(
    site: *const CallSite,
    name: *const c_char,
    api: *const DLPackExchangeAPIHeader,
    inputs: *const *mut c_void,
    num_inputs: i32,
    outputs: *mut *mut c_void,
    num_outputs: i32,
    stream: *mut c_void,
    attrs: *const CAttr,
    num_attrs: i32,
) -> i32 {
    // SAFETY: the header's contract for every argument.
    guard("dlkern_call_objects", || unsafe {
        // The header promises NULL slots after any failure, this one included.
        if !outputs.is_null() && (1..=MAX_OUTPUTS).contains(&num_outputs) {
            std::slice::from_raw_parts_mut(outputs, num_outputs as usize).fill(std::ptr::null_mut());
        }
        let site = site.as_ref();
        let name = name_ref(name, "name")?;
        let api = compatible_api(api)?;
        call_objects(site, name, api, (inputs, num_inputs), (outputs, num_outputs), stream, (attrs, num_attrs))
    })
}

/// `void* dlkern_call_object(site, name, api, inputs, num_inputs, stream, attrs, num_attrs,
/// failed)`: `dlkern_call_objects` for one output, which it returns (a new reference), or
/// `failed` on failure (`dlkern_last_error_code` and `dlkern_last_error` say why). Python
/// declares it with `restype = ctypes.py_object`, which takes the reference over: no output
/// array to make and no reference to drop afterwards, two ctypes round trips fewer per call.
/// (`failed` is a sentinel object there: ctypes cannot take a null `py_object` back.)
///
/// # Safety
/// As `dlkern_call_objects`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dlkern_call_object(
    site: *const CallSite,
    name: *const c_char,
    api: *const DLPackExchangeAPIHeader,
    inputs: *const *mut c_void,
    num_inputs: i32,
    stream: *mut c_void,
    attrs: *const CAttr,
    num_attrs: i32,
    failed: *mut c_void,
) -> *mut c_void {
    let mut output = std::ptr::null_mut();
    // SAFETY: forwarded; one writable output slot. With one output a failure leaves it null.
    let code =
        unsafe { dlkern_call_objects(site, name, api, inputs, num_inputs, &mut output, 1, stream, attrs, num_attrs) };
    if code == OK { output } else { failed }
}

/// The body of `dlkern_call_objects`.
///
/// # Safety
/// As `dlkern_call_objects`.
unsafe fn call_objects(
    site: Option<&CallSite>,
    name: &str,
    api: &DLPackExchangeAPI,
    (inputs, num_inputs): (*const *mut c_void, i32),
    (outputs, num_outputs): (*mut *mut c_void, i32),
    stream: *mut c_void,
    (attrs, num_attrs): (*const CAttr, i32),
) -> Result<i32, Error> {
    // SAFETY: the caller's contract for every argument.
    unsafe {
        if !(1..=MAX_INPUTS).contains(&num_inputs) || inputs.is_null() {
            return Err(invalid(format!("{name}: {num_inputs} inputs at {inputs:?} (1 to {MAX_INPUTS}, non-null)")));
        }
        if !(0..=MAX_OUTPUTS).contains(&num_outputs) || (num_outputs > 0 && outputs.is_null()) {
            return Err(invalid(format!(
                "{name}: {num_outputs} outputs at {outputs:?} (0 to {MAX_OUTPUTS}, non-null)"
            )));
        }
        let missing = |what: &str| invalid(format!("the exchange table has no {what}"));
        let to_dltensor =
            api.dltensor_from_py_object_no_sync.ok_or_else(|| missing("dltensor_from_py_object_no_sync"))?;
        // Outputs need both ends of the table; checked before anything is allocated or launched.
        let output_functions = if num_outputs > 0 {
            Some((
                api.managed_tensor_allocator.ok_or_else(|| missing("managed_tensor_allocator"))?,
                api.managed_tensor_to_py_object_no_sync
                    .ok_or_else(|| missing("managed_tensor_to_py_object_no_sync"))?,
            ))
        } else {
            None
        };
        let num_outputs = num_outputs as usize;
        let outputs = if num_outputs == 0 { &mut [][..] } else { std::slice::from_raw_parts_mut(outputs, num_outputs) };

        // Read without assuming alignment: Python passes the addresses as the bytes of a `bytes`.
        let num_inputs = num_inputs as usize;
        let objects = (0..num_inputs).map(|i| inputs.add(i).read_unaligned());
        let mut tensors: Vec<DLTensor> = Vec::with_capacity(num_inputs + num_outputs);
        for (i, object) in objects.enumerate() {
            if object.is_null() {
                return Err(invalid(format!("{name}: input {i} is a null object")));
            }
            // Every field is an integer, a pointer or a newtype of one: all-zero is a valid value.
            let mut tensor: DLTensor = std::mem::zeroed();
            if to_dltensor(object, &mut tensor) != 0 {
                return Err(invalid(format!(
                    "{name}: input {i} is not a tensor the exchange table can describe (its exception says why)"
                )));
            }
            tensors.push(tensor);
        }
        let device = tensors[0].device;
        let stream = if stream.is_null() && device.device_type == DLDeviceType::CUDA {
            let current = api.current_work_stream.ok_or_else(|| missing("current_work_stream"))?;
            let mut work_stream = std::ptr::null_mut();
            if current(DLDeviceType::CUDA, device.device_id, &mut work_stream) != 0 {
                return Err(invalid(format!(
                    "{name}: the framework has no current stream on CUDA device {}",
                    device.device_id
                )));
            }
            work_stream
        } else {
            stream
        };
        with_call_attrs((attrs, num_attrs), |attrs| {
            // Outputs: shapes from the kernel's inference, memory from the framework's allocator, so
            // the objects handed back own it as any tensor of theirs does. Until then each is a
            // ManagedTensor, released by its deleter if anything below fails.
            let mut owned: Vec<ManagedTensor> = Vec::with_capacity(num_outputs);
            if let Some((allocate, _)) = output_functions {
                let specs = registry::infer(name, &tensors, num_outputs, attrs)?;
                if specs.len() != num_outputs {
                    return Err(invalid(format!("{name}: inference gave {} outputs for {num_outputs}", specs.len())));
                }
                for (i, mut spec) in specs.into_iter().enumerate() {
                    let mut prototype = DLTensor {
                        data: std::ptr::null_mut(),
                        device,
                        ndim: spec.shape.len() as i32,
                        dtype: dtype_to_dl(spec.dtype),
                        shape: spec.shape.as_mut_ptr(),
                        strides: std::ptr::null_mut(),
                        byte_offset: 0,
                    };
                    let mut error = AllocatorError::default();
                    let mut made: *mut DLManagedTensorVersioned = std::ptr::null_mut();
                    let code = allocate(&mut prototype, &mut made, (&raw mut error).cast(), Some(keep_allocator_error));
                    if code != 0 || made.is_null() {
                        return Err(Error::KernelFailed {
                            name: name.to_string(),
                            message: format!(
                                "the framework could not allocate output {i} {:?} of {:?}: {}",
                                spec.shape,
                                spec.dtype,
                                error.message.as_deref().unwrap_or("no reason given")
                            ),
                        });
                    }
                    let tensor = ManagedTensor::from_versioned(made)?;
                    tensors.push(*tensor.dl_tensor());
                    owned.push(tensor);
                }
            }

            match site {
                Some(site) => registry::call_at(name, &mut tensors, num_inputs, stream, attrs, site),
                None => registry::call(name, &mut tensors, num_inputs, stream, attrs),
            }?;

            if let Some((_, to_object)) = output_functions {
                for (i, tensor) in owned.into_iter().enumerate() {
                    // Outputs come from managed_tensor_allocator, whose tensors are versioned.
                    let Some(raw) = tensor.into_versioned_raw() else {
                        return Err(invalid(format!("{name}: output {i} is not a versioned DLPack tensor")));
                    };
                    // The framework takes the tensor over whether or not it succeeds (the spec).
                    if to_object(raw, &mut outputs[i]) != 0 {
                        outputs[i] = std::ptr::null_mut();
                        return Err(invalid(format!(
                            "{name}: the framework could not make an object of output {i} (its exception says why); \
                         the outputs before it are in `outputs` and are the caller's to release"
                        )));
                    }
                }
            }
            Ok(OK)
        })
    }
}
