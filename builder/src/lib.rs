//! Compile a `#![no_std]` Rust kernel crate to PTX from a build script.
//!
//! No nvcc, libNVVM or CUDA toolkit is involved: rustc's NVPTX backend emits PTX directly. The
//! kernel crate is built as a `staticlib` with fat LTO and `--emit=asm`, which makes the emitted
//! `.s` file the complete PTX module (`core` merged in), one module per GPU architecture.
//!
//! ```no_run
//! // build.rs of a crate with its kernels in `kernels/`
//! if let Err(e) = dlkern_builder::KernelBuilder::new("kernels")
//!     .arch(dlkern_builder::Arch::SM80)
//!     .arch(dlkern_builder::Arch::SM90)
//!     .build()
//! {
//!     eprintln!("{e}");
//!     std::process::exit(1);
//! }
//! // then, in the crate: include!(concat!(env!("OUT_DIR"), "/kernels_ptx.rs"));
//! // which defines `pub const PTX_MODULES: &[(u32, bool, &str, &[u8])]` (sm number, `sm_XYa`,
//! // PTX text, the module assembled for that architecture or empty).
//! ```
//!
//! With [`PTXAS_ENV`] naming a `ptxas`, each module is also assembled for its architecture (a
//! cubin of the same kernels), so that a GPU of that architecture loads machine code instead of
//! JIT-compiling the PTX, which takes tens of seconds for a large module on every fresh machine.
//!
//! The kernel crate needs `crate-type = ["staticlib"]`, `panic = "abort"`, `lto = "fat"` and
//! `codegen-units = 1` in its release profile, its own `[workspace]` table, and a
//! `#[panic_handler]`. See `toolchain` for how the compiler is found.

mod toolchain;

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use toolchain::{Toolchain, ToolchainSource, find_toolchain};

/// Environment variable naming the directory for the inner kernel build (default: beside the
/// outer cargo's target directory, so `cargo build`, `test`, `clippy` and `doc` share one copy
/// of the compiled `core`).
pub const TARGET_DIR_ENV: &str = "DLKERN_KERNEL_TARGET_DIR";

/// Environment variable naming the `ptxas` that assembles each module for its architecture
/// (unset or empty: PTX only). A `ptxas` that fails is a build error: it says the PTX is one
/// the GPU's own compiler would reject too.
pub const PTXAS_ENV: &str = "DLKERN_PTXAS";

/// A GPU architecture, by its `sm_XY` number; `sm_XYa` when arch-specific (features such as
/// `wgmma` that only that exact architecture has; such PTX runs on no other GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Arch {
    number: u32,
    specific: bool,
}

impl Arch {
    /// Ampere A100 (and the baseline for all sm_8x parts).
    pub const SM80: Arch = Arch::new(80);
    /// Hopper H100/H200.
    pub const SM90: Arch = Arch::new(90);
    /// Hopper with its arch-specific instructions (`wgmma`, `setmaxnreg`), PTX ISA 8.0. The
    /// kernel crate sees `target_feature = "sm_90"` and `cfg(dlkern_arch_specific)` (declare
    /// the latter in its `[lints.rust] unexpected_cfgs` check-cfg list, as `kernels-gpu` does,
    /// or `-Dwarnings` fails the build). Its PTX runs on compute capability 9.0 only.
    pub const SM90A: Arch = Arch { number: 90, specific: true };

    /// The architecture `sm_{number}`, e.g. `Arch::new(86)`. The NVPTX backend must know it.
    pub const fn new(number: u32) -> Arch {
        Arch { number, specific: false }
    }

    /// The `XY` of `sm_XY`.
    pub const fn number(self) -> u32 {
        self.number
    }

    /// Whether this is the `sm_XYa` form.
    pub const fn is_specific(self) -> bool {
        self.specific
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.number, if self.specific { "a" } else { "" })
    }
}

/// Why a kernel build failed. The `Display` text is meant to be shown to the user as is.
#[derive(Debug)]
pub enum BuildError {
    /// No compiler that can build `core` for nvptx64 was found.
    NoToolchain(String),
    /// The kernel crate's manifest could not be read or has no package name.
    BadKernelCrate(String),
    /// The inner cargo failed; its output is attached.
    CompileFailed { arch: Arch, command: String, output: String },
    /// The emitted file is missing or is not a PTX module for the requested architecture.
    BadPtx { arch: Arch, reason: String },
    /// An I/O error around the build.
    Io(String),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoToolchain(msg) => write!(f, "dlkern-builder: {msg}"),
            BuildError::BadKernelCrate(msg) => write!(f, "dlkern-builder: kernel crate: {msg}"),
            BuildError::CompileFailed { arch, command, output } => {
                write!(f, "dlkern-builder: compiling kernels for {arch} failed.\ncommand: {command}\n{output}")
            }
            BuildError::BadPtx { arch, reason } => write!(f, "dlkern-builder: PTX for {arch}: {reason}"),
            BuildError::Io(msg) => write!(f, "dlkern-builder: {msg}"),
        }
    }
}

impl std::error::Error for BuildError {}

/// One PTX module produced by [`KernelBuilder::build`].
#[derive(Clone, Debug)]
pub struct BuiltPtx {
    pub arch: Arch,
    /// Where the module was written (in the output directory).
    pub path: PathBuf,
    /// The module assembled by [`PTXAS_ENV`]'s `ptxas` for `arch`, when one was given.
    pub cubin: Option<PathBuf>,
}

/// Builds a kernel crate to one PTX module per architecture. See the crate docs.
#[derive(Clone, Debug)]
pub struct KernelBuilder {
    crate_dir: PathBuf,
    archs: Vec<Arch>,
    features: Vec<String>,
    name: Option<String>,
    out_dir: Option<PathBuf>,
    target_dir: Option<PathBuf>,
    emit_cargo_directives: bool,
}

impl KernelBuilder {
    /// A builder for the kernel crate at `crate_dir` (relative paths are taken from
    /// `CARGO_MANIFEST_DIR`, i.e. the crate whose build script runs this).
    pub fn new(crate_dir: impl AsRef<Path>) -> Self {
        let dir = crate_dir.as_ref();
        let crate_dir = if dir.is_absolute() {
            dir.to_path_buf()
        } else {
            std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).unwrap_or_default().join(dir)
        };
        KernelBuilder {
            crate_dir,
            archs: Vec::new(),
            features: Vec::new(),
            name: None,
            out_dir: None,
            target_dir: None,
            emit_cargo_directives: true,
        }
    }

    /// Adds an architecture to build for.
    pub fn arch(mut self, arch: Arch) -> Self {
        if !self.archs.contains(&arch) {
            self.archs.push(arch);
        }
        self
    }

    /// Enables a Cargo feature of the kernel crate (`--features`). The build keeps `core`: a
    /// crate built with and without a feature shares one compiled `core` per architecture, and
    /// cargo keeps both builds of the crate itself side by side.
    pub fn feature(mut self, feature: impl Into<String>) -> Self {
        self.features.push(feature.into());
        self
    }

    /// The stem of the files [`KernelBuilder::build`] writes: `<name>.<sm_XY>.ptx` and
    /// `<name>_ptx.rs` (default: the crate's name, `-` spelled `_`). Builds of one crate with
    /// different features need different names.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Where to write the PTX modules and `<name>_ptx.rs` (default: `OUT_DIR`).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// Target directory of the inner build (default: see [`TARGET_DIR_ENV`]).
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.target_dir = Some(dir.into());
        self
    }

    /// Whether to print `cargo:rerun-if-*` lines (default: yes; turn off outside build scripts).
    pub fn cargo_directives(mut self, emit: bool) -> Self {
        self.emit_cargo_directives = emit;
        self
    }

    /// Compiles the kernel crate once per architecture (in parallel) and writes
    /// `<out>/<name>.<sm_XY>.ptx` for each, plus `<out>/<name>_ptx.rs` defining
    /// `PTX_MODULES: &[(u32, bool, &str)]`, newest architecture first (see
    /// [`KernelBuilder::name`]).
    pub fn build(self) -> Result<Vec<BuiltPtx>, BuildError> {
        let crate_name = package_name(&self.crate_dir)?;
        let crate_stem = crate_name.replace('-', "_");
        let file_stem = self.name.clone().unwrap_or_else(|| crate_stem.clone());
        if self.emit_cargo_directives {
            // Only the kernel sources and the knobs below can change the PTX.
            println!("cargo:rerun-if-changed={}", self.crate_dir.join("src").display());
            println!("cargo:rerun-if-changed={}", self.crate_dir.join("Cargo.toml").display());
            for var in [toolchain::RUSTC_ENV, toolchain::CARGO_ENV, TARGET_DIR_ENV, PTXAS_ENV] {
                println!("cargo:rerun-if-env-changed={var}");
            }
        }
        let out_dir = match self.out_dir.clone() {
            Some(dir) => dir,
            None => std::env::var_os("OUT_DIR")
                .map(PathBuf::from)
                .ok_or_else(|| BuildError::Io("OUT_DIR is not set; call out_dir() outside a build script".into()))?,
        };
        // One inner target directory per crate and architecture, whatever the features: they
        // share `core`.
        let target_root = self.inner_target_root(&out_dir).join(&crate_stem);
        if self.archs.is_empty() {
            return Err(BuildError::BadKernelCrate("no architecture requested; call arch()".into()));
        }
        let toolchain = find_toolchain()?;

        let this = &self;
        let results: Vec<Result<BuiltPtx, BuildError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = this
                .archs
                .iter()
                .map(|&arch| {
                    let (toolchain, target_root, out_dir) = (&toolchain, &target_root, &out_dir);
                    let (crate_name, file_stem) = (&crate_name, &file_stem);
                    scope.spawn(move || {
                        let target_dir = target_root.join(arch.to_string());
                        this.build_arch(toolchain, arch, &target_dir, out_dir, crate_name, file_stem)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(BuildError::Io("kernel build thread panicked".into()))))
                .collect()
        });
        let mut built = results.into_iter().collect::<Result<Vec<_>, _>>()?;
        built.sort_by_key(|b| std::cmp::Reverse(b.arch));
        write_module_table(&out_dir, &file_stem, &built)?;
        Ok(built)
    }

    fn inner_target_root(&self, out_dir: &Path) -> PathBuf {
        if let Some(dir) = &self.target_dir {
            return dir.clone();
        }
        if let Some(dir) = std::env::var_os(TARGET_DIR_ENV) {
            return PathBuf::from(dir);
        }
        // OUT_DIR is <target>[/<triple>]/<profile>/build/<pkg>-<hash>/out: share one inner
        // target directory across profiles so `core` is compiled once per architecture.
        out_dir
            .ancestors()
            .find(|p| p.file_name().is_some_and(|n| n == "build"))
            .and_then(|build| build.parent()?.parent())
            .map(|target| target.join("dlkern-kernels"))
            .unwrap_or_else(|| out_dir.join("dlkern-kernels"))
    }

    fn build_arch(
        &self,
        toolchain: &Toolchain,
        arch: Arch,
        target_dir: &Path,
        out_dir: &Path,
        crate_name: &str,
        file_stem: &str,
    ) -> Result<BuiltPtx, BuildError> {
        let emitted = target_dir.join(format!("{file_stem}.ptx"));
        let mut command = self.inner_cargo(toolchain, arch, target_dir, &emitted);
        let mut output = run(&mut command, arch)?;
        if !emitted.exists() {
            // Cargo considered the crate fresh but the emitted file is gone: rebuild it.
            let mut clean = toolchain.command(&toolchain.cargo);
            clean.arg("clean").arg("--release").arg("--target").arg("nvptx64-nvidia-cuda");
            clean.arg("--manifest-path").arg(self.crate_dir.join("Cargo.toml")).arg("-p").arg(crate_name);
            clean.env("CARGO_TARGET_DIR", target_dir);
            run(&mut clean, arch)?;
            output = run(&mut self.inner_cargo(toolchain, arch, target_dir, &emitted), arch)?;
        }
        let ptx = std::fs::read_to_string(&emitted).map_err(|e| BuildError::BadPtx {
            arch,
            reason: format!(
                "cannot read {} after a successful build ({e}); build output:\n{output}",
                emitted.display()
            ),
        })?;
        // rustc knows no `sm_90a` CPU (and its `ptx80` feature is unstable, with a warning): the
        // module is generated for `sm_90`, and its header names the arch-specific target and
        // the PTX ISA version that introduced it, which `ptxas` and the driver need before
        // they accept `wgmma`. PTX versions are supersets, so the body is valid either way.
        let ptx = if arch.is_specific() { retarget(&ptx, arch) } else { ptx };
        let ptx = apply_entry_directives(&ptx).map_err(|reason| BuildError::BadPtx { arch, reason })?;
        check_ptx(&ptx, arch)?;
        let path = out_dir.join(format!("{file_stem}.{arch}.ptx"));
        write_if_changed(&path, &ptx)?;
        let cubin = match std::env::var_os(PTXAS_ENV).filter(|p| !p.is_empty()) {
            Some(ptxas) => Some(assemble(Path::new(&ptxas), &path, &ptx, arch, target_dir, file_stem)?),
            None => None,
        };
        Ok(BuiltPtx { arch, path, cubin })
    }

    fn inner_cargo(&self, toolchain: &Toolchain, arch: Arch, target_dir: &Path, emitted: &Path) -> Command {
        let mut command = toolchain.command(&toolchain.cargo);
        command
            .arg("rustc")
            .arg("--release")
            .arg("--manifest-path")
            .arg(self.crate_dir.join("Cargo.toml"))
            .arg("-Zbuild-std=core")
            .arg("--target")
            .arg("nvptx64-nvidia-cuda");
        if !self.features.is_empty() {
            command.arg("--features").arg(self.features.join(","));
        }
        command
            .arg("--")
            // The kernel crate only (not `core`): its warnings fail the build, since cargo shows
            // a build script's output only when it fails.
            .arg("-Dwarnings")
            .arg(format!("--emit=asm={}", emitted.display()));
        // RUSTFLAGS reach `core` too, so the whole module is generated for `arch`.
        // -JumpThreading: rustc's MIR pass can duplicate a barrier into divergent branches and
        // hang a block (rust-lang/rust#137086).
        let mut flags =
            vec![format!("-Ctarget-cpu=sm_{}", arch.number()), "-Zmir-enable-passes=-JumpThreading".to_string()];
        if arch.is_specific() {
            flags.push("--cfg=dlkern_arch_specific".to_string());
        }
        command.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\u{1f}"));
        command.env("CARGO_TARGET_DIR", target_dir);
        command
    }
}

fn run(command: &mut Command, arch: Arch) -> Result<String, BuildError> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(|e| BuildError::CompileFailed {
        arch,
        command: shown.clone(),
        output: format!("could not start: {e}"),
    })?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if output.status.success() {
        Ok(text)
    } else {
        Err(BuildError::CompileFailed { arch, command: shown, output: text })
    }
}

/// The `name` in the `[package]` table of `<dir>/Cargo.toml`.
fn package_name(dir: &Path) -> Result<String, BuildError> {
    let manifest = dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| BuildError::BadKernelCrate(format!("cannot read {}: {e}", manifest.display())))?;
    let mut in_package = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package && let Some(value) = line.strip_prefix("name") {
            let value = value.trim_start();
            if let Some(value) = value.strip_prefix('=') {
                return Ok(value.trim().trim_matches('"').to_string());
            }
        }
    }
    Err(BuildError::BadKernelCrate(format!("no [package] name in {}", manifest.display())))
}

/// `ptx` (generated for the generic `sm_XY`) with the header of the arch-specific `sm_XYa`:
/// its `.target` line, and a `.version` of at least 8.0 (PTX ISA 8.0 introduced `sm_90a`).
fn retarget(ptx: &str, arch: Arch) -> String {
    let generic = format!(".target sm_{}", arch.number());
    let mut out = String::with_capacity(ptx.len() + 1);
    for line in ptx.lines() {
        let trimmed = line.trim();
        let version = trimmed.strip_prefix(".version ").and_then(|v| v.split_once('.'));
        let version = version.and_then(|(major, minor)| Some((major.parse::<u32>().ok()?, minor.parse::<u32>().ok()?)));
        match version {
            Some(v) if v < (8, 0) => out.push_str(".version 8.0"),
            _ if trimmed == generic => out.push_str(&format!(".target {arch}")),
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The comment the kernel crate's `entry_directive!` emits: `// dlkern-entry-directive ENTRY
/// DIRECTIVE`.
const ENTRY_DIRECTIVE: &str = "// dlkern-entry-directive ";

/// The comment the kernel crate's `tensor_map_param!` emits: `// dlkern-param-align PARAM
/// ALIGN`, for a by-value parameter that needs more alignment than rustc's NVPTX ABI can declare
/// (at most 16 bytes; a tensor map needs 64).
const PARAM_ALIGN: &str = "// dlkern-param-align ";

/// Moves each `entry_directive!` comment's directive into its entry's header (between the
/// parameter list and the body, where PTX takes performance-tuning directives such as
/// `.reqnctapercluster`), and raises the alignment of each parameter a `tensor_map_param!`
/// names (ptxas then places it on that boundary of the parameter space); an entry or parameter
/// the module does not have is an error.
fn apply_entry_directives(ptx: &str) -> Result<String, String> {
    let mut out = ptx.to_string();
    for line in ptx.lines() {
        let Some(spec) = line.trim().strip_prefix(PARAM_ALIGN) else { continue };
        let (param, align) = spec.split_once(' ').ok_or_else(|| format!("malformed parameter alignment `{line}`"))?;
        let declared = [2, 4, 8, 16].into_iter().find_map(|a| {
            let decl = format!(".param .align {a} .b8 {param}[");
            out.find(&decl).map(|at| (at, decl.len()))
        });
        let (at, len) =
            declared.ok_or_else(|| format!("parameter alignment for `{param}`, which no entry declares as bytes"))?;
        out.replace_range(at..at + len, &format!(".param .align {align} .b8 {param}["));
    }
    for line in ptx.lines() {
        let Some(spec) = line.trim().strip_prefix(ENTRY_DIRECTIVE) else { continue };
        let (entry, directive) = spec.split_once(' ').ok_or_else(|| format!("malformed entry directive `{line}`"))?;
        let header = format!(".entry {entry}(");
        let at = out.find(&header).ok_or_else(|| format!("entry directive for `{entry}`, which the module lacks"))?;
        let body = out[at..].find("\n{").ok_or_else(|| format!("entry `{entry}` has no body"))?;
        out.insert_str(at + body, &format!("\n{directive}"));
    }
    Ok(out)
}

/// The cubin `ptxas` makes of the module at `ptx_path` (text `ptx`) for `arch`, kept in the
/// inner target directory under the PTX's hash: the builds of every profile share it, and an
/// unchanged module is not assembled again (a large one takes ptxas half a minute).
fn assemble(
    ptxas: &Path,
    ptx_path: &Path,
    ptx: &str,
    arch: Arch,
    target_dir: &Path,
    file_stem: &str,
) -> Result<PathBuf, BuildError> {
    // Keyed by the PTX and by which ptxas (its path, size and time: another version at the same
    // path assembles anew). FNV-1a: a stable key (std's hasher may change between toolchains).
    let tool = std::fs::metadata(ptxas).map_err(|e| BuildError::Io(format!("{PTXAS_ENV}={}: {e}", ptxas.display())))?;
    let modified = tool.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    let key = format!("{}\n{}\n{:?}\n", ptxas.display(), tool.len(), modified);
    let hash = key
        .bytes()
        .chain(ptx.bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let cubin = target_dir.join(format!("{file_stem}.{arch}.{hash:016x}.cubin"));
    if cubin.exists() {
        return Ok(cubin);
    }
    std::fs::create_dir_all(target_dir).map_err(|e| BuildError::Io(format!("{}: {e}", target_dir.display())))?;
    let partial = cubin.with_extension("cubin.partial");
    let mut command = Command::new(ptxas);
    command.arg(format!("-arch={arch}")).arg("-O3").arg(ptx_path).arg("-o").arg(&partial);
    run(&mut command, arch)?;
    // Renamed into place whole, so that a build cut short leaves no truncated cubin behind.
    std::fs::rename(&partial, &cubin).map_err(|e| BuildError::Io(format!("{}: {e}", cubin.display())))?;
    Ok(cubin)
}

/// A PTX module for `arch` has the matching `.target` line and at least one kernel.
fn check_ptx(ptx: &str, arch: Arch) -> Result<(), BuildError> {
    let target = format!(".target {arch}");
    if !ptx.lines().any(|l| l.trim() == target) {
        return Err(BuildError::BadPtx { arch, reason: format!("no `{target}` line") });
    }
    if !ptx.contains(".entry ") {
        return Err(BuildError::BadPtx { arch, reason: "no kernel entry points (`.entry`)".into() });
    }
    Ok(())
}

fn write_module_table(out_dir: &Path, file_stem: &str, built: &[BuiltPtx]) -> Result<(), BuildError> {
    let mut table = String::from(
        "/// PTX modules built from the kernel crate: (sm number, arch-specific `sm_XYa`, PTX text,\n/// the module assembled for that architecture or empty), newest first.\n",
    );
    table.push_str("pub const PTX_MODULES: &[(u32, bool, &str, &[u8])] = &[\n");
    for module in built {
        let cubin = match &module.cubin {
            Some(path) => format!("include_bytes!({:?})", path.display().to_string()),
            None => "&[]".to_string(),
        };
        table.push_str(&format!(
            "    ({}, {}, include_str!({:?}), {cubin}),\n",
            module.arch.number(),
            module.arch.is_specific(),
            module.path.display().to_string()
        ));
    }
    table.push_str("];\n");
    write_if_changed(&out_dir.join(format!("{file_stem}_ptx.rs")), &table)
}

/// Writes only when the content differs, so unchanged PTX does not trigger recompiles.
fn write_if_changed(path: &Path, content: &str) -> Result<(), BuildError> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == content) {
        return Ok(());
    }
    std::fs::write(path, content).map_err(|e| BuildError::Io(format!("cannot write {}: {e}", path.display())))
}

/// Variables of the environment that the inner cargo may see. Everything else the outer cargo
/// set (RUSTFLAGS, RUSTC_WRAPPER from clippy, CARGO_TARGET_DIR, the jobserver in
/// CARGO_MAKEFLAGS, CARGO_CFG_*, profile settings) is dropped.
pub(crate) const PASSED_ENV: &[&str] =
    &["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "TMPDIR", "TMP", "TEMP", "LANG", "LC_ALL", "USER"];

pub(crate) fn scrubbed_env() -> Vec<(OsString, OsString)> {
    std::env::vars_os().filter(|(k, _)| PASSED_ENV.iter().any(|p| k == *p)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_directives_move_into_their_entry_header() {
        let ptx = "// dlkern-entry-directive k2 .reqnctapercluster 1, 1, 2\n.visible .entry k1(\n.param .u64 a\n)\n{\nret;\n}\n.visible .entry k2(\n.param .u64 a\n)\n{\nret;\n}\n";
        let out = apply_entry_directives(ptx).unwrap();
        assert!(out.contains(".entry k2(\n.param .u64 a\n)\n.reqnctapercluster 1, 1, 2\n{"), "{out}");
        assert!(out.contains(".entry k1(\n.param .u64 a\n)\n{"), "{out}");
        assert_eq!(apply_entry_directives("no directives\n").unwrap(), "no directives\n");
        let missing = apply_entry_directives("// dlkern-entry-directive k9 .maxnreg 128\n.entry k1(\n)\n{\n}\n");
        assert!(missing.unwrap_err().contains("k9"));
    }

    #[test]
    fn parameter_alignments_are_raised_where_named() {
        let ptx = "// dlkern-param-align k_param_0 64\n.visible .entry k(\n\t.param .align 16 .b8 k_param_0[128],\n\t.param .align 16 .b8 k_param_1[128]\n)\n{\nret;\n}\n";
        let out = apply_entry_directives(ptx).unwrap();
        assert!(
            out.contains("\t.param .align 64 .b8 k_param_0[128],\n\t.param .align 16 .b8 k_param_1[128]\n"),
            "{out}"
        );
        let missing = apply_entry_directives("// dlkern-param-align k_param_2 64\n.entry k(\n)\n{\n}\n");
        assert!(missing.unwrap_err().contains("k_param_2"));
    }

    #[test]
    fn arch_specific_modules_get_their_target_and_at_least_ptx_8_0() {
        let generic = "//\n.version 7.8\n.target sm_90\n.address_size 64\n\n.visible .entry k() { ret; }\n";
        let ptx = retarget(generic, Arch::SM90A);
        assert!(ptx.contains("\n.version 8.0\n.target sm_90a\n"), "{ptx}");
        assert!(ptx.ends_with(".visible .entry k() { ret; }\n"), "{ptx}");
        check_ptx(&ptx, Arch::SM90A).unwrap();
        // A newer PTX version is kept; only the exact generic target line is rewritten.
        let newer = retarget(".version 8.5\n.target sm_90\n// .target sm_90 in a comment\n.entry k", Arch::SM90A);
        assert!(newer.starts_with(".version 8.5\n.target sm_90a\n// .target sm_90 in a comment\n"), "{newer}");
        assert_eq!(Arch::SM90A.to_string(), "sm_90a");
        assert!(Arch::SM90A > Arch::SM90 && !Arch::SM90.is_specific());
        assert!(check_ptx(generic, Arch::SM90A).is_err(), "an sm_90 module is not an sm_90a one");
    }
}
