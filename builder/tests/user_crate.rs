//! The builder compiles a user's own kernel crate (not dlkern's) to PTX, and reports compile
//! errors with rustc's message instead of leaving stale PTX behind.

use std::path::PathBuf;

use dlkern_builder::{Arch, BuildError, KernelBuilder};

const MANIFEST: &str = r#"[package]
name = "user-kernels"
version = "0.1.0"
edition = "2024"

[workspace]

[lib]
crate-type = ["staticlib"]

[features]
extra = []

[profile.release]
lto = "fat"
codegen-units = 1
panic = "abort"
"#;

const LIB: &str = r#"#![no_std]
#![feature(abi_ptx, stdarch_nvptx)]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! { unsafe { core::arch::nvptx::trap() } }
/// y[i] = x[i] + 1
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn add_one_f32(x: *const f32, y: *mut f32, n: u32) {
    let i = unsafe { core::arch::nvptx::_block_idx_x() * core::arch::nvptx::_block_dim_x()
        + core::arch::nvptx::_thread_idx_x() } as u32;
    if i < n { unsafe { *y.add(i as usize) = *x.add(i as usize) + 1.0 } }
}
#[cfg(feature = "extra")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn extra_kernel() {}
"#;

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), MANIFEST).unwrap();
    dir
}

fn builder(dir: &PathBuf) -> KernelBuilder {
    KernelBuilder::new(dir)
        .arch(Arch::SM80)
        .out_dir(dir.join("out"))
        // Share compiled `core` between runs of this test.
        .target_dir(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("user-kernels-target"))
        .cargo_directives(false)
}

#[test]
fn builds_a_user_kernel_crate_and_reports_compile_errors() {
    let dir = scratch("user-kernels");
    std::fs::create_dir_all(dir.join("out")).unwrap();
    std::fs::write(dir.join("src/lib.rs"), LIB).unwrap();
    let built = builder(&dir).build().expect("user kernel crate builds");
    assert_eq!(built.len(), 1);
    let ptx = std::fs::read_to_string(&built[0].path).unwrap();
    assert!(ptx.contains(".target sm_80"), "{ptx}");
    assert!(ptx.contains(".visible .entry add_one_f32("), "{ptx}");
    let table = std::fs::read_to_string(dir.join("out/user_kernels_ptx.rs")).unwrap();
    assert!(table.contains("(80, false, include_str!("), "{table}");
    assert!(!ptx.contains("extra_kernel"), "{ptx}");

    // The same crate with a feature, under another name: its own files beside the first build's.
    let extra = builder(&dir).feature("extra").name("user_kernels_extra").build().expect("builds with a feature");
    assert_eq!(extra[0].path, dir.join("out/user_kernels_extra.sm_80.ptx"));
    let extra_ptx = std::fs::read_to_string(&extra[0].path).unwrap();
    assert!(extra_ptx.contains(".visible .entry extra_kernel(") && extra_ptx.contains("add_one_f32"), "{extra_ptx}");
    let extra_table = std::fs::read_to_string(dir.join("out/user_kernels_extra_ptx.rs")).unwrap();
    assert!(extra_table.contains("user_kernels_extra.sm_80.ptx"), "{extra_table}");
    assert_eq!(std::fs::read_to_string(&built[0].path).unwrap(), ptx, "the first build's PTX stays");

    std::fs::write(dir.join("src/lib.rs"), LIB.replace("+ 1.0", "+ undefined_name")).unwrap();
    match builder(&dir).build() {
        Err(BuildError::CompileFailed { arch, output, .. }) => {
            assert_eq!(arch, Arch::SM80);
            assert!(output.contains("undefined_name"), "{output}");
        }
        other => panic!("expected CompileFailed, got {other:?}"),
    }
}

#[test]
fn a_crate_without_package_name_is_rejected() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("not-a-crate");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Cargo.toml"), "[workspace]\n").unwrap();
    let err = KernelBuilder::new(&dir).arch(Arch::SM90).out_dir(&dir).cargo_directives(false).build().unwrap_err();
    assert!(matches!(err, BuildError::BadKernelCrate(_)), "{err}");
}

#[test]
fn finds_a_toolchain_with_library_source() {
    let toolchain = dlkern_builder::find_toolchain().expect("the test scripts install one");
    assert!(toolchain.sysroot.join("lib/rustlib/src/rust/library/core").is_dir());
}
