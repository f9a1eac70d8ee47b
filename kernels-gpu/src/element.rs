//! Element types of kernel tensors and their conversions to the f32 compute type.
//!
//! 16-bit floats are carried as bit patterns (`#[repr(transparent)]` over `u16`): the NVPTX
//! backend and inline PTX know them only as b16 registers.

use crate::device::bits::and_or;
use crate::device::convert;

/// IEEE 754 binary16, as its bit pattern.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct F16(pub u16);

/// bfloat16, as its bit pattern.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// A floating-point element that kernels load, compute on in f32, and store.
pub trait Element: Copy {
    /// Elements per 16-byte vector.
    const PER_VEC: usize;
    /// Widen to f32 (exact).
    fn to_f32(self) -> f32;
    /// Narrow from f32, rounding to nearest even.
    fn from_f32(x: f32) -> Self;
    /// Unpack a 16-byte vector into its first [`Self::PER_VEC`] lanes of `out`.
    fn unpack_vec(v: [u32; 4], out: &mut [f32; 8]);
    /// Pack the first [`Self::PER_VEC`] lanes of `x` into a 16-byte vector.
    fn pack_vec(x: &[f32; 8]) -> [u32; 4];
}

impl Element for f32 {
    const PER_VEC: usize = 4;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline(always)]
    fn unpack_vec(v: [u32; 4], out: &mut [f32; 8]) {
        for i in 0..4 {
            out[i] = f32::from_bits(v[i]);
        }
    }
    #[inline(always)]
    fn pack_vec(x: &[f32; 8]) -> [u32; 4] {
        [x[0].to_bits(), x[1].to_bits(), x[2].to_bits(), x[3].to_bits()]
    }
}

impl Element for F16 {
    const PER_VEC: usize = 8;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        convert::f16_to_f32(self.0)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        F16(convert::f32_to_f16(x))
    }
    #[inline(always)]
    fn unpack_vec(v: [u32; 4], out: &mut [f32; 8]) {
        for i in 0..4 {
            out[2 * i] = convert::f16_to_f32(v[i] as u16);
            out[2 * i + 1] = convert::f16_to_f32((v[i] >> 16) as u16);
        }
    }
    #[inline(always)]
    fn pack_vec(x: &[f32; 8]) -> [u32; 4] {
        let mut v = [0u32; 4];
        for i in 0..4 {
            v[i] = convert::pack_f16x2(x[2 * i], x[2 * i + 1]);
        }
        v
    }
}

impl Element for Bf16 {
    const PER_VEC: usize = 8;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        convert::bf16_to_f32(self.0)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        Bf16(convert::f32_to_bf16(x))
    }
    #[inline(always)]
    fn unpack_vec(v: [u32; 4], out: &mut [f32; 8]) {
        for i in 0..4 {
            out[2 * i] = convert::bf16_to_f32(v[i] as u16);
            out[2 * i + 1] = convert::bf16_to_f32((v[i] >> 16) as u16);
        }
    }
    #[inline(always)]
    fn pack_vec(x: &[f32; 8]) -> [u32; 4] {
        let mut v = [0u32; 4];
        for i in 0..4 {
            v[i] = convert::pack_bf16x2(x[2 * i], x[2 * i + 1]);
        }
        v
    }
}

/// A 16-bit float the tensor cores multiply (`mma.sync` m16n8k16 with f32 accumulation).
pub trait TensorElement: Element {
    /// `D = A * B + C` on one warp; fragments as [`crate::device::mma`] documents.
    ///
    /// # Safety
    /// All 32 lanes of the warp must execute it.
    unsafe fn mma(c: [f32; 4], a: [u32; 4], b: [u32; 2]) -> [f32; 4];
    /// The element with bit pattern `bits`.
    fn from_bits(bits: u16) -> Self;
    /// Two f32 rounded to a packed pair, `lo` in the low half.
    fn pack2(lo: f32, hi: f32) -> u32;
    /// `a * b + c` on packed pairs.
    fn fma2(a: u32, b: u32, c: u32) -> u32;
    /// The constants [`Self::codes_minus_bias`] subtracts for zero point `zero` (0..=15),
    /// built with integer arithmetic: once per block, not per word.
    fn code_bias(zero: u32) -> [u32; 2];
    /// Eight 4-bit codes (code `j` in bits `4j..4j+4`) minus the zero point whose
    /// [`Self::code_bias`] is `bias`, exactly, as pairs `(0, 4)`, `(1, 5)`, `(2, 6)`, `(3, 7)`:
    /// the OR-into-the-mantissa trick (a code ORed into the mantissa of 2^10 or 2^7 is that
    /// power plus the code). `PINNED`: see [`mask_or`].
    fn codes_minus_bias<const PINNED: bool>(word: u32, bias: [u32; 2]) -> [u32; 4];
    /// Eight 4-bit codes plus fixed offsets, exactly, in the pairs of [`Self::codes_minus_bias`]:
    /// one `lop3` per pair (the same trick without the subtraction). The offset of a pair
    /// depends only on its place: pairs 0 and 2 (an `mma` A fragment's registers 0-1) and pairs
    /// 1 and 3 (registers 2-3) each have one, which [`Self::OFFSET_SUMS`] weighs.
    fn codes_plus_offset(word: u32) -> [u32; 4];
    /// The `mma` A fragment (the same in every lane) whose rows 0-7 weigh a K step's
    /// activations by the offsets [`Self::codes_plus_offset`] adds at their places and whose rows
    /// 8-15 are ones: its product with the activations is, per token, the sum the offsets
    /// added (rows 0-7) and the plain sum of the activations (rows 8-15).
    const OFFSET_SUMS: [u32; 4];
}

/// `(x & MASK) | magic`. `PINNED`: one `lop3` with the mask an immediate and `magic` held in a
/// register (fewest instructions); otherwise plain operations, which leave ptxas free to
/// re-materialize the constants instead of holding them (one register fewer: what the
/// register-bound 128 x 128 tile needs to stay free of spills).
#[inline(always)]
fn mask_or<const MASK: u32, const PINNED: bool>(x: u32, magic: u32) -> u32 {
    if PINNED { and_or::<MASK>(x, magic) } else { (x & MASK) | magic }
}

impl TensorElement for F16 {
    #[inline(always)]
    fn from_bits(bits: u16) -> Self {
        F16(bits)
    }
    #[inline(always)]
    unsafe fn mma(c: [f32; 4], a: [u32; 4], b: [u32; 2]) -> [f32; 4] {
        // SAFETY: forwarded contract.
        unsafe { crate::device::mma::mma_m16n8k16_f16_f32(c, a, b) }
    }
    #[inline(always)]
    fn pack2(lo: f32, hi: f32) -> u32 {
        convert::pack_f16x2(lo, hi)
    }
    #[inline(always)]
    fn fma2(a: u32, b: u32, c: u32) -> u32 {
        crate::device::math::fma_f16x2(a, b, c)
    }
    #[inline(always)]
    fn code_bias(zero: u32) -> [u32; 2] {
        // -(1024 + z) (0xE400: -1024, unit 1) and -(64 + z) (0xD400: -64, unit 1/16), twice:
        // both exact in f16 for z <= 15.
        [(0xE400 + zero) * 0x1_0001, (0xD400 + 16 * zero) * 0x1_0001]
    }
    #[inline(always)]
    fn codes_minus_bias<const PINNED: bool>(word: u32, [neg_lo, neg_hi]: [u32; 2]) -> [u32; 4] {
        const MAGIC: u32 = 0x6400_6400; // 1024.0 twice
        const ONE: u32 = 0x3C00_3C00;
        const SIXTEENTH: u32 = 0x2C00_2C00;
        let w8 = word >> 8;
        [
            Self::fma2(mask_or::<0x000F_000F, PINNED>(word, MAGIC), ONE, neg_lo),
            Self::fma2(mask_or::<0x00F0_00F0, PINNED>(word, MAGIC), SIXTEENTH, neg_hi),
            Self::fma2(mask_or::<0x000F_000F, PINNED>(w8, MAGIC), ONE, neg_lo),
            Self::fma2(mask_or::<0x00F0_00F0, PINNED>(w8, MAGIC), SIXTEENTH, neg_hi),
        ]
    }
    #[inline(always)]
    fn codes_plus_offset(word: u32) -> [u32; 4] {
        // A code in mantissa bits 0-3 of 1024.0 (unit 1) is 1024 + code; in bits 4-7 of 64.0
        // (0x5400, unit 1/16) it is 64 + code: no shift for the odd codes.
        const MAGIC_LOW: u32 = 0x6400_6400;
        const MAGIC_HIGH: u32 = 0x5400_5400;
        let w8 = word >> 8;
        [
            and_or::<0x000F_000F>(word, MAGIC_LOW),
            and_or::<0x00F0_00F0>(word, MAGIC_HIGH),
            and_or::<0x000F_000F>(w8, MAGIC_LOW),
            and_or::<0x00F0_00F0>(w8, MAGIC_HIGH),
        ]
    }
    // 1024 at the even codes' places, 64 at the odd codes'; ones in rows 8-15.
    const OFFSET_SUMS: [u32; 4] = [0x6400_6400, 0x3C00_3C00, 0x5400_5400, 0x3C00_3C00];
}

impl TensorElement for Bf16 {
    #[inline(always)]
    fn from_bits(bits: u16) -> Self {
        Bf16(bits)
    }
    #[inline(always)]
    unsafe fn mma(c: [f32; 4], a: [u32; 4], b: [u32; 2]) -> [f32; 4] {
        // SAFETY: forwarded contract.
        unsafe { crate::device::mma::mma_m16n8k16_bf16_f32(c, a, b) }
    }
    #[inline(always)]
    fn pack2(lo: f32, hi: f32) -> u32 {
        convert::pack_bf16x2(lo, hi)
    }
    #[inline(always)]
    fn fma2(a: u32, b: u32, c: u32) -> u32 {
        crate::device::math::fma_bf16x2(a, b, c)
    }
    #[inline(always)]
    fn code_bias(zero: u32) -> [u32; 2] {
        // -(128 + z) twice (0xC300: -128, unit 1), exact for z <= 15.
        let neg = (0xC300 + zero) * 0x1_0001;
        [neg, neg]
    }
    #[inline(always)]
    fn codes_minus_bias<const PINNED: bool>(word: u32, [neg, _]: [u32; 2]) -> [u32; 4] {
        // bfloat16 has 7 mantissa bits: only the low nibble of each half fits, so shift.
        const MAGIC: u32 = 0x4300_4300; // 128.0 twice
        const ONE: u32 = 0x3F80_3F80;
        let nib = |shift: u32| Self::fma2(mask_or::<0x000F_000F, PINNED>(word >> shift, MAGIC), ONE, neg);
        [nib(0), nib(4), nib(8), nib(12)]
    }
    #[inline(always)]
    fn codes_plus_offset(word: u32) -> [u32; 4] {
        const MAGIC: u32 = 0x4300_4300; // 128.0 twice: 128 + code
        let nib = |shift: u32| and_or::<0x000F_000F>(word >> shift, MAGIC);
        [nib(0), nib(4), nib(8), nib(12)]
    }
    // 128 at every place; ones in rows 8-15.
    const OFFSET_SUMS: [u32; 4] = [0x4300_4300, 0x3F80_3F80, 0x4300_4300, 0x3F80_3F80];
}
