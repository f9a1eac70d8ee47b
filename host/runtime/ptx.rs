//! The PTX modules built from `kernels-gpu/` by `build.rs`, and the choice among them.

// Defines `PTX_MODULES: &[(u32, &str)]`, newest architecture first.
include!(concat!(env!("OUT_DIR"), "/dlkern_kernels_gpu_ptx.rs"));

/// The oldest compute capability any shipped module runs on.
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// The module for a device of compute capability `major.minor`: the newest one whose
/// architecture is not newer than the device (PTX is forward compatible, so a newer GPU JIT
/// compiles the newest module). `None` for GPUs older than every module.
pub fn select(major: i32, minor: i32) -> Option<(u32, &'static str)> {
    let cc = (major.max(0) as u32) * 10 + minor.max(0) as u32;
    PTX_MODULES.iter().copied().find(|&(sm, _)| sm <= cc)
}

/// Architectures shipped, newest first (e.g. `[90, 80]`).
pub fn architectures() -> impl Iterator<Item = u32> {
    PTX_MODULES.iter().map(|&(sm, _)| sm)
}

/// The PTX text for `sm_<sm>`, if shipped.
pub fn module_for_arch(sm: u32) -> Option<&'static str> {
    PTX_MODULES.iter().find(|&&(s, _)| s == sm).map(|&(_, text)| text)
}
