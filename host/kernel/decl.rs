//! The declaration of an op: one `static` per op (in its family's `op.rs`) from which the
//! registry entry, the C ABI name, the ONNX Runtime custom op (schema, types per execution
//! provider, attributes) and the tables of `docs/ops.md` are all derived, so none of them can
//! disagree with another.

use std::ffi::CStr;
use std::fmt::Write;

use super::{InferArgs, KernelArgs, TensorSpec};
use crate::dlpack::{DEVICE_MASK_CPU, DEVICE_MASK_CUDA};
use crate::dtype::DType;
use crate::error::Result;

/// Everything about one op.
pub struct OpDecl {
    /// The registry name, which is also the name C callers use (`dlkern_call`) and
    /// `DLPackKernel`'s `function_name`.
    pub name: &'static str,
    pub inputs: &'static [TensorDecl],
    pub outputs: &'static [TensorDecl],
    pub attrs: &'static [AttrDecl],
    /// Accepted tensor devices: [`DEVICE_MASK_CPU`] | [`DEVICE_MASK_CUDA`].
    pub devices: u32,
    pub compute: fn(&KernelArgs) -> Result<()>,
    pub infer: fn(&InferArgs) -> Result<Vec<TensorSpec>>,
    /// The typed ONNX Runtime op in domain `dlkern` that runs this kernel, if there is one
    /// (every registry kernel is reachable from ORT through `DLPackKernel` anyway).
    pub ort: Option<OrtDecl>,
}

/// A typed ONNX Runtime custom op: its name and the element types `T` it serves on each
/// execution provider (one `OrtCustomOp` per provider and `T`).
pub struct OrtDecl {
    pub name: &'static CStr,
    pub cuda: &'static [DType],
    pub cpu: &'static [DType],
}

/// One input or output.
pub struct TensorDecl {
    pub name: &'static str,
    pub ty: TensorType,
    /// An optional input may be absent (ORT: an empty name; the registry: a 0-element tensor).
    pub optional: bool,
    /// The shape, as the docs show it (`[..., K]`).
    pub shape: &'static str,
}

/// The element type of an input or output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    /// The op's element type `T`.
    T,
    /// Always this type.
    Fixed(DType),
    /// Several types, checked by the kernel; the text says which (for the docs).
    Any(&'static str),
    /// Always this type, and in host memory on every execution provider (ONNX Runtime hands
    /// it over as a CPU input even on CUDA): a scalar the kernel needs before it launches.
    Host(DType),
}

/// One attribute.
pub struct AttrDecl {
    pub name: &'static CStr,
    pub kind: AttrKind,
    /// What it means, for the docs (may be empty).
    pub doc: &'static str,
}

/// An attribute's type and what happens when a node leaves it out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AttrKind {
    /// A float, finite and >= 0, with this default.
    Float { default: f32 },
    /// An int the node must set.
    Int,
    /// An int the kernel defaults when absent; the text says to what.
    OptionalInt { default: &'static str },
    /// A string the kernel defaults when absent; the text says to what.
    OptionalString { default: &'static str },
}

impl OpDecl {
    /// The number of outputs when it is fixed (no optional outputs).
    pub fn fixed_outputs(&self) -> Option<usize> {
        (!self.outputs.iter().any(|o| o.optional)).then_some(self.outputs.len())
    }

    /// The op's schema as Markdown tables: the typed ORT op's (when it has one), else the
    /// registry kernel's. `docs/ops.md` holds exactly this between its `dlkern-schema` markers
    /// (a test checks it).
    pub fn schema_markdown(&self) -> String {
        let mut md = String::new();
        md.push_str("| | name | type | shape |\n| --- | --- | --- | --- |\n");
        for (what, list) in [("input", self.inputs), ("output", self.outputs)] {
            for t in list {
                let role = if t.optional { format!("{what} (optional)") } else { what.to_string() };
                let ty = match t.ty {
                    TensorType::T => "T".to_string(),
                    TensorType::Fixed(d) => onnx_type_name(d).to_string(),
                    TensorType::Any(text) => text.to_string(),
                    TensorType::Host(d) => format!("{} (host memory)", onnx_type_name(d)),
                };
                let _ = writeln!(md, "| {role} | `{}` | {ty} | {} |", t.name, t.shape);
            }
        }
        for a in self.attrs {
            let (ty, default) = match a.kind {
                AttrKind::Float { default } => ("float", format!("default `{default:?}`")),
                AttrKind::Int => ("int", "required".to_string()),
                AttrKind::OptionalInt { default } => ("int", format!("default {default}")),
                AttrKind::OptionalString { default } => ("string", format!("default {default}")),
            };
            let doc = if a.doc.is_empty() { String::new() } else { format!(": {}", a.doc) };
            let _ = writeln!(md, "| attribute | `{}` | {ty} | {default}{doc} |", a.name.to_string_lossy());
        }
        md.push('\n');
        let types = |list: &[DType]| list.iter().map(|&d| format!("`{}`", onnx_type_name(d))).collect::<Vec<_>>();
        let devices = [(DEVICE_MASK_CUDA, "CUDA"), (DEVICE_MASK_CPU, "CPU")]
            .iter()
            .filter(|(bit, _)| self.devices & bit != 0)
            .map(|(_, name)| *name)
            .collect::<Vec<_>>()
            .join(" and ");
        match &self.ort {
            Some(ort) => {
                let mut eps = Vec::new();
                if !ort.cuda.is_empty() {
                    eps.push(format!("CUDA execution provider {}", types(ort.cuda).join(", ")));
                }
                if !ort.cpu.is_empty() {
                    eps.push(format!("CPU execution provider {}", types(ort.cpu).join(", ")));
                }
                let _ =
                    writeln!(md, "ORT op `{}` (domain `dlkern`). T: {}.", ort.name.to_string_lossy(), eps.join("; "));
                let _ = writeln!(md, "Registry kernel: `{}` ({devices} tensors).", self.name);
            }
            None => {
                let _ = writeln!(
                    md,
                    "No typed ORT op: `{}` runs through `DLPackKernel`, the C ABI or Rust ({devices} tensors).",
                    self.name
                );
            }
        }
        md
    }
}

/// ONNX's name of an element type, as ORT's schemas write it.
pub fn onnx_type_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I32 => "int32",
        DType::I64 => "int64",
    }
}
