//! Thin `Result` wrappers over the ONNX Runtime C API calls the ops use.

use std::ffi::{CStr, CString, c_char, c_void};

use ort_sys::*;

/// The lowest ORT C API version dlkern needs: custom-op shape inference
/// (`InferOutputShapeFn`, `ShapeInferContext_*`) and `CreateKernelV2`/`KernelComputeV2` arrived
/// in 1.17.
pub const ORT_API_VERSION_NEEDED: u32 = 17;

/// The C API version of `GetTensorElementTypeAndShapeDataReference` (ONNX Runtime 1.24): a
/// tensor's type and a reference to its dims in one call, where the older way takes five and a
/// heap-allocated info.
pub const ORT_API_VERSION_SHAPE_REFERENCE: u32 = 24;

/// The ORT C API table with error handling, and whether the runtime's table reaches
/// [`ORT_API_VERSION_SHAPE_REFERENCE`] (the fields past version [`ORT_API_VERSION_NEEDED`] are
/// read only then).
#[derive(Clone, Copy)]
pub(crate) struct Api(pub &'static OrtApi, pub bool);

// SAFETY: the OrtApi table is immutable and valid for the life of the process.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

pub(crate) type OrtResult<T> = Result<T, String>;

impl Api {
    /// Turns a returned status into a Result (releasing the status).
    pub fn check(self, status: OrtStatusPtr) -> OrtResult<()> {
        if status.0.is_null() {
            return Ok(());
        }
        // SAFETY: a non-null status from ORT; we own it.
        unsafe {
            let message = CStr::from_ptr((self.0.GetErrorMessage)(status.0)).to_string_lossy().into_owned();
            (self.0.ReleaseStatus)(status.0);
            Err(message)
        }
    }

    /// A new error status with `message`.
    pub fn error(self, message: &str) -> *mut OrtStatus {
        let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: CreateStatus copies the message.
        unsafe { (self.0.CreateStatus)(OrtErrorCode::ORT_FAIL, c.as_ptr()).0 }
    }

    pub fn attr_f32(self, info: *const OrtKernelInfo, name: &CStr) -> OrtResult<f32> {
        let mut v = 0f32;
        // SAFETY: valid info and out-pointer.
        self.check(unsafe { (self.0.KernelInfoGetAttribute_float)(info, name.as_ptr(), &mut v) })?;
        Ok(v)
    }

    pub fn attr_i64(self, info: *const OrtKernelInfo, name: &CStr) -> OrtResult<i64> {
        let mut v = 0i64;
        // SAFETY: valid info and out-pointer.
        self.check(unsafe { (self.0.KernelInfoGetAttribute_int64)(info, name.as_ptr(), &mut v) })?;
        Ok(v)
    }

    pub fn attr_string(self, info: *const OrtKernelInfo, name: &CStr) -> OrtResult<String> {
        let mut size = 0usize;
        // SAFETY: size query with a null buffer, then a read into a buffer of that size.
        unsafe {
            self.check((self.0.KernelInfoGetAttribute_string)(info, name.as_ptr(), std::ptr::null_mut(), &mut size))?;
            let mut buf = vec![0u8; size.max(1)];
            self.check((self.0.KernelInfoGetAttribute_string)(
                info,
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                &mut size,
            ))?;
            Ok(CStr::from_bytes_until_nul(&buf).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default())
        }
    }

    pub fn attr_i64s(self, info: *const OrtKernelInfo, name: &CStr) -> OrtResult<Vec<i64>> {
        let mut size = 0usize;
        // SAFETY: size query, then a read into a buffer of that size.
        unsafe {
            self.check((self.0.KernelInfoGetAttributeArray_int64)(
                info,
                name.as_ptr(),
                std::ptr::null_mut(),
                &mut size,
            ))?;
            let mut v = vec![0i64; size];
            self.check((self.0.KernelInfoGetAttributeArray_int64)(info, name.as_ptr(), v.as_mut_ptr(), &mut size))?;
            Ok(v)
        }
    }

    pub fn attr_f32s(self, info: *const OrtKernelInfo, name: &CStr) -> OrtResult<Vec<f32>> {
        let mut size = 0usize;
        // SAFETY: size query, then a read into a buffer of that size.
        unsafe {
            self.check((self.0.KernelInfoGetAttributeArray_float)(
                info,
                name.as_ptr(),
                std::ptr::null_mut(),
                &mut size,
            ))?;
            let mut v = vec![0f32; size];
            self.check((self.0.KernelInfoGetAttributeArray_float)(info, name.as_ptr(), v.as_mut_ptr(), &mut size))?;
            Ok(v)
        }
    }

    /// The node's inputs that are constant initializers, as a bit mask (inputs past 63 and
    /// any input ORT cannot answer for count as not constant).
    pub fn constant_inputs(self, info: *const OrtKernelInfo) -> u64 {
        let mut count = 0usize;
        // SAFETY: a valid info; out-pointers to locals. The constant's OrtValue stays ORT's.
        unsafe {
            if self.check((self.0.KernelInfo_GetInputCount)(info, &mut count)).is_err() {
                return 0;
            }
            (0..count.min(64)).fold(0, |mask, i| {
                let (mut is_constant, mut value) = (0, std::ptr::null());
                let known =
                    self.check((self.0.KernelInfoGetConstantInput_tensor)(info, i, &mut is_constant, &mut value));
                if known.is_ok() && is_constant != 0 { mask | 1 << i } else { mask }
            })
        }
    }

    pub fn node_name(self, info: *const OrtKernelInfo) -> String {
        let mut size = 0usize;
        // SAFETY: size query, then a read into a buffer of that size.
        unsafe {
            if self.check((self.0.KernelInfo_GetNodeName)(info, std::ptr::null_mut(), &mut size)).is_err() {
                return String::new();
            }
            let mut buf = vec![0u8; size.max(1)];
            if self.check((self.0.KernelInfo_GetNodeName)(info, buf.as_mut_ptr().cast::<c_char>(), &mut size)).is_err()
            {
                return String::new();
            }
            CStr::from_bytes_until_nul(&buf).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
        }
    }

    /// Element type and dimensions of a type-and-shape info (released here when `owned`).
    pub fn type_and_shape(
        self,
        info: *mut OrtTensorTypeAndShapeInfo,
        owned: bool,
    ) -> OrtResult<(ONNXTensorElementDataType, Vec<i64>)> {
        let mut dims = Vec::new();
        self.type_and_shape_into(info, owned, &mut dims).map(|ty| (ty, dims))
    }

    /// [`Api::type_and_shape`] with the dims appended to `dims`.
    fn type_and_shape_into(
        self,
        info: *mut OrtTensorTypeAndShapeInfo,
        owned: bool,
        dims: &mut Vec<i64>,
    ) -> OrtResult<ONNXTensorElementDataType> {
        // SAFETY: a valid info from ORT.
        let result = unsafe {
            let mut ty = ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
            let mut n = 0usize;
            self.check((self.0.GetTensorElementType)(info, &mut ty)).and_then(|()| {
                self.check((self.0.GetDimensionsCount)(info, &mut n))?;
                let start = dims.len();
                dims.resize(start + n, 0);
                self.check((self.0.GetDimensions)(info, dims[start..].as_mut_ptr(), n))?;
                Ok(ty)
            })
        };
        if owned {
            // SAFETY: we own it.
            unsafe { (self.0.ReleaseTensorTypeAndShapeInfo)(info) };
        }
        result
    }

    /// The symbolic names of an info's `n` dimensions ("" where a dimension has none).
    pub fn symbolic_dims(self, info: *const OrtTensorTypeAndShapeInfo, n: usize) -> Vec<String> {
        let mut names: Vec<*const c_char> = vec![std::ptr::null(); n];
        // SAFETY: a valid info; ORT fills n pointers to strings it owns.
        if self.check(unsafe { (self.0.GetSymbolicDimensions)(info, names.as_mut_ptr(), n) }).is_err() {
            return vec![String::new(); n];
        }
        names
            .into_iter()
            // SAFETY: null or a NUL-terminated string owned by the info.
            .map(
                |p| {
                    if p.is_null() {
                        String::new()
                    } else {
                        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                    }
                },
            )
            .collect()
    }

    /// A tensor value's element type, its dims appended to `dims` (no allocation once `dims`
    /// has room).
    pub fn value_type_and_shape_into(
        self,
        value: *const OrtValue,
        dims: &mut Vec<i64>,
    ) -> OrtResult<ONNXTensorElementDataType> {
        if self.1 {
            let mut ty = ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
            let (mut shape, mut n) = (std::ptr::null(), 0usize);
            // SAFETY: a valid tensor value; the table has the field (checked at registration);
            // the dims stay valid while the value lives, and are copied at once.
            unsafe {
                self.check((self.0.GetTensorElementTypeAndShapeDataReference)(value, &mut ty, &mut shape, &mut n))?;
                if n > 0 {
                    dims.extend_from_slice(std::slice::from_raw_parts(shape, n));
                }
            }
            return Ok(ty);
        }
        let mut info = std::ptr::null_mut();
        // SAFETY: a valid value from ORT; the info is ours.
        self.check(unsafe { (self.0.GetTensorTypeAndShape)(value, &mut info) })?;
        self.type_and_shape_into(info, true, dims)
    }

    pub fn mutable_data(self, value: *mut OrtValue) -> OrtResult<*mut c_void> {
        let mut data = std::ptr::null_mut();
        // SAFETY: a valid tensor value.
        self.check(unsafe { (self.0.GetTensorMutableData)(value, &mut data) })?;
        Ok(data)
    }

    /// The device id of the memory a value lives in.
    pub fn device_id(self, value: *const OrtValue) -> OrtResult<i32> {
        let mut info = std::ptr::null();
        let mut id = 0;
        // SAFETY: a valid value; the memory info is owned by the value.
        unsafe {
            self.check((self.0.GetTensorMemoryInfo)(value, &mut info))?;
            self.check((self.0.MemoryInfoGetId)(info, &mut id))?;
        }
        Ok(id)
    }
}

impl Api {
    /// An attribute of the node under shape inference, read as `ty`; `None` when absent or of
    /// another type.
    fn op_attr_raw(
        self,
        ctx: *const OrtShapeInferContext,
        name: &CStr,
        ty: OrtOpAttrType,
        elem: usize,
    ) -> Option<Vec<u8>> {
        let mut attr = std::ptr::null();
        // SAFETY: a valid context; the attribute is owned by it.
        unsafe {
            self.check((self.0.ShapeInferContext_GetAttribute)(ctx, name.as_ptr(), &mut attr)).ok()?;
            if attr.is_null() {
                return None;
            }
            let mut size = 0usize;
            // A size query fails for a wrong type (and for an empty buffer with data).
            let _ = self.check((self.0.ReadOpAttr)(attr, ty, std::ptr::null_mut(), 0, &mut size));
            let mut buf = vec![0u8; size.max(elem)];
            self.check((self.0.ReadOpAttr)(attr, ty, buf.as_mut_ptr().cast(), buf.len(), &mut size)).ok()?;
            buf.truncate(size);
            Some(buf)
        }
    }

    /// A string attribute under shape inference.
    pub fn infer_attr_string(self, ctx: *const OrtShapeInferContext, name: &CStr) -> Option<String> {
        let bytes = self.op_attr_raw(ctx, name, OrtOpAttrType::ORT_OP_ATTR_STRING, 1)?;
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        Some(String::from_utf8_lossy(&bytes[..end]).into_owned())
    }

    /// An attribute of any numeric or string type under shape inference.
    pub fn infer_attr_any(self, ctx: *const OrtShapeInferContext, name: &CStr) -> Option<crate::registry::AttrValue> {
        use crate::registry::AttrValue;
        if let Some(b) = self.op_attr_raw(ctx, name, OrtOpAttrType::ORT_OP_ATTR_INT, 8) {
            return Some(AttrValue::Int(i64::from_ne_bytes(b.get(..8)?.try_into().ok()?)));
        }
        if let Some(b) = self.op_attr_raw(ctx, name, OrtOpAttrType::ORT_OP_ATTR_FLOAT, 4) {
            return Some(AttrValue::Float(f32::from_ne_bytes(b.get(..4)?.try_into().ok()?) as f64));
        }
        if let Some(s) = self.infer_attr_string(ctx, name) {
            return Some(AttrValue::String(s));
        }
        if let Some(b) = self.op_attr_raw(ctx, name, OrtOpAttrType::ORT_OP_ATTR_INTS, 0) {
            return Some(AttrValue::Ints(
                b.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap_or_default())).collect(),
            ));
        }
        let b = self.op_attr_raw(ctx, name, OrtOpAttrType::ORT_OP_ATTR_FLOATS, 0)?;
        Some(AttrValue::Floats(
            b.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap_or_default()) as f64).collect(),
        ))
    }

    /// Sets output `index` of the node under shape inference; dimensions < 0 become symbolic
    /// (named by `symbol(axis)`) so ORT does not take them as fixed sizes.
    pub fn set_output(
        self,
        ctx: *mut OrtShapeInferContext,
        index: usize,
        elem: ONNXTensorElementDataType,
        dims: &[i64],
        symbol: impl Fn(usize) -> String,
    ) -> OrtResult<()> {
        let names: Vec<CString> = (0..dims.len())
            .map(|a| CString::new(if dims[a] < 0 { symbol(a) } else { String::new() }).unwrap_or_default())
            .collect();
        let mut name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
        let mut info = std::ptr::null_mut();
        // SAFETY: we create, fill, hand over (ORT copies) and release the info.
        unsafe {
            self.check((self.0.CreateTensorTypeAndShapeInfo)(&mut info))?;
            let result = self
                .check((self.0.SetTensorElementType)(info, elem))
                .and_then(|()| self.check((self.0.SetDimensions)(info, dims.as_ptr(), dims.len())))
                .and_then(|()| {
                    self.check((self.0.SetSymbolicDimensions)(info, name_ptrs.as_mut_ptr(), name_ptrs.len()))
                })
                .and_then(|()| self.check((self.0.ShapeInferContext_SetOutputTypeShape)(ctx, index, info)));
            (self.0.ReleaseTensorTypeAndShapeInfo)(info);
            result
        }
    }
}
