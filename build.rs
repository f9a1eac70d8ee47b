//! Compiles the Rust kernels in `kernels-gpu/` to PTX for every architecture dlkern ships, into
//! `OUT_DIR`, where `host/runtime/ptx.rs` embeds them. No nvcc or CUDA toolkit is involved;
//! see `builder/` for how the compiler is found and invoked.
//!
//! A second build of the same crate, with its feature `probes`, gives the probe modules
//! (`dlkern_kernels_gpu_probe_ptx.rs`): device self-tests that only the tests and benches load
//! (`tests/common/probe.rs`), never the library. It reuses the first build's `core`.

use dlkern_builder::{Arch, KernelBuilder};

fn main() {
    let kernels = KernelBuilder::new("kernels-gpu").arch(Arch::SM80).arch(Arch::SM90A);
    let probes = kernels.clone().feature("probes").name("dlkern_kernels_gpu_probe");
    for build in [kernels, probes] {
        if let Err(error) = build.build() {
            eprintln!("{error}");
            std::process::exit(1);
        }
    }
}
