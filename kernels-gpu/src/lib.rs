//! dlkern device code: the CUDA kernels, written in Rust for `nvptx64-nvidia-cuda`.
//!
//! Layout:
//! - [`device`]: the only place with inline PTX; small `#[inline(always)]` wrappers, each with
//!   a one-line PTX ISA reference and a `# Safety` contract. Kernels never write `asm!`.
//! - one file per kernel family ([`rmsnorm`], [`probe`]), each exporting
//!   `family_variant_dtype` entry points whose launch contract its docs state.
//!
//! This crate is compiled to PTX by the host crate's build script (see `builder/`); it is
//! never linked into a host binary.
#![no_std]
#![feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, stmt_expr_attributes)]
#![allow(clippy::missing_safety_doc)]

pub mod attention;
pub mod device;
pub mod element;
pub mod layout;
pub mod matmul_nbits;
pub mod matmul_w8a8;
#[cfg(dlkern_arch_specific)]
pub mod matmul_w8a8_wgmma;
pub mod paged_attention;
pub mod probe;
pub mod rmsnorm;
mod unroll;

/// Device code cannot unwind or print: a panic (an out-of-bounds index the optimiser could not
/// remove, say) traps, which surfaces on the host as `CUDA_ERROR_LAUNCH_FAILED`.
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; it has no other preconditions.
    unsafe { core::arch::nvptx::trap() }
}
