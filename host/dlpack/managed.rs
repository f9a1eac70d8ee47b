//! Owned DLPack tensors: both exchange structs, released through their deleter exactly once.

use super::{DLManagedTensor, DLManagedTensorVersioned, DLTensor, TensorView};
use crate::error::{Error, Result};

/// The DLPack major version whose `DLManagedTensorVersioned` layout dlkern reads.
pub const SUPPORTED_MAJOR_VERSION: u32 = dlpark::ffi::DLPACK_MAJOR_VERSION;

enum Inner {
    Legacy(*mut DLManagedTensor),
    Versioned(*mut DLManagedTensorVersioned),
}

/// A DLPack tensor handed over by a producer (PyTorch's `to_dlpack`, `__dlpack__`, CuPy, ...).
/// Dropping it calls the producer's deleter.
pub struct ManagedTensor {
    inner: Inner,
}

// SAFETY: DLPack tensors may be released from any thread (the deleter contract has no thread
// affinity); the struct only carries the producer's pointer.
unsafe impl Send for ManagedTensor {}

impl ManagedTensor {
    /// Takes ownership of a legacy `DLManagedTensor` (DLPack < 0.8, `"dltensor"` capsules).
    ///
    /// # Safety
    /// `tensor` must be a valid `DLManagedTensor` that nothing else will release.
    pub unsafe fn from_legacy(tensor: *mut DLManagedTensor) -> Result<Self> {
        if tensor.is_null() {
            return Err(Error::InvalidTensor { name: "managed tensor".into(), message: "null DLManagedTensor".into() });
        }
        Ok(ManagedTensor { inner: Inner::Legacy(tensor) })
    }

    /// Takes ownership of a `DLManagedTensorVersioned` (`"dltensor_versioned"` capsules). A
    /// different major version has another layout: it is released at once and refused.
    ///
    /// # Safety
    /// `tensor` must be a valid `DLManagedTensorVersioned` that nothing else will release.
    pub unsafe fn from_versioned(tensor: *mut DLManagedTensorVersioned) -> Result<Self> {
        // SAFETY: the caller guarantees validity; `version` and `deleter` are ABI-stable fields.
        let Some(t) = (unsafe { tensor.as_ref() }) else {
            return Err(Error::InvalidTensor {
                name: "managed tensor".into(),
                message: "null DLManagedTensorVersioned".into(),
            });
        };
        if t.version.major != SUPPORTED_MAJOR_VERSION {
            let major = t.version.major;
            if let Some(deleter) = t.deleter {
                // SAFETY: the DLPack spec makes calling the deleter safe across major versions.
                unsafe { deleter(tensor) };
            }
            return Err(Error::InvalidTensor {
                name: "managed tensor".into(),
                message: format!("DLPack major version {major}, dlkern reads {SUPPORTED_MAJOR_VERSION}"),
            });
        }
        Ok(ManagedTensor { inner: Inner::Versioned(tensor) })
    }

    /// The `DLTensor` inside.
    pub fn dl_tensor(&self) -> *const DLTensor {
        // SAFETY: the pointers were validated at construction and are owned by self.
        unsafe {
            match self.inner {
                Inner::Legacy(t) => &raw const (*t).dl_tensor,
                Inner::Versioned(t) => &raw const (*t).dl_tensor,
            }
        }
    }

    /// Whether the producer marked the data read-only (versioned tensors only).
    pub fn is_read_only(&self) -> bool {
        match self.inner {
            Inner::Legacy(_) => false,
            // SAFETY: valid for self's lifetime.
            Inner::Versioned(t) => unsafe { (*t).flags.contains(dlpark::DlpackFlags::READ_ONLY) },
        }
    }

    /// Gives up ownership of a versioned tensor without releasing it: the pointer for a
    /// consumer that takes it over (a framework's `managed_tensor_to_py_object_no_sync`).
    /// `None` (and the tensor released as usual) for a legacy one.
    pub fn into_versioned_raw(self) -> Option<*mut DLManagedTensorVersioned> {
        match self.inner {
            Inner::Versioned(t) => {
                std::mem::forget(self);
                Some(t)
            }
            Inner::Legacy(_) => None,
        }
    }

    /// A validated view named `name`.
    pub fn view<'a>(&'a self, name: &'a str) -> Result<TensorView<'a>> {
        // SAFETY: the producer keeps shape/strides alive until the deleter runs (at drop).
        unsafe { TensorView::from_raw(name, self.dl_tensor()) }
    }
}

impl Drop for ManagedTensor {
    fn drop(&mut self) {
        // SAFETY: owned since construction; each deleter runs exactly once, here.
        unsafe {
            match self.inner {
                Inner::Legacy(t) => {
                    if let Some(deleter) = (*t).deleter {
                        deleter(t)
                    }
                }
                Inner::Versioned(t) => {
                    if let Some(deleter) = (*t).deleter {
                        deleter(t)
                    }
                }
            }
        }
    }
}
