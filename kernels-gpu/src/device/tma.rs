//! Tensor copies by Hopper's tensor memory accelerator (TMA; PTX ISA §9.7.9.25.5.1
//! `cp.async.bulk.tensor`, sm_90): one instruction moves a box of a 1-5 dimensional tensor
//! between global and shared memory, laid out (and swizzled) in shared memory as a tensor map
//! says, with the box's parts outside the tensor filled with zeros. The destination's
//! `mbarrier` counts the bytes as they land (`complete_tx`, as [`super::bulk_copy`]).
//!
//! The tensor map (`CUtensorMap`, 128 opaque bytes made by the driver's
//! `cuTensorMapEncodeTiled` on the host, `runtime::tensor_map` there) reaches the kernel as a
//! by-value kernel parameter ([`TensorMapParam`]): CUDA C++'s `const __grid_constant__
//! CUtensorMap`. The instruction takes the map's generic address, which
//! [`kernel_param_address!`](crate::kernel_param_address) gives without copying the parameter
//! (a map copied to local or global memory would need the proxy fences of PTX ISA §9.7.13.4
//! first; in the parameter space the driver has written it before the grid starts).
//!
//! The copies run in the async proxy: `wgmma` may read what they wrote once the barrier's phase
//! completes, with no proxy fence; generic-proxy writes to the same shared memory before a copy
//! into it need `fence.proxy.async.shared::cta`.

use core::arch::asm;

use super::SharedAddr;

/// A tensor map as a kernel parameter: declare it by value, name it in
/// [`tensor_map_param!`](crate::tensor_map_param), and take its address with
/// [`kernel_param_address!`](crate::kernel_param_address) (the value itself is never read by
/// the kernel's code).
///
/// A map must lie on a 64-byte boundary (else the copy faults: `CUDA_ERROR_MISALIGNED_ADDRESS`,
/// seen on an H100 with the parameter first and 16-byte aligned: the parameter space itself is
/// not 64-byte aligned). rustc's NVPTX kernel ABI cannot declare a parameter aligned beyond 16
/// bytes (an `align(64)` type is an internal compiler error), so the type is 16-byte aligned and
/// the build raises the parameter's alignment in the PTX.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct TensorMapParam(pub [u64; 16]);

/// The generic address of kernel parameter `$symbol` (its PTX name: `<entry>_param_<index>`,
/// e.g. `"probe_tma_load_param_0"`) as a `u64`, for instructions that read a parameter through
/// an address, such as the tensor map of [`load_2d`]. `cvta.param` (PTX ISA §9.7.9.21, PTX
/// 7.7) makes the parameter's address generic; ptxas then reads the parameter from the constant
/// bank where the driver put it, instead of copying it to the stack.
///
/// The build fails (ptxas: undefined symbol) if the entry has no such parameter.
#[macro_export]
macro_rules! kernel_param_address {
    ($symbol:expr) => {{
        let address: u64;
        // SAFETY: reads no memory; the symbol is checked by ptxas. (The block may sit inside
        // the caller's own `unsafe`.)
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::asm!(
                concat!("mov.b64 {a}, ", $symbol, ";\n\tcvta.param.u64 {a}, {a};"),
                a = out(reg64) address,
                options(pure, nomem, nostack)
            )
        };
        address
    }};
}

/// Declares that parameter `$index` of entry `$entry` is a [`TensorMapParam`]: the build
/// (`builder`'s `apply_entry_directives`) declares it 64-byte aligned in the PTX, and fails if
/// the entry has no such by-value parameter.
///
/// ```ignore
/// tensor_map_param!(probe_tma_load, 0);
/// ```
#[macro_export]
macro_rules! tensor_map_param {
    ($entry:ident, $index:literal) => {
        core::arch::global_asm!(concat!(
            "// dlkern-param-align ",
            stringify!($entry),
            "_param_",
            stringify!($index),
            " 64"
        ));
    };
}

/// `prefetch.tensormap [map]` (PTX ISA §9.7.9.15): brings the tensor map into the TMA unit's
/// cache ahead of the first copy through it (the producer issues it while the barriers are
/// being set up).
///
/// # Safety
/// `map` is the generic address of a tensor map ([`kernel_param_address!`](crate::kernel_param_address)).
#[inline(always)]
pub unsafe fn prefetch(map: u64) {
    // SAFETY: the caller guarantees a tensor map's address; a prefetch has no other effect.
    unsafe { asm!("prefetch.tensormap [{}];", in(reg64) map, options(nostack)) };
}

/// `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [dst],
/// [map, {c0, c1}], [bar]`: copies the map's box whose first element is at coordinates `(c0,
/// c1)` (innermost first, in elements; negative or past the tensor's end: those elements are
/// zeros) to this block's shared memory at `dst`; as they land, `bar` counts the box's bytes
/// against its current phase's transactions.
///
/// # Safety
/// `map` is the generic address of a valid tensor map of rank 2 for memory that no grid writes
/// meanwhile; `dst` is aligned as the map's swizzle requires (128 bytes, 1024 for the 128-byte
/// swizzle) and holds the box; nothing reads or writes `dst` until `bar`'s phase completes;
/// `bar` is initialized and its phase expects the box's bytes.
#[inline(always)]
pub unsafe fn load_2d(dst: SharedAddr, map: u64, c0: i32, c1: i32, bar: SharedAddr) {
    // SAFETY: the caller guarantees the map, the destination and the barrier's expectation.
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{}], [{}, {{{}, {}}}], [{}];",
            in(reg32) dst.0, in(reg64) map, in(reg32) c0, in(reg32) c1, in(reg32) bar.0, options(nostack)
        )
    };
}

/// As [`load_2d`] for a map of rank 3, coordinates `(c0, c1, c2)` innermost first.
///
/// # Safety
/// As [`load_2d`], with a map of rank 3.
#[inline(always)]
pub unsafe fn load_3d(dst: SharedAddr, map: u64, c0: i32, c1: i32, c2: i32, bar: SharedAddr) {
    // SAFETY: the caller guarantees the map, the destination and the barrier's expectation.
    unsafe {
        asm!(
            "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{}], [{}, {{{}, {}, {}}}], [{}];",
            in(reg32) dst.0, in(reg64) map, in(reg32) c0, in(reg32) c1, in(reg32) c2, in(reg32) bar.0, options(nostack)
        )
    };
}

/// As [`load_2d`] for a map of rank 4, coordinates `(c0, c1, c2, c3)` innermost first.
///
/// # Safety
/// As [`load_2d`], with a map of rank 4.
#[inline(always)]
pub unsafe fn load_4d(dst: SharedAddr, map: u64, c0: i32, c1: i32, c2: i32, c3: i32, bar: SharedAddr) {
    // SAFETY: the caller guarantees the map, the destination and the barrier's expectation.
    unsafe {
        asm!(
            "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{}], [{}, {{{}, {}, {}, {}}}], [{}];",
            in(reg32) dst.0, in(reg64) map, in(reg32) c0, in(reg32) c1, in(reg32) c2, in(reg32) c3, in(reg32) bar.0,
            options(nostack)
        )
    };
}
