//! Attention (prefill) forward, flash-attention's interface: padded or packed batches, GQA, causal,
//! window, soft cap, the row log-sum-exp.
//!
//! One folder per family: `op.rs` declares the op(s) and their registry kernels, `launch.rs`
//! validates and launches, `reference.rs` is the CPU oracle; the
//! device code is `kernels-gpu/src/attention`.

/// The tile shapes and argument structs shared with the kernels: the device crate's own
/// source, compiled here too, so a launch cannot disagree with its kernel (the host uses only
/// part of it).
#[allow(dead_code)]
#[path = "../../../kernels-gpu/src/attention/layout.rs"]
pub(crate) mod layout;

mod gqa;
pub use gqa::with_two_launch_decode;
pub mod launch;
pub mod op;
pub mod reference;
mod rotary_embedding;
