//! dlkern's ops as `OrtCustomOp`s: one struct per (op, element type, execution provider), all
//! of them thin wrappers that turn ORT values into DLPack tensors and call the registry.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::{Mutex, OnceLock};

use ort_sys::ONNXTensorElementDataType as Elem;
use ort_sys::*;

use super::api::{Api, ORT_API_VERSION_NEEDED, ORT_API_VERSION_SHAPE_REFERENCE, OrtResult};
use crate::dlpack::{DLDevice, DLDeviceType, DLTensor, dense_tensor};
use crate::dtype::DType;
use crate::kernel::{AttrKind, AttrValue, Attributes, CallSite, OpDecl, TensorDecl, TensorSpec, TensorType};
use crate::registry;

/// Which ONNX Runtime execution provider an op instance serves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Provider {
    Cpu,
    Cuda,
}

/// What an op does.
#[derive(Clone, Copy)]
enum Kind {
    /// A typed op for one declared kernel and one element type `T` (`elem`).
    Typed { decl: &'static OpDecl, op: &'static CStr, elem: Elem },
    /// `DLPackKernel`: any registered kernel, variadic heterogeneous inputs and outputs.
    Generic,
}

/// The ORT element type of a declared input or output (`UNDEFINED`: any, the kernel checks).
fn elem_of_decl(ty: TensorType, elem: Elem) -> Elem {
    match ty {
        TensorType::T => elem,
        TensorType::Fixed(dtype) | TensorType::Host(dtype) => elem_of(dtype),
        TensorType::Any(_) => Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED,
    }
}

/// One registered `OrtCustomOp` and what it stands for. `base` comes first so ORT's
/// `*const OrtCustomOp` can be cast back.
#[repr(C)]
struct DlkernOp {
    base: OrtCustomOp,
    kind: Kind,
    provider: Provider,
}

// SAFETY: immutable after construction; ORT reads it from any thread.
unsafe impl Send for DlkernOp {}
unsafe impl Sync for DlkernOp {}

const GENERIC_OP: &CStr = c"DLPackKernel";

impl DlkernOp {
    /// Whether input `index` is declared in host memory ([`TensorType::Host`]).
    fn host_input(&self, index: usize) -> bool {
        matches!(self.kind, Kind::Typed { decl, .. }
            if decl.inputs.get(index).is_some_and(|t| matches!(t.ty, TensorType::Host(_))))
    }
}

fn op_of(op: *const OrtCustomOp) -> &'static DlkernOp {
    // SAFETY: every OrtCustomOp dlkern registers is the first field of a leaked DlkernOp.
    unsafe { &*op.cast::<DlkernOp>() }
}

static API: OnceLock<Api> = OnceLock::new();

fn api() -> Api {
    *API.get().expect("the API is set before any op is registered")
}

/// Runs an ORT callback body, turning errors and panics into an error status.
fn guarded(what: &str, body: impl FnOnce() -> OrtResult<()>) -> OrtStatusPtr {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => OrtStatusPtr(std::ptr::null_mut()),
        Ok(Err(message)) => OrtStatusPtr(api().error(&message)),
        Err(_) => OrtStatusPtr(api().error(&format!("{what}: internal error in dlkern (panic contained)"))),
    }
}

fn all_ops() -> &'static [DlkernOp] {
    // Never modified after initialisation, so the elements keep their addresses (ORT holds them).
    static OPS: OnceLock<Vec<DlkernOp>> = OnceLock::new();
    OPS.get_or_init(|| {
        let mut ops = Vec::new();
        for provider in [Provider::Cuda, Provider::Cpu] {
            for decl in crate::ops::declarations() {
                let Some(ort) = &decl.ort else { continue };
                let types = if provider == Provider::Cuda { ort.cuda } else { ort.cpu };
                for &dtype in types {
                    let kind = Kind::Typed { decl, op: ort.name, elem: elem_of(dtype) };
                    ops.push(DlkernOp { base: custom_op_table(), kind, provider });
                }
            }
            ops.push(DlkernOp { base: custom_op_table(), kind: Kind::Generic, provider });
        }
        ops
    })
}

fn custom_op_table() -> OrtCustomOp {
    OrtCustomOp {
        // The struct layout dlkern fills (through GetEndVersion).
        version: ORT_API_VERSION_NEEDED,
        CreateKernel: None,
        GetName: Some(get_name),
        GetExecutionProviderType: Some(get_provider),
        GetInputType: Some(get_input_type),
        GetInputTypeCount: Some(get_input_count),
        GetOutputType: Some(get_output_type),
        GetOutputTypeCount: Some(get_output_count),
        KernelCompute: None,
        KernelDestroy: Some(kernel_destroy),
        GetInputCharacteristic: Some(get_input_characteristic),
        GetOutputCharacteristic: Some(get_output_characteristic),
        GetInputMemoryType: Some(get_input_memory_type),
        GetVariadicInputMinArity: Some(variadic_min_arity),
        GetVariadicInputHomogeneity: Some(variadic_homogeneity),
        GetVariadicOutputMinArity: Some(variadic_min_arity),
        GetVariadicOutputHomogeneity: Some(variadic_homogeneity),
        CreateKernelV2: Some(create_kernel),
        KernelComputeV2: Some(kernel_compute),
        InferOutputShapeFn: Some(infer_output_shape),
        GetStartVersion: Some(start_version),
        GetEndVersion: Some(end_version),
        // Version 18's fields, past the layout `version` declares: ORT does not read them.
        GetMayInplace: None,
        ReleaseMayInplace: None,
        GetAliasMap: None,
        ReleaseAliasMap: None,
    }
}

unsafe extern "system" fn get_name(op: *const OrtCustomOp) -> *const c_char {
    match op_of(op).kind {
        Kind::Typed { op, .. } => op.as_ptr(),
        Kind::Generic => GENERIC_OP.as_ptr(),
    }
}

unsafe extern "system" fn get_provider(op: *const OrtCustomOp) -> *const c_char {
    match op_of(op).provider {
        Provider::Cuda => c"CUDAExecutionProvider".as_ptr(),
        Provider::Cpu => c"CPUExecutionProvider".as_ptr(),
    }
}

unsafe extern "system" fn get_input_type(op: *const OrtCustomOp, index: usize) -> Elem {
    match op_of(op).kind {
        Kind::Typed { decl, elem, .. } => {
            decl.inputs.get(index).map_or(Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, |t| elem_of_decl(t.ty, elem))
        }
        Kind::Generic => Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED,
    }
}

unsafe extern "system" fn get_output_type(op: *const OrtCustomOp, index: usize) -> Elem {
    match op_of(op).kind {
        Kind::Typed { decl, elem, .. } => {
            decl.outputs.get(index).map_or(Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, |t| elem_of_decl(t.ty, elem))
        }
        Kind::Generic => Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED,
    }
}

unsafe extern "system" fn get_input_count(op: *const OrtCustomOp) -> usize {
    match op_of(op).kind {
        Kind::Typed { decl, .. } => decl.inputs.len(),
        Kind::Generic => 1,
    }
}

unsafe extern "system" fn get_output_count(op: *const OrtCustomOp) -> usize {
    match op_of(op).kind {
        Kind::Typed { decl, .. } => decl.outputs.len(),
        Kind::Generic => 1, // the variadic output
    }
}

fn characteristic(list: &[TensorDecl], index: usize) -> OrtCustomOpInputOutputCharacteristic {
    if list.get(index).is_some_and(|t| t.optional) {
        OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_OPTIONAL
    } else {
        OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_REQUIRED
    }
}

unsafe extern "system" fn get_input_characteristic(
    op: *const OrtCustomOp,
    index: usize,
) -> OrtCustomOpInputOutputCharacteristic {
    match op_of(op).kind {
        Kind::Typed { decl, .. } => characteristic(decl.inputs, index),
        Kind::Generic => OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_VARIADIC,
    }
}

unsafe extern "system" fn get_output_characteristic(
    op: *const OrtCustomOp,
    index: usize,
) -> OrtCustomOpInputOutputCharacteristic {
    match op_of(op).kind {
        Kind::Typed { decl, .. } => characteristic(decl.outputs, index),
        Kind::Generic => OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_VARIADIC,
    }
}

unsafe extern "system" fn get_input_memory_type(op: *const OrtCustomOp, index: usize) -> OrtMemType {
    if op_of(op).host_input(index) { OrtMemType::OrtMemTypeCPUInput } else { OrtMemType::OrtMemTypeDefault }
}

unsafe extern "system" fn variadic_min_arity(_op: *const OrtCustomOp) -> c_int {
    1
}

unsafe extern "system" fn variadic_homogeneity(_op: *const OrtCustomOp) -> c_int {
    0 // heterogeneous: each input/output has its own type
}

unsafe extern "system" fn start_version(_op: *const OrtCustomOp) -> c_int {
    1
}

unsafe extern "system" fn end_version(_op: *const OrtCustomOp) -> c_int {
    c_int::MAX
}

impl NodeKernel {
    fn optional_input(&self, i: usize) -> bool {
        matches!(self.op.kind, Kind::Typed { decl, .. } if decl.inputs.get(i).is_some_and(|x| x.optional))
    }
    fn optional_output(&self, i: usize) -> bool {
        matches!(self.op.kind, Kind::Typed { decl, .. } if decl.outputs.get(i).is_some_and(|x| x.optional))
    }
}

/// A kernel instance: one node of a session.
struct NodeKernel {
    op: &'static DlkernOp,
    /// "dlkern RMSNorm node 'n1'" for messages.
    label: String,
    function_name: String,
    attrs: Attributes,
    num_outputs: usize,
    /// The node's initializer inputs, and what its kernel derives from them (`matmul_nbits`
    /// keeps its repacked B there).
    site: CallSite,
    /// The node's last output inference: the key of what it read (each input's dtype and
    /// shape, the values of host inputs) and the outputs it gave. A decode step repeats its
    /// shapes, so most calls skip the kernel's inference.
    inferred: Mutex<Option<(Vec<i64>, Vec<TensorSpec>)>>,
}

fn op_name(op: &DlkernOp) -> &'static str {
    match op.kind {
        Kind::Typed { op, .. } => op.to_str().unwrap_or("?"),
        Kind::Generic => "DLPackKernel",
    }
}

unsafe extern "system" fn create_kernel(
    op: *const OrtCustomOp,
    _api: *const OrtApi,
    info: *const OrtKernelInfo,
    kernel: *mut *mut c_void,
) -> OrtStatusPtr {
    let op = op_of(op);
    guarded("CreateKernel", || {
        let api = api();
        let label = format!("dlkern {} node '{}'", op_name(op), api.node_name(info));
        let with_label = |m: String| format!("{label}: {m}");
        let mut n_out = 0usize;
        // SAFETY: valid info.
        api.check(unsafe { (api.0.KernelInfo_GetOutputCount)(info, &mut n_out) }).map_err(with_label)?;
        let mut attrs = Attributes::new();
        let function_name = match op.kind {
            Kind::Typed { decl, .. } => {
                for a in decl.attrs {
                    let name = a.name.to_string_lossy();
                    // Absent: the default (or an error if required). Present with another type:
                    // the node is wrong.
                    let wrong_type = |want: &str| match read_any_attr(api, info, &name) {
                        Some(other) => Err(with_label(format!("attribute '{name}' must be {want}, got {other:?}"))),
                        None => Ok(()),
                    };
                    match a.kind {
                        AttrKind::Float { default } => {
                            let value = match api.attr_f32(info, a.name) {
                                Ok(v) => v,
                                Err(_) => {
                                    wrong_type("a float")?;
                                    default
                                }
                            };
                            if !value.is_finite() || value < 0.0 {
                                return Err(with_label(format!(
                                    "attribute '{name}' = {value} must be finite and >= 0"
                                )));
                            }
                            attrs.set(name, AttrValue::Float(value as f64));
                        }
                        AttrKind::Int | AttrKind::OptionalInt { .. } => match api.attr_i64(info, a.name) {
                            Ok(v) => attrs.set(name, AttrValue::Int(v)),
                            Err(_) => {
                                wrong_type("an int")?;
                                if a.kind == AttrKind::Int {
                                    return Err(with_label(format!("missing required int attribute '{name}'")));
                                }
                            }
                        },
                        AttrKind::OptionalString { .. } => match api.attr_string(info, a.name) {
                            Ok(v) => attrs.set(name, AttrValue::String(v)),
                            Err(_) => wrong_type("a string")?,
                        },
                    }
                }
                decl.name.to_string()
            }
            Kind::Generic => {
                let name = api.attr_string(info, c"function_name").map_err(|_| {
                    match read_any_attr(api, info, "function_name") {
                        Some(other) => with_label(format!("attribute 'function_name' must be a string, got {other:?}")),
                        None => with_label("missing required string attribute 'function_name'".into()),
                    }
                })?;
                registry::get(&name).map_err(|e| with_label(e.to_string()))?;
                if let Ok(list) = api.attr_string(info, c"attribute_names") {
                    for attr in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                        let value = read_any_attr(api, info, attr).ok_or_else(|| {
                            with_label(format!("attribute_names lists '{attr}', which the node does not have"))
                        })?;
                        attrs.set(attr, value);
                    }
                }
                name
            }
        };
        let site = CallSite::new(api.constant_inputs(info));
        let state = Box::new(NodeKernel {
            op,
            label,
            function_name,
            attrs,
            num_outputs: n_out,
            site,
            inferred: Mutex::new(None),
        });
        // SAFETY: ORT passes a valid out-pointer; KernelDestroy frees the box.
        unsafe { *kernel = Box::into_raw(state).cast() };
        Ok(())
    })
}

/// An attribute of unknown type: tries each type ORT can return for a name.
fn read_any_attr(api: Api, info: *const OrtKernelInfo, name: &str) -> Option<AttrValue> {
    let c = CString::new(name).ok()?;
    if let Ok(v) = api.attr_i64(info, &c) {
        return Some(AttrValue::Int(v));
    }
    if let Ok(v) = api.attr_f32(info, &c) {
        return Some(AttrValue::Float(v as f64));
    }
    if let Ok(v) = api.attr_string(info, &c) {
        return Some(AttrValue::String(v));
    }
    if let Ok(v) = api.attr_i64s(info, &c) {
        return Some(AttrValue::Ints(v));
    }
    api.attr_f32s(info, &c).ok().map(|v| AttrValue::Floats(v.into_iter().map(f64::from).collect()))
}

unsafe extern "system" fn kernel_destroy(kernel: *mut c_void) {
    if !kernel.is_null() {
        // SAFETY: created by create_kernel.
        drop(unsafe { Box::from_raw(kernel.cast::<NodeKernel>()) });
    }
}

fn dtype_of(elem: Elem) -> Option<DType> {
    Some(match elem {
        Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT => DType::F32,
        Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 => DType::F16,
        Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 => DType::BF16,
        Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 => DType::I8,
        Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 => DType::U8,
        Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 => DType::I32,
        Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 => DType::I64,
        _ => return None,
    })
}

unsafe extern "system" fn kernel_compute(kernel: *mut c_void, context: *mut OrtKernelContext) -> OrtStatusPtr {
    // SAFETY: created by create_kernel, alive until KernelDestroy.
    let kernel = unsafe { &*kernel.cast::<NodeKernel>() };
    guarded("Compute", || {
        CALL_SCRATCH
            .with(|cell| match cell.try_borrow_mut() {
                Ok(mut scratch) => compute(kernel, context, &mut scratch),
                // A kernel that runs another session on this thread (a plug-in can): its nodes
                // get buffers of their own.
                Err(_) => compute(kernel, context, &mut CallScratch::default()),
            })
            .map_err(|m| format!("{}: {m}", kernel.label))
    })
}

/// One tensor of a call as ORT describes it: its dims are `dims[offset..offset + ndim]` of the
/// call's [`CallScratch`].
#[derive(Clone, Copy)]
struct TensorMeta {
    data: *mut c_void,
    device: DLDevice,
    dtype: DType,
    offset: usize,
    ndim: usize,
}

/// What one call gathers from ORT before it calls the registry, in buffers each thread keeps
/// from call to call: once they have grown to a node's size, a call allocates nothing on its
/// way to the kernel.
#[derive(Default)]
struct CallScratch {
    /// Every tensor's dims, one after another.
    dims: Vec<i64>,
    /// Inputs (absent ones as 0-element placeholders), then outputs.
    metas: Vec<TensorMeta>,
    tensors: Vec<DLTensor>,
    /// What the outputs' inference depends on (see `NodeKernel::inferred`).
    key: Vec<i64>,
}

thread_local! {
    static CALL_SCRATCH: std::cell::RefCell<CallScratch> = std::cell::RefCell::default();
}

impl CallScratch {
    /// A 0-element placeholder for an absent optional tensor (keeps the positions).
    fn push_absent(&mut self, provider: Provider) {
        let offset = self.dims.len();
        self.dims.push(0);
        let device = device_of_provider(provider);
        self.metas.push(TensorMeta { data: std::ptr::null_mut(), device, dtype: DType::U8, offset, ndim: 1 });
    }

    /// `self.tensors` anew over the first `count` metas. Built after the last change to
    /// `dims`, so that every shape pointer is derived from the buffer as it now stands.
    fn build_tensors(&mut self, count: usize) {
        let base = self.dims.as_mut_ptr();
        self.tensors.clear();
        self.tensors.extend(self.metas[..count].iter().map(|m| {
            // SAFETY: offset + ndim <= dims.len() (each meta's dims were pushed with it), and the
            // metas' ranges do not overlap.
            let shape = unsafe { std::slice::from_raw_parts_mut(base.add(m.offset), m.ndim) };
            dense_tensor(m.data, m.device, m.dtype, shape)
        }));
    }
}

/// Appends the values of a host input to an inference key; `false` (the call's inference is
/// not cached) when it has more than a few elements.
///
/// # Safety
/// `data` is null or points to `elements` host elements of `dtype`, valid for the call.
unsafe fn host_values_into(key: &mut Vec<i64>, data: *const c_void, dtype: DType, elements: usize) -> bool {
    const MOST: usize = 8;
    if data.is_null() || elements == 0 {
        key.push(-1);
        return true;
    }
    if elements > MOST {
        return false;
    }
    let size = dtype.size_bytes();
    // SAFETY: the caller's contract.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), elements * size) };
    key.extend(bytes.chunks_exact(size).map(|c| {
        let mut word = [0u8; 8];
        word[..size].copy_from_slice(c);
        i64::from_le_bytes(word)
    }));
    true
}

fn compute(kernel: &NodeKernel, context: *mut OrtKernelContext, s: &mut CallScratch) -> OrtResult<()> {
    let api = api();
    let (mut n_in, mut n_out) = (0usize, 0usize);
    // SAFETY: a valid context for the duration of the call.
    unsafe {
        api.check((api.0.KernelContext_GetInputCount)(context, &mut n_in))?;
        api.check((api.0.KernelContext_GetOutputCount)(context, &mut n_out))?;
    }
    let mut stream: *mut c_void = std::ptr::null_mut();
    if kernel.op.provider == Provider::Cuda {
        // SAFETY: a valid context; the stream stays ORT's.
        api.check(unsafe { (api.0.KernelContext_GetGPUComputeStream)(context, &mut stream) })?;
    }
    s.dims.clear();
    s.metas.clear();
    s.key.clear();
    // A typed op's inference reads the inputs' dtypes and shapes and the values of its host
    // inputs, nothing else: calls that agree on those share its result. (A DLPackKernel's
    // inference is the plug-in's, which may read anything.)
    let mut cacheable = matches!(kernel.op.kind, Kind::Typed { .. });
    // A CUDA node's tensors all live on its EP's device (ORT copies inputs there and allocates
    // the outputs there): asked once per call, for the first of them, not once per tensor (two
    // ORT calls each).
    let mut device_of_node = None;
    let mut device = |value: *const OrtValue| -> OrtResult<DLDevice> {
        match device_of_node {
            Some(device) => Ok(device),
            None => {
                let device = device_of(api, kernel.op.provider, value)?;
                device_of_node = Some(device);
                Ok(device)
            }
        }
    };
    for i in 0..n_in {
        let mut value: *const OrtValue = std::ptr::null();
        // SAFETY: index < input count.
        api.check(unsafe { (api.0.KernelContext_GetInput)(context, i, &mut value) })?;
        if value.is_null() {
            if !kernel.optional_input(i) {
                return Err(format!("input {i} is missing"));
            }
            s.push_absent(kernel.op.provider);
            s.key.push(-2);
            continue;
        }
        let offset = s.dims.len();
        let elem = api.value_type_and_shape_into(value, &mut s.dims)?;
        let ndim = s.dims.len() - offset;
        let dtype =
            dtype_of(elem).ok_or_else(|| format!("input {i} has element type {elem:?}, which dlkern does not take"))?;
        let host = kernel.op.host_input(i);
        let device = if host { device_of_provider(Provider::Cpu) } else { device(value)? };
        let data = api.mutable_data(value.cast_mut())?;
        s.metas.push(TensorMeta { data, device, dtype, offset, ndim });
        s.key.extend([dtype as i64, ndim as i64]);
        s.key.extend_from_slice(&s.dims[offset..]);
        if host && cacheable {
            let elements = s.dims[offset..].iter().product::<i64>().max(0) as usize;
            // SAFETY: a host input of this dtype and shape, valid for the call.
            cacheable = unsafe { host_values_into(&mut s.key, data, dtype, elements) };
        }
    }
    // Trailing optional inputs the node left out.
    let declared = match kernel.op.kind {
        Kind::Typed { decl, .. } => decl.inputs.len(),
        Kind::Generic => n_in,
    };
    for _ in n_in..declared {
        s.push_absent(kernel.op.provider);
    }
    let n_in = n_in.max(declared);
    // Outputs: shapes from the kernel's inference (or from this node's last one, for the same
    // key), memory from ORT.
    let mut last = if cacheable { kernel.inferred.try_lock().ok() } else { None };
    let fresh;
    let specs: &[TensorSpec] = match last.as_deref() {
        Some(Some((key, specs))) if *key == s.key => specs,
        _ => {
            s.build_tensors(n_in);
            // SAFETY: the DLTensors point into `s.dims`, unchanged while they are used here.
            fresh = unsafe { registry::infer(&kernel.function_name, &s.tensors, n_out, &kernel.attrs) }
                .map_err(|e| e.to_string())?;
            if let Some(slot) = last.as_deref_mut() {
                *slot = Some((s.key.clone(), fresh.clone()));
            }
            &fresh
        }
    };
    for (i, spec) in specs.iter().enumerate() {
        let mut value: *mut OrtValue = std::ptr::null_mut();
        // SAFETY: index < output count; ORT allocates on the op's provider.
        api.check(unsafe {
            (api.0.KernelContext_GetOutput)(context, i, spec.shape.as_ptr(), spec.shape.len(), &mut value)
        })?;
        if value.is_null() {
            if !kernel.optional_output(i) {
                return Err(format!("ORT could not allocate output {i} of shape {:?}", spec.shape));
            }
            // An omitted optional output (`''` in the node): a 0-element placeholder keeps the
            // positions, as for inputs.
            s.push_absent(kernel.op.provider);
            continue;
        }
        let device = device(value)?;
        let data = api.mutable_data(value)?;
        let offset = s.dims.len();
        s.dims.extend_from_slice(&spec.shape);
        s.metas.push(TensorMeta { data, device, dtype: spec.dtype, offset, ndim: spec.shape.len() });
    }
    drop(last);
    debug_assert_eq!(kernel.num_outputs, n_out);
    s.build_tensors(s.metas.len());
    // SAFETY: ORT's tensors are valid on their device for this call, their shapes in `s.dims`,
    // which does not change again before the call returns; `stream` is ORT's compute stream of
    // the node's device (or null on the CPU provider); the inputs the site marks constant are
    // the node's initializers, the same tensors on every call.
    unsafe { registry::call_at(&kernel.function_name, &mut s.tensors, n_in, stream, &kernel.attrs, &kernel.site) }
        .map_err(|e| e.to_string())
}

/// The DLPack device of a placeholder on `provider` (device 0 for CUDA: it is never read).
fn device_of_provider(provider: Provider) -> DLDevice {
    match provider {
        Provider::Cpu => DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
        Provider::Cuda => DLDevice { device_type: DLDeviceType::CUDA, device_id: 0 },
    }
}

fn device_of(api: Api, provider: Provider, value: *const OrtValue) -> OrtResult<DLDevice> {
    Ok(match provider {
        Provider::Cpu => DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
        Provider::Cuda => DLDevice { device_type: DLDeviceType::CUDA, device_id: api.device_id(value)? },
    })
}

unsafe extern "system" fn infer_output_shape(
    op: *const OrtCustomOp,
    context: *mut OrtShapeInferContext,
) -> OrtStatusPtr {
    let op = op_of(op);
    guarded("InferOutputShape", || infer_shapes(op, context).map_err(|m| format!("dlkern {}: {m}", op_name(op))))
}

/// Output types and shapes from the registry kernel's own inference, for typed ops and
/// `DLPackKernel` alike. Unknown (symbolic) input dimensions are probed twice with distinct
/// values: an output dimension that stays put is static; one that follows an input's unknown
/// dimension keeps that dimension's symbolic name; any other varying one gets a fresh name.
fn infer_shapes(op: &DlkernOp, context: *mut OrtShapeInferContext) -> OrtResult<()> {
    let api = api();
    let mut attrs = Attributes::new();
    let (function_name, n_out) = match op.kind {
        Kind::Typed { decl, .. } => {
            for a in decl.attrs {
                if let Some(value) = api.infer_attr_any(context, a.name) {
                    attrs.set(a.name.to_string_lossy(), value);
                } else if let AttrKind::Float { default } = a.kind {
                    attrs.set(a.name.to_string_lossy(), AttrValue::Float(default as f64));
                }
            }
            (decl.name.to_string(), decl.outputs.len())
        }
        Kind::Generic => {
            let name = api
                .infer_attr_string(context, c"function_name")
                .ok_or("missing required string attribute 'function_name'")?;
            if let Some(list) = api.infer_attr_string(context, c"attribute_names") {
                for attr in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let c = CString::new(attr).map_err(|e| e.to_string())?;
                    if let Some(value) = api.infer_attr_any(context, &c) {
                        attrs.set(attr, value);
                    }
                }
            }
            // The context has no output count: the kernel's declared one (or one).
            let kernel = registry::get(&name).map_err(|e| e.to_string())?;
            let n_out = kernel.num_outputs.unwrap_or(1);
            (name, n_out)
        }
    };
    let mut n_in = 0usize;
    // SAFETY: a valid context.
    api.check(unsafe { (api.0.ShapeInferContext_GetInputCount)(context, &mut n_in) })?;
    // (dtype, dims, symbolic names) per input; an absent optional input is a 0-element u8.
    let mut inputs = Vec::with_capacity(n_in);
    for i in 0..n_in {
        let mut info = std::ptr::null_mut();
        // SAFETY: index < count; the info is owned by the context.
        let got = api.check(unsafe { (api.0.ShapeInferContext_GetInputTypeShape)(context, i, &mut info) });
        if got.is_err() || info.is_null() {
            inputs.push((DType::U8, vec![0i64], vec![String::new()]));
            continue;
        }
        let (elem, dims) = api.type_and_shape(info, false)?;
        let names = api.symbolic_dims(info, dims.len());
        let dtype =
            dtype_of(elem).ok_or_else(|| format!("input {i} has element type {elem:?}, which dlkern does not take"))?;
        inputs.push((dtype, dims, names));
    }
    // Unknown dimensions, in order: (input, axis).
    let unknown: Vec<(usize, usize)> = inputs
        .iter()
        .enumerate()
        .flat_map(|(i, (_, dims, _))| dims.iter().enumerate().filter(|(_, d)| **d < 0).map(move |(a, _)| (i, a)))
        .collect();
    let probe_value = |probe: usize, slot: usize| [101i64, 211][probe] + slot as i64;
    let mut probes = Vec::with_capacity(2);
    for probe in 0..2 {
        let mut shapes: Vec<Vec<i64>> = inputs.iter().map(|(_, dims, _)| dims.clone()).collect();
        for (slot, &(i, a)) in unknown.iter().enumerate() {
            shapes[i][a] = probe_value(probe, slot);
        }
        let device = DLDevice { device_type: DLDeviceType::CPU, device_id: 0 };
        let tensors: Vec<DLTensor> = shapes
            .iter_mut()
            .zip(&inputs)
            .map(|(s, (d, _, _))| dense_tensor(std::ptr::null_mut(), device, *d, s))
            .collect();
        // SAFETY: metadata-only tensors with live shape arrays.
        probes.push(unsafe { registry::infer(&function_name, &tensors, n_out, &attrs) }.map_err(|e| e.to_string())?);
        if unknown.is_empty() {
            break;
        }
    }
    let last = probes.len() - 1;
    for (i, spec) in probes[0].iter().enumerate() {
        let other = &probes[last][i];
        let mut names = Vec::with_capacity(spec.shape.len());
        let dims: Vec<i64> = (0..spec.shape.len())
            .map(|axis| {
                let (d0, d1) = (spec.shape[axis], other.shape.get(axis).copied().unwrap_or(-1));
                if d0 == d1 {
                    names.push(String::new());
                    return d0;
                }
                let source = (0..unknown.len()).find(|&slot| d0 == probe_value(0, slot) && d1 == probe_value(1, slot));
                let name = source
                    .map(|slot| inputs[unknown[slot].0].2.get(unknown[slot].1).cloned().unwrap_or_default())
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| format!("{function_name}_out{i}_{axis}"));
                names.push(name);
                -1
            })
            .collect();
        let set = api.set_output(context, i, elem_of(spec.dtype), &dims, |axis| names[axis].clone());
        // The context cannot say how many outputs the node has: a node that leaves out trailing
        // optional outputs makes setting those fail, which is not an error of the node.
        let optional = matches!(op.kind, Kind::Typed { decl, .. } if decl.outputs.get(i).is_some_and(|o| o.optional));
        if set.is_err() && optional {
            break;
        }
        set?;
    }
    Ok(())
}

fn elem_of(dtype: DType) -> Elem {
    match dtype {
        DType::F32 => Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
        DType::F16 => Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
        DType::BF16 => Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16,
        DType::I8 => Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8,
        DType::U8 => Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
        DType::I32 => Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32,
        DType::I64 => Elem::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
    }
}

/// Custom-op domains handed to sessions; ORT requires them to outlive the sessions, so they
/// are kept for the life of the process.
struct Domains(Vec<usize>);
static DOMAINS: Mutex<Domains> = Mutex::new(Domains(Vec::new()));

/// `RegisterCustomOps`: adds the `dlkern` domain with every op to `options`.
///
/// # Safety
/// ORT's arguments.
pub(super) unsafe fn register(options: *mut OrtSessionOptions, api_base: *const OrtApiBase) -> *mut OrtStatus {
    if api_base.is_null() || options.is_null() {
        return std::ptr::null_mut(); // no API to build a status with
    }
    // SAFETY: ORT's API base.
    let table = unsafe { ((*api_base).GetApi)(ORT_API_VERSION_NEEDED) };
    if table.is_null() {
        // SAFETY: version 1 of the API exists in every runtime; CreateStatus is in its prefix.
        let v1 = unsafe { ((*api_base).GetApi)(1) };
        if v1.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: as above.
        let version = unsafe { super::runtime_version(api_base) };
        let message = format!(
            "libdlkern needs ONNX Runtime C API version {ORT_API_VERSION_NEEDED} (ONNX Runtime 1.{ORT_API_VERSION_NEEDED}) or newer; this runtime is {version}"
        );
        return Api(unsafe { &*v1 }, false).error(&message);
    }
    // SAFETY: ORT's API base.
    let shape_reference = unsafe { super::runtime_api_version(api_base) } >= ORT_API_VERSION_SHAPE_REFERENCE;
    // SAFETY: a valid table for the life of the process, of at least the runtime's version.
    let api = *API.get_or_init(|| Api(unsafe { &*table }, shape_reference));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> OrtResult<()> {
        let mut domain = std::ptr::null_mut();
        let name = CString::new(super::DOMAIN).map_err(|e| e.to_string())?;
        // SAFETY: ORT calls with valid arguments; ops are 'static.
        unsafe {
            api.check((api.0.CreateCustomOpDomain)(name.as_ptr(), &mut domain))?;
            DOMAINS.lock().unwrap_or_else(|p| p.into_inner()).0.push(domain as usize);
            for op in all_ops() {
                api.check((api.0.CustomOpDomain_Add)(domain, &op.base))?;
            }
            api.check((api.0.AddCustomOpDomain)(options, domain))
        }
    }));
    match result {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(message)) => api.error(&format!("dlkern: registering custom ops failed: {message}")),
        Err(_) => api.error("dlkern: registering custom ops failed (internal error, panic contained)"),
    }
}
