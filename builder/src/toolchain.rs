//! Finding a Rust compiler that can build `core` for `nvptx64-nvidia-cuda`.
//!
//! Order: an explicit override ([`RUSTC_ENV`]/[`CARGO_ENV`]); a system compiler whose sysroot
//! ships the library source (Debian's `rustc-web` + `rust-web-src` at `/usr/bin`); a rustup
//! nightly with `rust-src`. There is no fallback to prebuilt or stale PTX.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::BuildError;

/// Environment variable: path of the `rustc` to compile kernels with.
pub const RUSTC_ENV: &str = "DLKERN_KERNEL_RUSTC";
/// Environment variable: path of the `cargo` to drive the kernel build with.
pub const CARGO_ENV: &str = "DLKERN_KERNEL_CARGO";

const INSTALL_HINT: &str = "no Rust compiler that can build `core` for nvptx64-nvidia-cuda was found.\n\
     Install one of:\n\
     - Debian/Ubuntu: apt-get install rustc-web cargo-web rust-web-src   (gives /usr/bin/rustc with library source)\n\
     - rustup: rustup toolchain install nightly --component rust-src\n\
     or point DLKERN_KERNEL_RUSTC and DLKERN_KERNEL_CARGO at a rustc/cargo pair whose sysroot has\n\
     lib/rustlib/src/rust/library (the `rust-src` component).";

/// Where a [`Toolchain`] was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolchainSource {
    /// `DLKERN_KERNEL_RUSTC`/`DLKERN_KERNEL_CARGO`.
    Override,
    /// A system compiler with library source (Debian's `/usr/bin/rustc`).
    System,
    /// A rustup nightly with `rust-src`.
    RustupNightly,
}

/// A `rustc`/`cargo` pair able to build `core` for nvptx64 with `-Zbuild-std`.
#[derive(Clone, Debug)]
pub struct Toolchain {
    pub rustc: PathBuf,
    pub cargo: PathBuf,
    pub sysroot: PathBuf,
    pub source: ToolchainSource,
}

impl Toolchain {
    /// A command for `program` with a scrubbed environment and this toolchain's compiler.
    pub(crate) fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        command.env_clear().envs(crate::scrubbed_env());
        command.env("RUSTC", &self.rustc);
        // -Zbuild-std and the kernels' nightly features on a stable-channel compiler.
        command.env("RUSTC_BOOTSTRAP", "1");
        command
    }
}

/// Finds the kernel toolchain (see the module docs for the order).
pub fn find_toolchain() -> Result<Toolchain, BuildError> {
    if let Some(rustc) = std::env::var_os(RUSTC_ENV) {
        let rustc = PathBuf::from(rustc);
        let cargo = match std::env::var_os(CARGO_ENV) {
            Some(cargo) => PathBuf::from(cargo),
            None => rustc.with_file_name("cargo"),
        };
        return check(rustc, cargo, ToolchainSource::Override)
            .map_err(|why| BuildError::NoToolchain(format!("{RUSTC_ENV} is set but unusable: {why}\n{INSTALL_HINT}")));
    }
    let mut rejected = Vec::new();
    match check("/usr/bin/rustc".into(), "/usr/bin/cargo".into(), ToolchainSource::System) {
        Ok(t) => return Ok(t),
        Err(why) => rejected.push(format!("/usr/bin/rustc: {why}")),
    }
    match rustup_nightly() {
        Ok(t) => return Ok(t),
        Err(why) => rejected.push(format!("rustup nightly: {why}")),
    }
    Err(BuildError::NoToolchain(format!("{INSTALL_HINT}\nTried: {}", rejected.join("; "))))
}

fn rustup_nightly() -> Result<Toolchain, String> {
    let out = Command::new("rustup")
        .env_clear()
        .envs(crate::scrubbed_env())
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
        .map_err(|e| format!("rustup not runnable ({e})"))?;
    if !out.status.success() {
        return Err("no nightly toolchain installed".into());
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    check(sysroot.join("bin/rustc"), sysroot.join("bin/cargo"), ToolchainSource::RustupNightly)
}

fn check(rustc: PathBuf, cargo: PathBuf, source: ToolchainSource) -> Result<Toolchain, String> {
    if !rustc.is_file() {
        return Err(format!("{} does not exist", rustc.display()));
    }
    if !cargo.is_file() {
        return Err(format!("{} does not exist", cargo.display()));
    }
    let out = Command::new(&rustc)
        .env_clear()
        .envs(crate::scrubbed_env())
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("{} not runnable ({e})", rustc.display()))?;
    if !out.status.success() {
        return Err(format!("{} --print sysroot failed", rustc.display()));
    }
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let core_src = sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if !core_src.is_file() {
        return Err(format!("its sysroot {} has no library source (rust-src)", sysroot.display()));
    }
    Ok(Toolchain { rustc, cargo, sysroot, source })
}
