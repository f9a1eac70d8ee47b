//! Bit manipulation in one instruction each (PTX ISA §9.7.8.6 `lop3`, §9.7.9.7 `prmt`), with the
//! constants as immediates: written as plain `&`, `|` and shifts, ptxas builds the same
//! results from two or three instructions or keeps re-materializing the constants in
//! registers.

use core::arch::asm;

/// `lop3.b32 d, a, MASK, c, 0xEA` (PTX ISA §9.7.8.6): `(a & MASK) | c`, the mask an immediate.
#[inline(always)]
pub fn and_or<const MASK: u32>(a: u32, c: u32) -> u32 {
    let d: u32;
    // SAFETY: a pure register operation.
    unsafe {
        asm!("lop3.b32 {}, {}, {}, {}, 0xEA;", out(reg32) d, in(reg32) a, const MASK, in(reg32) c,
             options(pure, nomem, nostack))
    };
    d
}

/// `prmt.b32 d, a, b, SELECT` (PTX ISA §9.7.9.7): byte `i` of `d` is byte `(SELECT >> 4i) & 7`
/// of the pair `{b, a}` (bytes 0-3 from `a`, 4-7 from `b`).
#[inline(always)]
pub fn permute_bytes<const SELECT: u32>(a: u32, b: u32) -> u32 {
    let d: u32;
    // SAFETY: a pure register operation.
    unsafe {
        asm!("prmt.b32 {}, {}, {}, {};", out(reg32) d, in(reg32) a, in(reg32) b, const SELECT,
             options(pure, nomem, nostack))
    };
    d
}

/// The low halves of `a` and `b` as one pair (`a`'s in the low half).
#[inline(always)]
pub fn low_halves(a: u32, b: u32) -> u32 {
    permute_bytes::<0x5410>(a, b)
}

/// The high halves of `a` and `b` as one pair (`a`'s in the low half).
#[inline(always)]
pub fn high_halves(a: u32, b: u32) -> u32 {
    permute_bytes::<0x7632>(a, b)
}
