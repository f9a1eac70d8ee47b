//! The PTX modules built from `kernels-gpu/` by `build.rs`, and the choice among them.

// Defines `PTX_MODULES: &[(u32, bool, &str, &[u8])]` (sm number, arch-specific `sm_XYa`, text,
// the module assembled for its architecture when the build had a ptxas, else empty), newest
// architecture first.
include!(concat!(env!("OUT_DIR"), "/dlkern_kernels_gpu_ptx.rs"));

/// The oldest compute capability any shipped module runs on.
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// A row of a module table as `dlkern-builder` writes it (`PTX_MODULES`): sm number,
/// arch-specific `sm_XYa`, PTX text, cubin (empty when the build had no `ptxas`).
pub type TableEntry = (u32, bool, &'static str, &'static [u8]);

/// One shipped PTX module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Module {
    /// The `XY` of its `sm_XY` target.
    pub arch: u32,
    /// `sm_XYa`: it uses instructions only that exact architecture has (Hopper's `wgmma`), so
    /// it runs on compute capability `X.Y` and no other.
    pub arch_specific: bool,
    pub text: &'static str,
    /// The same kernels as machine code for `sm_XY` (empty when the build had no `ptxas`):
    /// loading it skips the driver's JIT compile of `text`, tens of seconds for this module on
    /// a machine whose JIT cache does not hold it yet.
    pub cubin: &'static [u8],
}

impl Module {
    /// The module a table row describes.
    pub fn of(&(arch, arch_specific, text, cubin): &TableEntry) -> Module {
        Module { arch, arch_specific, text, cubin }
    }

    /// The `.target` name, e.g. `sm_90a`.
    pub fn target(&self) -> String {
        format!("sm_{}{}", self.arch, if self.arch_specific { "a" } else { "" })
    }

    /// The cubin, if there is one and a device of compute capability `major.minor` runs it:
    /// machine code runs on its own major architecture only, from its minor version on (an
    /// `sm_XYa` cubin on `X.Y` alone), where PTX also runs on every newer GPU.
    pub fn cubin_for(&self, major: i32, minor: i32) -> Option<&'static [u8]> {
        let (cc, arch) = ((major.max(0) as u32) * 10 + minor.max(0) as u32, self.arch);
        let runs = if self.arch_specific { cc == arch } else { cc / 10 == arch / 10 && cc >= arch };
        (runs && !self.cubin.is_empty()).then_some(self.cubin)
    }
}

/// Every shipped module, newest first.
pub fn modules() -> impl Iterator<Item = Module> {
    PTX_MODULES.iter().map(Module::of)
}

/// The module for a device of compute capability `major.minor`: an arch-specific module of
/// exactly that architecture, else the newest portable one not newer than the device (PTX is
/// forward compatible, so a newer GPU JIT compiles it). `None` for GPUs older than every module.
pub fn select(major: i32, minor: i32) -> Option<Module> {
    let cc = (major.max(0) as u32) * 10 + minor.max(0) as u32;
    modules().find(|m| if m.arch_specific { m.arch == cc } else { m.arch <= cc })
}
