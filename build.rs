//! Compiles the Rust kernels in `kernels-gpu/` to PTX for every architecture dlkern ships, into
//! `OUT_DIR`, where `host/runtime/ptx.rs` embeds them. No nvcc or CUDA toolkit is involved;
//! see `builder/` for how the compiler is found and invoked.

use dlkern_builder::{Arch, KernelBuilder};

fn main() {
    let built = KernelBuilder::new("kernels-gpu").arch(Arch::SM80).arch(Arch::SM90A).build();
    if let Err(error) = built {
        eprintln!("{error}");
        std::process::exit(1);
    }
}
