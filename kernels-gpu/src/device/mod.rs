//! Device support: the one module of dlkern that contains inline PTX.
//!
//! Every wrapper is `#[inline(always)]`, names the PTX ISA section it uses, and states its
//! safety contract. Kernels compose these; they never write `asm!` themselves.
//!
//! Conventions: shared-memory addresses are 32-bit `.shared` window addresses ([`SharedAddr`]),
//! global memory is passed as ordinary pointers (the generic address of a global allocation is
//! its global address on NVPTX).

pub mod async_copy;
pub mod bits;
#[cfg(dlkern_arch_specific)]
pub mod bulk_copy;
#[cfg(dlkern_arch_specific)]
pub mod cluster;
pub mod convert;
pub mod entry;
pub mod index;
pub mod ldmatrix;
pub mod math;
#[cfg(dlkern_arch_specific)]
pub mod mbarrier;
pub mod memory;
pub mod mma;
pub mod reduce;
pub mod shared;
pub mod sync;
#[cfg(dlkern_arch_specific)]
pub mod tma;
pub mod warp;
#[cfg(dlkern_arch_specific)]
pub mod wgmma;

pub use shared::SharedAddr;

/// Threads per warp on every NVIDIA GPU dlkern supports.
pub const WARP_SIZE: u32 = 32;
