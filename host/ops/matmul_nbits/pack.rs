//! 4-bit block-wise weights in ONNX Runtime's `MatMulNBits` format (bits = 4).
//!
//! For a weight matrix `W [N, K]` (output features by input features; `Y = A W^T`):
//! - `b`: u8 `[N, k_blocks, block_size / 2]`, `k_blocks = ceil(K / block_size)`; each block's 4-bit
//!   values are packed along K, element `2i` in the low nibble of byte `i`, `2i + 1` in the high.
//! - `scales`: `[N, k_blocks]` (A's element type in ORT; f32 here).
//! - zero points: absent (every block's zero point is 8), packed u8 `[N, ceil(k_blocks / 2)]`
//!   (block `2j` in the low nibble of byte `j`), or unpacked `[N, k_blocks]` in A's type.
//! - `dequantized = (q - zero_point) * scale`. Positions past K in the last block are padding.

use crate::error::{Error, Result};

const KERNEL: &str = "matmul_nbits quantizer";

/// How the zero points are given.
#[derive(Clone, Debug, PartialEq)]
pub enum ZeroPoints {
    /// None: 8 for every block (symmetric quantization).
    Default,
    /// 4-bit, packed two blocks per byte: `[N, ceil(k_blocks / 2)]`.
    Packed(Vec<u8>),
    /// One value per block in A's type (may be fractional): `[N, k_blocks]`.
    Unpacked(Vec<f32>),
}

/// A `MatMulNBits` (bits = 4) weight.
#[derive(Clone, Debug, PartialEq)]
pub struct MatMulNBitsWeights {
    pub n: usize,
    pub k: usize,
    pub block_size: usize,
    pub b: Vec<u8>,
    pub scales: Vec<f32>,
    pub zero_points: ZeroPoints,
}

/// Whether `block_size` is one `MatMulNBits` accepts (a power of two, at least 16).
pub fn valid_block_size(block_size: usize) -> bool {
    block_size >= 16 && block_size.is_power_of_two()
}

impl MatMulNBitsWeights {
    pub fn k_blocks(&self) -> usize {
        self.k.div_ceil(self.block_size)
    }

    /// Bytes of one block's packed values.
    pub fn blob_size(&self) -> usize {
        self.block_size / 2
    }

    /// The 4-bit value of `W[n][k]`.
    pub fn code(&self, n: usize, k: usize) -> u8 {
        let (blk, within) = (k / self.block_size, k % self.block_size);
        let byte = self.b[(n * self.k_blocks() + blk) * self.blob_size() + within / 2];
        if within % 2 == 0 { byte & 0x0f } else { byte >> 4 }
    }

    /// The zero point of block `blk` of row `n`.
    pub fn zero_point(&self, n: usize, blk: usize) -> f32 {
        match &self.zero_points {
            ZeroPoints::Default => 8.0,
            ZeroPoints::Packed(zp) => {
                let byte = zp[n * self.k_blocks().div_ceil(2) + blk / 2];
                (if blk.is_multiple_of(2) { byte & 0x0f } else { byte >> 4 }) as f32
            }
            ZeroPoints::Unpacked(zp) => zp[n * self.k_blocks() + blk],
        }
    }

    /// `W [N, K]` dequantized exactly as `MatMulNBits` defines it, in f64.
    pub fn dequantize(&self) -> Vec<f64> {
        let mut w = Vec::with_capacity(self.n * self.k);
        for n in 0..self.n {
            for k in 0..self.k {
                let blk = k / self.block_size;
                let scale = self.scales[n * self.k_blocks() + blk] as f64;
                w.push((self.code(n, k) as f64 - self.zero_point(n, blk) as f64) * scale);
            }
        }
        w
    }

    /// Checks that the buffers have the sizes the shape implies.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Error::invalid(KERNEL, m);
        if !valid_block_size(self.block_size) {
            return Err(bad(format!("block_size {} must be a power of two >= 16", self.block_size)));
        }
        if self.n == 0 || self.k == 0 {
            return Err(bad(format!("empty weight [{}, {}]", self.n, self.k)));
        }
        let blocks = self.n * self.k_blocks();
        if self.b.len() != blocks * self.blob_size() {
            return Err(bad(format!("B has {} bytes, expected {}", self.b.len(), blocks * self.blob_size())));
        }
        if self.scales.len() != blocks {
            return Err(bad(format!("{} scales, expected {blocks}", self.scales.len())));
        }
        match &self.zero_points {
            ZeroPoints::Default => Ok(()),
            ZeroPoints::Packed(zp) if zp.len() == self.n * self.k_blocks().div_ceil(2) => Ok(()),
            ZeroPoints::Unpacked(zp) if zp.len() == blocks => Ok(()),
            _ => Err(bad("zero points have the wrong length".into())),
        }
    }
}

impl MatMulNBitsWeights {
    /// B, its scales and zero points repacked for `Variant::Packed` (`decode*_packed`): one
    /// record of `PACKED_RECORD_BYTES` per 32-column tile and 128-wide K chunk, tile-major. A
    /// record holds the tile's 64 code bytes of the chunk per column (columns past N repeat
    /// column N - 1), as four 16-byte pieces whose word `i` in piece `q` is the column's word
    /// `4 i + q` of the chunk (the 8 codes at K `32 i + 8 q`, even codes in nibbles 0-3 and odd
    /// ones in 4-7: `layout::packed_code_word`), then per lane group `g` (0..8)
    /// 16 bytes: `scale_bits` of columns `g`, `g + 8`, `g + 16`, `g + 24` (u16, little-endian),
    /// their zero points (u8) and 4 zero bytes. `scale_bits` are the scales in A's type,
    /// `[N, k_blocks]`, as the GPU gets them.
    ///
    /// Blocks of 32 and 64 get the fine records (`layout::PACKED_FINE_RECORD_BYTES`): the same
    /// codes (words past the end of a row, past K, as zero-point codes 8), then per lane group
    /// `g` 48 bytes: the scale bits of those 4 columns for each 32-K step `s` of the chunk at
    /// bytes `8 s..8 s + 8`, then their zero points per step at `32 + 4 s` (a step past K takes
    /// the row's last block's).
    ///
    /// Blocks of 16 get the fine16 records (`layout::PACKED_FINE16_RECORD_BYTES`): the same
    /// codes, then per lane group `g` 80 bytes: for the lanes of parity `h` (0 then 1: lanes
    /// `q < 2` and `q >= 2`, whose word `i` lies in block `2 i + h` of the chunk), the scale bits
    /// of word `i` and column `g + 8 u` at bytes `32 h + 2 (4 i + u)`; then the zero points as
    /// nibbles, nibble `4 i + u` of the 8 bytes at `64 + 8 h` (a block past K takes the row's
    /// last block's).
    pub fn pack_for_decode(&self, scale_bits: &[u16]) -> Result<Vec<u8>> {
        use super::layout::{
            B_CHUNK_BYTES, CHUNK, DECODE_COLUMNS, FINE_GROUP_CONSTS_BYTES, FINE_STEP, FINE_STEPS,
            FINE16_GROUP_CONSTS_BYTES, PACKED_MIN_BLOCK, packed_code_word, packed_record_bytes, packed_step,
        };
        self.validate()?;
        let bad = |m: String| Error::invalid(KERNEL, m);
        if self.block_size < PACKED_MIN_BLOCK || matches!(self.zero_points, ZeroPoints::Unpacked(_)) {
            return Err(bad(format!(
                "packing for decode needs block_size >= {PACKED_MIN_BLOCK} and integer zero points"
            )));
        }
        if scale_bits.len() != self.scales.len() {
            return Err(bad(format!("{} scale bits, expected {}", scale_bits.len(), self.scales.len())));
        }
        let (chunks, tiles, row_bytes) =
            (self.k.div_ceil(CHUNK), self.n.div_ceil(DECODE_COLUMNS), self.k_blocks() * self.blob_size());
        let (record_bytes, step) = (packed_record_bytes(self.block_size), packed_step(self.block_size));
        let mut out = vec![0u8; tiles * chunks * record_bytes];
        for (record, bytes) in out.chunks_exact_mut(record_bytes).enumerate() {
            let (tile, chunk) = (record / chunks, record % chunks);
            let column = |local: usize| (tile * DECODE_COLUMNS + local).min(self.n - 1);
            for local in 0..DECODE_COLUMNS {
                let row = column(local) * row_bytes;
                // Word `i` of piece `q` is the chunk's word `4 i + q` (K `32 i + 8 q`).
                for (word, dst) in bytes[local * B_CHUNK_BYTES..][..B_CHUNK_BYTES].chunks_exact_mut(4).enumerate() {
                    let (q, i) = (word / 4, word % 4);
                    let within = chunk * B_CHUNK_BYTES + 4 * (4 * i + q);
                    let word = if within < row_bytes {
                        let b = &self.b[row + within..][..4];
                        packed_code_word(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    } else {
                        0x8888_8888
                    };
                    dst.copy_from_slice(&word.to_le_bytes());
                }
            }
            let consts_at = DECODE_COLUMNS * B_CHUNK_BYTES;
            if step < FINE_STEP {
                // Word `i` of the lanes of parity `h`: block `2 i + h` of the chunk.
                let blk =
                    |i: usize, h: usize| ((chunk * CHUNK + 32 * i + 16 * h) / self.block_size).min(self.k_blocks() - 1);
                for g in 0..8 {
                    let consts = &mut bytes[consts_at + FINE16_GROUP_CONSTS_BYTES * g..][..FINE16_GROUP_CONSTS_BYTES];
                    for h in 0..2 {
                        for i in 0..4 {
                            for u in 0..4 {
                                let n = column(g + 8 * u);
                                let bits = scale_bits[n * self.k_blocks() + blk(i, h)];
                                consts[32 * h + 2 * (4 * i + u)..][..2].copy_from_slice(&bits.to_le_bytes());
                                let nibble = 4 * i + u;
                                consts[64 + 8 * h + nibble / 2] |=
                                    (self.zero_point(n, blk(i, h)) as u8) << (4 * (nibble % 2));
                            }
                        }
                    }
                }
                continue;
            }
            if step == FINE_STEP {
                let step_blk = |s: usize| ((chunk * CHUNK + s * FINE_STEP) / self.block_size).min(self.k_blocks() - 1);
                for g in 0..8 {
                    let consts = &mut bytes[consts_at + FINE_GROUP_CONSTS_BYTES * g..][..FINE_GROUP_CONSTS_BYTES];
                    for s in 0..FINE_STEPS {
                        for u in 0..4 {
                            let n = column(g + 8 * u);
                            let bits = scale_bits[n * self.k_blocks() + step_blk(s)];
                            consts[8 * s + 2 * u..][..2].copy_from_slice(&bits.to_le_bytes());
                            consts[32 + 4 * s + u] = self.zero_point(n, step_blk(s)) as u8;
                        }
                    }
                }
                continue;
            }
            let blk = chunk * CHUNK / self.block_size;
            for g in 0..8 {
                let consts = &mut bytes[consts_at + 16 * g..][..16];
                for u in 0..4 {
                    let n = column(g + 8 * u);
                    consts[2 * u..2 * u + 2].copy_from_slice(&scale_bits[n * self.k_blocks() + blk].to_le_bytes());
                    consts[8 + u] = self.zero_point(n, blk) as u8;
                }
            }
        }
        Ok(out)
    }
}

/// Quantizes `w` (`[N, K]` row-major, f32) to 4 bits in blocks of `block_size` along K.
///
/// Symmetric: `scale = max|w| / 7`, codes `round(w / scale) + 8` in `1..=15`, default zero
/// point. Asymmetric: the block's range widened to include 0, `scale = (max - min) / 15`, a packed
/// zero point `round(-min / scale)`, codes `round(w / scale) + zp` clamped to `0..=15`. All-zero
/// blocks get scale 0 (dequantizing to exact zeros).
pub fn quantize(w: &[f32], n: usize, k: usize, block_size: usize, symmetric: bool) -> Result<MatMulNBitsWeights> {
    if w.len() != n * k {
        return Err(Error::invalid(KERNEL, format!("{} weights for [{n}, {k}]", w.len())));
    }
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(Error::invalid(KERNEL, format!("weight {i} is not finite ({})", w[i])));
    }
    let k_blocks = k.div_ceil(block_size.max(1));
    let mut q = MatMulNBitsWeights {
        n,
        k,
        block_size,
        b: vec![0; n * k_blocks * (block_size / 2)],
        scales: vec![0.0; n * k_blocks],
        zero_points: if symmetric {
            ZeroPoints::Default
        } else {
            ZeroPoints::Packed(vec![0; n * k_blocks.div_ceil(2)])
        },
    };
    if !valid_block_size(block_size) {
        return Err(Error::invalid(KERNEL, format!("block_size {block_size} must be a power of two >= 16")));
    }
    for row in 0..n {
        for blk in 0..k_blocks {
            let lo = blk * block_size;
            let hi = (lo + block_size).min(k);
            let values = &w[row * k + lo..row * k + hi];
            let (scale, zp) = if symmetric {
                let max_abs = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                (max_abs / 7.0, 8u8)
            } else {
                let min = values.iter().fold(0.0f32, |m, &v| m.min(v));
                let max = values.iter().fold(0.0f32, |m, &v| m.max(v));
                let scale = (max - min) / 15.0;
                let zp = if scale > 0.0 { (-min / scale).round().clamp(0.0, 15.0) as u8 } else { 8 };
                (scale, zp)
            };
            q.scales[row * k_blocks + blk] = scale;
            if let ZeroPoints::Packed(zps) = &mut q.zero_points {
                zps[row * k_blocks.div_ceil(2) + blk / 2] |= zp << (4 * (blk % 2));
            }
            for within in 0..block_size {
                // Padding past K holds the zero point, so it dequantizes to 0.
                let code = match values.get(within) {
                    Some(&v) if scale > 0.0 => ((v / scale).round() + zp as f32).clamp(0.0, 15.0) as u8,
                    _ => zp,
                };
                q.b[(row * k_blocks + blk) * (block_size / 2) + within / 2] |= code << (4 * (within % 2));
            }
        }
    }
    Ok(q)
}
