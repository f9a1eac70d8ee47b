//! Shared memory: the dynamic window, module-scope static arrays, and typed accesses
//! (PTX ISA §5.1.4 "Shared State Space", §9.7.9.8 `ld`, §9.7.9.10 `st`).
//!
//! Rust has no syntax for address-space-3 statics, so shared arrays are declared in PTX with
//! `global_asm!` and addressed through their 32-bit `.shared` window address.

use core::arch::{asm, global_asm};

global_asm!(".extern .shared .align 128 .b8 DLKERN_DYNAMIC_SMEM[];");

/// A 32-bit address in the `.shared` state space (what `ldmatrix`, `cp.async` and `ld.shared`
/// take). Arithmetic on it is plain byte offsets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(transparent)]
pub struct SharedAddr(pub u32);

impl SharedAddr {
    /// This address plus `bytes`.
    #[inline(always)]
    pub const fn offset(self, bytes: u32) -> Self {
        SharedAddr(self.0.wrapping_add(bytes))
    }
}

/// Start of the block's dynamic shared memory (`.extern .shared`, 128-byte aligned). Its size is
/// the `sharedMemBytes` of the launch, which each kernel's launch contract states.
#[inline(always)]
pub fn dynamic_shared_base() -> SharedAddr {
    let addr: u32;
    // SAFETY: taking the address of a shared symbol has no preconditions.
    unsafe { asm!("mov.u32 {}, DLKERN_DYNAMIC_SMEM;", out(reg32) addr, options(pure, nomem, nostack)) };
    SharedAddr(addr)
}

/// Declares a module-scope `.shared` array of `$bytes` bytes aligned to `$align`, and evaluates
/// to its [`SharedAddr`]. `$name` must be unique in the kernel crate; the same name always
/// denotes the same array (generic instantiations share it).
///
/// ```ignore
/// let tile = shared_array!(MMA_PROBE_A_TILE, 512, 16);
/// ```
#[macro_export]
macro_rules! shared_array {
    ($name:ident, $bytes:literal, $align:literal) => {{
        // `global_asm!` is an item, so it needs a module around it inside a block.
        #[allow(non_snake_case)]
        mod $name {
            core::arch::global_asm!(concat!(
                ".shared .align ", stringify!($align), " .b8 ", stringify!($name), "[", stringify!($bytes), "];"
            ));
        }
        let addr: u32;
        // SAFETY: taking the address of a shared symbol has no preconditions.
        unsafe {
            core::arch::asm!(concat!("mov.u32 {}, ", stringify!($name), ";"), out(reg32) addr,
                             options(pure, nomem, nostack))
        };
        $crate::device::shared::SharedAddr(addr)
    }};
}

/// `ld.shared.f32` (PTX ISA §9.7.9.8).
///
/// # Safety
/// `addr` must be 4-byte aligned and inside the block's shared allocation, and must not be
/// written concurrently by another thread without a barrier in between.
#[inline(always)]
pub unsafe fn ld_shared_f32(addr: SharedAddr) -> f32 {
    let v: f32;
    // SAFETY: the caller guarantees a valid, aligned, race-free address.
    unsafe { asm!("ld.shared.f32 {}, [{}];", out(reg32) v, in(reg32) addr.0, options(nostack, readonly)) };
    v
}

/// `st.shared.f32` (PTX ISA §9.7.9.10).
///
/// # Safety
/// As [`ld_shared_f32`].
#[inline(always)]
pub unsafe fn st_shared_f32(addr: SharedAddr, value: f32) {
    // SAFETY: the caller guarantees a valid, aligned, race-free address.
    unsafe { asm!("st.shared.f32 [{}], {};", in(reg32) addr.0, in(reg32) value, options(nostack)) };
}

/// `st.shared.u32` (PTX ISA §9.7.9.10).
///
/// # Safety
/// As [`ld_shared_f32`].
#[inline(always)]
pub unsafe fn st_shared_u32(addr: SharedAddr, value: u32) {
    // SAFETY: the caller guarantees a valid, aligned, race-free address.
    unsafe { asm!("st.shared.u32 [{}], {};", in(reg32) addr.0, in(reg32) value, options(nostack)) };
}

/// `st.shared.u16` (PTX ISA §9.7.9.10): the low 16 bits of `value`.
///
/// # Safety
/// `addr` must be 2-byte aligned and inside the block's shared allocation, race-free.
#[inline(always)]
pub unsafe fn st_shared_u16(addr: SharedAddr, value: u16) {
    // SAFETY: the caller guarantees a valid, aligned, race-free address.
    unsafe { asm!("st.shared.u16 [{}], {};", in(reg32) addr.0, in(reg16) value, options(nostack)) };
}

/// `ld.shared.v4.u32` (PTX ISA §9.7.9.8): 16 bytes.
///
/// # Safety
/// `addr` must be 16-byte aligned and inside the block's shared allocation, race-free.
#[inline(always)]
pub unsafe fn ld_shared_v4(addr: SharedAddr) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees a valid, aligned, race-free address.
    unsafe {
        asm!("ld.shared.v4.u32 {{{}, {}, {}, {}}}, [{}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) addr.0,
             options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `ld.shared.v2.u32` (PTX ISA §9.7.9.8): 8 bytes.
///
/// # Safety
/// `addr` must be 8-byte aligned and inside the block's shared allocation, race-free.
#[inline(always)]
pub unsafe fn ld_shared_v2(addr: SharedAddr) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: the caller guarantees a valid, aligned, race-free address.
    unsafe {
        asm!("ld.shared.v2.u32 {{{}, {}}}, [{}];", out(reg32) a, out(reg32) b, in(reg32) addr.0,
             options(nostack, readonly))
    };
    [a, b]
}

/// `st.shared.v4.u32` (PTX ISA §9.7.9.10): 16 bytes.
///
/// # Safety
/// As [`ld_shared_v4`].
#[inline(always)]
pub unsafe fn st_shared_v4(addr: SharedAddr, v: [u32; 4]) {
    // SAFETY: the caller guarantees a valid, aligned, race-free address.
    unsafe {
        asm!("st.shared.v4.u32 [{}], {{{}, {}, {}, {}}};",
             in(reg32) addr.0, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
             options(nostack))
    };
}
