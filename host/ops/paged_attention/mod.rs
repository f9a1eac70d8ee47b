//! Attention over a paged KV cache (ONNX Runtime's `PagedAttention` layout), and the cache
//! write: the kernels from Rust, and `dlkern.paged_attention` (ORT op `PagedAttention`, [`op`]).
//!
//! One folder per family: `op.rs` declares the op(s) and their registry kernels, `launch.rs`
//! validates and launches, `reference.rs` is the CPU oracle; the
//! device code is `kernels-gpu/src/paged_attention`.

/// The tile shapes and argument structs shared with the kernels: the device crate's own
/// source, compiled here too, so a launch cannot disagree with its kernel (the host uses only
/// part of it).
#[allow(dead_code)]
#[path = "../../../kernels-gpu/src/paged_attention/layout.rs"]
pub(crate) mod layout;

pub mod launch;
pub mod op;
pub mod reference;
