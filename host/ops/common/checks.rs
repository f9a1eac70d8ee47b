//! What every launcher checks before its launch.
//!
//! Every launcher follows one shape: a parameter struct that validates everything checkable on
//! the host (dtype, shape, strides, alignment, overlap, launch limits) into a plan naming the
//! kernel variant and its launch dimensions, an `unsafe fn ..._raw` that takes device pointers
//! (what DLPack, ONNX Runtime and PyTorch hand over) and makes one launch, and a safe function
//! over cudarc `CudaSlice`s whose lengths prove the pointers valid.

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};

use crate::error::{Error, Result};
use crate::runtime::Device;

/// Checks that a device pointer is non-null and aligned to `align` bytes.
pub(crate) fn check_pointer(kernel: &'static str, name: &str, ptr: u64, align: u64) -> Result<()> {
    if ptr == 0 {
        return Err(Error::invalid(kernel, format!("{name} is a null pointer")));
    }
    if !ptr.is_multiple_of(align) {
        return Err(Error::invalid(kernel, format!("{name} at {ptr:#x} is not {align}-byte aligned")));
    }
    Ok(())
}

/// Whether the byte ranges `[a, a + a_len)` and `[b, b + b_len)` intersect.
pub(crate) fn overlaps(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a_len > 0 && b_len > 0 && a < b.saturating_add(b_len) && b < a.saturating_add(a_len)
}

/// Bytes spanned by `rows` rows of `cols` elements, `row_stride` elements apart.
pub(crate) fn span_bytes(rows: usize, cols: usize, row_stride: usize, elem_bytes: usize) -> Option<u64> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    let elements = (rows - 1).checked_mul(row_stride)?.checked_add(cols)?;
    (elements as u64).checked_mul(elem_bytes as u64)
}

/// Checks that a stream and a set of slices belong to `device`, so the raw launch that
/// follows runs in the right context.
pub fn check_same_device(kernel: &'static str, device: &Device, stream: &CudaStream) -> Result<()> {
    if stream.context().ordinal() != device.ordinal() {
        return Err(Error::invalid(
            kernel,
            format!(
                "stream is on device {}, kernel launched on device {}",
                stream.context().ordinal(),
                device.ordinal()
            ),
        ));
    }
    Ok(())
}

/// Checks that a slice lives on `device` and holds at least `needed` elements.
pub fn check_slice<T: DeviceRepr>(
    kernel: &'static str,
    name: &str,
    device: &Device,
    slice: &CudaSlice<T>,
    needed: usize,
) -> Result<()> {
    if slice.ordinal() != device.ordinal() {
        return Err(Error::invalid(
            kernel,
            format!("{name} is on device {}, kernel launched on device {}", slice.ordinal(), device.ordinal()),
        ));
    }
    if slice.len() < needed {
        return Err(Error::invalid(kernel, format!("{name} holds {} elements, needs {needed}", slice.len())));
    }
    Ok(())
}
