//! DLPack: the C types (from `dlpark`, which asserts their layout against dlpack.h), safe
//! validated views over a borrowed `DLTensor`, and owned managed tensors (legacy
//! `DLManagedTensor` and `DLManagedTensorVersioned`).
//!
//! A [`TensorView`] is made once per tensor per call and checks everything a kernel relies on:
//! non-null shape and (for non-empty tensors) data, non-negative dimensions, a supported dtype
//! with one lane, a supported device, non-negative strides, and the data pointer (after
//! `byte_offset`) aligned to the element size. Errors name the tensor.

mod managed;

pub use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DLPackExchangeAPI,
    DLPackExchangeAPIHeader, DLPackVersion, DLTensor,
};
pub use managed::{ManagedTensor, SUPPORTED_MAJOR_VERSION};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The most dimensions a view accepts (DLPack has no limit; kernels need at most a handful and
/// a bound protects against garbage `ndim`).
pub const MAX_NDIM: usize = 16;

/// Where a tensor's memory lives, among the DLPack device types dlkern accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// Host memory (`kDLCPU`, or pinned `kDLCUDAHost`).
    Cpu,
    /// CUDA device memory (`kDLCUDA`, or `kDLCUDAManaged`) on the given ordinal.
    Cuda(i32),
}

impl DeviceKind {
    /// The kind of a DLPack device, `None` for a device type dlkern does not take.
    pub fn of_dl(device: DLDevice) -> Option<DeviceKind> {
        match device.device_type {
            DLDeviceType::CPU | DLDeviceType::CUDAHOST => Some(DeviceKind::Cpu),
            DLDeviceType::CUDA | DLDeviceType::CUDAMANAGED => Some(DeviceKind::Cuda(device.device_id)),
            _ => None,
        }
    }

    /// The DLPack device of this kind.
    pub fn to_dl(self) -> DLDevice {
        match self {
            DeviceKind::Cpu => DLDevice { device_type: DLDeviceType::CPU, device_id: 0 },
            DeviceKind::Cuda(id) => DLDevice { device_type: DLDeviceType::CUDA, device_id: id },
        }
    }

    /// Bit of this kind in a device mask (see [`DEVICE_MASK_CPU`], [`DEVICE_MASK_CUDA`]).
    pub fn mask_bit(self) -> u32 {
        match self {
            DeviceKind::Cpu => DEVICE_MASK_CPU,
            DeviceKind::Cuda(_) => DEVICE_MASK_CUDA,
        }
    }
}

/// Device-mask bit for CPU memory (`1 << kDLCPU`).
pub const DEVICE_MASK_CPU: u32 = 1 << 1;
/// Device-mask bit for CUDA memory (`1 << kDLCUDA`).
pub const DEVICE_MASK_CUDA: u32 = 1 << 2;

/// The dlkern dtype of a DLPack dtype, if supported.
pub fn dtype_from_dl(dt: DLDataType) -> Option<DType> {
    if dt.lanes != 1 {
        return None;
    }
    Some(match (dt.code, dt.bits) {
        (DLDataTypeCode::FLOAT, 32) => DType::F32,
        (DLDataTypeCode::FLOAT, 16) => DType::F16,
        (DLDataTypeCode::BFLOAT, 16) => DType::BF16,
        (DLDataTypeCode::INT, 8) => DType::I8,
        (DLDataTypeCode::UINT, 8) => DType::U8,
        (DLDataTypeCode::INT, 32) => DType::I32,
        (DLDataTypeCode::INT, 64) => DType::I64,
        _ => return None,
    })
}

/// The DLPack dtype of a dlkern dtype.
pub fn dtype_to_dl(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::F32 => (DLDataTypeCode::FLOAT, 32),
        DType::F16 => (DLDataTypeCode::FLOAT, 16),
        DType::BF16 => (DLDataTypeCode::BFLOAT, 16),
        DType::I8 => (DLDataTypeCode::INT, 8),
        DType::U8 => (DLDataTypeCode::UINT, 8),
        DType::I32 => (DLDataTypeCode::INT, 32),
        DType::I64 => (DLDataTypeCode::INT, 64),
    };
    DLDataType { code, bits, lanes: 1 }
}

fn describe_dl_dtype(dt: DLDataType) -> String {
    format!("DLDataType {{ code: {}, bits: {}, lanes: {} }}", dt.code.0, dt.bits, dt.lanes)
}

/// A validated, borrowed view of a `DLTensor`.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    name: &'a str,
    raw: &'a DLTensor,
    dtype: DType,
    device: DeviceKind,
    shape: &'a [i64],
    strides: Option<&'a [i64]>,
    elements: usize,
}

impl<'a> TensorView<'a> {
    /// Validates `tensor` (see the module docs); `name` appears in every error.
    ///
    /// # Safety
    /// `tensor` must be null or point to a `DLTensor` whose `shape` and `strides` (when non-null)
    /// point to `ndim` readable `i64`s, all valid for `'a`. The data pointer is not read.
    pub unsafe fn from_raw(name: &'a str, tensor: *const DLTensor) -> Result<Self> {
        // SAFETY: forwarded contract.
        unsafe { Self::validate(name, tensor, true) }
    }

    /// As [`TensorView::from_raw`] but for shape/dtype/device only (output-shape inference):
    /// the data pointer may be null or unaligned.
    ///
    /// # Safety
    /// As [`TensorView::from_raw`].
    pub unsafe fn metadata_only(name: &'a str, tensor: *const DLTensor) -> Result<Self> {
        // SAFETY: forwarded contract.
        unsafe { Self::validate(name, tensor, false) }
    }

    unsafe fn validate(name: &'a str, tensor: *const DLTensor, check_data: bool) -> Result<Self> {
        let invalid = |message: String| Error::InvalidTensor { name: name.to_string(), message };
        // SAFETY: the caller guarantees a valid pointer or null.
        let raw = unsafe { tensor.as_ref() }.ok_or_else(|| invalid("the DLTensor pointer is null".into()))?;
        let ndim = raw.ndim;
        if ndim < 0 || ndim as usize > MAX_NDIM {
            return Err(invalid(format!("ndim = {ndim} (expected 0..={MAX_NDIM})")));
        }
        let ndim = ndim as usize;
        let shape: &[i64] = if ndim == 0 {
            &[]
        } else if raw.shape.is_null() {
            return Err(invalid(format!("shape is a null pointer with ndim = {ndim}")));
        } else {
            // SAFETY: non-null, and the caller guarantees ndim readable elements.
            unsafe { std::slice::from_raw_parts(raw.shape, ndim) }
        };
        if let Some((axis, d)) = shape.iter().enumerate().find(|(_, d)| **d < 0) {
            return Err(invalid(format!("dimension {axis} is negative ({d})")));
        }
        let strides = if ndim == 0 || raw.strides.is_null() {
            None // contiguous (allowed before DLPack 1.2)
        } else {
            // SAFETY: non-null, and the caller guarantees ndim readable elements.
            Some(unsafe { std::slice::from_raw_parts(raw.strides, ndim) })
        };
        if let Some((axis, s)) = strides.and_then(|s| s.iter().enumerate().find(|(_, s)| **s < 0)) {
            return Err(invalid(format!("stride {axis} is negative ({s}); negative strides are not supported")));
        }
        let dtype = dtype_from_dl(raw.dtype).ok_or_else(|| {
            invalid(format!(
                "unsupported dtype {} (supported: f32, f16, bf16, i8, u8, i32, i64 with 1 lane)",
                describe_dl_dtype(raw.dtype)
            ))
        })?;
        let device = DeviceKind::of_dl(raw.device).ok_or_else(|| {
            invalid(format!(
                "unsupported device type {} (supported: kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged)",
                raw.device.device_type.0
            ))
        })?;
        let elements = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize))
            .filter(|n| n.checked_mul(dtype.size_bytes()).is_some())
            .ok_or_else(|| invalid(format!("shape {shape:?} overflows the address space")))?;
        if check_data && elements > 0 {
            if raw.data.is_null() {
                return Err(invalid(format!("data is a null pointer for a tensor of {elements} elements")));
            }
            let address = (raw.data as u64).wrapping_add(raw.byte_offset);
            if !address.is_multiple_of(dtype.size_bytes() as u64) {
                return Err(invalid(format!(
                    "data + byte_offset = {address:#x} is not aligned to its {}-byte {dtype} elements",
                    dtype.size_bytes()
                )));
            }
        }
        Ok(TensorView { name, raw, dtype, device, shape, strides, elements })
    }

    /// The tensor's name in error messages.
    pub fn name(&self) -> &str {
        self.name
    }
    /// The underlying DLPack struct.
    pub fn raw(&self) -> &'a DLTensor {
        self.raw
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn device(&self) -> DeviceKind {
        self.device
    }
    pub fn shape(&self) -> &'a [i64] {
        self.shape
    }
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements (product of the shape).
    pub fn len(&self) -> usize {
        self.elements
    }
    pub fn is_empty(&self) -> bool {
        self.elements == 0
    }
    /// Dimension `axis` (negative counts from the end, as in Python).
    pub fn dim(&self, axis: isize) -> Option<usize> {
        let axis = if axis < 0 { self.ndim() as isize + axis } else { axis };
        self.shape.get(usize::try_from(axis).ok()?).map(|&d| d as usize)
    }
    /// The address of the first element (`data + byte_offset`).
    pub fn data_address(&self) -> u64 {
        (self.raw.data as u64).wrapping_add(self.raw.byte_offset)
    }

    /// Strides in elements (the row-major ones when the tensor gave none).
    pub fn strides(&self) -> Vec<i64> {
        match self.strides {
            Some(s) => s.to_vec(),
            None => row_major_strides(self.shape),
        }
    }

    /// Whether the elements are laid out densely in row-major order. Size-1 dimensions may have
    /// any stride (PyTorch gives them arbitrary values).
    pub fn is_contiguous(&self) -> bool {
        let Some(strides) = self.strides else { return true };
        let mut expected = 1i64;
        for (&d, &s) in self.shape.iter().zip(strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    fn invalid(&self, message: String) -> Error {
        Error::InvalidTensor { name: self.name.to_string(), message }
    }

    /// Errors unless the dtype is one of `allowed`.
    pub fn expect_dtype(&self, allowed: &[DType]) -> Result<DType> {
        if allowed.contains(&self.dtype) {
            Ok(self.dtype)
        } else {
            let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
            Err(self.invalid(format!("dtype {} (expected {})", self.dtype, names.join(" or "))))
        }
    }

    /// Errors unless the dtype equals that of `other`.
    pub fn expect_same_dtype(&self, other: &TensorView) -> Result<()> {
        if self.dtype == other.dtype {
            Ok(())
        } else {
            Err(self.invalid(format!("dtype {} differs from {}'s {}", self.dtype, other.name, other.dtype)))
        }
    }

    /// Errors unless the rank is within `min..=max`.
    pub fn expect_rank(&self, min: usize, max: usize) -> Result<()> {
        if (min..=max).contains(&self.ndim()) {
            Ok(())
        } else if min == max {
            Err(self.invalid(format!("rank {} (expected {min}), shape {:?}", self.ndim(), self.shape)))
        } else {
            Err(self.invalid(format!("rank {} (expected {min} to {max}), shape {:?}", self.ndim(), self.shape)))
        }
    }

    /// Errors unless the shape equals `expected`.
    pub fn expect_shape(&self, expected: &[i64]) -> Result<()> {
        if self.shape == expected {
            Ok(())
        } else {
            Err(self.invalid(format!("shape {:?} (expected {expected:?})", self.shape)))
        }
    }

    /// Errors unless the tensor is on `device`.
    pub fn expect_device(&self, device: DeviceKind) -> Result<()> {
        if self.device == device {
            Ok(())
        } else {
            Err(self.invalid(format!("is on {:?}, expected {device:?}", self.device)))
        }
    }

    /// Errors unless the layout is dense row-major.
    pub fn expect_contiguous(&self) -> Result<()> {
        if self.is_contiguous() {
            Ok(())
        } else {
            Err(self.invalid(format!(
                "strides {:?} for shape {:?} are not row-major contiguous",
                self.strides(),
                self.shape
            )))
        }
    }

    /// The elements of a CPU tensor, typed.
    ///
    /// # Safety
    /// The data must be readable host memory for the tensor's extent, not written during `'a`.
    pub unsafe fn host_slice<T: crate::dtype::Scalar>(&self) -> Result<&'a [T]> {
        self.check_host_access::<T>()?;
        if self.elements == 0 {
            return Ok(&[]);
        }
        // SAFETY: checked dtype, device, contiguity and alignment; extent by the caller.
        Ok(unsafe { std::slice::from_raw_parts(self.data_address() as *const T, self.elements) })
    }

    /// The elements of a CPU tensor, typed and writable.
    ///
    /// # Safety
    /// The data must be writable host memory for the tensor's extent, not accessed by anything
    /// else during `'a`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn host_slice_mut<T: crate::dtype::Scalar>(&self) -> Result<&'a mut [T]> {
        self.check_host_access::<T>()?;
        if self.elements == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as host_slice, with exclusivity from the caller.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data_address() as *mut T, self.elements) })
    }

    fn check_host_access<T: crate::dtype::Scalar>(&self) -> Result<()> {
        if T::DTYPE != self.dtype {
            return Err(self.invalid(format!("dtype {} accessed as {}", self.dtype, T::DTYPE)));
        }
        self.expect_device(DeviceKind::Cpu)?;
        self.expect_contiguous()
    }
}

/// A dense row-major `DLTensor` (no strides, no offset) over `data` on `device`, with `shape`
/// borrowed: `shape` must outlive every use of the result.
pub fn dense_tensor(data: *mut std::ffi::c_void, device: DLDevice, dtype: DType, shape: &mut [i64]) -> DLTensor {
    DLTensor {
        data,
        device,
        ndim: shape.len() as i32,
        dtype: dtype_to_dl(dtype),
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

/// Row-major strides (elements) of `shape`.
pub fn row_major_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    strides
}
