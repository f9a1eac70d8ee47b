//! Directives on kernel entries that Rust has no attribute for (PTX ISA §11.4 performance
//! tuning directives, e.g. `.reqnctapercluster`).

/// Puts `$directive` into the header of entry `$entry`: emits the PTX comment
/// `// dlkern-entry-directive $entry $directive`, which the build (`builder`'s
/// `apply_entry_directives`) moves between the entry's parameter list and its body. The build
/// fails if the module has no such entry.
///
/// ```ignore
/// entry_directive!(matmul_nbits_wgmma_pair_f16, ".reqnctapercluster 1, 1, 2");
/// ```
#[macro_export]
macro_rules! entry_directive {
    ($entry:ident, $directive:literal) => {
        core::arch::global_asm!(concat!("// dlkern-entry-directive ", stringify!($entry), " ", $directive));
    };
}
