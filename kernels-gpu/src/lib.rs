//! dlkern device code: the CUDA kernels, written in Rust for `nvptx64-nvidia-cuda`.
//!
//! Layout:
//! - [`device`]: the only place with inline PTX; small `#[inline(always)]` wrappers, each with
//!   a one-line PTX ISA reference and a `# Safety` contract. Kernels never write `asm!`.
//! - [`element`]: the element types (f16/bf16 as bits) and their tensor-core operations.
//! - one folder per kernel family: [`rmsnorm`], [`attention`], [`paged_attention`],
//!   [`matmul_nbits`], [`matmul_w8a8`] and `probe`. Its `mod.rs` holds the kernels (or, split
//!   by kind, its other files do: `matmul_nbits/decode.rs`, `wgmma.rs` for the sm_90a module
//!   only, ...), `family_variant_dtype` entry points whose launch contracts the family's module
//!   docs state, and `layout.rs` everything its host launcher must agree on with them: grid,
//!   block and shared-memory shapes, flag bits and the `#[repr(C)]` scalar-argument struct. A
//!   `layout.rs` has no device code: the host crate compiles the very same file (a `#[path]`
//!   module in `host/ops/<family>/mod.rs`), so a launch cannot disagree with the kernel it
//!   launches.
//!
//! Each `layout.rs` also has the table of its family's entry points: an `Entry` enum naming
//! them in typed terms (variant, element type, head size), `ENTRIES: &[(Entry, &str)]` pairing
//! each with its symbol, and `entry(Entry)`, the lookup the host launchers use instead of
//! string literals (`entries.rs`, which each one `include!`s, has the element types and the
//! lookup). Rust cannot name an `extern "ptx-kernel"` function from a constant, so the kernels
//! keep their own function names; `tests/ptx.rs` checks that each PTX module's entries are
//! exactly those of the tables of the families it ships.
//!
//! This crate is compiled to PTX by the host crate's build script (see `builder/`), twice: the
//! production modules that `libdlkern` embeds (every family but `probe`), and, with the feature
//! `probes`, the probe modules (only [`device`], [`element`], `unroll` and `probe`: device
//! self-tests and a read-bandwidth ceiling, which only the host crate's tests and benches load,
//! through `tests/common/probe.rs`). It is never linked into a host binary.
#![no_std]
#![feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)]
#![cfg_attr(not(feature = "probes"), feature(stmt_expr_attributes))]
#![allow(clippy::missing_safety_doc)]

#[cfg(not(feature = "probes"))]
pub mod attention;
pub mod device;
pub mod element;
#[cfg(not(feature = "probes"))]
pub mod matmul_nbits;
#[cfg(not(feature = "probes"))]
pub mod matmul_w8a8;
#[cfg(not(feature = "probes"))]
pub mod paged_attention;
#[cfg(feature = "probes")]
pub mod probe;
#[cfg(not(feature = "probes"))]
pub mod rmsnorm;
#[cfg(not(feature = "probes"))]
pub mod rotary;
mod unroll;

/// Device code cannot unwind or print: a panic (an out-of-bounds index the optimiser could not
/// remove, say) traps, which surfaces on the host as `CUDA_ERROR_LAUNCH_FAILED`.
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; it has no other preconditions.
    unsafe { core::arch::nvptx::trap() }
}
