//! Warp-level tensor-core matrix multiply-accumulate (PTX ISA §9.7.14.5.14 `mma.sync`).
//!
//! Fragment layouts (lane `t`, `group = t / 4`, `tig = t % 4`), as [`super::ldmatrix`] delivers
//! them for a row-major A tile and an n-major (k contiguous) B tile:
//! - C/D (16x8, f32 or s32): `d[0..2]` at row `group`, columns `2*tig..+2`; `d[2..4]` at row
//!   `group + 8`, same columns.
//! - A (16xK): `a[0]` rows 0..8, `a[1]` rows 8..16, `a[2]`/`a[3]` the same for the upper half
//!   of K; each register holds K-adjacent elements.
//! - B (Kx8): `b[0]` the lower half of K, `b[1]` the upper half, column `group`.

use core::arch::asm;

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (PTX ISA §9.7.14.5.14): D = A*B + C
/// with f16 inputs and f32 accumulation.
///
/// # Safety
/// All 32 lanes of the warp must execute it with their fragments in the layout above.
#[inline(always)]
pub unsafe fn mma_m16n8k16_f16_f32(c: [f32; 4], a: [u32; 4], b: [u32; 2]) -> [f32; 4] {
    let (d0, d1, d2, d3): (f32, f32, f32, f32);
    // SAFETY: the caller guarantees warp convergence.
    unsafe {
        asm!("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{}, {}, {}, {}}}, {{{}, {}, {}, {}}}, {{{}, {}}}, {{{}, {}, {}, {}}};",
             out(reg32) d0, out(reg32) d1, out(reg32) d2, out(reg32) d3,
             in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
             in(reg32) b[0], in(reg32) b[1],
             in(reg32) c[0], in(reg32) c[1], in(reg32) c[2], in(reg32) c[3],
             options(pure, nomem, nostack))
    };
    [d0, d1, d2, d3]
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (PTX ISA §9.7.14.5.14): D = A*B + C
/// with bfloat16 inputs and f32 accumulation.
///
/// # Safety
/// As [`mma_m16n8k16_f16_f32`].
#[inline(always)]
pub unsafe fn mma_m16n8k16_bf16_f32(c: [f32; 4], a: [u32; 4], b: [u32; 2]) -> [f32; 4] {
    let (d0, d1, d2, d3): (f32, f32, f32, f32);
    // SAFETY: the caller guarantees warp convergence.
    unsafe {
        asm!("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{}, {}, {}, {}}}, {{{}, {}, {}, {}}}, {{{}, {}}}, {{{}, {}, {}, {}}};",
             out(reg32) d0, out(reg32) d1, out(reg32) d2, out(reg32) d3,
             in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
             in(reg32) b[0], in(reg32) b[1],
             in(reg32) c[0], in(reg32) c[1], in(reg32) c[2], in(reg32) c[3],
             options(pure, nomem, nostack))
    };
    [d0, d1, d2, d3]
}

/// `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32` (PTX ISA §9.7.14.5.14): D = A*B + C with
/// int8 inputs and wrapping int32 accumulation (no `.satfinite`).
///
/// # Safety
/// As [`mma_m16n8k16_f16_f32`]; each register holds four K-adjacent int8 values.
#[inline(always)]
pub unsafe fn mma_m16n8k32_s8_s32(c: [i32; 4], a: [u32; 4], b: [u32; 2]) -> [i32; 4] {
    let (d0, d1, d2, d3): (i32, i32, i32, i32);
    // SAFETY: the caller guarantees warp convergence.
    unsafe {
        asm!("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {{{}, {}, {}, {}}}, {{{}, {}, {}, {}}}, {{{}, {}}}, {{{}, {}, {}, {}}};",
             out(reg32) d0, out(reg32) d1, out(reg32) d2, out(reg32) d3,
             in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
             in(reg32) b[0], in(reg32) b[1],
             in(reg32) c[0], in(reg32) c[1], in(reg32) c[2], in(reg32) c[3],
             options(pure, nomem, nostack))
    };
    [d0, d1, d2, d3]
}
