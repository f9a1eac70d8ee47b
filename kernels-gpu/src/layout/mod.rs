//! What the host launchers need of each kernel: tile shapes (grid, block, shared memory), flag
//! bits and the `#[repr(C)]` scalar-argument struct, in files with no device code so that the
//! host crate compiles the very same source (`#[path]` modules in `host/launch/`): a launch
//! can never disagree with the kernel it launches.

pub mod attention;
pub mod matmul_w8a8;
pub mod paged_attention;
pub mod probe;
