//! Fast math on the special function unit (PTX ISA §9.7.3).

use core::arch::asm;

/// `ex2.approx.ftz.f32` (PTX ISA §9.7.3.20): 2^x, max relative error 2^-22, subnormals
/// flushed to zero.
#[inline(always)]
pub fn ex2_approx(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a pure register operation.
    unsafe { asm!("ex2.approx.ftz.f32 {}, {};", out(reg32) y, in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// `rcp.approx.ftz.f32` (PTX ISA §9.7.3.13): 1/x, max relative error 2^-23.
#[inline(always)]
pub fn rcp_approx(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a pure register operation.
    unsafe { asm!("rcp.approx.ftz.f32 {}, {};", out(reg32) y, in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// `rsqrt.approx.ftz.f32` (PTX ISA §9.7.3.17): 1/sqrt(x), max relative error 2^-22.9.
#[inline(always)]
pub fn rsqrt_approx(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a pure register operation.
    unsafe { asm!("rsqrt.approx.ftz.f32 {}, {};", out(reg32) y, in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// `fma.rn.f32` (PTX ISA §9.7.3.6): a*b+c with one rounding (`core` has no `mul_add`).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let y: f32;
    // SAFETY: a pure register operation.
    unsafe {
        asm!("fma.rn.f32 {}, {}, {}, {};", out(reg32) y, in(reg32) a, in(reg32) b, in(reg32) c,
             options(pure, nomem, nostack))
    };
    y
}

/// `fma.rn.f16x2` (PTX ISA §9.7.4.4): a*b+c on two packed halves, one rounding each.
#[inline(always)]
pub fn fma_f16x2(a: u32, b: u32, c: u32) -> u32 {
    let y: u32;
    // SAFETY: a pure register operation.
    unsafe {
        asm!("fma.rn.f16x2 {}, {}, {}, {};", out(reg32) y, in(reg32) a, in(reg32) b, in(reg32) c,
             options(pure, nomem, nostack))
    };
    y
}

/// `fma.rn.bf16x2` (PTX ISA §9.7.4.4, sm_80+): a*b+c on two packed bfloat16, one rounding each.
#[inline(always)]
pub fn fma_bf16x2(a: u32, b: u32, c: u32) -> u32 {
    let y: u32;
    // SAFETY: a pure register operation.
    unsafe {
        asm!("fma.rn.bf16x2 {}, {}, {}, {};", out(reg32) y, in(reg32) a, in(reg32) b, in(reg32) c,
             options(pure, nomem, nostack))
    };
    y
}

/// `lg2.approx.ftz.f32` (PTX ISA §9.7.3.19): log2(x), max absolute error 2^-22 (x in 0.5..2).
#[inline(always)]
pub fn lg2_approx(x: f32) -> f32 {
    let y: f32;
    // SAFETY: a pure register operation.
    unsafe { asm!("lg2.approx.ftz.f32 {}, {};", out(reg32) y, in(reg32) x, options(pure, nomem, nostack)) };
    y
}
