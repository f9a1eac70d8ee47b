//! Conversions between f32 and the 16-bit float formats (PTX ISA §9.7.9.21 `cvt`).
//!
//! Half-precision values travel as their `u16` bit patterns (and pairs packed in `u32`,
//! low half first), because inline PTX only has 16/32/64-bit integer register classes.

use core::arch::asm;

/// `cvt.f32.f16` (PTX ISA §9.7.9.21): IEEE half to f32, exact.
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let y: f32;
    // SAFETY: a pure register operation.
    unsafe { asm!("cvt.f32.f16 {}, {};", out(reg32) y, in(reg16) bits, options(pure, nomem, nostack)) };
    y
}

/// `cvt.rn.f16.f32` (PTX ISA §9.7.9.21): f32 to IEEE half, round to nearest even.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let y: u16;
    // SAFETY: a pure register operation.
    unsafe { asm!("cvt.rn.f16.f32 {}, {};", out(reg16) y, in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// bfloat16 to f32, exact: bf16 is the upper half of an f32 (no instruction needed, and this
/// also works on sm_80, where `cvt.f32.bf16` does not exist).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `cvt.rn.bf16.f32` (PTX ISA §9.7.9.21, sm_80+): f32 to bfloat16, round to nearest even.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let y: u16;
    // SAFETY: a pure register operation.
    unsafe { asm!("cvt.rn.bf16.f32 {}, {};", out(reg16) y, in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// `cvt.rn.f16x2.f32` (PTX ISA §9.7.9.21, sm_80+): two f32 to a packed half pair, `lo` in
/// the low 16 bits.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let y: u32;
    // SAFETY: a pure register operation. PTX takes the high element first.
    unsafe {
        asm!("cvt.rn.f16x2.f32 {}, {}, {};", out(reg32) y, in(reg32) hi, in(reg32) lo,
             options(pure, nomem, nostack))
    };
    y
}

/// `cvt.rn.bf16x2.f32` (PTX ISA §9.7.9.21, sm_80+): two f32 to a packed bfloat16 pair, `lo`
/// in the low 16 bits.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let y: u32;
    // SAFETY: a pure register operation. PTX takes the high element first.
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {}, {}, {};", out(reg32) y, in(reg32) hi, in(reg32) lo,
             options(pure, nomem, nostack))
    };
    y
}

/// `cvt.rni.s32.f32` (PTX ISA §9.7.9.21): round to the nearest integer, ties to even (NaN
/// gives 0, out-of-range values saturate).
#[inline(always)]
pub fn round_ties_even_i32(x: f32) -> i32 {
    let y: i32;
    // SAFETY: a pure register operation.
    unsafe { asm!("cvt.rni.s32.f32 {}, {};", out(reg32) y, in(reg32) x, options(pure, nomem, nostack)) };
    y
}
