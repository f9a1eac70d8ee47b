//! Warp shuffles (PTX ISA §9.7.9.6 `shfl.sync`) and the warp reductions built on them.

use core::arch::asm;

/// `shfl.sync.bfly.b32` over the full warp (PTX ISA §9.7.9.6): the value of lane
/// `lane_id ^ lane_mask`.
///
/// # Safety
/// All 32 lanes of the warp must execute this call with the same `lane_mask`.
#[inline(always)]
pub unsafe fn shfl_xor_u32(value: u32, lane_mask: u32) -> u32 {
    let out: u32;
    // SAFETY: full-warp participation is the caller's contract; 0x1f clamps within the warp.
    unsafe {
        asm!(
            "shfl.sync.bfly.b32 {out}, {v}, {m}, 0x1f, 0xffffffff;",
            out = out(reg32) out, v = in(reg32) value, m = in(reg32) lane_mask,
            options(nostack, nomem)
        )
    };
    out
}

/// `shfl.sync.idx.b32` over the full warp (PTX ISA §9.7.9.6): the value of lane `src_lane`.
///
/// # Safety
/// All 32 lanes of the warp must execute this call.
#[inline(always)]
pub unsafe fn shfl_idx_u32(value: u32, src_lane: u32) -> u32 {
    let out: u32;
    // SAFETY: full-warp participation is the caller's contract.
    unsafe {
        asm!(
            "shfl.sync.idx.b32 {out}, {v}, {l}, 0x1f, 0xffffffff;",
            out = out(reg32) out, v = in(reg32) value, l = in(reg32) src_lane,
            options(nostack, nomem)
        )
    };
    out
}

/// `vote.sync.any.pred` over the full warp (PTX ISA §9.7.13.8): whether `pred` holds on any
/// lane; every lane receives the answer (a warp-uniform branch condition).
///
/// # Safety
/// All 32 lanes of the warp must execute this call.
#[inline(always)]
pub unsafe fn any(pred: bool) -> bool {
    let out: u32;
    // SAFETY: full-warp participation is the caller's contract.
    unsafe {
        asm!(
            "{{ .reg .pred p, q; setp.ne.u32 p, {v}, 0; vote.sync.any.pred q, p, 0xffffffff; selp.u32 {o}, 1, 0, q; }}",
            v = in(reg32) pred as u32, o = out(reg32) out,
            options(nostack, nomem)
        )
    };
    out != 0
}

/// [`shfl_xor_u32`] for `f32`.
///
/// # Safety
/// As [`shfl_xor_u32`].
#[inline(always)]
pub unsafe fn shfl_xor_f32(value: f32, lane_mask: u32) -> f32 {
    // SAFETY: forwarded contract.
    f32::from_bits(unsafe { shfl_xor_u32(value.to_bits(), lane_mask) })
}

/// Sum over the 32 lanes of a warp; every lane receives the result (butterfly reduction).
///
/// # Safety
/// All 32 lanes of the warp must execute this call.
#[inline(always)]
pub unsafe fn warp_sum_f32(mut value: f32) -> f32 {
    let mut mask = 16;
    while mask > 0 {
        // SAFETY: forwarded contract.
        value += unsafe { shfl_xor_f32(value, mask) };
        mask >>= 1;
    }
    value
}

/// Maximum over the 32 lanes of a warp; every lane receives the result.
///
/// # Safety
/// All 32 lanes of the warp must execute this call.
#[inline(always)]
pub unsafe fn warp_max_f32(mut value: f32) -> f32 {
    let mut mask = 16;
    while mask > 0 {
        // SAFETY: forwarded contract.
        value = value.max(unsafe { shfl_xor_f32(value, mask) });
        mask >>= 1;
    }
    value
}
