//! What a kernel is, below every way of calling one: the arguments of a call
//! ([`KernelArgs`]), of an output inference ([`InferArgs`]), attributes, the call site a caller
//! may keep, and the declaration of an op ([`OpDecl`]) from which the registry, the ONNX
//! Runtime adapter and `docs/ops.md` are all derived.
//!
//! This module knows no kernel family, no registry and no adapter: `ops/*` build on it, and the
//! registry, the C ABI and the ORT adapter build on `ops/*`.

mod attributes;
mod decl;

use std::any::Any;
use std::ffi::c_void;
use std::ops::RangeInclusive;
use std::sync::{Mutex, MutexGuard};

pub use attributes::{AttrValue, Attributes};
pub use decl::{AttrDecl, AttrKind, OpDecl, OrtDecl, TensorDecl, TensorType, onnx_type_name};

use crate::dlpack::{DLTensor, TensorView};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A CUDA stream handle as C sees it (`CUstream`/`cudaStream_t`); null is the legacy default
/// stream. Ignored by CPU kernels.
pub type StreamHandle = *mut c_void;

/// The arguments of one call: tensors (inputs, then outputs), the stream and the attributes.
pub struct KernelArgs<'a> {
    /// The name the kernel was called by (one function may serve several names).
    pub function_name: &'a str,
    tensors: &'a [DLTensor],
    num_inputs: usize,
    /// CUDA stream to launch on (for CUDA tensors).
    pub stream: StreamHandle,
    pub attrs: &'a Attributes,
    /// The call site, when the caller keeps one across calls (`registry::call_at`; ONNX Runtime's nodes).
    pub site: Option<&'a CallSite>,
}

/// What a caller that calls one kernel again and again from the same place (an ONNX node)
/// tells it, and lets it keep: which inputs stay the same for the site's whole life (the node's
/// initializers), and one slot for what the kernel derives from them (a repacked weight), freed
/// with the site. Kernels must check that what they cached still belongs to the inputs they get.
#[derive(Default)]
pub struct CallSite {
    constant_inputs: u64,
    cache: Mutex<Option<Box<dyn Any + Send + Sync>>>,
}

impl CallSite {
    /// A site whose inputs `i` with bit `i` set in `constant_inputs` never change (same address,
    /// same contents) while it lives.
    pub fn new(constant_inputs: u64) -> Self {
        CallSite { constant_inputs, cache: Mutex::new(None) }
    }

    /// Whether input `i` is the same tensor, with the same contents, on every call.
    pub fn is_constant(&self, i: usize) -> bool {
        i < 64 && self.constant_inputs & (1 << i) != 0
    }

    /// Whether every input in `inputs` is constant at this site.
    pub fn are_constant(&self, inputs: &[usize]) -> bool {
        inputs.iter().all(|&i| self.is_constant(i))
    }

    /// The kernel's slot (a poisoned lock is taken over: a slot is replaced whole, never left
    /// half written).
    pub fn cache(&self) -> MutexGuard<'_, Option<Box<dyn Any + Send + Sync>>> {
        self.cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<'a> KernelArgs<'a> {
    /// The arguments of one call: `tensors` holds the inputs, then the outputs.
    pub(crate) fn new(
        function_name: &'a str,
        tensors: &'a [DLTensor],
        num_inputs: usize,
        stream: StreamHandle,
        attrs: &'a Attributes,
        site: Option<&'a CallSite>,
    ) -> Self {
        KernelArgs { function_name, tensors, num_inputs, stream, attrs, site }
    }
    pub fn num_inputs(&self) -> usize {
        self.num_inputs
    }
    pub fn num_outputs(&self) -> usize {
        self.tensors.len() - self.num_inputs
    }
    /// Errors unless the call has exactly these counts.
    pub fn expect_counts(&self, inputs: usize, outputs: usize) -> Result<()> {
        self.expect_count_ranges(inputs..=inputs, outputs..=outputs)
    }
    /// Errors unless the input and output counts lie in these ranges (optional trailing
    /// inputs, optional outputs).
    pub fn expect_count_ranges(&self, inputs: RangeInclusive<usize>, outputs: RangeInclusive<usize>) -> Result<()> {
        if inputs.contains(&self.num_inputs()) && outputs.contains(&self.num_outputs()) {
            return Ok(());
        }
        let show = |r: &RangeInclusive<usize>| {
            if r.start() == r.end() { r.start().to_string() } else { format!("{} to {}", r.start(), r.end()) }
        };
        Err(Error::KernelFailed {
            name: self.function_name.to_string(),
            message: format!(
                "called with {} inputs and {} outputs (expected {} and {})",
                self.num_inputs(),
                self.num_outputs(),
                show(&inputs),
                show(&outputs)
            ),
        })
    }
    /// Input `i`, validated, named `name` in errors.
    pub fn input(&self, i: usize, name: &'a str) -> Result<TensorView<'a>> {
        let t = self.tensors[..self.num_inputs].get(i).ok_or_else(|| self.missing("input", i))?;
        // SAFETY: the registry's callers guarantee the DLTensors' shape/stride arrays are valid.
        unsafe { TensorView::from_raw(name, t) }
    }
    /// Output `i`, validated, named `name` in errors.
    pub fn output(&self, i: usize, name: &'a str) -> Result<TensorView<'a>> {
        let t = self.tensors[self.num_inputs..].get(i).ok_or_else(|| self.missing("output", i))?;
        // SAFETY: as `input`.
        unsafe { TensorView::from_raw(name, t) }
    }
    fn missing(&self, what: &str, i: usize) -> Error {
        Error::KernelFailed { name: self.function_name.to_string(), message: format!("no {what} {i}") }
    }
}

/// The dtype and shape of one output, as inference reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub dtype: DType,
    pub shape: Vec<i64>,
}

/// The arguments of an output inference: inputs' dtype/shape/device (data may be absent).
pub struct InferArgs<'a> {
    pub function_name: &'a str,
    pub inputs: &'a [TensorView<'a>],
    pub num_outputs: usize,
    pub attrs: &'a Attributes,
}
