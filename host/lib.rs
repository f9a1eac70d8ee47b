//! dlkern: CUDA kernels for LLM inference, written in Rust and compiled to PTX without nvcc.
//!
//! The crate is layered (top to bottom; a layer imports only the layers below it):
//! - [`ort`] and [`capi`]: the adapters, ONNX Runtime's custom-op library and the C ABI;
//! - [`registry`]: kernels by name, dlkern's own (from [`ops::declarations`]) and users';
//! - [`ops`]: one folder per kernel family: its op declarations, planner, launchers (validate
//!   everything, then one unsafe launch on a caller-given stream; a raw-pointer entry for
//!   DLPack, ONNX Runtime and PyTorch memory and a safe one over cudarc's `CudaSlice`), CPU
//!   reference (f64, the oracle of every GPU test) and weight packing;
//! - [`kernel`] (what a call of a kernel is: arguments, attributes, the op declaration type),
//!   [`runtime`] (the CUDA driver, loaded at run time; devices on their primary context; the
//!   embedded PTX modules, loaded once per device), [`dlpack`] (validated tensor views).
//!
//! `docs/architecture.md` draws the tree and lists the files a new op touches.
//! Device code lives in the `kernels-gpu/` crate; `build.rs` compiles it to PTX.
//!
//! ```no_run
//! use dlkern::runtime::Device;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Device::get(0)?; // Err (never a panic) without a driver or GPU
//! let stream = device.context().default_stream();
//! let (rows, cols) = (4, 4096);
//! let x = stream.clone_htod(&vec![half::f16::from_f32(0.5); rows * cols])?;
//! let w = stream.clone_htod(&vec![half::f16::ONE; cols])?;
//! let mut y = stream.alloc_zeros::<half::f16>(rows * cols)?;
//! dlkern::ops::rmsnorm::launch::rmsnorm(&device, &stream, &x, &w, &mut y, rows, cols, 1e-6)?;
//! let y = stream.clone_dtoh(&y)?;
//! # Ok(()) }
//! ```

pub mod capi;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod kernel;
pub mod ops;
pub mod ort;
pub mod registry;
pub mod runtime;

pub use dtype::{DType, Element};
pub use error::{Error, Result};
