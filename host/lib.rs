//! dlkern: CUDA kernels for LLM inference, written in Rust and compiled to PTX without nvcc.
//!
//! The crate is layered the way cudarc is:
//! - [`runtime`]: the CUDA driver (loaded at run time), devices on their primary context, and
//!   the embedded PTX modules loaded once per device.
//! - [`launch`]: typed launchers. Each validates shapes, strides, alignment and the launch
//!   budget, then makes exactly one unsafe launch on a caller-given stream. Every kernel has a
//!   raw-pointer entry (for DLPack, ONNX Runtime and PyTorch memory) and a safe entry over
//!   cudarc's `CudaSlice`.
//! - [`reference`](mod@reference): CPU reference implementations in f64, the oracle of every GPU test.
//!
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
//! dlkern::launch::rmsnorm::rmsnorm(&device, &stream, &x, &w, &mut y, rows, cols, 1e-6)?;
//! let y = stream.clone_dtoh(&y)?;
//! # Ok(()) }
//! ```

pub mod capi;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod launch;
pub mod ort;
pub mod quant;
pub mod reference;
pub mod registry;
pub mod runtime;

pub use dtype::{DType, Element};
pub use error::{Error, Result};
