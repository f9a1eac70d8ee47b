//! Tile shapes the host launchers need (grid, block, shared memory), in files with no device
//! code so that the host crate compiles the very same source (`#[path]` modules in
//! `host/launch/`): a launch can never disagree with the kernel it launches.

pub mod attention;
pub mod matmul_nbits;
pub mod matmul_w8a8;
pub mod paged_attention;
