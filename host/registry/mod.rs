//! The kernel registry: kernel name -> compute function, output inference, accepted devices and
//! user data. Built-in kernels are registered under stable names (`dlkern.rmsnorm`, ...); users
//! add their own from Rust ([`register`]) or C (`dlkern_register_kernel`, plug-ins).
//!
//! Thread safety: every function here may be called from any thread at any time. A call holds
//! its own reference to the entry, so unregistering or replacing a kernel while it runs is
//! safe: the running call finishes with the old entry, and the old entry's `destroy(user_data)`
//! runs when the last such call returns.

mod c_attrs;
mod tvm_ffi;

use std::collections::BTreeMap;
use std::ffi::{CString, c_char, c_void};
use std::sync::{Arc, LazyLock, RwLock};

pub use c_attrs::{ATTR_FLOAT, ATTR_FLOATS, ATTR_INT, ATTR_INTS, ATTR_STRING, CAttr};
pub(crate) use c_attrs::{c_str, c_string};
pub use tvm_ffi::{TvmFfiKernel, register_tvm_ffi};
// The call interface lives in `kernel` (below the op families); re-exported here, where Rust
// users registering their own kernels look for it.
pub use crate::kernel::{AttrValue, Attributes, CallSite, InferArgs, KernelArgs, StreamHandle, TensorSpec};

use crate::dlpack::{DLTensor, DeviceKind, MAX_NDIM, TensorView, dtype_from_dl, dtype_to_dl};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A Rust compute function.
pub type RustCompute = Arc<dyn Fn(&KernelArgs) -> Result<()> + Send + Sync>;
/// A Rust inference function.
pub type RustInfer = Arc<dyn Fn(&InferArgs) -> Result<Vec<TensorSpec>> + Send + Sync>;

/// `dlkern_compute_fn` from `include/dlkern.h`.
pub type CComputeFn = unsafe extern "C" fn(
    tensors: *mut DLTensor,
    num_inputs: i32,
    num_outputs: i32,
    function_name: *const c_char,
    stream: StreamHandle,
    attrs: *const CAttr,
    num_attrs: i32,
    user_data: *mut c_void,
    error_buf: *mut c_char,
    error_buf_len: usize,
) -> i32;

/// `dlkern_infer_fn` from `include/dlkern.h`.
pub type CInferFn = unsafe extern "C" fn(
    inputs: *const DLTensor,
    num_inputs: i32,
    outputs: *mut DLTensor,
    num_outputs: i32,
    function_name: *const c_char,
    attrs: *const CAttr,
    num_attrs: i32,
    user_data: *mut c_void,
    error_buf: *mut c_char,
    error_buf_len: usize,
) -> i32;

/// How a kernel computes.
#[derive(Clone)]
pub enum Compute {
    Rust(RustCompute),
    C(CComputeFn),
}

/// How a kernel infers its outputs (or doesn't: callers must then allocate outputs themselves).
#[derive(Clone)]
pub enum Infer {
    None,
    Rust(RustInfer),
    C(CInferFn),
}

/// User data of a C kernel and the function that frees it.
pub struct UserData {
    pub ptr: *mut c_void,
    pub destroy: Option<unsafe extern "C" fn(*mut c_void)>,
}

// SAFETY: registering C user data promises it may be used from any thread (documented in
// include/dlkern.h); dlkern only passes the pointer back.
unsafe impl Send for UserData {}
unsafe impl Sync for UserData {}

impl UserData {
    /// Leaves the data with the registrant: `destroy` will not be called (a refused
    /// registration's data is still the caller's).
    pub fn disown(&mut self) {
        self.destroy = None;
    }
}

impl Drop for UserData {
    fn drop(&mut self) {
        if let Some(destroy) = self.destroy {
            // SAFETY: the registrant asked for exactly this call once the kernel is gone.
            unsafe { destroy(self.ptr) };
        }
    }
}

/// Everything the registry knows about one kernel.
pub struct KernelDef {
    pub name: String,
    pub compute: Compute,
    pub infer: Infer,
    /// Accepted tensor devices: [`crate::dlpack::DEVICE_MASK_CPU`] | [`crate::dlpack::DEVICE_MASK_CUDA`].
    pub device_mask: u32,
    /// Fixed number of outputs, or `None` for any.
    pub num_outputs: Option<usize>,
    pub user_data: Option<UserData>,
}

impl KernelDef {
    /// A Rust kernel with no inference, accepting the devices in `device_mask`.
    pub fn rust(
        name: impl Into<String>,
        device_mask: u32,
        compute: impl Fn(&KernelArgs) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        KernelDef {
            name: name.into(),
            compute: Compute::Rust(Arc::new(compute)),
            infer: Infer::None,
            device_mask,
            num_outputs: None,
            user_data: None,
        }
    }

    /// The registry entry of a declared op.
    pub fn builtin(decl: &crate::kernel::OpDecl) -> Self {
        let mut def = KernelDef::rust(decl.name, decl.devices, decl.compute).with_infer(decl.infer);
        def.num_outputs = decl.fixed_outputs();
        def
    }

    /// Adds a Rust inference function.
    pub fn with_infer(mut self, infer: impl Fn(&InferArgs) -> Result<Vec<TensorSpec>> + Send + Sync + 'static) -> Self {
        self.infer = Infer::Rust(Arc::new(infer));
        self
    }

    /// Fixes the number of outputs.
    pub fn with_outputs(mut self, n: usize) -> Self {
        self.num_outputs = Some(n);
        self
    }
}

/// Libraries whose functions the registry holds (plug-ins, TVM-FFI libraries) stay loaded for
/// the life of the process: their functions may be registered and running on any thread.
static LOADED: std::sync::Mutex<Vec<libloading::Library>> = std::sync::Mutex::new(Vec::new());

/// Keeps `library` loaded until the process ends.
pub(crate) fn keep_loaded(library: libloading::Library) {
    LOADED.lock().unwrap_or_else(|p| p.into_inner()).push(library);
}

type Entries = BTreeMap<String, Arc<KernelDef>>;

static REGISTRY: LazyLock<RwLock<Entries>> = LazyLock::new(|| {
    let mut entries = Entries::new();
    for decl in crate::ops::declarations() {
        entries.insert(decl.name.to_string(), Arc::new(KernelDef::builtin(decl)));
    }
    RwLock::new(entries)
});

fn read() -> std::sync::RwLockReadGuard<'static, Entries> {
    REGISTRY.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write() -> std::sync::RwLockWriteGuard<'static, Entries> {
    REGISTRY.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Registers a kernel. A name already taken is an error unless `replace`. On failure the
/// registry does not take ownership of the definition's user data (its `destroy` is not called).
pub fn register(mut def: KernelDef, replace: bool) -> Result<()> {
    let refuse = |def: &mut KernelDef, error: Error| {
        if let Some(user) = def.user_data.as_mut() {
            user.disown();
        }
        Err(error)
    };
    let name = def.name.clone();
    if name.is_empty() || name.contains('\0') || name.contains('\n') {
        return refuse(&mut def, Error::invalid("registry", format!("invalid kernel name {name:?}")));
    }
    if def.device_mask & (crate::dlpack::DEVICE_MASK_CPU | crate::dlpack::DEVICE_MASK_CUDA) == 0 {
        let message = format!("kernel '{name}' accepts no supported device (mask {:#x})", def.device_mask);
        return refuse(&mut def, Error::invalid("registry", message));
    }
    let old = {
        let mut entries = write();
        if entries.contains_key(&name) && !replace {
            drop(entries);
            return refuse(&mut def, Error::DuplicateKernel(name));
        }
        entries.insert(name, Arc::new(def))
    };
    drop(old); // outside the lock: may run a user's destroy()
    Ok(())
}

/// Removes a kernel. Calls in flight finish with it.
pub fn unregister(name: &str) -> Result<()> {
    let old = write().remove(name);
    match old {
        Some(_) => Ok(()),
        None => Err(unknown(name)),
    }
}

/// Registered names, sorted.
pub fn names() -> Vec<String> {
    read().keys().cloned().collect()
}

/// The kernel registered as `name`.
pub fn get(name: &str) -> Result<Arc<KernelDef>> {
    // Release the read lock before building the error: `unknown` reads the registry again, and
    // a second read while a writer waits would deadlock (std's RwLock prefers writers).
    let found = read().get(name).cloned();
    found.ok_or_else(|| unknown(name))
}

fn unknown(name: &str) -> Error {
    let names = names();
    let lower = name.to_lowercase();
    let mut scored: Vec<(usize, &String)> = names
        .iter()
        .map(|n| (edit_distance(&lower, &n.to_lowercase()), n))
        .filter(|(d, n)| {
            *d <= (name.len() / 3).max(2) || n.to_lowercase().contains(&lower) || lower.contains(&n.to_lowercase())
        })
        .collect();
    scored.sort();
    Error::UnknownKernel {
        name: name.to_string(),
        suggestions: scored.into_iter().take(3).map(|(_, n)| n.clone()).collect(),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Size of the message buffer given to C kernels.
const ERROR_BUF_LEN: usize = 1024;

fn message_from(buf: &[u8], code: i32) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let text = String::from_utf8_lossy(&buf[..end]).trim().to_string();
    if text.is_empty() { format!("returned {code} without a message") } else { text }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Calls kernel `name` on `tensors` (the first `num_inputs` are inputs, the rest outputs).
///
/// Checks the output count and that every tensor is on a device the kernel accepts, then runs
/// it. A Rust kernel that panics, or a C kernel that returns non-zero, becomes
/// [`Error::KernelFailed`] with its message.
///
/// # Safety
/// Every `DLTensor` must be valid as DLPack requires (shape/strides arrays of `ndim` elements;
/// data valid for the described extent on its device) for the duration of the call, outputs
/// writable; `stream` must be a stream of the tensors' CUDA context (or null).
pub unsafe fn call(
    name: &str,
    tensors: &mut [DLTensor],
    num_inputs: usize,
    stream: StreamHandle,
    attrs: &Attributes,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { call_with(name, tensors, num_inputs, stream, attrs, None) }
}

/// [`call`] from a call site the caller keeps across calls: a Rust kernel may keep what it
/// derives from the site's constant inputs there (C kernels do not see it).
///
/// # Safety
/// As [`call`], and the inputs `site` marks constant must be the same tensors, with the same
/// contents, on every call at this site.
pub unsafe fn call_at(
    name: &str,
    tensors: &mut [DLTensor],
    num_inputs: usize,
    stream: StreamHandle,
    attrs: &Attributes,
    site: &CallSite,
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { call_with(name, tensors, num_inputs, stream, attrs, Some(site)) }
}

unsafe fn call_with(
    name: &str,
    tensors: &mut [DLTensor],
    num_inputs: usize,
    stream: StreamHandle,
    attrs: &Attributes,
    site: Option<&CallSite>,
) -> Result<()> {
    let def = get(name)?;
    let fail = |message: String| Error::KernelFailed { name: name.to_string(), message };
    if num_inputs > tensors.len() {
        return Err(fail(format!("{num_inputs} inputs but only {} tensors", tensors.len())));
    }
    let num_outputs = tensors.len() - num_inputs;
    if let Some(n) = def.num_outputs
        && n != num_outputs
    {
        return Err(fail(format!("called with {num_outputs} outputs, the kernel has {n}")));
    }
    // A Rust kernel validates each tensor it takes (`KernelArgs::input`), so for it a tensor on
    // an accepted device passes on its device alone; a C kernel reads them raw, so each is
    // validated in full first (as is any tensor whose device is refused, for the error).
    let raw_kernel = matches!(def.compute, Compute::C(_));
    for (i, t) in tensors.iter().enumerate() {
        if !raw_kernel && DeviceKind::of_dl(t.device).is_some_and(|d| def.device_mask & d.mask_bit() != 0) {
            continue;
        }
        let label = tensor_label(i, num_inputs);
        // SAFETY: the caller guarantees valid DLTensors.
        let view = unsafe { TensorView::metadata_only(&label, t) }?;
        if def.device_mask & view.device().mask_bit() == 0 {
            return Err(fail(format!("{label} is on {:?}, which this kernel does not accept", view.device())));
        }
    }
    match &def.compute {
        Compute::Rust(f) => {
            let args = KernelArgs::new(name, tensors, num_inputs, stream, attrs, site);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&args))) {
                Ok(result) => result,
                Err(payload) => Err(fail(format!("panicked: {}", panic_message(payload)))),
            }
        }
        Compute::C(f) => {
            let c_name = CString::new(name).map_err(|_| fail("name contains NUL".into()))?;
            let c_attrs = c_attrs::CAttrs::new(attrs);
            let mut buf = [0u8; ERROR_BUF_LEN];
            let user = def.user_data.as_ref().map_or(std::ptr::null_mut(), |u| u.ptr);
            // SAFETY: the C kernel's contract (include/dlkern.h); all pointers live for the call.
            let code = unsafe {
                f(
                    tensors.as_mut_ptr(),
                    num_inputs as i32,
                    num_outputs as i32,
                    c_name.as_ptr(),
                    stream,
                    c_attrs.attrs.as_ptr(),
                    c_attrs.attrs.len() as i32,
                    user,
                    buf.as_mut_ptr().cast(),
                    ERROR_BUF_LEN,
                )
            };
            if code == 0 { Ok(()) } else { Err(fail(message_from(&buf, code))) }
        }
    }
}

/// "input i" or "output j" for tensor `i` of a call, for its error messages: the common ones
/// borrowed, so a call's success path formats nothing.
fn tensor_label(i: usize, num_inputs: usize) -> std::borrow::Cow<'static, str> {
    const INPUTS: [&str; 16] = [
        "input 0", "input 1", "input 2", "input 3", "input 4", "input 5", "input 6", "input 7", "input 8", "input 9",
        "input 10", "input 11", "input 12", "input 13", "input 14", "input 15",
    ];
    const OUTPUTS: [&str; 8] =
        ["output 0", "output 1", "output 2", "output 3", "output 4", "output 5", "output 6", "output 7"];
    let known = if i < num_inputs { INPUTS.get(i) } else { OUTPUTS.get(i - num_inputs) };
    match known {
        Some(&label) => label.into(),
        None if i < num_inputs => format!("input {i}").into(),
        None => format!("output {}", i - num_inputs).into(),
    }
}

/// Infers the dtype and shape of `num_outputs` outputs of kernel `name` from its inputs'
/// metadata.
///
/// # Safety
/// Every `DLTensor` in `inputs` must have valid shape/strides arrays; data is not read.
pub unsafe fn infer(
    name: &str,
    inputs: &[DLTensor],
    num_outputs: usize,
    attrs: &Attributes,
) -> Result<Vec<TensorSpec>> {
    let def = get(name)?;
    let fail = |message: String| Error::KernelFailed { name: name.to_string(), message };
    if let Some(n) = def.num_outputs
        && n != num_outputs
    {
        return Err(fail(format!("asked to infer {num_outputs} outputs, the kernel has {n}")));
    }
    let labels: Vec<_> = (0..inputs.len()).map(|i| tensor_label(i, inputs.len())).collect();
    let views = inputs
        .iter()
        .zip(&labels)
        // SAFETY: the caller guarantees valid shape/strides arrays.
        .map(|(t, label)| unsafe { TensorView::metadata_only(label, t) })
        .collect::<Result<Vec<_>>>()?;
    let specs = match &def.infer {
        Infer::None => return Err(fail("has no output inference; allocate its outputs yourself".into())),
        Infer::Rust(f) => {
            let args = InferArgs { function_name: name, inputs: &views, num_outputs, attrs };
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&args))) {
                Ok(result) => result?,
                Err(payload) => return Err(fail(format!("inference panicked: {}", panic_message(payload)))),
            }
        }
        Infer::C(f) => {
            let c_name = CString::new(name).map_err(|_| fail("name contains NUL".into()))?;
            let c_attrs = c_attrs::CAttrs::new(attrs);
            let mut shapes = vec![[0i64; MAX_NDIM]; num_outputs];
            let mut outputs: Vec<DLTensor> = shapes
                .iter_mut()
                .map(|shape| DLTensor {
                    data: std::ptr::null_mut(),
                    device: inputs.first().map_or(crate::dlpack::DeviceKind::Cpu.to_dl(), |t| t.device),
                    ndim: -1,
                    dtype: dtype_to_dl(DType::F32),
                    shape: shape.as_mut_ptr(),
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                })
                .collect();
            let mut buf = [0u8; ERROR_BUF_LEN];
            let user = def.user_data.as_ref().map_or(std::ptr::null_mut(), |u| u.ptr);
            // SAFETY: the C inference contract; shape buffers hold MAX_NDIM entries.
            let code = unsafe {
                f(
                    inputs.as_ptr(),
                    inputs.len() as i32,
                    outputs.as_mut_ptr(),
                    num_outputs as i32,
                    c_name.as_ptr(),
                    c_attrs.attrs.as_ptr(),
                    c_attrs.attrs.len() as i32,
                    user,
                    buf.as_mut_ptr().cast(),
                    ERROR_BUF_LEN,
                )
            };
            if code != 0 {
                return Err(fail(message_from(&buf, code)));
            }
            outputs
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if t.ndim < 0 || t.ndim as usize > MAX_NDIM || t.shape != shapes[i].as_mut_ptr() {
                        return Err(fail(format!("inference left output {i} with ndim {} or moved its shape", t.ndim)));
                    }
                    let dtype = dtype_from_dl(t.dtype)
                        .ok_or_else(|| fail(format!("inference gave output {i} an unsupported dtype")))?;
                    Ok(TensorSpec { dtype, shape: shapes[i][..t.ndim as usize].to_vec() })
                })
                .collect::<Result<Vec<_>>>()?
        }
    };
    if specs.len() != num_outputs {
        return Err(fail(format!("inference returned {} outputs, {num_outputs} requested", specs.len())));
    }
    if let Some((i, s)) =
        specs.iter().enumerate().find(|(_, s)| s.shape.iter().any(|&d| d < 0) || s.shape.len() > MAX_NDIM)
    {
        return Err(fail(format!("inference gave output {i} the invalid shape {:?}", s.shape)));
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::tensor_label;

    #[test]
    fn tensor_labels_count_inputs_then_outputs_past_the_borrowed_ones() {
        assert_eq!(tensor_label(0, 3), "input 0");
        assert_eq!(tensor_label(2, 3), "input 2");
        assert_eq!(tensor_label(3, 3), "output 0");
        assert_eq!(tensor_label(17, 20), "input 17");
        assert_eq!(tensor_label(30, 20), "output 10");
    }
}
